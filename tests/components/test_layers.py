"""The import graph's layers: ``components/protocols.py`` (the seams) imports no implementation, the run wing
(``components/run/``) is the top layer of ``components`` (nothing below it imports it: recipes, benchmarks,
examples and tests sit above), and no import cycle spans modules of two packages. Imports are read from the
source (every ``import``, under ``TYPE_CHECKING`` and inside functions too), so a lazy import counts."""

from __future__ import annotations

import ast
from collections.abc import Container, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_WING = "components.run"
# What the seams may name besides the standard library and third-party types: helpers for config records, and
# the records the seams exchange (the trajectory and its segments).
SEAM_IMPORTS = {"components.config", "components.json_types", "components.trajectory"}
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


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def package_name(path: Path, root: Path = ROOT) -> str:
    """The package a module file belongs to: its folder (a package's ``__init__.py`` belongs to itself)."""
    return ".".join(path.parent.relative_to(root).parts)


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
        "def f():\n    import components.run.stack\n"
    )
    assert {"components.training.trainer.Trainer", "components.run.stack"} <= imported_modules(source)


def in_run_wing(module: str) -> bool:
    return module == RUN_WING or module.startswith(f"{RUN_WING}.")


def run_wing_imports_from_below(root: Path, package: str) -> dict[str, list[str]]:
    """Per module of ``package`` outside the run wing the run-wing modules it imports (none: not listed)."""
    offenders = {}
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root)
        if in_run_wing(name):
            continue
        # ``from components import run`` names ``components.run``: caught as well
        wing = {m for m in imported_modules(path) if in_run_wing(m)}
        if wing:
            offenders[name] = sorted(wing)
    return offenders


@pytest.mark.parametrize("package", BELOW_RUN_WING)
def test_nothing_below_the_run_wing_imports_it(package):
    offenders = run_wing_imports_from_below(ROOT, package)
    assert not offenders, f"modules below the run wing import it: {offenders}"


def test_the_run_wing_is_the_package_recipes_build_on():
    """The layer is real: ``components/run`` is a package, and the recipes import it (so a rename of the wing
    that left ``RUN_WING`` behind would fail here, not make the check above vacuous)."""
    assert (ROOT / "components" / "run" / "__init__.py").exists()
    recipes = [path for path in (ROOT / "recipes").glob("*.py") if path.name != "__init__.py"]
    assert recipes
    for path in recipes:
        assert any(in_run_wing(m) for m in imported_modules(path)), (
            f"{path.name} does not import the run wing"
        )


def test_the_run_wing_check_sees_an_import_from_below(tmp_path):
    """The checker is not blind: a lower module importing the wing (lazily, or as ``from components import
    run``) is an offender; the wing's own modules importing each other are not."""
    (tmp_path / "components" / "run").mkdir(parents=True)
    (tmp_path / "components" / "run" / "loop.py").write_text("from components.run.stack import RunStack\n")
    (tmp_path / "components" / "engine.py").write_text(
        "def later():\n    from components.run.config import RunConfig\n"
    )
    (tmp_path / "components" / "proxy.py").write_text("from components import run\n")
    assert run_wing_imports_from_below(tmp_path, "components") == {
        "components.engine": ["components.run.config", "components.run.config.RunConfig"],
        "components.proxy": ["components.run"],
    }


def owning_module(imported: str, modules: Container[str]) -> str | None:
    """The longest of ``modules`` that ``imported`` names or starts with (``a.b.c`` is module ``a.b`` when ``c``
    is a name in it); None for anything else (standard library, third party)."""
    parts = imported.split(".")
    return next((m for n in range(len(parts), 0, -1) if (m := ".".join(parts[:n])) in modules), None)


def import_graph(root: Path, packages: Sequence[str]) -> tuple[dict[str, set[str]], dict[str, str]]:
    """Per module of ``packages`` the modules of them it imports, and per module its package."""
    paths = {
        module_name(path, root): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }
    graph = {
        name: {owning_module(imported, paths) for imported in imported_modules(path)} - {None, name}
        for name, path in paths.items()
    }
    return graph, {name: package_name(path, root) for name, path in paths.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def cross_package_cycles(root: Path, packages: Sequence[str]) -> dict[str, list[str]]:
    """Per module the modules of other packages on an import cycle with it (none: not listed)."""
    graph, package = import_graph(root, packages)
    reach = {module: reachable(graph, module) for module in graph}
    cycles = {
        module: sorted(
            other for other in reach[module] if module in reach[other] and package[other] != package[module]
        )
        for module in graph
    }
    return {module: others for module, others in cycles.items() if others}


def test_no_import_cycle_spans_two_packages():
    cycles = cross_package_cycles(ROOT, BELOW_RUN_WING)
    assert not cycles, f"import cycles between modules of different packages: {cycles}"


def test_the_cycle_check_sees_a_lazy_cycle_through_a_third_module(tmp_path):
    """The checker is not blind: ``a.x`` → ``b.y`` at import time, ``b.y`` → ``b.z`` (same package, allowed
    alone), and ``b.z`` → ``a.x`` only inside a function is a cycle across ``a`` and ``b``."""
    for package in ("a", "b"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "a" / "x.py").write_text("from b.y import helper\n")
    (tmp_path / "b" / "y.py").write_text("import b.z\nhelper = 1\n")
    (tmp_path / "b" / "z.py").write_text("def later():\n    from a import x\n")
    assert cross_package_cycles(tmp_path, ("a", "b")) == {
        "a.x": ["b.y", "b.z"],
        "b.y": ["a.x"],
        "b.z": ["a.x"],
    }
    (tmp_path / "b" / "z.py").write_text("def later():\n    from b import y\n")  # the same package: fine
    assert cross_package_cycles(tmp_path, ("a", "b")) == {}
