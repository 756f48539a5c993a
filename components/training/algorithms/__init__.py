"""Policy-gradient algorithms, one file each, every one an ``Algorithm`` brick (``components.protocols``).

Add one: a file here with a class implementing ``Algorithm`` (advantages, sample_weights, loss), an entry in
``ALGORITHMS`` if the ``--algorithm`` option should name it, and ``tests/contracts/test_algorithm_contract.py``
run against it (``pytest tests/contracts --brick yourmodule:YourAlgorithm``).
"""

from __future__ import annotations

from collections.abc import Callable

from components.protocols import Algorithm
from components.training.algorithms.dr_grpo import DrGRPO
from components.training.algorithms.grpo import GRPO, GRPOConfig
from components.training.algorithms.gspo import GSPO, GSPOConfig
from components.training.algorithms.rloo import RLOO, RLOOConfig

# What ``--algorithm NAME`` builds (the one place a name maps to a brick; the stack only sees the object).
ALGORITHMS: dict[str, Callable[[], Algorithm]] = {"grpo": GRPO, "dr_grpo": DrGRPO, "gspo": GSPO, "rloo": RLOO}


def make_algorithm(name: str) -> Algorithm:
    """The algorithm ``name`` names, with its default config; ``ValueError`` naming the field otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: must be one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]()


__all__ = [
    "ALGORITHMS",
    "GRPO",
    "GSPO",
    "RLOO",
    "DrGRPO",
    "GRPOConfig",
    "GSPOConfig",
    "RLOOConfig",
    "make_algorithm",
]
