"""The canonical conversation every protocol (OpenAI Chat, OpenAI Responses, Anthropic Messages) is
translated into before it reaches the TITO core."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from components.config import require, require_one_of
from components.json_types import JsonObject, JsonValue

Role = Literal["system", "user", "assistant", "tool"]
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """A tool call the assistant made. ``arguments`` is JSON text (as OpenAI carries it)."""

    id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> JsonValue:
        """The arguments as JSON, or the raw text when it is not valid JSON."""
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError:
            return self.arguments


@dataclass(frozen=True, kw_only=True)
class ChatMessage:
    """One turn. ``tool_call_id`` is set exactly on ``tool`` messages; ``tool_calls`` only on assistant ones."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning: str | None = None  # thinking text of an assistant turn, when the harness sends it back

    def __post_init__(self) -> None:
        require_one_of(self.role, "role", ROLES)
        require(isinstance(self.content, str), "content", f"must be text, got {type(self.content).__name__}")
        require(
            not self.tool_calls or self.role == "assistant", "tool_calls", "only assistant messages have them"
        )
        require(
            (self.tool_call_id is not None) == (self.role == "tool"),
            "tool_call_id",
            "must be set exactly on tool messages",
        )
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A function tool the agent offers. ``parameters`` is a JSON schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, JsonValue] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        require(bool(self.name), "name", "a tool needs a name")

    def to_openai(self) -> JsonObject:
        """The OpenAI ``{"type": "function", "function": {...}}`` form HF chat templates take."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }
