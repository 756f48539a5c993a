"""MoE routing capture for the embedded engine: forward hooks on every router record the experts it chose.

The recorded layout is SGLang's ``meta_info.routed_experts``: per forwarded position, one tuple per MoE layer
(in layer order) of the top-k expert ids, in router order.
"""

from __future__ import annotations

import torch
from torch.utils.hooks import RemovableHandle


class RouterCapture:
    """Hooks on a model's MoE routers (modules named ``gate`` inside a sparse-MoE block); none on a dense model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._routing: list[torch.Tensor] = []
        self._hooks: list[RemovableHandle] = []
        text_config = model.config.get_text_config()
        top_k = getattr(text_config, "num_experts_per_tok", None)
        if not top_k:
            return
        for name, module in model.named_modules():
            is_router = name.endswith(".gate") and (".mlp." in name or ".block_sparse_moe." in name)
            if is_router:
                self._hooks.append(module.register_forward_hook(self._make_hook(int(top_k))))

    @property
    def num_moe_layers(self) -> int:
        return len(self._hooks)

    def _make_hook(self, top_k: int):
        def hook(
            module: torch.nn.Module,
            inputs: tuple[torch.Tensor, ...],
            output: torch.Tensor | tuple[torch.Tensor, ...],
        ) -> None:
            if (
                isinstance(output, tuple)
                and isinstance(output[-1], torch.Tensor)
                and not output[-1].is_floating_point()
            ):
                indices = output[-1]  # (router_logits, scores, indices) routers
            else:
                logits = output[0] if isinstance(output, tuple) else output
                indices = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1).indices
            self._routing.append(indices.reshape(-1, indices.shape[-1]))

        return hook

    def take(self, num_rows: int, length: int) -> torch.Tensor | None:
        """The routing recorded during the last forward as [rows, length, layers, top_k] (None if no MoE)."""
        if not self._routing:
            return None
        stacked = torch.stack([r.reshape(num_rows, length, -1) for r in self._routing], dim=2)
        self._routing.clear()
        return stacked.cpu()

    def clear(self) -> None:
        """Forget what the last forward recorded (a forward whose routing nobody asked for)."""
        self._routing.clear()

    def remove(self) -> None:
        """Remove the hooks (the engine is closing)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
