"""SWE-style tasks: a buggy repository snapshot, a problem statement, and hidden tests that grade the fix.

Task file format (JSONL, one JSON object per line; blank lines and lines starting with ``#`` are skipped):

``task_id`` (str, required)
    Unique id made of letters, digits, ``.``, ``_`` and ``-``.
``repo`` (str, required)
    The repository snapshot the agent starts from: a directory or a ``.tar.gz``, relative to the JSONL file
    (or absolute). Its ``.git`` (if any) is discarded.
``bug_patch`` (str, optional)
    A unified diff applied to ``repo`` to produce the buggy snapshot. Lets many tasks share one pristine
    repository (the built-in set stores its library once). Without it, ``repo`` *is* the buggy snapshot.
``problem_statement`` (str, required)
    What the agent is told: the symptom, as a user would report it.
``setup_commands`` (list of str, optional)
    Shell commands run inside each fresh sandbox (agent's and grader's) before anything else, with the
    workspace as cwd. See :meth:`SweTask.run_setup`.
``hidden_tests`` (object or str, required)
    The grading tests: a mapping of workspace-relative file path to file content, or a directory (relative
    to the JSONL file) whose files are taken with their relative paths. They are never put in the agent's
    workspace; at grading they overwrite whatever is at those paths. A file in ``repo`` may share a path with
    a hidden test (the visible, older version of a test file) but must not have the same content.
``FAIL_TO_PASS`` (list of str, required, non-empty)
    Pytest node ids (``tests/test_x.py::test_name``) in the hidden test files that fail on the buggy
    snapshot and pass once it is fixed.
``PASS_TO_PASS`` (list of str, required)
    Node ids in the hidden test files that pass both before and after the fix.
``reference_patch`` (str, required)
    A unified diff that fixes the buggy snapshot (used only by the checker; never shown to the agent).

The agent's workspace is the buggy snapshot with git history flattened into one fresh commit (fixed author
and dates, so its id is reproducible): ``git diff`` works for the agent, and nothing in history reveals the
fix. Snapshots are materialised on demand into a cache directory, atomically (build in a temporary
directory, then rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from components.errors import SandboxError
from components.json_types import JsonObject, JsonValue
from components.protocols import Sandbox, SandboxLimits, SandboxSpec

TASK_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "rein" / "tasks"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The flattened commit is made with these, so the same snapshot always gets the same commit id.
_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "rein",
    "GIT_AUTHOR_EMAIL": "rein@localhost",
    "GIT_COMMITTER_NAME": "rein",
    "GIT_COMMITTER_EMAIL": "rein@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
_SKIPPED_NAMES = {".git", "__pycache__", ".pytest_cache"}


def python_tool_paths() -> tuple[str, ...]:
    """Host directories a sandbox needs read-only to run this interpreter's pytest: the venv and the base
    interpreter it links to (``sys.prefix`` and ``sys.base_prefix``)."""
    paths: list[str] = []
    for path in (sys.prefix, sys.base_prefix):
        resolved = str(Path(path).resolve())
        if resolved not in paths:
            paths.append(resolved)
    return tuple(paths)


@dataclass(frozen=True, kw_only=True)
class TaskSnapshot:
    """A materialised buggy snapshot: ``workspace_dir`` (with a one-commit ``.git``) and that commit's id."""

    workspace_dir: Path
    base_commit: str


@dataclass(frozen=True, kw_only=True)
class SweTask:
    """One SWE-style task (implements ``components.protocols.Task``). Build with :func:`load_tasks`."""

    task_id: str
    problem_statement: str
    repo: Path  # absolute: a directory or a .tar.gz
    hidden_tests: Mapping[str, str]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    reference_patch: str
    bug_patch: str = ""
    setup_commands: tuple[str, ...] = ()
    cache_dir: Path = DEFAULT_CACHE_DIR
    # Host paths the agent's sandbox sees read-only (by default this interpreter, so `python -m pytest` works).
    tool_paths: tuple[str, ...] = field(default_factory=python_tool_paths)
    # The interpreter agents run the tests with; its directory leads PATH inside the sandbox, so plain
    # `python -m pytest` finds the project's venv (pytest included).
    python_executable: str = field(default_factory=lambda: sys.executable)
    limits: SandboxLimits = field(default_factory=SandboxLimits)

    def __hash__(self) -> int:  # hidden_tests is a dict; a task is identified by its id and content
        return hash((self.task_id, self.repo, self.bug_patch, self.reference_patch))

    @property
    def test_command(self) -> str:
        """How to run the visible tests inside the sandbox (for prompts): ``python -m pytest -q``."""
        return "python -m pytest -q"

    def snapshot(self) -> TaskSnapshot:
        """The buggy snapshot, materialised into ``cache_dir`` on first use."""
        return materialize_snapshot(self)

    def sandbox_spec(self) -> SandboxSpec:
        """The agent's sandbox: the buggy snapshot (no hidden tests, flattened history), no network."""
        return SandboxSpec(
            workspace_source=self.snapshot().workspace_dir,
            read_only_paths=self.tool_paths,
            limits=self.limits,
            proxy_url=None,
            env={"PATH": f"{Path(self.python_executable).parent}:{SYSTEM_PATH}"},
        )

    async def run_setup(self, sandbox: Sandbox) -> None:
        """Run ``setup_commands`` in ``sandbox`` (cwd = workspace); a failing command raises ``SandboxError``."""
        for command in self.setup_commands:
            result = await sandbox.exec(["bash", "-lc", command])
            if result.exit_code != 0 or result.timed_out:
                raise SandboxError(
                    f"task {self.task_id}: setup command {command!r} failed (exit {result.exit_code}): "
                    f"{result.stderr[-2000:]}",
                    sandbox_id=sandbox.sandbox_id,
                )


# ----------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------


class _LineError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"field {field_name!r}: {message}")


def load_tasks(
    path: str | Path, *, cache_dir: Path | None = None, tool_paths: tuple[str, ...] | None = None
) -> list[SweTask]:
    """Read a task JSONL file; a bad line raises ``ValueError`` naming the file, line number and field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"task file {path} does not exist")
    tasks: list[SweTask] = []
    seen_ids: dict[str, int] = {}
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{line_number}: not valid JSON ({error.msg})") from None
        try:
            task = _task_from_record(record, base_dir=path.parent, cache_dir=cache_dir, tool_paths=tool_paths)
        except _LineError as error:
            raise ValueError(f"{path}:{line_number}: {error}") from None
        if task.task_id in seen_ids:
            raise ValueError(
                f"{path}:{line_number}: field 'task_id': {task.task_id!r} already used on line "
                f"{seen_ids[task.task_id]}"
            )
        seen_ids[task.task_id] = line_number
        tasks.append(task)
    if not tasks:
        raise ValueError(f"{path}: no tasks in file")
    return tasks


_KNOWN_FIELDS = {
    "task_id",
    "repo",
    "bug_patch",
    "problem_statement",
    "setup_commands",
    "hidden_tests",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "reference_patch",
}


def _task_from_record(
    record: JsonValue, *, base_dir: Path, cache_dir: Path | None, tool_paths: tuple[str, ...] | None
) -> SweTask:
    if not isinstance(record, dict):
        raise _LineError("<line>", f"must be a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - _KNOWN_FIELDS)
    if unknown:
        raise _LineError(unknown[0], f"unknown field (allowed: {sorted(_KNOWN_FIELDS)})")
    task_id = _string(record, "task_id")
    if not TASK_ID_PATTERN.fullmatch(task_id):
        raise _LineError("task_id", f"{task_id!r} may only use letters, digits, '.', '_' and '-'")
    repo = _resolve(base_dir, _string(record, "repo"))
    if not (repo.is_dir() or (repo.is_file() and repo.name.endswith(".tar.gz"))):
        raise _LineError("repo", f"{repo} is neither a directory nor a .tar.gz file")
    hidden_tests = _hidden_tests(record, base_dir)
    fail_to_pass = _node_ids(record, "FAIL_TO_PASS", hidden_tests, allow_empty=False)
    pass_to_pass = _node_ids(record, "PASS_TO_PASS", hidden_tests, allow_empty=True)
    overlap = sorted(set(fail_to_pass) & set(pass_to_pass))
    if overlap:
        raise _LineError("PASS_TO_PASS", f"{overlap[0]!r} is also in FAIL_TO_PASS")
    setup_commands = record.get("setup_commands", [])
    if not isinstance(setup_commands, list) or not all(isinstance(c, str) for c in setup_commands):
        raise _LineError("setup_commands", "must be a list of strings")
    bug_patch = record.get("bug_patch", "")
    if not isinstance(bug_patch, str):
        raise _LineError("bug_patch", "must be a unified diff (string)")
    if repo.is_file() and bug_patch:
        raise _LineError("bug_patch", "only supported when 'repo' is a directory")
    return SweTask(
        task_id=task_id,
        problem_statement=_string(record, "problem_statement"),
        repo=repo,
        hidden_tests=hidden_tests,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        reference_patch=_string(record, "reference_patch"),
        bug_patch=bug_patch,
        setup_commands=tuple(setup_commands),
        cache_dir=DEFAULT_CACHE_DIR if cache_dir is None else Path(cache_dir),
        tool_paths=python_tool_paths() if tool_paths is None else tuple(tool_paths),
    )


def _string(record: JsonObject, name: str) -> str:
    if name not in record:
        raise _LineError(name, "is required")
    value = record[name]
    if not isinstance(value, str) or not value.strip():
        raise _LineError(name, "must be a non-empty string")
    return value


def _resolve(base_dir: Path, relative: str) -> Path:
    path = Path(relative)
    return (path if path.is_absolute() else base_dir / path).resolve()


def _check_relative_path(name: str, path: str) -> None:
    posix = PurePosixPath(path)
    if not path or posix.is_absolute() or ".." in posix.parts or "\\" in path:
        raise _LineError(name, f"path {path!r} must be relative, inside the workspace, with '/' separators")


def _hidden_tests(record: JsonObject, base_dir: Path) -> dict[str, str]:
    if "hidden_tests" not in record:
        raise _LineError("hidden_tests", "is required")
    value = record["hidden_tests"]
    files: Mapping[str, JsonValue]
    if isinstance(value, str):
        directory = _resolve(base_dir, value)
        if not directory.is_dir():
            raise _LineError("hidden_tests", f"directory {directory} does not exist")
        files = {
            file.relative_to(directory).as_posix(): file.read_text(encoding="utf-8")
            for file in sorted(directory.rglob("*"))
            if file.is_file() and not _SKIPPED_NAMES & set(file.relative_to(directory).parts)
        }
    elif isinstance(value, dict):
        files = value
    else:
        raise _LineError("hidden_tests", "must be a mapping of path to content, or a directory")
    if not files:
        raise _LineError("hidden_tests", "has no files")
    checked: dict[str, str] = {}
    for test_path, content in files.items():
        _check_relative_path("hidden_tests", test_path)
        if not isinstance(content, str):
            raise _LineError("hidden_tests", f"content of {test_path!r} must be a string")
        checked[test_path] = content
    return checked


def _node_ids(
    record: JsonObject, name: str, hidden_tests: Mapping[str, str], *, allow_empty: bool
) -> tuple[str, ...]:
    if name not in record:
        raise _LineError(name, "is required")
    value = record[name]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _LineError(name, "must be a list of pytest node ids")
    if not value and not allow_empty:
        raise _LineError(name, "must name at least one test")
    for node_id in value:
        file_part = node_id.split("::", 1)[0]
        if "::" not in node_id or file_part not in hidden_tests:
            raise _LineError(name, f"{node_id!r} is not a test in one of the hidden test files")
    if len(set(value)) != len(value):
        raise _LineError(name, "lists a test twice")
    return tuple(value)


# ----------------------------------------------------------------------------------------------------------
# Snapshots
# ----------------------------------------------------------------------------------------------------------


def materialize_snapshot(task: SweTask) -> TaskSnapshot:
    """Build (once) the task's buggy workspace with flattened history under ``task.cache_dir``."""
    target = task.cache_dir / task.task_id / _snapshot_key(task)
    workspace = target / "workspace"
    commit_file = target / "base_commit"
    if commit_file.is_file():
        return TaskSnapshot(workspace_dir=workspace, base_commit=commit_file.read_text().strip())
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        _copy_repo(task.repo, building / "workspace")
        if task.bug_patch:
            apply_patch(building / "workspace", task.bug_patch, what=f"task {task.task_id}: bug_patch")
        for test_path, content in task.hidden_tests.items():
            existing = building / "workspace" / test_path
            if existing.is_file() and existing.read_text(encoding="utf-8", errors="replace") == content:
                raise ValueError(
                    f"task {task.task_id}: hidden test {test_path} is present in the repo snapshot; "
                    "remove it from 'repo' (the agent must not see hidden tests)"
                )
        base_commit = _flatten_git(building / "workspace")
        (building / "base_commit").write_text(base_commit + "\n")
        try:
            os.replace(building, target)
        except OSError:
            if not commit_file.is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return TaskSnapshot(workspace_dir=workspace, base_commit=commit_file.read_text().strip())


def _snapshot_key(task: SweTask) -> str:
    digest = hashlib.sha256()
    digest.update(_tree_digest(task.repo).encode())
    digest.update(task.bug_patch.encode())
    for test_path in sorted(task.hidden_tests):
        digest.update(test_path.encode() + b"\0" + task.hidden_tests[test_path].encode() + b"\0")
    return digest.hexdigest()[:16]


_TREE_DIGESTS: dict[tuple[str, float], str] = {}


def _tree_digest(path: Path) -> str:
    """Content hash of a directory tree or a file, memoised per (path, mtime of the top)."""
    key = (str(path), path.stat().st_mtime)
    if key not in _TREE_DIGESTS:
        digest = hashlib.sha256()
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if not path.is_file() and _SKIPPED_NAMES & set(file.relative_to(path).parts):
                continue
            digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode() + b"\0")
            digest.update(hashlib.sha256(file.read_bytes()).digest())
        _TREE_DIGESTS[key] = digest.hexdigest()
    return _TREE_DIGESTS[key]


def _copy_repo(repo: Path, destination: Path) -> None:
    if repo.is_dir():
        shutil.copytree(repo, destination, symlinks=True, ignore=shutil.ignore_patterns(*_SKIPPED_NAMES))
        return
    destination.mkdir(parents=True)
    with tarfile.open(repo, "r:gz") as archive:
        archive.extractall(destination, filter="data")
    shutil.rmtree(destination / ".git", ignore_errors=True)
    entries = list(destination.iterdir())
    if len(entries) == 1 and entries[0].is_dir():  # a tarball with one top-level folder: unwrap it
        inner = entries[0]
        for child in inner.iterdir():
            child.rename(destination / child.name)
        inner.rmdir()
        shutil.rmtree(destination / ".git", ignore_errors=True)


def apply_patch(directory: Path, patch: str, *, what: str) -> None:
    """Apply a unified diff to ``directory`` on the host (``git apply``); ValueError when it does not apply."""
    with tempfile.NamedTemporaryFile("w", suffix=".patch", delete=False) as handle:
        handle.write(patch if patch.endswith("\n") else patch + "\n")
    try:
        result = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", handle.name],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=60,
            env=_git_env(),
        )
    finally:
        os.unlink(handle.name)
    if result.returncode != 0:
        raise ValueError(f"{what} does not apply: {result.stderr.strip()}")


def _git_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(_GIT_IDENTITY)
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    return env


def _flatten_git(workspace: Path) -> str:
    """Make ``workspace`` a git repository with exactly one commit holding its files; returns the commit id."""
    shutil.rmtree(workspace / ".git", ignore_errors=True)
    env = _git_env()
    for command in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "--no-gpg-sign", "-m", "Initial commit"],
    ):
        subprocess.run(command, cwd=workspace, env=env, check=True, capture_output=True, timeout=60)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=workspace, env=env, check=True, capture_output=True, text=True
    )
    return head.stdout.strip()
