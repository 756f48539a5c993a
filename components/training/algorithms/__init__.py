"""Policy-gradient algorithms, one file each, every one an ``Algorithm`` brick (``components.protocols``).

Add one: a file here with a class implementing ``Algorithm`` (advantages, sample_weights, loss), an entry in
``ALGORITHMS`` if the ``--algorithm`` option should name it, and ``tests/contracts/test_algorithm_contract.py``
run against it (``pytest tests/contracts --brick yourmodule:YourAlgorithm``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from components.protocols import Algorithm
from components.recipe_config import option
from components.training.algorithms.dr_grpo import DrGRPO
from components.training.algorithms.grpo import GRPO, GRPOConfig
from components.training.algorithms.gspo import GSPO, GSPOConfig
from components.training.algorithms.rloo import RLOO, RLOOConfig

# What ``--algorithm NAME`` builds (the one place a name maps to a brick; the stack only sees the object).
ALGORITHMS: dict[str, Callable[[], Algorithm]] = {"grpo": GRPO, "dr_grpo": DrGRPO, "gspo": GSPO, "rloo": RLOO}


@dataclass(kw_only=True, frozen=True)
class AlgorithmOptions:
    """Each built-in algorithm's config, its loss knobs included; ``--algorithm NAME`` uses NAME's."""

    grpo: GRPOConfig = option(GRPOConfig(), "GRPO")
    dr_grpo: GRPOConfig = option(GRPOConfig.dr_grpo(), "Dr.GRPO (no std division, constant normaliser)")
    gspo: GSPOConfig = option(GSPOConfig(), "GSPO (sequence-level ratio and clipping)")
    rloo: RLOOConfig = option(RLOOConfig(), "RLOO (leave-one-out baseline)")


_FROM_OPTIONS: dict[str, Callable[[AlgorithmOptions], Algorithm]] = {
    "grpo": lambda options: GRPO(options.grpo),
    "dr_grpo": lambda options: DrGRPO(options.dr_grpo),
    "gspo": lambda options: GSPO(options.gspo),
    "rloo": lambda options: RLOO(options.rloo),
}


def make_algorithm(name: str, options: AlgorithmOptions | None = None) -> Algorithm:
    """The algorithm ``name`` names, with its config in ``options`` (default: its default config);
    ``ValueError`` naming the field otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: must be one of {sorted(ALGORITHMS)}, got {name!r}")
    return _FROM_OPTIONS[name](options or AlgorithmOptions())


__all__ = [
    "ALGORITHMS",
    "AlgorithmOptions",
    "GRPO",
    "GSPO",
    "RLOO",
    "DrGRPO",
    "GRPOConfig",
    "GSPOConfig",
    "RLOOConfig",
    "make_algorithm",
]
