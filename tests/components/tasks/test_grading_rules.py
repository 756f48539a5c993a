"""The grader's rules as pure functions (no sandbox): strict resolution, what counts as test infrastructure,
honest comparisons (issue #28)."""

from __future__ import annotations

import collections
import fractions
import sys
from pathlib import Path

import pytest

from components.tasks.grading_runner import (
    DishonestComparison,
    HonestComparisons,
    ProbingComparisons,
    honest_asserts,
    outcomes_from_events,
    read_by_the_test_runner,
)
from components.tasks.swebench_grading import passed_strictly


def test_only_passed_passes_and_truncated_ids_match_only_passes():
    statuses = {"a": "PASSED", "b": "XFAIL", "c": "SKIPPED", "t[x-1]": "PASSED", "t[x-2]": "XFAIL"}
    assert [passed_strictly(test_id, statuses) for test_id in ("a", "b", "c", "missing")] == [
        True,
        False,
        False,
        False,
    ]
    assert not passed_strictly("t[x", statuses)  # one of its matches is an XFAIL
    assert passed_strictly("t[x-1", statuses)


def test_a_phase_that_raised_or_was_expected_to_fail_is_not_a_pass():
    def events(nodeid, **call):
        phases = [{"when": when, "outcome": "passed", "raised": False, "xfail": False} for when in ("setup", "call", "teardown")]  # fmt: skip
        phases[1].update(call)
        return [{"nodeid": nodeid, **phase} for phase in phases]

    outcomes = outcomes_from_events(
        events("plain") + events("rewritten", raised=True) + events("xpass", xfail=True) + events("short")[:2]
    )
    assert outcomes == {"plain": "passed", "rewritten": "raised", "xpass": "xpassed", "short": "incomplete"}


@pytest.mark.parametrize(
    "path",
    ["pytest.ini", "a/.pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "x/pytest.toml", "lib/conftest.py",
     "sitecustomize/__init__.py", "usercustomize.py", "evil.pth", "pkg.egg-info/entry_points.txt",
     "pkg-1.0.dist-info/entry_points.txt", "m/__pycache__/x.cpython-311.pyc", "old.pyc"],
)  # fmt: skip
def test_files_pytest_reads_are_test_infrastructure(path):
    assert read_by_the_test_runner(path)


@pytest.mark.parametrize("path", ["lib/core.py", "README.md", "lib/data.json", "tests/test_x.py"])
def test_code_and_data_are_not_test_infrastructure(path):
    assert not read_by_the_test_runner(path)


@pytest.fixture
def own_module(tmp_path: Path, monkeypatch):
    (tmp_path / "agentlib.py").write_text(
        "class Liar:\n    def __eq__(self, other):\n        return True\n\n\n"
        "class Agreeable(str):\n    __hash__ = str.__hash__\n\n    def __eq__(self, other):\n        return True\n\n\n"
        "class Box:\n    def __init__(self, value):\n        self.value = value\n\n"
        "    def __eq__(self, other):\n        return isinstance(other, Box) and other.value == self.value\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import agentlib

    yield HonestComparisons(str(tmp_path)), agentlib
    sys.modules.pop("agentlib", None)


def test_values_of_the_agents_types_cannot_lie_to_builtins(own_module):
    compare, agentlib = own_module
    for operators, *operands in [(("==",), agentlib.Liar(), 3), (("!=",), agentlib.Liar(), 3),
                                 (("==",), [agentlib.Liar()], [3]), (("in",), agentlib.Liar(), [3])]:  # fmt: skip
        with pytest.raises(DishonestComparison):
            compare(operators, *operands)
    assert compare(("==",), agentlib.Agreeable("a"), "b") is False  # compared as the plain str it holds
    assert compare(("==",), agentlib.Agreeable("a"), "a") is True
    assert compare(("==",), agentlib.Box(1), agentlib.Box(1))  # the agent's own types: the code under test
    assert compare(("in",), 3, [agentlib.Box(1), 3])  # membership in a container of the agent's values


def test_honest_comparisons_keep_builtin_semantics():
    compare = HonestComparisons("/nonexistent-workspace")
    point = collections.namedtuple("Point", "x y")
    assert compare(("==",), point(1, 2), (1, 2)) and compare(("==",), fractions.Fraction(1, 2), 0.5)
    assert compare(("<", "<="), 1, 2, 2) and not compare(("<", "<"), 1, 3, 2)
    assert compare(("==",), collections.OrderedDict(a=[1]), {"a": [1]}) and compare(("is",), None, None)
    assert compare(("==",), pytest.approx(0.3), 0.1 + 0.2)


def test_only_comparisons_in_asserts_are_rewritten():
    import ast

    tree = honest_asserts(ast.parse("assert f(1) == 2 and x not in y\nz = a == b\n"))
    assert ast.unparse(tree).splitlines() == [
        "assert @rein_compare(('==',), f(1), 2) and @rein_compare(('not in',), x, y)",
        "z = a == b",
    ]


def test_repository_comparisons_probe_the_agents_values_instead_of_refusing_them(own_module):
    """Repository mode: a type of a changed file may equal a builtin value (the repository's types do), but one
    that also equals a probe of that value's shape is lying."""
    _, agentlib = own_module
    compare = ProbingComparisons([agentlib.__file__])
    for operators, *operands in [(("==",), agentlib.Liar(), 3), (("==",), "x", agentlib.Agreeable("y")),
                                 (("==",), [agentlib.Liar()], [3]), (("in",), agentlib.Liar(), [3])]:  # fmt: skip
        with pytest.raises(DishonestComparison):
            compare(operators, *operands)
    assert compare(("!=",), agentlib.Box(1), 1) and not compare(("==",), agentlib.Box(1), 1)
    assert compare(("==",), agentlib.Box(1), agentlib.Box(1)) and compare(("<",), 1, 2)
    assert ProbingComparisons([])(("==",), agentlib.Liar(), 3) is True  # not a changed file: the repository's


def test_repository_asserts_keep_comparisons_whose_results_are_used():
    import ast

    tree = honest_asserts(ast.parse("assert (a == b).all() and not c == d\nassert f(x == y)\n"), True)
    assert ast.unparse(tree).splitlines() == [
        "assert (a == b).all() and (not @rein_compare(('==',), c, d))",
        "assert f(x == y)",
    ]


def test_the_bridge_copies_builtin_values_and_hands_out_handles_for_the_rest():
    """What crosses from the code-under-test process: exact builtin values (a lying ``str`` subclass arrives as
    the plain ``str`` it holds), handles for everything else, exceptions as their nearest builtin class; and the
    test process serves the other side nothing but its lent callables."""
    import socket
    import threading

    from components.tasks.grading_runner import _BRIDGE_OPERATIONS, Bridge, CodeUnderTestGone, Remote

    class Agreeable(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    class NotFound(KeyError):
        pass

    def lookup(key):
        raise NotFound(key)

    values = {"agreeable": Agreeable("a"), "nested": (1, [2.5, b"x"], {"k": {3}}), "lookup": lookup}
    test_end, code_end = socket.socketpair()
    serves = {
        "get": values.__getitem__,
        "call": lambda function, *args: function(*args),
        **_BRIDGE_OPERATIONS,
    }
    serves["peek"] = lambda function: code.request("getattr", function, "__globals__")
    code = Bridge(code_end, serves, lambda value: True)
    threading.Thread(target=lambda: pytest.raises(CodeUnderTestGone, code.serve_forever), daemon=True).start()
    bridge = Bridge(test_end, {"call": lambda function, *args: function(*args)}, callable)

    agreeable = bridge.request("get", "agreeable")
    assert type(agreeable) is str and agreeable == "a" and agreeable != "b"
    nested = bridge.request("get", "nested")
    assert nested == (1, [2.5, b"x"], {"k": {3}}) and type(nested[1][1]) is bytes
    remote_lookup = bridge.request("get", "lookup")
    assert isinstance(remote_lookup, Remote) and bridge.request("get", "lookup") is remote_lookup
    with pytest.raises(KeyError) as raised:
        remote_lookup("missing")
    assert type(raised.value) is KeyError and raised.value.args == ("missing",)
    assert bridge.request("call", str.upper, "abc") == "ABC"  # a lent callable, called back in this process
    with pytest.raises(TypeError, match="does not serve 'getattr'"):  # ... and nothing else done with it
        bridge.request("peek", str.upper)
    test_end.close()
