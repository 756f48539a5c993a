"""Each algorithm against values computed by hand (GRPO, Dr.GRPO, GSPO, RLOO), and ``--algorithm`` names."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from components.protocols import Algorithm
from components.registry import ALGORITHMS
from components.training.algorithms import GRPO, GSPO, RLOO, DrGRPO, GSPOConfig
from components.training.algorithms.gspo import gspo_loss
from components.training.losses import PolicyLossConfig

GROUPS = ["a", "a", "b", "b", "b"]
REWARDS = np.array([1.0, 0.0, 1.0, 0.0, 0.0])


def test_every_named_algorithm_is_an_algorithm():
    assert set(ALGORITHMS) == {"grpo", "dr_grpo", "gspo", "rloo"}
    for name in ALGORITHMS:
        assert isinstance(ALGORITHMS.build(name), Algorithm)
    with pytest.raises(ValueError, match=r"algorithm: must be one of \['dr_grpo', 'grpo', 'gspo', 'rloo'\]"):
        ALGORITHMS.get("ppo")


def test_grpo_advantages_divide_by_the_group_sample_std():
    # group a: mean 0.5, sample std sqrt(0.5) → ±0.5/0.70711; group b: mean 1/3, sample std sqrt(1/3).
    expected = [0.70710, -0.70710, 1.15470, -0.57735, -0.57735]
    np.testing.assert_allclose(GRPO().advantages(REWARDS, GROUPS), expected, atol=1e-4)


def test_dr_grpo_advantages_are_centred_only_and_weights_constant():
    dr_grpo = DrGRPO(constant_normalizer_tokens=10)
    np.testing.assert_allclose(dr_grpo.advantages(REWARDS, GROUPS), [0.5, -0.5, 2 / 3, -1 / 3, -1 / 3])
    # Two trajectories (one split into two segments): every token weighs 1 / (2 trajectories · 10).
    weights = dr_grpo.sample_weights(np.array([3, 5, 2]), np.array([0, 0, 1]))
    np.testing.assert_allclose(weights, [0.05, 0.05, 0.05])


def test_rloo_baseline_is_the_mean_of_the_other_rewards():
    # group a: 1 − 0 = 1, 0 − 1 = −1; group b: 1 − 0 = 1, 0 − (1+0)/2 = −0.5 (twice); a group of one: 0.
    advantages = RLOO().advantages(np.append(REWARDS, 1.0), [*GROUPS, "alone"])
    np.testing.assert_allclose(advantages, [1.0, -1.0, 1.0, -0.5, -0.5, 0.0])


def test_rloo_loss_is_the_token_mean_per_trajectory():
    # One optimizer update: ratio 1, loss = −Σ_t w_t·A_t; weights 1/(2·2) for trajectory 0, 1/(2·1) for 1.
    weights = torch.tensor(RLOO().sample_weights(np.array([2, 1]), np.array([0, 1])), dtype=torch.float64)
    np.testing.assert_allclose(weights.numpy(), [0.25, 0.5])
    logprobs = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    loss, stats = RLOO().loss(
        logprobs=logprobs,
        old_logprobs=logprobs.detach(),
        advantages=torch.tensor([1.0, 1.0, -0.5], dtype=torch.float64),
        loss_mask=torch.ones(3, dtype=torch.float64),
        weights=torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64),
    )
    assert loss.item() == pytest.approx(-(0.25 + 0.25) + 0.25)
    loss.backward()
    np.testing.assert_allclose(logprobs.grad.numpy(), [-0.25, -0.25, 0.25])
    assert stats["num_tokens"] == 3


def _gspo_loss(config: GSPOConfig):
    # Sequence 0: two tokens, mean log ratio (0.1 + 0.1) / 2 = 0.1 → s0 = e^0.1 = 1.10517, inside [0.8, 1.28].
    # Sequence 1: one token, log ratio 0.5 → s1 = e^0.5 = 1.64872 > 1.28: clipped (no gradient, A > 0).
    # The padding token (mask 0) must change nothing. Weights: 1/(2·2) per token of 0, 1/(2·1) for 1.
    logprobs = torch.tensor([-1.0, -2.0, -0.5, -3.0], dtype=torch.float64, requires_grad=True)
    proximal = torch.tensor([-1.1, -2.1, -1.0, -9.0], dtype=torch.float64)
    loss, stats = GSPO(config).loss(
        logprobs=logprobs,
        old_logprobs=proximal,
        proximal_logprobs=proximal,
        advantages=torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64),
        loss_mask=torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64),
        weights=torch.tensor([0.25, 0.25, 0.5, 0.5], dtype=torch.float64),
        sequence_ids=torch.tensor([0, 0, 1, 1]),
    )
    loss.backward()
    return loss.item(), logprobs.grad.numpy(), stats


def test_gspo_ratio_and_clipping_are_per_sequence():
    loss, grad, stats = _gspo_loss(GSPOConfig(loss=gspo_loss(clip_low=0.2, clip_high=0.28)))
    s0 = math.exp(0.1)
    assert loss == pytest.approx(2 * 0.25 * -s0 + 0.5 * -1.28, abs=1e-9)  # −1.192585
    # d/dlogprob_t of −0.25·2·s0 where s0 = exp(mean of the two log ratios): −0.5·s0·(1/2) per token.
    np.testing.assert_allclose(grad, [-0.25 * s0, -0.25 * s0, 0.0, 0.0], atol=1e-9)
    assert stats["pg_clip_fraction_sum"] == 1.0  # the one token of sequence 1
    assert stats["num_tokens"] == 3


def test_gspo_default_clip_range_is_the_papers_narrow_one():
    # With ε = 3e-4 / 4e-4 both sequences are outside the trust region: clipped, no gradient.
    loss, grad, stats = _gspo_loss(GSPOConfig())
    assert loss == pytest.approx(2 * 0.25 * -(1 + 4e-4) + 0.5 * -(1 + 4e-4), abs=1e-9)
    np.testing.assert_allclose(grad, [0.0, 0.0, 0.0, 0.0])
    assert stats["pg_clip_fraction_sum"] == 3.0


def test_gspo_needs_sequence_ids_and_validates_its_config():
    with pytest.raises(ValueError, match="sequence_ids"):
        GSPO().loss(
            logprobs=torch.zeros(2),
            old_logprobs=torch.zeros(2),
            advantages=torch.ones(2),
            loss_mask=torch.ones(2),
            weights=torch.ones(2),
        )
    with pytest.raises(ValueError, match="clip_low"):
        gspo_loss(clip_low=1.5)
    with pytest.raises(ValueError, match="loss.ratio_level"):
        GSPOConfig(loss=PolicyLossConfig())


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_trains_on_packed_micro_batches(name, tiny_model_dir):
    """The real path: Arrow batches → packed micro-batches (several sequences per row) → a train step."""
    from transformers import AutoModelForCausalLM

    from components.training.data import (
        SampleBatchConfig,
        build_micro_batches_locally,
        micro_batches_from_table,
    )
    from components.training.step import OptimizerConfig, build_optimizer, run_train_step
    from tests.components.training.training_synthetic import random_batch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    algorithm = ALGORITHMS.build(name)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    batches = build_micro_batches_locally(
        random_batch(num_groups=2, group_size=4, seed=3),
        algorithm,
        SampleBatchConfig(max_tokens_per_micro_batch=24),
        current_version=0,
    )
    config = OptimizerConfig(learning_rate=1e-2)
    metrics = run_train_step(
        model, build_optimizer(model, config), micro_batches_from_table(batches.micro_batches), algorithm,
        optimizer_config=config,
    )  # fmt: skip
    assert math.isfinite(metrics["loss"]) and metrics["num_tokens"] > 0
    assert any(not torch.equal(before[key], value) for key, value in model.state_dict().items())


@pytest.mark.parametrize("recipe", ["swe_grpo", "claude_code_grpo", "tictactoe_grpo", "temporal_clue_grpo"])
def test_every_recipe_takes_algorithm_gspo(recipe):
    import importlib

    from components.recipe_config import parse_config
    from components.run.config import RunConfig
    from components.run.stack import Bricks

    module = importlib.import_module(f"recipes.{recipe}")
    config_class = next(
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, RunConfig) and value.__module__ == module.__name__
    )
    config = parse_config(config_class, ["--algorithm", "gspo"])
    assert isinstance(Bricks.from_config(config).algorithm, GSPO)


def test_every_loss_knob_reaches_the_algorithm_from_flags_and_errors_name_the_dotted_field(capsys):
    from components.recipe_config import parse_config
    from components.run.config import RunConfig
    from components.run.stack import Bricks

    flags = [
        "--algorithm", "gspo", "--algorithm-loss-clip-low", "0.01", "--algorithm-loss-clip-high", "0.02",
        "--algorithm-loss-importance-sampling", "icepop", "--algorithm-loss-icepop-high", "3",
        "--algorithm-loss-kl-coef", "0.05", "--algorithm-loss-kl-estimator", "k2",
        "--trainer-weight-decay", "0.1", "--trainer-max-grad-norm", "0.5", "--trainer-num-updates-per-step", "2",
        "--trainer-entropy-coef", "0.01",
    ]  # fmt: skip
    config = parse_config(RunConfig, flags)
    algorithm = Bricks.from_config(config).algorithm
    assert isinstance(algorithm, GSPO) and algorithm.needs_reference_logprobs
    loss = algorithm.loss_config
    assert (loss.clip_low, loss.clip_high, loss.importance_sampling, loss.icepop_high) == (
        0.01,
        0.02,
        "icepop",
        3,
    )
    assert (loss.kl_coef, loss.kl_estimator, loss.ratio_level) == (0.05, "k2", "sequence")
    optimizer = config.trainer.optimizer
    assert (optimizer.weight_decay, optimizer.max_grad_norm, optimizer.learning_rate) == (0.1, 0.5, 1e-5)
    assert (config.trainer.num_updates_per_step, config.trainer.entropy_coef) == (2, 0.01)
    # the other algorithms keep their own defaults; Dr.GRPO's aggregation is its own
    dr_grpo = Bricks.from_config(parse_config(RunConfig, ["--algorithm", "dr_grpo"])).algorithm
    assert isinstance(dr_grpo, DrGRPO) and dr_grpo.config.sample_weighting == "constant"
    aggregated = parse_config(RunConfig, ["--algorithm-sample-weighting", "token"])
    assert Bricks.from_config(aggregated).algorithm.config.sample_weighting == "token"
    for bad, field in (
        (["--algorithm-loss-clip-low", "1.5"], "algorithm.loss.clip_low"),
        (["--trainer-max-grad-norm", "-1"], "trainer.optimizer.max_grad_norm"),
        (["--trainer-num-updates-per-step", "0"], "trainer.num_updates_per_step"),
    ):
        with pytest.raises(SystemExit):
            parse_config(RunConfig, bad)
        assert f"{field}:" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # an unknown kind lists the registered ones
        parse_config(RunConfig, ["--algorithm", "ppo"])
    assert "invalid choice: 'ppo' (choose from 'dr_grpo', 'grpo', 'gspo', 'rloo')" in capsys.readouterr().err
