"""Model families end to end: multi-turn tool conversations through the proxy with every official SDK (openai
Chat Completions and Responses, anthropic Messages, google-genai), for each family under its real chat template,
downloaded by ``make setup-test`` into ``.templates/``: vLLM's ``examples/tool_chat_template_*.jinja`` (its sdist
on PyPI) and llama.cpp's ``models/templates`` for GLM-4.6 (GLM-4.5's format), Kimi K2, gpt-oss and Qwen3
(vendored in llama-cpp-python's sdist on PyPI), with a scripted policy writing that family's tool-call format.

Each conversation checks: the format is detected from the template (or the named one is used); every turn's
prompt extends the previous prompt + sampled ids exactly (one segment); the sampled ids are exactly the
policy's; the SDK gets the calls the policy wrote, whole and streamed as deltas; the drift audit says how far a
naive re-render of the history would be (templates that drop a turn's content next to its calls, or move the
system prompt, rewrite history).
"""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from openai import OpenAI

from components.engine.scripted import ScriptedEngine
from components.protocols import SessionDescription
from components.proxy.config import ProxyConfig
from components.proxy.server import ProxyServer
from components.proxy.sessions import LocalSessionRegistry
from components.tito import TemplateFormatsConfig
from components.tito.drift_audit import audit_session, drift_audit
from components.tito.formats import tool_format_named
from components.tito.messages import ToolCall
from tests.components.proxy.proxy_helpers import assert_one_segment_record, streamed_tool_calls

TEMPLATES = Path(__file__).resolve().parents[3] / ".templates"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


@dataclass(frozen=True)
class Family:
    tool_format: str
    template_file: str | None  # None: SmolLM2's ChatML, tool_format named
    special_tokens: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None
    parallel: bool = True  # the template takes several calls in one turn
    extra: dict = field(default_factory=dict)


LLAMA = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>")
MISTRAL = ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]")
DEEPSEEK = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
GLM = (
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
)
KIMI = (
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
FAMILIES = {
    "hermes": Family("hermes", "tool_chat_template_hermes.jinja"),
    "qwen3": Family("hermes", "Qwen-Qwen3-0.6B.jinja"),
    "qwen3_coder": Family("qwen3_coder", "tool_chat_template_qwen3coder.jinja"),
    "llama3_json": Family(
        "llama3_json",
        "tool_chat_template_llama3.1_json.jinja",
        LLAMA,
        "<|begin_of_text|>",
        "<|eot_id|>",
        False,
    ),
    "mistral": Family(
        "mistral",
        "tool_chat_template_mistral_parallel.jinja",
        (*MISTRAL, "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        "<s>",
        "</s>",
    ),
    "deepseek_v3": Family(
        "deepseek_v3", "tool_chat_template_deepseekv3.jinja", DEEPSEEK, DEEPSEEK[0], DEEPSEEK[1]
    ),
    "llama3.2_json": Family(
        "llama3_json",
        "tool_chat_template_llama3.2_json.jinja",
        LLAMA,
        "<|begin_of_text|>",
        "<|eot_id|>",
        False,
    ),
    "deepseek_r1": Family(
        "deepseek_v3", "tool_chat_template_deepseekr1.jinja", DEEPSEEK, DEEPSEEK[0], DEEPSEEK[1]
    ),
    "glm45": Family("glm45", "GLM-4.6.jinja", GLM, "[gMASK]", "<|observation|>"),
    "kimi_k2": Family("kimi_k2", "moonshotai-Kimi-K2.jinja", KIMI, None, "<|im_end|>"),
    "harmony": Family("harmony", "openai-gpt-oss-120b.jinja", HARMONY, None, "<|call|>", False),
}


_TOKENIZERS: dict[str, object] = {}


def family_tokenizer(tokenizer, family: Family):
    """The SmolLM2 tokenizer with the family's real template and its special tokens (built once per family)."""
    if family.template_file is None:
        return tokenizer
    if family.template_file not in _TOKENIZERS:
        _TOKENIZERS[family.template_file] = _build_family_tokenizer(tokenizer, family)
    return _TOKENIZERS[family.template_file]


def _build_family_tokenizer(tokenizer, family: Family):
    path = TEMPLATES / family.template_file
    assert path.is_file(), f"{path} is missing: run `make setup-test` (it downloads vLLM's templates)"
    clone = copy.deepcopy(tokenizer)
    clone.add_special_tokens({"additional_special_tokens": list(family.special_tokens)})
    if family.bos:
        clone.bos_token = family.bos
    if family.eos:
        clone.eos_token = family.eos
    clone.chat_template = path.read_text()
    return clone


def scripted_turns(family: Family) -> list[tuple[str, list[ToolCall]]]:
    """(content, calls) of each policy turn: a call, (parallel) calls, a final answer."""
    fmt = tool_format_named(family.tool_format)
    first = [ToolCall(id="callAAAA00001", name="bash", arguments='{"cmd": "ls -la"}')]
    second = [ToolCall(id="callBBBB00002", name="bash", arguments='{"cmd": "cat é.txt | grep 中"}')]
    if family.parallel:
        second.append(ToolCall(id="callCCCC00003", name="bash", arguments='{"cmd": "pytest -q"}'))
    content = "Let me look." if fmt.keeps_content_with_calls else ""
    return [(content, first), ("", second), ("All tests pass: é 中 🙂.", [])]


def policy_texts(family: Family) -> list[str]:
    fmt = tool_format_named(family.tool_format)
    return [fmt.render_calls(content, calls) for content, calls in scripted_turns(family)]


@dataclass
class FamilyProxy:
    """A proxy over a scripted engine under a family's tokenizer, with one session open."""

    server: ProxyServer
    registry: LocalSessionRegistry
    config: ProxyConfig
    engine: ScriptedEngine
    tokenizer: object
    session_id: str

    @property
    def base_url(self) -> str:
        return self.server.session_url(self.session_id)

    @property
    def api_key(self) -> str:
        return self.config.session_keys.session_token(self.session_id)

    def openai(self) -> OpenAI:
        return OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key, max_retries=0)

    def describe(self) -> SessionDescription:
        return self.server.call(lambda: self.registry.describe(self.session_id))

    @property
    def tito(self):
        return self.registry._sessions[self.session_id].tito

    def audit(self):
        return audit_session(self.tito)


@contextmanager
def family_proxy(tokenizer, family: Family, replies: list[str], *, tool_format: str | None = None):
    """Serve ``replies`` under the family's real template (or SmolLM2's ChatML with the format named)."""
    family_tok = family_tokenizer(tokenizer, family)
    engine = ScriptedEngine(family_tok, replies)
    if family.template_file is None:
        tool_format = family.tool_format
    config = ProxyConfig(port=0, formats=TemplateFormatsConfig(tool_format=tool_format))
    registry = LocalSessionRegistry(engine, family_tok, config)
    server = ProxyServer(registry, config)
    server.start_in_thread()
    try:
        session_id = server.call(lambda: registry.open_session())
        yield FamilyProxy(server, registry, config, engine, family_tok, session_id)
    finally:
        server.stop_thread()


# What an SDK returned for one turn: its content and its calls as (name, arguments).
SeenTurn = tuple[str, list[tuple[str, dict]]]


def openai_chat_conversation(proxy: FamilyProxy, num_turns: int, *, stream: bool) -> list[SeenTurn]:
    """The OpenAI Chat Completions SDK: policy turns with tool results between them."""
    client = proxy.openai()
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    seen = []
    for _ in range(num_turns):
        if stream:
            chunks = list(
                client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, stream=True)
            )
            texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
            content = "".join(texts)
            assert len(texts) != 1 or len(content) < 3  # the text came as its tokens wrote it
            pieces = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
            tool_calls = streamed_tool_calls(chunks)
            if tool_calls:
                assert len(pieces) > 2 * len(tool_calls)  # the arguments came as their tokens wrote them
        else:
            message = (
                client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
                .choices[0]
                .message
            )
            content = message.content or ""
            tool_calls = [c.model_dump() for c in message.tool_calls or []]
        seen.append(
            (content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls])
        )
        assistant = {"role": "assistant", "content": content}
        if tool_calls:
            assistant["tool_calls"] = tool_calls
        messages.append(assistant)
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "content": f"output {i}: ok"}
            for i, c in enumerate(tool_calls)
        ]
    return seen


def anthropic_conversation(proxy: FamilyProxy, num_turns: int, *, stream: bool) -> list[SeenTurn]:
    """The Anthropic Messages SDK (Claude Code's protocol): tool_use blocks, tool_result blocks back."""
    import anthropic

    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=proxy.api_key, max_retries=0)
    tools = [{"name": "bash", "description": "Run.", "input_schema": TOOLS[0]["function"]["parameters"]}]
    messages: list[dict] = [{"role": "user", "content": "Fix the failing test."}]
    seen = []
    for _ in range(num_turns):
        request = dict(
            model="claude-x", system="You are a coding agent.", max_tokens=256, messages=messages, tools=tools
        )
        if stream:
            events = list(client.messages.create(**request, stream=True))
            texts = [
                e.delta.text
                for e in events
                if e.type == "content_block_delta" and e.delta.type == "text_delta"
            ]
            text = "".join(texts)
            assert len(texts) != 1 or len(text) < 3  # the text came as its tokens wrote it
            uses = [
                e.content_block
                for e in events
                if e.type == "content_block_start" and e.content_block.type == "tool_use"
            ]
            json_pieces: dict[int, list[str]] = {}  # per tool_use block: its input as the tokens wrote it
            for e in events:
                if e.type == "content_block_delta" and e.delta.type == "input_json_delta":
                    json_pieces.setdefault(e.index, []).append(e.delta.partial_json)
            assert len(json_pieces) == len(uses) and all(len(p) > 2 for p in json_pieces.values())
            inputs = [json.loads("".join(json_pieces[index])) for index in sorted(json_pieces)]
            calls = [(u.id, u.name, i) for u, i in zip(uses, inputs, strict=True)]
        else:
            message = client.messages.create(**request)
            text = "".join(b.text for b in message.content if b.type == "text")
            calls = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
            assert message.stop_reason == ("tool_use" if calls else "end_turn")
        seen.append((text, [(name, arguments) for _, name, arguments in calls]))
        content: list[dict] = [{"type": "text", "text": text}] if text else []
        content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls]
        messages.append({"role": "assistant", "content": content})
        if calls:
            results = [
                {"type": "tool_result", "tool_use_id": i, "content": f"output {k}: ok"}
                for k, (i, _, _) in enumerate(calls)
            ]
            messages.append({"role": "user", "content": results})
    return seen


def responses_conversation(proxy: FamilyProxy, num_turns: int, *, stream: bool) -> list[SeenTurn]:
    """The OpenAI Responses SDK (Codex's protocol): function_call items, function_call_output items back."""
    client = proxy.openai()
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    items: list[dict] = [{"role": "user", "content": "Fix the failing test."}]
    seen = []
    for _ in range(num_turns):
        request = dict(model="policy", instructions="You are a coding agent.", input=items, tools=tools)
        if stream:
            events = list(client.responses.create(**request, stream=True))
            texts = [e.delta for e in events if e.type == "response.output_text.delta"]
            text = "".join(texts)
            assert len(texts) != 1 or len(text) < 3  # the text came as its tokens wrote it
            output = [e.item for e in events if e.type == "response.output_item.done"]
            pieces = [e for e in events if e.type == "response.function_call_arguments.delta"]
            num_calls = sum(item.type == "function_call" for item in output)
            if num_calls:
                assert len(pieces) > 2 * num_calls  # the arguments came as their tokens wrote them
        else:
            response = client.responses.create(**request)
            text, output = response.output_text, response.output
        calls = [item for item in output if item.type == "function_call"]
        seen.append((text, [(c.name, json.loads(c.arguments)) for c in calls]))
        if text:
            items.append({"role": "assistant", "content": text})
        items += [
            {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
            for c in calls
        ]
        items += [
            {"type": "function_call_output", "call_id": c.call_id, "output": f"output {k}: ok"}
            for k, c in enumerate(calls)
        ]
    return seen


def gemini_conversation(proxy: FamilyProxy, num_turns: int, *, stream: bool) -> list[SeenTurn]:
    """The google-genai SDK (Gemini CLI's protocol): functionCall parts, functionResponse parts back."""
    from google import genai
    from google.genai import types

    client = genai.Client(
        api_key=proxy.api_key,
        http_options=types.HttpOptions(base_url=proxy.base_url, api_version="v1beta"),
    )
    declaration = types.FunctionDeclaration(
        name="bash",
        description="Run a shell command.",
        parameters=types.Schema(type="OBJECT", properties={"cmd": types.Schema(type="STRING")}),
    )
    generation = types.GenerateContentConfig(
        system_instruction="You are a coding agent.",
        tools=[types.Tool(function_declarations=[declaration])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: list[types.Content] = [
        types.Content(role="user", parts=[types.Part(text="Fix the failing test.")])
    ]
    seen = []
    for _ in range(num_turns):
        if stream:
            chunks = list(
                client.models.generate_content_stream(model="m", contents=contents, config=generation)
            )
            parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts or []]
            texts = [part.text for part in parts if part.text and not part.thought]
            assert len(texts) != 1 or len("".join(texts)) < 3  # the text came as its tokens wrote it
        else:
            response = client.models.generate_content(model="m", contents=contents, config=generation)
            parts = response.candidates[0].content.parts or []
        text = "".join(part.text for part in parts if part.text and not part.thought)
        calls = [part.function_call for part in parts if part.function_call]
        seen.append((text, [(c.name, c.args) for c in calls]))
        model_parts = [types.Part(text=text)] if text else []
        model_parts += [types.Part(function_call=c) for c in calls]
        contents.append(types.Content(role="model", parts=model_parts))
        if calls:
            responses = [
                types.Part(
                    function_response=types.FunctionResponse(
                        id=c.id, name=c.name, response={"output": f"output {k}: ok"}
                    )
                )
                for k, c in enumerate(calls)
            ]
            contents.append(types.Content(role="user", parts=responses))
    return seen


SDK_CONVERSATIONS = {
    "openai_chat": openai_chat_conversation,
    "anthropic": anthropic_conversation,
    "responses": responses_conversation,
    "gemini": gemini_conversation,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("sdk", list(SDK_CONVERSATIONS))
def test_family_conversation_keeps_tito_exact(tokenizer, sdk, name, stream):
    """Every official SDK × every family under its real template, whole and streamed: one exact segment."""
    family = FAMILIES[name]
    replies = policy_texts(family)
    with family_proxy(tokenizer, family, replies) as proxy:
        seen = SDK_CONVERSATIONS[sdk](proxy, len(replies), stream=stream)
        record = proxy.describe()
        assert record.tool_format == family.tool_format  # detected from the real template (or named)
        assert record.num_malformed_tool_calls == 0
        expected = [
            (content, [(c.name, json.loads(c.arguments)) for c in calls])
            for content, calls in scripted_turns(family)
        ]
        assert [calls for _, calls in seen] == [calls for _, calls in expected]
        assert [content.strip() for content, _ in seen] == [content for content, _ in expected]
        # every prompt extends the previous prompt + sampled ids; the sampled ids (the parsed calls' tokens
        # among them) are exactly the policy's
        assert_one_segment_record(record, proxy.engine, replies, proxy.tokenizer)
        reports = proxy.audit()
        assert [r.segment_reason for r in reports] == ["start"]
        if name in ("hermes", "mistral"):
            # hermes' template drops the content next to calls, mistral's moves the system prompt: a naive
            # re-render of the history differs from what the model saw; TITO's ids do not
            assert reports[0].num_mismatched > 0


def test_a_template_that_moves_history_starts_a_segment_with_its_reason(tokenizer):
    """Mistral's template writes the system prompt and the tool list into the LAST user turn: a new user turn
    rewrites the earlier ones, so TITO starts a ``prefix_mismatch`` segment and the drift audit reports both."""
    family = FAMILIES["mistral"]
    fmt = tool_format_named("mistral")
    call = ToolCall(id="callAAAA00001", name="bash", arguments='{"cmd": "ls"}')
    replies = [fmt.render_calls("", [call]), " Listed.", " Bye."]
    with family_proxy(tokenizer, family, replies) as proxy:
        client = proxy.openai()
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List files."}]
        first = client.chat.completions.create(model="p", messages=messages, tools=TOOLS).choices[0].message
        assert first.tool_calls[0].id == "AAAA00001"  # the 9 characters the model wrote are the call's id
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in first.tool_calls]},
            {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "a.py"},
        ]
        second = client.chat.completions.create(model="p", messages=messages, tools=TOOLS).choices[0].message
        assert second.content == "Listed."
        record = proxy.describe()
        assert record.num_segments == 1  # tool results extend the conversation exactly
        messages += [{"role": "assistant", "content": second.content}, {"role": "user", "content": "Thanks."}]
        client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        record = proxy.describe()
        assert [s["reason"] for s in record.segments] == ["start", "prefix_mismatch"]
        reports = proxy.audit()
        assert [r.segment_reason for r in reports] == ["start", "prefix_mismatch"]
        # a naive re-render of either segment's history differs from the ids the model saw (its system prompt
        # and tools sit in whichever user turn is last); the segments' TITO ids are what was sampled on
        assert all(report.num_mismatched > 0 for report in reports)


def test_an_unknown_tool_template_is_refused_naming_the_formats(tokenizer):
    from components.tito import TitoConfig, TitoSession
    from components.tito.formats import TOOL_FORMATS, UnknownTemplateFormatError

    clone = copy.deepcopy(tokenizer)
    clone.chat_template = (TEMPLATES / "tool_chat_template_gemma3_pythonic.jinja").read_text()
    with pytest.raises(UnknownTemplateFormatError) as refused:
        TitoSession(clone, context_window=4096)
    assert "--tool-format" in str(refused.value) and all(name in str(refused.value) for name in TOOL_FORMATS)
    forced = TitoSession(
        clone, context_window=4096, config=TitoConfig(formats=TemplateFormatsConfig(tool_format="hermes"))
    )
    assert forced.renderer.tool_format.name == "hermes"


def test_the_cli_flags_name_formats_and_refuse_unknown_ones(capsys):
    from components.proxy.cli import parse_proxy_config

    config = parse_proxy_config(["--tool-format", "qwen3_coder", "--reasoning-format", "none"])
    assert (config.formats.tool_format, config.formats.reasoning_format) == ("qwen3_coder", "none")
    assert (
        config.tito_config().formats is config.formats
    )  # the TITO core reads the proxy's formats as they are
    with pytest.raises(SystemExit) as refused:
        parse_proxy_config(["--tool-format", "gemma"])
    error = capsys.readouterr().err
    assert refused.value.code == 2
    assert "formats.tool_format: unknown format 'gemma'" in error and "qwen3_coder" in error
    with pytest.raises(SystemExit) as refused:
        parse_proxy_config(["--reasoning-format", "deep"])
    assert refused.value.code == 2 and "formats.reasoning_format" in capsys.readouterr().err


def test_a_malformed_call_stays_content_and_is_counted(tokenizer):
    """A call the policy botched (broken JSON) is served as content, counted per turn and per session."""
    from components.protocols import FinishReason, GenerationResult
    from components.tito import ChatMessage, TitoSession, ToolSpec

    tito = TitoSession(tokenizer, context_window=4096)
    tools = (ToolSpec(name="bash", parameters=TOOLS[0]["function"]["parameters"]),)
    turn = tito.prepare([ChatMessage(role="user", content="Go.")], tools, max_tokens=64)
    text = 'Trying.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"\n</tool_call>'
    ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    result = GenerationResult(
        output_ids=tuple(ids),
        logprobs=(-0.5,) * len(ids),
        weight_versions=(0,) * len(ids),
        finish_reason=FinishReason.STOP,
        num_prompt_tokens=len(turn.prompt_ids),
    )
    reply = tito.complete(turn, result)
    assert reply.tool_calls == () and reply.content == text and reply.finish_reason == "stop"
    assert reply.num_malformed_tool_calls == 1 and tito.num_malformed_tool_calls == 1


def test_a_malformed_call_reaches_the_trajectory_and_the_step_metrics(tokenizer):
    """Through the proxy (openai SDK, Hermes' real template): a botched call is served as content, the finalized
    trajectory carries the session's count, and the step's rollout metrics report it."""
    from components.protocols import SessionOutcome
    from components.trajectory import MALFORMED_TOOL_CALLS_METRIC
    from monitoring.rollout_stats import rollout_metrics

    broken = 'Trying.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"\n</tool_call>'
    replies = [broken, "Giving up."]
    with family_proxy(tokenizer, FAMILIES["hermes"], replies) as proxy:
        client = proxy.openai()
        messages = [{"role": "user", "content": "List files."}]
        first = client.chat.completions.create(model="p", messages=messages, tools=TOOLS).choices[0].message
        assert first.tool_calls is None and first.content == broken
        messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "Again?"}]
        client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        assert proxy.describe().num_malformed_tool_calls == 1
        outcome = SessionOutcome(reward=0.0, metrics={"num_policy_calls": 2.0})
        trajectory = proxy.server.call(lambda: proxy.registry.finalize(proxy.session_id, outcome))
    assert trajectory.metrics[MALFORMED_TOOL_CALLS_METRIC] == 1.0
    assert trajectory.metrics["num_policy_calls"] == 2.0  # the harness's metrics are kept beside it
    step = rollout_metrics([trajectory])
    assert step["tool_format/malformed_calls_total"] == 1.0
    assert step["tool_format/trajectories_with_malformed_calls"] == 1.0
    assert step["tool_format/malformed_calls_per_turn"] == 0.5
    assert "agent/num_malformed_tool_calls" not in step  # one home: its own section


def test_recipes_name_the_formats_on_their_proxy_brick(capsys):
    from components.recipe_config import parse_config
    from recipes.swe_grpo import SweGrpoConfig

    config = parse_config(
        SweGrpoConfig, ["--proxy-tool-format", "llama3_json", "--proxy-reasoning-format", "none"]
    )
    assert (config.proxy.tool_format, config.proxy.reasoning_format) == ("llama3_json", "none")
    assert parse_config(SweGrpoConfig, []).proxy.tool_format is None  # detected from the template
    with pytest.raises(SystemExit):
        parse_config(SweGrpoConfig, ["--proxy-tool-format", "gemma"])
    assert "unknown format 'gemma'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "expected_segments"),
    [
        ("qwen3", ["start", "prefix_mismatch"]),
        ("harmony", ["start", "prefix_mismatch"]),
        ("glm45", ["start"]),
    ],
)
def test_a_template_that_drops_past_reasoning_starts_a_segment_with_its_reason(
    tokenizer, name, expected_segments
):
    """Qwen3's template (llama.cpp's ``Qwen-Qwen3-0.6B.jinja``) drops the ``<think>`` of turns before the last
    user turn, and gpt-oss' drops a tool-call turn's analysis once a final answer follows it: the next user turn
    rewrites what the model saw (the new messages render differently after it), so TITO starts a
    ``prefix_mismatch`` segment and the drift audit reports it. GLM-4.6's drops the reasoning of turns before the
    last user turn, but the new messages render the same after the held ids: TITO keeps extending the ids the
    model saw (one segment), and the drift audit reports how far a naive re-render would be."""
    from components.tito.formats import detect_reasoning_format

    family = FAMILIES[name]
    family_tok = family_tokenizer(tokenizer, family)
    fmt = tool_format_named(family.tool_format)
    thinking = detect_reasoning_format(family_tok.chat_template)
    call = ToolCall(id="functions.bash:0", name="bash", arguments='{"cmd": "ls"}')
    replies = [
        thinking.render("I should list the files.", fmt.render_calls("", [call])),
        thinking.render("The listing is short.", fmt.render_calls("Listed.", [])),
        fmt.render_calls("Bye.", []),
    ]
    with family_proxy(tokenizer, family, replies) as proxy:
        client = proxy.openai()
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List files."}]
        first = client.chat.completions.create(model="p", messages=messages, tools=TOOLS).choices[0].message
        assert [(c.function.name, json.loads(c.function.arguments)) for c in first.tool_calls] == [
            ("bash", {"cmd": "ls"})
        ]
        # the client sends the reasoning back (``reasoning_content``), as agents that keep it do
        assert first.model_extra["reasoning_content"] == "I should list the files."
        messages += [
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": first.model_extra["reasoning_content"],
                "tool_calls": [c.model_dump() for c in first.tool_calls],
            },
            {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "a.py"},
        ]
        second = client.chat.completions.create(model="p", messages=messages, tools=TOOLS).choices[0].message
        assert second.content == "Listed."
        record = proxy.describe()
        assert record.num_segments == 1  # the tool result extends the conversation exactly
        messages += [
            {"role": "assistant", "content": second.content, "reasoning_content": "The listing is short."},
            {"role": "user", "content": "Thanks."},
        ]
        client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
        record = proxy.describe()
        reports = proxy.audit()
        assert [s["reason"] for s in record.segments] == expected_segments
        assert [r.segment_reason for r in reports] == expected_segments
        # what a framework without TITO trains on, the final history re-rendered, drops reasoning the model saw
        # in the first segment's turns: the audit of those ids against it counts the dropped tokens
        tito = proxy.tito
        last = len(reports) - 1
        naive = drift_audit(
            tito.tokenizer,
            tito.segments()[0].token_ids,
            tito.segment_messages(last),
            tito.segment_tools(last),
            native_tools=tito.renderer.native_tools,
            tool_format=tito.renderer.tool_format,
        )
        assert naive.num_mismatched > 0
