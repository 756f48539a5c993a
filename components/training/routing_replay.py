"""MoE routing replay (R3): the trainer's forward pass uses the experts the engine routed each token to at
rollout, instead of re-routing with its own (slightly different) numerics or weights.

For Mixtral-style top-k routers (softmax over expert logits → top-k → renormalise): the router's top-k
expert ids are forced, and the gate weights are recomputed from the *current* router logits over the forced
experts, so the router still receives a gradient. Routes are given per token position as
``[positions, moe_layers, top_k]`` expert ids; ``-1`` marks a position without a recorded route (the last
token of a sequence, which the engine never fed), which is routed normally.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F


def find_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's top-k MoE routers, in layer order."""
    return [
        module
        for module in model.modules()
        if type(module).__name__.endswith("TopKRouter")
        and hasattr(module, "top_k")
        and hasattr(module, "weight")
    ]


def _forced_forward(router: torch.nn.Module, forced: torch.Tensor):
    def forward(self, hidden_states: torch.Tensor):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = F.linear(hidden_states, self.weight)
        router_probs = torch.softmax(router_logits.float(), dim=-1)
        natural = torch.topk(router_probs, self.top_k, dim=-1).indices
        if forced.shape != natural.shape:
            raise ValueError(
                f"routed_experts: {tuple(forced.shape)} routes for {tuple(natural.shape)} positions × top-k"
            )
        indices = torch.where(forced >= 0, forced.to(natural.device), natural)
        top_values = router_probs.gather(-1, indices)
        top_values = top_values / top_values.sum(dim=-1, keepdim=True)
        return router_logits, top_values, indices

    return types.MethodType(forward, router)


@contextmanager
def replay_routes(model: torch.nn.Module, routed_experts: torch.Tensor | None) -> Iterator[None]:
    """Within the block, the model's routers use ``routed_experts`` ([positions, layers, top_k]) when given."""
    if routed_experts is None:
        yield
        return
    routers = find_routers(model)
    if routed_experts.ndim != 3 or routed_experts.shape[1] != len(routers):
        raise ValueError(
            f"routed_experts: expected [positions, {len(routers)} MoE layers, top_k], got {tuple(routed_experts.shape)}"
        )
    for layer, router in enumerate(routers):
        router.forward = _forced_forward(router, routed_experts[:, layer, :].long())
    try:
        yield
    finally:
        for router in routers:
            del router.forward  # back to the class's forward


@contextmanager
def record_routes(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collects each router's chosen expert ids during the block; after it, ``routes_tensor(recorded)``."""
    recorded: list[torch.Tensor] = []
    handles = [
        router.register_forward_hook(
            lambda _module, _inputs, output: recorded.append(output[2].detach().cpu())
        )
        for router in find_routers(model)
    ]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


def routes_tensor(recorded: list[torch.Tensor]) -> torch.Tensor:
    """Recorded per-layer [positions, top_k] ids (one forward) → [positions, layers, top_k]."""
    return torch.stack(recorded, dim=1)


def routes_from_generation(
    routed_experts: tuple[tuple[tuple[int, ...], ...], ...], num_positions: int
) -> torch.Tensor:
    """``GenerationResult.routed_experts`` (positions × layers × top-k, without the last token) → a route
    tensor for ``num_positions`` positions, unrecorded positions marked -1."""
    recorded = torch.as_tensor(routed_experts, dtype=torch.long)
    if recorded.ndim != 3 or recorded.shape[0] > num_positions:
        raise ValueError(
            f"routed_experts: shape {tuple(recorded.shape)} does not fit {num_positions} positions"
        )
    routes = torch.full((num_positions, recorded.shape[1], recorded.shape[2]), -1, dtype=torch.long)
    routes[: recorded.shape[0]] = recorded
    return routes
