"""Overlong (truncated) trajectories: kept, masked out of the loss, or softly penalised, by hand."""

from __future__ import annotations

import pytest

from components.training.data import SUMMARY_COLUMNS, SampleBatchConfig, plan_step, read_segments
from components.training.grpo import GRPO, GRPOConfig
from components.training.overlong import OverlongConfig
from components.trajectory import TrajectoryStatus
from tests.components.training.training_synthetic import make_segment, make_trajectory


def plan(overlong: OverlongConfig):
    """Group a: t1 (reward 1, 2 + 3 sampled tokens), t2 (reward 0, 5), t3 (reward 1, 8, cut off by the context
    window); advantages are reward - group mean (no std division)."""
    trajectories = [
        make_trajectory("t1", "a", 1.0, (make_segment(3, 2, seed=1), make_segment(4, 3, seed=2))),
        make_trajectory("t2", "a", 0.0, (make_segment(2, 5, seed=3),)),
        make_trajectory(
            "t3", "a", 1.0, (make_segment(2, 8, seed=4),), status=TrajectoryStatus.CONTEXT_OVERFLOW
        ),
    ]
    summary = read_segments(trajectories).select(SUMMARY_COLUMNS)
    algorithm = GRPO(GRPOConfig(normalize_advantages_by_std=False))
    return plan_step(summary, algorithm, SampleBatchConfig(overlong=overlong), current_version=0)


def test_keep_trains_on_overlong_trajectories_as_they_are():
    step = plan(OverlongConfig())
    assert step.segment_advantage == pytest.approx(
        {"t1#0": 1 / 3, "t1#1": 1 / 3, "t2#0": -2 / 3, "t3#0": 1 / 3}
    )
    assert step.metrics["num_overlong_trajectories"] == 1


def test_mask_leaves_overlong_trajectories_out_of_the_loss_but_in_the_baseline():
    step = plan(OverlongConfig(mode="mask"))
    assert step.segment_advantage == pytest.approx({"t1#0": 1 / 3, "t1#1": 1 / 3, "t2#0": -2 / 3})
    assert step.metrics["num_trained_trajectories"] == 2
    # over max_sampled_tokens is overlong too: t1 and t2 (5 > 4) join t3 (context overflow)
    step = plan(OverlongConfig(mode="mask", max_sampled_tokens=4))
    assert set(step.segment_advantage) == set() and step.metrics["num_overlong_trajectories"] == 3


def test_penalty_ramps_over_the_buffer_and_is_full_for_overlong():
    step = plan(OverlongConfig(mode="penalty", max_sampled_tokens=6, buffer_tokens=2, penalty=0.5))
    # ramp from 4 to 6 tokens: t1 and t2 (5 tokens) get -0.25; t3 (context overflow) gets -0.5
    shaped = {"t1": 0.75, "t2": -0.25, "t3": 0.5}
    mean = sum(shaped.values()) / 3
    expected = {"t1#0": 0.75 - mean, "t1#1": 0.75 - mean, "t2#0": -0.25 - mean, "t3#0": 0.5 - mean}
    assert step.segment_advantage == pytest.approx(expected)
    assert step.metrics["overlong_penalty_mean"] == pytest.approx(-1 / 3)
    assert step.metrics["reward_mean"] == pytest.approx(2 / 3)  # the task reward, before shaping


def test_overlong_config_is_validated_by_name():
    with pytest.raises(ValueError, match="^mode:"):
        OverlongConfig(mode="drop")
    with pytest.raises(ValueError, match="^buffer_tokens:"):
        OverlongConfig(max_sampled_tokens=4, buffer_tokens=5)
