"""#13.1: the trainer recomputes every segment's logprobs under the distribution it was sampled from
(temperature, top-p, top-k), even with segments of different distributions packed in one micro-batch; the
recorded distribution survives the Parquet store."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from components.protocols import SamplingParams
from components.sampling import SamplingDistribution, sampling_logprobs
from components.training.grpo import GRPO, GRPOConfig
from components.training.step import OptimizerConfig, build_optimizer, run_train_step
from components.trajectory import Segment
from components.trajectory_store import TrajectoryStore
from tests.components.training.signal_helpers import (
    load_model,
    max_abs_gap,
    packed,
    trajectory_of,
)

# a deliberately mixed set: cold and hot temperatures, nucleus, top-k, both, and greedy
DISTRIBUTIONS = (
    SamplingDistribution(temperature=0.6, top_p=0.9),
    SamplingDistribution(temperature=1.3, top_k=20),
    SamplingDistribution(temperature=1.0),
    SamplingDistribution(temperature=0.8, top_p=0.7, top_k=50),
    SamplingDistribution(temperature=0.0),
)
AGREEMENT = 1e-4  # engine (KV-cached decode) vs trainer (one full forward), fp32 on CPU


async def _rollouts(model_dir, distributions) -> list[Segment]:
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig

    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=model_dir))
    segments = []
    try:
        for seed, distribution in enumerate(distributions):
            prompt = [1, *np.random.default_rng(seed).integers(3, 49000, 10).tolist()]
            params = SamplingParams(
                max_tokens=16,
                seed=seed,
                temperature=distribution.temperature,
                top_p=distribution.top_p,
                top_k=distribution.top_k,
            )
            result = await engine.generate(prompt, params)
            n, m = len(prompt), len(result.output_ids)
            segments.append(
                Segment(
                    token_ids=prompt + list(result.output_ids),
                    loss_mask=[0] * n + [1] * m,
                    logprobs=[0.0] * n + list(result.logprobs),
                    weight_versions=[-1] * n + list(result.weight_versions),
                    sampling=distribution,
                )
            )
    finally:
        await engine.aclose()
    return segments


async def test_mixed_distributions_packed_in_one_micro_batch_match_the_rollout(tiny_model_dir, tmp_path):
    torch.set_num_threads(1)
    segments = await _rollouts(tiny_model_dir, DISTRIBUTIONS)
    trajectories = [trajectory_of([s], trajectory_id=f"t{i}") for i, s in enumerate(segments)]
    store = TrajectoryStore(tmp_path)
    stored = TrajectoryStore.read_shard(store.write(trajectories))
    assert [t.segments[0].sampling for t in stored] == list(DISTRIBUTIONS)

    batches = packed(stored, max_tokens=4096)
    assert len(batches) == 1  # every distribution in one micro-batch
    assert sorted(batches[0].temperature.tolist()) == pytest.approx(
        sorted(d.temperature for d in DISTRIBUTIONS)
    )
    model = load_model(tiny_model_dir)
    _assert_top_k_by_definition(model, segments[1])
    gap = max_abs_gap(model, stored)
    # what a trainer that ignores the recorded distribution (temperature 1, no truncation) computes
    ignored = [
        dataclasses.replace(
            t, segments=tuple(dataclasses.replace(s, sampling=SamplingDistribution()) for s in t.segments)
        )
        for t in stored
    ]
    ignored_gap = max_abs_gap(model, ignored)
    print(f"max |train - rollout| logprob: {gap:.2e} recorded distribution, {ignored_gap:.2e} ignored")
    assert gap <= AGREEMENT
    assert ignored_gap > 1.0  # the test can tell

    # each segment alone agrees too (per-segment parameters, not the row's first)
    for t in stored:
        assert max_abs_gap(model, [t]) <= AGREEMENT

    # the train step itself (its diagnostics use the pre-update logprobs) reports the worst token
    metrics = run_train_step(
        model,
        build_optimizer(model, OptimizerConfig()),
        batches,
        GRPO(GRPOConfig()),
        optimizer_config=OptimizerConfig(),
    )
    assert metrics["logprob_abs_diff_max"] <= AGREEMENT


def _assert_top_k_by_definition(model, segment: Segment) -> None:
    """The engine sampled inside the top-k and reported the renormalised logprob, checked against the
    definition, independently of ``sampling_logprobs``."""
    distribution = segment.sampling
    assert distribution.top_k > 0 and distribution.top_p == 1.0
    ids = torch.as_tensor(segment.token_ids, dtype=torch.long)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / distribution.temperature
    for position in np.flatnonzero(segment.loss_mask):
        probs = torch.softmax(logits[position - 1], dim=-1)
        top = torch.topk(probs, distribution.top_k)
        token = int(segment.token_ids[position])
        assert token in top.indices.tolist(), "sampled a token outside the top-k"
        expected = float(torch.log(probs[token] / top.values.sum()))
        assert abs(float(segment.logprobs[position]) - expected) < 1e-4


def test_sampling_logprobs_truncation_rules():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 4)
    out = sampling_logprobs(
        logits,
        temperature=torch.tensor([1.0, 0.5, 1.0, 0.0]),
        top_p=torch.tensor([1.0, 1.0, 0.8, 0.5]),
        top_k=torch.tensor([2, 0, 0, 1]),
    )
    probs = out.exp()
    assert torch.allclose(probs.sum(-1), torch.ones(4))
    # top-k 2: exactly the two best tokens, renormalised
    assert (probs[0, 2:] == 0).all() and probs[0, 0] == pytest.approx(1 / (1 + np.exp(-1)), abs=1e-6)
    # temperature 0.5, no truncation: softmax(2 * logits)
    assert torch.allclose(out[1], torch.log_softmax(2 * logits[1], -1))
    # top-p 0.8: the smallest prefix whose mass reaches 0.8 (tokens 0 and 1: 0.636 + 0.234)
    base = torch.softmax(logits[2], -1)
    assert (probs[2, :2] > 0).all() and (probs[2, 2:] == 0).all() and base[:2].sum() >= 0.8 > base[0]
    # greedy: the unscaled, untruncated distribution (what the engine reports for temperature 0)
    assert torch.allclose(out[3], torch.log_softmax(logits[3], -1))
    # the trainer's guard: a sampled token outside the kept set still gets a finite logprob
    kept = sampling_logprobs(
        logits[:1],
        temperature=torch.tensor([1.0]),
        top_p=torch.tensor([1.0]),
        top_k=torch.tensor([1]),
        keep_tokens=torch.tensor([3]),
    )
    assert torch.isfinite(kept[0, [0, 3]]).all() and torch.isinf(kept[0, [1, 2, 4]]).all()


def test_distribution_and_segment_validation():
    with pytest.raises(ValueError, match="top_k"):
        SamplingDistribution(top_k=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingDistribution(top_p=0.0)
    with pytest.raises(ValueError, match="sampling"):
        Segment(token_ids=[1], loss_mask=[0], logprobs=[0.0], weight_versions=[-1], sampling=0.7)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-1)
