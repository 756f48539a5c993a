"""The embedded engine's sampler: one token per row from a batch of logits, with the logprob it was drawn with.

Vectorised over rows: one log-softmax, one (batched) top-p truncation, and inverse-CDF sampling with one uniform
number per row drawn from that request's own generator (so a seed reproduces a completion whatever else is in
the batch). The logprob of a sampled token is taken under the distribution it was sampled from, i.e. after
temperature scaling and top-p truncation (renormalised over the kept tokens); for greedy decoding
(``temperature == 0``) it is the log-probability under the unscaled model distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from components.protocols import SamplingParams
from components.sampling import sampling_logprobs


def sample_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Sample one token per row of ``logits`` ([rows, vocab]); returns the tokens and their logprobs."""
    device = logits.device
    # the one definition the trainer recomputes logprobs with (temperature, top-k, top-p)
    logprobs = sampling_logprobs(
        logits,
        temperature=torch.tensor([p.temperature for p in params], device=device),
        top_p=torch.tensor([p.top_p for p in params], device=device),
        top_k=torch.tensor([p.top_k for p in params], device=device),
    )
    uniforms = torch.stack([torch.rand((), generator=generator, device=device) for generator in generators])
    cumulative = logprobs.double().exp().cumsum(dim=-1)
    targets = (uniforms.double() * cumulative[:, -1])[:, None]
    sampled = torch.searchsorted(cumulative, targets, right=True)[:, 0].clamp_(max=logprobs.shape[-1] - 1)
    greedy = torch.tensor([p.temperature == 0 for p in params], device=device)
    tokens = torch.where(greedy, logprobs.argmax(dim=-1), sampled)
    chosen = logprobs.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), chosen.tolist()


def top_p_logprobs(logprobs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row, keep the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise over it
    (-inf elsewhere). ``logprobs`` is [rows, vocab], ``top_p`` is [rows]."""
    sorted_logprobs, order = torch.sort(logprobs, dim=-1, descending=True)
    sorted_probs = sorted_logprobs.exp()
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p[:, None]  # the tokens before this one already reach top_p
    drop_sorted[:, 0] = False
    kept = sorted_logprobs.masked_fill(drop_sorted, float("-inf"))
    kept = kept - torch.logsumexp(kept, dim=-1, keepdim=True)
    return torch.empty_like(logprobs).scatter_(1, order, kept)
