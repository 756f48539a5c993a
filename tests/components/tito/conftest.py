"""Helpers for the TITO tests: engine records built directly from chosen replies (TITO only sees records)."""

from __future__ import annotations

import copy

import pytest

from components.protocols import FinishReason, GenerationResult

# A Qwen3-like template with native tool support that strips <think> from assistant turns before the last
# user query and puts consecutive tool results into one user turn.
QWEN_LIKE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_query_index=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- set reasoning = message.reasoning_content if message.reasoning_content is defined "
    "and message.reasoning_content else '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and reasoning %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.function.name + \'", "arguments": \' '
    "+ (tool_call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="session")
def qwen_like_tokenizer(tokenizer):
    """The SmolLM2 tokenizer with the Qwen-like reasoning + tools template."""
    clone = copy.deepcopy(tokenizer)
    clone.chat_template = QWEN_LIKE_TEMPLATE
    return clone


def engine_result(
    tokenizer,
    text: str | None = None,
    *,
    ids: list[int] | None = None,
    eos: bool = True,
    version: int = 0,
    finish_reason: FinishReason = FinishReason.STOP,
    num_prompt_tokens: int = 0,
) -> GenerationResult:
    """A GenerationResult as an engine would return it for a chosen reply (fake but distinct logprobs)."""
    output = list(ids) if ids is not None else tokenizer.encode(text, add_special_tokens=False)
    if eos:
        output.append(tokenizer.eos_token_id)
    logprobs = tuple(-0.25 * ((i % 7) + 1) for i in range(len(output)))  # exact in float32
    return GenerationResult(
        output_ids=tuple(output),
        logprobs=logprobs,
        weight_versions=(version,) * len(output),
        finish_reason=finish_reason,
        num_prompt_tokens=num_prompt_tokens,
    )


@pytest.fixture(scope="session")
def make_result():
    """``engine_result`` as a fixture (conftest modules are not imported by tests directly)."""
    return engine_result
