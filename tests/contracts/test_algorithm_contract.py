"""The ``Algorithm`` contract (``components.protocols.Algorithm``), checked on any algorithm brick:

- ``advantages``: one finite float per trajectory;
- ``sample_weights``: one non-negative weight per segment, and a trajectory's total weight does not change when
  its tokens are split into more segments;
- ``loss``: a scalar plus float statistics with ``num_tokens`` = the masked tokens; masked-out tokens change
  nothing and get no gradient; losses of micro-batches split at sequence boundaries add up to the whole's.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from components.protocols import Algorithm
from components.registry import ALGORITHMS
from tests.contracts.conftest import brick_params


def pytest_generate_tests(metafunc):
    if "make_algorithm" in metafunc.fixturenames:
        metafunc.parametrize(
            "make_algorithm",
            brick_params(
                metafunc.config, {name: functools.partial(ALGORITHMS.build, name) for name in ALGORITHMS}
            ),
        )


@pytest.fixture
def algorithm(make_algorithm) -> Algorithm:
    brick = make_algorithm()
    assert isinstance(brick, Algorithm), f"{brick!r} does not implement components.protocols.Algorithm"
    assert isinstance(brick.needs_reference_logprobs, bool)
    return brick


def test_one_finite_advantage_per_trajectory(algorithm):
    rewards = np.array([1.0, 0.0, 0.5, 0.5, 0.2, 0.9, 0.0])
    groups = ["a", "a", "b", "b", "c", "c", "c"]
    advantages = np.asarray(algorithm.advantages(rewards, groups), dtype=np.float64)
    assert advantages.shape == (len(rewards),) and np.isfinite(advantages).all()
    # Within a group, a better reward never gets a smaller advantage.
    for group in set(groups):
        members = [i for i, g in enumerate(groups) if g == group]
        order = sorted(members, key=lambda i: rewards[i])
        assert all(advantages[a] <= advantages[b] + 1e-12 for a, b in zip(order, order[1:], strict=False))


def test_a_trajectory_weighs_the_same_however_it_is_split(algorithm):
    whole = np.asarray(algorithm.sample_weights(np.array([6, 4]), np.array([0, 1])), dtype=np.float64)
    split = np.asarray(algorithm.sample_weights(np.array([2, 4, 4]), np.array([0, 0, 1])), dtype=np.float64)
    assert whole.shape == (2,) and split.shape == (3,)
    assert (whole >= 0).all() and (split >= 0).all()
    np.testing.assert_allclose(6 * whole[0], 2 * split[0] + 4 * split[1], rtol=1e-9)
    np.testing.assert_allclose(4 * whole[1], 4 * split[2], rtol=1e-9)


def _inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    n = 12
    logprobs = -torch.rand(n, generator=generator, dtype=torch.float64) * 3
    old = logprobs.detach() - 0.05 * torch.randn(n, generator=generator, dtype=torch.float64)
    return {
        "logprobs": logprobs,
        "old_logprobs": old,
        "ref_logprobs": old - 0.1,
        "advantages": torch.tensor([1.0] * 5 + [-0.5] * 4 + [0.25] * 3, dtype=torch.float64),
        "loss_mask": torch.tensor([0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1], dtype=torch.float64),
        "weights": torch.full((n,), 0.1, dtype=torch.float64),
        "sequence_ids": torch.tensor([0] * 5 + [1] * 4 + [2] * 3),
    }


def _loss(algorithm, inputs):
    logprobs = inputs["logprobs"].clone().requires_grad_(True)
    loss, stats = algorithm.loss(**{**inputs, "logprobs": logprobs})
    loss.backward()
    return loss, stats, logprobs.grad


def test_loss_is_a_scalar_with_float_statistics(algorithm):
    loss, stats, grad = _loss(algorithm, _inputs())
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(isinstance(value, float) for value in stats.values())
    assert stats["num_tokens"] == 9.0
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_masked_tokens_change_nothing(algorithm):
    inputs = _inputs()
    loss, _, grad = _loss(algorithm, inputs)
    masked = inputs["loss_mask"] == 0
    changed = {**inputs}
    changed["logprobs"] = torch.where(masked, inputs["logprobs"] - 5.0, inputs["logprobs"])
    changed["advantages"] = torch.where(
        masked, torch.full_like(inputs["advantages"], 9.0), inputs["advantages"]
    )
    changed_loss, _, changed_grad = _loss(algorithm, changed)
    torch.testing.assert_close(changed_loss, loss)
    assert (grad[masked] == 0).all() and (changed_grad[masked] == 0).all()


def test_micro_batch_losses_add_up(algorithm):
    inputs = _inputs(seed=1)
    loss, stats, _ = _loss(algorithm, inputs)
    first, second = slice(0, 5), slice(5, 12)  # a boundary between sequences 0 and 1
    parts = []
    for part, offset in ((first, 0), (second, 1)):
        piece = {key: value[part] for key, value in inputs.items()}
        piece["sequence_ids"] = piece["sequence_ids"] - offset
        parts.append(_loss(algorithm, piece))
    torch.testing.assert_close(parts[0][0] + parts[1][0], loss)
    assert parts[0][1]["num_tokens"] + parts[1][1]["num_tokens"] == stats["num_tokens"]


class _IgnoresTheMask:
    """A deliberately broken brick: it trains on prompt tokens too (loss_mask ignored)."""

    needs_reference_logprobs = False

    def __init__(self) -> None:
        from examples.bricks.reinforce import Reinforce

        self._inner = Reinforce()
        self.advantages, self.sample_weights = self._inner.advantages, self._inner.sample_weights

    def loss(self, **inputs):
        return self._inner.loss(**{**inputs, "loss_mask": torch.ones_like(inputs["loss_mask"])})


def test_the_contract_catches_a_brick_that_trains_on_masked_tokens():
    with pytest.raises(AssertionError):
        test_masked_tokens_change_nothing(_IgnoresTheMask())
