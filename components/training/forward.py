"""The trainer's forward pass over a packed micro-batch: logprobs (and entropy) of exactly the sampled tokens.

Logits are computed only at the positions that predict a sampled token (``logits_to_keep``), which avoids a
[tokens × vocab] tensor for the (usually much longer) prompt and tool-output parts of a segment.

Each sampled token's logprob is taken under the distribution its segment was sampled from (temperature,
top-k and top-p truncation, ``components.sampling``: the engine's own definition), so segments sampled with
different settings can share a micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from components.sampling import sampling_logprobs
from components.training.data import MicroBatch
from components.training.routing_replay import replay_routes


@dataclass(kw_only=True)
class SampledTokenView:
    """A micro-batch restricted to its sampled tokens, with the model's logprobs for them."""

    logprobs: torch.Tensor  # with gradient when computed with grad enabled
    entropy: torch.Tensor  # detached unless computed with ``entropy_gradient``
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
    device: torch.device | str = "cpu",
    with_entropy: bool = True,
    entropy_gradient: bool = False,
) -> SampledTokenView:
    """Logprobs of the sampled tokens of ``batch`` under each segment's sampling distribution (temperature 1
    and no truncation when the batch carries none); routes replayed when given. The entropy is detached unless
    ``entropy_gradient`` (an entropy bonus in the loss)."""
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
    segments = batch.sequence_ids[targets]
    tokens = input_ids[0, targets.to(device)]

    def per_token(values: torch.Tensor | None, default: float, dtype: torch.dtype) -> torch.Tensor:
        if values is None:
            return torch.full((targets.numel(),), default, dtype=dtype, device=device)
        return values.to(device=device, dtype=dtype)[segments.to(device)]

    log_probs = sampling_logprobs(
        logits[0],
        temperature=per_token(batch.temperature, 1.0, torch.float32),
        top_p=per_token(batch.top_p, 1.0, torch.float32),
        top_k=per_token(batch.top_k, 0, torch.long),
        keep_tokens=tokens,
    )
    token_logprobs = log_probs.gather(-1, tokens[:, None]).squeeze(-1)
    if with_entropy or entropy_gradient:
        with torch.set_grad_enabled(entropy_gradient and torch.is_grad_enabled()):
            entropy = torch.special.entr(log_probs.exp()).sum(-1)
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
