"""The single-process train step: PPO-style multiple updates per step clip against the pre-step (proximal)
policy, the step is deterministic on CPU, and a step without update (the trainer's warm-up) moves nothing."""

from __future__ import annotations

import pytest
import torch

from components.training.data import SampleBatchConfig, build_micro_batches_locally, micro_batches_from_table
from components.training.grpo import GRPO
from components.training.step import OptimizerConfig, build_optimizer, run_train_step
from tests.components.training.training_synthetic import random_batch


def step_metrics(
    model_dir, *, num_updates: int, learning_rate: float, update: bool = True
) -> tuple[dict, dict]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = OptimizerConfig(learning_rate=learning_rate)
    batches = build_micro_batches_locally(
        random_batch(num_groups=2, group_size=4, seed=3),
        GRPO(),
        SampleBatchConfig(max_tokens_per_micro_batch=24),
        current_version=0,
    )
    micro_batches = micro_batches_from_table(batches.micro_batches)
    assert len(micro_batches) >= 4
    metrics = run_train_step(
        model,
        build_optimizer(model, config),
        micro_batches,
        GRPO(),
        optimizer_config=config,
        num_updates=num_updates,
        apply_update=update,
    )
    return metrics, model.state_dict()


def test_multiple_updates_per_step_clip_against_the_proximal_policy(tiny_model_dir):
    torch.set_num_threads(1)
    single, _ = step_metrics(tiny_model_dir, num_updates=1, learning_rate=5e-2)
    assert single["pg_clip_fraction"] == 0  # one update: the ratio to the proximal policy is exactly 1
    multi, _ = step_metrics(tiny_model_dir, num_updates=4, learning_rate=5e-2)
    assert multi["pg_clip_fraction"] > 0  # later mini-batches see a moved policy and get clipped
    # diagnostics use the pre-update policy, so they match the single-update step's
    assert multi["logprob_abs_diff_mean"] == single["logprob_abs_diff_mean"]


def test_the_step_is_deterministic_on_cpu(tiny_model_dir):
    torch.set_num_threads(1)
    first_metrics, first = step_metrics(tiny_model_dir, num_updates=2, learning_rate=1e-3)
    second_metrics, second = step_metrics(tiny_model_dir, num_updates=2, learning_rate=1e-3)
    assert first_metrics["loss"] == second_metrics["loss"]
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name


def test_a_step_without_update_computes_the_step_and_leaves_the_weights(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    dry_metrics, dry = step_metrics(tiny_model_dir, num_updates=1, learning_rate=5e-2, update=False)
    metrics, updated = step_metrics(tiny_model_dir, num_updates=1, learning_rate=5e-2)
    assert dry_metrics["loss"] == metrics["loss"] and dry_metrics["grad_norm"] == metrics["grad_norm"] > 0
    assert all(torch.equal(tensor, initial[name]) for name, tensor in dry.items())
    assert not all(
        torch.equal(tensor, initial[name]) for name, tensor in updated.items()
    )  # an update moves them


def test_kl_to_the_reference_policy_grows_once_the_policy_moves(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from components.training.grpo import GRPOConfig
    from components.training.losses import PolicyLossConfig

    torch.set_num_threads(1)
    algorithm = GRPO(GRPOConfig(loss=PolicyLossConfig(kl_coef=0.1)))
    assert algorithm.needs_reference_logprobs
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).requires_grad_(
        False
    )
    config = OptimizerConfig(learning_rate=1e-2)
    optimizer = build_optimizer(model, config)
    local = build_micro_batches_locally(
        random_batch(seed=5), algorithm, SampleBatchConfig(), current_version=0
    )
    batches = micro_batches_from_table(local.micro_batches)
    first = run_train_step(
        model, optimizer, batches, algorithm, optimizer_config=config, reference_model=reference
    )
    second = run_train_step(
        model, optimizer, batches, algorithm, optimizer_config=config, reference_model=reference
    )
    assert first["kl"] == 0 and second["kl"] > 0


def test_an_entropy_bonus_lowers_the_loss_and_changes_the_update(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    results = []
    for coef in (0.0, 0.5):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        config = OptimizerConfig(learning_rate=1e-2)
        batches = build_micro_batches_locally(
            random_batch(num_groups=2, group_size=4, seed=3), GRPO(), SampleBatchConfig(), current_version=0
        )
        metrics = run_train_step(
            model,
            build_optimizer(model, config),
            micro_batches_from_table(batches.micro_batches),
            GRPO(),
            optimizer_config=config,
            entropy_coef=coef,
        )
        results.append((metrics, model.state_dict()))
    (plain, plain_weights), (bonus, bonus_weights) = results
    # GRPO's weights sum to 1 over the step's sampled tokens, so the bonus is at most -coef * max entropy
    assert plain["entropy"] == pytest.approx(bonus["entropy"])  # measured before the update
    assert bonus["loss"] < plain["loss"]
    assert not all(torch.equal(tensor, bonus_weights[name]) for name, tensor in plain_weights.items())
