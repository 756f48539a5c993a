"""One optimizer step over a list of micro-batches: the math shared by the Ray Train workers (FSDP2) and a plain
single-process model (tests, benchmark baseline).

Micro-batch losses are sums whose weights already carry the step's normalisation, so the step's gradient is
the sum of micro-batch gradients whatever the split into micro-batches or ranks; under FSDP2 (which averages
gradients across ranks) each rank's loss is scaled by the world size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from components.config import option, require, require_non_negative, require_positive
from components.protocols import Algorithm
from components.training.data import MicroBatch
from components.training.forward import forward_sampled_tokens
from components.training.losses import entropy_bonus


@dataclass(kw_only=True, frozen=True)
class OptimizerConfig:
    """AdamW with gradient clipping."""

    learning_rate: float = option(1e-5, "AdamW learning rate", flag="learning-rate")
    weight_decay: float = option(0.0, "AdamW decoupled weight decay", flag="trainer-weight-decay")
    beta1: float = option(0.9, "AdamW first-moment decay")
    beta2: float = option(0.999, "AdamW second-moment decay")
    epsilon: float = option(1e-8, "AdamW denominator epsilon")
    max_grad_norm: float = option(
        1.0, "clip the global gradient norm to this (0: no clipping)", flag="trainer-max-grad-norm"
    )

    def __post_init__(self) -> None:
        require_positive(self.learning_rate, "learning_rate")
        require_non_negative(self.weight_decay, "weight_decay")
        require_positive(self.epsilon, "epsilon")
        require(0 <= self.beta1 < 1, "beta1", f"must be in [0, 1), got {self.beta1!r}")
        require(0 <= self.beta2 < 1, "beta2", f"must be in [0, 1), got {self.beta2!r}")
        require_non_negative(self.max_grad_norm, "max_grad_norm")


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the model's trainable parameters."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.learning_rate,
        betas=(config.beta1, config.beta2),
        eps=config.epsilon,
        weight_decay=config.weight_decay,
        foreach=False,
    )


_SUM_KEYS = (
    "loss",
    "num_tokens",
    "num_sampled_tokens",
    "entropy_sum",
    "train_logprob_sum",
    "rollout_logprob_sum",
    "train_logprob_sq_sum",
    "rollout_logprob_sq_sum",
    "train_rollout_logprob_product_sum",
    "logprob_abs_diff_sum",
    "is_ratio_sum",
    "is_ratio_sq_sum",
)


def _reduce(totals: dict[str, float], maxima: dict[str, float], minima: dict[str, float]) -> None:
    """All-reduce step statistics across ranks (in place)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for values, op in ((totals, dist.ReduceOp.SUM), (maxima, dist.ReduceOp.MAX), (minima, dist.ReduceOp.MIN)):
        keys = sorted(values)
        tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(tensor, op=op)
        values.update(zip(keys, tensor.tolist(), strict=True))


def _global_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    parameters = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def _record_diagnostics(
    totals: dict[str, float],
    maxima: dict[str, float],
    minima: dict[str, float],
    *,
    batch: MicroBatch,
    mask: torch.Tensor,
    train_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    entropy: torch.Tensor,
) -> None:
    """Add one micro-batch's train-vs-rollout statistics (pre-update train logprobs) to the step sums."""
    train = train_logprobs.detach().double() * mask
    rollout = rollout_logprobs.double() * mask
    ratio = torch.exp(train - rollout) * mask
    totals["num_tokens"] += batch.num_tokens
    totals["num_sampled_tokens"] += float(mask.sum())
    totals["entropy_sum"] += float((entropy * mask).sum())
    totals["train_logprob_sum"] += float(train.sum())
    totals["rollout_logprob_sum"] += float(rollout.sum())
    totals["train_logprob_sq_sum"] += float((train * train).sum())
    totals["rollout_logprob_sq_sum"] += float((rollout * rollout).sum())
    totals["train_rollout_logprob_product_sum"] += float((train * rollout).sum())
    totals["logprob_abs_diff_sum"] += float((train - rollout).abs().sum())
    totals["is_ratio_sum"] += float(ratio.sum())
    totals["is_ratio_sq_sum"] += float((ratio * ratio).sum())
    if mask.sum() > 0:
        maxima["is_ratio_max"] = max(maxima["is_ratio_max"], float(ratio[mask > 0].max()))
        maxima["logprob_abs_diff_max"] = max(
            maxima["logprob_abs_diff_max"], float((train - rollout).abs()[mask > 0].max())
        )
        minima["is_ratio_min"] = min(minima["is_ratio_min"], float(ratio[mask > 0].min()))


def run_train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[MicroBatch],
    algorithm: Algorithm,
    *,
    optimizer_config: OptimizerConfig,
    device: torch.device | str = "cpu",
    loss_scale: float = 1.0,
    reference_model: torch.nn.Module | None = None,
    num_updates: int = 1,
    apply_update: bool = True,
    entropy_coef: float = 0.0,
) -> dict[str, float]:
    """Forward/backward every micro-batch, clip, step; return step metrics (reduced over ranks).

    ``apply_update=False`` runs all of it but the optimizer's update (the gradients are dropped): a warm-up whose
    first-call costs (autograd, FSDP's lazy init, the collectives) the first real step would otherwise pay.

    ``num_updates > 1`` (PPO-style): the micro-batches are split into that many contiguous mini-batches, each
    one optimizer update; the policy before the first update is the proximal policy of the clipped ratio
    (its logprobs come from one extra no-grad pass), so later updates are clipped against it. Each
    mini-batch's loss is scaled by ``num_updates`` so an update sees about a full step's loss scale. Every
    rank must pass the same number of micro-batches.

    ``entropy_coef > 0`` adds the entropy bonus ``entropy_bonus`` (the same weights as the algorithm's loss) to
    every algorithm's loss; the entropy then carries a gradient.
    """
    started = time.perf_counter()
    model.train()
    totals = dict.fromkeys(_SUM_KEYS, 0.0)
    maxima = {"is_ratio_max": -math.inf, "logprob_abs_diff_max": 0.0}
    minima = {"is_ratio_min": math.inf}
    proximal: list[torch.Tensor | None] = [None] * len(micro_batches)
    if num_updates > 1:
        with torch.no_grad():
            proximal = [
                forward_sampled_tokens(model, b, device=device, with_entropy=False).logprobs
                for b in micro_batches
            ]
    per_update = -(-len(micro_batches) // num_updates) if micro_batches else 0
    grad_norms = []
    for update in range(num_updates):
        indices = range(update * per_update, min((update + 1) * per_update, len(micro_batches)))
        if not indices:
            continue
        optimizer.zero_grad(set_to_none=True)
        for index in indices:
            batch = micro_batches[index]
            if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: one reduce-scatter per update
                model.set_requires_gradient_sync(index == indices[-1])
            view = forward_sampled_tokens(model, batch, device=device, entropy_gradient=entropy_coef > 0)
            ref_logprobs = None
            if algorithm.needs_reference_logprobs:
                if reference_model is None:
                    raise ValueError("algorithm needs reference logprobs but no reference model was built")
                with torch.no_grad():
                    ref_logprobs = forward_sampled_tokens(
                        reference_model, batch, device=device, with_entropy=False
                    ).logprobs
            loss, stats = algorithm.loss(
                logprobs=view.logprobs,
                old_logprobs=view.old_logprobs,
                advantages=view.advantages,
                loss_mask=view.loss_mask,
                weights=view.weights,
                ref_logprobs=ref_logprobs,
                proximal_logprobs=proximal[index],
                sequence_ids=view.sequence_ids,
            )
            if entropy_coef > 0:
                loss = loss + entropy_bonus(
                    view.entropy, weights=view.weights, loss_mask=view.loss_mask, coef=entropy_coef
                )
            (loss * (loss_scale * num_updates)).backward()
            totals["loss"] += float(loss.detach())
            for key, value in stats.items():
                if key != "num_tokens":
                    totals[key] = totals.get(key, 0.0) + float(value)
            with torch.no_grad():
                _record_diagnostics(
                    totals,
                    maxima,
                    minima,
                    batch=batch,
                    mask=view.loss_mask,
                    train_logprobs=view.logprobs if proximal[index] is None else proximal[index],
                    rollout_logprobs=view.old_logprobs,
                    entropy=view.entropy.detach(),
                )
        grad_norms.append(_global_grad_norm(model, optimizer_config.max_grad_norm))
        if apply_update:
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _reduce(totals, maxima, minima)
    elapsed_s = time.perf_counter() - started
    grad_norm = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
    return summarize_step(totals, maxima, minima, grad_norm=grad_norm, elapsed_s=elapsed_s)


def summarize_step(
    totals: dict[str, float],
    maxima: dict[str, float],
    minima: dict[str, float],
    *,
    grad_norm: float,
    elapsed_s: float,
) -> dict[str, float]:
    """Sums over tokens → the reported step metrics."""
    n = max(totals["num_sampled_tokens"], 1.0)
    metrics = {
        "loss": totals["loss"],
        "grad_norm": grad_norm,
        "num_tokens": totals["num_tokens"],
        "num_sampled_tokens": totals["num_sampled_tokens"],
        "tokens_per_s": totals["num_tokens"] / max(elapsed_s, 1e-9),
        "train_step_s": elapsed_s,
        "entropy": totals["entropy_sum"] / n,
        "logprob_abs_diff_mean": totals["logprob_abs_diff_sum"] / n,
        # the worst token: a mean hides a segment recomputed under the wrong distribution
        "logprob_abs_diff_max": maxima.get("logprob_abs_diff_max", 0.0),
        "is_ratio_mean": totals["is_ratio_sum"] / n,
        "is_ratio_max": maxima["is_ratio_max"] if math.isfinite(maxima["is_ratio_max"]) else 1.0,
        "is_ratio_min": minima["is_ratio_min"] if math.isfinite(minima["is_ratio_min"]) else 1.0,
        # normalised effective sample size of the raw train/rollout ratios: (Σr)² / (n Σr²), 1 = on-policy
        "is_ess": totals["is_ratio_sum"] ** 2 / (n * totals["is_ratio_sq_sum"])
        if totals["is_ratio_sq_sum"]
        else 1.0,
    }
    mean_x = totals["train_logprob_sum"] / n
    mean_y = totals["rollout_logprob_sum"] / n
    var_x = totals["train_logprob_sq_sum"] / n - mean_x**2
    var_y = totals["rollout_logprob_sq_sum"] / n - mean_y**2
    covariance = totals["train_rollout_logprob_product_sum"] / n - mean_x * mean_y
    metrics["logprob_pearson"] = covariance / math.sqrt(var_x * var_y) if var_x > 0 and var_y > 0 else 1.0
    for key, value in totals.items():
        if key.endswith("_sum") and key not in _SUM_KEYS:
            metrics[key.removesuffix("_sum")] = value / n
    return metrics
