"""On-policy distillation against plain GRPO at equal rollouts, on the tiny model, in process.

The task (the classic case for distillation: a sparse reward that almost never fires): after a fixed prompt
the policy writes ``num_tokens`` tokens; the reward is 1 only when every one is the target token of its
position, else 0. The student is the tiny model shaped (soft-label cross-entropy, every context) so that at
each position its mass is spread over ``num_candidates`` candidate tokens, the target holding only
``student_target_mass`` of it: the target sequence has probability 0.05³ ≈ 1e-4, so a GRPO group is all zeros
and GRPO has nothing to learn from. The teacher "knows the target": the student shaped further until the target
holds ``teacher_target_mass`` at every position, the other candidates keeping their relative weights; its
per-token signal log π_teacher − log π_student is dense (negative on every sampled non-target token, positive
on a sampled target). Both models are built here from the project's own tiny model (nothing downloaded).

Both arms run the real training path: ``Trajectory`` → ``build_micro_batches_locally`` (GRPO advantages; with
distillation the teacher's per-token signal mixed in, ``components/training/distillation.py``) →
``run_train_step``, with the same seeds, the same ``group_size`` rollouts per step (sampled at temperature 1
from the full distribution, the distribution the teacher scores) and the same step budget; the teacher scores
through an embedded engine (``logprobs_of``). A run's figure is the number of steps until the student's exact
expected reward (the probability that its sampling writes the target sequence) reaches ``target_reward``; a run
that never does counts as the budget (reported as censored, ">").

    python benchmarks/distill.py            # 3 seeds, 30 steps budget
    python benchmarks/distill.py --quick    # 1 seed, 15 steps

Last line: ``distill: <median steps to target with distillation ÷ without> (target < 1)``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from components.models.registry import default_model_dir
from components.models.tiny import build_tiny_model
from components.training.algorithms import GRPO
from components.training.data import SampleBatchConfig, build_micro_batches_locally, micro_batches_from_table
from components.training.distillation import DistillationConfig, score_with_teachers
from components.training.step import OptimizerConfig, build_optimizer, run_train_step
from components.trajectory import Segment, Trajectory, TrajectoryStatus

PROMPT = [1, 17, 42, 99, 7]


@dataclass(frozen=True, kw_only=True)
class Settings:
    num_tokens: int = 3
    num_candidates: int = 8  # the tokens that share the student's mass at each position
    student_target_mass: float = 0.05  # the target's share of the student's mass (sequence: 0.05³)
    teacher_target_mass: float = 0.5  # the teacher's
    group_size: int = 8
    learning_rate: float = 3e-3  # 1e-2 overshot on one seed of three (reward 0.04 → 0.000 in one step)
    target_reward: float = 0.05  # ~400x the initial expected reward
    max_steps: int = 30
    kl_weight: float = 1.0
    reward_weight: float = 1.0
    shaping_steps: int = 400  # cross-entropy steps that shape the student and the teacher


def candidate_tokens(settings: Settings) -> list[list[int]]:
    """Per position, the candidate token ids (the first one is the target), fixed by a seed."""
    rng = np.random.default_rng(1234)
    return [
        [int(t) for t in rng.choice(np.arange(1000, 40000), settings.num_candidates, replace=False)]
        for _ in range(settings.num_tokens)
    ]


def shape_model(
    model_dir: Path, out_dir: Path, candidates: list[list[int]], target_mass: float, steps: int
) -> Path:
    """``model_dir``'s model trained (soft-label cross-entropy, Adam) so that after the prompt and every prefix
    of candidates, position p's distribution is the target ``target_mass`` and the other candidates the rest
    evenly; saved to ``out_dir`` with the tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    num_tokens = len(candidates)
    prefixes = list(itertools.product(*candidates[: num_tokens - 1]))  # every context of the last position
    ids = torch.tensor([PROMPT + list(prefix) for prefix in prefixes])
    positions = torch.arange(len(PROMPT) - 1, len(PROMPT) - 1 + num_tokens)
    wanted = torch.zeros(num_tokens, model.config.vocab_size)
    for p, tokens in enumerate(candidates):
        wanted[p, tokens] = (1 - target_mass) / (len(tokens) - 1)
        wanted[p, tokens[0]] = target_mass
    entropy = float(-(wanted * torch.log(wanted.clamp(min=1e-30))).sum(-1).mean())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        hidden = model.model(input_ids=ids).last_hidden_state[:, positions]  # logits only where needed
        log_probs = torch.log_softmax(model.lm_head(hidden).float(), -1)
        loss = -(wanted[None] * log_probs).sum(-1).mean()
        if float(loss.detach()) - entropy < 0.01:  # KL(wanted ‖ model) below 0.01 nats per position
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out_dir)
    return out_dir


def next_log_probs(model: torch.nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """log π(· | sequence) at temperature 1 over the whole vocabulary, per sequence."""
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=sequences).logits[:, -1].float(), -1)


def expected_reward(model: torch.nn.Module, target: list[int]) -> float:
    """The exact probability that the student's sampling writes ``target``."""
    log_probability = 0.0
    for position, token in enumerate(target):
        log_probability += float(next_log_probs(model, torch.tensor([PROMPT + target[:position]]))[0, token])
    return float(np.exp(log_probability))


def sample_group(model: torch.nn.Module, settings: Settings, target: list[int], *, step: int, generator):
    """``group_size`` rollouts of ``num_tokens`` tokens sampled at temperature 1, as trajectories."""
    sequences = torch.tensor([PROMPT] * settings.group_size)
    sampled_log_probs = []
    for _ in range(settings.num_tokens):
        log_probs = next_log_probs(model, sequences)
        draws = torch.multinomial(log_probs.exp(), 1, generator=generator)
        sequences = torch.cat([sequences, draws], dim=1)
        sampled_log_probs.append(log_probs.gather(1, draws)[:, 0])
    sampled = torch.stack(sampled_log_probs, 1)
    trajectories = []
    num_prompt = len(PROMPT)
    for index in range(settings.group_size):
        tokens = sequences[index].tolist()
        segment = Segment(
            token_ids=np.array(tokens),
            loss_mask=np.array([0] * num_prompt + [1] * settings.num_tokens),
            logprobs=np.array([0.0] * num_prompt + sampled[index].tolist()),
            weight_versions=np.array([-1] * num_prompt + [step] * settings.num_tokens),
        )
        trajectories.append(
            Trajectory(
                trajectory_id=f"s{step}-{index}",
                group_id=f"s{step}",
                task_id="write",
                harness="bench",
                status=TrajectoryStatus.OK,
                reward=float(tokens[num_prompt:] == target),
                step=step,
                segments=(segment,),
            )
        )
    return trajectories


def steps_to_target(
    student_dir: Path, teacher, settings: Settings, targets: list[int], *, seed: int, distill: bool
) -> tuple[int, bool, float]:
    """(steps until the expected reward reaches the target or the budget, reached?, final expected reward)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
    optimizer_config = OptimizerConfig(learning_rate=settings.learning_rate)
    optimizer = build_optimizer(model, optimizer_config)
    generator = torch.Generator().manual_seed(seed)
    distillation = DistillationConfig(
        teachers=("teacher",), kl_weight=settings.kl_weight, reward_weight=settings.reward_weight
    )
    batching = SampleBatchConfig(distillation=distillation)
    algorithm = GRPO()
    for step in range(settings.max_steps):
        reward = expected_reward(model, targets)
        if reward >= settings.target_reward:
            return step, True, reward
        trajectories = sample_group(model, settings, targets, step=step, generator=generator)
        if distill:
            trajectories = asyncio.run(score_with_teachers(distillation, [teacher], trajectories))
        batches = build_micro_batches_locally(trajectories, algorithm, batching, current_version=step)
        micro_batches = micro_batches_from_table(batches.micro_batches)
        if micro_batches:
            run_train_step(model, optimizer, micro_batches, algorithm, optimizer_config=optimizer_config)
    final = expected_reward(model, targets)
    return settings.max_steps, final >= settings.target_reward, final


def build_models(settings: Settings, folder: Path) -> tuple[Path, Path, list[int]]:
    """(student folder, teacher folder, target sequence): both shaped from the project's tiny model."""
    candidates = candidate_tokens(settings)
    base = build_tiny_model(folder / "base", tokenizer_dir=default_model_dir())
    student = shape_model(
        base, folder / "student", candidates, settings.student_target_mass, settings.shaping_steps
    )
    teacher = shape_model(
        student, folder / "teacher", candidates, settings.teacher_target_mass, settings.shaping_steps
    )
    return student, teacher, [tokens[0] for tokens in candidates]


def run(settings: Settings, seeds: list[int]) -> dict:
    """Both arms on every seed: steps to target, reached or not, final expected reward, wall time."""
    from transformers import AutoModelForCausalLM

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.engine.providers import EmbeddedEngineBrickConfig

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        student_dir, teacher_dir, targets = build_models(settings, Path(folder))
        student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
        teacher_model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
        teacher = EmbeddedEngine(
            EmbeddedEngineConfig(model_path=teacher_dir, settings=EmbeddedEngineBrickConfig(kv_cache_gb=0.0))
        )
        try:
            results = {
                "initial_reward": expected_reward(student, targets),
                "teacher_reward": expected_reward(teacher_model, targets),
                "seeds": [],
            }
            for seed in seeds:
                row = {"seed": seed}
                for arm, distill in (("grpo", False), ("distill", True)):
                    started = time.perf_counter()
                    steps, reached, final = steps_to_target(
                        student_dir, teacher, settings, targets, seed=seed, distill=distill
                    )
                    row[arm] = {"steps": steps, "reached": reached, "final_reward": final,
                                "wall_s": time.perf_counter() - started}  # fmt: skip
                results["seeds"].append(row)
        finally:
            teacher.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, 15 steps budget")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=Settings.max_steps)
    args = parser.parse_args()
    settings = Settings(max_steps=15 if args.quick else args.max_steps)
    seeds = list(range(1 if args.quick else args.seeds))
    results = run(settings, seeds)
    for line in report(results, settings):
        print(line)


def report(results: dict, settings: Settings) -> list[str]:
    """The printed lines: the start, one line per seed, and ``distill: <ratio> (target < 1...)``."""
    lines = [
        f"initial expected reward {results['initial_reward']:.2e} (teacher's {results['teacher_reward']:.3f}), "
        f"target {settings.target_reward}"
    ]
    ratios = []
    for row in results["seeds"]:
        cells = []
        for arm in ("grpo", "distill"):
            r = row[arm]
            mark = "" if r["reached"] else ">"
            cells.append(
                f"{arm} {mark}{r['steps']} steps (final {r['final_reward']:.3f}, {r['wall_s']:.1f} s)"
            )
        ratios.append(row["distill"]["steps"] / max(row["grpo"]["steps"], 1))
        lines.append(f"seed {row['seed']}: " + "; ".join(cells))
    censored = any(not row["grpo"]["reached"] for row in results["seeds"])
    note = ", GRPO censored at the budget" if censored else ""
    lines.append(f"distill: {statistics.median(ratios):.2f} (target < 1{note})")
    return lines


if __name__ == "__main__":
    main()
