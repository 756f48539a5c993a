"""Hand-built but realistic trajectories for the monitoring tests: ChatML token ids from the real tokenizer,
tool calls and outputs, a compacted (second-segment) trajectory, infrastructure failures, hostile text."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from components.trajectory import BranchKind, Segment, SegmentReason, Trajectory, TrajectoryStatus


def tool_call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def chatml_segment(tokenizer, messages: list[dict], *, reason=SegmentReason.START, seed: int = 0) -> Segment:
    """Token ids of ``messages`` rendered as ChatML; assistant turns are "sampled" (mask 1, logprob < 0)."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    mask: list[int] = []
    for message in messages:
        text = message.get("content") or ""
        for call in message.get("tool_calls") or ():
            text += f"\n<tool_call>{call['function']['name']} {call['function']['arguments']}</tool_call>"
        head = tokenizer.encode(f"<|im_start|>{message['role']}\n", add_special_tokens=False)
        body = tokenizer.encode(f"{text}<|im_end|>", add_special_tokens=False)
        tail = tokenizer.encode("\n", add_special_tokens=False)
        sampled = 1 if message["role"] == "assistant" else 0
        ids += head + body + tail
        mask += [0] * len(head) + [sampled] * len(body) + [0] * len(tail)
    mask_array = np.asarray(mask, dtype=np.int8)
    logprobs = np.where(mask_array == 1, -rng.uniform(0.01, 3.0, len(ids)), 0.0)
    versions = np.where(mask_array == 1, 3, -1)
    return Segment(
        token_ids=ids, loss_mask=mask_array, logprobs=logprobs, weight_versions=versions, reason=reason
    )


SYSTEM = {"role": "system", "content": "You are a careful software engineer. Use the bash tool."}


def solved_conversation(task: str) -> list[dict]:
    return [
        SYSTEM,
        {"role": "user", "content": f"Fix the failing test in {task}."},
        {
            "role": "assistant",
            "content": "Let me look at the code.",
            "tool_calls": [tool_call("call_1", "bash", {"command": "cat calc.py"})],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "def add(a, b):\n    return a - b\n"},
        {
            "role": "assistant",
            "content": "The sign is wrong.",
            "tool_calls": [
                tool_call("call_2", "str_replace", {"path": "calc.py", "old": "a - b", "new": "a + b"})
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "edited calc.py"},
        {"role": "assistant", "content": "Fixed: add now returns a + b."},
    ]


def build_trajectories(tokenizer) -> list[Trajectory]:
    """Six trajectories over two steps, three tasks, every interesting status and a second segment."""
    out = []
    conversation = solved_conversation("calc")
    out.append(
        Trajectory(
            trajectory_id="traj-ok-calc-0",
            group_id="g-calc-1",
            task_id="calc",
            harness="swe_agent",
            status=TrajectoryStatus.OK,
            reward=1.0,
            step=1,
            metrics={
                "turns": 3,
                "tool_calls": 2,
                "tool_calls/bash": 1,
                "tool_calls/str_replace": 1,
                "wall_time_s": 12.5,
                "files_reread_after_edit": 1,
                "sandbox_wait_s": 0.5,
            },
            segments=(chatml_segment(tokenizer, conversation, seed=1),),
            messages_json=json.dumps(conversation),
            log="harness: 3 turns\ngrading: PASSED tests/test_calc.py::test_add",
        )
    )
    hostile = [
        SYSTEM,
        {"role": "user", "content": "Fix <b>bold</b> <script>document.title='pwned'</script>"},
        {"role": "assistant", "content": "<img src=x onerror=\"document.title='pwned'\"> I give up."},
    ]
    out.append(
        Trajectory(
            trajectory_id="traj-fail-calc-1",
            group_id="g-calc-1",
            task_id="calc",
            harness="swe_agent",
            status=TrajectoryStatus.OK,
            reward=0.0,
            step=1,
            metrics={"turns": 1, "tool_calls": 0, "wall_time_s": 3.0},
            segments=(chatml_segment(tokenizer, hostile, seed=2),),
            messages_json=json.dumps(hostile),
            log="grading: FAILED tests/test_calc.py::test_add - assert -1 == 3",
        )
    )
    first = solved_conversation("strings")[:4]
    rewritten = [
        SYSTEM,
        {"role": "user", "content": "Summary so far: calc.py read. Continue."},
        {"role": "assistant", "content": "Continuing after compaction."},
    ]
    out.append(
        Trajectory(
            trajectory_id="traj-compacted-strings",
            group_id="g-strings-2",
            task_id="strings",
            harness="swe_agent",
            status=TrajectoryStatus.TURN_LIMIT,
            failure_reason="ran past 2 turns",
            reward=0.0,
            step=2,
            metrics={"turns": 2, "tool_calls/bash": 1, "drift_tokens": 2},
            segments=(
                chatml_segment(tokenizer, first, seed=3),
                dataclasses.replace(
                    chatml_segment(tokenizer, rewritten, reason=SegmentReason.HISTORY_REWRITTEN, seed=4),
                    parent_segment=0,
                    branch_position=len(chatml_segment(tokenizer, first, seed=3).token_ids),
                    branch_kind=BranchKind.COMPACTION,
                ),
            ),
            messages_json=json.dumps(first + rewritten[1:]),
            log="harness: turn limit reached",
        )
    )
    out.append(
        Trajectory(
            trajectory_id="traj-sandbox-died",
            group_id="g-strings-2",
            task_id="strings",
            harness="swe_agent",
            status=TrajectoryStatus.SANDBOX_ERROR,
            failure_reason="SandboxError: bwrap exited with 1",
            step=2,
            log="sandbox: bwrap: No permissions to create new namespace",
        )
    )
    parse = solved_conversation("parse")
    out.append(
        Trajectory(
            trajectory_id="traj-ok-parse",
            group_id="g-parse-2",
            task_id="parse",
            harness="claude_code",
            status=TrajectoryStatus.OK,
            reward=1.0,
            step=2,
            metrics={"turns": 3, "tool_calls/bash": 2},
            segments=(chatml_segment(tokenizer, parse, seed=5),),
            messages_json=json.dumps(parse),
            log="grading: PASSED",
        )
    )
    out.append(
        Trajectory(
            trajectory_id="traj-grading-error",
            group_id="g-parse-2",
            task_id="parse",
            harness="claude_code",
            status=TrajectoryStatus.GRADING_ERROR,
            failure_reason="pytest crashed while collecting",
            step=2,
            segments=(chatml_segment(tokenizer, parse[:3], seed=6),),
            messages_json=json.dumps(parse[:3]),
        )
    )
    return out


def train_logprob_rows(trajectories: list[Trajectory]):
    """Per-token train logprobs: the rollout's, off by 0.8 nats on every fifth sampled token."""
    for trajectory in trajectories:
        for index, segment in enumerate(trajectory.segments):
            train = segment.logprobs.astype(np.float64).copy()
            sampled = np.flatnonzero(segment.loss_mask)
            train[sampled[::5]] -= 0.8
            yield trajectory.trajectory_id, index, train
