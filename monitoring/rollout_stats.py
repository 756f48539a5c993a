"""One step's rollouts → a flat dict of metrics for the loggers (pure functions, no I/O).

Keys (every count key is present even when zero, so charts line up across steps):
- ``rollout/num_trajectories``, ``rollout/num_graded`` (reward not None), ``rollout/num_trainable``;
  ``rollout/reward_mean|std|min|max`` and ``rollout/pass_rate`` (reward == 1) over graded trajectories.
- ``failures/<status>`` for every non-ok ``TrajectoryStatus``, ``failures/total``, and
  ``failures/grading_error/<kind>`` for every ``components.errors.GRADING_ERROR_KINDS`` (what part failed).
- ``segments/total``, ``segments/per_trajectory_mean``, ``segments/<reason>`` for every ``SegmentReason``.
- ``tokens/sampled_total|sampled_mean|prompt_total`` from the segments' loss masks.
- ``agent/<metric>``: the mean over trajectories where the agent ran (it has tokens or messages) of each
  numeric trajectory metric (``turns``, ``tool_calls``, ``files_reread_after_edit``, ``response_tokens`` …);
  ``agent/tool_calls/<name>`` is the mean number of calls of each tool per trajectory. ``turns`` falls back to
  the proxy's ``num_policy_calls``, then to the conversation; tool calls are counted from the conversation
  when the harness did not report them. Durations (metrics ending in ``_s``) go to ``time/<metric>``.
- ``harness/<name>/…`` when the step mixes harnesses (``components/rollout/mixture.py``): per harness, its
  ``num_trajectories``, ``reward_mean``, ``pass_rate``, ``turns_mean`` and ``failures`` (non-ok count).
- ``groups/num``, ``groups/zero_variance_fraction`` (GRPO groups whose rewards are all equal: no signal).
- ``drift/tokens_total``, ``drift/trajectories_with_drift`` when trajectories report ``drift_tokens``.
- ``tool_format/malformed_calls_total``, ``tool_format/trajectories_with_malformed_calls`` and
  ``tool_format/malformed_calls_per_turn`` when trajectories report ``num_malformed_tool_calls`` (the proxy sets
  it on every trajectory: calls the model botched, served as content).
- ``throughput/rollouts_per_min``, ``throughput/sampled_tokens_per_s`` when ``wall_time_s`` is given;
  ``throughput/sandbox_wait_s_mean|total`` from the trajectories' ``sandbox_wait_s`` / ``sandbox_acquire_s``
  metric, or the argument.
- ``drift_report_metrics(reports)``: ``drift/…`` from TITO drift-audit reports, for a recipe that audits.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from components.errors import GRADING_ERROR_KINDS, grading_error_kind
from components.trajectory import MALFORMED_TOOL_CALLS_METRIC, SegmentReason, Trajectory, TrajectoryStatus

PASS_REWARD = 1.0
TOOL_CALL_PREFIX = "tool_calls/"
DRIFT_METRIC = "drift_tokens"
# How long a rollout waited for its sandbox: the harness's own figure, or the rollout runner's.
SANDBOX_WAIT_METRICS = ("sandbox_wait_s", "sandbox_acquire_s")
# trajectory metrics with a section of their own, not averaged under agent/
OWN_SECTION_METRICS = frozenset({DRIFT_METRIC, MALFORMED_TOOL_CALLS_METRIC, *SANDBOX_WAIT_METRICS})
DURATION_SUFFIX = "_s"  # trajectory metrics ending in _s are durations: reported under time/


def rollout_metrics(
    trajectories: Sequence[Trajectory],
    *,
    wall_time_s: float | None = None,
    sandbox_wait_s: float | None = None,
) -> dict[str, float]:
    """Flat metrics of one step's rollouts; ``wall_time_s`` (the step's rollout phase) enables throughput."""
    if wall_time_s is not None and not (math.isfinite(wall_time_s) and wall_time_s > 0):
        raise ValueError(f"wall_time_s: must be a finite number > 0, got {wall_time_s!r}")
    metrics: dict[str, float] = {}
    metrics.update(reward_metrics(trajectories))
    metrics.update(failure_counts(trajectories))
    metrics.update(segment_metrics(trajectories))
    metrics.update(agent_behaviour_metrics(trajectories))
    metrics.update(harness_metrics(trajectories))
    metrics.update(group_metrics(trajectories))
    metrics.update(drift_metrics(trajectories))
    metrics.update(malformed_tool_call_metrics(trajectories))
    metrics.update(throughput_metrics(trajectories, wall_time_s=wall_time_s, sandbox_wait_s=sandbox_wait_s))
    return metrics


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def reward_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Mean/std/min/max reward and pass rate over graded trajectories, plus counts."""
    rewards = [t.reward for t in trajectories if t.reward is not None]
    mean = _mean(rewards)
    std = math.sqrt(_mean([(r - mean) ** 2 for r in rewards])) if rewards else math.nan
    return {
        "rollout/num_trajectories": float(len(trajectories)),
        "rollout/num_graded": float(len(rewards)),
        "rollout/num_trainable": float(sum(t.trainable for t in trajectories)),
        "rollout/reward_mean": mean,
        "rollout/reward_std": std,
        "rollout/reward_min": min(rewards) if rewards else math.nan,
        "rollout/reward_max": max(rewards) if rewards else math.nan,
        "rollout/pass_rate": _mean([float(r == PASS_REWARD) for r in rewards]),
    }


def failure_counts(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``failures/<status>`` for every non-ok status, and ``failures/total``."""
    counts = Counter(t.status for t in trajectories)
    out = {f"failures/{s.value}": float(counts[s]) for s in TrajectoryStatus if s != TrajectoryStatus.OK}
    out["failures/total"] = float(sum(n for s, n in counts.items() if s != TrajectoryStatus.OK))
    kinds = Counter(
        grading_error_kind(t.failure_reason)
        for t in trajectories
        if t.status == TrajectoryStatus.GRADING_ERROR
    )
    out.update({f"failures/grading_error/{kind}": float(kinds[kind]) for kind in GRADING_ERROR_KINDS})
    return out


def segment_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Segment counts by the reason each began, and sampled/prompt token totals."""
    reasons = Counter(s.reason for t in trajectories for s in t.segments)
    total = sum(reasons.values())
    sampled = [sum(s.num_sampled_tokens for s in t.segments) for t in trajectories]
    all_tokens = sum(len(s.token_ids) for t in trajectories for s in t.segments)
    out = {f"segments/{r.value}": float(reasons[r]) for r in SegmentReason}
    out["segments/total"] = float(total)
    out["segments/per_trajectory_mean"] = total / len(trajectories) if trajectories else math.nan
    out["tokens/sampled_total"] = float(sum(sampled))
    out["tokens/sampled_mean"] = _mean([float(n) for n in sampled])
    out["tokens/prompt_total"] = float(all_tokens - sum(sampled))
    return out


def conversation_counts(messages: Iterable[Mapping[str, Any]]) -> tuple[int, Counter[str]]:
    """Assistant turns and tool calls by name in an OpenAI-style message list."""
    turns = 0
    calls: Counter[str] = Counter()
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        turns += 1
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, Mapping) else {}
            calls[str(function.get("name") or "unknown")] += 1
    return turns, calls


def _parsed_messages(trajectory: Trajectory) -> list[Any]:
    try:
        messages = json.loads(trajectory.messages_json)
    except (json.JSONDecodeError, TypeError):
        return []
    return messages if isinstance(messages, list) else []


def agent_behaviour_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``agent/<metric>`` means of the harness's metrics over trajectories where the agent ran, with turns and
    tool calls counted from the conversation where the harness did not report them."""
    per_key: dict[str, list[float]] = defaultdict(list)
    tool_calls_per_trajectory: list[Counter[str]] = []
    for trajectory in trajectories:
        if not trajectory.segments and not _parsed_messages(trajectory):
            continue  # the agent never ran (e.g. the sandbox failed to start): no behaviour to average
        reported = dict(trajectory.metrics)
        reported_tools = Counter(
            {
                k.removeprefix(TOOL_CALL_PREFIX): v
                for k, v in reported.items()
                if k.startswith(TOOL_CALL_PREFIX)
            }
        )
        if "turns" not in reported and "num_policy_calls" in reported:
            reported["turns"] = reported["num_policy_calls"]
        if "turns" not in reported or ("tool_calls" not in reported and not reported_tools):
            turns, counted_tools = conversation_counts(_parsed_messages(trajectory))
            reported.setdefault("turns", float(turns))
            if "tool_calls" not in reported and not reported_tools:
                reported_tools = counted_tools
        reported.setdefault("tool_calls", float(sum(reported_tools.values())))
        if "response_tokens" not in reported:
            reported["response_tokens"] = float(sum(s.num_sampled_tokens for s in trajectory.segments))
        tool_calls_per_trajectory.append(reported_tools)
        for key, value in reported.items():
            if key.startswith(TOOL_CALL_PREFIX) or key in OWN_SECTION_METRICS:
                continue
            if math.isfinite(value):
                per_key[key].append(value)
    out = {
        (f"time/{key}" if key.endswith(DURATION_SUFFIX) else f"agent/{key}"): _mean(values)
        for key, values in sorted(per_key.items())
    }
    tool_names = sorted({name for counts in tool_calls_per_trajectory for name in counts})
    for name in tool_names:  # a trajectory that never called a tool counts as zero calls of it
        out[f"agent/{TOOL_CALL_PREFIX}{name}"] = _mean([float(c[name]) for c in tool_calls_per_trajectory])
    return out


def harness_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``harness/<name>/…`` reward, turn and failure figures per harness, when more than one harness ran."""
    by_harness: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_harness[trajectory.harness].append(trajectory)
    if len(by_harness) < 2:
        return {}
    out: dict[str, float] = {}
    for name, members in sorted(by_harness.items()):
        rewards = reward_metrics(members)
        turns = agent_behaviour_metrics(members).get("agent/turns", math.nan)
        out[f"harness/{name}/num_trajectories"] = float(len(members))
        out[f"harness/{name}/reward_mean"] = rewards["rollout/reward_mean"]
        out[f"harness/{name}/pass_rate"] = rewards["rollout/pass_rate"]
        out[f"harness/{name}/turns_mean"] = turns
        out[f"harness/{name}/failures"] = failure_counts(members)["failures/total"]
    return out


def group_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """How many GRPO groups there are and the fraction whose graded rewards are all equal."""
    groups: dict[str, list[float]] = defaultdict(list)
    for trajectory in trajectories:
        rewards = groups[trajectory.group_id]  # every group counts, graded or not
        if trajectory.reward is not None:
            rewards.append(trajectory.reward)
    graded = [rewards for rewards in groups.values() if rewards]
    zero_variance = [len(set(rewards)) == 1 for rewards in graded]
    return {
        "groups/num": float(len(groups)),
        "groups/zero_variance_fraction": _mean([float(z) for z in zero_variance]),
    }


def drift_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Drift-audit token counts, when trajectories report them (``drift_tokens``)."""
    drift = [t.metrics[DRIFT_METRIC] for t in trajectories if DRIFT_METRIC in t.metrics]
    if not drift:
        return {}
    return {
        "drift/tokens_total": float(sum(drift)),
        "drift/trajectories_with_drift": float(sum(d > 0 for d in drift)),
    }


def malformed_tool_call_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Tool calls the model botched (served as content), when trajectories report them: the step's total, how
    many trajectories had one, and the total per policy call."""
    reporting = [t for t in trajectories if MALFORMED_TOOL_CALLS_METRIC in t.metrics]
    if not reporting:
        return {}
    counts = [t.metrics[MALFORMED_TOOL_CALLS_METRIC] for t in reporting]
    num_calls = sum(t.metrics.get("num_policy_calls", 0.0) for t in reporting)
    return {
        "tool_format/malformed_calls_total": float(sum(counts)),
        "tool_format/trajectories_with_malformed_calls": float(sum(c > 0 for c in counts)),
        "tool_format/malformed_calls_per_turn": sum(counts) / num_calls if num_calls else math.nan,
    }


def throughput_metrics(
    trajectories: Sequence[Trajectory],
    *,
    wall_time_s: float | None = None,
    sandbox_wait_s: float | None = None,
) -> dict[str, float]:
    """Rollouts per minute and sampled tokens per second over ``wall_time_s``; sandbox wait."""
    out: dict[str, float] = {}
    if wall_time_s is not None:
        sampled = sum(s.num_sampled_tokens for t in trajectories for s in t.segments)
        out["throughput/rollouts_per_min"] = len(trajectories) / wall_time_s * 60.0
        out["throughput/sampled_tokens_per_s"] = sampled / wall_time_s
    waits = [
        next(t.metrics[key] for key in SANDBOX_WAIT_METRICS if key in t.metrics)
        for t in trajectories
        if any(key in t.metrics for key in SANDBOX_WAIT_METRICS)
    ]
    if waits:
        out["throughput/sandbox_wait_s_mean"] = _mean(waits)
        out["throughput/sandbox_wait_s_total"] = float(sum(waits))
    elif sandbox_wait_s is not None:
        out["throughput/sandbox_wait_s_total"] = float(sandbox_wait_s)
        out["throughput/sandbox_wait_s_mean"] = (
            sandbox_wait_s / len(trajectories) if trajectories else math.nan
        )
    return out


def drift_report_metrics(reports: Iterable[Any]) -> dict[str, float]:
    """``drift/…`` from TITO drift-audit reports (anything with ``num_tokens`` and ``num_mismatched``):
    audited and mismatched token counts, the mismatch rate, and how many segments drifted at all."""
    reports = list(reports)
    audited = sum(int(r.num_tokens) for r in reports)
    mismatched = sum(int(r.num_mismatched) for r in reports)
    return {
        "drift/segments_audited": float(len(reports)),
        "drift/segments_with_drift": float(sum(int(r.num_mismatched) > 0 for r in reports)),
        "drift/tokens_audited": float(audited),
        "drift/tokens_mismatched": float(mismatched),
        "drift/mismatch_rate": mismatched / audited if audited else 0.0,
    }
