"""Dr.GRPO ("GRPO done right", Liu et al. 2025): GRPO without the two biases it adds — advantages are
reward − group mean (no division by the group std), and token losses are summed per trajectory and divided by
a constant instead of the trajectory's length, so long wrong answers are not penalised less per token."""

from __future__ import annotations

from components.training.algorithms.grpo import GRPO, GRPOConfig
from components.training.losses import PolicyLossConfig


class DrGRPO(GRPO):
    """Dr.GRPO: ``GRPO`` with ``GRPOConfig.dr_grpo()`` (implements ``components.protocols.Algorithm``)."""

    def __init__(
        self,
        config: GRPOConfig | None = None,
        *,
        constant_normalizer_tokens: int = 1024,
        loss: PolicyLossConfig | None = None,
    ) -> None:
        super().__init__(
            config or GRPOConfig.dr_grpo(constant_normalizer_tokens=constant_normalizer_tokens, loss=loss)
        )
