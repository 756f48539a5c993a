"""TITO through a real vLLM server: a 3-turn conversation with a tool through the proxy, driven by the official
``openai`` SDK. The trajectory's sampled ids are exactly the ids vLLM returned, and every turn's prompt extends
the previous prompt + its sampled ids exactly (never re-tokenized)."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from components.engine.vllm import VLLMEngine, VLLMEngineConfig
from tests.components.proxy.proxy_helpers import BASH_TOOL_OPENAI

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class RecordingVLLM(VLLMEngine):
    """The real client, keeping each prompt and what vLLM sampled for it."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        super().__init__(config)
        self.calls: list[tuple[list[int], tuple[int, ...], tuple[float, ...]]] = []

    async def generate(self, input_ids, params):
        result = await super().generate(input_ids, params)
        self.calls.append((list(input_ids), result.output_ids, result.logprobs))
        return result


def test_three_turn_tool_conversation_keeps_vllms_ids(vllm_server, start_proxy):
    config = VLLMEngineConfig(base_url=vllm_server.url, served_model=vllm_server.served_model)
    engine = RecordingVLLM(config)
    import asyncio

    asyncio.run(engine.refresh())  # context window, logprobs mode, version (its HTTP client is then reopened)
    engine._client = None
    proxy = start_proxy(engine)
    session_id = proxy.open_session(task_id="vllm-tito")
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    messages = [
        {"role": "system", "content": "You run commands."},
        {"role": "user", "content": "What is in README?"},
    ]
    for turn in range(3):
        response = client.chat.completions.create(
            model="m", messages=messages, tools=[BASH_TOOL_OPENAI], max_tokens=12, seed=turn
        )
        message = response.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        messages.append({"role": "user", "content": f"Now run step {turn + 1}."})
    assert len(engine.calls) == 3
    for (prompt, output, _), (next_prompt, _, _) in zip(engine.calls, engine.calls[1:], strict=False):
        assert next_prompt[: len(prompt) + len(output)] == prompt + list(output), (
            "a turn's prompt must extend the last"
        )
    record = proxy.describe(session_id)
    sampled = np.concatenate(
        [np.asarray(s["token_ids"])[np.asarray(s["loss_mask"]) == 1] for s in record["segments"]]
    ).tolist()
    assert sampled == [t for _, output, _ in engine.calls for t in output]
    logprobs = np.concatenate(
        [np.asarray(s["logprobs"])[np.asarray(s["loss_mask"]) == 1] for s in record["segments"]]
    ).tolist()
    assert logprobs == pytest.approx([lp for _, _, lps in engine.calls for lp in lps], abs=1e-6)
    assert record["num_segments"] == 1
