"""The run progress display: plain log lines off a terminal, a live rich display on one."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from components.trajectory import Segment, Trajectory, TrajectoryStatus
from monitoring.progress import RunProgress


def segment(num_prompt: int, num_sampled: int) -> Segment:
    mask = np.array([0] * num_prompt + [1] * num_sampled)
    return Segment(
        token_ids=np.arange(len(mask)), loss_mask=mask, logprobs=-0.5 * mask, weight_versions=mask - 1
    )


def rollout(name: str, *, reward: float | None, status=TrajectoryStatus.OK, sampled: int = 10) -> Trajectory:
    return Trajectory(
        trajectory_id=name,
        group_id="g",
        task_id="t",
        harness="h",
        status=status,
        failure_reason="" if status == TrajectoryStatus.OK else "why",
        reward=reward,
        segments=(segment(5, sampled),) if sampled else (),
    )


def run_two_steps(progress: RunProgress) -> None:
    with progress:
        progress.start_step(0)
        progress.rollout_finished(rollout("a", reward=1.0))
        progress.rollout_finished(rollout("b", reward=0.0))
        progress.rollout_finished(rollout("c", reward=None, status=TrajectoryStatus.SANDBOX_ERROR, sampled=0))
        progress.rollout_finished(rollout("d", reward=0.0, status=TrajectoryStatus.TIMEOUT))
        progress.finish_step({"train/loss": 0.1234, "train/logprob_pearson": 0.998})
        progress.start_step(1, num_rollouts=2)
        progress.rollout_finished(rollout("e", reward=1.0))
        progress.message("checkpoint saved")


def test_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    progress = RunProgress(
        num_steps=2, rollouts_per_step=4, console=Console(file=stream, force_terminal=False, width=80)
    )
    assert not progress.interactive
    run_two_steps(progress)
    lines = stream.getvalue().splitlines()
    assert "\x1b[" not in stream.getvalue()  # no escape codes in CI logs
    assert lines[0] == "step 0 started: 4 rollouts"
    # One line per quarter of the rollouts, never wrapped, then a summary line with the trainer metrics.
    assert lines[1].startswith("step 0 (0/2 done) | rollouts 1/4 | reward 1.000 | pass 1.00 | failures 0 |")
    summary = next(line for line in lines if "loss" in line)
    assert summary.startswith("step 0 (1/2 done) | rollouts 4/4 | reward 0.333 | pass 0.33 |")
    assert "failures 2 (sandbox_error=1, timeout=1)" in summary
    assert "loss 0.1234" in summary and "logprob pearson 0.9980" in summary
    assert "step 1 started: 2 rollouts" in lines
    assert lines[-1] == "checkpoint saved"


def test_live_display_on_a_terminal():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=140, record=True)
    progress = RunProgress(num_steps=2, rollouts_per_step=4, console=console)
    assert progress.interactive
    run_two_steps(progress)
    text = console.export_text()
    assert "steps" in text and "rollouts" in text
    assert "1/2" in text  # one of two steps done
    assert "checkpoint saved" in text
    assert "reward 1.000" in text  # step 1: one rollout, reward 1
    assert "loss 0.1234" in text
    assert "[bold]" not in text  # markup is rendered, never shown


def test_tokens_per_second_counts_sampled_tokens():
    progress = RunProgress(num_steps=1, rollouts_per_step=1, console=Console(file=io.StringIO()))
    progress.start_step(0)
    progress.step_started_at -= 2.0  # as if the step had run for two seconds
    progress.rollout_finished(rollout("a", reward=1.0, sampled=30))
    assert progress.tokens_per_s == pytest.approx(15.0, rel=0.05)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_steps"):
        RunProgress(num_steps=0, rollouts_per_step=1)
    with pytest.raises(ValueError, match="first_step"):
        RunProgress(num_steps=2, rollouts_per_step=1, first_step=3)
    with pytest.raises(ValueError, match="num_rollouts"):
        RunProgress(num_steps=2, rollouts_per_step=1).start_step(0, num_rollouts=0)
