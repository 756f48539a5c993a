"""MoE routing replay (R3): replaying the engine's recorded routes makes the trainer's logprobs agree better
with the rollout's when the trainer's weights differ slightly from the rollout's (as after an update, or
with different numerics), and is exact when nothing differs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from components.protocols import SamplingParams
from components.training.data import MicroBatch
from components.training.forward import forward_sampled_tokens
from components.training.routing_replay import (
    find_routers,
    record_routes,
    routes_from_generation,
    routes_tensor,
)


def sampled_view(model, token_ids, num_prompt, routes):
    n = len(token_ids)
    mask = torch.zeros(n)
    mask[num_prompt:] = 1
    batch = MicroBatch(
        input_ids=torch.tensor(token_ids),
        position_ids=torch.arange(n),
        sequence_ids=torch.zeros(n, dtype=torch.long),
        loss_mask=mask,
        old_logprobs=torch.zeros(n),
        advantages=torch.zeros(n),
        weights=torch.zeros(n),
        weight_versions=torch.zeros(n, dtype=torch.long),
        routed_experts=routes,
    )
    with torch.no_grad():
        return forward_sampled_tokens(model, batch, with_entropy=False).logprobs.numpy()


async def test_routing_replay_improves_train_rollout_agreement(tiny_moe_model_dir):
    from transformers import AutoModelForCausalLM

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig

    torch.set_num_threads(1)
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_moe_model_dir))
    try:
        rollouts = []
        for seed in range(6):
            prompt = [1, *np.random.default_rng(seed).integers(3, 49000, 12).tolist()]
            params = SamplingParams(max_tokens=24, seed=seed, return_routed_experts=True)
            rollouts.append((prompt, await engine.generate(prompt, params)))
    finally:
        await engine.aclose()

    model = AutoModelForCausalLM.from_pretrained(tiny_moe_model_dir, dtype=torch.float32)
    model.eval()
    assert len(find_routers(model)) == 2

    def disagreement(replay: bool) -> tuple[float, float]:
        diffs, flipped, total = [], 0, 0
        for prompt, result in rollouts:
            tokens = prompt + list(result.output_ids)
            routes = routes_from_generation(result.routed_experts, len(tokens))
            with record_routes(model) as recorded:
                logprobs = sampled_view(model, tokens, len(prompt), routes if replay else None)
            used = routes_tensor(recorded)[: len(tokens) - 1].sort(-1).values
            flipped += int((used != routes[: len(tokens) - 1].sort(-1).values).any(-1).sum())
            total += used.shape[0] * used.shape[1]
            diffs.append(np.abs(logprobs - np.asarray(result.logprobs)))
        return float(np.concatenate(diffs).mean()), flipped / total

    # same weights: replay is exact and re-routing picks the same experts
    same_replayed, same_flips = disagreement(replay=True)
    same_rerouted, _ = disagreement(replay=False)
    assert same_flips == 0
    assert same_replayed == pytest.approx(same_rerouted, abs=1e-6) and same_replayed < 1e-4

    # the trainer's routers drift slightly from the rollout's (as after an update or with other numerics):
    # near-tied tokens route to other experts, which changes their logprobs far more than the drift itself
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for router in find_routers(model):
            router.weight.add_(
                torch.randn(router.weight.shape, generator=generator) * 0.05 * router.weight.std()
            )
    replayed, replayed_flips = disagreement(replay=True)
    rerouted, rerouted_flips = disagreement(replay=False)
    print(
        f"R3: mean |train - rollout| logprob {replayed:.2e} with replay, {rerouted:.2e} re-routed "
        f"({rerouted_flips:.1%} of position×layer routes differ)"
    )
    assert replayed_flips == 0 and rerouted_flips > 0.01
    assert replayed < 0.5 * rerouted, (replayed, rerouted, rerouted_flips)
