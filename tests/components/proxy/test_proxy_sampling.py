"""#13.1, the proxy's sampling rule: by default every request is sampled with the run's distribution whatever
the agent sends; ``agent_sampling`` lets the agent choose; either way each segment records the distribution
it was sampled with, and a change of distribution starts a new segment."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from components.engine.scripted import ScriptedEngine
from components.protocols import GenerationResult, SamplingParams, SessionOutcome
from components.proxy.config import ProxyConfig
from components.proxy.errors import InvalidRequestError
from components.proxy.sessions import LocalSessionRegistry, TurnRequest
from components.sampling import SamplingDistribution
from components.tito.messages import ChatMessage
from components.trajectory import SegmentReason

RUN = SamplingDistribution(temperature=0.8, top_p=0.9, top_k=40)


class RecordingEngine:
    """A scripted engine that keeps the sampling parameters of every call."""

    def __init__(self, inner: ScriptedEngine) -> None:
        self.inner = inner
        self.params: list[SamplingParams] = []

    @property
    def context_window(self) -> int:
        return self.inner.context_window

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        self.params.append(params)
        return await self.inner.generate(input_ids, params)

    async def update_weights(self, state_dict, version: int) -> None:
        await self.inner.update_weights(state_dict, version)


def _registry(tokenizer, **config) -> tuple[LocalSessionRegistry, RecordingEngine]:
    engine = RecordingEngine(ScriptedEngine(tokenizer, ["One.", "Two.", "Three."]))
    return LocalSessionRegistry(engine, tokenizer, ProxyConfig(sampling=RUN, **config)), engine


def _conversation(*replies: str) -> tuple[ChatMessage, ...]:
    messages = [ChatMessage(role="user", content="go")]
    for reply in replies:
        messages += [ChatMessage(role="assistant", content=reply), ChatMessage(role="user", content="more")]
    return tuple(messages)


async def test_run_distribution_wins_by_default(tokenizer):
    registry, engine = _registry(tokenizer)
    session = await registry.open_session()
    await registry.run_turn(session, TurnRequest(messages=_conversation(), temperature=0.2, top_p=0.5))
    await registry.run_turn(session, TurnRequest(messages=_conversation("One."), temperature=1.7, top_k=3))
    assert [(p.temperature, p.top_p, p.top_k) for p in engine.params] == [(0.8, 0.9, 40)] * 2
    trajectory = await registry.finalize(session, SessionOutcome(reward=1.0))
    assert len(trajectory.segments) == 1 and trajectory.segments[0].sampling == RUN


async def test_agent_sampling_is_recorded_and_a_change_starts_a_segment(tokenizer):
    registry, engine = _registry(tokenizer, agent_sampling=True)
    session = await registry.open_session()
    await registry.run_turn(session, TurnRequest(messages=_conversation(), temperature=0.2, top_p=0.5))
    await registry.run_turn(session, TurnRequest(messages=_conversation("One."), temperature=0.2, top_p=0.5))
    await registry.run_turn(
        session, TurnRequest(messages=_conversation("One.", "Two."), temperature=1.1, top_k=7)
    )
    assert [(p.temperature, p.top_p, p.top_k) for p in engine.params] == [
        (0.2, 0.5, 0),
        (0.2, 0.5, 0),
        (1.1, 1.0, 7),
    ]
    description = await registry.describe(session)
    assert [s["sampling"] for s in description.segments] == [
        {"temperature": 0.2, "top_p": 0.5, "top_k": 0},
        {"temperature": 1.1, "top_p": 1.0, "top_k": 7},
    ]
    trajectory = await registry.finalize(session, SessionOutcome(reward=1.0))
    first, second = trajectory.segments
    assert second.reason == SegmentReason.SAMPLING_CHANGED
    # the new segment reuses the held ids unmasked: its earlier replies are trained in the first segment only
    assert second.token_ids[: len(first.token_ids)].tolist() == first.token_ids.tolist()
    assert second.loss_mask[: len(first.token_ids)].sum() == 0
    with pytest.raises(InvalidRequestError, match="top_k"):
        await registry.run_turn(
            await registry.open_session(), TurnRequest(messages=_conversation(), top_k=-1)
        )


def test_config_names_the_field():
    with pytest.raises(ValueError, match="sampling"):
        ProxyConfig(sampling=0.7)


def test_anthropic_top_k_reaches_the_engine_when_agents_choose(start_proxy, tokenizer):
    import anthropic

    engine = RecordingEngine(ScriptedEngine(tokenizer, ["Hi."]))
    proxy = start_proxy(engine, sampling=RUN, agent_sampling=True)
    session_id = proxy.open_session()
    client = anthropic.Anthropic(base_url=proxy.session_url(session_id), api_key="unused")
    client.messages.create(
        model="m",
        max_tokens=16,
        extra_body={"temperature": 0.5, "top_k": 5},  # this SDK version has no typed temperature argument
        messages=[{"role": "user", "content": "hi"}],
    )
    assert [(p.temperature, p.top_p, p.top_k) for p in engine.params] == [(0.5, 1.0, 5)]
    record = proxy.server.call(lambda: proxy.registry.describe(session_id))
    assert record.segments[0]["sampling"] == {"temperature": 0.5, "top_p": 1.0, "top_k": 5}


def test_recipe_options_name_the_run_distribution(capsys):
    from components.recipe_config import parse_config
    from components.run.config import RunConfig

    config = parse_config(
        RunConfig, ["--model", "tiny", "--temperature", "0.6", "--top-p", "0.95", "--top-k", "50"]
    )
    assert config.sampling.distribution == SamplingDistribution(temperature=0.6, top_p=0.95, top_k=50)
    assert not config.sampling.agent_sampling and not config.sampling.record_routed_experts
    assert parse_config(RunConfig, ["--model", "tiny", "--agent-sampling", "true"]).sampling.agent_sampling
    with pytest.raises(SystemExit):
        parse_config(RunConfig, ["--model", "tiny", "--top-k", "-2"])
    assert "sampling.top_k" in capsys.readouterr().err
