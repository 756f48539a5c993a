"""The learning curve of ``recipes/tictactoe_grpo.py``: mean game reward at the start and after N GRPO steps, and
the wall time, on this machine's CPUs, for several training variants over the same seeds and the same budget.

    python benchmarks/learning_curve.py                          # SmolLM2-135M, sync + async + LoRA, 1 seed each
    python benchmarks/learning_curve.py --variants sync --seeds 3
    python benchmarks/learning_curve.py --quick                  # the tiny model, 2 steps: checks the pipeline

Variants (``--variants``, run in a seeded random order per seed, one after another):

- ``sync``: full fine-tuning, roll out then train (the reference);
- ``async``: the same with ``--rollout-mode async --max-staleness 2`` (issue #11);
- ``lora``: ``--lora-rank 16 --lora-target all-linear`` at ``--lora-learning-rate`` (issue #14).

Every variant gets the same budget: steps, games per step, group size, reply tokens, turns, temperature, and the
same recipe seeds (so the same games). Runs the recipe as a user would (a subprocess) and reads each run's
``metrics.jsonl`` (``rollout/reward_mean``: the mean reward of the trajectories trained at that step; under
``async`` those were sampled by weights up to ``max_staleness`` versions older, so the x-axis is the training
step, not the version that played). Both ends use the same window: "start" is the mean reward over the first
``--window`` steps, "end" over the last ``--window`` steps. The headline per variant is the mean over seeds of
(end - start) with its sample standard deviation. Writes ``benchmarks/results/learning_curve.md`` and ``.png``
(``learning_curve_<variants>`` when not all three ran).
Last line: ``learning_curve: sync +<delta>, async +<delta>, lora +<delta> mean reward over <n> seed(s) ...
(target >= +0.3 each)``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
TARGET_DELTA = 0.3
TARGET_MINUTES = 20.0
# Ray 2.60's raylet gives its dashboard agent a fixed 15 s to start; on a loaded machine it may not, and the
# local node never comes up (ray-project/ray#65983). Such a run measured nothing and is started again.
RAY_START_TIMEOUT = "The current node timed out during startup"


@dataclass(frozen=True)
class Variant:
    """One way to train, run on the same seeds and budget as the others: its own recipe flags and learning rate."""

    name: str
    flags: tuple[str, ...]
    learning_rate: float


VARIANT_NAMES = ("sync", "async", "lora")


def variants(args: argparse.Namespace) -> dict[str, Variant]:
    """Every variant the benchmark knows, by ``--variants`` name."""
    return {
        "sync": Variant("sync", (), args.learning_rate),
        "async": Variant(
            "async",
            ("--rollout-mode", "async", "--max-staleness", str(args.max_staleness)),
            args.learning_rate,
        ),
        "lora": Variant(
            "lora",
            ("--lora-rank", str(args.lora_rank), "--lora-target", args.lora_target),
            args.lora_learning_rate,
        ),
    }


def recipe_flags(args: argparse.Namespace, variant: Variant, run_dir: Path, seed: int) -> list[str]:
    """The recipe's command line: the budget every variant shares, then the variant's own flags."""
    if args.quick:
        budget = ["--model", "tiny", "--num-steps", str(args.num_steps), "--games-per-step", "1",
                  "--group-size", "2"]  # fmt: skip
    else:
        budget = [
            "--model", args.model, "--num-steps", str(args.num_steps), "--games-per-step", str(args.games_per_step),
            "--group-size", str(args.group_size), "--max-turns", "6", "--max-tokens", str(args.max_tokens),
            "--temperature", str(args.temperature), "--accept-text-moves", "true", "--checkpoint-every-steps", "0",
        ]  # fmt: skip
    return [
        *budget, "--trainer-workers", str(args.trainer_workers), "--seed", str(seed), "--run-dir", str(run_dir),
        "--wandb-mode", "disabled", "--learning-rate", str(variant.learning_rate), *variant.flags,
    ]  # fmt: skip


def read_rewards(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, mean reward, mean staleness of the step's groups) per logged step (staleness 0 under sync)."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "rollout/reward_mean" in record:
            rows.append(
                (
                    int(record["step"]),
                    float(record["rollout/reward_mean"]),
                    float(record.get("staleness/mean", 0.0)),
                )
            )
    return rows


def results_name(variant_names: list[str], *, quick: bool) -> str:
    """The results' file name: ``learning_curve`` (all variants), else with the variants run, so that one
    variant's run does not overwrite another's (``learning_curve_async``); ``_quick`` for ``--quick``."""
    name = "learning_curve"
    if sorted(variant_names) != sorted(VARIANT_NAMES):
        name += "_" + "_".join(variant_names)
    return name + ("_quick" if quick else "")


def write_results(
    runs: dict[tuple[str, int], list], *, commands: list[str], summary: str, name: str
) -> None:
    """The curves of every variant and seed (table + plot) and the summary, under ``benchmarks/results``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    figure, axis = plt.subplots(figsize=(6, 3.5))
    for (variant, seed), rows in runs.items():
        axis.plot(
            [step for step, _, _ in rows],
            [reward for _, reward, _ in rows],
            marker="o",
            label=f"{variant}, seed {seed}",
        )
    axis.set_xlabel("GRPO step (async: groups trained at that step)")
    axis.set_ylabel("mean game reward")
    axis.set_title("tictactoe_grpo learning curves")
    axis.set_ylim(-0.05, 1.05)
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(RESULTS / f"{name}.png", dpi=100)
    steps = sorted({step for rows in runs.values() for step, _, _ in rows})
    rewards = {key: {step: reward for step, reward, _ in rows} for key, rows in runs.items()}
    header = "| step | " + " | ".join(f"{variant}, seed {seed}" for variant, seed in runs) + " |"
    rule = "|---|" + "---|" * len(runs)
    table = "\n".join(
        f"| {step} | " + " | ".join(f"{rewards[key].get(step, float('nan')):.3f}" for key in runs) + " |"
        for step in steps
    )
    shown = "\n".join(f"    {command}" for command in commands)
    (RESULTS / f"{name}.md").write_text(
        f"# Learning curves: recipes/tictactoe_grpo.py\n\nCommands (in the order run):\n\n{shown}\n\n"
        f"Machine: 2 shared CPU cores (other jobs running), no GPU.\n\n"
        f"Mean game reward per step:\n\n{header}\n{rule}\n{table}\n\n"
        f"![learning curve]({name}.png)\n\n```\n{summary}\n```\n"
    )


def window_delta(rows: list[tuple[int, float, float]], window: int) -> tuple[float, float, float]:
    """(start, end, end - start): mean reward over the first and over the last ``window`` steps."""
    if len(rows) < 2 * window:
        raise ValueError(f"window: {len(rows)} logged steps cannot hold two disjoint windows of {window}")
    start = statistics.fmean(reward for _, reward, _ in rows[:window])
    end = statistics.fmean(reward for _, reward, _ in rows[-window:])
    return start, end, end - start


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's command line (the budget every variant shares, and each variant's own knobs)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 steps per run, window 1")
    parser.add_argument("--variants", default="sync,async,lora", help="comma-separated: sync, async, lora")
    parser.add_argument("--model", default="default")
    parser.add_argument(
        "--seeds", type=int, default=1, help="independent runs per variant (recipe --seed 0..N-1, see --first-seed)"
    )
    parser.add_argument("--num-steps", type=int, default=None, help="GRPO steps per run (default 7; quick 2)")
    parser.add_argument("--games-per-step", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="full fine-tuning (sync, async)")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=24, help="cap on one reply (a move is ~8 tokens)")
    parser.add_argument("--trainer-workers", type=int, default=1, help="FSDP2 ranks (1 halves the memory)")
    parser.add_argument("--max-staleness", type=int, default=2, help="async variant")
    parser.add_argument("--lora-rank", type=int, default=16, help="lora variant")
    parser.add_argument("--lora-target", default="all-linear", help="lora variant")
    parser.add_argument(
        "--lora-learning-rate",
        type=float,
        default=5e-4,
        help="lora variant: 10x the full rate (an adapter starts at zero and has few parameters)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="runs at once (they then share the machine's load; each SmolLM2 run needs ~8 GB, and two at once "
        "were killed by Ray's memory monitor on a 24 GB machine)",
    )
    parser.add_argument(
        "--stagger-s", type=float, default=90.0, help="with --parallel: seconds between two run starts"
    )
    parser.add_argument(
        "--first-seed", type=int, default=0, help="recipe seeds --first-seed .. --first-seed + --seeds - 1"
    )
    parser.add_argument("--order-seed", type=int, default=0, help="seeds the order of the variants per seed")
    parser.add_argument(
        "--window", type=int, default=None, help="steps averaged at each end (default 2; quick 1)"
    )
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    args.num_steps = args.num_steps or (2 if args.quick else 7)
    window = args.window or (1 if args.quick else 2)
    if args.num_steps < 2 * window:
        parser.error(f"--num-steps {args.num_steps} cannot hold two disjoint windows of --window {window}")
    known = variants(args)
    names = [name for name in args.variants.split(",") if name]
    if not names or any(name not in known for name in names):
        parser.error(f"--variants {args.variants!r}: choose from {', '.join(known)}")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    order_rng = random.Random(args.order_seed)
    queue = []  # (seed, variant name): each seed's variants in their own random order
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        order = order_rng.sample(names, len(names))
        print(f"seed {seed}: variants in order {', '.join(order)}", flush=True)
        queue += [(seed, name) for name in order]
    runs: dict[tuple[str, int], list] = {}
    deltas: dict[str, list[float]] = {name: [] for name in names}
    walls: dict[str, list[float]] = {name: [] for name in names}
    lines, commands = [], []
    running: dict[subprocess.Popen, tuple[int, str, Path, float]] = {}
    retries = {job: 0 for job in queue}
    while queue or running:
        while queue and len(running) < args.parallel:
            seed, name = queue.pop(0)
            run_dir = Path(tempfile.mkdtemp(prefix=f"rein-learning-curve-{name}-{seed}-")) / "run"
            command = [
                sys.executable,
                str(REPO_ROOT / "recipes" / "tictactoe_grpo.py"),
                *recipe_flags(args, known[name], run_dir, seed),
            ]
            commands.append("python " + " ".join(command[1:]))
            with (run_dir.parent / "recipe.log").open("w") as log:  # a file: a full pipe would block the run
                process = subprocess.Popen(
                    command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
                )
            running[process] = (seed, name, run_dir, time.monotonic())
            if queue and len(running) < args.parallel:
                time.sleep(args.stagger_s)  # two Ray nodes starting at once on a loaded machine time out
        time.sleep(1.0)
        for process in [process for process in running if process.poll() is not None]:
            seed, name, run_dir, started = running.pop(process)
            wall_s = time.monotonic() - started
            log_text = (run_dir.parent / "recipe.log").read_text()
            if process.returncode != 0 and RAY_START_TIMEOUT in log_text and retries[(seed, name)] < 2:
                retries[(seed, name)] += 1  # the run never started: start it again, nothing was measured
                print(f"{name} seed {seed}: Ray's node did not start (load); starting it again", flush=True)
                queue.insert(0, (seed, name))
                continue
            if process.returncode != 0:
                for other in running:
                    other.terminate()
                sys.exit(f"recipe ({name}, seed {seed}) failed ({process.returncode}):\n{log_text[-4000:]}")
            rows = runs[(name, seed)] = read_rewards(run_dir)
            start, end, delta = window_delta(rows, window)
            deltas[name].append(delta)
            walls[name].append(wall_s)
            rewards = ", ".join(f"{reward:.3f}" for _, reward, _ in rows)
            staleness = statistics.fmean(lag for _, _, lag in rows)
            lines.append(
                f"{name} seed {seed}: rewards per step [{rewards}]; start {start:.3f} -> end {end:.3f} "
                f"(delta {delta:+.3f}), mean staleness {staleness:.2f}, {wall_s:.0f} s ({run_dir})"
            )
            print(lines[-1], flush=True)
    headline = []
    for name in names:
        spread = statistics.stdev(deltas[name]) if len(deltas[name]) > 1 else 0.0
        mean_delta, minutes = statistics.fmean(deltas[name]), statistics.fmean(walls[name]) / 60
        lines.append(
            f"{name}: delta over {len(deltas[name])} seed(s) (window {window} step(s) at each end) mean "
            f"{mean_delta:+.3f}, sd {spread:.3f}, range [{min(deltas[name]):+.3f}, {max(deltas[name]):+.3f}]; "
            f"wall time per run {minutes:.1f} min"
        )
        met = "met" if mean_delta >= TARGET_DELTA else "not met"
        headline.append(f"{name} {mean_delta:+.2f} ({met}, {minutes:.1f} min)")
    lines.append(
        f"learning_curve: {', '.join(headline)} mean reward over {args.seeds} seed(s), {args.num_steps} steps "
        f"(target >= +{TARGET_DELTA} each, <= {TARGET_MINUTES:.0f} min per run)"
    )
    summary = "\n".join(lines)
    write_results(runs, commands=commands, summary=summary, name=results_name(names, quick=args.quick))
    for line in lines[-len(names) - 1 :]:
        print(line)  # the last line: learning_curve: ...


if __name__ == "__main__":
    main()
