"""SWE-bench-format task sets (SWE-bench, SWE-Gym, SWE-smith rows; R2E-Gym rows converted) as Rein tasks.

Rows come from Parquet or JSONL files in the Hugging Face ``datasets`` column layout:

``instance_id, repo, base_commit, patch, test_patch, problem_statement, hints_text, created_at, version,
environment_setup_commit, FAIL_TO_PASS, PASS_TO_PASS`` — the last two JSON-encoded lists of test ids (plain
lists are accepted too). Optional: ``image_name`` (SWE-smith: the environment image), ``test_cmd`` (the test
command, run in the repository; default ``python3 -m pytest --no-header -rA --tb=no -p no:cacheprovider`` on
the files ``test_patch`` touches, as SWE-bench runs pytest repositories), ``log_parser`` (a name in
``swebench.harness.log_parsers.PARSER_REGISTRY``; default: the parser SWE-bench maps the repository to, else
``parse_log_pytest``). Every other column is kept verbatim in ``SweBenchInstance.extra`` — nothing is lost.
A row with an ``eval_script`` (swebench >= 4 data sets; ``image`` names its image) is graded by running that
script, as SWE-bench does; its workspace then keeps the repository's history up to the base commit (the script
checks it out) and nothing later. Without one, repositories whose tests are not pytest (Django's
``runtests.py``, SymPy's ``bin/test``) need a ``test_cmd``.

Where a repository comes from (``RepoSources``):
  * an image: ``images_dir`` holds one OCI layout per image (``skopeo copy docker://NAME:TAG oci:DIR/BASE:TAG``,
    ``BASE`` = the image name's last path component) or a ``docker save`` archive ``DIR/BASE.tar``; the image
    is ``image_name`` or SWE-bench's ``swebench/sweb.eval.x86_64.<instance id, "__" -> "_1776_">:latest``, and
    ``images.json`` in ``images_dir`` may map instance ids to references (``oci:DIR:TAG``, ``docker-archive:PATH``)
    or to plain image names (looked up in the store as ``image_name`` is). The repository is the
    image's ``/testbed``, and the sandbox runs on the image.
  * a local snapshot: ``snapshots_dir/<instance_id>/`` or ``snapshots_dir/<instance_id>.tar.gz`` holding the
    repository at ``base_commit``. With an image as well, the snapshot is the repository and the image the
    environment; without one, the sandbox runs on the host's root with this interpreter (``python3`` is the
    project venv's).

Bad rows (a missing or mistyped field, an unknown image, a missing snapshot, a ``patch``/``test_patch`` that
does not apply) are returned in ``SweBenchLoad.rejected`` with the instance id and the reason, never raised.
The agent's workspace is the repository with git history flattened into one commit (nothing in history
reveals the fix) and without ``test_patch``; grading is ``components/tasks/swebench_grading.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from components.config import require
from components.errors import SandboxError
from components.protocols import Sandbox, SandboxLimits, SandboxSpec
from components.tasks.swe import (
    SYSTEM_PATH,
    TaskSnapshot,
    _copy_repo,
    _flatten_git,
    _git_env,
    python_tool_paths,
)
from sandboxes.image import ImageCache, ImageError, UnpackedImage, parse_reference
from sandboxes.rootfs_paths import ImageLayoutError

SWEBENCH_COLUMNS = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "environment_setup_commit",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
# Columns a row cannot do without; the others default to "".
REQUIRED_COLUMNS = ("instance_id", "repo", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS")
OPTIONAL_REIN_COLUMNS = ("image_name", "test_cmd", "log_parser")
DEFAULT_REPO_PATH = "/testbed"
SWEBENCH_CONDA_ENV = "/opt/miniconda3/envs/testbed"
DEFAULT_TASK_CACHE = Path.home() / ".cache" / "rein" / "swebench"
_INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# Maps a foreign data set's row (R2E-Gym) to a SWE-bench row.
RowConverter = Callable[[Mapping[str, object]], dict[str, object]]


class RowError(ValueError):
    """One row is unusable; ``instance_id`` says which (``"<row N>"`` when it has none)."""

    def __init__(self, instance_id: str, message: str) -> None:
        self.instance_id = instance_id
        self.reason = message
        super().__init__(f"{instance_id}: {message}")


@dataclass(frozen=True, kw_only=True)
class SweBenchInstance:
    """One data set row, lossless: the SWE-bench columns, Rein's optional ones, and ``extra`` (all others)."""

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    hints_text: str = ""
    created_at: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    image_name: str = ""
    test_cmd: str = ""
    log_parser: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.instance_id, self.patch, self.test_patch))

    def to_row(self) -> dict[str, object]:
        """The row in the data set's own encoding (FAIL_TO_PASS / PASS_TO_PASS as JSON strings)."""
        row: dict[str, object] = {name: getattr(self, name) for name in SWEBENCH_COLUMNS[:10]}
        row["FAIL_TO_PASS"] = json.dumps(list(self.fail_to_pass))
        row["PASS_TO_PASS"] = json.dumps(list(self.pass_to_pass))
        for name in OPTIONAL_REIN_COLUMNS:
            if getattr(self, name):
                row[name] = getattr(self, name)
        row.update(self.extra)
        return row

    @property
    def test_files(self) -> tuple[str, ...]:
        """Files ``test_patch`` touches (SWE-bench's test directives for pytest repositories)."""
        return tuple(dict.fromkeys(match.group(2) for match in _DIFF_FILE.finditer(self.test_patch)))

    @property
    def eval_script(self) -> str:
        """The row's own evaluation script (swebench >= 4 data sets), or ""."""
        script = self.extra.get("eval_script")
        return script if isinstance(script, str) else ""

    @property
    def test_command(self) -> str:
        """The command that runs this instance's tests inside the repository."""
        if self.test_cmd:
            return self.test_cmd
        files = " ".join(shlex.quote(path) for path in self.test_files)
        return f"python3 -m pytest --no-header -rA --tb=no -p no:cacheprovider {files}".rstrip()


def instance_from_row(row: Mapping[str, object], *, row_number: int = 0) -> SweBenchInstance:
    """Validate one row; ``RowError`` names the instance and the field."""
    instance_id = row.get("instance_id")
    label = instance_id if isinstance(instance_id, str) and instance_id else f"<row {row_number}>"
    for name in REQUIRED_COLUMNS:
        if row.get(name) is None:
            raise RowError(label, f"field {name!r} is missing")
    strings: dict[str, str] = {}
    for name in (*SWEBENCH_COLUMNS[:10], *OPTIONAL_REIN_COLUMNS):
        value = row.get(name)
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise RowError(label, f"field {name!r} must be a string, got {type(value).__name__}")
        strings[name] = value
    if not _INSTANCE_ID.fullmatch(strings["instance_id"]):
        raise RowError(label, "field 'instance_id' may only use letters, digits, '.', '_' and '-'")
    for name in ("problem_statement", "repo"):
        if not strings[name].strip():
            raise RowError(label, f"field {name!r} is empty")
    tests = {name: _test_ids(label, row.get(name), name) for name in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    if not tests["FAIL_TO_PASS"]:
        raise RowError(label, "field 'FAIL_TO_PASS' names no test")
    if not strings["test_patch"].strip() and not strings["test_cmd"]:
        raise RowError(label, "field 'test_patch' is empty and no 'test_cmd' says what to run")
    if strings["log_parser"] and strings["log_parser"] != R2E_LOG_PARSER:
        from swebench.harness.log_parsers import PARSER_REGISTRY

        if strings["log_parser"] not in PARSER_REGISTRY:
            raise RowError(label, f"field 'log_parser': {strings['log_parser']!r} is not a swebench parser")
    known = {*SWEBENCH_COLUMNS, *OPTIONAL_REIN_COLUMNS}
    # None is how a Parquet file says "this row has no such column" (one schema for all rows).
    extra = {key: value for key, value in row.items() if key not in known and value is not None}
    return SweBenchInstance(
        **strings,
        fail_to_pass=tests["FAIL_TO_PASS"],
        pass_to_pass=tests["PASS_TO_PASS"],
        extra=extra,
    )


def _test_ids(label: str, value: object, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError:
            raise RowError(label, f"field {name!r} is not a JSON-encoded list") from None
    if hasattr(value, "tolist"):  # a numpy array from a Parquet list column
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise RowError(label, f"field {name!r} must be a list of test ids")
    return tuple(value)


def read_rows(path: Path) -> Iterator[dict[str, object]]:
    """Rows of a Parquet (``.parquet``) or JSONL file, as dicts; a JSONL line that is not JSON yields
    ``{"__error__": ...}`` so that the loader reports it with its line number."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"tasks: {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
            yield from batch.to_pylist()
        return
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                yield {"__error__": f"line {line_number} is not JSON ({exc})"}
                continue
            yield row if isinstance(row, dict) else {"__error__": f"line {line_number} is not an object"}


# ----------------------------------------------------------------------------------------------------------
# Repository sources and tasks
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RepoSources:
    """Where repositories and environments come from (see the module docstring)."""

    images_dir: Path | None = None
    snapshots_dir: Path | None = None
    repo_path: str = DEFAULT_REPO_PATH  # the repository's path inside images (SWE-bench, R2E-Gym: /testbed)
    cache_dir: Path = DEFAULT_TASK_CACHE  # flattened workspaces
    image_cache: ImageCache | None = None  # unpacked images (default: ~/.cache/rein/images)

    def __post_init__(self) -> None:
        require(
            self.images_dir is not None or self.snapshots_dir is not None,
            "images_dir",
            "give images_dir, snapshots_dir or both",
        )
        for name in ("images_dir", "snapshots_dir"):
            value = getattr(self, name)
            require(value is None or Path(value).is_dir(), name, f"{value} is not a directory")

    def image_for(self, instance: SweBenchInstance) -> str | None:
        """The image reference of ``instance`` (None without an image store); ``RowError`` if it is absent."""
        if self.images_dir is None:
            return None
        images_dir = Path(self.images_dir)
        mapping_file = images_dir / "images.json"
        named = instance.image_name or instance.extra.get("image")  # SWE-smith's column, swebench 5's
        if mapping_file.is_file():
            mapping = json.loads(mapping_file.read_text())
            if instance.instance_id in mapping:
                reference = str(mapping[instance.instance_id])
                if reference.partition(":")[0] in _TRANSPORTS:
                    return _resolve_reference(reference, images_dir, instance.instance_id)
                named = reference  # a plain image name, looked up in the store as a row's image_name is
        names = (
            [str(named)]
            if named
            else [swebench_image_name(instance.instance_id), swegym_image_name(instance.instance_id)]
        )
        for name in names:
            base, _, tag = name.rpartition("/")[2].partition(":")
            for candidate in (images_dir / base, images_dir / f"{base}.tar"):
                if (candidate / "index.json").is_file():
                    return f"oci:{candidate}:{tag or 'latest'}"
                if candidate.is_file():
                    return f"docker-archive:{candidate}"
        bases = " or ".join(name.rpartition("/")[2].partition(":")[0] for name in names)
        raise RowError(
            instance.instance_id, f"unknown image {names[0]!r}: no {bases} (dir or .tar) in {images_dir}"
        )

    def snapshot_for(self, instance: SweBenchInstance) -> Path | None:
        """The local repository snapshot of ``instance`` (None without a snapshot store)."""
        if self.snapshots_dir is None:
            return None
        for candidate in (
            Path(self.snapshots_dir) / instance.instance_id,
            Path(self.snapshots_dir) / f"{instance.instance_id}.tar.gz",
        ):
            if candidate.exists():
                return candidate.resolve()
        if self.images_dir is not None:
            return None  # the image's repository path serves
        raise RowError(
            instance.instance_id, f"no snapshot {instance.instance_id}[.tar.gz] in {self.snapshots_dir}"
        )


_TRANSPORTS = ("oci", "docker-archive")  # images.json values naming a layout or archive path explicitly


def _resolve_reference(reference: str, images_dir: Path, instance_id: str) -> str:
    try:
        transport, path, tag = parse_reference(reference)
    except ImageError as exc:
        raise RowError(instance_id, str(exc)) from None
    if not path.is_absolute():
        path = images_dir / path
    if not path.exists():
        raise RowError(instance_id, f"unknown image {reference!r}: {path} does not exist")
    return f"oci:{path}:{tag}" if transport == "oci" else f"docker-archive:{path}"


def swebench_image_name(instance_id: str) -> str:
    """SWE-bench's instance image name (Docker Hub names are lower case without ``__``: it becomes ``_1776_``)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.lower().replace('__', '_1776_')}:latest"


def swegym_image_name(instance_id: str) -> str:
    """SWE-Gym's instance image name (as OpenHands pulls it: ``__`` becomes ``_s_``)."""
    return f"xingyaoww/sweb.eval.x86_64.{instance_id.lower().replace('__', '_s_')}:latest"


@dataclass(frozen=True, kw_only=True)
class SweBenchTask:
    """A SWE-bench-format instance as a Rein task (implements ``components.protocols.Task``)."""

    instance: SweBenchInstance
    image: str | None  # skopeo-style reference; None: the host's root with this interpreter
    snapshot_source: Path | None  # a local repository snapshot; None: the image's ``repo_path``
    repo_path: str = DEFAULT_REPO_PATH
    cache_dir: Path = DEFAULT_TASK_CACHE
    image_cache: ImageCache | None = field(default=None, compare=False)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    # Host paths bound read-only: without an image, this interpreter (its venv leads PATH).
    tool_paths: tuple[str, ...] = ()

    def __hash__(self) -> int:
        return hash((self.instance, self.image, self.snapshot_source))

    @property
    def task_id(self) -> str:
        return self.instance.instance_id

    @property
    def problem_statement(self) -> str:
        return self.instance.problem_statement

    @property
    def test_command(self) -> str:
        """How the instance's tests run (the grader's command; shown to agents as a hint)."""
        return self.instance.test_command

    def unpacked_image(self) -> UnpackedImage | None:
        """The task's image, unpacked on first use (None without one)."""
        if self.image is None:
            return None
        return (self.image_cache or ImageCache()).unpack(self.image)

    def snapshot(self) -> TaskSnapshot:
        """The agent's starting repository (flattened history, no ``test_patch``), materialised once."""
        source = self.snapshot_source
        if source is None:
            unpacked = self.unpacked_image()
            assert unpacked is not None  # a task without image has a snapshot (loader invariant)
            source = unpacked.path(self.repo_path)  # resolved inside the image, never through the host
            if not source.is_dir():
                raise ValueError(f"{self.task_id}: image {self.image} has no repository at {self.repo_path}")
        return _materialise(
            self.task_id, source, self.cache_dir, keep_history=bool(self.instance.eval_script)
        )

    def sandbox_spec(self) -> SandboxSpec:
        """The agent's sandbox: the image (or the host root), the flattened repository, no network."""
        unpacked = self.unpacked_image()
        if unpacked is not None:
            env = {key: value for key, value in unpacked.env.items() if key not in ("HOME", "USER")}
            # SWE-bench / SWE-Gym images keep the repository's environment in the conda env "testbed", which
            # their own scripts activate; leading PATH with it gives agents and tests the same interpreter.
            if unpacked.path(f"{SWEBENCH_CONDA_ENV}/bin").is_dir():
                env["PATH"] = f"{SWEBENCH_CONDA_ENV}/bin:{env.get('PATH', SYSTEM_PATH)}"
        else:
            env = {"PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}"}
        return SandboxSpec(
            workspace_source=self.snapshot().workspace_dir,
            read_only_paths=self.tool_paths if unpacked is None else (),
            limits=self.limits,
            proxy_url=None,
            env=env,
            root_image=self.image,
        )

    async def run_setup(self, sandbox: Sandbox) -> None:
        """SWE-bench images come ready to test; nothing to run. (Kept for the runner's task contract.)"""
        result = await sandbox.exec(["test", "-d", ".git"])
        if result.exit_code != 0:
            raise SandboxError(
                f"task {self.task_id}: workspace has no repository", sandbox_id=sandbox.sandbox_id
            )


def _materialise(task_id: str, source: Path, cache_dir: Path, *, keep_history: bool = False) -> TaskSnapshot:
    """Copy ``source`` into the cache once: flattened to one commit, or (``keep_history``, for rows whose
    ``eval_script`` checks out the data set's base commit) with its history up to HEAD and nothing else."""
    stat = source.stat()
    identity = f"{source}\0{stat.st_mtime_ns}\0{stat.st_size}\0{keep_history}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    target = Path(cache_dir) / task_id / key
    commit_file = target / "base_commit"
    if not commit_file.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        try:
            if keep_history:
                if not (source / ".git").is_dir():
                    raise ValueError(f"{task_id}: eval_script needs the repository's git history at {source}")
                _require_self_contained_git(task_id, source / ".git")
                shutil.copytree(source, building / "workspace", symlinks=True)
                base_commit = _prune_to_head(building / "workspace")
            else:
                _copy_repo(source, building / "workspace")
                base_commit = _flatten_git(building / "workspace")
            (building / "base_commit").write_text(base_commit + "\n")
            try:
                os.replace(building, target)
            except OSError:
                if not commit_file.is_file():  # not a concurrent build that won the race
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return TaskSnapshot(workspace_dir=target / "workspace", base_commit=commit_file.read_text().strip())


def _require_self_contained_git(task_id: str, git_dir: Path) -> None:
    """The host runs git on a copy of an image's repository: its git directory must be a plain directory that
    names no other place (a symlink anywhere in it, ``commondir`` or ``objects/info/alternates`` would have the
    host's git read or rewrite files outside the image)."""
    outside = [
        str(path)
        for path in (git_dir, git_dir / "commondir", git_dir / "objects" / "info" / "alternates")
        if path.is_symlink() or (path != git_dir and path.exists())
    ]
    outside += [str(path) for path in git_dir.rglob("*") if path.is_symlink()]
    if outside:
        raise ImageLayoutError(
            f"{task_id}: the repository's git directory points outside the image: {outside[:5]}"
        )


# Options for git run by the host in a repository the image wrote: no hook, fsmonitor, attributes file or
# ownership check applies (with ``_own_git_config`` nothing else in the image names a command git would run).
UNTRUSTED_REPO_GIT_OPTIONS = (
    "-c", "safe.directory=*",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.attributesFile=/dev/null",
    "-c", "core.pager=cat",
)  # fmt: skip


def _own_git_config(git_dir: Path) -> None:
    """Replace the image's ``.git/config`` (and the files git reads beside it) by one the host wrote.

    The repository's config is where commands live (``core.fsmonitor``, ``filter.*.smudge``/``clean``,
    ``core.sshCommand``, ``diff.external``, ``alias.*``, ``include.path``, ``core.worktree``...): none of it
    is the image's to say. Only the object format is kept (a SHA-256 repository stays readable)."""
    object_format = subprocess.run(
        ["git", "config", "--file", str(git_dir / "config"), "--get", "extensions.objectformat"],
        cwd="/", env=_untrusted_git_env(), capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    if object_format not in ("", "sha1", "sha256"):
        raise ImageLayoutError(f"{git_dir}: unknown extensions.objectformat {object_format!r}")
    version = 1 if object_format else 0
    config = f"[core]\n\trepositoryformatversion = {version}\n\tfilemode = true\n\tbare = false\n"
    if object_format:
        config += f"[extensions]\n\tobjectformat = {object_format}\n"
    for name in ("config", "config.worktree", "info/attributes"):
        (git_dir / name).unlink(missing_ok=True)
    (git_dir / "config").write_text(config)


def _untrusted_git_env() -> dict[str, str]:
    """``_git_env`` without the host's system attributes, prompts, pagers or editors."""
    return {
        **_git_env(),
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "GIT_EDITOR": "true",
        "GIT_NO_REPLACE_OBJECTS": "1",
    }


def _prune_to_head(workspace: Path) -> str:
    """Keep HEAD's history and nothing else (no remotes, other branches, tags, stashes or reflog), so that no
    later commit - the fix - is reachable. Returns HEAD's commit.

    The repository came from an image: its config is replaced by the host's before git reads it, and git runs
    with hooks, fsmonitor and attributes off (``UNTRUSTED_REPO_GIT_OPTIONS``)."""
    _own_git_config(workspace / ".git")
    env = _untrusted_git_env()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *UNTRUSTED_REPO_GIT_OPTIONS, *args],
            cwd=workspace, env=env, check=True, capture_output=True, text=True, timeout=1800,
            stdin=subprocess.DEVNULL,
        ).stdout  # fmt: skip

    head = git("rev-parse", "HEAD").strip()
    git("checkout", "-q", "--detach")
    for ref in git("for-each-ref", "--format=%(refname)").split():
        git("update-ref", "-d", ref)
    git("update-ref", "refs/heads/main", head)
    git("symbolic-ref", "HEAD", "refs/heads/main")
    git("reflog", "expire", "--expire=now", "--all")
    git("gc", "-q", "--prune=now")
    return head


# ----------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RejectedRow:
    """A row the loader skipped, and why."""

    instance_id: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class SweBenchLoad:
    """What a data set file gave: usable tasks and the rows skipped with their reasons."""

    tasks: list[SweBenchTask]
    rejected: list[RejectedRow]


def load_swebench(
    path: str | Path,
    sources: RepoSources,
    *,
    check_patches: bool = True,
    limits: SandboxLimits | None = None,
    row_converter: RowConverter | None = None,
) -> SweBenchLoad:
    """Load a SWE-bench-format file (Parquet or JSONL) into tasks; bad rows are rejected, never raised.

    ``check_patches``: for repositories from local snapshots, check that ``patch`` and ``test_patch`` apply
    (``git apply --check``); a repository inside an image is checked by ``--check`` (unpacking every image
    of a large set at load time would cost more than the run's first steps). ``row_converter``: maps a foreign row (R2E-Gym) to a
    SWE-bench row first (``components.tasks.swebench_r2e.r2e_row``).
    """
    tasks: list[SweBenchTask] = []
    rejected: list[RejectedRow] = []
    seen: set[str] = set()
    for row_number, row in enumerate(read_rows(Path(path)), start=1):
        try:
            if "__error__" in row:
                raise RowError(f"<row {row_number}>", str(row["__error__"]))
            if row_converter is not None:
                row = row_converter(row)
            instance = instance_from_row(row, row_number=row_number)
            if instance.instance_id in seen:
                raise RowError(instance.instance_id, "instance_id used by an earlier row")
            seen.add(instance.instance_id)
            task = _task_for(instance, sources, limits)
            if check_patches and task.snapshot_source is not None:
                _check_patches(task)
        except RowError as error:
            rejected.append(RejectedRow(instance_id=error.instance_id, reason=error.reason))
            continue
        except (ImageError, OSError, ValueError) as error:
            instance_id = row.get("instance_id") if isinstance(row, dict) else None
            rejected.append(
                RejectedRow(instance_id=str(instance_id or f"<row {row_number}>"), reason=str(error))
            )
            continue
        tasks.append(task)
    return SweBenchLoad(tasks=tasks, rejected=rejected)


def _task_for(instance: SweBenchInstance, sources: RepoSources, limits: SandboxLimits | None) -> SweBenchTask:
    image = sources.image_for(instance)
    snapshot = sources.snapshot_for(instance)
    return SweBenchTask(
        instance=instance,
        image=image,
        snapshot_source=snapshot,
        repo_path=sources.repo_path,
        cache_dir=sources.cache_dir,
        image_cache=sources.image_cache,
        tool_paths=python_tool_paths() if image is None else (),
        limits=SandboxLimits() if limits is None else limits,
    )


def _check_patches(task: SweBenchTask) -> None:
    workspace = task.snapshot().workspace_dir
    for name in ("patch", "test_patch"):
        diff = getattr(task.instance, name)
        if not diff.strip():
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".diff", delete=False) as handle:
            handle.write(diff if diff.endswith("\n") else diff + "\n")
        try:
            result = subprocess.run(
                ["git", *UNTRUSTED_REPO_GIT_OPTIONS, "apply", "--check", "--whitespace=nowarn", handle.name],
                cwd=workspace,
                env=_untrusted_git_env(),
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.unlink(handle.name)
        if result.returncode != 0:
            raise RowError(task.task_id, f"{name} does not apply: {result.stderr.strip()[-500:]}")


def load_task_set(
    tasks: str,
    *,
    images: Path | None = None,
    snapshots: Path | None = None,
    image_cache_dir: Path | None = None,
    check_patches: bool = True,
) -> SweBenchLoad:
    """``swebench:PATH`` or ``r2e:PATH`` (Parquet / JSONL) with an image store and/or a snapshot store."""
    kind, _, path = tasks.partition(":")
    if kind not in ("swebench", "r2e") or not path:
        raise ValueError(f"tasks: expected 'swebench:PATH' or 'r2e:PATH', got {tasks!r}")
    sources = RepoSources(
        images_dir=images,
        snapshots_dir=snapshots,
        image_cache=ImageCache(image_cache_dir) if image_cache_dir else None,
    )
    converter = r2e_row if kind == "r2e" else None
    return load_swebench(Path(path), sources, check_patches=check_patches, row_converter=converter)


# ----------------------------------------------------------------------------------------------------------
# R2E-Gym rows
# ----------------------------------------------------------------------------------------------------------

R2E_LOG_PARSER = "r2e"  # not one of swebench's: R2E-Gym's own pytest summary parser (parse_r2e_log)
R2E_TESTS_PATH = "/r2e_tests"  # where R2E-Gym images keep the hidden tests (hide it from agents)
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")


def parse_r2e_log(log: str) -> dict[str, str]:
    """R2E-Gym's test-name -> status map from a ``pytest -rA`` log: the summary block only, each line's
    ``::``-separated parts after the file joined with ``.``, a `` - reason`` suffix dropped (r2egym's
    ``parse_log_pytest``, re-implemented: the r2egym package is not on PyPI)."""
    text = _ANSI.sub("", log or "")
    if "short test summary info" not in text:
        return {}
    statuses: dict[str, str] = {}
    for line in text.split("short test summary info", 1)[1].splitlines():
        for status in ("PASSED", "FAILED", "ERROR"):
            if status in line:
                statuses[".".join(line.split("::")[1:]).split(" - ")[0].strip()] = status
                break
    return statuses


def r2e_row(row: Mapping[str, object]) -> dict[str, object]:
    """An R2E-Gym row (``repo_name, docker_image, commit_hash, parsed_commit_content, problem_statement,
    expected_output_json, execution_result_content, …``) as a SWE-bench-format row.

    FAIL_TO_PASS = tests R2E expects PASSED that did not pass at the parent commit (its own pre-fix log,
    ``execution_result_content.old_commit_res_stdout``); PASS_TO_PASS = the other expected-PASSED tests. The
    tests run as R2E-Gym runs them: ``/r2e_tests`` linked into the repository and ``bash run_tests.sh``.
    Differences from R2E-Gym's own reward, stated: tests it expects to FAIL are not checked (R2E demands the
    exact status map), and ``patch`` is empty — the gold fix lives in ``parsed_commit_content``, r2egym's own
    structure, which is not converted — so ``--check`` cannot verify gold for R2E rows.
    """
    label = str(row.get("docker_image") or row.get("commit_hash") or "<r2e row>")
    for name in ("repo_name", "docker_image", "problem_statement", "expected_output_json"):
        if not row.get(name):
            raise RowError(label, f"R2E-Gym field {name!r} is missing")
    try:
        expected = {
            _ANSI.sub("", key).split(" - ")[0]: value
            for key, value in json.loads(row["expected_output_json"]).items()
        }
        commit = json.loads(row["parsed_commit_content"]) if row.get("parsed_commit_content") else {}
        execution = json.loads(row["execution_result_content"]) if row.get("execution_result_content") else {}
    except (ValueError, TypeError, AttributeError) as exc:
        raise RowError(label, f"R2E-Gym JSON column unreadable: {exc}") from None
    before = parse_r2e_log(execution.get("old_commit_res_stdout", ""))
    passing = [name for name, status in expected.items() if status == "PASSED"]
    fail_to_pass = [name for name in passing if before.get(name) != "PASSED"]
    image_name = str(row["docker_image"])
    tag = image_name.rpartition(":")[2]
    known = {"repo_name", "docker_image", "commit_hash", "problem_statement", "expected_output_json"}
    converted: dict[str, object] = {
        "instance_id": re.sub(
            r"[^A-Za-z0-9._-]", "_", f"r2e__{row['repo_name']}-{tag or row.get('commit_hash', '')}"
        ),
        "repo": str(row["repo_name"]),
        "base_commit": str(commit.get("old_commit_hash", "")),
        "patch": "",  # not converted: see the docstring
        "test_patch": "",
        "problem_statement": str(row["problem_statement"]),
        "FAIL_TO_PASS": json.dumps(fail_to_pass),
        "PASS_TO_PASS": json.dumps([name for name in passing if name not in fail_to_pass]),
        "image_name": image_name,
        "test_cmd": f"rm -rf r2e_tests && ln -s {R2E_TESTS_PATH} r2e_tests && bash run_tests.sh",
        "log_parser": R2E_LOG_PARSER,
        "commit_hash": str(row.get("commit_hash", "")),
    }
    converted.update({key: value for key, value in row.items() if key not in known})
    return converted


class SnapshotPrefetcher:
    """Materialises tasks' workspaces (unpacking their images first) in a background thread, in task order, so
    that a rollout rarely waits on a first unpack (which would hold up its event loop). Errors are left for the
    rollout that uses the task to report."""

    def __init__(self, tasks: list[SweBenchTask]) -> None:
        self._tasks = list(tasks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swebench-prefetch", daemon=True)
        self.num_prepared = 0

    def start(self) -> SnapshotPrefetcher:
        """Begin in the background; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the task in progress."""
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the thread (tests)."""
        self._thread.join(timeout_s)

    def _run(self) -> None:
        for task in self._tasks:
            if self._stop.is_set():
                return
            try:
                task.snapshot()
            except (OSError, ValueError):  # reported by the rollout that uses the task
                continue
            self.num_prepared += 1
