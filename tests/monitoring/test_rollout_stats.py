"""Rollout statistics from hand-built trajectories (and the realistic run's, read back from Parquet)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from components.trajectory import Segment, SegmentReason, Trajectory, TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from monitoring.rollout_stats import conversation_counts, drift_report_metrics, rollout_metrics


def segment(num_prompt: int, num_sampled: int, reason=SegmentReason.START) -> Segment:
    mask = np.array([0] * num_prompt + [1] * num_sampled)
    return Segment(
        token_ids=np.arange(num_prompt + num_sampled),
        loss_mask=mask,
        logprobs=np.where(mask == 1, -0.5, 0.0),
        weight_versions=np.where(mask == 1, 1, -1),
        reason=reason,
    )


def trajectory(
    name: str, *, group="g1", status=TrajectoryStatus.OK, reward=1.0, segments=(), metrics=None, messages=None
):
    return Trajectory(
        trajectory_id=name,
        group_id=group,
        task_id="t",
        harness="h",
        status=status,
        failure_reason="" if status == TrajectoryStatus.OK else "because",
        reward=reward,
        metrics=metrics or {},
        segments=tuple(segments),
        messages_json=json.dumps(messages or []),
    )


def call(name):
    return {"id": f"c-{name}", "type": "function", "function": {"name": name, "arguments": "{}"}}


@pytest.fixture
def batch() -> list[Trajectory]:
    return [
        trajectory(
            "a",
            reward=1.0,
            segments=[segment(10, 5)],
            metrics={
                "turns": 2,
                "tool_calls/bash": 3,
                "files_reread_after_edit": 1,
                "wall_time_s": 4.0,
                "sandbox_wait_s": 1.0,
            },
        ),
        trajectory(
            "b",
            reward=0.0,
            segments=[segment(10, 3), segment(4, 2, SegmentReason.HISTORY_REWRITTEN)],
            metrics={
                "turns": 4,
                "tool_calls/bash": 1,
                "tool_calls/edit": 2,
                "files_reread_after_edit": 0,
                "wall_time_s": 8.0,
                "sandbox_wait_s": 3.0,
                "drift_tokens": 2,
            },
        ),
        trajectory(
            "c",
            group="g2",
            status=TrajectoryStatus.TIMEOUT,
            reward=0.5,
            segments=[segment(6, 4, SegmentReason.START)],
            messages=[
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [call("bash"), call("bash")]},
                {"role": "tool", "tool_call_id": "c-bash", "content": "ok"},
                {"role": "assistant", "content": "done", "tool_calls": [call("submit")]},
            ],
        ),
        trajectory("d", group="g2", status=TrajectoryStatus.SANDBOX_ERROR, reward=None),
        trajectory(
            "e",
            group="g3",
            status=TrajectoryStatus.GRADING_ERROR,
            reward=None,
            segments=[segment(3, 1)],
            metrics={"drift_tokens": 0},
        ),
    ]


def test_rewards_and_pass_rate_are_over_graded_trajectories(batch):
    metrics = rollout_metrics(batch)
    assert metrics["rollout/num_trajectories"] == 5
    assert metrics["rollout/num_graded"] == 3
    assert metrics["rollout/num_trainable"] == 3
    assert metrics["rollout/reward_mean"] == pytest.approx(0.5)
    assert metrics["rollout/reward_std"] == pytest.approx(math.sqrt(1 / 6))
    assert (metrics["rollout/reward_min"], metrics["rollout/reward_max"]) == (0.0, 1.0)
    assert metrics["rollout/pass_rate"] == pytest.approx(1 / 3)


def test_failure_taxonomy_counts_every_status(batch):
    metrics = rollout_metrics(batch)
    assert metrics["failures/timeout"] == 1
    assert metrics["failures/sandbox_error"] == 1
    assert metrics["failures/grading_error"] == 1
    assert metrics["failures/engine_error"] == 0  # present even when zero
    assert metrics["failures/total"] == 3
    assert "failures/ok" not in metrics


def test_segments_and_tokens(batch):
    metrics = rollout_metrics(batch)
    assert metrics["segments/total"] == 5
    assert metrics["segments/start"] == 4 and metrics["segments/history_rewritten"] == 1
    assert metrics["segments/tools_changed"] == 0
    assert metrics["segments/per_trajectory_mean"] == pytest.approx(1.0)
    assert metrics["tokens/sampled_total"] == 5 + 3 + 2 + 4 + 1
    assert metrics["tokens/prompt_total"] == 10 + 10 + 4 + 6 + 3
    assert metrics["tokens/sampled_mean"] == pytest.approx(15 / 5)


def test_agent_behaviour_uses_reported_metrics_and_counts_the_rest(batch):
    metrics = rollout_metrics(batch)
    # "d" never ran (no tokens, no messages): it is left out of behaviour averages. "c" and "e" reported no
    # turns: they are counted from the conversation (c: 2 assistant turns, e: none recorded).
    assert metrics["agent/turns"] == pytest.approx((2 + 4 + 2 + 0) / 4)
    assert metrics["agent/tool_calls/bash"] == pytest.approx((3 + 1 + 2 + 0) / 4)
    assert metrics["agent/tool_calls/edit"] == pytest.approx(2 / 4)
    assert metrics["agent/tool_calls/submit"] == pytest.approx(1 / 4)
    assert metrics["agent/tool_calls"] == pytest.approx((3 + 3 + 3 + 0) / 4)
    assert metrics["agent/files_reread_after_edit"] == pytest.approx(0.5)  # over those that reported it
    assert metrics["time/wall_time_s"] == pytest.approx(6.0)  # durations go under time/
    assert metrics["agent/response_tokens"] == pytest.approx((5 + 5 + 4 + 1) / 4)
    assert "agent/drift_tokens" not in metrics and "time/sandbox_wait_s" not in metrics
    assert not any(key.startswith("agent/") and key.endswith("_s") for key in metrics)


def test_groups_drift_and_throughput(batch):
    metrics = rollout_metrics(batch, wall_time_s=30.0)
    assert metrics["groups/num"] == 3
    # g1 rewards {1, 0}: signal; g2 only {0.5} graded: no variance; g3 none graded: not counted.
    assert metrics["groups/zero_variance_fraction"] == pytest.approx(0.5)
    assert metrics["drift/tokens_total"] == 2 and metrics["drift/trajectories_with_drift"] == 1
    assert metrics["throughput/rollouts_per_min"] == pytest.approx(5 / 30 * 60)
    assert metrics["throughput/sampled_tokens_per_s"] == pytest.approx(15 / 30)
    assert metrics["throughput/sandbox_wait_s_mean"] == pytest.approx(2.0)
    assert metrics["throughput/sandbox_wait_s_total"] == pytest.approx(4.0)


def test_rollout_runner_metric_names_are_understood():
    ran = trajectory(
        "r",
        segments=[segment(2, 2)],
        metrics={"num_policy_calls": 5, "sandbox_acquire_s": 0.25, "harness_wall_time_s": 9},
    )
    metrics = rollout_metrics([ran])
    assert metrics["agent/turns"] == 5  # from the proxy's count of policy calls
    assert metrics["throughput/sandbox_wait_s_mean"] == 0.25
    assert metrics["time/harness_wall_time_s"] == 9


def test_drift_report_metrics():
    from components.tito.drift_audit import DriftReport

    reports = [
        DriftReport(num_tokens=100, num_mismatched=0, first_mismatch_index=None, num_rerendered_tokens=100),
        DriftReport(num_tokens=50, num_mismatched=5, first_mismatch_index=7, num_rerendered_tokens=52),
    ]
    assert drift_report_metrics(reports) == {
        "drift/segments_audited": 2.0,
        "drift/segments_with_drift": 1.0,
        "drift/tokens_audited": 150.0,
        "drift/tokens_mismatched": 5.0,
        "drift/mismatch_rate": pytest.approx(5 / 150),
    }
    assert drift_report_metrics([])["drift/mismatch_rate"] == 0.0


def test_malformed_tool_calls_are_a_step_figure_of_their_own():
    batch = [
        trajectory(
            "a", segments=[segment(2, 2)], metrics={"num_malformed_tool_calls": 3, "num_policy_calls": 4}
        ),
        trajectory(
            "b", segments=[segment(2, 2)], metrics={"num_malformed_tool_calls": 0, "num_policy_calls": 2}
        ),
    ]
    metrics = rollout_metrics(batch)
    assert metrics["tool_format/malformed_calls_total"] == 3
    assert metrics["tool_format/trajectories_with_malformed_calls"] == 1
    assert metrics["tool_format/malformed_calls_per_turn"] == pytest.approx(3 / 6)
    assert "agent/num_malformed_tool_calls" not in metrics


def test_without_wall_time_or_drift_those_keys_are_absent():
    metrics = rollout_metrics([trajectory("x", segments=[segment(2, 2)])], sandbox_wait_s=3.0)
    assert not any(k.startswith(("drift/", "throughput/rollouts", "tool_format/")) for k in metrics)
    assert metrics["throughput/sandbox_wait_s_total"] == 3.0


def test_empty_batch_gives_nan_means_and_zero_counts():
    metrics = rollout_metrics([])
    assert metrics["rollout/num_trajectories"] == 0 and metrics["failures/total"] == 0
    assert math.isnan(metrics["rollout/reward_mean"]) and math.isnan(metrics["rollout/pass_rate"])


def test_bad_wall_time_is_refused():
    with pytest.raises(ValueError, match="wall_time_s"):
        rollout_metrics([], wall_time_s=0)


def test_conversation_counts_ignore_malformed_entries():
    turns, calls = conversation_counts(
        [{"role": "assistant", "tool_calls": [call("a"), {"bad": 1}]}, "junk", {"role": "user"}]
    )
    assert turns == 1 and calls == {"a": 1, "unknown": 1}


def test_metrics_of_the_realistic_run_read_back_from_parquet(run_dir):
    trajectories = TrajectoryStore(run_dir).read_all().trajectories
    metrics = rollout_metrics(trajectories, wall_time_s=10.0)
    assert metrics["rollout/num_trajectories"] == 6
    assert metrics["rollout/pass_rate"] == pytest.approx(0.5)
    assert metrics["segments/history_rewritten"] == 1
    assert metrics["agent/tool_calls/str_replace"] > 0
    assert all(isinstance(v, float) for v in metrics.values())


def test_grading_errors_are_counted_by_kind():
    import dataclasses

    from components.errors import GRADING_ERROR_KINDS, grading_failure_reason

    base = trajectory("x", status=TrajectoryStatus.GRADING_ERROR, reward=None)
    batch = [
        dataclasses.replace(base, failure_reason=grading_failure_reason("sandbox", "it died")),
        dataclasses.replace(base, failure_reason=grading_failure_reason("sandbox", "again")),
        dataclasses.replace(base, failure_reason=grading_failure_reason("observer", "never started")),
        dataclasses.replace(base, failure_reason="grader raised KeyError: 'x'"),
    ]
    metrics = rollout_metrics(batch)
    expected = {"sandbox": 2, "observer": 1, "other": 1}
    assert {kind: metrics[f"failures/grading_error/{kind}"] for kind in GRADING_ERROR_KINDS} == {
        kind: expected.get(kind, 0) for kind in GRADING_ERROR_KINDS
    }


def test_harness_metrics_appear_per_harness_only_when_harnesses_mix():
    import dataclasses

    ran = [segment(3, 2)]
    one = [
        trajectory("a", reward=1.0, metrics={"turns": 2}, segments=ran),
        trajectory("b", reward=0.0, metrics={"turns": 4}, segments=ran),
    ]
    assert not any(key.startswith("harness/") for key in rollout_metrics(one))
    mixed = [
        dataclasses.replace(one[0], harness="codex"),
        dataclasses.replace(one[1], harness="opencode"),
        dataclasses.replace(
            trajectory(
                "c", status=TrajectoryStatus.AGENT_ERROR, reward=None, metrics={"turns": 1}, segments=ran
            ),
            harness="opencode",
        ),
    ]
    metrics = rollout_metrics(mixed)
    assert metrics["harness/codex/num_trajectories"] == 1 and metrics["harness/codex/reward_mean"] == 1.0
    assert (
        metrics["harness/opencode/num_trajectories"] == 2 and metrics["harness/opencode/reward_mean"] == 0.0
    )
    assert metrics["harness/opencode/failures"] == 1 and metrics["harness/codex/failures"] == 0
    assert metrics["harness/opencode/turns_mean"] == 2.5 and metrics["harness/codex/pass_rate"] == 1.0
