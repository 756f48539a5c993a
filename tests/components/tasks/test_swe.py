"""Task file format: loader validation errors, snapshot materialisation (flattened history, no hidden tests)."""

from __future__ import annotations

import json
import subprocess

import pytest

from components.protocols import Task
from components.tasks.builtin import BUILTIN_TASKS_FILE, MINILIB_DIR
from components.tasks.swe import SweTask, load_tasks


def _valid_record(**overrides):
    record = {
        "task_id": "demo-1",
        "repo": "repo",
        "problem_statement": "add() returns the wrong sum",
        "hidden_tests": {
            "tests/test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 2) == 4\n"
        },
        "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
        "PASS_TO_PASS": [],
        "reference_patch": (
            "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
            "-    return a - b\n+    return a + b\n"
        ),
    }
    record.update(overrides)
    return record


@pytest.fixture
def task_dir(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / ".git").mkdir()  # an old history that must not survive
    (repo / ".git" / "secret").write_text("the fix is a + b")
    return tmp_path


def _write(task_dir, *records):
    path = task_dir / "tasks.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def test_loads_a_valid_task(task_dir):
    [task] = load_tasks(_write(task_dir, _valid_record()), cache_dir=task_dir / "cache")
    assert isinstance(task, SweTask) and isinstance(task, Task)
    assert task.repo == (task_dir / "repo").resolve()
    assert task.fail_to_pass == ("tests/test_calc.py::test_add",)
    assert task.setup_commands == ()


@pytest.mark.parametrize(
    ("override", "field", "message"),
    [
        ({"task_id": ""}, "task_id", "non-empty"),
        ({"task_id": "bad id/x"}, "task_id", "may only use"),
        ({"repo": "missing"}, "repo", "neither a directory"),
        ({"problem_statement": 3}, "problem_statement", "non-empty string"),
        ({"hidden_tests": {}}, "hidden_tests", "no files"),
        ({"hidden_tests": {"../escape.py": "x"}}, "hidden_tests", "must be relative"),
        ({"hidden_tests": "no-such-dir"}, "hidden_tests", "does not exist"),
        ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS", "at least one"),
        ({"FAIL_TO_PASS": ["tests/other.py::test_x"]}, "FAIL_TO_PASS", "not a test in one of the hidden"),
        ({"FAIL_TO_PASS": "tests/test_calc.py::test_add"}, "FAIL_TO_PASS", "list of pytest node ids"),
        ({"PASS_TO_PASS": ["tests/test_calc.py::test_add"]}, "PASS_TO_PASS", "also in FAIL_TO_PASS"),
        ({"setup_commands": "pip install x"}, "setup_commands", "list of strings"),
        ({"reference_patch": ""}, "reference_patch", "non-empty string"),
        ({"surprise": 1}, "surprise", "unknown field"),
    ],
)
def test_bad_fields_are_named_with_their_line(task_dir, override, field, message):
    path = _write(task_dir, "# a comment", _valid_record(task_id="ok-1"), _valid_record(**override))
    with pytest.raises(ValueError) as error:
        load_tasks(path)
    text = str(error.value)
    assert f"{path}:3:" in text
    assert f"field {field!r}" in text
    assert message in text


def test_missing_required_field(task_dir):
    record = _valid_record()
    del record["PASS_TO_PASS"]
    with pytest.raises(ValueError, match=r":1: field 'PASS_TO_PASS': is required"):
        load_tasks(_write(task_dir, record))


def test_invalid_json_duplicate_ids_and_empty_file(task_dir):
    with pytest.raises(ValueError, match=r":2: not valid JSON"):
        load_tasks(_write(task_dir, _valid_record(), "{not json"))
    with pytest.raises(ValueError, match=r":2: field 'task_id': 'demo-1' already used on line 1"):
        load_tasks(_write(task_dir, _valid_record(), _valid_record()))
    with pytest.raises(ValueError, match="no tasks"):
        load_tasks(_write(task_dir, "# only a comment"))
    with pytest.raises(ValueError, match="does not exist"):
        load_tasks(task_dir / "nope.jsonl")


def _git(workspace, *args):
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args], cwd=workspace, capture_output=True, text=True
    )


def test_snapshot_has_one_fresh_commit_and_no_hidden_tests(task_dir):
    [task] = load_tasks(_write(task_dir, _valid_record()), cache_dir=task_dir / "cache")
    snapshot = task.snapshot()
    workspace = snapshot.workspace_dir
    assert (workspace / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    assert not (workspace / "tests" / "test_calc.py").exists()
    assert not (workspace / ".git" / "secret").exists()
    assert _git(workspace, "rev-list", "--all").stdout.split() == [snapshot.base_commit]
    assert _git(workspace, "status", "--porcelain").stdout == ""
    # Cached and reproducible: the same commit id every time.
    assert task.snapshot() == snapshot
    spec = task.sandbox_spec()
    assert spec.workspace_source == workspace and spec.proxy_url is None


def test_hidden_test_shipped_in_the_repo_is_refused(task_dir):
    content = "def test_add():\n    pass\n"
    (task_dir / "repo" / "tests").mkdir()
    (task_dir / "repo" / "tests" / "test_calc.py").write_text(content)
    record = _valid_record(hidden_tests={"tests/test_calc.py": content})
    [task] = load_tasks(_write(task_dir, record), cache_dir=task_dir / "cache")
    with pytest.raises(ValueError, match="hidden test tests/test_calc.py is present in the repo snapshot"):
        task.snapshot()


def test_bug_patch_that_does_not_apply_is_a_clear_error(task_dir):
    record = _valid_record(
        bug_patch="diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"
    )
    [task] = load_tasks(_write(task_dir, record), cache_dir=task_dir / "cache")
    with pytest.raises(ValueError, match="bug_patch does not apply"):
        task.snapshot()


def test_builtin_set(builtin_tasks):
    assert len(builtin_tasks) >= 30
    assert BUILTIN_TASKS_FILE.stat().st_size < 200_000  # one pristine library + small bug patches
    for task in builtin_tasks.values():
        assert task.repo == MINILIB_DIR
        assert task.bug_patch and task.reference_patch and task.fail_to_pass
        assert "FAIL_TO_PASS" not in task.problem_statement
    task = builtin_tasks["minilib-text-slugify-edges"]
    workspace = task.snapshot().workspace_dir
    assert "return slug\n" in (workspace / "minilib" / "text.py").read_text()  # the bug is in
    visible = (workspace / "tests" / "test_text.py").read_text()
    assert "test_slugify_strips_separators_at_the_ends" not in visible  # the hidden test is not
    assert all(content != visible for content in task.hidden_tests.values())


def test_tarball_repo_with_one_top_folder(task_dir):
    import tarfile

    archive = task_dir / "repo.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(task_dir / "repo", arcname="project-1.0")
    [task] = load_tasks(_write(task_dir, _valid_record(repo="repo.tar.gz")), cache_dir=task_dir / "cache")
    workspace = task.snapshot().workspace_dir
    assert (workspace / "calc.py").is_file()
    assert not (workspace / ".git" / "secret").exists()
    assert _git(workspace, "rev-list", "--all").stdout.count("\n") == 1


def test_tasks_are_hashable_and_picklable(builtin_tasks):
    import pickle

    tasks = list(builtin_tasks.values())
    assert len(set(tasks)) == len(tasks)
    copy = pickle.loads(pickle.dumps(tasks[0]))
    assert copy == tasks[0] and hash(copy) == hash(tasks[0])
