"""``rollout_mode async`` against ``sync`` on a long-tailed agent workload: the same trained groups, side by side
in one run, wall-clock ratio, staleness, trainer and engine idle fractions.

    python benchmarks/async_speedup.py            # 6 steps × 4 groups × 2 samples per mode (several minutes)
    python benchmarks/async_speedup.py --quick    # 2 steps × 2 groups per mode: checks the pipeline

The workload is the toy recipe's (tic-tac-toe through the proxy, tiny model, real Ray, engine, bubblewrap,
FSDP2 trainer) with one tool call per rollout that runs in the rollout's bubblewrap sandbox and takes a
heavy-tailed time (log-normal, median ``--tool-median-s``, shape ``--tool-sigma``: most calls are short, a few
are 10-20× the median, like a test suite that sometimes hangs on I/O). The delay is real time inside the
sandbox, not a sleep in the trainer. Each mode trains ``num_steps × groups_per_step`` groups (async replaces
dropped stale groups, so both modes train the same number); the figure is the loop's wall time: the sum of the
steps' ``time/step_s`` (stack start-up and shut-down excluded, the same for both). The run is the recipe's own
``train(config, harness=...)``. Last line:
``async_speedup: <ratio>x faster, mean staleness <s> (target >= 1.8x, staleness <= 1.5)``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_SPEEDUP = 1.8
TARGET_STALENESS = 1.5


class ToolLatencyHarness:
    """The toy agent, after one tool call in its sandbox whose duration is drawn log-normally. The draw is seeded
    by (seed, task, how many times the task ran before): a group's members get the same tail in every mode, in
    whatever order the modes start them (a replacement for a dropped group is a new task, so a new draw)."""

    def __init__(self, inner: Any, *, median_s: float, sigma: float, seed: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.reward = inner.reward
        self.median_s = median_s
        self.sigma = sigma
        self.seed = seed
        self._runs_of: collections.Counter[str] = collections.Counter()

    async def run(self, *, task: Any, sandbox: Any, base_url: str, **credentials: Any) -> Any:
        draw = random.Random(f"{self.seed}-{task.task_id}-{self._runs_of[task.task_id]}")
        self._runs_of[task.task_id] += 1
        delay = self.median_s * math.exp(self.sigma * draw.gauss(0.0, 1.0))
        started = time.monotonic()
        result = await sandbox.exec(["sleep", f"{delay:.3f}"], timeout_s=delay + 60)
        if result.exit_code != 0:
            raise RuntimeError(f"the tool call failed in the sandbox: exit {result.exit_code}")
        tool_s = time.monotonic() - started
        outcome = await self.inner.run(task=task, sandbox=sandbox, base_url=base_url, **credentials)
        return dataclasses.replace(outcome, metrics={**outcome.metrics, "tool_latency_s": tool_s})


async def run_mode(args: argparse.Namespace, mode: str, run_dir: Path) -> dict[str, float]:
    """One run of the toy recipe (its own ``train``) in ``mode`` with the tool-latency agent; returns the loop's
    wall time (the sum of the steps' ``time/step_s``: stack start-up and shut-down excluded) and its
    pipeline means."""
    from components.launch import (
        MonitoringBrickConfig,
        RolloutBrickConfig,
        SamplingBrickConfig,
        SandboxBrickConfig,
        TrainerBrickConfig,
    )
    from recipes.tictactoe_grpo import TicTacToeGrpoConfig, toy_harness, train

    config = TicTacToeGrpoConfig(
        model="tiny",
        run_dir=str(run_dir),
        num_steps=args.num_steps,
        games_per_step=args.groups_per_step,
        group_size=2,
        rollout=RolloutBrickConfig(
            mode=mode, max_staleness=args.max_staleness, max_concurrency=args.max_concurrency
        ),
        sampling=SamplingBrickConfig(max_tokens=24),
        max_turns=2,
        trainer=TrainerBrickConfig(workers=1, learning_rate=2e-5),
        sandbox=SandboxBrickConfig(num_warm=args.max_concurrency),
        checkpoint_every_steps=0,
        monitoring=MonitoringBrickConfig(wandb_mode="disabled"),
        seed=args.seed,
    )
    toy = toy_harness(config)
    harness = ToolLatencyHarness(toy, median_s=args.tool_median_s, sigma=args.tool_sigma, seed=args.seed)
    run = await train(config, harness=harness, grader=toy.reward)
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines() if line]

    def mean(key: str) -> float:
        values = [row[key] for row in rows if key in row]
        return statistics.fmean(values) if values else float("nan")

    return {
        "wall_s": sum(row["time/step_s"] for row in rows),
        "steps": float(len(rows)),
        "staleness_mean": mean("staleness/mean"),
        "groups_dropped": sum(row.get("staleness/groups_dropped", 0.0) for row in rows),
        "trainer_idle": mean("pipeline/trainer_idle_fraction"),
        "engine_idle": mean("pipeline/engine_idle_fraction"),
        "rollout_slot_idle": mean("pipeline/rollout_slot_idle_fraction"),
    }


async def main_async(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    results = {}
    with tempfile.TemporaryDirectory(prefix="async-speedup-") as scratch:
        for mode in ("sync", "async"):
            results[mode] = await run_mode(args, mode, Path(scratch) / mode)
            print(f"{mode}: " + ", ".join(f"{k} {v:.3g}" for k, v in results[mode].items()), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 steps × 2 groups per mode")
    parser.add_argument("--num-steps", type=int, default=None, help="training steps per mode (default 6)")
    parser.add_argument("--groups-per-step", type=int, default=None, help="GRPO groups per step (default 4)")
    parser.add_argument("--max-concurrency", type=int, default=8, help="rollouts in flight (both modes)")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--tool-median-s", type=float, default=1.5, help="median tool time in the sandbox")
    parser.add_argument("--tool-sigma", type=float, default=1.2, help="log-normal shape: the tail's weight")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.num_steps = args.num_steps or (2 if args.quick else 6)
    args.groups_per_step = args.groups_per_step or (2 if args.quick else 4)
    if args.quick:
        args.tool_median_s = min(args.tool_median_s, 0.5)
    results = asyncio.run(main_async(args))
    sync, overlapped = results["sync"], results["async"]
    speedup = sync["wall_s"] / overlapped["wall_s"]
    print(
        f"trainer idle: sync {sync['trainer_idle']:.2f}, async {overlapped['trainer_idle']:.2f}; "
        f"engine idle: sync {sync['engine_idle']:.2f}, async {overlapped['engine_idle']:.2f}; "
        f"groups dropped (async): {overlapped['groups_dropped']:.0f}"
    )
    print(
        f"async_speedup: {speedup:.2f}x faster, mean staleness {overlapped['staleness_mean']:.2f} "
        f"(target >= {TARGET_SPEEDUP}x, staleness <= {TARGET_STALENESS})"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
