"""Dr.GRPO ("GRPO done right", Liu et al. 2025): GRPO without the two biases it adds — advantages are
reward − group mean (no division by the group std), and token losses are summed per trajectory and divided by
a constant instead of the trajectory's length, so long wrong answers are not penalised less per token."""

from __future__ import annotations

from dataclasses import dataclass

from components.config import option
from components.registry import ALGORITHMS
from components.training.algorithms.grpo import GRPO, GRPOConfig, SampleWeighting
from components.training.losses import PolicyLossConfig


@ALGORITHMS.register("dr_grpo")
@dataclass(kw_only=True, frozen=True)
class DrGRPOConfig(GRPOConfig):
    """Dr.GRPO: GRPO's fields with Dr.GRPO's defaults (no std division, constant normaliser)."""

    normalize_advantages_by_std: bool = option(
        False, "divide (reward - group mean) by the group's sample std; false: Dr.GRPO"
    )
    sample_weighting: SampleWeighting = option(
        "constant", "loss aggregation: constant (sum over a trajectory / constant_normalizer_tokens, Dr.GRPO)"
    )

    def build(self) -> DrGRPO:
        """The Dr.GRPO brick with this config."""
        return DrGRPO(self)


class DrGRPO(GRPO):
    """Dr.GRPO: ``GRPO`` with ``DrGRPOConfig`` (implements ``components.protocols.Algorithm``)."""

    def __init__(
        self,
        config: GRPOConfig | None = None,
        *,
        constant_normalizer_tokens: int = 1024,
        loss: PolicyLossConfig | None = None,
    ) -> None:
        super().__init__(
            config
            or DrGRPOConfig(
                constant_normalizer_tokens=constant_normalizer_tokens, loss=loss or PolicyLossConfig()
            )
        )
