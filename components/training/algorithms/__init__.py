"""Policy-gradient algorithms, one file each, every one an ``Algorithm`` brick (``components.protocols``).

Each file registers its config class on the algorithm seam (``components.registry.ALGORITHMS``): the config's
fields are the algorithm's knobs (``--algorithm gspo --algorithm-loss-clip-low 3e-4``) and its ``build()`` makes
the brick. Add one: a file here (or in your own package, registered through the ``rein.bricks`` entry point
``algorithm.<name>``) with a class implementing ``Algorithm`` and its config decorated with
``@ALGORITHMS.register("<name>")``, and ``tests/contracts/test_algorithm_contract.py`` run against it
(``pytest tests/contracts --brick yourmodule:YourAlgorithm``).
"""

from __future__ import annotations

from typing import Protocol

from components.protocols import Algorithm
from components.registry import ALGORITHMS
from components.training.algorithms.dr_grpo import DrGRPO, DrGRPOConfig
from components.training.algorithms.grpo import GRPO, GRPOConfig
from components.training.algorithms.gspo import GSPO, GSPOConfig
from components.training.algorithms.rloo import RLOO, RLOOConfig


class AlgorithmConfig(Protocol):
    """A registered algorithm kind: its fields are the algorithm's knobs, ``build()`` makes the brick."""

    def build(self) -> Algorithm:
        """The algorithm this config describes."""
        ...


__all__ = [
    "ALGORITHMS",
    "AlgorithmConfig",
    "GRPO",
    "GSPO",
    "RLOO",
    "DrGRPO",
    "DrGRPOConfig",
    "GRPOConfig",
    "GSPOConfig",
    "RLOOConfig",
]
