"""Session lineage: every segment names its parent segment, the branch point and the kind of branch (the
shapes of Claude Code's Task sub-agents, its compaction and title calls, retries, forks), and the lineage
survives the Parquet store, old (trajectory/2) files reading as roots."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from components.sampling import SamplingDistribution
from components.tito import ChatMessage, TitoSession, ToolSpec
from components.trajectory import (
    TRAJECTORY_SCHEMA,
    BranchKind,
    Trajectory,
    TrajectoryStatus,
    trajectories_from_table,
    trajectories_to_table,
)
from components.trajectory_store import TrajectoryStore
from tests.components.tito.test_tito_session import tool_reply

SYSTEM = ChatMessage(role="system", content="You are Claude Code, a coding agent.")
TASK = ToolSpec(name="Task", parameters={"type": "object", "properties": {"prompt": {"type": "string"}}})
BASH = ToolSpec(name="Bash", parameters={"type": "object", "properties": {"command": {"type": "string"}}})
SUBAGENT_PROMPT = "Find every caller of slugify() in the repository and report their files."
SUMMARY = "Summary: the slugify bug is in minilib/text.py; the fix strips edge dashes."


def _turn(tito, tokenizer, make_result, messages, tools, reply, sampling=SamplingDistribution()):
    turn = tito.prepare(messages, tools, max_tokens=64, sampling=sampling)
    return tito.complete(turn, make_result(tokenizer, reply))


def test_subagent_compaction_side_call_retry_and_continuation_are_labelled(tokenizer, make_result):
    tito = TitoSession(tokenizer, context_window=32_000, session_id="lineage")
    main = [SYSTEM, ChatMessage(role="user", content="Fix the slugify bug.")]
    call = _turn(
        tito,
        tokenizer,
        make_result,
        main,
        (TASK, BASH),
        tool_reply("", [("Task", {"prompt": SUBAGENT_PROMPT})]),
    )
    main += [call.to_message()]
    root_length = len(tito.segments()[0].token_ids)
    # the sub-agent: its own system prompt and tools, its first prompt the Task call's text
    sub = [
        ChatMessage(role="system", content="You are a search sub-agent."),
        ChatMessage(role="user", content=SUBAGENT_PROMPT),
    ]
    _turn(tito, tokenizer, make_result, sub, (BASH,), "Only minilib/text.py calls it.")
    # a title side call (no tools, another system prompt)
    title = [
        ChatMessage(role="system", content="Write a 5-word title."),
        ChatMessage(role="user", content="fix slugify"),
    ]
    _turn(tito, tokenizer, make_result, title, (), "Fixing slugify")
    # the main conversation goes on (extends the root), then asks for a summary (compaction request)
    main += [
        ChatMessage(role="tool", content="Only minilib/text.py calls it.", tool_call_id=call.tool_calls[0].id)
    ]
    summary = _turn(
        tito,
        tokenizer,
        make_result,
        [*main, ChatMessage(role="user", content="Summarize.")],
        (TASK, BASH),
        SUMMARY,
    )
    # the retried summary request (the harness lost the answer)
    _turn(
        tito,
        tokenizer,
        make_result,
        [*main, ChatMessage(role="user", content="Summarize.")],
        (TASK, BASH),
        SUMMARY,
    )
    # the compacted conversation: resumes from the summary
    compacted = [
        SYSTEM,
        ChatMessage(role="user", content=f"This session continues a previous one.\n{summary.content}"),
    ]
    resumed = _turn(tito, tokenizer, make_result, compacted, (TASK, BASH), "Continuing with the fix.")
    # the same conversation under another sampling distribution: a continuation in a new segment
    _turn(
        tito,
        tokenizer,
        make_result,
        [*compacted, resumed.to_message(), ChatMessage(role="user", content="go on")],
        (TASK, BASH),
        "ok",
        sampling=SamplingDistribution(temperature=0.5),
    )
    segments = tito.segments()
    lineage = [(s.branch_kind, s.parent_segment) for s in segments]
    assert lineage == [
        (BranchKind.ROOT, -1),
        (BranchKind.SUBAGENT, 0),
        (BranchKind.SIDE_CALL, 1),  # beside the conversation used last
        (BranchKind.RETRY, 0),
        (BranchKind.COMPACTION, 3),  # resumes from the latest summary: the retried one
        (BranchKind.CONTINUATION, 4),
    ]
    assert segments[1].branch_position == root_length  # right after the Task call
    # the retry reuses the root's held ids up to its last checkpoint (after the Task call): the branch point
    position = segments[3].branch_position
    assert position == root_length
    assert segments[3].token_ids[:position].tolist() == segments[0].token_ids[:position].tolist()
    assert segments[4].branch_position == len(segments[3].token_ids)  # right after that summary
    assert segments[5].branch_position == len(segments[4].token_ids)


SPAWN = ToolSpec(  # Codex's sub-agent tool, as the proxy names a function of a Responses ``namespace`` tool
    name="multi_agent_v1.spawn_agent",
    parameters={"type": "object", "properties": {"message": {"type": "string"}}},
)


def test_a_codex_sub_agent_after_its_context_prompt_is_a_subagent(tokenizer, make_result):
    """Codex's sub-agent conversation starts with its environment context; the spawn call's text is a later
    prompt. A resumed conversation whose summary quotes the spawn call is a compaction all the same."""
    tito = TitoSession(tokenizer, context_window=32_000, session_id="codex")
    main = [SYSTEM, ChatMessage(role="user", content="Fix the slugify bug.")]
    call = _turn(
        tito,
        tokenizer,
        make_result,
        main,
        (SPAWN, BASH),
        tool_reply("", [(SPAWN.name, {"message": SUBAGENT_PROMPT})]),
    )
    root_length = len(tito.segments()[0].token_ids)
    context = ChatMessage(role="user", content="<environment_context><cwd>/work</cwd></environment_context>")
    sub = [SYSTEM, context, ChatMessage(role="user", content=SUBAGENT_PROMPT)]
    _turn(tito, tokenizer, make_result, sub, (SPAWN, BASH), "Only minilib/text.py calls it.")
    summary_text = f"{SUMMARY} I asked a sub-agent: {SUBAGENT_PROMPT}"
    summary = _turn(
        tito,
        tokenizer,
        make_result,
        [
            *main,
            call.to_message(),
            ChatMessage(role="tool", content="{}", tool_call_id=call.tool_calls[0].id),
        ],
        (SPAWN, BASH),
        summary_text,
    )
    resumed = [SYSTEM, context, ChatMessage(role="user", content=summary.content)]
    _turn(tito, tokenizer, make_result, resumed, (SPAWN, BASH), "Continuing.")
    segments = tito.segments()
    assert [(s.branch_kind, s.parent_segment) for s in segments] == [
        (BranchKind.ROOT, -1),
        (BranchKind.SUBAGENT, 0),
        (BranchKind.COMPACTION, 0),
    ]
    assert segments[1].branch_position == root_length  # right after the spawn call


def test_a_fork_from_an_edited_history(tokenizer, make_result):
    tito = TitoSession(tokenizer, context_window=32_000, session_id="fork")
    messages = [SYSTEM, ChatMessage(role="user", content="hello")]
    reply = _turn(tito, tokenizer, make_result, messages, (), "Hi! How can I help?")
    _turn(
        tito,
        tokenizer,
        make_result,
        [*messages, reply.to_message(), ChatMessage(role="user", content="A")],
        (),
        "a",
    )
    _turn(
        tito,
        tokenizer,
        make_result,
        [*messages, reply.to_message(), ChatMessage(role="user", content="B")],
        (),
        "b",
    )
    segments = tito.segments()
    assert [(s.branch_kind, s.parent_segment) for s in segments] == [
        (BranchKind.ROOT, -1),
        (BranchKind.FORK, 0),
    ]


def test_lineage_survives_the_store_and_old_files_read_as_roots(tokenizer, make_result, tmp_path):
    tito = TitoSession(tokenizer, context_window=32_000, session_id="store")
    main = [SYSTEM, ChatMessage(role="user", content="Fix it.")]
    call = _turn(
        tito, tokenizer, make_result, main, (TASK,), tool_reply("", [("Task", {"prompt": SUBAGENT_PROMPT})])
    )
    _turn(tito, tokenizer, make_result, [ChatMessage(role="user", content=SUBAGENT_PROMPT)], (BASH,), "done")
    assert call.tool_calls
    trajectory = Trajectory(
        trajectory_id="t",
        group_id="g",
        task_id="k",
        harness="h",
        status=TrajectoryStatus.OK,
        reward=1.0,
        segments=tuple(tito.segments()),
    )
    store = TrajectoryStore(tmp_path / "new")
    store.write([trajectory])
    [read] = store.read_all().trajectories
    assert read.segments == trajectory.segments and read.segments[1].branch_kind == BranchKind.SUBAGENT
    assert TRAJECTORY_SCHEMA.metadata[b"rein.schema"] == b"trajectory/4"
    # a trajectory/2 file: the segment struct without the lineage fields
    table = trajectories_to_table([trajectory])
    old_segment_type = pa.struct(
        [
            f
            for f in TRAJECTORY_SCHEMA.field("segments").type.value_type
            if f.name not in ("parent_segment", "branch_position", "branch_kind")
        ]
    )
    old_schema = TRAJECTORY_SCHEMA.set(
        TRAJECTORY_SCHEMA.get_field_index("segments"),
        pa.field("segments", pa.list_(old_segment_type), nullable=False),
    )
    old = pa.Table.from_pylist(
        [
            {
                **row,
                "segments": [
                    {k: v for k, v in s.items() if k in old_segment_type.names} for s in row["segments"]
                ],
            }
            for row in table.to_pylist()
        ],
        schema=old_schema.with_metadata({"rein.schema": "trajectory/2"}),
    )
    (tmp_path / "old").mkdir()
    pq.write_table(old, tmp_path / "old" / "step-000000-old.parquet")
    [old_read] = trajectories_from_table(
        pq.read_table(tmp_path / "old" / "step-000000-old.parquet", schema=TRAJECTORY_SCHEMA)
    )
    assert [s.branch_kind for s in old_read.segments] == [BranchKind.ROOT, BranchKind.ROOT]
    assert [s.token_ids.tolist() for s in old_read.segments] == [
        s.token_ids.tolist() for s in trajectory.segments
    ]


def test_a_toolless_request_quoting_a_call_is_a_side_call(tokenizer, make_result):
    """Claude Code's command checks quote the policy's Bash command to a tool-less model call: a side call,
    not a sub-agent."""
    tito = TitoSession(tokenizer, context_window=32_000, session_id="check")
    command = "python -m pytest -q tests/test_text.py -k slugify"
    main = [SYSTEM, ChatMessage(role="user", content="Fix it.")]
    _turn(tito, tokenizer, make_result, main, (BASH,), tool_reply("", [("Bash", {"command": command})]))
    check = [
        ChatMessage(role="system", content="Detect the command prefix."),
        ChatMessage(role="user", content=f"Command: {command}"),
    ]
    _turn(tito, tokenizer, make_result, check, (), "python")
    assert [s.branch_kind for s in tito.segments()] == [BranchKind.ROOT, BranchKind.SIDE_CALL]
