"""The distillation learning test (#25): on the tiny model, on-policy distillation from a teacher that knows the
target reaches a reward that plain GRPO with the same rollouts, steps and seeds does not (``benchmarks/distill.py``:
a sparse reward that almost never fires, a teacher's dense per-token signal), and the benchmark's last line says
so in its own format."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.test_benchmark_methods import load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEEDS = [0, 1, 2]


def test_distillation_reaches_a_reward_the_same_budget_of_grpo_does_not():
    distill = load("distill")
    settings = distill.Settings(max_steps=16)
    results = distill.run(settings, SEEDS)
    assert results["initial_reward"] < settings.target_reward / 100  # sparse: GRPO's groups are all zeros
    assert results["teacher_reward"] > settings.target_reward  # the teacher knows the target
    for row in results["seeds"]:
        assert row["distill"]["reached"] and row["distill"]["steps"] < settings.max_steps, row
        assert not row["grpo"]["reached"] and row["grpo"]["final_reward"] < settings.target_reward, row
    *_, last = distill.report(results, settings)
    ratio = re.fullmatch(r"distill: (\d+\.\d\d) \(target < 1, GRPO censored at the budget\)", last)
    assert ratio and float(ratio.group(1)) < 1, last
