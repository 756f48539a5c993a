"""The sampling distribution, one definition shared by the engine's sampler and the trainer.

A token is sampled from ``softmax(logits / temperature)`` truncated to the tokens that are both among the
``top_k`` most likely (``top_k == 0``: no bound) and in the ``top_p`` nucleus (the smallest set of most likely
tokens whose mass reaches ``top_p``, measured on the untruncated distribution), renormalised over the kept
tokens. ``temperature == 0`` is greedy decoding: the recorded logprob is the one under the unscaled,
untruncated distribution.

The engine records each sampled token's logprob under this distribution, and the proxy records the
distribution of every segment (``Segment.sampling``); the trainer recomputes logprobs with
``sampling_logprobs`` under exactly the recorded distribution, so importance ratios compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.config import option, require, require_non_negative

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class SamplingDistribution:
    """Temperature, top-p and top-k of a sampling distribution (defaults: the model's own distribution)."""

    temperature: float = option(1.0, "sampling temperature (0: greedy)", flag="temperature")
    top_p: float = option(1.0, "nucleus mass, in (0, 1]; 1: no nucleus truncation", flag="top-p")
    top_k: int = option(0, "keep only the k most likely tokens; 0: no top-k truncation", flag="top-k")

    def __post_init__(self) -> None:
        require_non_negative(self.temperature, "temperature")
        require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        require(
            isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0,
            "top_k",
            f"must be an int >= 0 (0: no top-k truncation), got {self.top_k!r}",
        )

    @property
    def truncates(self) -> bool:
        """Whether the distribution drops tokens (greedy never truncates the recorded distribution)."""
        return self.temperature > 0 and (self.top_p < 1.0 or self.top_k > 0)


def sampling_logprobs(
    logits: torch.Tensor,
    *,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    keep_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per row of ``logits`` ([rows, vocab]), the log-probabilities of the sampling distribution of that row's
    ``temperature`` / ``top_p`` / ``top_k`` ([rows] each); dropped tokens get ``-inf``.

    Differentiable in ``logits`` (the kept set itself is chosen without gradient). ``keep_tokens`` ([rows]
    token ids) are kept whatever the truncation says: the trainer passes the sampled tokens, so that numeric
    drift at the nucleus boundary never gives a sampled token probability 0."""
    import torch

    logits = logits.float()
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(logits)
    logprobs = torch.log_softmax(logits / scale[:, None], dim=-1)
    truncated = (temperature > 0) & ((top_p < 1.0) | (top_k > 0))
    if not bool(truncated.any()):
        return logprobs
    rows = torch.nonzero(truncated).flatten()
    drop = torch.empty((len(rows), logprobs.shape[-1]), dtype=torch.bool, device=logprobs.device)
    with torch.no_grad():
        # in chunks of rows: the sort's values and int64 indices cost 12 bytes per row × vocab entry
        for start in range(0, len(rows), _TRUNCATION_ROWS_PER_CHUNK):
            chunk = rows[start : start + _TRUNCATION_ROWS_PER_CHUNK]
            drop[start : start + len(chunk)] = _dropped_tokens(
                logprobs[chunk].detach(), top_p[chunk], top_k[chunk]
            )
        if keep_tokens is not None:
            drop[torch.arange(len(rows), device=drop.device), keep_tokens[rows].to(drop.device)] = False
    kept = logprobs[rows].masked_fill(drop, float("-inf"))
    kept = kept - torch.logsumexp(kept, dim=-1, keepdim=True)
    return logprobs.index_put((rows,), kept)


_TRUNCATION_ROWS_PER_CHUNK = 512


def _dropped_tokens(logprobs: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Per row of ``logprobs`` ([rows, vocab]), which tokens the top-k / top-p truncation drops."""
    import torch

    sorted_logprobs, order = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    sorted_probs = sorted_logprobs.exp()
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p.to(logprobs)[:, None]  # the tokens before this one already reach top_p
    row_top_k = top_k.to(order.device)[:, None]
    rank = torch.arange(logprobs.shape[-1], device=order.device)[None, :]
    drop_sorted |= (row_top_k > 0) & (rank >= row_top_k)
    drop_sorted[:, 0] = False  # the most likely token is always kept
    return torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)
