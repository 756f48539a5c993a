"""Grading SWE-bench-format tasks the data set's way, with the project grader's tamper-proofing.

Per verdict (``SweBenchGrader.score``):
1. The agent's diff: read from its sandbox by ``SweGrader.extract_diff`` (``git add -A`` + ``git diff --cached
   --binary`` against the flattened base commit, hooks / diff drivers / prefixes overridden).
2. ``flag_suspicious_diff`` (the project grader's): non-test code reaching for pytest/pluggy earns 0 (when
   ``reject_test_runner_tampering``); other interpreter tricks are flagged in the log.
3. A **fresh** sandbox from the same image and the same base commit (network off), where the diff is applied
   (``git apply``, then SWE-bench's own fallback ``patch --batch --fuzz=5 -p1``; neither applying earns 0).
4. Restore: every path of the agent's patch (as ``git apply --numstat -z`` reads it) that pytest or Python reads
   as its own configuration or start-up code (``grading_runner.read_by_the_test_runner``: ``*.ini``/``*.cfg``/
   ``*.toml``, ``conftest``/``*customize``, ``*.pth``, package metadata, bytecode), every test file the patch
   touched that the row's gold ``patch`` does not, and every file ``test_patch`` touches go back to the base
   commit (or away, if the agent created them); every bytecode cache of the tree is removed; then
   ``test_patch`` (never shown to the agent) is applied. The environment itself is the image's, read-only: an
   agent cannot plant anything in site-packages.
5. A pytest repository's tests (no ``eval_script``, a test command ``python[3] -m pytest ARGS`` or ``pytest
   ARGS``, a pytest-format log parser) run through the project grader's observer
   (``components/tasks/grading_runner.py``, repository mode): the test process sends one event per test phase
   over a socket whose sender pid the kernel stamps, the observer kills every process when the session ends and
   prints its verdict authenticated with a per-verdict secret. The per-test outcomes of that verdict, written
   out as pytest's ``-rA`` summary lines, go through the repository's swebench parser, so test ids map to
   FAIL_TO_PASS / PASS_TO_PASS exactly as swebench maps them. Nothing the tests print is read. The comparisons
   the tests' asserts make are probed (``grading_runner.ProbingComparisons``: a value of a type from a file the
   agent changed that also equals a changed copy of the expected value fails the test). No verdict, a
   session the test process did not finish, a fingerprint change of pytest/pluggy/builtins, or processes that
   outlive the kill loop earn 0.
6. Any other row (the fallback): the instance's test command runs between two random markers (a row with its
   own ``eval_script``, as swebench >= 4 data sets ship, runs that script instead: it restores the tests,
   applies ``test_patch`` and prints swebench's fixed markers, exactly as SWE-bench grades it); the text
   between them is parsed per test id with the ``swebench`` package's own parser for the repository (``PARSER_REGISTRY`` /
   ``MAP_REPO_TO_PARSER_PY``), and ``resolution`` decides: reward 1 iff every FAIL_TO_PASS and PASS_TO_PASS
   test is exactly ``PASSED`` (``RESOLVED_FULL``; stricter than swebench's ``get_eval_tests_report``, which also
   passes ``XFAIL`` and a skipped PASS_TO_PASS); a test missing from the log counts as failed. The exit code is
   never trusted.

Known limits: on the fallback path (SWE-bench's own) the verdict is read from the test output, which code under
test also writes to, so a forged ``PASSED <id>`` line counts; the random markers only stop it from cutting the
parsed region short. On the observer path the code under test still runs inside pytest's process (the
observer's known limit), the repository's own ``conftest.py`` files load before the fingerprint is taken, and
pytest plugins are not autoloaded (``SweBenchGraderConfig.grader.pytest_plugins`` names the ones a repository
needs).

Grading failures (sandbox or image unusable, ``test_patch`` not applying to the restored tree, the test
command not found) are ``RewardResult(reward=None, error=...)``, never a 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import shlex
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from components.errors import SandboxError
from components.protocols import RewardResult, Sandbox, Task
from components.tasks.grading import (
    _TAMPERING,
    INTERPRETER_PATTERN,
    TEST_RUNNER_PATTERN,
    GradingError,
    SandboxFactory,
    SandboxSource,
    SweGrader,
    SweGraderConfig,
    _AgentFault,
    collection_error_lines,
    error_kind_of,
    flag_suspicious_diff,
)
from components.tasks.grading_runner import is_test_file, read_by_the_test_runner
from components.tasks.swe import SweTask
from components.tasks.swebench import R2E_LOG_PARSER, SweBenchTask, parse_r2e_log

_SAFE_GIT = ("git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
_DIFF_PATHS = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# Every bytecode cache of the tree goes before the tests run (they also run with -B / PYTHONDONTWRITEBYTECODE).
_REMOVE_BYTECODE = (
    "find . -path ./.git -prune -o \\( -name __pycache__ -o -name '*.py[co]' \\) -prune -exec rm -rf -- {} +"
)
_NO_BYTECODE = {"PYTHONDONTWRITEBYTECODE": "1"}
# The test command, and each script it names, may name repository files (``bash run_tests.sh``, ``bin/test``,
# ``.venv/bin/python``): words split at blanks, shell punctuation, quotes and ``=``.
_COMMAND_WORD = re.compile(r"[^\s;&|<>()`'\"=,]+")
_MAX_SCRIPT_BYTES = 256 * 1024  # a named file longer than this is not read for further names
_MAX_SCRIPTS_READ = 32
_HARNESS_NAMES = frozenset({"setup.py"})  # not test files by name, but the test harness's to run


# Repositories whose own library code is the test runner: referencing pytest there is the fix, not tampering.
TEST_RUNNER_REPOS = frozenset({"pytest-dev/pytest", "pytest-dev/pluggy"})


@dataclass(frozen=True, kw_only=True)
class SweBenchGraderConfig:
    """How ``SweBenchGrader`` runs an instance's tests."""

    # The project grader's settings, SWE-bench's longer limits: ``test_timeout_s`` bounds the whole test command
    # (a patch that hangs the tests earns 0), ``step_timeout_s`` each git / patch step; ``pytest_plugins``: the
    # plugins the observer path enables with ``-p`` (it turns entry-point autoloading off: a ``*.dist-info`` in
    # the working tree could otherwise load a plugin before the fingerprint is taken); ``observer_grace_s``,
    # ``reject_test_runner_tampering`` as there. Each instance's tests run under its own interpreter, whatever
    # ``python_executable`` says; nothing of the host is mounted (``tool_paths``).
    grader: SweGraderConfig = SweGraderConfig(test_timeout_s=1800.0, step_timeout_s=120.0, tool_paths=())


_INTERPRETER = re.compile(r"python(3(\.\d+)?)?")
_SHELL_SYNTAX = re.compile(r"[;&|<>$`()\n*?\[\]{}~]")
# swebench's outcome names for the observer's per-test outcomes (as pytest -rA prints them).
_SUMMARY_STATUS = {
    "passed": "PASSED",
    "failed": "FAILED",
    "error": "ERROR",
    "skipped": "SKIPPED",
    "xfailed": "XFAIL",
    "xpassed": "XPASS",
    "raised": "FAILED",
    "incomplete": "FAILED",
}
PASSED = "PASSED"  # the only status that passes (swebench also counts XFAIL, and a skipped PASS_TO_PASS)


def _repository_path(word: str) -> str | None:
    """The repository path a command word may name (``./bin/test`` → ``bin/test``, a pytest node id → its
    file), or None for an option, an absolute path or one that leaves the repository."""
    word = word.split("::", 1)[0]
    if not word or word.startswith(("-", "/", "$", "~")):
        return None
    path = PurePosixPath(word)
    if ".." in path.parts or not path.parts or str(path) == ".":
        return None
    return str(path)


def pytest_invocation(task: SweBenchTask) -> tuple[str, list[str]] | None:
    """``(interpreter, pytest arguments)`` when the instance's tests run through the observer, else None.

    Only a plain ``python[3] -m pytest ARGS`` / ``pytest ARGS`` command (no shell syntax), no ``eval_script``,
    and a pytest-format swebench log parser for the repository qualify."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY, parse_log_pytest

    instance = task.instance
    if instance.eval_script or instance.log_parser == R2E_LOG_PARSER:
        return None
    if instance.log_parser:
        parser = PARSER_REGISTRY.get(instance.log_parser)
    else:
        parser = MAP_REPO_TO_PARSER_PY.get(instance.repo, parse_log_pytest)
    if parser is None or not parser.__name__.startswith("parse_log_pytest"):
        return None
    command = task.test_command
    if _SHELL_SYNTAX.search(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if len(words) >= 3 and _INTERPRETER.fullmatch(words[0]) and words[1:3] == ["-m", "pytest"]:
        return words[0], words[3:]
    if words and words[0] == "pytest":
        return "python3", words[1:]
    return None


def summary_log(outcomes: dict[str, str]) -> str:
    """The observer's per-test outcomes as pytest's ``-rA`` short summary (what swebench's parsers read)."""
    return "".join(
        f"{_SUMMARY_STATUS.get(outcome, 'FAILED')} {nodeid}\n" for nodeid, outcome in outcomes.items()
    )


class _RepositoryTestsObserver(SweGrader):
    """The project grader's observer (``grading_runner.py``) in repository mode: the repository's own pytest
    tests, not hidden ones; its ``_run_runner`` (authenticated start and verdict lines) is reused unchanged."""

    def __init__(self, pytest_args: list[str], changed_paths: list[str], config: SweGraderConfig) -> None:
        super().__init__(_no_sandboxes, config)
        self.pytest_args = pytest_args
        self.changed_paths = changed_paths  # the agent's files: their types' comparisons are probed

    def runner_bundle(self, task: SweTask, nonce: str) -> dict:
        return {
            "nonce": nonce,
            "workspace": ".",  # the exec's working directory: the repository, as the test command sees it
            "pytest_args": list(self.pytest_args),
            "changed_paths": list(self.changed_paths),
            "plugins": list(self.config.pytest_plugins),
            "timeout_s": self.config.test_timeout_s,
            "test_runner_pattern": TEST_RUNNER_PATTERN,
            "interpreter_pattern": INTERPRETER_PATTERN,
        }


async def _no_sandboxes(spec):
    raise GradingError("the repository-tests observer runs in the grader's sandbox; it creates none")


def parse_test_log(task: SweBenchTask, log: str) -> dict[str, str]:
    """Per-test statuses (``PASSED``, ``FAILED``…) of a test log, by the parser SWE-bench uses for the repo."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY, parse_log_pytest
    from swebench.types import TestSpec

    instance = task.instance
    if instance.log_parser == R2E_LOG_PARSER:
        return parse_r2e_log(log)
    if instance.log_parser:
        parser = PARSER_REGISTRY[instance.log_parser]
    else:
        parser = MAP_REPO_TO_PARSER_PY.get(instance.repo, parse_log_pytest)
    spec = TestSpec(
        instance_id=instance.instance_id,
        image=task.image or "",
        eval_script_list=[],
        repo=instance.repo,
        version=instance.version,
        FAIL_TO_PASS=list(instance.fail_to_pass),
        PASS_TO_PASS=list(instance.pass_to_pass),
        log_parser=instance.log_parser,
    )
    return parser(log, spec)


def passed_strictly(test_id: str, statuses: dict[str, str]) -> bool:
    """``test_id`` passed: its status is exactly ``PASSED``. An id that swebench's data truncated mid-parameter
    (more ``[`` than ``]``) matches the ids it prefixes, and passes only when there is one and all are PASSED."""
    if test_id in statuses:
        return statuses[test_id] == PASSED
    if test_id.count("[") > test_id.count("]"):
        matches = [status for key, status in statuses.items() if key.startswith(test_id)]
        return bool(matches) and all(status == PASSED for status in matches)
    return False


def resolution(task: SweBenchTask, statuses: dict[str, str]) -> tuple[bool, str]:
    """``(resolved, summary)``: resolved iff every FAIL_TO_PASS and PASS_TO_PASS test is exactly ``PASSED``.

    The status names are swebench's ``ResolvedStatus`` (FULL / PARTIAL / NO as ``get_resolution_status`` defines
    them), but stricter than ``get_eval_tests_report``: an ``XFAIL`` does not pass, a skipped PASS_TO_PASS test is
    not "maintained", and anything other than ``PASSED`` (``XPASS``, ``SKIPPED``, missing…) fails."""
    from swebench.harness.constants import ResolvedStatus

    f2p, p2p = list(task.instance.fail_to_pass), list(task.instance.pass_to_pass)
    f2p_failing = [test_id for test_id in f2p if not passed_strictly(test_id, statuses)]
    p2p_failing = [test_id for test_id in p2p if not passed_strictly(test_id, statuses)]
    if not f2p_failing and not p2p_failing:
        status = ResolvedStatus.FULL.value
    elif len(f2p_failing) < len(f2p) and not p2p_failing:
        status = ResolvedStatus.PARTIAL.value
    else:
        status = ResolvedStatus.NO.value
    failures = [f"{test_id} ({statuses.get(test_id, 'missing')})" for test_id in f2p_failing + p2p_failing]
    summary = (
        f"{status}: FAIL_TO_PASS {len(f2p) - len(f2p_failing)}/{len(f2p)}, "
        f"PASS_TO_PASS {len(p2p) - len(p2p_failing)}/{len(p2p)}"
        + (f"; failing: {', '.join(failures[:10])}" if failures else "")
    )
    return status == ResolvedStatus.FULL.value, summary


class SweBenchGrader:
    """Implements ``components.protocols.Reward`` for :class:`SweBenchTask` (see the module docstring)."""

    runner_source = SweGrader.runner_source  # the observer's source (a weakened variant replaces it in tests)

    def __init__(self, sandboxes: SandboxFactory | SandboxSource, config: SweBenchGraderConfig | None = None):
        """``sandboxes``: a factory (``sandboxes.image.create_image_sandbox``) or a provider with
        ``acquire``/``release`` (``ImageSandboxProvider``, whose pools reset a sandbox before reuse)."""
        self.sandboxes = sandboxes
        self.config = config or SweBenchGraderConfig()
        # The project grader reads the agent's diff; only its git plumbing is used.
        self._diff_reader = SweGrader(sandboxes, self.config.grader)

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        """Grade what the agent left in ``agent_sandbox``."""
        if not isinstance(task, SweBenchTask):
            raise TypeError(f"SweBenchGrader grades SweBenchTask, got {type(task).__name__}")
        try:
            diff = await self._diff_reader.extract_diff(task, agent_sandbox)  # uses task.snapshot() only
        except _AgentFault as fault:
            return RewardResult(reward=0.0, log=f"agent's repository unusable: {fault}")
        except (SandboxError, GradingError) as error:
            return RewardResult(
                reward=None,
                error=f"reading the agent's diff failed: {error}",
                error_kind=error_kind_of(error),
            )
        return await self.grade_patch(task, diff)

    async def grade_patch(self, task: SweBenchTask, patch: str) -> RewardResult:
        """Grade ``patch`` (a diff against the instance's base) in a fresh sandbox."""
        log = [f"diff: {len(patch.splitlines())} lines"]
        reasons = flag_suspicious_diff(patch)
        log.extend(f"FLAGGED: {reason}" for reason in reasons)
        rejecting = (
            self.config.grader.reject_test_runner_tampering and task.instance.repo not in TEST_RUNNER_REPOS
        )
        if rejecting and any(_TAMPERING in reason for reason in reasons):
            log.append("reward 0: the diff's non-test code reaches into the test runner")
            return RewardResult(reward=0.0, log="\n".join(log))
        try:
            spec = await asyncio.to_thread(task.sandbox_spec)
            sandbox = await self._acquire(spec)
        except (SandboxError, OSError, ValueError) as error:
            return RewardResult(
                reward=None,
                log="\n".join(log),
                error=f"{type(error).__name__}: {error}",
                error_kind="sandbox",
            )
        try:
            return await self._grade_in(sandbox, task, patch, log)
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
        finally:
            await self._release(sandbox)

    async def _grade_in(
        self, sandbox: Sandbox, task: SweBenchTask, patch: str, log: list[str]
    ) -> RewardResult:
        grader_dir = f"/tmp/rein-grade-{secrets.token_hex(8)}"
        await self._checked(sandbox, ["mkdir", "-p", grader_dir], "creating the grader directory")
        if patch.strip():
            await sandbox.write_file(f"{grader_dir}/agent.patch", patch)
            applied = await self._step(
                sandbox, [*_SAFE_GIT, "apply", "--whitespace=nowarn", f"{grader_dir}/agent.patch"]
            )
            if applied.exit_code == 127:
                raise GradingError(
                    f"git is not available in the grading sandbox: {applied.stderr[-300:]}", kind="tooling"
                )
            if applied.exit_code != 0:
                fuzzy = await self._step(
                    sandbox, ["patch", "--batch", "--fuzz=5", "-p1", "-i", f"{grader_dir}/agent.patch"]
                )
                if fuzzy.exit_code != 0:
                    raise _AgentFault(f"the agent's diff does not apply: {applied.stderr.strip()[-800:]}")
                log.append("agent's diff applied with patch --fuzz=5 (git apply refused it)")
        # What the patch changed, as git itself reads the patch (any name, binary files included); the paths the
        # data set's own fix touches are the agent's to change, test files or not.
        agent_paths = await self._patched_paths(sandbox, grader_dir) if patch.strip() else []
        owned = {match.group(2) for match in _DIFF_PATHS.finditer(task.instance.patch)}
        base = task.snapshot().base_commit
        run_by_the_tests = await self._run_by_the_tests(sandbox, task, base) if agent_paths else set()
        infrastructure = [
            path
            for path in agent_paths
            if read_by_the_test_runner(path)
            or (
                (is_test_file(path) or path in run_by_the_tests or PurePosixPath(path).name in _HARNESS_NAMES)
                and path not in owned
            )
        ]
        if infrastructure:
            log.append(
                "FLAGGED: test infrastructure and test files in the diff restored to the base: "
                + ", ".join(infrastructure[:20])
            )
        await self._checked(sandbox, ["bash", "-c", _REMOVE_BYTECODE], "removing bytecode caches")
        if task.instance.eval_script:
            await self._restore_paths(sandbox, base, infrastructure)
            return await self._run_eval_script(sandbox, task, grader_dir, log)
        await self._restore_paths(
            sandbox, base, list(dict.fromkeys([*task.instance.test_files, *infrastructure]))
        )
        if task.instance.test_patch.strip():
            await sandbox.write_file(f"{grader_dir}/test.patch", task.instance.test_patch)
            applied = await self._step(
                sandbox, [*_SAFE_GIT, "apply", "--whitespace=nowarn", f"{grader_dir}/test.patch"]
            )
            if applied.exit_code != 0:
                raise GradingError(
                    f"test_patch does not apply to the restored tree: {applied.stderr.strip()[-800:]}",
                    kind="data",
                )
        invocation = self._observer_invocation(task)
        if invocation is not None:
            changed = [path for path in agent_paths if path not in infrastructure]
            return await self._run_observed(sandbox, task, grader_dir, invocation, changed, log)
        start, end = f"REIN-TESTS-START-{secrets.token_hex(12)}", f"REIN-TESTS-END-{secrets.token_hex(12)}"
        script = f"echo {start}; {task.test_command}; echo; echo {end}"
        result = await sandbox.exec(
            ["bash", "-c", script], timeout_s=self.config.grader.test_timeout_s, env=_NO_BYTECODE
        )
        if result.timed_out:
            log.append(f"tests timed out after {self.config.grader.test_timeout_s:.0f} s")
            return RewardResult(reward=0.0, log="\n".join(log))
        output = result.stdout + "\n" + result.stderr
        section = output.split(start, 1)[1].split(end, 1)[0] if start in output and end in output else ""
        if start not in output:
            raise GradingError(
                f"the test script did not start (exit {result.exit_code}): {output[-800:]}", kind="sandbox"
            )
        statuses = parse_test_log(task, section)
        if not statuses and result.exit_code in (126, 127):
            raise GradingError(
                f"test command not runnable (exit {result.exit_code}): {output[-800:]}", kind="tooling"
            )
        resolved, summary = self._resolution(task, statuses)
        log.append(summary)
        if not statuses:
            log.append(f"no test outcome in the log (exit {result.exit_code}): {section[-800:]}")
        return RewardResult(reward=1.0 if resolved else 0.0, log="\n".join(log))

    def _resolution(self, task: SweBenchTask, statuses: dict[str, str]) -> tuple[bool, str]:
        """Strict resolution (``resolution``): only ``PASSED`` passes."""
        return resolution(task, statuses)

    def _observer_invocation(self, task: SweBenchTask) -> tuple[str, list[str]] | None:
        """How the tests run through the observer; None: the log-parsing fallback."""
        return pytest_invocation(task)

    async def _run_observed(
        self,
        sandbox: Sandbox,
        task: SweBenchTask,
        grader_dir: str,
        invocation: tuple[str, list[str]],
        changed_paths: list[str],
        log: list[str],
    ) -> RewardResult:
        """The tests through the observer's authenticated channel (module docstring, step 5)."""
        interpreter, pytest_args = invocation
        observer = _RepositoryTestsObserver(
            pytest_args,
            changed_paths,
            replace(self.config.grader, python_executable=interpreter),
        )
        observer.runner_source = self.runner_source
        run = await observer._run_runner(sandbox, task, grader_dir)  # type: ignore[arg-type]
        if not run.started:
            raise GradingError(
                f"the grader's observer did not start under {interpreter} (exit {run.exit_code}): "
                f"{run.output_tail[-800:]}",
                kind="observer",
            )
        if run.observer_error:
            raise GradingError(f"the grader's observer failed: {run.observer_error}", kind="observer")
        failure = ""
        if run.outcomes is None:
            failure = (
                f"no verdict from the grader's observer (exit {run.exit_code}): the code under test ended it"
            )
        elif run.tampered:
            failure = "the test runner or builtins changed while the tests ran: " + ", ".join(run.tampered)
        elif run.survivors:
            failure = "processes of the code under test outlived the observer's kill loop"
        elif run.flooded:
            failure = "the test process flooded the observer's channel with events"
        elif run.timed_out:
            failure = f"tests timed out after {self.config.grader.test_timeout_s:.0f} s"
        elif not run.finished:
            failure = f"the test process ended before its pytest session did (exit {run.exit_code})"
        if failure:
            log.append(f"observer: reward 0: {failure}\n{run.output_tail[-1500:]}")
            return RewardResult(reward=0.0, log="\n".join(log))
        assert run.outcomes is not None
        if run.foreign_events:
            log.append(
                f"FLAGGED: {run.foreign_events} test events from processes other than the test process"
            )
        resolved, summary = self._resolution(task, parse_test_log(task, summary_log(run.outcomes)))
        log.append("observer: " + summary)
        log.extend(collection_error_lines(run))
        if not run.outcomes and not run.collection_errors:
            log.append(f"no test outcome on the observer's channel: {run.output_tail[-800:]}")
        return RewardResult(reward=1.0 if resolved else 0.0, log="\n".join(log))

    async def _run_eval_script(
        self, sandbox: Sandbox, task: SweBenchTask, grader_dir: str, log: list[str]
    ) -> RewardResult:
        """The row's own eval script (it restores the test files, applies test_patch and runs the tests between
        swebench's output markers), its output parsed the way swebench's ``get_logs_eval`` slices it."""
        from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

        await sandbox.write_file(f"{grader_dir}/eval.sh", task.instance.eval_script)
        result = await sandbox.exec(
            ["bash", "-c", f"bash {grader_dir}/eval.sh 2>&1"],
            timeout_s=self.config.grader.test_timeout_s,
            env=_NO_BYTECODE,
        )
        if result.timed_out:
            log.append(f"eval script timed out after {self.config.grader.test_timeout_s:.0f} s")
            return RewardResult(reward=0.0, log="\n".join(log))
        output = result.stdout + result.stderr
        if START_TEST_OUTPUT not in output:  # it broke before any code of the agent ran: the data's fault
            raise GradingError(
                f"eval script printed no test-output markers (exit {result.exit_code}): {output[-800:]}",
                kind="data",
            )
        if END_TEST_OUTPUT not in output:
            return self._unfinished_eval_script(output, result.exit_code, log)
        section = output.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0]
        resolved, summary = self._resolution(task, parse_test_log(task, section))
        log.append("eval_script: " + summary)
        return RewardResult(reward=1.0 if resolved else 0.0, log="\n".join(log))

    def _unfinished_eval_script(self, output: str, exit_code: int, log: list[str]) -> RewardResult:
        """The tests started (the start marker is there) and never let the script reach its end marker: the code
        under test killed or exited it, or printed past the output cap. Its 0, not a grading error."""
        log.append(
            "eval script: reward 0: the tests started but the script never printed its end marker (killed, "
            f"exited or output past the cap; exit {exit_code}): {output[-800:]}"
        )
        return RewardResult(reward=0.0, log="\n".join(log))

    async def _patched_paths(self, sandbox: Sandbox, grader_dir: str) -> list[str]:
        """Every path the agent's patch creates, changes or deletes, as ``git apply --numstat -z`` reads it."""
        listed = await self._step(
            sandbox, [*_SAFE_GIT, "apply", "--numstat", "-z", f"{grader_dir}/agent.patch"]
        )
        if listed.exit_code != 0:
            raise GradingError(f"listing the paths of an applied patch failed: {listed.stderr[-500:]}")
        paths, fields = [], listed.stdout.split("\0")
        while fields:
            entry = fields.pop(0)
            if entry.count("\t") >= 2:
                path = entry.split("\t", 2)[2]
                paths.extend([path] if path else fields[:2])  # a rename: "a\td\t", then old and new
                del fields[: 0 if path else 2]
        return list(dict.fromkeys(path for path in paths if path))

    async def _run_by_the_tests(self, sandbox: Sandbox, task: SweBenchTask, base: str) -> set[str]:
        """Every repository path the test command (or the eval script) names, the paths named by each such file
        as ``base`` holds it (``run_tests.sh`` → ``.venv/bin/python``), and their parent directories: what the
        tests run besides the code under test, restored to the base when the agent changed it."""
        named: set[str] = set()
        pending, read = [task.instance.eval_script or task.test_command], 0
        while pending:
            words = {
                path for word in _COMMAND_WORD.findall(pending.pop()) if (path := _repository_path(word))
            }
            fresh = sorted(words - named)
            named |= words
            if read >= _MAX_SCRIPTS_READ or not fresh:
                continue
            files = []  # the named paths that are files of the base (not directories: never listed whole)
            for start in range(0, len(fresh), 500):
                listed = await self._step(
                    sandbox,
                    [
                        *_SAFE_GIT,
                        "--literal-pathspecs",
                        "ls-tree",
                        "-z",
                        base,
                        "--",
                        *fresh[start : start + 500],
                    ],
                )
                if listed.exit_code != 0:
                    raise GradingError(f"listing the base commit failed: {listed.stderr[-500:]}")
                entries = (entry.split("\t", 1) for entry in listed.stdout.split("\0") if "\t" in entry)
                files += [path for meta, path in entries if meta.split()[1] == "blob"]
            for path in sorted(set(files) & set(fresh))[: _MAX_SCRIPTS_READ - read]:
                read += 1
                shown = await self._step(sandbox, [*_SAFE_GIT, "cat-file", "blob", f"{base}:{path}"])
                if (
                    shown.exit_code == 0
                    and len(shown.stdout) <= _MAX_SCRIPT_BYTES
                    and "\0" not in shown.stdout
                ):
                    pending.append(shown.stdout)
        return named | {
            str(parent) for path in named for parent in PurePosixPath(path).parents if parent.parts
        }

    async def _restore_paths(self, sandbox: Sandbox, base: str, paths: list[str]) -> None:
        """Each of ``paths`` back to its state in ``base``, or removed when ``base`` has no such path."""
        for path in paths:
            if PurePosixPath(path).is_absolute() or ".." in PurePosixPath(path).parts:
                raise _AgentFault(f"path outside the repository in the diff: {path!r}")
        for start in range(0, len(paths), 200):
            chunk = paths[start : start + 200]
            listed = await self._step(
                sandbox, [*_SAFE_GIT, "ls-tree", "-r", "-z", "--name-only", base, "--", *chunk]
            )
            if listed.exit_code != 0:
                raise GradingError(f"listing the base commit failed: {listed.stderr[-500:]}")
            in_base = set(listed.stdout.split("\0"))
            kept = [path for path in chunk if path in in_base]
            gone = [path for path in chunk if path not in in_base]
            if kept:
                await self._checked(
                    sandbox, [*_SAFE_GIT, "checkout", base, "--", *kept], "restoring test files"
                )
            if gone:
                await self._checked(sandbox, ["rm", "-rf", "--", *gone], "removing files the agent added")

    async def _acquire(self, spec) -> Sandbox:
        if isinstance(self.sandboxes, SandboxSource):
            return await self.sandboxes.acquire(spec)
        return await self.sandboxes(spec)

    async def _release(self, sandbox: Sandbox) -> None:
        if isinstance(self.sandboxes, SandboxSource):
            await self.sandboxes.release(sandbox)
        else:
            await sandbox.close()

    async def _step(self, sandbox: Sandbox, command: list[str]):
        return await sandbox.exec(command, timeout_s=self.config.grader.step_timeout_s)

    async def _checked(self, sandbox: Sandbox, command: list[str], what: str) -> None:
        result = await self._step(sandbox, command)
        if result.exit_code != 0:
            raise GradingError(f"{what} failed (exit {result.exit_code}): {result.stderr[-500:]}")


@dataclass(frozen=True, kw_only=True)
class InstanceCheck:
    """``--check``'s verdict on one instance: the gold patch must earn 1 and the empty patch 0."""

    instance_id: str
    gold: RewardResult
    empty: RewardResult

    @property
    def ok(self) -> bool:
        return self.gold.reward == 1.0 and self.empty.reward == 0.0


async def check_instances(
    tasks: list[SweBenchTask], grader: SweBenchGrader, *, concurrency: int = 2
) -> list[InstanceCheck]:
    """Grade each instance's gold patch and the empty patch; an instance that is not ok is a bad instance."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(task: SweBenchTask) -> InstanceCheck:
        async with semaphore:
            gold = await grader.grade_patch(task, task.instance.patch)
            empty = await grader.grade_patch(task, "")
        return InstanceCheck(instance_id=task.task_id, gold=gold, empty=empty)

    return list(await asyncio.gather(*(one(task) for task in tasks)))


def main(argv: list[str] | None = None) -> int:
    """``python -m components.tasks.swebench_grading --check --tasks swebench:PATH [--images DIR] [--snapshots DIR]``"""
    from components.tasks.swebench import load_task_set
    from sandboxes.image import ImageSandboxConfig, ImageSandboxProvider

    parser = argparse.ArgumentParser(prog="python -m components.tasks.swebench_grading")
    parser.add_argument(
        "--check", action="store_true", required=True, help="gold -> 1 and empty -> 0 per instance"
    )
    parser.add_argument("--tasks", required=True, help="swebench:PATH or r2e:PATH")
    parser.add_argument("--images", type=Path, default=None)
    parser.add_argument("--snapshots", type=Path, default=None)
    parser.add_argument("--image-cache", type=Path, default=None)
    args = parser.parse_args(argv)
    loaded = load_task_set(
        args.tasks, images=args.images, snapshots=args.snapshots, image_cache_dir=args.image_cache
    )
    for row in loaded.rejected:
        print(json.dumps({"instance_id": row.instance_id, "bad": True, "reason": row.reason}))

    async def run() -> list[InstanceCheck]:
        image_config = ImageSandboxConfig(
            num_warm_per_image=0, **({"cache_dir": args.image_cache} if args.image_cache else {})
        )
        async with ImageSandboxProvider(image_config) as provider:
            from sandboxes.bwrap import BwrapSandbox

            grader_sandboxes = provider if any(task.image for task in loaded.tasks) else BwrapSandbox.create
            return await check_instances(loaded.tasks, SweBenchGrader(grader_sandboxes))

    checks = asyncio.run(run())
    for check in checks:
        print(json.dumps({"instance_id": check.instance_id, "bad": not check.ok, "gold": check.gold.reward,
                          "empty": check.empty.reward, "log": (check.gold.error or check.gold.log)[-300:]}))  # fmt: skip
    num_ok = sum(check.ok for check in checks)
    num_bad = len(loaded.rejected) + len(checks) - num_ok
    print(f"checked {len(checks) + len(loaded.rejected)} instances: {num_ok} ok, {num_bad} bad")
    return 1 if num_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "InstanceCheck",
    "SweBenchGrader",
    "SweBenchGraderConfig",
    "check_instances",
    "parse_test_log",
    "pytest_invocation",
    "resolution",
    "summary_log",
]
