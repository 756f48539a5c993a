"""The GRPO loss against hand-computed values: clipping on both sides, truncated IS, masking, KL; and the
advantage estimator and sample weighting of the GRPO brick."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from components.protocols import Algorithm
from components.training.algorithms import DrGRPOConfig
from components.training.grpo import GRPO, GRPOConfig
from components.training.losses import PolicyLossConfig, policy_gradient_loss

# four tokens: a (ratio 1.5, A=+1), b (ratio 0.5, A=-1), c (ratio 1.1, A=+2), d (masked out)
RATIOS = [1.5, 0.5, 1.1, 3.0]
ADVANTAGES = [1.0, -1.0, 2.0, 5.0]
MASK = [1.0, 1.0, 1.0, 0.0]
WEIGHTS = [0.5, 0.25, 1.0, 7.0]
# behaviour (rollout) logprobs below the proximal ones: IS ratios 1.5, 3 (truncated to 2), 1, 10 (masked)
IS_RATIOS = [1.5, 3.0, 1.0, 10.0]


def inputs(**overrides):
    proximal = torch.tensor([-1.0, -2.0, -0.5, -0.3])
    logprobs = (proximal + torch.log(torch.tensor(RATIOS))).requires_grad_(True)
    values = dict(
        logprobs=logprobs,
        proximal_logprobs=proximal,
        old_logprobs=proximal - torch.log(torch.tensor(IS_RATIOS)),
        advantages=torch.tensor(ADVANTAGES),
        loss_mask=torch.tensor(MASK),
        weights=torch.tensor(WEIGHTS),
    )
    values.update(overrides)
    return values


def test_clip_higher_both_sides_and_token_truncated_is():
    config = PolicyLossConfig(
        clip_low=0.2, clip_high=0.28, importance_sampling="token", importance_sampling_cap=2.0
    )
    values = inputs()
    loss, stats = policy_gradient_loss(config, **values)
    # a: max(-1.5, -1.28) = -1.28 (clipped high), IS 1.5, w 0.5  -> -0.96
    # b: max(0.5, 0.8) = 0.8 (clipped low), IS min(3, 2) = 2, w 0.25 -> 0.4
    # c: -2.2 unclipped, IS 1, w 1 -> -2.2 ; d masked
    assert loss.item() == pytest.approx(-0.96 + 0.4 - 2.2, abs=1e-5)
    loss.backward()
    # clipped tokens get no gradient; c: d/dlogp (-A r IS w) = -2 * 1.1 * 1 * 1
    assert values["logprobs"].grad.tolist() == pytest.approx([0.0, 0.0, -2.2, 0.0], abs=1e-5)
    assert stats["pg_clip_fraction_sum"] == 2
    assert stats["is_truncated_fraction_sum"] == 1
    assert stats["num_tokens"] == 3


def test_sequence_level_is_uses_the_summed_log_ratio_of_masked_tokens():
    config = PolicyLossConfig(importance_sampling="sequence", importance_sampling_cap=2.0)
    loss, stats = policy_gradient_loss(config, **inputs(), sequence_ids=torch.tensor([0, 0, 1, 1]))
    # sequence 0: IS = min(1.5 * 3, 2) = 2 for a and b; sequence 1: only c counts (d masked) -> 1
    assert loss.item() == pytest.approx(0.5 * 2 * -1.28 + 0.25 * 2 * 0.8 - 2.2, abs=1e-5)
    assert stats["is_truncated_fraction_sum"] == 2
    with pytest.raises(ValueError, match="sequence_ids"):
        policy_gradient_loss(config, **inputs())


def test_no_importance_sampling_and_default_proximal_policy():
    config = PolicyLossConfig(importance_sampling="none")
    values = inputs(proximal_logprobs=None)
    loss, stats = policy_gradient_loss(config, **values)
    # proximal = current (detached): ratio 1, nothing clipped, loss = Σ w·(-A) over masked tokens
    assert loss.item() == pytest.approx(0.5 * -1 + 0.25 * 1 + 1 * -2, abs=1e-6)
    loss.backward()
    assert values["logprobs"].grad.tolist() == pytest.approx([-0.5, 0.25, -2.0, 0.0], abs=1e-6)
    assert stats["pg_clip_fraction_sum"] == 0


def test_kl_penalty_is_the_k3_estimate_and_needs_reference_logprobs():
    config = PolicyLossConfig(importance_sampling="none", kl_coef=0.1)
    values = inputs(proximal_logprobs=None, advantages=torch.zeros(4))
    logprobs = values["logprobs"].detach()
    reference = logprobs - torch.tensor([0.5, -0.5, 0.0, 9.0])
    loss, stats = policy_gradient_loss(config, **values, ref_logprobs=reference)
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1, 0.0]
    assert loss.item() == pytest.approx(0.1 * (0.5 * k3[0] + 0.25 * k3[1] + 0), abs=1e-6)
    assert stats["kl_sum"] == pytest.approx(sum(k3), abs=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_gradient_loss(config, **inputs())


def test_loss_config_validation_names_the_field():
    with pytest.raises(ValueError, match="clip_low"):
        PolicyLossConfig(clip_low=1.5)
    with pytest.raises(ValueError, match="importance_sampling"):
        PolicyLossConfig(importance_sampling="per-token")
    with pytest.raises(ValueError, match="ratio_level"):
        PolicyLossConfig(ratio_level="segment")
    with pytest.raises(ValueError, match="sequence_ids"):  # a sequence ratio needs to know the sequences
        policy_gradient_loss(PolicyLossConfig(ratio_level="sequence"), **inputs())
    with pytest.raises(ValueError, match="sample_weighting"):
        GRPOConfig(sample_weighting="per-segment")


def test_grpo_is_an_algorithm_with_group_relative_advantages():
    grpo = GRPO()
    assert isinstance(grpo, Algorithm)
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.3, 0.3, 2.0])
    groups = ["a", "a", "a", "a", "b", "b", "c"]
    std = math.sqrt(4 * 0.25 / 3)  # sample std of [1, 0, 0, 1]
    expected = [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std, 0.0, 0.0, 0.0]
    assert grpo.advantages(rewards, groups).tolist() == pytest.approx(expected, abs=1e-5)
    dr_grpo = GRPO(DrGRPOConfig())
    assert dr_grpo.advantages(rewards, groups).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0])
    with pytest.raises(ValueError, match="group_ids"):
        grpo.advantages(rewards, groups[:3])


def test_sample_weights_do_not_grow_with_the_number_of_segments():
    num_sampled = np.array([2, 6, 4])  # trajectory 0 split into two segments, trajectory 1 in one
    trajectory_index = np.array([0, 0, 1])
    weights = GRPO().sample_weights(num_sampled, trajectory_index)
    assert weights.tolist() == pytest.approx([1 / 16, 1 / 16, 1 / 8])
    per_trajectory = np.bincount(trajectory_index, weights=weights * num_sampled)
    assert per_trajectory.tolist() == pytest.approx([0.5, 0.5])  # each trajectory counts once
    assert GRPO(GRPOConfig(sample_weighting="token")).sample_weights(
        num_sampled, trajectory_index
    ).tolist() == (pytest.approx([1 / 12] * 3))
    constant = GRPO(DrGRPOConfig(constant_normalizer_tokens=10))
    assert constant.sample_weights(num_sampled, trajectory_index).tolist() == pytest.approx([0.05] * 3)
