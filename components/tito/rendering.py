"""Render canonical conversations with a tokenizer's own chat template, and find where a template's turns meet.

Templates that support tools (they mention ``tools``) get the tools and the messages in the OpenAI form HF
templates take (``tools=`` of ``apply_chat_template``, ``tool_calls`` with parsed arguments, ``reasoning_content``).
Templates without tool support (SmolLM2's ChatML) get the tool format's text instead (Hermes/Qwen by default,
``components/tito/formats``): the tool schemas in the system message, past tool calls written in the assistant
content as the model wrote them, and each run of
consecutive tool results as ONE user turn of ``<tool_response>`` blocks. (With tools but no system message,
the tool instructions become the system message, replacing any default system prompt of the template.)

``new_messages_text`` is how TITO appends turns without re-rendering (or re-tokenizing) the history: it renders
the new messages after a small *anchor* (a system message, a placeholder user turn and a placeholder assistant
turn; with native tool support the real system message, tools and the reply's tool calls), and keeps the
difference between the render with and without them. The placeholder assistant turn has no reasoning, so
templates that strip ``<think>`` from past turns do not change the anchor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from components.json_types import JsonObject
from components.tito.formats import ToolFormat, detect_tool_format
from components.tito.formats.hermes import tool_responses_text
from components.tito.messages import ChatMessage, ToolCall, ToolSpec
from components.tito.tool_calls import template_tool_call

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_SENTINEL = "\u2063rein-turn-end\u2063"
_ANCHOR_CACHE_SIZE = 64


class TemplateRenderError(ValueError):
    """The chat template could not render the conversation (or its render is not what TITO needs)."""


class TemplatePrefixError(TemplateRenderError):
    """The template renders earlier turns differently once new messages follow them."""


def _template_source(tokenizer: PreTrainedTokenizerBase) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default") or next(iter(template.values()), None)
    if not isinstance(template, str) or not template:
        raise ValueError("tokenizer: has no chat template; TITO needs one to render prompts")
    return template


class ChatTemplateRenderer:
    """Canonical messages → the text and token ids the model's chat template makes of them."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        native_tools: bool | None = None,
        tool_format: ToolFormat | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        template = _template_source(tokenizer)
        self.template = template
        # None: decide from the template itself (HF templates with tool support read the ``tools`` variable).
        self.native_tools = ("tools" in template) if native_tools is None else native_tools
        # How the model writes tool calls: given, else detected from the template (UnknownTemplateFormatError
        # for a template that renders tools in a format no registered one matches).
        self.tool_format = tool_format or detect_tool_format(template, renders_tools="tools" in template)
        # (anchor messages, the anchor tools' canonical JSON) → the anchor's text
        self._anchor_cache: dict[tuple[tuple[ChatMessage, ...], tuple[str, ...]], str] = {}
        self.end_of_turn_text = self._assistant_turn_closing()

    # -- messages in the template's form -----------------------------------------------------------------

    def template_messages(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> list[JsonObject]:
        """The messages as the dicts this template takes (tools folded into text when it cannot take them)."""
        if self.native_tools:
            return [self._native_message(message) for message in messages]
        out: list[JsonObject] = []
        pending_results: list[str] = []
        for message in messages:
            if message.role == "tool":
                pending_results.append(message.content)
                continue
            if pending_results:
                out.append({"role": "user", "content": tool_responses_text(pending_results)})
                pending_results = []
            if message.role == "assistant":
                text = self.tool_format.render_calls(message.content, message.tool_calls)
                out.append({"role": "assistant", "content": text})
            else:
                out.append({"role": message.role, "content": message.content})
        if pending_results:
            out.append({"role": "user", "content": tool_responses_text(pending_results)})
        if tools:
            tools_text = self.tool_format.tools_prompt(tools)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools_text}"}
            else:
                out.insert(0, {"role": "system", "content": tools_text})
        return out

    @staticmethod
    def _native_message(message: ChatMessage) -> JsonObject:
        out: JsonObject = {"role": message.role, "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [template_tool_call(call) for call in message.tool_calls]
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.reasoning:
            out["reasoning_content"] = message.reasoning
        return out

    # -- rendering ---------------------------------------------------------------------------------------

    def render_text(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, add_generation_prompt: bool
    ) -> str:
        """The template's text for a conversation."""
        try:
            text = self.tokenizer.apply_chat_template(
                self.template_messages(messages, tools),
                tools=[tool.to_openai() for tool in tools] if (self.native_tools and tools) else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception as error:  # jinja raises its own error types (and templates call raise_exception)
            raise TemplateRenderError(
                f"messages: the chat template failed to render them: {error}"
            ) from error
        if not isinstance(text, str):
            raise TemplateRenderError(f"chat template returned {type(text).__name__}, expected text")
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (the template writes any BOS itself)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_ids(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, add_generation_prompt: bool
    ) -> list[int]:
        """The template's token ids for a whole conversation."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt=add_generation_prompt))

    def new_messages_text(
        self,
        system: ChatMessage | None,
        reply_tool_calls: Sequence[ToolCall],
        new_messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
    ) -> str:
        """The text the template puts after a finished assistant turn for ``new_messages`` and the generation
        prompt, found by rendering them after a small anchor conversation and diffing.

        With native tool support the anchor carries the real system message, tools and the reply's tool calls
        (a template may read them); with Hermes-style text they only shape the system message, so a fixed
        anchor is used and its render is cached.
        """
        if self.native_tools:
            anchor_system = [system] if system is not None else []
            anchor_calls, anchor_tools = tuple(reply_tool_calls), tuple(tools)
        else:
            anchor_system = [ChatMessage(role="system", content=".")]
            anchor_calls, anchor_tools = (), ()
        anchor = [
            *anchor_system,
            ChatMessage(role="user", content="."),
            ChatMessage(role="assistant", content="", tool_calls=anchor_calls),
        ]
        before = self._anchor_text(anchor, anchor_tools)
        after = self.render_text([*anchor, *new_messages], anchor_tools, add_generation_prompt=True)
        if not after.startswith(before) and after.startswith(before.rstrip()):
            before = before.rstrip()  # whitespace some templates (DeepSeek V3's) write only at the very end
        if not after.startswith(before):
            raise TemplatePrefixError(
                "the template renders earlier turns differently once new messages follow"
            )
        return after[len(before) :]

    def _anchor_text(self, anchor: list[ChatMessage], tools: tuple[ToolSpec, ...]) -> str:
        key = (tuple(anchor), tuple(json.dumps(tool.to_openai(), sort_keys=True) for tool in tools))
        text = self._anchor_cache.get(key)
        if text is None:
            text = self.render_text(anchor, tools, add_generation_prompt=False)
            if len(self._anchor_cache) >= _ANCHOR_CACHE_SIZE:
                self._anchor_cache.pop(next(iter(self._anchor_cache)))
            self._anchor_cache[key] = text
        return text

    def generation_prompt_opens_reasoning(self, marker: str) -> bool:
        """Whether the generation prompt ends by opening a reasoning block (``marker``, e.g. ``<think>``)."""
        try:
            text = self.render_text([ChatMessage(role="user", content=".")], (), add_generation_prompt=True)
        except TemplateRenderError:
            return False
        return bool(marker) and text.rstrip().endswith(marker)

    def _assistant_turn_closing(self) -> str:
        """What the template writes after an assistant turn's content (``<|im_end|>\\n`` for ChatML)."""
        conversation = [
            ChatMessage(role="user", content="."),
            ChatMessage(role="assistant", content=_SENTINEL),
        ]
        try:
            text = self.render_text(conversation, (), add_generation_prompt=False)
        except TemplateRenderError:
            return ""
        if _SENTINEL not in text:
            return ""
        closing = text[text.rindex(_SENTINEL) + len(_SENTINEL) :]
        try:  # only what still follows the turn once another message comes (not whitespace ending the text)
            followed = self.render_text(
                [*conversation, ChatMessage(role="user", content=".")], (), add_generation_prompt=False
            )
        except TemplateRenderError:
            return closing
        after = followed[followed.rindex(_SENTINEL) + len(_SENTINEL) :] if _SENTINEL in followed else ""
        size = 0
        while size < min(len(closing), len(after)) and closing[size] == after[size]:
            size += 1
        return closing[:size]
