"""Tamper-proof grading of SWE-style tasks: the agent's diff, replayed in a fresh sandbox, against hidden tests.

How a verdict is reached (``SweGrader.score``):
1. In the agent's sandbox, ``git add -A`` and ``git diff --cached --binary <base commit>``: the agent's whole
   change (new files included) against the flattened commit, whatever it committed meanwhile. Git runs with
   hooks, external diff drivers, text conversion and prefix options switched off.
2. A **fresh** sandbox from the pristine buggy snapshot, without network; ``setup_commands``; the diff is
   applied with ``git apply``.
3. ``grading_runner.py`` (see its docstring) runs there as an *observer* that no code of the agent can reach:
   it scans the patched tree (every file that differs from the base commit, whatever its name, git attributes
   or encoding), removes test infrastructure, restores the agent's own test and pytest-config files, then
   starts the *code-under-test process* (the only one that imports the agent's code) and the *test process*
   (pytest, hidden tests compiled from memory: never on disk; the agent's modules reached only through a
   bridge to the other process), collects one event per test phase over a socket only the test process holds,
   kills every process of the sandbox, and prints its verdict authenticated with a per-verdict secret (HMAC).
   The exit code, files in the sandbox and any other output are never trusted.
4. Reward = 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed (setup, call and teardown); a test that
   never reported (the process died or hung) is not passed. With ``partial_credit``: the fraction passed.

Whose fault is it? Failures the agent caused earn **reward 0** with the reason in ``log``: an empty diff, a
diff that does not apply, a git repository the agent broke, a test run its code cut short, hung, or ended by
killing or stopping the observer (started, but no authenticated verdict). Failures of the machinery return
``RewardResult(reward=None, error=...)``: a sandbox that cannot be created or dies (``SandboxError``), git or
Python missing, an observer that never started or failed itself. Suspicious edits are *flagged* in ``log``
with a ``FLAGGED:`` line.

The agent's code runs in a process of its own, not in pytest's (``grading_runner.py``, step 4): what it can
write there (events, frames, pytest's objects, its own exit) is not what decides. The tree scan stays as a
second line: with ``reject_test_runner_tampering`` (default) any added line naming pytest/_pytest/pluggy in any
changed file earns 0, and with ``reject_interpreter_tampering`` (default) so does any added line reaching into
the interpreter (``sys.modules``, ``builtins``, frame/GC walking, tracing hooks, ``ctypes``, ``os.kill``,
``/proc``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from components.config import require, require_positive
from components.errors import GradingError, SandboxError
from components.protocols import ExecResult, RewardResult, Sandbox, SandboxLimits, SandboxSpec, Task
from components.tasks.swe import SweTask, python_tool_paths

SandboxFactory = Callable[[SandboxSpec], Awaitable[Sandbox]]


@runtime_checkable
class SandboxSource(Protocol):
    """A pool-like provider (``sandboxes.provider.SandboxProvider``): ``acquire(spec)`` then ``release``."""

    async def acquire(self, spec: SandboxSpec | None = None) -> Sandbox: ...

    async def release(self, sandbox: Sandbox) -> None: ...


_RUNNER_SOURCE = (Path(__file__).with_name("grading_runner.py")).read_text(encoding="utf-8")
STARTED_PREFIX = "REIN-GRADER-STARTED"  # as grading_runner.py (standalone: it cannot import this module)
VERDICT_PREFIX = "REIN-GRADER-VERDICT"
# Git options that keep a repository the agent controlled from changing what the diff says.
_SAFE_GIT = (
    "git",
    "-c",
    "safe.directory=*",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "diff.noprefix=false",
    "-c",
    "diff.mnemonicPrefix=false",
    "-c",
    "diff.relative=false",
    "-c",
    "core.quotePath=true",
)
# Patterns for the tree scan (searched in the lines each changed file adds, as bytes, in the sandbox).
TEST_RUNNER_PATTERN = r"\b(_pytest|pytest|pluggy)\b"
INTERPRETER_PATTERN = (
    r"(\bos\._exit\b|\bsys\.exit\b|\bSystemExit\b|\bsys\.modules\b|\b__import__\b|\bimportlib\b|"
    r"\bsys\._getframe\b|\bgc\.get_\w+|\binspect\.(stack|currentframe|getouterframes)\b|\bctypes\b|"
    r"\bbuiltins\b|\b__builtins__\b|\bsys\.set(trace|profile)\b|\bthreading\.set(trace|profile)\b|"
    r"\bos\.kill(pg)?\b|\bsignal\.|/proc/)"
)
# The reaches in-process forging needs (reward 0 with ``reject_interpreter_tampering``); the other
# interpreter patterns (exits, dynamic imports) are only flagged: legitimate code uses them.
_REJECTED_REACH = re.compile(
    r"(\bsys\.modules\b|\bsys\._getframe\b|\bgc\.get_\w+|\binspect\.(stack|currentframe|getouterframes)\b|"
    r"\bctypes\b|\bbuiltins\b|\b__builtins__\b|\bsys\.set(trace|profile)\b|\bthreading\.set(trace|profile)\b|"
    r"\bos\.kill(pg)?\b|\bsignal\.|/proc/)"
)
# Diff-text rules, kept for graders that only have a diff (``flag_suspicious_diff``).
_TEST_RUNNER_CODE = re.compile(r"^\+(?!\+\+).*\b(_pytest|pytest|pluggy)\b")
# Added lines of non-test code that exit the process or reach into the interpreter: flagged.
_SUSPICIOUS_CODE = re.compile(
    r"^\+(?!\+\+).*(\bos\._exit\b|\bsys\.exit\b|\bSystemExit\b|\bsys\.modules\b|\b__import__\b|"
    r"\bimportlib\b|\bsys\._getframe\b|\bgc\.get_objects\b|\binspect\.stack\b|\bctypes\b|\bbuiltins\b)"
)


@dataclass(frozen=True, kw_only=True)
class SweGraderConfig:
    """How ``SweGrader`` runs the hidden tests."""

    # Reward = fraction of FAIL_TO_PASS + PASS_TO_PASS tests passed, instead of all-or-nothing.
    partial_credit: bool = False
    # Wall-clock limit of the whole hidden-test run (a patch that hangs the tests earns 0).
    test_timeout_s: float = 300.0
    # Limit for each git / setup step.
    step_timeout_s: float = 60.0
    # The interpreter that runs pytest inside the grading sandbox (visible there through ``tool_paths``).
    python_executable: str = sys.executable
    tool_paths: tuple[str, ...] = field(default_factory=python_tool_paths)
    # Reward 0 when a changed file adds a line naming pytest / _pytest / pluggy (the agent's own test files
    # are restored to the base, so this is library code): code under test runs inside pytest's process.
    reject_test_runner_tampering: bool = True
    # Reward 0 when a changed file adds a line reaching into the interpreter the way forging needs
    # (``sys.modules``, ``builtins``, frames, GC, tracing, ``ctypes``, ``os.kill``, ``/proc``).
    reject_interpreter_tampering: bool = True
    # How long the in-sandbox observer may take beyond ``test_timeout_s`` (scan, kill, verdict).
    observer_grace_s: float = 60.0
    # pytest plugins to enable explicitly (entry-point autoloading is off during grading).
    pytest_plugins: tuple[str, ...] = ()
    limits: SandboxLimits = field(default_factory=SandboxLimits)

    def __post_init__(self) -> None:
        require_positive(self.test_timeout_s, "test_timeout_s")
        require_positive(self.step_timeout_s, "step_timeout_s")
        require_positive(self.observer_grace_s, "observer_grace_s")
        require(bool(self.python_executable), "python_executable", "must name an interpreter")


@dataclass(frozen=True, kw_only=True)
class HiddenTestRun:
    """What the hidden-test run produced: per-test outcomes (None when no report was written)."""

    outcomes: dict[str, str] | None  # None: no authenticated verdict
    started: bool  # the observer printed its authenticated start line
    exit_code: int
    timed_out: bool
    output_tail: str
    neutralised: tuple[str, ...] = ()  # test infrastructure removed, agent test/config files restored
    test_runner_lines: tuple[str, ...] = ()  # "path: line" added lines naming the test runner
    interpreter_lines: tuple[str, ...] = ()  # "path: line" added lines reaching into the interpreter
    observer_error: str = ""
    tampered: tuple[str, ...] = ()  # pytest/pluggy/builtins objects the code under test changed
    finished: bool = False  # the test process itself reported the end of its pytest session
    foreign_events: int = 0  # events sent by other processes (forks of the test process): ignored
    survivors: bool = False  # processes kept appearing while the observer killed them all
    collection_errors: tuple[str, ...] = ()  # "nodeid: text" of each file that failed to import or collect
    flooded: bool = False  # the test process sent more events than the observer keeps
    skipped: str = ""  # why the observer ran no tests (the tree references the test runner or is unscannable)


class SweGrader:
    """Implements ``components.protocols.Reward`` for :class:`SweTask` (see the module docstring)."""

    def __init__(
        self, sandboxes: SandboxFactory | SandboxSource, config: SweGraderConfig | None = None
    ) -> None:
        """``sandboxes``: a factory (``BwrapSandbox.create``: a brand-new sandbox per verdict, closed after) or a
        provider with ``acquire``/``release`` (a ``SandboxPool``, whose reset kills every process and empties
        the workspace, /tmp and $HOME before reuse)."""
        self.sandboxes = sandboxes
        self.config = config or SweGraderConfig()

    async def _acquire(self, spec: SandboxSpec) -> Sandbox:
        if isinstance(self.sandboxes, SandboxSource):
            return await self.sandboxes.acquire(spec)
        return await self.sandboxes(spec)

    async def _release(self, sandbox: Sandbox) -> None:
        if isinstance(self.sandboxes, SandboxSource):
            await self.sandboxes.release(sandbox)
        else:
            await sandbox.close()

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        """Grade what the agent left in ``agent_sandbox``."""
        if not isinstance(task, SweTask):
            raise TypeError(f"SweGrader grades SweTask, got {type(task).__name__}")
        try:
            diff = await self.extract_diff(task, agent_sandbox)
        except _AgentFault as fault:
            return RewardResult(reward=0.0, log=f"agent's repository unusable: {fault}")
        except (SandboxError, GradingError) as error:
            return RewardResult(
                reward=None,
                error=f"reading the agent's diff failed: {error}",
                error_kind=error_kind_of(error),
            )
        return await self.grade_patch(task, diff)

    async def grade_patch(self, task: SweTask, patch: str) -> RewardResult:
        """Grade ``patch`` (a unified diff against the buggy snapshot) in a fresh sandbox."""
        log: list[str] = [f"diff: {len(patch.splitlines())} lines"]
        try:
            report = await self.run_hidden_tests(task, patch)
        except _AgentFault as fault:
            log.append(str(fault))
            return RewardResult(reward=0.0, log="\n".join(log))
        except (SandboxError, GradingError, OSError) as error:
            return RewardResult(
                reward=None,
                log="\n".join(log),
                error=f"{type(error).__name__}: {error}",
                error_kind=error_kind_of(error),
            )
        if not report.started:
            return RewardResult(
                reward=None,
                log="\n".join(log),
                error=f"test runner did not start (exit {report.exit_code}): {report.output_tail[-1500:]}",
                error_kind="observer",
            )
        if report.observer_error:
            return RewardResult(
                reward=None,
                log="\n".join(log),
                error=f"the grader's observer failed: {report.observer_error}",
                error_kind="observer",
            )
        if report.neutralised:
            log.append(
                "FLAGGED: removed test infrastructure / restored the agent's test and config files: "
                + ", ".join(report.neutralised[:20])
            )
        log.extend(
            f"FLAGGED: {line.split(': ', 1)[0]} {_TAMPERING}: {line}" for line in report.test_runner_lines
        )
        rejected_reach = [line for line in report.interpreter_lines if _REJECTED_REACH.search(line)]
        log.extend(
            f"FLAGGED: exits the process or reaches into the interpreter: {line}"
            for line in report.interpreter_lines
        )
        if report.tampered:
            log.append(
                "reward 0: the test runner or builtins changed while the tests ran: "
                + ", ".join(report.tampered)
            )
            return RewardResult(reward=0.0, log="\n".join(log))
        if self.config.reject_test_runner_tampering and report.test_runner_lines:
            log.append("reward 0: the patched code reaches into the test runner")
            return RewardResult(reward=0.0, log="\n".join(log))
        if self.config.reject_interpreter_tampering and rejected_reach:
            log.append("reward 0: the patched code reaches into the interpreter the way forging needs")
            return RewardResult(reward=0.0, log="\n".join(log))
        if report.survivors:
            log.append("processes of the code under test outlived the observer's kill loop")
            return RewardResult(reward=0.0, log="\n".join(log))
        if report.flooded:
            log.append("the test process flooded the observer's channel with events")
            return RewardResult(reward=0.0, log="\n".join(log))
        if report.timed_out:
            log.append(f"hidden tests timed out after {self.config.test_timeout_s:.0f}s")
            return RewardResult(reward=0.0, log="\n".join(log))
        if report.outcomes is None and report.skipped:
            log.append(f"reward 0: no tests ran: {report.skipped}")
            return RewardResult(reward=0.0, log="\n".join(log))
        if report.outcomes is None:
            log.append(
                f"no verdict from the grader's observer (exit {report.exit_code}): the code under test killed "
                f"or stopped it\n{report.output_tail[-1500:]}"
            )
            return RewardResult(reward=0.0, log="\n".join(log))
        if report.foreign_events:
            log.append(
                f"FLAGGED: {report.foreign_events} test events from processes other than the test process"
            )
        reward, summary = compute_reward(task, report.outcomes, partial_credit=self.config.partial_credit)
        log.append(summary)
        log.extend(collection_error_lines(report))
        if not report.finished:
            log.append(
                f"the test process ended before its session did (exit {report.exit_code}): the tests that did "
                "not report count as failed"
            )
            if not self.config.partial_credit:
                reward = 0.0
        if reward < 1.0 and report.output_tail:
            log.append(f"test output (tail):\n{report.output_tail[-1500:]}")
        return RewardResult(reward=reward, log="\n".join(log))

    async def extract_diff(self, task: SweTask, agent_sandbox: Sandbox) -> str:
        """The agent's change against the flattened commit, new files included (binary-safe)."""
        base_commit = task.snapshot().base_commit
        staged = await self._exec(agent_sandbox, [*_SAFE_GIT, "add", "-A"])
        if staged.exit_code == 127:
            raise GradingError(
                f"git is not available in the agent's sandbox: {staged.stderr[-500:]}", kind="tooling"
            )
        if staged.exit_code != 0:
            raise _AgentFault(f"git add failed (exit {staged.exit_code}): {staged.stderr[-500:]}")
        diff = await self._exec(
            agent_sandbox,
            [
                *_SAFE_GIT,
                "diff",
                "--cached",
                "--binary",
                "--full-index",
                "--no-color",
                "--no-ext-diff",
                "--no-textconv",
                "--no-renames",
                base_commit,
            ],
        )
        if diff.exit_code != 0:
            raise _AgentFault(
                f"git diff against {base_commit} failed (exit {diff.exit_code}): {diff.stderr[-500:]}"
            )
        return diff.stdout

    async def run_hidden_tests(self, task: SweTask, patch: str) -> HiddenTestRun:
        """Fresh sandbox from the pristine snapshot → setup → apply ``patch`` → hidden tests → report."""
        spec = SandboxSpec(
            workspace_source=task.snapshot().workspace_dir,
            read_only_paths=self.config.tool_paths,
            limits=self.config.limits,
            proxy_url=None,  # no network while grading
        )
        sandbox = await self._acquire(spec)
        try:
            await task.run_setup(sandbox)
            grader_dir = f"/tmp/rein-grade-{secrets.token_hex(8)}"
            await self._checked(sandbox, ["mkdir", "-p", grader_dir], "creating the grader directory")
            if patch.strip():
                await sandbox.write_file(f"{grader_dir}/agent.patch", patch)
                applied = await self._exec(
                    sandbox, [*_SAFE_GIT, "apply", "--whitespace=nowarn", f"{grader_dir}/agent.patch"]
                )
                if applied.exit_code == 127:
                    raise GradingError(
                        f"git is not available in the grading sandbox: {applied.stderr[-500:]}",
                        kind="tooling",
                    )
                if applied.exit_code != 0:
                    raise _AgentFault(f"the agent's diff does not apply: {applied.stderr.strip()[-1000:]}")
            return await self._run_runner(sandbox, task, grader_dir)
        finally:
            await self._release(sandbox)

    def runner_bundle(self, task: SweTask, nonce: str) -> dict:
        """What the in-sandbox observer gets (deleted by it before any code of the agent runs)."""
        return {
            "nonce": nonce,
            "workspace": "/workspace",
            "hidden_tests": dict(task.hidden_tests),
            "plugins": list(self.config.pytest_plugins),
            "timeout_s": self.config.test_timeout_s,
            "test_runner_pattern": TEST_RUNNER_PATTERN,
            "interpreter_pattern": INTERPRETER_PATTERN,
            "skip_tests_on_tampering": self.config.reject_test_runner_tampering,
        }

    runner_source = _RUNNER_SOURCE

    async def _run_runner(self, sandbox: Sandbox, task: SweTask, grader_dir: str) -> HiddenTestRun:
        nonce = secrets.token_hex(32)
        await sandbox.write_file(f"{grader_dir}/runner.py", self.runner_source)
        await sandbox.write_file(f"{grader_dir}/bundle.json", json.dumps(self.runner_bundle(task, nonce)))
        result = await sandbox.exec(
            [
                self.config.python_executable,
                "-I",
                "-B",
                f"{grader_dir}/runner.py",
                f"{grader_dir}/bundle.json",
            ],
            timeout_s=self.config.test_timeout_s + self.config.observer_grace_s,
            env={"PYTHONHASHSEED": "0"},
        )
        started = any(_verify(nonce, STARTED_PREFIX, line) is not None for line in result.stdout.splitlines())
        verdicts = [_verify(nonce, VERDICT_PREFIX, line) for line in result.stdout.splitlines()]
        verdicts = [verdict for verdict in verdicts if verdict is not None]
        # The observer prints exactly one; more means the nonce leaked, and none of them is trusted.
        verdict = verdicts[0] if len(verdicts) == 1 else None
        output_tail = (result.stdout + result.stderr)[-4000:]
        if verdict is None:
            return HiddenTestRun(
                outcomes=None,
                started=started,
                exit_code=result.exit_code,
                timed_out=result.timed_out,
                output_tail=output_tail,
            )
        scan = verdict.get("scan") or {}
        return HiddenTestRun(
            outcomes=None if verdict.get("skipped") else dict(verdict.get("outcomes") or {}),
            started=started,
            exit_code=result.exit_code,
            timed_out=bool(verdict.get("timed_out")) or result.timed_out,
            output_tail=str(verdict.get("output_tail", "")),
            neutralised=tuple(scan.get("removed", ())) + tuple(scan.get("restored", ())),
            test_runner_lines=tuple(scan.get("test_runner", ())),
            interpreter_lines=tuple(scan.get("interpreter", ())),
            observer_error=str(verdict.get("observer_error", "")),
            tampered=tuple(str(name) for name in verdict.get("tampered") or ()),
            finished=bool(verdict.get("finished")),
            foreign_events=int(verdict.get("foreign_events") or 0),
            survivors=bool(verdict.get("survivors")),
            flooded=bool(verdict.get("flooded")),
            skipped=str(verdict.get("skipped") or ""),
            collection_errors=tuple(
                f"{error.get('nodeid', '')}: {error.get('text', '')}"
                for error in verdict.get("collection_errors") or ()
                if isinstance(error, dict)
            ),
        )

    async def _exec(self, sandbox: Sandbox, command: list[str]) -> ExecResult:
        return await sandbox.exec(command, timeout_s=self.config.step_timeout_s)

    async def _checked(self, sandbox: Sandbox, command: list[str], what: str) -> ExecResult:
        result = await self._exec(sandbox, command)
        if result.exit_code != 0:
            raise GradingError(
                f"{what} failed (exit {result.exit_code}): {result.stderr[-500:]}", kind="sandbox"
            )
        return result


_TAMPERING = "references the test runner"


def collection_error_lines(run: HiddenTestRun) -> list[str]:
    """One log line per test file that failed to import or collect, with pytest's own error text."""
    return [f"collection error in {error}" for error in run.collection_errors]


def _verify(nonce: str, kind: str, line: str) -> dict | None:
    """The payload of an authenticated observer line of ``kind``, or None (forged, garbled, other kind)."""
    prefix, _, rest = line.partition(" ")
    mac, _, body = rest.partition(" ")
    if prefix != kind or not body:
        return None
    expected = hmac.new(nonce.encode(), f"{kind}\n{body}".encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac.encode(), expected.encode()):
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def error_kind_of(error: Exception) -> str:
    """The ``GRADING_ERROR_KINDS`` entry of an exception that ended grading without a verdict."""
    if isinstance(error, SandboxError):
        return "sandbox"
    if isinstance(error, GradingError):
        return error.kind
    return "grader"


class _AgentFault(Exception):
    """Something the agent did makes the grade 0 (not an infrastructure failure)."""


def compute_reward(task: SweTask, outcomes: dict[str, str], *, partial_credit: bool) -> tuple[float, str]:
    """Reward from per-test outcomes: 1.0 iff all FAIL_TO_PASS and PASS_TO_PASS passed (or the fraction)."""
    required = (*task.fail_to_pass, *task.pass_to_pass)
    failing = [node_id for node_id in required if outcomes.get(node_id) != "passed"]
    num_passed = len(required) - len(failing)
    num_f2p_passed = sum(outcomes.get(node_id) == "passed" for node_id in task.fail_to_pass)
    summary = (
        f"FAIL_TO_PASS {num_f2p_passed}/{len(task.fail_to_pass)} passed, "
        f"PASS_TO_PASS {num_passed - num_f2p_passed}/{len(task.pass_to_pass)} passed"
    )
    if failing:
        shown = ", ".join(f"{node_id} ({outcomes.get(node_id, 'missing')})" for node_id in failing[:10])
        summary += f"; not passing: {shown}" + (" ..." if len(failing) > 10 else "")
    if partial_credit:
        return num_passed / len(required), summary
    return (1.0 if not failing else 0.0), summary


def flag_suspicious_diff(patch: str) -> list[str]:
    """Reasons to flag a diff: it touches test infrastructure or references pytest/exit calls in code."""
    reasons: list[str] = []
    touched = re.findall(r"^diff --git a/(\S+) b/(\S+)$", patch, re.MULTILINE)
    for _, new_path in touched:
        name = new_path.rsplit("/", 1)[-1]
        if name in _REMOVED_BY_GRADER or name in {"pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}:
            reasons.append(f"diff touches test configuration {new_path}")
        elif name.endswith(".pth"):
            reasons.append(f"diff adds a .pth file {new_path}")
    current_file = ""
    for line in patch.splitlines():
        if line.startswith("+++ "):
            current_file = line[6:] if line.startswith("+++ b/") else ""
        elif _is_library_code(current_file):
            if _TEST_RUNNER_CODE.match(line):
                reasons.append(f"{current_file} {_TAMPERING}: {line[1:].strip()[:120]}")
            elif _SUSPICIOUS_CODE.match(line):
                reasons.append(
                    f"{current_file} exits the process or reaches into the interpreter: {line[1:].strip()[:120]}"
                )
    return reasons


def _is_library_code(path: str) -> bool:
    """A Python file that is neither a test nor infrastructure the grader removes anyway."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".py") and not _is_test_file(path) and name not in _REMOVED_BY_GRADER


_REMOVED_BY_GRADER = {"conftest.py", "sitecustomize.py", "usercustomize.py"}


def _is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.startswith("test_") or name.endswith("_test.py") or "/tests/" in f"/{path}"
