"""The import graph's layers: ``components/protocols.py`` (the seams) imports no implementation, and nothing
below the run wing (``components/launch.py``, ``components/loop.py``) imports it. Imports are read from the
source (every ``import``, under ``TYPE_CHECKING`` and inside functions too), so a lazy import counts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_WING = {"components.launch", "components.loop"}
# What the seams may name besides the standard library and third-party types: helpers for config records, and
# the records the seams exchange (the trajectory and its segments).
SEAM_IMPORTS = {"components.config", "components.trajectory"}
# The packages below the run wing (recipes, benchmarks, examples and tests sit above it).
BELOW_RUN_WING = ("components", "sandboxes", "harnesses", "monitoring")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a.b import c`` counts as ``a.b`` and ``a.b.c``)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def rein_modules(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in (*BELOW_RUN_WING, "recipes")}


def test_the_seams_import_no_implementation():
    found = rein_modules(imported_modules(ROOT / "components" / "protocols.py"))
    # ``from components.config import require`` names ``components.config.require``: its module is allowed
    beyond = {m for m in found if not any(m == a or m.startswith(f"{a}.") for a in SEAM_IMPORTS)}
    assert not beyond, f"components/protocols.py imports implementations: {sorted(beyond)}"


def test_the_check_sees_a_lazy_import_of_an_implementation(tmp_path):
    """The checker is not blind: an import under ``TYPE_CHECKING`` or inside a function is found."""
    source = tmp_path / "protocols.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from components.training.trainer import Trainer\n"
        "def f():\n    import components.launch\n"
    )
    assert {"components.training.trainer.Trainer", "components.launch"} <= imported_modules(source)


@pytest.mark.parametrize("package", BELOW_RUN_WING)
def test_nothing_below_the_run_wing_imports_it(package):
    offenders = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = module_name(path)
        if name in RUN_WING:
            continue
        wing = {m for m in imported_modules(path) if any(m == w or m.startswith(f"{w}.") for w in RUN_WING)}
        if wing:
            offenders[name] = sorted(wing)
    assert not offenders, f"modules below the run wing import it: {offenders}"
