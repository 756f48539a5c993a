"""The learning curve of ``recipes/tictactoe_grpo.py``: mean game reward at the start and after N GRPO steps, and
the wall time, on this machine's CPUs.

    python benchmarks/learning_curve.py            # SmolLM2-135M (the default model), full run (≤ 20 min target)
    python benchmarks/learning_curve.py --quick    # the tiny model, 1 step: checks the pipeline (< 1-2 min)

Runs the recipe as a user would (a subprocess) and reads its ``metrics.jsonl``. "Start" is step 0's mean reward
(the untrained policy); "end" is the mean over the last ``--final-window`` steps. Writes
``benchmarks/results/learning_curve.md`` and ``.png``. Last line:
``learning_curve: +<delta> mean reward in <min> min (target +0.3 in <= 20 min)``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"
TARGET_DELTA = 0.3
TARGET_MINUTES = 20.0


def recipe_flags(args: argparse.Namespace, run_dir: Path) -> list[str]:
    if args.quick:
        return ["--model", "tiny", "--num-steps", "1", "--games-per-step", "1", "--group-size", "2",
                "--trainer-workers", "1", "--run-dir", str(run_dir), "--wandb-mode", "disabled"]  # fmt: skip
    return [
        "--model", args.model, "--num-steps", str(args.num_steps), "--games-per-step", str(args.games_per_step),
        "--group-size", str(args.group_size), "--learning-rate", str(args.learning_rate),
        "--max-turns", "6", "--max-tokens", str(args.max_tokens), "--temperature", str(args.temperature),
        "--accept-text-moves", "true",
        "--checkpoint-every-steps", "0", "--trainer-workers", str(args.trainer_workers),
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


def write_results(rows, *, command: str, wall_s: float, delta: float, summary: str, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "learning_curve_quick" if quick else "learning_curve"
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot([step for step, _, _ in rows], [reward for _, reward, _ in rows], marker="o")
    axis.set_xlabel("GRPO step")
    axis.set_ylabel("mean game reward")
    axis.set_title(f"tictactoe_grpo learning curve ({wall_s / 60:.1f} min)")
    axis.set_ylim(-0.05, 1.05)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(RESULTS / f"{name}.png", dpi=100)
    table = "\n".join(f"| {step} | {reward:.3f} |" for step, reward, _ in rows)
    (RESULTS / f"{name}.md").write_text(
        f"# Learning curve: recipes/tictactoe_grpo.py\n\nCommand: `{command}`\n\n"
        f"Machine: 2 shared CPU cores (other jobs running), no GPU.\n\n"
        f"| step | mean reward |\n|---|---|\n{table}\n\n"
        f"Delta (last steps vs step 0): {delta:+.3f}; wall time {wall_s / 60:.1f} min.\n\n"
        f"![learning curve]({name}.png)\n\n```\n{summary}\n```\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, one step")
    parser.add_argument("--model", default="default")
    parser.add_argument("--num-steps", type=int, default=7)
    parser.add_argument("--games-per-step", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-tokens", type=int, default=24, help="cap on one reply (a move is ~8 tokens)")
    parser.add_argument("--trainer-workers", type=int, default=1, help="FSDP2 ranks (1 halves the memory)")
    parser.add_argument("--final-window", type=int, default=2, help="steps averaged for the end reward")
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="rein-learning-curve-")) / "run"
    command = [sys.executable, str(REPO_ROOT / "recipes" / "tictactoe_grpo.py"), *recipe_flags(args, run_dir)]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    wall_s = time.monotonic() - started
    if completed.returncode != 0:
        sys.exit(
            f"recipe failed ({completed.returncode}):\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
        )
    rows = read_rewards(run_dir)
    start = rows[0][1]
    end = sum(reward for _, reward, _ in rows[-args.final_window :]) / len(rows[-args.final_window :])
    delta = end - start
    lines = [f"step {step}: mean reward {reward:.3f}" for step, reward, _ in rows]
    lines.append(
        f"start {start:.3f} → end {end:.3f} (delta {delta:+.3f}) over {len(rows)} steps, {wall_s:.0f} s"
    )
    lines.append(
        f"learning_curve: {delta:+.2f} mean reward in {wall_s / 60:.1f} min "
        f"(target +{TARGET_DELTA} in <= {TARGET_MINUTES:.0f} min)"
    )
    summary = "\n".join(lines)
    shown = " ".join(part if " " not in part else f"'{part}'" for part in command[1:])
    write_results(
        rows, command=f"python {shown}", wall_s=wall_s, delta=delta, summary=summary, quick=args.quick
    )
    print(summary)  # its last line: learning_curve: ...


if __name__ == "__main__":
    main()
