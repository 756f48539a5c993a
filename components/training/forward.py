"""The trainer's forward pass over a packed micro-batch: logprobs (and entropy) of exactly the sampled tokens.

Logits are computed only at the positions that predict a sampled token (``logits_to_keep``), which avoids a
[tokens × vocab] tensor for the (usually much longer) prompt and tool-output parts of a segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from components.training.data import MicroBatch
from components.training.routing_replay import replay_routes


@dataclass(kw_only=True)
class SampledTokenView:
    """A micro-batch restricted to its sampled tokens, with the model's logprobs for them."""

    logprobs: torch.Tensor  # with gradient when computed with grad enabled
    entropy: torch.Tensor  # detached
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    sequence_ids: torch.Tensor
    loss_mask: torch.Tensor  # all ones, except a placeholder token for micro-batches with nothing sampled


def sampled_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Indices t ≥ 1 of sampled tokens (token t is predicted by the logits at t - 1)."""
    return torch.nonzero(loss_mask[1:] > 0).flatten() + 1


def forward_sampled_tokens(
    model: torch.nn.Module,
    batch: MicroBatch,
    *,
    temperature: float = 1.0,
    device: torch.device | str = "cpu",
    with_entropy: bool = True,
) -> SampledTokenView:
    """Logprobs (under logits / temperature) of the sampled tokens of ``batch``; routes replayed when given."""
    targets = sampled_positions(batch.loss_mask)
    placeholder = targets.numel() == 0
    if placeholder:  # every rank must still run forward and backward (FSDP collectives)
        targets = torch.zeros(1, dtype=torch.long)
    input_ids = batch.input_ids.to(device)[None]
    position_ids = batch.position_ids.to(device)[None]
    keep = (targets - 1).clamp(min=0).to(device)
    with replay_routes(model, batch.routed_experts):
        logits = model(
            input_ids=input_ids, position_ids=position_ids, logits_to_keep=keep, use_cache=False
        ).logits
    logits = logits[0].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    token_logprobs = log_probs.gather(-1, input_ids[0, targets.to(device)][:, None]).squeeze(-1)
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1)
    else:
        entropy = torch.zeros_like(token_logprobs.detach())
    mask = torch.zeros(1, device=device) if placeholder else torch.ones(targets.numel(), device=device)
    return SampledTokenView(
        logprobs=token_logprobs,
        entropy=entropy,
        old_logprobs=batch.old_logprobs[targets].to(device),
        advantages=batch.advantages[targets].to(device),
        weights=batch.weights[targets].to(device),
        sequence_ids=batch.sequence_ids[targets].to(device),
        loss_mask=mask,
    )
