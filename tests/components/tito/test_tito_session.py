"""TitoSession with the real SmolLM2 tokenizer: exact ids, splicing, segments, replies, errors, overflow."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from components.errors import ContextOverflowError, MissingLogprobsError
from components.protocols import FinishReason, GenerationResult
from components.tito import ChatMessage, TitoSession, ToolCall, ToolSpec, audit_session, drift_audit
from components.trajectory import SegmentReason

SYSTEM = ChatMessage(role="system", content="You are a coding agent. Use the tools.")
BASH = ToolSpec(
    name="bash",
    description="Run a shell command.",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
)
READ = ToolSpec(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
TOOLS = (BASH, READ)


def tool_reply(content: str, calls: list[tuple[str, dict]]) -> str:
    """A reply written the way the Hermes format (and our renderer) writes it."""
    blocks = [
        "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"
        for name, args in calls
    ]
    return "\n".join(([content] if content else []) + blocks)


def session(tokenizer, window: int = 32_000) -> TitoSession:
    return TitoSession(tokenizer, context_window=window, session_id="test")


def find_reencoding_mismatch(tokenizer) -> tuple[str, list[int]]:
    """Text plus ids that decode to it but are not what encoding it gives (split merges)."""
    for text in ("The answer is hello world.", "Okay, the function returns nothing.", "Running tests now."):
        canonical = tokenizer.encode(text, add_special_tokens=False)
        for cut in range(1, len(text)):
            ids = tokenizer.encode(text[:cut], add_special_tokens=False) + tokenizer.encode(
                text[cut:], add_special_tokens=False
            )
            if tokenizer.decode(ids) == text and ids != canonical:
                return text, ids
    raise AssertionError("no re-encoding mismatch found")


# ---------------------------------------------------------------------------------------------------------
# (a) the model's own ids are never re-tokenized
# ---------------------------------------------------------------------------------------------------------


def test_sampled_ids_that_reencode_differently_are_kept_exactly(tokenizer, make_result):
    text, odd_ids = find_reencoding_mismatch(tokenizer)
    assert tokenizer.encode(tokenizer.decode(odd_ids), add_special_tokens=False) != odd_ids
    tito = session(tokenizer)
    messages = [SYSTEM, ChatMessage(role="user", content="Say something.")]
    turn = tito.prepare(messages, (), max_tokens=64)
    result = make_result(tokenizer, ids=odd_ids, version=3)
    reply = tito.complete(turn, result)
    assert reply.content == text and reply.finish_reason == "stop"

    # The next request carries the reply as text; TITO must keep the sampled ids, not the re-encoding.
    messages = [*messages, reply.to_message(), ChatMessage(role="user", content="And again?")]
    turn2 = tito.prepare(messages, (), max_tokens=64)
    assert turn2.new_segment_reason is None
    held = list(turn.prompt_ids) + list(result.output_ids)
    assert list(turn2.prompt_ids[: len(held)]) == held
    tito.complete(turn2, make_result(tokenizer, "Sure.", version=4))

    (segment,) = tito.segments()
    start = len(turn.prompt_ids)
    assert segment.token_ids[start : start + len(result.output_ids)].tolist() == list(result.output_ids)
    assert segment.logprobs[start : start + len(result.output_ids)].tolist() == list(result.logprobs)
    assert segment.weight_versions[start : start + len(result.output_ids)].tolist() == [3] * len(
        result.output_ids
    )
    # A re-render would have drifted exactly there.
    report = audit_session(tito)[0]
    assert report.num_mismatched > 0
    assert report.first_mismatch_index is not None and start <= report.first_mismatch_index < start + len(
        odd_ids
    )


# ---------------------------------------------------------------------------------------------------------
# (b) a long tool-use conversation is one exact segment
# ---------------------------------------------------------------------------------------------------------


def run_tool_conversation(tokenizer, make_result, num_turns: int):
    """Drive ``num_turns`` tool-calling turns; returns the session, the final messages and expected records."""
    tito = session(tokenizer)
    messages = [SYSTEM, ChatMessage(role="user", content="Find the bug in the repository and fix it.")]
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    expected_logprobs: list[float] = []
    expected_versions: list[int] = []
    for turn_number in range(num_turns):
        turn = tito.prepare(messages, TOOLS, max_tokens=256)
        assert turn.new_segment_reason is (SegmentReason.START if turn_number == 0 else None)
        assert turn.segment_index == 0
        # Held ids reused exactly; only the appended part is new.
        assert list(turn.prompt_ids[: len(expected_ids)]) == expected_ids
        appended = list(turn.prompt_ids[len(expected_ids) :])
        if turn_number > 0:
            assert turn.num_reused_tokens == len(expected_ids)
            text = tokenizer.decode(appended, skip_special_tokens=False)
            assert text.startswith("\n<|im_start|>user\n<tool_response>\n")
            assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
            assert text.count("<|im_start|>") == 2  # consecutive tool results share ONE turn
        expected_ids += appended
        expected_mask += [0] * len(appended)
        expected_logprobs += [0.0] * len(appended)
        expected_versions += [-1] * len(appended)

        if turn_number < num_turns - 1:
            calls = [("bash", {"cmd": f"grep -n bug src/file_{turn_number}.py"})]
            if turn_number % 3 == 0:
                calls.append(("read_file", {"path": f"src/file_{turn_number}.py"}))
            reply_text = tool_reply(f"Step {turn_number}: checking file {turn_number}.", calls)
        else:
            reply_text = "The bug is fixed: the loop bound was off by one."
        result = make_result(tokenizer, reply_text, version=turn_number // 4)
        reply = tito.complete(turn, result)
        expected_ids += list(result.output_ids)
        expected_mask += [1] * len(result.output_ids)
        expected_logprobs += list(result.logprobs)
        expected_versions += list(result.weight_versions)

        messages.append(reply.to_message())
        if reply.tool_calls:
            assert reply.finish_reason == "tool_calls"
            for call in reply.tool_calls:
                output = f"output of {call.name}: line {turn_number * 7}: x = compute(y)\n"
                messages.append(ChatMessage(role="tool", content=output, tool_call_id=call.id))
    return tito, messages, (expected_ids, expected_mask, expected_logprobs, expected_versions)


def test_multi_turn_tool_conversation_is_one_exact_segment(tokenizer, make_result):
    tito, messages, (ids, mask, logprobs, versions) = run_tool_conversation(
        tokenizer, make_result, num_turns=12
    )
    (segment,) = tito.segments()
    assert segment.reason == SegmentReason.START
    assert segment.token_ids.tolist() == ids
    assert segment.loss_mask.tolist() == mask
    assert np.array_equal(segment.logprobs, np.asarray(logprobs, dtype=np.float32))
    assert segment.weight_versions.tolist() == versions
    assert set(segment.weight_versions[segment.loss_mask == 1].tolist()) == {0, 1, 2}
    assert (segment.logprobs[segment.loss_mask == 0] == 0).all()
    # Replies re-encode identically here, so the template's render of the whole conversation gives the same ids.
    rendered = tito.renderer.render_ids(messages, TOOLS, add_generation_prompt=False)
    assert rendered[: len(ids)] == ids
    assert drift_audit(tokenizer, segment.token_ids, messages, TOOLS).num_mismatched == 0
    assert audit_session(tito)[0].num_mismatched == 0


def test_prompt_is_the_template_render_and_tools_go_into_the_system_message(tokenizer):
    tito = session(tokenizer)
    messages = [SYSTEM, ChatMessage(role="user", content="hi")]
    turn = tito.prepare(messages, TOOLS, max_tokens=16)
    text = tokenizer.decode(turn.prompt_ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou are a coding agent. Use the tools.\n\n# Tools")
    assert '"name": "bash"' in text and "<tools>" in text and text.count("<|im_start|>system") == 1
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert turn.stop_token_ids == (tokenizer.eos_token_id,)
    assert tito.count_tokens(messages, TOOLS) == len(turn.prompt_ids)
    assert tito.segments() == []  # nothing is recorded before complete


# ---------------------------------------------------------------------------------------------------------
# (c) segments and their reasons
# ---------------------------------------------------------------------------------------------------------


def two_turns(tito, tokenizer, make_result, system=SYSTEM, tools=TOOLS):
    messages = [system, ChatMessage(role="user", content="Fix the failing test.")]
    reply = tito.complete(
        tito.prepare(messages, tools, max_tokens=64),
        make_result(tokenizer, tool_reply("", [("bash", {"cmd": "pytest -x"})])),
    )
    messages += [
        reply.to_message(),
        ChatMessage(role="tool", content="1 failed", tool_call_id=reply.tool_calls[0].id),
    ]
    reply = tito.complete(tito.prepare(messages, tools, max_tokens=64), make_result(tokenizer, "Found it."))
    return [*messages, reply.to_message()]


def test_compaction_starts_a_segment_marked_history_rewritten(tokenizer, make_result):
    tito = session(tokenizer)
    two_turns(tito, tokenizer, make_result)
    compacted = [SYSTEM, ChatMessage(role="user", content="Summary: pytest failed once; the bug was found.")]
    turn = tito.prepare(compacted, TOOLS, max_tokens=64)
    assert turn.new_segment_reason == SegmentReason.HISTORY_REWRITTEN and turn.segment_index == 1
    tito.complete(turn, make_result(tokenizer, "Continuing."))
    assert [s.reason for s in tito.segments()] == [SegmentReason.START, SegmentReason.HISTORY_REWRITTEN]


def test_tool_list_change_starts_a_segment_marked_tools_changed(tokenizer, make_result):
    tito = session(tokenizer)
    messages = two_turns(tito, tokenizer, make_result)
    turn = tito.prepare([*messages, ChatMessage(role="user", content="go on")], (BASH,), max_tokens=64)
    assert turn.new_segment_reason == SegmentReason.TOOLS_CHANGED
    tito.complete(turn, make_result(tokenizer, "ok"))
    assert tito.segments()[-1].reason == SegmentReason.TOOLS_CHANGED


def test_system_prompt_change_starts_a_segment_marked_system_changed(tokenizer, make_result):
    tito = session(tokenizer)
    messages = two_turns(tito, tokenizer, make_result)
    other = ChatMessage(role="system", content="You are a careful reviewer.")
    turn = tito.prepare([other, *messages[1:], ChatMessage(role="user", content="go")], TOOLS, max_tokens=64)
    assert turn.new_segment_reason == SegmentReason.SYSTEM_CHANGED
    tito.complete(turn, make_result(tokenizer, "ok"))
    assert tito.segments()[-1].reason == SegmentReason.SYSTEM_CHANGED


def test_side_requests_do_not_fragment_the_main_conversation(tokenizer, make_result):
    tito = session(tokenizer)
    messages = two_turns(tito, tokenizer, make_result)
    length_before = len(tito.segments()[0].token_ids)
    # A title request with another system prompt (as Claude Code sends) gets its own segment...
    side = [
        ChatMessage(role="system", content="Write a 5-word title."),
        ChatMessage(role="user", content="fix bug"),
    ]
    side_turn = tito.prepare(side, (), max_tokens=16)
    assert side_turn.new_segment_reason == SegmentReason.SYSTEM_CHANGED
    tito.complete(side_turn, make_result(tokenizer, "Fixing the failing test"))
    # ...and the main conversation still extends segment 0.
    turn = tito.prepare(
        [*messages, ChatMessage(role="user", content="Now run all tests.")], TOOLS, max_tokens=64
    )
    assert turn.new_segment_reason is None and turn.segment_index == 0
    tito.complete(turn, make_result(tokenizer, "All pass."))
    segments = tito.segments()
    assert len(segments) == 2 and len(segments[0].token_ids) > length_before
    assert segments[1].reason == SegmentReason.SYSTEM_CHANGED


def test_a_retried_request_forks_a_segment_reusing_the_held_ids_unmasked(tokenizer, make_result):
    tito = session(tokenizer)
    messages = [SYSTEM, ChatMessage(role="user", content="hello")]
    first = tito.prepare(messages, (), max_tokens=64)
    reply = tito.complete(first, make_result(tokenizer, "Hi! How can I help?"))
    messages = [*messages, reply.to_message(), ChatMessage(role="user", content="Write a haiku.")]
    second = tito.prepare(messages, (), max_tokens=64)
    tito.complete(second, make_result(tokenizer, "Leaves fall"))
    retry = tito.prepare(messages, (), max_tokens=64)  # the harness lost the answer and asks again
    assert retry.new_segment_reason == SegmentReason.HISTORY_REWRITTEN
    assert retry.prompt_ids == second.prompt_ids and retry.num_reused_tokens > len(first.prompt_ids)
    tito.complete(retry, make_result(tokenizer, "Snow melts"))
    main, fork = tito.segments()
    n = len(second.prompt_ids)
    assert fork.token_ids[:n].tolist() == main.token_ids[:n].tolist()
    assert fork.loss_mask[:n].sum() == 0 and fork.loss_mask[n:].all()  # earlier samples trained once, in main


def test_concurrent_turns_on_one_segment_fork_instead_of_corrupting_it(tokenizer, make_result):
    tito = session(tokenizer)
    messages = [SYSTEM, ChatMessage(role="user", content="hello")]
    reply = tito.complete(tito.prepare(messages, (), max_tokens=8), make_result(tokenizer, "Hi."))
    base = [*messages, reply.to_message()]
    a = tito.prepare([*base, ChatMessage(role="user", content="A?")], (), max_tokens=8)
    b = tito.prepare([*base, ChatMessage(role="user", content="B?")], (), max_tokens=8)
    assert a.new_segment_reason is None and b.new_segment_reason is None
    tito.complete(a, make_result(tokenizer, "A."))
    reply_b = tito.complete(b, make_result(tokenizer, "B."))
    assert reply_b.segment_index == 1
    main, fork = tito.segments()
    assert fork.token_ids.tolist() == list(b.prompt_ids) + list(make_result(tokenizer, "B.").output_ids)
    assert main.token_ids[: len(a.prompt_ids)].tolist() == list(a.prompt_ids)
    with pytest.raises(ValueError, match="already completed"):
        tito.complete(a, make_result(tokenizer, "A."))


# ---------------------------------------------------------------------------------------------------------
# (d) a template that strips <think>, native tools, consecutive tool results
# ---------------------------------------------------------------------------------------------------------


def test_think_stripping_template_keeps_exact_ids_and_reports_drift(qwen_like_tokenizer, make_result):
    tok = qwen_like_tokenizer
    tito = TitoSession(tok, context_window=32_000)
    assert tito.renderer.native_tools
    messages = [SYSTEM, ChatMessage(role="user", content="How many files are there?")]
    turn1 = tito.prepare(messages, TOOLS, max_tokens=64)
    prompt_text = tok.decode(turn1.prompt_ids, skip_special_tokens=False)
    assert "# Tools\n\n<tools>\n" in prompt_text and "You may call one or more functions" not in prompt_text

    text1 = '<think>\nI should list them.\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
    result1 = make_result(tok, text1)
    reply1 = tito.complete(turn1, result1)
    assert reply1.reasoning == "I should list them." and reply1.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in reply1.tool_calls] == [("bash", {"cmd": "ls"})]
    results = [
        ChatMessage(role="tool", content="a.py", tool_call_id=reply1.tool_calls[0].id),
        ChatMessage(role="tool", content="b.py", tool_call_id=reply1.tool_calls[0].id),
    ]
    messages += [reply1.to_message(), *results]
    turn2 = tito.prepare(messages, TOOLS, max_tokens=64)
    assert turn2.new_segment_reason is None
    held = list(turn1.prompt_ids) + list(result1.output_ids)
    assert list(turn2.prompt_ids[: len(held)]) == held
    appended = tok.decode(turn2.prompt_ids[len(held) :], skip_special_tokens=False)
    assert appended == (
        "\n<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nb.py\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    result2 = make_result(tok, "<think>\nTwo results.\n</think>\n\nThere are two files.")
    reply2 = tito.complete(turn2, result2)
    assert reply2.content == "There are two files." and reply2.reasoning == "Two results."
    # Within one user query the template keeps reasoning: a re-render agrees with the TITO ids.
    assert audit_session(tito)[0].num_mismatched == 0

    # A new user query: the template would now strip both <think> blocks. TITO keeps the exact ids (one
    # segment) and the drift audit shows what a re-render would have lost.
    messages += [
        ChatMessage(role="assistant", content="There are two files."),  # reasoning dropped by the harness
        ChatMessage(role="user", content="Thanks. And directories?"),
    ]
    turn3 = tito.prepare(messages, TOOLS, max_tokens=64)
    assert turn3.new_segment_reason is None
    held = list(turn2.prompt_ids) + list(result2.output_ids)
    assert list(turn3.prompt_ids[: len(held)]) == held
    assert tok.decode(turn3.prompt_ids[len(held) :], skip_special_tokens=False) == (
        "\n<|im_start|>user\nThanks. And directories?<|im_end|>\n<|im_start|>assistant\n"
    )
    tito.complete(turn3, make_result(tok, "None."))
    (segment,) = tito.segments()
    report = audit_session(tito)[0]
    think_ids = len(tok.encode("<think>\nI should list them.\n</think>\n\n", add_special_tokens=False))
    assert report.num_mismatched >= think_ids
    start = len(turn1.prompt_ids)
    assert (
        report.first_mismatch_index is not None and start <= report.first_mismatch_index < start + think_ids
    )


def test_chatml_renders_consecutive_tool_results_as_one_turn(tokenizer):
    tito = session(tokenizer)
    call = ToolCall(id="c1", name="bash", arguments='{"cmd": "ls"}')
    messages = [
        SYSTEM,
        ChatMessage(role="user", content="go"),
        ChatMessage(role="assistant", content="", tool_calls=(call, call)),
        ChatMessage(role="tool", content="one", tool_call_id="c1"),
        ChatMessage(role="tool", content="two", tool_call_id="c1"),
    ]
    text = tokenizer.decode(tito.prepare(messages, TOOLS, max_tokens=8).prompt_ids, skip_special_tokens=False)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
        "<tool_call>" in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response>"
        in text
    )
    assert "<|im_start|>tool" not in text


# ---------------------------------------------------------------------------------------------------------
# (e) missing logprobs
# ---------------------------------------------------------------------------------------------------------


def test_a_generation_without_logprobs_is_an_error_naming_the_cause(tokenizer, make_result):
    tito = session(tokenizer)
    turn = tito.prepare([ChatMessage(role="user", content="hi")], (), max_tokens=8)
    good = make_result(tokenizer, "Hello.")
    no_logprobs = GenerationResult(
        output_ids=good.output_ids,
        logprobs=(math.nan,) * len(good.output_ids),
        weight_versions=good.weight_versions,
        finish_reason=FinishReason.STOP,
        num_prompt_tokens=0,
    )
    with pytest.raises(MissingLogprobsError, match="logprob"):
        tito.complete(turn, no_logprobs)
    # A record that bypassed validation and carries no logprobs at all.
    empty = make_result(tokenizer, "Hello.")
    object.__setattr__(empty, "logprobs", ())
    with pytest.raises(MissingLogprobsError, match=r"\d+ sampled token ids but 0 logprobs"):
        tito.complete(turn, empty)
    object.__setattr__(empty, "logprobs", None)
    with pytest.raises(MissingLogprobsError, match="but no logprobs"):
        tito.complete(turn, empty)
    assert tito.segments() == []  # nothing recorded with a zeroed mask or logprob
    tito.complete(turn, good)  # the turn can still be completed with a proper record
    assert tito.segments()[0].num_sampled_tokens == len(good.output_ids)


# ---------------------------------------------------------------------------------------------------------
# (f) re-serialised assistant messages
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "resend",
    [
        "exact",
        "whitespace",
        "key_order_and_spacing",
        "new_call_id",
        "reasoning_dropped",
        "reasoning_inlined",
        "content_dropped",
        "as_raw_text",
    ],
)
def test_reserialised_assistant_replies_still_extend_the_segment(tokenizer, make_result, resend):
    tito = session(tokenizer)
    messages = [SYSTEM, ChatMessage(role="user", content="Edit the config.")]
    turn = tito.prepare(messages, TOOLS, max_tokens=128)
    text = "<think>\nNeed to edit.\n</think>\n\nI will edit it now.\n" + tool_reply(
        "", [("bash", {"cmd": "sed -i s/a/b/ config.toml", "timeout": 10})]
    )
    result = make_result(tokenizer, text)
    reply = tito.complete(turn, result)
    assert reply.reasoning == "Need to edit." and reply.content == "I will edit it now."
    (call,) = reply.tool_calls
    variants = {
        "exact": reply.to_message(),
        "whitespace": ChatMessage(
            role="assistant", content="  I will\n edit it   now.\n", tool_calls=(call,)
        ),
        "key_order_and_spacing": ChatMessage(
            role="assistant",
            content=reply.content,
            tool_calls=(
                ToolCall(
                    id=call.id, name="bash", arguments='{"timeout":10,"cmd":"sed -i s/a/b/ config.toml"}'
                ),
            ),
        ),
        "new_call_id": ChatMessage(
            role="assistant",
            content=reply.content,
            tool_calls=(ToolCall(id="toolu_01", name="bash", arguments=call.arguments),),
        ),
        "reasoning_dropped": ChatMessage(role="assistant", content=reply.content, tool_calls=(call,)),
        "reasoning_inlined": ChatMessage(
            role="assistant", content="<think>Need to edit.</think>I will edit it now.", tool_calls=(call,)
        ),
        "content_dropped": ChatMessage(role="assistant", content="", tool_calls=(call,)),
        "as_raw_text": ChatMessage(role="assistant", content=reply.raw_text.removesuffix("<|im_end|>")),
    }
    follow_up = ChatMessage(role="tool", content="done", tool_call_id="toolu_01")
    if resend == "as_raw_text":
        follow_up = ChatMessage(role="user", content="Output: done")
    turn2 = tito.prepare([*messages, variants[resend], follow_up], TOOLS, max_tokens=128)
    assert turn2.new_segment_reason is None and turn2.segment_index == 0
    held = list(turn.prompt_ids) + list(result.output_ids)
    assert list(turn2.prompt_ids[: len(held)]) == held and turn2.num_reused_tokens == len(held)


def test_a_different_assistant_message_is_a_rewrite(tokenizer, make_result):
    tito = session(tokenizer)
    messages = [SYSTEM, ChatMessage(role="user", content="Edit the config.")]
    tito.complete(tito.prepare(messages, (), max_tokens=16), make_result(tokenizer, "I will edit it."))
    edited = ChatMessage(role="assistant", content="I refuse.")
    turn = tito.prepare([*messages, edited, ChatMessage(role="user", content="?")], (), max_tokens=16)
    assert turn.new_segment_reason == SegmentReason.HISTORY_REWRITTEN and turn.num_reused_tokens == 0


# ---------------------------------------------------------------------------------------------------------
# (g) context overflow and clamping
# ---------------------------------------------------------------------------------------------------------


def test_context_overflow_is_refused_and_max_tokens_clamped(tokenizer, make_result):
    messages = [SYSTEM, ChatMessage(role="user", content="hello there")]
    num_prompt = len(session(tokenizer).prepare(messages, (), max_tokens=1).prompt_ids)

    roomy = session(tokenizer, window=num_prompt + 10)
    assert roomy.prepare(messages, (), max_tokens=100).max_tokens == 10
    assert roomy.prepare(messages, (), max_tokens=4).max_tokens == 4
    assert not roomy.overflowed

    for window in (num_prompt, num_prompt - 5):
        full = session(tokenizer, window=window)
        with pytest.raises(ContextOverflowError) as error:
            full.prepare(messages, (), max_tokens=100)
        assert error.value.num_prompt_tokens == num_prompt and error.value.context_window == window
        assert full.overflowed and full.segments() == []

    # Overflow on a later turn of a conversation that fit so far.
    tito = session(tokenizer, window=num_prompt + 12)
    turn = tito.prepare(messages, (), max_tokens=100)
    reply = tito.complete(turn, make_result(tokenizer, "Hi.", finish_reason=FinishReason.STOP))
    long_user = ChatMessage(role="user", content="tell me more " * 20)
    with pytest.raises(ContextOverflowError):
        tito.prepare([*messages, reply.to_message(), long_user], (), max_tokens=10)
    assert tito.overflowed and len(tito.segments()) == 1
    assert tito.count_tokens([*messages, reply.to_message(), long_user], ()) > num_prompt + 12


def test_bad_requests_are_clear_value_errors(tokenizer):
    tito = session(tokenizer)
    with pytest.raises(ValueError, match="messages"):
        tito.prepare([], (), max_tokens=8)
    with pytest.raises(ValueError, match="prefilled"):
        tito.prepare(
            [ChatMessage(role="user", content="x"), ChatMessage(role="assistant", content="y")],
            (),
            max_tokens=8,
        )
    with pytest.raises(ValueError, match="max_tokens"):
        tito.prepare([ChatMessage(role="user", content="x")], (), max_tokens=0)
    with pytest.raises(ValueError, match="context_window"):
        TitoSession(tokenizer, context_window=0)


def test_a_truncated_reply_is_closed_by_the_template(tokenizer, make_result):
    tito = session(tokenizer)
    messages = [ChatMessage(role="user", content="Count.")]
    turn = tito.prepare(messages, (), max_tokens=3)
    result = make_result(tokenizer, "One two three", eos=False, finish_reason=FinishReason.LENGTH)
    reply = tito.complete(turn, result)
    assert reply.finish_reason == "length"
    turn2 = tito.prepare(
        [*messages, reply.to_message(), ChatMessage(role="user", content="Go on.")], (), max_tokens=8
    )
    assert turn2.new_segment_reason is None
    appended = tokenizer.decode(
        turn2.prompt_ids[len(turn.prompt_ids) + len(result.output_ids) :], skip_special_tokens=False
    )
    assert appended == "<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------------------------------------------------
# templates that defeat incremental rendering: verified fallback, never a silent mismatch
# ---------------------------------------------------------------------------------------------------------

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Stamps the conversation length into the system turn: every new message changes the render of turn 0.
COUNTING_TEMPLATE = "{{ '<|im_start|>system\\n' + (messages | length | string) + '<|im_end|>\\n' }}" + CHATML
# Refuses to render a user turn that is a lone "." (TITO's anchor uses one).
PICKY_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] == '.' and message['role'] == 'user' %}"
    "{{ raise_exception('no lone dots') }}{% endif %}{% endfor %}" + CHATML
)


@pytest.fixture
def templated(tokenizer):
    import copy

    def make(template: str):
        clone = copy.deepcopy(tokenizer)
        clone.chat_template = template
        return clone

    return make


def test_a_template_that_rewrites_earlier_turns_starts_a_prefix_mismatch_segment(templated, make_result):
    tok = templated(COUNTING_TEMPLATE)
    tito = TitoSession(tok, context_window=4096)
    messages = [ChatMessage(role="user", content="hi")]
    reply = tito.complete(tito.prepare(messages, (), max_tokens=8), make_result(tok, "Hello."))
    turn = tito.prepare(
        [*messages, reply.to_message(), ChatMessage(role="user", content="bye")], (), max_tokens=8
    )
    assert turn.new_segment_reason == SegmentReason.PREFIX_MISMATCH and turn.num_reused_tokens == 0
    assert tok.decode(turn.prompt_ids, skip_special_tokens=False).startswith(
        "<|im_start|>system\n3<|im_end|>"
    )


def test_when_incremental_rendering_fails_a_full_render_is_used_and_checked(templated, make_result):
    tok = templated(PICKY_TEMPLATE)
    tito = TitoSession(tok, context_window=4096)
    messages = [ChatMessage(role="user", content="hi")]
    first = tito.prepare(messages, (), max_tokens=8)
    reply = tito.complete(first, make_result(tok, "Hello."))
    # The full render still reproduces the held ids: the segment is extended.
    messages = [*messages, reply.to_message(), ChatMessage(role="user", content="more")]
    second = tito.prepare(messages, (), max_tokens=8)
    assert second.new_segment_reason is None and second.num_reused_tokens == len(tito.segments()[0].token_ids)
    # Sampled ids that re-encode differently: the full render no longer matches, so a new segment says why.
    text, odd_ids = find_reencoding_mismatch(tok)
    reply = tito.complete(second, make_result(tok, ids=odd_ids))
    third = tito.prepare(
        [*messages, reply.to_message(), ChatMessage(role="user", content="ok")], (), max_tokens=8
    )
    assert third.new_segment_reason == SegmentReason.RENDER_FAILED and third.num_reused_tokens == 0


def test_the_formats_are_any_object_naming_the_two_formats(tokenizer):
    """``TitoConfig.formats`` takes any ``TemplateFormats`` as it is (a run's proxy brick is one, nothing is
    copied out of it); a name no format has fails naming the field and listing the registered ones."""
    from dataclasses import dataclass

    from components.tito import TemplateFormatsConfig, TitoConfig
    from components.tito.formats import TOOL_FORMATS

    @dataclass(frozen=True)
    class Named:  # no Rein base class: the two properties are the whole contract
        tool_format: str | None = "qwen3_coder"
        reasoning_format: str | None = "none"

    session = TitoSession(tokenizer, context_window=4096, config=TitoConfig(formats=Named()))
    assert session.renderer.tool_format.name == "qwen3_coder"
    with pytest.raises(ValueError, match="tool_format: unknown format 'gemma'") as refused:
        TitoConfig(formats=Named(tool_format="gemma"))
    assert all(name in str(refused.value) for name in TOOL_FORMATS)
    with pytest.raises(ValueError, match="reasoning_format: unknown format 'deep'"):
        TemplateFormatsConfig(reasoning_format="deep")


def test_config_is_validated_and_can_force_the_tool_rendering(tokenizer):
    from components.tito import TitoConfig

    with pytest.raises(ValueError, match="max_open_segments"):
        TitoConfig(max_open_segments=0)
    with pytest.raises(ValueError, match="native_tools"):
        TitoConfig(native_tools="yes")
    forced = TitoSession(tokenizer, context_window=4096, config=TitoConfig(native_tools=True))
    turn = forced.prepare([ChatMessage(role="user", content="hi")], TOOLS, max_tokens=8)
    # SmolLM2's template ignores native tools: forcing the native path drops them from the prompt.
    assert "<tools>" not in tokenizer.decode(turn.prompt_ids)
