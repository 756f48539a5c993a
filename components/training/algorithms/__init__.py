"""Policy-gradient algorithms, one file each, every one an ``Algorithm`` brick (``components.protocols``).

Add one: a file here with a class implementing ``Algorithm`` (advantages, sample_weights, loss) and its config
class registered as a kind of the ``algorithm`` seam (``@ALGORITHMS.register("name")`` on a frozen dataclass
with ``build()``; a package outside Rein registers through the ``rein.bricks`` entry point group, see
``components/registry.py``), then ``tests/contracts/test_algorithm_contract.py`` run against it
(``pytest tests/contracts --brick yourmodule:YourAlgorithm``). ``--algorithm NAME`` then picks it and every
field of its config is a flag (``--algorithm-<field>``) and a config-file key (``algorithm: {kind: NAME, ...}``).
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
    """A registered kind of the ``algorithm`` seam: a frozen config that builds its ``Algorithm``."""

    def build(self) -> Algorithm: ...


def make_algorithm(name: str) -> Algorithm:
    """The algorithm ``name`` names, with its default config; ``ValueError`` listing the registered kinds."""
    return ALGORITHMS.get(name)().build()


__all__ = [
    "ALGORITHMS",
    "GRPO",
    "GSPO",
    "RLOO",
    "AlgorithmConfig",
    "DrGRPO",
    "DrGRPOConfig",
    "GRPOConfig",
    "GSPOConfig",
    "RLOOConfig",
    "make_algorithm",
]
