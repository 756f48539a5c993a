"""``rollout_mode async`` against ``sync`` on a long-tailed agent workload: the same trained groups, side by side
in one run, wall-clock ratio, staleness, trainer and engine idle fractions.

    python benchmarks/async_speedup.py            # 6 steps × 4 groups × 2 samples per mode (several minutes)
    python benchmarks/async_speedup.py --quick    # 2 steps × 2 groups per mode: checks the pipeline

The workload is the toy recipe's (tic-tac-toe through the proxy, tiny model, real Ray, engine, bubblewrap,
FSDP2 trainer) with one tool call per rollout that runs in the rollout's bubblewrap sandbox and takes a
heavy-tailed time (log-normal, median ``--tool-median-s``, shape ``--tool-sigma``: most calls are short, a few
are 10-20× the median, like a test suite that sometimes hangs on I/O). The delay is real time inside the
sandbox, not a sleep in the trainer. Each mode trains ``num_steps × groups_per_step`` groups (async replaces
dropped stale groups, so both modes train the same number); the figure is the loop's wall time (stack start-up
excluded, the same for both). Last line:
``async_speedup: <ratio>x faster, mean staleness <s> (target >= 1.8x, staleness <= 1.5)``.
"""

from __future__ import annotations

import argparse
import asyncio
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
    """The toy agent, after one tool call in its sandbox whose duration is drawn log-normally (seeded)."""

    def __init__(self, inner: Any, *, median_s: float, sigma: float, seed: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.reward = inner.reward
        self.median_s = median_s
        self.sigma = sigma
        self._random = random.Random(seed)

    async def run(self, *, task: Any, sandbox: Any, base_url: str, **credentials: Any) -> Any:
        delay = self.median_s * math.exp(self.sigma * self._random.gauss(0.0, 1.0))
        started = time.monotonic()
        result = await sandbox.exec(["sleep", f"{delay:.3f}"], timeout_s=delay + 60)
        if result.exit_code != 0:
            raise RuntimeError(f"the tool call failed in the sandbox: exit {result.exit_code}")
        tool_s = time.monotonic() - started
        outcome = await self.inner.run(task=task, sandbox=sandbox, base_url=base_url, **credentials)
        return dataclasses.replace(outcome, metrics={**outcome.metrics, "tool_latency_s": tool_s})


async def run_mode(args: argparse.Namespace, mode: str, run_dir: Path) -> dict[str, float]:
    """One run of the toy recipe's bricks in ``mode``; returns the loop's wall time and its pipeline means."""
    import functools

    from components.launch import (
        MonitoringBrickConfig,
        RolloutBrickConfig,
        RunDirectory,
        RunStack,
        SamplingBrickConfig,
        SandboxBrickConfig,
        TrainerBrickConfig,
    )
    from components.loop import run_recipe_loop
    from components.rollout import RolloutConfig, RolloutRunner
    from harnesses.toy_agent import ToyAgentConfig, ToyAgentHarness
    from recipes.tictactoe_grpo import (
        TEXT_MOVE_SYSTEM_PROMPT,
        TicTacToeGrpoConfig,
        games_for_step,
        text_move_example,
    )

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
    run = RunDirectory.create(config, recipe=f"async_speedup_{mode}")
    harness = ToolLatencyHarness(
        ToyAgentHarness(
            ToyAgentConfig(
                max_turns=config.max_turns,
                max_tokens=config.sampling.max_tokens,
                temperature=config.sampling.temperature,
                accept_text_moves=True,
                offer_tools=False,
                example_turns=(text_move_example(),),
                system_prompt=TEXT_MOVE_SYSTEM_PROMPT,
            )
        ),
        median_s=args.tool_median_s,
        sigma=args.tool_sigma,
        seed=args.seed,
    )
    async with RunStack.start(config, run) as stack:
        runner = RolloutRunner(
            RolloutConfig(group_size=config.group_size, max_concurrency=config.rollout.max_concurrency),
            harness=harness,
            sandboxes=stack.sandboxes,
            sessions=stack.sessions,
            proxy_url=stack.proxy_url,
            session_keys=stack.session_keys,
            grader=harness.reward,
        )
        started = time.monotonic()
        await run_recipe_loop(config, run, stack, runner, functools.partial(games_for_step, config))
        wall_s = time.monotonic() - started
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines() if line]

    def mean(key: str) -> float:
        values = [row[key] for row in rows if key in row]
        return statistics.fmean(values) if values else float("nan")

    return {
        "wall_s": wall_s,
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
