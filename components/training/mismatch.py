"""Corrections for the mismatch between the policy that sampled the tokens (the engine: ``old_logprobs``) and the
trainer's proximal policy (``proximal_logprobs``): one importance weight per token, from the per-token log ratio
log ρ_t = log π_trainer(y_t) − log π_rollout(y_t). The choice is ``PolicyLossConfig.importance_sampling``:

- ``token``: truncated IS, w_t = min(ρ_t, cap) (slime's / verl's TIS);
- ``sequence``: truncated sequence IS, w = min(Π_t ρ_t, cap) for every token of the sequence;
- ``geometric``: sequence IS with the length-normalised (geometric-mean) ratio, w = min(exp(mean_t log ρ_t), cap);
- ``token_mask``: masked IS (MIS), w_t = ρ_t where floor ≤ ρ_t ≤ cap, else 0 (the token is dropped);
- ``sequence_mask``: masked sequence IS, w = Π_t ρ_t where floor ≤ Π_t ρ_t ≤ cap, else 0 (the whole sequence);
- ``icepop``: IcePop (Ring-1T): w_t = ρ_t inside [icepop_low, icepop_high], else 0 (a two-sided token mask
  with the paper's band);
- ``none``: w = 1.

Each reports how many tokens it truncated or masked, so the step's fractions reach monitoring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from components.training.losses import PolicyLossConfig


@dataclass(frozen=True)
class Correction:
    """Per-token importance weights (0 where masked) and the counts of truncated / masked sampled tokens."""

    weights: torch.Tensor
    num_truncated: float = 0.0
    num_masked: float = 0.0


def per_sequence_sum(values: torch.Tensor, sequence_ids: torch.Tensor) -> torch.Tensor:
    """The sum of ``values`` over each sequence's tokens, broadcast back to its tokens."""
    sequence_ids = sequence_ids.long()
    num_sequences = int(sequence_ids.max().item()) + 1 if sequence_ids.numel() else 0
    sums = torch.zeros(num_sequences, dtype=values.dtype, device=values.device)
    return sums.index_add(0, sequence_ids, values)[sequence_ids]


def _sequence_log_ratio(
    log_ratio: torch.Tensor, mask: torch.Tensor, sequence_ids: torch.Tensor | None, *, mean: bool
):
    if sequence_ids is None:
        raise ValueError("importance_sampling: a sequence-level correction needs sequence_ids for the tokens")
    summed = per_sequence_sum(log_ratio * mask, sequence_ids)
    return summed / per_sequence_sum(mask, sequence_ids).clamp(min=1.0) if mean else summed


def _truncated(log_ratio: torch.Tensor, mask: torch.Tensor, cap: float) -> Correction:
    log_cap = math.log(cap)
    return Correction(
        weights=torch.exp(torch.clamp(log_ratio, max=log_cap)),
        num_truncated=float(((log_ratio > log_cap).to(mask.dtype) * mask).sum()),
    )


def _masked(log_ratio: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> Correction:
    log_low = math.log(low) if low > 0 else -math.inf
    inside = (log_ratio >= log_low) & (log_ratio <= math.log(high))
    return Correction(
        weights=torch.where(inside, torch.exp(torch.clamp(log_ratio, max=math.log(high))), 0.0),
        num_masked=float(((~inside).to(mask.dtype) * mask).sum()),
    )


def no_correction(log_ratio, mask, sequence_ids, config: PolicyLossConfig) -> Correction:
    """w = 1."""
    return Correction(weights=torch.ones_like(log_ratio))


def token_truncated(log_ratio, mask, sequence_ids, config: PolicyLossConfig) -> Correction:
    """w_t = min(ρ_t, cap)."""
    return _truncated(log_ratio, mask, config.importance_sampling_cap)


def sequence_truncated(log_ratio, mask, sequence_ids, config: PolicyLossConfig) -> Correction:
    """w = min(Π_t ρ_t, cap) per sequence."""
    return _truncated(
        _sequence_log_ratio(log_ratio, mask, sequence_ids, mean=False), mask, config.importance_sampling_cap
    )


def geometric_truncated(log_ratio, mask, sequence_ids, config: PolicyLossConfig) -> Correction:
    """w = min(exp(mean_t log ρ_t), cap) per sequence."""
    return _truncated(
        _sequence_log_ratio(log_ratio, mask, sequence_ids, mean=True), mask, config.importance_sampling_cap
    )


def token_masked(log_ratio, mask, sequence_ids, config: PolicyLossConfig) -> Correction:
    """w_t = ρ_t inside [floor, cap], else 0."""
    return _masked(log_ratio, mask, config.importance_sampling_floor, config.importance_sampling_cap)


def sequence_masked(log_ratio, mask, sequence_ids, config: PolicyLossConfig) -> Correction:
    """w = Π_t ρ_t inside [floor, cap], else 0, per sequence."""
    return _masked(
        _sequence_log_ratio(log_ratio, mask, sequence_ids, mean=False),
        mask,
        config.importance_sampling_floor,
        config.importance_sampling_cap,
    )


def icepop(log_ratio, mask, sequence_ids, config: PolicyLossConfig) -> Correction:
    """w_t = ρ_t inside [icepop_low, icepop_high], else 0."""
    return _masked(log_ratio, mask, config.icepop_low, config.icepop_high)


# What ``importance_sampling: NAME`` applies (the one place a correction's name maps to its function).
CORRECTIONS: dict[str, Callable[..., Correction]] = {
    "token": token_truncated,
    "sequence": sequence_truncated,
    "geometric": geometric_truncated,
    "token_mask": token_masked,
    "sequence_mask": sequence_masked,
    "icepop": icepop,
    "none": no_correction,
}


def mismatch_correction(
    config: PolicyLossConfig,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    sequence_ids: torch.Tensor | None = None,
) -> Correction:
    """The configured correction of ``log_ratio`` = proximal − rollout logprobs (detached) over the masked
    tokens."""
    return CORRECTIONS[config.importance_sampling](log_ratio.detach(), mask, sequence_ids, config)


def rollout_kl(log_ratio: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Sums over masked tokens of two estimates of KL(π_rollout ‖ π_trainer) from tokens the rollout sampled:
    k1 = −log ρ and k3 = ρ − 1 − log ρ (unbiased and ≥ 0), with log ρ = trainer − rollout logprob."""
    log_ratio = log_ratio.detach().double()
    mask = mask.double()
    k1 = -log_ratio
    k3 = torch.expm1(log_ratio) - log_ratio
    return float((k1 * mask).sum()), float((k3 * mask).sum())
