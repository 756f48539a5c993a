"""On-policy distillation against plain GRPO at equal rollouts, on the tiny model, in process.

The task: after a fixed prompt the policy writes ``num_tokens`` tokens, each sampled from its top-k; the reward is
1 only when the whole sequence is the target one (at each position the student's ``target_rank``-th likeliest
token: not its favourite), else 0, so a random group is almost always all zeros and GRPO has nothing to learn
from. The teacher is the student fine-tuned (cross-entropy) on the target sequence: a teacher that knows the
answer. Both arms run the real training path: ``Trajectory`` → ``build_micro_batches_locally`` (GRPO
advantages; with distillation the teacher's per-token signal mixed in, ``components/training/distillation.py``)
→ ``run_train_step``, the same seeds, the same ``group_size`` rollouts per step; the teacher scores through an
embedded engine (``logprobs_of``). A run's figure is the number of steps until the student's exact expected
reward (the probability of the target sequence under its top-k sampling) reaches ``target_reward``; a run that
never does counts as the budget (reported as censored, ">").

    python benchmarks/distill.py            # 3 seeds, 40 steps budget
    python benchmarks/distill.py --quick    # 1 seed, 15 steps

Last line: ``distill: <median steps to target with distillation ÷ without> (target < 1)``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from components.models.registry import default_model_dir
from components.models.tiny import build_tiny_model
from components.sampling import SamplingDistribution
from components.training.algorithms import GRPO
from components.training.data import SampleBatchConfig, build_micro_batches_locally, micro_batches_from_table
from components.training.distillation import DistillationConfig, score_with_teachers
from components.training.step import OptimizerConfig, build_optimizer, run_train_step
from components.trajectory import Segment, Trajectory, TrajectoryStatus

PROMPT = [1, 17, 42, 99, 7]


@dataclass(frozen=True, kw_only=True)
class Settings:
    top_k: int = 8  # each token is sampled among the student's 8 likeliest
    num_tokens: int = 3
    target_rank: int = 2  # the target token at each position is the student's 3rd likeliest there
    group_size: int = 8
    learning_rate: float = 3e-3
    target_reward: float = 0.3
    max_steps: int = 40
    kl_weight: float = 0.2
    teacher_target_mass: float = 0.5  # the teacher is fine-tuned until each target token has this much mass


def top_k_log_probs(
    model: torch.nn.Module, sequences: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k tokens after each sequence and their renormalised log probabilities (temperature 1)."""
    with torch.no_grad():
        logits = model(input_ids=sequences).logits[:, -1].float()
    kept = torch.topk(logits, top_k, dim=-1).indices
    return kept, torch.log_softmax(logits.gather(1, kept), -1)


def target_path(model: torch.nn.Module, settings: Settings) -> list[int]:
    """At each position the student's ``target_rank``-th likeliest token after the path so far."""
    path: list[int] = []
    for _ in range(settings.num_tokens):
        kept, _ = top_k_log_probs(model, torch.tensor([PROMPT + path]), settings.top_k)
        path.append(int(kept[0, settings.target_rank]))
    return path


def expected_reward(model: torch.nn.Module, target: list[int], top_k: int) -> float:
    """The exact probability that the student's top-k sampling writes ``target`` (0 if a token leaves the top-k)."""
    probability = 1.0
    for position, token in enumerate(target):
        kept, log_probs = top_k_log_probs(model, torch.tensor([PROMPT + target[:position]]), top_k)
        hits = (kept[0] == token).nonzero()
        probability *= float(log_probs[0, hits[0, 0]].exp()) if len(hits) else 0.0
    return probability


def make_teacher(student_dir: Path, out_dir: Path, target: list[int], *, settings_floor: float) -> Path:
    """The student fine-tuned by cross-entropy on prompt → target until every target token has at least
    ``settings_floor`` of the teacher's mass (a soft teacher: the student's other samples keep some probability)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.tensor([PROMPT + target])
    positions = torch.arange(len(PROMPT) - 1, len(PROMPT) - 1 + len(target))
    for _ in range(200):
        log_probs = torch.log_softmax(model(input_ids=ids).logits[0, positions].float(), -1)
        target_log_probs = log_probs[torch.arange(len(target)), torch.tensor(target)]
        if float(target_log_probs.detach().exp().min()) >= settings_floor:
            break
        optimizer.zero_grad()
        (-target_log_probs.mean()).backward()
        optimizer.step()
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(student_dir).save_pretrained(out_dir)
    return out_dir


def sample_group(model: torch.nn.Module, settings: Settings, target: list[int], *, step: int, generator):
    """``group_size`` rollouts of ``num_tokens`` tokens from the student's top-k distribution, as trajectories."""
    sequences = torch.tensor([PROMPT] * settings.group_size)
    sampled_log_probs = []
    for _ in range(settings.num_tokens):
        kept, log_probs = top_k_log_probs(model, sequences, settings.top_k)
        draws = torch.multinomial(log_probs.exp(), 1, generator=generator)
        sequences = torch.cat([sequences, kept.gather(1, draws)], dim=1)
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
            sampling=SamplingDistribution(top_k=settings.top_k),
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
    distillation = DistillationConfig(teachers=("teacher",), kl_weight=settings.kl_weight)
    batching = SampleBatchConfig(distillation=distillation)
    algorithm = GRPO()
    for step in range(settings.max_steps):
        if expected_reward(model, targets, settings.top_k) >= settings.target_reward:
            return step, True, expected_reward(model, targets, settings.top_k)
        trajectories = sample_group(model, settings, targets, step=step, generator=generator)
        if distill:
            trajectories = asyncio.run(score_with_teachers(distillation, [teacher], trajectories))
        batches = build_micro_batches_locally(trajectories, algorithm, batching, current_version=step)
        micro_batches = micro_batches_from_table(batches.micro_batches)
        if micro_batches:
            run_train_step(model, optimizer, micro_batches, algorithm, optimizer_config=optimizer_config)
    final = expected_reward(model, targets, settings.top_k)
    return settings.max_steps, final >= settings.target_reward, final


def run(settings: Settings, seeds: list[int]) -> dict:
    from transformers import AutoModelForCausalLM

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        student_dir = build_tiny_model(Path(folder) / "student", tokenizer_dir=default_model_dir())
        student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
        targets = target_path(student, settings)
        teacher_dir = make_teacher(
            student_dir, Path(folder) / "teacher", targets, settings_floor=settings.teacher_target_mass
        )
        teacher = EmbeddedEngine(EmbeddedEngineConfig(model_path=teacher_dir, num_threads=1, kv_cache_gb=0.0))
        try:
            results = {"initial_reward": expected_reward(student, targets, settings.top_k), "seeds": []}
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
    print(f"initial expected reward {results['initial_reward']:.3f}, target {settings.target_reward}")
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
        print(f"seed {row['seed']}: " + "; ".join(cells))
    censored = any(not row["grpo"]["reached"] for row in results["seeds"])
    note = ", GRPO censored at the budget" if censored else ""
    print(f"distill: {statistics.median(ratios):.2f} (target < 1{note})")


if __name__ == "__main__":
    main()
