"""TITO (token-in, token-out): exact token records of agent conversations, independent of any engine or HTTP.

``TitoSession`` renders prompts with the model's chat template, reuses held ids when a request extends an
earlier one, records the engine's sampled ids/logprobs/weight versions into segments, and parses replies in the model
family's tool-call and reasoning formats (``components.tito.formats``: detected from the chat template or named
in ``TitoConfig.formats``: any ``TemplateFormats``), whole or as streamed deltas. ``drift_audit`` measures how far a re-render of a recorded
conversation is from its TITO ids.
"""

from components.tito.drift_audit import DriftReport, audit_session, drift_audit
from components.tito.messages import ChatMessage, ToolCall, ToolSpec
from components.tito.rendering import ChatTemplateRenderer, TemplateRenderError
from components.tito.session import (
    AssistantReply,
    PreparedTurn,
    TemplateFormats,
    TemplateFormatsConfig,
    TitoConfig,
    TitoSession,
    check_template_formats,
)

__all__ = [
    "AssistantReply",
    "ChatMessage",
    "ChatTemplateRenderer",
    "DriftReport",
    "PreparedTurn",
    "TemplateFormats",
    "TemplateFormatsConfig",
    "TemplateRenderError",
    "TitoConfig",
    "TitoSession",
    "ToolCall",
    "ToolSpec",
    "audit_session",
    "check_template_formats",
    "drift_audit",
]
