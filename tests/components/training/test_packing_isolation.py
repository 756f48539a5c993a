"""#13.4: packed segments never see each other. A segment's trainer logprobs are the same (≤ 1e-6) whether it
shares a micro-batch with other segments or is alone, for the dense and the MoE tiny model, with each
segment's own sampling distribution and (MoE) its own replayed routes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from components.sampling import SamplingDistribution
from components.training.forward import forward_sampled_tokens
from components.training.routing_replay import find_routers
from components.trajectory import Segment
from tests.components.training.signal_helpers import load_model, packed, trajectory_of

DISTRIBUTIONS = (
    SamplingDistribution(temperature=0.7, top_p=0.9),
    SamplingDistribution(temperature=1.2, top_k=30),
    SamplingDistribution(),
    SamplingDistribution(temperature=0.5, top_p=0.8, top_k=100),
)
LENGTHS = (37, 23, 51, 12)


def _segments(num_layers_and_top_k: tuple[int, int] | None) -> list[Segment]:
    segments = []
    for index, (length, distribution) in enumerate(zip(LENGTHS, DISTRIBUTIONS, strict=True)):
        rng = np.random.default_rng(index)
        mask = (rng.random(length) < 0.6).astype(np.int8)
        mask[0] = 0
        routes = None
        if num_layers_and_top_k is not None:
            layers, top_k = num_layers_and_top_k
            # distinct experts per position (as a router picks them), ids of a 4-expert model
            routes = np.stack([rng.permutation(4)[:top_k] for _ in range((length - 1) * layers)])
            routes = routes.reshape(length - 1, layers, top_k)
        segments.append(
            Segment(
                token_ids=rng.integers(3, 49000, length),
                loss_mask=mask,
                logprobs=np.where(mask == 1, -rng.uniform(0.1, 5.0, length), 0.0),
                weight_versions=np.where(mask == 1, 0, -1),
                sampling=distribution,
                routed_experts=routes,
            )
        )
    return segments


def _per_segment_logprobs(model, batch) -> list[np.ndarray]:
    with torch.no_grad():
        view = forward_sampled_tokens(model, batch, with_entropy=False)
    ids = view.sequence_ids.numpy()
    values = view.logprobs.double().numpy()
    return [values[ids == k] for k in range(int(batch.sequence_ids.max()) + 1)]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_segment_logprobs_do_not_depend_on_their_neighbours(tiny_model_dir, tiny_moe_model_dir, moe):
    torch.set_num_threads(1)
    # float64: what is compared is attention structure, not float32 summation-order noise (≈ 1e-6 here)
    model = load_model(tiny_moe_model_dir if moe else tiny_model_dir, dtype=torch.float64)
    routers = find_routers(model)
    assert bool(routers) == moe
    segments = _segments((len(routers), routers[0].top_k) if moe else None)
    trajectories = [trajectory_of([s], trajectory_id=f"t{i}") for i, s in enumerate(segments)]

    (row,) = packed(trajectories, max_tokens=4096)
    assert int(row.sequence_ids.max()) == len(segments) - 1  # all four share one row
    assert (row.routed_experts is not None) == moe
    together = _per_segment_logprobs(model, row)

    worst = 0.0
    for index, trajectory in enumerate(trajectories):
        (alone_row,) = packed([trajectory], max_tokens=4096)
        (alone,) = _per_segment_logprobs(model, alone_row)
        assert len(alone) == len(together[index]) == segments[index].num_sampled_tokens
        worst = max(worst, float(np.abs(alone - together[index]).max()))
    print(f"{'moe' if moe else 'dense'}: max |packed - alone| logprob {worst:.2e}")
    assert worst <= 1e-6

    # the test can tell: positions that do not restart per segment let segments attend to each other
    leaky = dataclasses.replace(row, position_ids=torch.arange(row.num_tokens))
    leaked = _per_segment_logprobs(model, leaky)
    assert max(float(np.abs(a - b).max()) for a, b in zip(leaked[1:], together[1:], strict=True)) > 1e-3
