"""``rollout_mode async`` against ``sync`` on a long-tailed agent workload: the same trained groups, in pairs
(one ``sync`` and one ``async`` run of the same seeded workload, in an order drawn per pair), wall-clock ratio,
staleness, trainer and engine idle fractions.

    python benchmarks/async_speedup.py                 # 3 pairs × 24 steps × 4 groups × 2 samples (~35 min)
    python benchmarks/async_speedup.py --num-steps 12  # a shorter run: fill and drain weigh more (~1.75x)
    python benchmarks/async_speedup.py --quick         # 1 pair × 2 steps × 2 groups, no warm-up: checks the
                                                       # pipeline (two stack starts: ~2 min, not under one)

The workload is the toy recipe's (tic-tac-toe through the proxy, tiny model, real Ray, engine, bubblewrap,
FSDP2 trainer) with one tool call per rollout that runs in the rollout's bubblewrap sandbox and takes a
heavy-tailed time (log-normal, median ``--tool-median-s``, shape ``--tool-sigma``: most calls are short, a few
are 10-20× the median, like a test suite that sometimes hangs on I/O). The delay is real time inside the
sandbox, not a sleep in the trainer. Each mode trains ``num_steps × groups_per_step`` groups (async replaces
dropped stale groups, so both modes train the same number); a run's figure is the loop's wall time: the sum of
its steps' ``time/step_s`` (stack start-up and shut-down excluded, the same for both).

Method: both modes are warmed first (one short run each, discarded: the driver's first stack pays one-off
costs, e.g. Ray's first workers); then each pair runs ``sync`` and ``async`` on the same seed (the same tool
times for the same groups), in an order drawn per pair; seeds differ between pairs (another draw of the tail).
The headline is the median over pairs of sync wall / async wall, with the min-max spread; staleness is the mean
over the async runs.

Why 24 steps by default: a real RL run has hundreds of steps, and async's gain is its steady state (rollouts of
the next steps in flight while the trainer trains). With ``max_staleness 2`` the first ~2 steps fill the
pipeline and the last ~2 drain it, whatever the schedule, and the last step's slowest rollout bounds the wall
time: a fixed cost that weighs less the longer the run. Measured on the quiet machine (RESULTS.md): 6 steps
~1.5x, 12 steps 1.76x (1.74-2.74x over pairs), 24 steps 2.50x (2.44-2.58x). 24 steps is the longest run that
still fits three pairs into about half an hour here; ``--num-steps`` keeps the shorter figures measurable
(RESULTS.md reports them). Last line:
``async_speedup: <median>x faster (<min>-<max>x over <n> pairs, <steps> steps), mean staleness <s>
(target >= 1.8x, staleness <= 1.5)``.
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
from collections.abc import Awaitable, Callable, Sequence
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


MODES = ("sync", "async")


@dataclasses.dataclass(frozen=True)
class ModeRun:
    """One run's figures: wall time (the sum of the steps' ``time/step_s``) and the pipeline's fractions, weighted
    by step time (the fraction of the whole run, not a mean of per-step fractions)."""

    wall_s: float
    num_steps: int
    staleness_mean: float
    groups_dropped: float
    trainer_idle: float
    engine_idle: float
    rollout_slot_idle: float
    sandbox_wait_s: float  # mean per rollout: from its start to holding a sandbox

    def describe(self) -> str:
        """One line of this run's figures."""
        return (
            f"wall {self.wall_s:.1f} s, {self.num_steps} steps, staleness {self.staleness_mean:.2f}, "
            f"dropped {self.groups_dropped:.0f}, trainer idle {self.trainer_idle:.2f}, "
            f"engine idle {self.engine_idle:.2f}, slot idle {self.rollout_slot_idle:.2f}, "
            f"sandbox wait {self.sandbox_wait_s * 1000:.0f} ms"
        )


@dataclasses.dataclass(frozen=True)
class Pair:
    """``sync`` and ``async`` on one seed; ``order`` is the mode that ran first."""

    seed: int
    order: str
    sync: ModeRun
    overlapped: ModeRun

    @property
    def speedup(self) -> float:
        """Sync wall time over async wall time for the same trained groups."""
        return self.sync.wall_s / self.overlapped.wall_s


RunMode = Callable[[str, int, bool], Awaitable[ModeRun]]  # (mode, seed, warm_up) -> the run's figures


async def measure_pairs(
    run_mode: RunMode, *, seeds: Sequence[int], rng: random.Random, warm_up: bool = True
) -> list[Pair]:
    """Warm both modes (one short run each, discarded; ``--quick`` skips it), then run ``sync`` and ``async`` on
    each seed in an order drawn per pair."""
    for mode in MODES if warm_up else ():
        await run_mode(mode, seeds[0], True)
    pairs = []
    for seed in seeds:
        order = list(MODES)
        rng.shuffle(order)
        runs = {}
        for mode in order:
            runs[mode] = await run_mode(mode, seed, False)
            print(f"  seed {seed} {mode}: {runs[mode].describe()}", flush=True)
        pair = Pair(seed=seed, order=order[0], sync=runs["sync"], overlapped=runs["async"])
        print(f"pair seed {seed} ({pair.order} first): {pair.speedup:.2f}x", flush=True)
        pairs.append(pair)
    return pairs


def summarize(pairs: Sequence[Pair]) -> dict[str, float]:
    """The headline: median speedup over pairs with its spread, async staleness averaged over the async runs,
    and each mode's idle fractions averaged over its runs."""
    speedups = [pair.speedup for pair in pairs]
    summary = {
        "speedup_median": statistics.median(speedups),
        "speedup_min": min(speedups),
        "speedup_max": max(speedups),
        "staleness_mean": statistics.fmean(pair.overlapped.staleness_mean for pair in pairs),
        "groups_dropped_mean": statistics.fmean(pair.overlapped.groups_dropped for pair in pairs),
    }
    for name, runs in (("sync", [p.sync for p in pairs]), ("async", [p.overlapped for p in pairs])):
        for field in ("trainer_idle", "engine_idle", "rollout_slot_idle", "sandbox_wait_s"):
            summary[f"{name}_{field}"] = statistics.fmean(getattr(run, field) for run in runs)
    return summary


def read_run(metrics_path: Path) -> ModeRun:
    """A run's figures from its ``metrics.jsonl``."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    step_s = [row["time/step_s"] for row in rows]
    wall_s = sum(step_s)

    def weighted(key: str) -> float:
        pairs = [(row[key], row["time/step_s"]) for row in rows if key in row]
        total_s = sum(seconds for _, seconds in pairs)
        return sum(value * seconds for value, seconds in pairs) / total_s if total_s > 0 else float("nan")

    def mean(key: str) -> float:
        values = [row[key] for row in rows if key in row]
        return statistics.fmean(values) if values else float("nan")

    return ModeRun(
        wall_s=wall_s,
        num_steps=len(rows),
        staleness_mean=mean("staleness/mean") if any("staleness/mean" in row for row in rows) else 0.0,
        groups_dropped=sum(row.get("staleness/groups_dropped", 0.0) for row in rows),
        trainer_idle=weighted("pipeline/trainer_idle_fraction"),
        engine_idle=weighted("pipeline/engine_idle_fraction"),
        rollout_slot_idle=weighted("pipeline/rollout_slot_idle_fraction"),
        sandbox_wait_s=mean("throughput/sandbox_wait_s_mean"),
    )


async def run_mode(args: argparse.Namespace, mode: str, seed: int, warm_up: bool, run_dir: Path) -> ModeRun:
    """One run of the toy recipe (its own ``train``) in ``mode`` with the tool-latency agent; a warm-up run is
    1 step × 1 group with short tool calls."""
    from components.run.config import RolloutBrickConfig, SamplingBrickConfig
    from components.training.step import OptimizerConfig
    from components.training.trainer_config import TrainerBrickConfig
    from monitoring.logger import WandbLoggersConfig
    from recipes.tictactoe_grpo import TicTacToeGrpoConfig, toy_harness, train
    from sandboxes.pool import SandboxPoolConfig

    config = TicTacToeGrpoConfig(
        model="tiny",
        run_dir=str(run_dir),
        num_steps=1 if warm_up else args.num_steps,
        games_per_step=1 if warm_up else args.groups_per_step,
        group_size=2,
        rollout=RolloutBrickConfig(
            mode=mode,
            max_staleness=args.max_staleness,
            max_steps_ahead=args.max_steps_ahead,
            max_concurrency=args.max_concurrency,
        ),
        sampling=SamplingBrickConfig(max_tokens=24),
        max_turns=2,
        trainer=TrainerBrickConfig(num_workers=1, optimizer=OptimizerConfig(learning_rate=2e-5)),
        sandbox=SandboxPoolConfig(num_warm=args.num_warm_sandboxes),
        checkpoint_every_steps=0,
        monitoring=WandbLoggersConfig(wandb_mode="disabled"),
        seed=seed,
    )
    toy = toy_harness(config)
    median_s = min(args.tool_median_s, 0.1) if warm_up else args.tool_median_s
    harness = ToolLatencyHarness(toy, median_s=median_s, sigma=args.tool_sigma, seed=seed)
    run = await train(config, harness=harness, grader=toy.reward)
    return read_run(run.path / "metrics.jsonl")


async def main_async(args: argparse.Namespace) -> list[Pair]:
    runs = collections.Counter[str]()
    with tempfile.TemporaryDirectory(prefix="async-speedup-") as scratch:

        async def one_run(mode: str, seed: int, warm_up: bool) -> ModeRun:
            runs[mode] += 1
            run_dir = Path(scratch) / f"{mode}-{runs[mode]}{'-warm-up' if warm_up else ''}"
            started = time.monotonic()
            result = await run_mode(args, mode, seed, warm_up, run_dir)
            label = "warm-up" if warm_up else f"seed {seed}"
            print(
                f"  {mode} {label}: {time.monotonic() - started:.0f} s with start-up and shut-down",
                flush=True,
            )
            return result

        seeds = [args.seed + index for index in range(args.num_pairs)]
        return await measure_pairs(one_run, seeds=seeds, rng=random.Random(args.seed), warm_up=not args.quick)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="1 pair × 2 steps × 2 groups, short tool calls, no warm-up runs"
    )
    parser.add_argument(
        "--num-pairs", type=int, default=None, help="sync/async pairs, one seed each (default 3)"
    )
    parser.add_argument("--num-steps", type=int, default=None, help="training steps per run (default 24)")
    parser.add_argument("--groups-per-step", type=int, default=None, help="GRPO groups per step (default 4)")
    parser.add_argument("--max-concurrency", type=int, default=8, help="rollouts in flight (both modes)")
    parser.add_argument(
        "--num-warm-sandboxes",
        type=int,
        default=12,
        help="the sandbox pool's warm sandboxes (slots + a margin)",
    )
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument(
        "--max-steps-ahead",
        type=int,
        default=1,
        help="async: steps beyond the trainer's the producer may start",
    )
    parser.add_argument("--tool-median-s", type=float, default=1.5, help="median tool time in the sandbox")
    parser.add_argument("--tool-sigma", type=float, default=1.2, help="log-normal shape: the tail's weight")
    parser.add_argument("--seed", type=int, default=0, help="the first pair's seed (pair i: seed + i)")
    args = parser.parse_args()
    args.num_pairs = args.num_pairs or (1 if args.quick else 3)
    args.num_steps = args.num_steps or (2 if args.quick else 24)
    args.groups_per_step = args.groups_per_step or (2 if args.quick else 4)
    if args.quick:
        args.tool_median_s = min(args.tool_median_s, 0.5)
    pairs = asyncio.run(main_async(args))
    summary = summarize(pairs)
    print(
        "speedups: "
        + ", ".join(f"{pair.speedup:.2f}x (seed {pair.seed}, {pair.order} first)" for pair in pairs)
    )
    for mode in MODES:
        print(
            f"{mode} (mean of {len(pairs)} runs): trainer idle {summary[f'{mode}_trainer_idle']:.2f}, "
            f"engine idle {summary[f'{mode}_engine_idle']:.2f}, "
            f"rollout slot idle {summary[f'{mode}_rollout_slot_idle']:.2f}, "
            f"sandbox wait {summary[f'{mode}_sandbox_wait_s'] * 1000:.0f} ms"
        )
    print(f"groups dropped for staleness (async, mean per run): {summary['groups_dropped_mean']:.1f}")
    print(
        f"async_speedup: {summary['speedup_median']:.2f}x faster ({summary['speedup_min']:.2f}-"
        f"{summary['speedup_max']:.2f}x over {len(pairs)} pairs, {args.num_steps} steps), "
        f"mean staleness {summary['staleness_mean']:.2f} "
        f"(target >= {TARGET_SPEEDUP}x, staleness <= {TARGET_STALENESS})"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
