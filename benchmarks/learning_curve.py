"""The learning curve of ``recipes/tictactoe_grpo.py``: mean game reward at the start and after N GRPO steps, and
the wall time, on this machine's CPUs, over several seeds.

    python benchmarks/learning_curve.py            # SmolLM2-135M (the default model), 3 seeds (<= 20 min each)
    python benchmarks/learning_curve.py --quick    # the tiny model, 2 steps per seed: checks the pipeline

Runs the recipe as a user would (a subprocess, one after another for ``--seeds`` seeds) and reads each run's
``metrics.jsonl``. Both ends use the same window: "start" is the mean reward over the first ``--window`` steps,
"end" over the last ``--window`` steps (so one lucky or unlucky step weighs the same at both ends). The headline is
the mean over seeds of (end - start), with its sample standard deviation and range. Writes
``benchmarks/results/learning_curve.md`` and ``.png``. Last line:
``learning_curve: +<delta> ± <sd> mean reward over <n> seeds in <min> min per run (target +0.3 in <= 20 min)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
TARGET_DELTA = 0.3
TARGET_MINUTES = 20.0


def recipe_flags(args: argparse.Namespace, run_dir: Path, seed: int) -> list[str]:
    if args.quick:
        return ["--model", "tiny", "--num-steps", str(args.num_steps), "--games-per-step", "1",
                "--group-size", "2", "--seed", str(seed),
                "--trainer-workers", "1", "--run-dir", str(run_dir), "--wandb-mode", "disabled"]  # fmt: skip
    return [
        "--model", args.model, "--num-steps", str(args.num_steps), "--games-per-step", str(args.games_per_step),
        "--group-size", str(args.group_size), "--learning-rate", str(args.learning_rate),
        "--max-turns", "6", "--max-tokens", str(args.max_tokens), "--temperature", str(args.temperature),
        "--accept-text-moves", "true",
        "--checkpoint-every-steps", "0", "--trainer-workers", str(args.trainer_workers), "--seed", str(seed),
        "--run-dir", str(run_dir), "--wandb-mode", "disabled",
    ]  # fmt: skip


def read_rewards(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, mean reward, seconds into the run at the step's end) per logged step."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "rollout/reward_mean" in record:
            rows.append(
                (int(record["step"]), float(record["rollout/reward_mean"]), float(record.get("_time", 0)))
            )
    return rows


def write_results(runs: dict[int, list], *, command: str, summary: str, quick: bool) -> None:
    """The curves of every seed (table + plot) and the summary, under ``benchmarks/results``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "learning_curve_quick" if quick else "learning_curve"
    figure, axis = plt.subplots(figsize=(6, 3.5))
    for seed, rows in runs.items():
        axis.plot(
            [step for step, _, _ in rows], [reward for _, reward, _ in rows], marker="o", label=f"seed {seed}"
        )
    axis.set_xlabel("GRPO step")
    axis.set_ylabel("mean game reward")
    axis.set_title(f"tictactoe_grpo learning curve, {len(runs)} seeds")
    axis.set_ylim(-0.05, 1.05)
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(RESULTS / f"{name}.png", dpi=100)
    seeds = list(runs)
    steps = sorted({step for rows in runs.values() for step, _, _ in rows})
    rewards = {seed: {step: reward for step, reward, _ in rows} for seed, rows in runs.items()}
    header = "| step | " + " | ".join(f"seed {seed}" for seed in seeds) + " |"
    rule = "|---|" + "---|" * len(seeds)
    table = "\n".join(
        f"| {step} | " + " | ".join(f"{rewards[seed].get(step, float('nan')):.3f}" for seed in seeds) + " |"
        for step in steps
    )
    (RESULTS / f"{name}.md").write_text(
        f"# Learning curve: recipes/tictactoe_grpo.py\n\nCommand: `{command}`\n\n"
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 steps per seed, window 1")
    parser.add_argument("--model", default="default")
    parser.add_argument("--seeds", type=int, default=3, help="independent runs (recipe --seed 0..N-1)")
    parser.add_argument("--num-steps", type=int, default=None, help="GRPO steps per run (default 7; quick 2)")
    parser.add_argument("--games-per-step", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=24, help="cap on one reply (a move is ~8 tokens)")
    parser.add_argument("--trainer-workers", type=int, default=1, help="FSDP2 ranks (1 halves the memory)")
    parser.add_argument(
        "--window", type=int, default=None, help="steps averaged at each end (default 2; quick 1)"
    )
    args = parser.parse_args()
    args.num_steps = args.num_steps or (2 if args.quick else 7)
    window = args.window or (1 if args.quick else 2)
    if args.num_steps < 2 * window:
        parser.error(f"--num-steps {args.num_steps} cannot hold two disjoint windows of --window {window}")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    runs: dict[int, list] = {}
    deltas, walls, lines = [], [], []
    for seed in range(args.seeds):
        run_dir = Path(tempfile.mkdtemp(prefix=f"rein-learning-curve-{seed}-")) / "run"
        command = [
            sys.executable, str(REPO_ROOT / "recipes" / "tictactoe_grpo.py"), *recipe_flags(args, run_dir, seed)
        ]  # fmt: skip
        started = time.monotonic()
        completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
        wall_s = time.monotonic() - started
        if completed.returncode != 0:
            sys.exit(
                f"recipe (seed {seed}) failed ({completed.returncode}):\n"
                f"{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
            )
        rows = runs[seed] = read_rewards(run_dir)
        start, end, delta = window_delta(rows, window)
        deltas.append(delta)
        walls.append(wall_s)
        rewards = ", ".join(f"{reward:.3f}" for _, reward, _ in rows)
        lines.append(
            f"seed {seed}: rewards per step [{rewards}]; start {start:.3f} -> end {end:.3f} "
            f"(delta {delta:+.3f}), {wall_s:.0f} s"
        )
        print(lines[-1], flush=True)
    spread = statistics.stdev(deltas) if len(deltas) > 1 else 0.0
    mean_delta, mean_minutes = statistics.fmean(deltas), statistics.fmean(walls) / 60
    lines.append(
        f"delta over {len(deltas)} seeds (window {window} step(s) at each end): mean {mean_delta:+.3f}, "
        f"sd {spread:.3f}, range [{min(deltas):+.3f}, {max(deltas):+.3f}]; wall time per run "
        f"{mean_minutes:.1f} min (max {max(walls) / 60:.1f})"
    )
    lines.append(
        f"learning_curve: {mean_delta:+.2f} ± {spread:.2f} mean reward over {len(deltas)} seeds in "
        f"{mean_minutes:.1f} min per run (target +{TARGET_DELTA} in <= {TARGET_MINUTES:.0f} min)"
    )
    summary = "\n".join(lines)
    shown = " ".join(part if " " not in part else f"'{part}'" for part in command[1:])
    write_results(
        runs, command=f"python {shown} (seed 0..{args.seeds - 1})", summary=summary, quick=args.quick
    )
    print(lines[-2])
    print(lines[-1])  # the last line: learning_curve: ...


if __name__ == "__main__":
    main()
