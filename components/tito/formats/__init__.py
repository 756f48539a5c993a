"""Model families' tool-call and reasoning formats, one file each, chosen from the chat template.

Tool formats (``ToolFormat``): ``hermes`` (Hermes / Qwen2.5 / Qwen3), ``qwen3_coder``, ``llama3_json``,
``mistral``, ``deepseek_v3``, ``glm45``, ``kimi_k2``, ``harmony`` (gpt-oss). Reasoning formats
(``ReasoningFormat``): ``think``, ``harmony``, ``none``.

``detect_formats(template)`` picks both from a tokenizer's chat template (the first tool format whose markers the
template writes; a template that renders no tools gets ``hermes``, taught through the system prompt); a name
given by the user (``--tool-format`` / ``--reasoning-format``, ``TitoConfig``) wins. ``ReplyParser`` splits
sampled text into reasoning, content and tool calls, whole or as a stream of deltas.

Adding a family: one file here with a class satisfying ``ToolFormat`` (``ToolFormatDefaults`` holds the common
defaults; ``base.py``'s ``tagged_calls`` / ``section_calls`` / ``xml_calls`` parse the usual layouts) or
``ReasoningFormat``, one line in ``TOOL_FORMATS`` (before any format whose markers its templates also contain),
and it passes ``tests/contracts/test_tool_format_contract.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from components.tito.formats.base import ParsedCalls, ReasoningFormat, ToolFormat, tool_call_id
from components.tito.formats.deepseek_v3 import DeepSeekV3Format
from components.tito.formats.glm45 import Glm45Format
from components.tito.formats.harmony import HarmonyFormat
from components.tito.formats.hermes import HermesFormat
from components.tito.formats.kimi_k2 import KimiK2Format
from components.tito.formats.llama3_json import Llama3JsonFormat
from components.tito.formats.mistral import MistralFormat
from components.tito.formats.qwen3_coder import Qwen3CoderFormat
from components.tito.formats.reasoning import HarmonyReasoning, NoReasoning, ThinkReasoning
from components.tito.formats.reply import (
    ParsedReply,
    ReplyDelta,
    ReplyParser,
    ReplyStream,
    call_argument_pieces,
    unsent_arguments,
)

# Detection order: more specific markers first (Qwen3-Coder and GLM templates also write ``<tool_call>``).
TOOL_FORMATS: Mapping[str, type[ToolFormat]] = {
    cls.name: cls
    for cls in (
        HarmonyFormat,
        KimiK2Format,
        DeepSeekV3Format,
        Glm45Format,
        Qwen3CoderFormat,
        MistralFormat,
        Llama3JsonFormat,
        HermesFormat,
    )
}
REASONING_FORMATS: Mapping[str, type[ReasoningFormat]] = {
    cls.name: cls for cls in (HarmonyReasoning, ThinkReasoning, NoReasoning)
}


class UnknownTemplateFormatError(ValueError):
    """A chat template renders tools, but in no tool-call format Rein knows."""


def tool_format_named(name: str) -> ToolFormat:
    """The registered tool format ``name``; ``ValueError`` listing the options otherwise."""
    if name not in TOOL_FORMATS:
        raise ValueError(f"tool_format: unknown format {name!r}; choose one of {sorted(TOOL_FORMATS)}")
    return TOOL_FORMATS[name]()


def reasoning_format_named(name: str) -> ReasoningFormat:
    """The registered reasoning format ``name``; ``ValueError`` listing the options otherwise."""
    if name not in REASONING_FORMATS:
        raise ValueError(
            f"reasoning_format: unknown format {name!r}; choose one of {sorted(REASONING_FORMATS)}"
        )
    return REASONING_FORMATS[name]()


def detect_tool_format(template: str, *, renders_tools: bool) -> ToolFormat:
    """The tool format a chat template writes; ``hermes`` for templates that render no tools."""
    for cls in TOOL_FORMATS.values():
        candidate = cls()
        if candidate.matches_template(template):
            return candidate
    if not renders_tools:
        return HermesFormat()
    raise UnknownTemplateFormatError(
        "tokenizer chat template: it renders tools, but its tool-call format is none Rein knows; pass "
        f"--tool-format NAME (TemplateFormatsConfig.tool_format) with one of {sorted(TOOL_FORMATS)}, or add a format "
        "(README: Model families)"
    )


def detect_reasoning_format(template: str) -> ReasoningFormat:
    """The reasoning format a chat template marks (``think`` when it marks none: a ``</think>`` in a reply is
    reasoning in every family that writes one)."""
    for cls in REASONING_FORMATS.values():
        candidate = cls()
        if candidate.matches_template(template):
            return candidate
    return ThinkReasoning()


__all__ = [
    "REASONING_FORMATS",
    "TOOL_FORMATS",
    "ParsedCalls",
    "ParsedReply",
    "ReasoningFormat",
    "ReplyDelta",
    "ReplyParser",
    "ReplyStream",
    "ToolFormat",
    "UnknownTemplateFormatError",
    "call_argument_pieces",
    "unsent_arguments",
    "detect_reasoning_format",
    "detect_tool_format",
    "reasoning_format_named",
    "tool_call_id",
    "tool_format_named",
]
