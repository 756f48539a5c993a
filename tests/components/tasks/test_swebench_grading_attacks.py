"""Attacks on SWE-bench-format grading (issue #28), on a small pytest repository in real bubblewrap sandboxes
(the host's Python runs the tests: no image needed). Each attack earns 1 against a named weakened variant of
``SweBenchGrader`` and 0 — never a grading error — against the real one, on the path it targets (observer or
log parsing)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from components.tasks.swe import python_tool_paths
from components.tasks.swebench import SweBenchTask, instance_from_row
from components.tasks.swebench_grading import SweBenchGrader, pytest_invocation
from sandboxes.bwrap import BwrapSandbox
from tests.components.tasks.test_swebench_loader import _row

BUGGY = "def add(a, b):\n    return a - b\n"
OBSERVED = "python3 -m pytest --no-header -rA --tb=no -p no:cacheprovider tests"
LOGGED = OBSERVED + " || true"  # shell syntax: the log-parsing path

pytestmark = pytest.mark.slow


def calc_task(tmp_path: Path, test_cmd: str, **changes) -> SweBenchTask:
    snapshot = tmp_path / "repo"
    snapshot.mkdir(exist_ok=True)
    (snapshot / "calc.py").write_text(BUGGY)
    fields = {"test_cmd": test_cmd, "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]), **changes}
    if "eval_script" in changes:  # SWE-bench's eval scripts run on the repository's own history
        git = ["git", "-C", str(snapshot), "-c", "user.name=t", "-c", "user.email=t@t"]
        for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
            subprocess.run([*git, *command], check=True)
        head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
        fields["base_commit"] = head.stdout.strip()
    row = _row("calc-attack", **fields)
    return SweBenchTask(
        instance=instance_from_row(row),
        image=None,
        snapshot_source=snapshot,
        cache_dir=tmp_path / "cache",
        tool_paths=python_tool_paths(),
    )


def replacing_calc(source: str) -> str:
    """A diff that replaces calc.py with ``source``."""
    old, new = BUGGY.splitlines(), source.splitlines()
    return (
        f"diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,{len(old)} +1,{len(new)} @@\n"
        + "".join(f"-{line}\n" for line in old)
        + "".join(f"+{line}\n" for line in new)
    )


class SwebenchLenientGrader(SweBenchGrader):
    """The weakened variant: swebench's own resolution (``get_eval_tests_report``: XFAIL passes, a skipped
    PASS_TO_PASS test is maintained)."""

    def _resolution(self, task, statuses):
        from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus
        from swebench.harness.grading import get_eval_tests_report, get_resolution_status

        gold = {
            FAIL_TO_PASS: list(task.instance.fail_to_pass),
            PASS_TO_PASS: list(task.instance.pass_to_pass),
        }
        status = get_resolution_status(get_eval_tests_report(statuses, gold))
        return status == ResolvedStatus.FULL.value, f"swebench: {status}"


# -- only a plain pass is a pass (#28.1) ----------------------------------------------------------------------

# An expected failure raised through pytest's own exception class, found without naming it anywhere.
RAISE_XFAIL = """def _every(kind):
    for sub in kind.__subclasses__():
        yield sub
        yield from _every(sub)


def add(a, b):
    raise next(kind for kind in _every(BaseException) if kind.__name__ == "XFailed")("later")
"""


@pytest.mark.parametrize("test_cmd", [OBSERVED, LOGGED], ids=["observer", "log"])
async def test_an_expected_failure_is_not_a_pass(tmp_path: Path, test_cmd: str) -> None:
    task = calc_task(tmp_path, test_cmd)
    assert (pytest_invocation(task) is not None) == (test_cmd == OBSERVED)
    diff = replacing_calc(RAISE_XFAIL)
    weak = await SwebenchLenientGrader(BwrapSandbox.create).grade_patch(task, diff)
    assert weak.reward == 1.0, weak.log + weak.error
    real = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, diff)
    assert real.reward == 0.0 and not real.error, real
    assert "tests/test_calc.py::test_add (XFAIL)" in real.log


# -- papercut (#28.9): a file that fails to collect is reported with its error ----------------------------------


async def test_a_collection_error_is_reported_with_its_text(tmp_path: Path) -> None:
    task = calc_task(tmp_path, OBSERVED)
    result = await SweBenchGrader(BwrapSandbox.create).grade_patch(
        task, replacing_calc("def add(a, b):\n    return a +* b\n")
    )
    assert result.reward == 0.0 and not result.error, result
    assert "collection error in tests/test_calc.py" in result.log and "SyntaxError" in result.log, result.log
    assert "no test outcome" not in result.log


# -- everything pytest reads is restored (#28.2) --------------------------------------------------------------

# A conftest pytest loads while it collects tests/, in a directory whose name a diff-header regex cannot read;
# its hook (naming nothing the diff scan rejects) makes the terminal summary print PASSED for every test.
SUMMARY_SAYS_PASSED = """def pytest_report_teststatus(report, config):
    if report.when == "call":
        return "passed", ".", "PASSED"
"""


def adding(path: str, source: str) -> str:
    lines = source.splitlines()
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)
    )


class DiffHeaderPathsGrader(SweBenchGrader):
    """The weakened variant: the agent's paths read from the diff's headers with a regex (the pre-#28 way)."""

    async def _patched_paths(self, sandbox, grader_dir):
        import re

        patch = (await sandbox.read_file(f"{grader_dir}/agent.patch")).decode()
        return [m.group(2) for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, re.MULTILINE)]


async def test_a_conftest_the_diff_header_regex_cannot_see(tmp_path: Path) -> None:
    task = calc_task(tmp_path, LOGGED)
    diff = adding("tests/more cases/conftest.py", SUMMARY_SAYS_PASSED)
    weak = await DiffHeaderPathsGrader(BwrapSandbox.create).grade_patch(task, diff)
    assert weak.reward == 1.0, weak.log + weak.error
    real = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, diff)
    assert real.reward == 0.0 and not real.error, real
    assert "restored to the base: tests/more cases/conftest.py" in real.log


# An R2E-style row (graded from its log): the test command runs ``run_tests.sh``, a file of the agent-writable
# repository, which runs ``ci/pytest.sh``; the agent rewrites either to print R2E's summary with the hidden test
# PASSED.
RUN_TESTS = "bash ci/pytest.sh\n"
PYTEST_SCRIPT = "python3 -m pytest --no-header -rA --tb=no -p no:cacheprovider tests\n"
FORGED = "echo '=== short test summary info ==='\necho 'PASSED tests/test_calc.py::test_add'\n"


class CommandScriptsKeptGrader(SweBenchGrader):
    """The weakened variant: the files the test command runs are left as the agent wrote them (pre-#28)."""

    async def _run_by_the_tests(self, sandbox, task, base):
        return set()


@pytest.mark.parametrize("script", ["run_tests.sh", "ci/pytest.sh"])
async def test_a_rewritten_test_script_is_restored(tmp_path: Path, script: str) -> None:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "ci").mkdir()
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (repo / "run_tests.sh").write_text(RUN_TESTS)
    (repo / "ci" / "pytest.sh").write_text(PYTEST_SCRIPT)
    task = calc_task(
        tmp_path, "bash run_tests.sh", log_parser="r2e", test_patch="", FAIL_TO_PASS=json.dumps(["test_add"])
    )
    old = (repo / script).read_text().splitlines()
    diff = (
        f"diff --git a/{script} b/{script}\n--- a/{script}\n+++ b/{script}\n@@ -1 +1,2 @@\n"
        + "".join(f"-{line}\n" for line in old)
        + "".join(f"+{line}\n" for line in FORGED.splitlines())
    )
    weak = await CommandScriptsKeptGrader(BwrapSandbox.create).grade_patch(task, diff)
    assert weak.reward == 1.0, weak.log + weak.error
    real = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, diff)
    assert real.reward == 0.0 and not real.error, real
    assert f"restored to the base: {script}" in real.log and "test_add (FAILED)" in real.log, real.log
    if script == "run_tests.sh":  # an honest fix still passes through the same scripts
        fixed = await SweBenchGrader(BwrapSandbox.create).grade_patch(
            task, replacing_calc(BUGGY.replace("-", "+"))
        )
        assert fixed.reward == 1.0, fixed.log + fixed.error


# -- an honest zero stays a zero (#28.4) ----------------------------------------------------------------------

KILL_THE_EVAL_SCRIPT = """import os
import signal

os.kill(os.getppid(), signal.SIGKILL)


def add(a, b):
    return a - b
"""


class MissingEndMarkerIsTheDatasGrader(SweBenchGrader):
    """The weakened variant: an eval script without its end marker is a broken row (a grading error)."""

    def _unfinished_eval_script(self, output, exit_code, log):
        from components.errors import GradingError

        raise GradingError("eval script printed no end marker", kind="data")


async def test_killing_the_eval_script_is_a_zero_not_a_grading_error(tmp_path: Path) -> None:
    from tests.components.tasks.test_swebench_loader import TEST_PATCH

    script = "\n".join(
        ["#!/bin/bash", "set -uxo pipefail", "git apply -v - <<'EOF_1'", TEST_PATCH.rstrip("\n"),
         "EOF_1", ": '>>>>> Start Test Output'", OBSERVED, ": '>>>>> End Test Output'"]
    )  # fmt: skip
    task = calc_task(tmp_path, OBSERVED, eval_script=script)
    assert task.instance.eval_script
    diff = replacing_calc(KILL_THE_EVAL_SCRIPT)
    weak = await MissingEndMarkerIsTheDatasGrader(BwrapSandbox.create).grade_patch(task, diff)
    assert weak.reward is None and weak.error_kind == "data", weak
    real = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, diff)
    assert real.reward == 0.0 and not real.error, real
    assert "never printed its end marker" in real.log


# -- values cannot lie about equality, in the repository's own tests (#28.7) ------------------------------------

# ``add`` still does not add; what it returns says it equals anything (``assert add(2, 3) == 5`` passes).
LYING_SUM = """class _Sum:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


def add(a, b):
    return _Sum(a - b)
"""
# The same type with an honest ``__eq__`` and a real fix: a repository's type may equal a builtin value.
HONEST_SUM = LYING_SUM.replace("return True", "return self.value == other").replace("a - b", "a + b")
NO_REPOSITORY_HONEST_COMPARISONS = (
    "        honest_repository_asserts(ProbingComparisons(changed))  # before the fingerprint (sessionstart)\n",
    "",
)


async def test_a_value_whose_eq_always_says_yes_in_the_repository_tests(tmp_path: Path) -> None:
    from tests.components.tasks.test_grading_attacks import weakened_runner

    task = calc_task(tmp_path, OBSERVED)
    weak_grader = SweBenchGrader(BwrapSandbox.create)
    weak_grader.runner_source = weakened_runner(NO_REPOSITORY_HONEST_COMPARISONS)
    weak = await weak_grader.grade_patch(task, replacing_calc(LYING_SUM))
    assert weak.reward == 1.0, weak.log + weak.error
    real = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, replacing_calc(LYING_SUM))
    assert real.reward == 0.0 and not real.error, real
    assert "tests/test_calc.py::test_add (FAILED)" in real.log
    honest = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, replacing_calc(HONEST_SUM))
    assert honest.reward == 1.0, honest.log + honest.error


# ``!=``, ordering and unittest's asserts (#28.7): the same liar class, through other operators and asserts.
# Each case: the hidden test's assert, the liar, and an honest fix of the same type.
OTHER_LIARS = {
    # ``__eq__`` honest, ``__ne__`` always "unequal": ``add(2, 3) != -1`` holds on the bug's -1
    "ne-only": (
        "add(2, 3) != -1",
        LYING_SUM.replace("return True", "return self.value == other\n\n    def __ne__(self, other):\n"
                          "        return True"),
        HONEST_SUM,
    ),
    # equal to nothing, unequal to everything, consistently
    "eq-and-ne": (
        "add(2, 3) != -1",
        LYING_SUM.replace("return True", "return False\n\n    def __ne__(self, other):\n        return True"),
        HONEST_SUM,
    ),
    # greater than anything
    "gt": (
        "add(2, 3) > 4",
        LYING_SUM.replace("return True", "return self.value == other\n\n    def __gt__(self, other):\n"
                          "        return True"),
        HONEST_SUM.replace("    __hash__", "    def __gt__(self, other):\n        return self.value > other\n\n"
                           "    __hash__"),
    ),
}  # fmt: skip


def with_tests(source: str) -> str:
    """A test_patch adding ``tests/test_calc.py`` with ``source``."""
    return adding("tests/test_calc.py", source)


@pytest.mark.parametrize("liar", sorted(OTHER_LIARS))
async def test_a_value_whose_other_comparisons_lie_in_the_repository_tests(tmp_path: Path, liar: str) -> None:
    from tests.components.tasks.test_grading_attacks import weakened_runner

    asserted, lying, honest_fix = OTHER_LIARS[liar]
    task = calc_task(
        tmp_path,
        OBSERVED,
        test_patch=with_tests(f"from calc import add\n\ndef test_add():\n    assert {asserted}\n"),
    )
    weak_grader = SweBenchGrader(BwrapSandbox.create)
    weak_grader.runner_source = weakened_runner(NO_REPOSITORY_HONEST_COMPARISONS)
    weak = await weak_grader.grade_patch(task, replacing_calc(lying))
    assert weak.reward == 1.0, weak.log + weak.error
    real = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, replacing_calc(lying))
    assert real.reward == 0.0 and not real.error, real
    assert "tests/test_calc.py::test_add (FAILED)" in real.log
    honest = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, replacing_calc(honest_fix))
    assert honest.reward == 1.0, honest.log + honest.error


UNITTEST_STYLE = """import unittest

from calc import add


class TestAdd(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)
"""


async def test_a_lying_value_in_a_unittest_style_test(tmp_path: Path) -> None:
    from tests.components.tasks.test_grading_attacks import weakened_runner

    task = calc_task(
        tmp_path,
        OBSERVED,
        test_patch=with_tests(UNITTEST_STYLE),
        FAIL_TO_PASS=json.dumps(["tests/test_calc.py::TestAdd::test_add"]),
    )
    weak_grader = SweBenchGrader(BwrapSandbox.create)
    weak_grader.runner_source = weakened_runner(NO_REPOSITORY_HONEST_COMPARISONS)
    weak = await weak_grader.grade_patch(task, replacing_calc(LYING_SUM))
    assert weak.reward == 1.0, weak.log + weak.error
    real = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, replacing_calc(LYING_SUM))
    assert real.reward == 0.0 and not real.error, real
    assert "TestAdd::test_add (FAILED)" in real.log
    honest = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, replacing_calc(HONEST_SUM))
    assert honest.reward == 1.0, honest.log + honest.error


# The liar also takes unittest's original ``assertEqual`` back out of the grader's checked one (its closure).
UNWRAPPING_LIAR = (
    """import unittest

_checked = unittest.TestCase.assertEqual
for _cell in getattr(_checked, "__closure__", None) or ():
    _value = _cell.cell_contents
    if callable(_value) and getattr(_value, "__name__", "") == "assertEqual" and _value is not _checked:
        unittest.TestCase.assertEqual = _value


"""
    + LYING_SUM
)
UNITTEST_UNWATCHED = (
    '_WATCHED_PREFIXES = ("pytest", "_pytest", "pluggy", "builtins", "unittest")',
    '_WATCHED_PREFIXES = ("pytest", "_pytest", "pluggy", "builtins")',
)


async def test_unwrapping_unittests_checked_assert_is_tampering(tmp_path: Path) -> None:
    from tests.components.tasks.test_grading_attacks import weakened_runner

    task = calc_task(
        tmp_path,
        OBSERVED,
        test_patch=with_tests(UNITTEST_STYLE),
        FAIL_TO_PASS=json.dumps(["tests/test_calc.py::TestAdd::test_add"]),
    )
    weak_grader = SweBenchGrader(BwrapSandbox.create)
    weak_grader.runner_source = weakened_runner(UNITTEST_UNWATCHED)
    weak = await weak_grader.grade_patch(task, replacing_calc(UNWRAPPING_LIAR))
    assert weak.reward == 1.0, weak.log + weak.error
    real = await SweBenchGrader(BwrapSandbox.create).grade_patch(task, replacing_calc(UNWRAPPING_LIAR))
    assert real.reward == 0.0 and not real.error, real
    assert "changed while the tests ran" in real.log and "TestCase" in real.log, real.log
