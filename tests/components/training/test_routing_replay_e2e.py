"""#13.2: R3 routes through the real path. The proxy asks the engine for MoE routes, TITO records them per
segment (across turns), the store writes them as a compact Arrow column, Ray Data packs them into
micro-batches with other segments, and the trainer's forward pass replays them: when the trainer's routers
differ slightly from the rollout's, the train/rollout logprob gap with replay is at most a fifth of the gap
without."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from components.protocols import SessionOpen, SessionOutcome
from components.proxy.config import ProxyConfig
from components.proxy.sessions import LocalSessionRegistry, TurnRequest
from components.sampling import SamplingDistribution
from components.tito.messages import ChatMessage
from components.training.data import MicroBatch, SampleBatchConfig, build_micro_batches_with_ray
from components.training.forward import forward_sampled_tokens
from components.training.grpo import GRPO, GRPOConfig
from components.training.routing_replay import find_routers
from components.trajectory_store import TrajectoryStore
from tests.components.training.signal_helpers import load_model

NUM_SESSIONS = 4


async def _record_sessions(model_dir, run_dir) -> None:
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig

    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=model_dir))
    config = ProxyConfig(
        run_dir=run_dir,
        record_routed_experts=True,
        sampling=SamplingDistribution(temperature=0.9, top_p=0.95),
        max_completion_tokens=20,
    )
    registry = LocalSessionRegistry(engine, engine.tokenizer, config)
    try:
        for index in range(NUM_SESSIONS):
            session = await registry.open_session(SessionOpen(group_id="g"))
            messages = [ChatMessage(role="user", content=f"Task {index}: count the files.")]
            for turn in range(2):  # the second turn extends the first: routes merge across turns
                outcome = await registry.run_turn(session, TurnRequest(messages=tuple(messages), seed=index))
                messages += [outcome.reply.to_message(), ChatMessage(role="user", content=f"Go on ({turn}).")]
            await registry.finalize(session, SessionOutcome(reward=float(index % 2)))
    finally:
        await engine.aclose()


def _gaps(model, batches: list[MicroBatch], *, replay: bool) -> np.ndarray:
    gaps = []
    with torch.no_grad():
        for batch in batches:
            used = batch if replay else dataclasses.replace(batch, routed_experts=None)
            view = forward_sampled_tokens(model, used, with_entropy=False)
            gaps.append((view.logprobs - view.old_logprobs).abs().double().numpy())
    return np.concatenate(gaps)


@pytest.mark.slow
async def test_routes_travel_proxy_store_ray_data_and_replay(tiny_moe_model_dir, tmp_path, ray_session):
    torch.set_num_threads(1)
    await _record_sessions(tiny_moe_model_dir, tmp_path)

    store = TrajectoryStore(tmp_path)
    trajectories = store.read_all().trajectories
    assert len(trajectories) == NUM_SESSIONS
    for trajectory in trajectories:
        (segment,) = trajectory.segments  # two turns, one segment
        assert segment.routed_experts.shape == (len(segment.token_ids) - 1, 2, 2)
        assert segment.routed_experts.dtype == np.int16 and segment.routed_experts.min() >= 0

    batches = build_micro_batches_with_ray(
        store.shard_paths(),
        GRPO(GRPOConfig()),
        SampleBatchConfig(max_tokens_per_micro_batch=4096),
        current_version=0,
        max_read_tasks=1,  # one block: the sessions' segments are packed together
    )
    rows = [MicroBatch.from_row(row) for row in batches.dataset.take_all()]
    assert any(int(b.sequence_ids.max()) > 0 for b in rows)  # segments packed together
    for batch in rows:
        assert batch.routed_experts is not None and batch.routed_experts.shape == (batch.num_tokens, 2, 2)

    model = load_model(tiny_moe_model_dir)
    same_weights = _gaps(model, rows, replay=True)
    assert same_weights.max() <= 1e-4, same_weights.max()

    # the trainer's routers drift slightly from the rollout's (other numerics, or an update in between)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for router in find_routers(model):
            router.weight.add_(
                torch.randn(router.weight.shape, generator=generator) * 0.05 * router.weight.std()
            )
    replayed = _gaps(model, rows, replay=True)
    rerouted = _gaps(model, rows, replay=False)
    print(
        f"R3 through proxy/store/Ray Data: |train - rollout| logprob over {replayed.size} tokens: "
        f"max {replayed.max():.2e} / mean {replayed.mean():.2e} with replay, "
        f"max {rerouted.max():.2e} / mean {rerouted.mean():.2e} re-routed; "
        f"same weights with replay: max {same_weights.max():.2e}"
    )
    assert replayed.mean() <= rerouted.mean() / 5
    assert replayed.max() <= rerouted.max() / 5
