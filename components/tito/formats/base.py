"""The seams of tool-call and reasoning formats, and the small text helpers the family files share.

A *tool format* is how one model family writes tool calls in its sampled text (Hermes ``<tool_call>`` JSON,
Qwen3-Coder XML, Llama 3 JSON, ``[TOOL_CALLS]`` …); a *reasoning format* is how it writes its thinking
(``<think>…</think>``, harmony's analysis channel). Each is one file under ``components/tito/formats/`` and
one entry in the registry of ``components/tito/formats/__init__.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from components.json_types import JsonObject, JsonValue
from components.tito.formats.json_stream import JsonStream
from components.tito.messages import ToolCall, ToolSpec


@dataclass(frozen=True, kw_only=True)
class ParsedCalls:
    """What a tool format found in (the non-reasoning part of) a reply.

    ``pending_from``: where an opened but unfinished tool call starts in the text (None: nothing is open).
    A finished parse keeps such a tail as content and counts it in ``num_malformed``; a stream holds it back.
    """

    content: str
    tool_calls: tuple[ToolCall, ...]
    num_malformed: int = 0
    pending_from: int | None = None


@dataclass(frozen=True)
class CallOpening:
    """A call whose JSON arguments have begun in the text of an unfinished call block (streaming)."""

    ordinal: int  # which call of the block (0 for formats with one call per block)
    name: str
    arguments_at: int  # where its arguments' JSON text starts in the block


def last_opening(pattern: re.Pattern[str], block: str, name_group: int = 1) -> CallOpening | None:
    """The last match of ``pattern`` (ending where a call's JSON arguments start) in ``block``, as an opening."""
    found = None
    for ordinal, match in enumerate(pattern.finditer(block)):
        found = CallOpening(ordinal=ordinal, name=match.group(name_group), arguments_at=match.end())
    return found


class ArgumentsStream(Protocol):
    """A call's arguments text in, the canonical JSON text it settles out (``JsonStream``, ``XmlArgumentsStream``)."""

    done: bool
    failed: bool

    def feed(self, text: str) -> str: ...


@runtime_checkable
class ToolFormat(Protocol):
    """How one model family writes tool calls.

    Contract (checked for every registered format by ``tests/contracts/test_tool_format_contract.py``):
    ``parse(render_calls(content, calls), tools)`` gives back ``content`` (modulo surrounding whitespace) and
    the calls (names, and arguments equal as JSON); ``parse`` never raises: a malformed call stays content and
    is counted in ``num_malformed``; ``render_calls`` writes the calls byte for byte as the family's chat
    template writes a past assistant turn (so that a model trained on the template wrote exactly that).
    """

    name: ClassVar[str]
    # Texts that open a tool call: a stream holds text back from where one of them (or its prefix) starts.
    call_markers: ClassVar[tuple[str, ...]]
    # Texts that end a call (or a section of calls): a stream parses the text again only when a marker arrives.
    end_markers: ClassVar[tuple[str, ...]]
    # Texts that end the model's turn besides EOS (e.g. Llama's ``<|eom_id|>``); stop ids when single tokens.
    stop_texts: ClassVar[tuple[str, ...]]
    # False where the family's template drops an assistant turn's content once it has tool calls.
    keeps_content_with_calls: ClassVar[bool]
    # Whether ids of past calls are part of what the model wrote (Mistral, Kimi): parse keeps them as the ids.
    writes_call_ids: ClassVar[bool]

    def matches_template(self, template: str) -> bool:
        """Whether a chat template writes tool calls in this format."""
        ...

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        """The system-prompt text describing ``tools``, for templates that do not render tools themselves."""
        ...

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        """A past assistant turn's content and tool calls as the model wrote them."""
        ...

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        """Content and tool calls of sampled text (reasoning already split off); call ids may be empty."""
        ...

    def arguments_stream(self, tool_name: str, tools: Sequence[ToolSpec]) -> ArgumentsStream:
        """What turns the text of an opened call's arguments into their canonical JSON text as it arrives."""
        ...

    def open_call(self, block: str) -> CallOpening | None:
        """In an unfinished call block (``block`` starts at ``ParsedCalls.pending_from``), the last call whose
        JSON arguments have begun (None: none yet, or a format whose arguments are not JSON text)."""
        ...


class ToolFormatDefaults:
    """What most families share (a family class states only where it differs): no stop texts of its own,
    content kept beside calls, no call ids in the text, JSON arguments (streamed once ``open_call`` finds
    where they start)."""

    end_markers: ClassVar[tuple[str, ...]] = ()
    stop_texts: ClassVar[tuple[str, ...]] = ()
    keeps_content_with_calls: ClassVar[bool] = True
    writes_call_ids: ClassVar[bool] = False

    def arguments_stream(self, tool_name: str, tools: Sequence[ToolSpec]) -> ArgumentsStream:
        return JsonStream()

    def open_call(self, block: str) -> CallOpening | None:
        return None


@runtime_checkable
class ReasoningFormat(Protocol):
    """How one model family writes its reasoning.

    Contract: ``split(render(reasoning, rest))`` gives back ``(reasoning, rest)`` (stripped); text without
    reasoning markers splits into ``(None, text)``; ``split`` never raises.
    """

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]  # texts a stream must not cut in half

    def matches_template(self, template: str) -> bool:
        """Whether a chat template marks reasoning this way."""
        ...

    def split(self, text: str, *, opened_by_prompt: bool = False) -> tuple[str | None, str]:
        """``(reasoning or None, the rest)`` of sampled text; ``opened_by_prompt``: the generation prompt
        already opened the reasoning block."""
        ...

    def in_progress(self, text: str, *, opened_by_prompt: bool = False) -> bool:
        """Whether a stream that has produced ``text`` so far may still be inside reasoning."""
        ...

    def render(self, reasoning: str | None, rest: str) -> str:
        """Reasoning and the rest of a reply as the model writes them."""
        ...


def tool_call_id(seed: str, index: int) -> str:
    """A deterministic tool call id (harnesses only need it to be unique within the conversation)."""
    return "call_" + hashlib.sha1(f"{seed}/{index}".encode()).hexdigest()[:24]


def arguments_object(call: ToolCall) -> JsonObject:
    """A call's arguments as a JSON object (a call whose arguments are not an object gets ``{}``)."""
    value = call.parsed_arguments()
    return value if isinstance(value, dict) else {}


def arguments_text(arguments: Mapping[str, JsonValue]) -> str:
    """Arguments as the JSON text a ``ToolCall`` carries."""
    return json.dumps(dict(arguments), ensure_ascii=False)


def template_json(value: JsonValue) -> str:
    """``value | tojson`` as transformers' chat-template environment writes it (non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def json_object(text: str) -> JsonObject | None:
    """``text`` as a JSON object, or None when it is not one."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def parameter_schema(tools: Sequence[ToolSpec], tool_name: str, parameter: str) -> Mapping[str, JsonValue]:
    """The JSON schema of one parameter of one tool ({} when unknown)."""
    for tool in tools:
        if tool.name == tool_name:
            properties = tool.parameters.get("properties")
            if isinstance(properties, Mapping):
                schema = properties.get(parameter)
                if isinstance(schema, Mapping):
                    return schema
    return {}


def jinja_string(value: object) -> str:
    """``value | string`` in jinja: Python's ``str`` (``True``, ``None``, ``3.5``)."""
    return str(value)


def xml_value(raw: str, schema: Mapping[str, JsonValue]) -> JsonValue:
    """A parameter value written as plain text (XML formats) back as JSON, guided by its schema's type."""
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if kinds == {"string"}:
        return raw
    if kinds & {"boolean"} and raw in ("True", "False", "true", "false"):
        return raw in ("True", "true")
    if raw == "None" and kinds & {"null"}:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return raw


def tools_json_lines(tools: Sequence[ToolSpec]) -> str:
    """One tool schema (OpenAI form) per line."""
    return "\n".join(json.dumps(tool.to_openai(), ensure_ascii=False) for tool in tools)


def partial_marker_cut(text: str, markers: Sequence[str]) -> int:
    """The length of ``text`` a stream may treat as settled: all of it but a tail that could still grow into
    one of ``markers``."""
    cut = len(text)
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                cut = min(cut, len(text) - size)
                break
    return cut


def xml_text(value: JsonValue) -> str:
    """A parameter value as XML formats write it: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else template_json(value)


def xml_calls(
    text: str, patterns: tuple[re.Pattern[str], re.Pattern[str]], tools: Sequence[ToolSpec]
) -> ParsedCalls:
    """``<tool_call>`` blocks (``patterns[0]``: the tool's name, then its body) whose bodies are only
    ``(key, value)`` parameters (``patterns[1]``), values read back by the tool's parameter schema (GLM-4.5,
    Qwen3-Coder)."""
    block, parameter = patterns

    def to_call(match: re.Match[str]) -> ToolCall | None:
        name, body = match.group(1).strip(), match.group(2)
        if not name or parameter.sub("", body).strip():
            return None
        arguments = {}
        for found in parameter.finditer(body):
            key = found.group(1).strip()
            arguments[key] = xml_value(found.group(2), parameter_schema(tools, name, key))
        return ToolCall(id="", name=name, arguments=arguments_text(arguments))

    return tagged_calls(text, block, ("<tool_call>", "</tool_call>"), to_call)


def tagged_calls(
    text: str,
    pattern: re.Pattern[str],
    markers: tuple[str, str],
    to_call: Callable[[re.Match[str]], ToolCall | None],
) -> ParsedCalls:
    """Calls written as ``OPEN…CLOSE`` blocks (``markers``) among the content (Hermes, Qwen3-Coder, GLM-4.5):
    each ``pattern`` match that ``to_call`` reads is a call, the rest of the text is content; a block that is
    broken or never closed stays content and is counted."""
    open_marker, close_marker = markers
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in pattern.finditer(text):
        call = to_call(match)
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    last_close = text.rfind(close_marker)
    opened = text.find(open_marker, last_close + len(close_marker) if last_close >= 0 else 0)
    kept.append(text[position:])
    return ParsedCalls(
        content="".join(kept).strip(),
        tool_calls=tuple(calls),
        num_malformed=text.count(open_marker) - len(calls),
        pending_from=opened if opened >= position else None,
    )


def section_calls(
    text: str,
    markers: tuple[str, str],
    pattern: re.Pattern[str],
    to_call: Callable[[re.Match[str]], ToolCall | None],
) -> ParsedCalls:
    """Calls written in one ``BEGIN…END`` section (``markers``) after the content (DeepSeek V3, Kimi K2): every
    ``pattern`` match in it must be a call ``to_call`` reads and nothing else may stand there; otherwise the
    whole reply stays content and is counted (pending while the section is still open)."""
    begin_marker, end_marker = markers
    begin = text.find(begin_marker)
    if begin < 0:
        return ParsedCalls(content=text.strip(), tool_calls=())
    end = text.find(end_marker, begin)
    section = text[begin + len(begin_marker) : end if end >= 0 else len(text)]
    calls = []
    for match in pattern.finditer(section):
        call = to_call(match)
        if call is None:
            return ParsedCalls(content=text.strip(), tool_calls=(), num_malformed=1)
        calls.append(call)
    if end < 0 or not calls or pattern.sub("", section).strip():
        return ParsedCalls(
            content=text.strip(), tool_calls=(), num_malformed=1, pending_from=begin if end < 0 else None
        )
    return ParsedCalls(
        content=(text[:begin] + text[end + len(end_marker) :]).strip(), tool_calls=tuple(calls)
    )
