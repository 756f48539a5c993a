"""The mismatch corrections (``components/training/mismatch.py``), the KL estimators, the entropy bonus and the
loss knobs' validation, against hand-computed values on the four tokens of ``test_policy_loss``:

a (clipped PPO loss -1.28, weight 0.5, rollout ratio 1.5), b (0.8, 0.25, ratio 3), c (-2.2, 1, ratio 1), d (masked
out, ratio 10); sequences [a, b] and [c, d].
"""

from __future__ import annotations

import math

import pytest
import torch

from components.training.losses import PolicyLossConfig, entropy_bonus, kl_estimate, policy_gradient_loss
from components.training.mismatch import CORRECTIONS, mismatch_correction
from components.training.step import OptimizerConfig
from tests.components.training.test_policy_loss import inputs

SEQUENCES = torch.tensor([0, 0, 1, 1])
A, B, C = 0.5 * -1.28, 0.25 * 0.8, -2.2  # each token's weighted PPO loss before the IS weight


def loss_of(**config):
    values = inputs()
    loss, stats = policy_gradient_loss(PolicyLossConfig(**config), **values, sequence_ids=SEQUENCES)
    loss.backward()
    return loss.item(), stats, values["logprobs"].grad.tolist()


def test_masked_token_is_drops_tokens_outside_the_band_and_keeps_the_ratio_inside():
    loss, stats, grad = loss_of(importance_sampling="token_mask", importance_sampling_cap=2.0)
    assert loss == pytest.approx(1.5 * A + 0 * B + 1.0 * C, abs=1e-5)  # b (ratio 3 > 2) dropped
    assert stats["is_masked_fraction_sum"] == 1 and stats["is_truncated_fraction_sum"] == 0
    assert grad == pytest.approx([0.0, 0.0, -2.2, 0.0], abs=1e-5)
    loss, stats, _ = loss_of(importance_sampling="token_mask", importance_sampling_floor=1.2)
    assert loss == pytest.approx(1.5 * A, abs=1e-5)  # c (ratio 1 < 1.2) dropped too
    assert stats["is_masked_fraction_sum"] == 2


def test_masked_sequence_is_drops_whole_sequences_by_their_product_ratio():
    loss, stats, _ = loss_of(importance_sampling="sequence_mask", importance_sampling_cap=5.0)
    # sequence 0: 1.5 * 3 = 4.5 inside; sequence 1: only c counts (d is masked out) -> 1
    assert loss == pytest.approx(4.5 * (A + B) + C, abs=1e-5)
    assert stats["is_masked_fraction_sum"] == 0
    loss, stats, grad = loss_of(importance_sampling="sequence_mask", importance_sampling_cap=4.0)
    assert loss == pytest.approx(C, abs=1e-5)  # 4.5 > 4: a and b dropped together
    assert stats["is_masked_fraction_sum"] == 2
    assert grad == pytest.approx([0.0, 0.0, -2.2, 0.0], abs=1e-5)


def test_geometric_sequence_is_truncates_the_length_normalised_ratio():
    geometric = math.sqrt(1.5 * 3)  # 2.121
    loss, stats, _ = loss_of(importance_sampling="geometric", importance_sampling_cap=2.0)
    assert loss == pytest.approx(2.0 * (A + B) + C, abs=1e-5)
    assert stats["is_truncated_fraction_sum"] == 2 and stats["is_masked_fraction_sum"] == 0
    loss, stats, _ = loss_of(importance_sampling="geometric", importance_sampling_cap=3.0)
    assert loss == pytest.approx(geometric * (A + B) + C, abs=1e-5)
    assert stats["is_truncated_fraction_sum"] == 0
    with pytest.raises(ValueError, match="sequence_ids"):
        policy_gradient_loss(PolicyLossConfig(importance_sampling="geometric"), **inputs())


def test_icepop_keeps_ratios_inside_its_band_and_drops_the_rest():
    loss, stats, _ = loss_of(importance_sampling="icepop")  # band [0.5, 5]: a, b, c inside
    assert loss == pytest.approx(1.5 * A + 3.0 * B + 1.0 * C, abs=1e-5)
    assert stats["is_masked_fraction_sum"] == 0
    loss, stats, grad = loss_of(importance_sampling="icepop", icepop_low=1.2, icepop_high=2.0)
    assert loss == pytest.approx(1.5 * A, abs=1e-5)  # b above, c below the band
    assert stats["is_masked_fraction_sum"] == 2
    assert grad == pytest.approx([0.0, 0.0, 0.0, 0.0], abs=1e-5)  # a is PPO-clipped, b and c masked


def test_every_correction_reports_the_rollout_vs_trainer_kl():
    k1 = -(math.log(1.5) + math.log(3.0))  # c's ratio is 1; d is masked out
    k3 = (1.5 - 1 - math.log(1.5)) + (3.0 - 1 - math.log(3.0))
    for name in CORRECTIONS:
        _, stats, _ = loss_of(importance_sampling=name)
        assert stats["rollout_kl_k1_sum"] == pytest.approx(k1, abs=1e-5), name
        assert stats["rollout_kl_k3_sum"] == pytest.approx(k3, abs=1e-5), name


def test_token_truncation_is_todays_default():
    assert PolicyLossConfig().importance_sampling == "token"
    weights = mismatch_correction(PolicyLossConfig(), torch.log(torch.tensor([1.5, 3.0, 1.0])), torch.ones(3))
    assert weights.weights.tolist() == pytest.approx([1.5, 2.0, 1.0]) and weights.num_truncated == 1


def test_kl_estimators_by_hand():
    logprobs, reference = torch.tensor([-1.0]), torch.tensor([-1.5])  # log(π/π_ref) = 0.5
    assert kl_estimate(logprobs, reference, "k1").item() == pytest.approx(0.5)
    assert kl_estimate(logprobs, reference, "k2").item() == pytest.approx(0.125)
    assert kl_estimate(logprobs, reference, "k3").item() == pytest.approx(math.exp(-0.5) - 1 + 0.5, abs=1e-7)
    values = inputs(advantages=torch.zeros(4))
    loss, stats = policy_gradient_loss(
        PolicyLossConfig(kl_coef=0.2, kl_estimator="k2"),
        **values,
        ref_logprobs=values["logprobs"].detach() - 1.0,
    )
    assert loss.item() == pytest.approx(0.2 * 0.5 * (0.5 + 0.25 + 1.0), abs=1e-6)  # k2 = ½·1² per token
    assert stats["kl_sum"] == pytest.approx(1.5, abs=1e-6)


def test_entropy_bonus_by_hand():
    entropy = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    bonus = entropy_bonus(
        entropy, weights=torch.tensor([0.5, 0.5, 1.0]), loss_mask=torch.tensor([1, 1, 0]), coef=0.1
    )
    assert bonus.item() == pytest.approx(-0.1 * (0.5 * 1 + 0.5 * 2))
    bonus.backward()
    assert entropy.grad.tolist() == pytest.approx([-0.05, -0.05, 0.0])


@pytest.mark.parametrize(
    ("config", "fields", "field"),
    [
        (PolicyLossConfig, {"importance_sampling": "masked"}, "importance_sampling"),
        (PolicyLossConfig, {"importance_sampling_floor": 2.0}, "importance_sampling_floor"),
        (PolicyLossConfig, {"icepop_low": 0.0}, "icepop_low"),
        (PolicyLossConfig, {"icepop_high": 0.4}, "icepop_high"),
        (PolicyLossConfig, {"kl_estimator": "k4"}, "kl_estimator"),
        (PolicyLossConfig, {"clip_high": -0.1}, "clip_high"),
        (OptimizerConfig, {"weight_decay": -1.0}, "weight_decay"),
        (OptimizerConfig, {"max_grad_norm": -1.0}, "max_grad_norm"),
        (OptimizerConfig, {"beta2": 1.0}, "beta2"),
    ],
)
def test_loss_and_optimizer_knobs_are_validated_by_name(config, fields, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        config(**fields)
