"""benchmarks/async_speedup.py measures what it claims: both modes warmed, pairs on one seed in a drawn order,
the headline the median over pairs with its spread, staleness from the async runs only."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "async_speedup.py"


def load_benchmark():
    """The benchmark script as a module (benchmarks/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("benchmark_async_speedup", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_pairs_are_warmed_run_one_seed_in_a_drawn_order_and_report_the_median_with_its_spread():
    bench = load_benchmark()
    calls: list[tuple[str, int, bool]] = []
    sync_wall_s = {10: 100.0, 11: 90.0, 12: 120.0, 13: 80.0, 14: 110.0, 15: 100.0, 16: 95.0, 17: 105.0}
    async_wall_s = {10: 50.0, 11: 60.0, 12: 48.0, 13: 40.0, 14: 55.0, 15: 40.0, 16: 50.0, 17: 70.0}

    async def run_mode(mode: str, seed: int, warm_up: bool):
        calls.append((mode, seed, warm_up))
        wall_s = 1.0 if warm_up else (sync_wall_s if mode == "sync" else async_wall_s)[seed]
        return bench.ModeRun(
            wall_s=wall_s,
            num_steps=12,
            staleness_mean=0.0 if mode == "sync" else 0.5 + (seed % 2),
            groups_dropped=0.0,
            trainer_idle=0.8 if mode == "sync" else 0.4,
            engine_idle=0.9 if mode == "sync" else 0.6,
            rollout_slot_idle=0.5,
            sandbox_wait_s=0.01,
        )

    seeds = list(range(10, 18))
    pairs = asyncio.run(bench.measure_pairs(run_mode, seeds=seeds, rng=random.Random(0)))
    assert [warm_up for _, _, warm_up in calls[:2]] == [
        True,
        True,
    ]  # both modes warmed before anything counts
    assert {mode for mode, _, _ in calls[:2]} == {"sync", "async"}
    timed = calls[2:]
    assert not any(warm_up for _, _, warm_up in timed)
    runs_of_pair = [timed[i : i + 2] for i in range(0, len(timed), 2)]
    assert [{mode for mode, _, _ in pair} for pair in runs_of_pair] == [{"sync", "async"}] * len(seeds)
    assert [{seed for _, seed, _ in pair} for pair in runs_of_pair] == [
        {seed} for seed in seeds
    ]  # one workload
    firsts = [pair[0][0] for pair in runs_of_pair]
    assert 1 <= firsts.count("sync") <= len(seeds) - 1  # drawn per pair, not fixed
    assert [pair.order for pair in pairs] == firsts

    summary = bench.summarize(pairs)
    speedups = sorted(
        sync_wall_s[seed] / async_wall_s[seed] for seed in seeds
    )  # sync / async of the same seed
    assert summary["speedup_median"] == pytest.approx((speedups[3] + speedups[4]) / 2)
    assert (summary["speedup_min"], summary["speedup_max"]) == (
        pytest.approx(speedups[0]),
        pytest.approx(speedups[-1]),
    )
    assert summary["staleness_mean"] == pytest.approx(
        1.0
    )  # the async runs' (0.5 and 1.5 alternately), not sync's 0
    assert (summary["sync_trainer_idle"], summary["async_trainer_idle"]) == (
        pytest.approx(0.8),
        pytest.approx(0.4),
    )
    assert (summary["sync_engine_idle"], summary["async_engine_idle"]) == (
        pytest.approx(0.9),
        pytest.approx(0.6),
    )

    calls.clear()  # --quick: no warm-up runs, the pair still runs both modes on one seed
    asyncio.run(bench.measure_pairs(run_mode, seeds=[10], rng=random.Random(0), warm_up=False))
    assert sorted(calls) == [("async", 10, False), ("sync", 10, False)]


def test_a_run_reads_its_wall_time_and_step_weighted_fractions_from_metrics(tmp_path):
    bench = load_benchmark()
    rows = [
        {
            "time/step_s": 10.0,
            "pipeline/trainer_idle_fraction": 0.9,
            "pipeline/engine_idle_fraction": 0.5,
            "pipeline/rollout_slot_idle_fraction": 0.2,
            "staleness/mean": 0.0,
            "throughput/sandbox_wait_s_mean": 0.4,
        },
        {
            "time/step_s": 30.0,
            "pipeline/trainer_idle_fraction": 0.5,
            "pipeline/engine_idle_fraction": 0.1,
            "pipeline/rollout_slot_idle_fraction": 0.6,
            "staleness/mean": 2.0,
            "staleness/groups_dropped": 1.0,
            "throughput/sandbox_wait_s_mean": 0.2,
        },
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f"{json.dumps(row)}\n" for row in rows))
    run = bench.read_run(path)
    assert run.wall_s == pytest.approx(40.0) and run.num_steps == 2
    assert run.trainer_idle == pytest.approx((0.9 * 10 + 0.5 * 30) / 40)  # weighted by step time, not 0.7
    assert run.engine_idle == pytest.approx((0.5 * 10 + 0.1 * 30) / 40)
    assert run.rollout_slot_idle == pytest.approx((0.2 * 10 + 0.6 * 30) / 40)
    assert run.staleness_mean == pytest.approx(1.0) and run.groups_dropped == 1.0
    assert run.sandbox_wait_s == pytest.approx(0.3)
