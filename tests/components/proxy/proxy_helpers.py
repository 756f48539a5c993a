"""Helpers shared by the proxy tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from components.engine.scripted import ScriptedEngine
from components.protocols import GenerationResult, SamplingParams, SessionDescription

BASH_TOOL_OPENAI = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}


def tool_call_text(name: str, arguments: dict[str, Any], prefix: str = "") -> str:
    """What the policy writes to call a tool (Hermes style, as the TITO core parses it)."""
    block = f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
    return f"{prefix}\n{block}" if prefix else block


class DelayedEngine:
    """A real engine whose every generation first waits ``delay_s`` (a slow prefill, for keep-alive tests)."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    @property
    def context_window(self) -> int:
        return self.inner.context_window

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        await asyncio.sleep(self.delay_s)
        return await self.inner.generate(input_ids, params)

    async def update_weights(self, state_dict, version: int) -> None:
        await self.inner.update_weights(state_dict, version)


def reply_ids(tokenizer, text: str) -> list[int]:
    """The ids ScriptedEngine samples for ``text``: its tokens, then EOS."""
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def assert_one_segment_record(
    record: SessionDescription, engine: ScriptedEngine, replies: Sequence[str], tokenizer
) -> None:
    """The session is one append-only segment: each prompt extends the last, the sampled ids are exactly the
    scripted replies' ids with loss mask 1 (logprob 0.0, weight version 0), everything else mask 0."""
    assert record.num_segments == 1, record.num_segments
    segment = record.segments[0]
    token_ids = np.asarray(segment["token_ids"])
    mask = np.asarray(segment["loss_mask"])
    assert len(engine.prompts) == len(replies)
    for prompt in engine.prompts:  # every prompt the engine saw is a prefix of the record
        assert token_ids[: len(prompt)].tolist() == list(prompt)
    expected_sampled = [t for text in replies for t in reply_ids(tokenizer, text)]
    assert token_ids[mask == 1].tolist() == expected_sampled
    last_prompt = engine.prompts[-1]
    assert token_ids.tolist() == [*last_prompt, *reply_ids(tokenizer, replies[-1])]
    assert np.all(np.asarray(segment["logprobs"])[mask == 0] == 0)
    assert np.all(np.asarray(segment["weight_versions"])[mask == 1] == 0)
    assert np.all(np.asarray(segment["weight_versions"])[mask == 0] == -1)


def read_rein_proxy_start(proxy: Any) -> tuple[str, str, str]:
    """Read a ``rein proxy`` subprocess's merged output until it serves: (URL, generated admin key, banner line).

    The admin key is the one it printed once to stderr (the closed default when no key is given)."""
    import re

    lines: list[str] = []
    admin_key = ""
    while True:  # library warnings may come first (stderr is merged)
        line = proxy.stdout.readline()
        assert line, "".join(lines)[-3000:]  # it exited without serving
        lines.append(line)
        if key := re.search(r"^rein proxy: generated admin key \(control routes\): (\S+)$", line):
            admin_key = key.group(1)
        if served := re.search(r"^rein proxy: .* at (http://\S+) \(context window", line):
            return served.group(1), admin_key, line


def streamed_tool_calls(chunks) -> list[dict[str, Any]]:
    """The tool calls of streamed chat completion chunks, as an OpenAI client assembles them: the first chunk
    of an index has its id and name, the arguments of all its chunks add up."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if call.index not in calls:
                function = {"name": call.function.name, "arguments": ""}
                calls[call.index] = {"id": call.id, "type": "function", "function": function}
            calls[call.index]["function"]["arguments"] += call.function.arguments or ""
    return [calls[index] for index in sorted(calls)]


def one_reply_through_rein_proxy(url: str, admin_key: str, *, max_tokens: int = 5) -> None:
    """Against a served ``rein proxy``: a session (admin key), one openai-SDK chat reply of ``max_tokens`` tokens
    through it, then the session finalized (its trajectory written)."""
    import httpx
    from openai import OpenAI

    admin = {"Authorization": f"Bearer {admin_key}"}
    session = httpx.post(f"{url}/sessions", headers=admin).json()
    client = OpenAI(base_url=f"{session['base_url']}/v1", api_key=session["api_key"], max_retries=0)
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens
    )
    assert reply.usage.completion_tokens == max_tokens
    finalized = httpx.post(f"{url}/s/{session['session_id']}/finalize", headers=admin, json={}).json()
    assert finalized["status"] == "ok"
