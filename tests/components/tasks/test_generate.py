"""The task generator: mutation rules, curated bugs, building tasks from mutants in real sandboxes, the CLI."""

from __future__ import annotations

import ast
import shutil

import pytest

from components.tasks.builtin import MINILIB_DIR
from components.tasks.builtin.catalog import CURATED_BUGS, InjectedBug
from components.tasks.generate import (
    Mutant,
    all_mutants,
    build_tasks,
    check_tasks,
    curated_mutant,
    hidden_tests_dir_for,
    main,
    make_patch,
    mutants_of_file,
    write_tasks,
)
from components.tasks.swe import apply_patch, load_tasks

SOURCE = """def f(values, strict=False):
    if not values:
        return 0
    total = 0
    for value in values:
        if value > 1 and strict:
            total = total + value
    return max(total, 1)
"""


def test_mutation_rules_cover_each_kind_and_stay_valid():
    mutants = list(mutants_of_file("m.py", SOURCE))
    kinds = {kind for _, kind, _, _ in mutants}
    assert kinds == {
        "wrong-default",
        "wrong-comparison",
        "wrong-operator",
        "off-by-one",
        "missing-edge-case",
        "swapped-arguments",
    }
    for _, _, _, mutated in mutants:
        ast.parse(mutated)
        assert mutated != SOURCE
    descriptions = {description for _, _, description, _ in mutants}
    assert "default False -> True" in descriptions
    assert "value > 1 -> value >= 1" in descriptions
    assert "max(total, 1) -> max(1, total)" in descriptions


def test_library_yields_many_candidates():
    mutants = all_mutants()
    assert len(mutants) > 100
    assert len({m.task_id for m in mutants}) == len(mutants)
    assert all(m.path.startswith("minilib/") for m in mutants)


def test_curated_bugs_apply_and_revert(tmp_path):
    assert len(CURATED_BUGS) >= 30
    assert len({bug.task_id for bug in CURATED_BUGS}) == len(CURATED_BUGS)
    workspace = tmp_path / "repo"
    shutil.copytree(MINILIB_DIR, workspace)
    for bug in CURATED_BUGS[:5]:
        mutant = curated_mutant(bug)
        pristine = (MINILIB_DIR / bug.path).read_text()
        apply_patch(workspace, make_patch(bug.path, pristine, mutant.mutated_text), what="bug")
        assert (workspace / bug.path).read_text() == mutant.mutated_text
        apply_patch(workspace, make_patch(bug.path, mutant.mutated_text, pristine), what="fix")
        assert (workspace / bug.path).read_text() == pristine


def test_curated_bug_snippet_must_be_unique():
    bug = InjectedBug(
        task_id="x", path="minilib/roman.py", original="    ", mutated="", kind="k", problem_statement="p"
    )
    with pytest.raises(ValueError, match="occurs .* times"):
        curated_mutant(bug)


async def test_build_keeps_mutants_that_break_tests_and_checks_them(tmp_path, sandbox_factory):
    path = "minilib/roman.py"
    pristine = (MINILIB_DIR / path).read_text()
    breaking = Mutant(
        task_id="roman-limit",
        path=path,
        kind="off-by-one",
        function="to_roman",
        description="",
        mutated_text=pristine.replace("number <= 3999", "number <= 3998"),
    )
    harmless = Mutant(
        task_id="roman-comment",
        path=path,
        kind="none",
        function="to_roman",
        description="",
        mutated_text=pristine.replace('"""Roman numerals', '"""Roman numerals!'),
    )
    tasks = await build_tasks([harmless, breaking], sandbox_factory=sandbox_factory, cache_dir=tmp_path / "c")
    assert [task.task_id for task in tasks] == ["roman-limit"]
    [task] = tasks
    assert set(task.hidden_tests) == {"tests/test_roman.py"}
    assert "tests/test_roman.py::test_to_roman_upper_limit" in task.fail_to_pass
    assert "tests/test_roman.py::test_to_roman_basic" in task.pass_to_pass
    assert "to_roman" in task.problem_statement and "test_to_roman_upper_limit" in task.problem_statement
    out = tmp_path / "out" / "tasks.jsonl"
    write_tasks(tasks, out, hidden_dirs={"roman-limit": hidden_tests_dir_for(path)})
    [loaded] = load_tasks(out, cache_dir=tmp_path / "c")
    assert loaded.fail_to_pass == task.fail_to_pass and loaded.bug_patch == task.bug_patch
    [check] = await check_tasks([loaded], sandbox_factory)
    assert check.ok, check.problems


def test_cli_needs_something_to_do(capsys):
    with pytest.raises(SystemExit) as error:
        main([])
    assert error.value.code == 2
    assert "nothing to do" in capsys.readouterr().err
