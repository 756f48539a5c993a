"""Run an unmodified agent program (Claude Code, Codex CLI, mini-swe-agent, …) inside the task's sandbox.

The program's base URL points at the proxy session (reachable from the sandbox through its proxy-only
network path), its configuration is written into a throwaway ``HOME`` inside the sandbox (``$HOME/.rein-agent``
by default: never the workspace, so it never shows up in the graded diff), it is bounded by its own turn flag and by a
wall-clock ``timeout``, and its exit status, stdout and stderr are kept in ``HarnessOutcome.log``.

Adding an agent is one small class implementing ``BlackBoxAgent``: which host paths it needs read-only,
how to launch it (argv, environment, files for its HOME), and how to read its exit. See
``harnesses/claude_code.py`` for a complete example.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from components.config import require, require_positive
from components.protocols import Harness, HarnessOutcome, Sandbox, SandboxSpec, Task
from components.rollout.failures import outcome_from_exception
from components.rollout.log_text import clip_text
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import project_bin_dirs, search_path

DEFAULT_PROMPT_TEMPLATE = (
    "{problem_statement}\n\nThe repository is in the current directory. Fix the issue by editing the source "
    "files (not the tests)."
)
_MARKER = "@@REIN@@"
_SAFE_RELATIVE_PATH = re.compile(r"^[A-Za-z0-9._\-][A-Za-z0-9._\-/]*$")
_CAPTURED_STREAMS = ("stdout", "stderr", "report")


@dataclass(kw_only=True, frozen=True)
class BlackBoxConfig:
    """Bounds and placement of one black-box agent run."""

    max_turns: int = 20  # passed to the agent's own turn flag (where it has one)
    wall_time_s: float = 600.0  # the agent is killed after this: status timeout
    kill_grace_s: float = 10.0  # SIGTERM → SIGKILL delay when the wall time runs out
    model: str = "rein-policy"  # the model name the agent is told to request (the proxy serves any name)
    # Cap on each reply's tokens, passed to the agent's own setting where it has one (Claude Code:
    # CLAUDE_CODE_MAX_OUTPUT_TOKENS, mini: model_kwargs.max_tokens); None: the agent's default. Codex has no
    # such setting: cap it with the proxy's ``default_max_tokens``.
    max_output_tokens: int | None = None
    home_dir: str = ""  # the throwaway HOME inside the sandbox; "": $HOME/.rein-agent of the sandbox user
    workdir: str = ""  # where the agent starts; "": the sandbox's workspace (its default cwd)
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE  # ``{problem_statement}`` is filled in
    max_capture_bytes: int = 200_000  # of each of stdout / stderr / report, read back from the sandbox
    max_log_chars: int = 100_000
    # Sandbox limits raised (never lowered) for the program: the sandbox caps address space (RLIMIT_AS), and
    # Node / Bun / Rust runtimes reserve gigabytes of address space they never touch.
    min_memory_mb: int = 32_768
    min_max_processes: int = 512
    extra_env: Mapping[str, str] = field(default_factory=dict)  # added to the agent's environment
    # Directories put before the system ones on the agent's PATH (default: the project venv's bin, so that the
    # agent's own commands find `python` / `pytest` inside the sandbox).
    path_prepend: tuple[str, ...] = field(default_factory=project_bin_dirs)

    def __post_init__(self) -> None:
        for name in (
            "max_turns",
            "wall_time_s",
            "kill_grace_s",
            "max_capture_bytes",
            "max_log_chars",
            "min_memory_mb",
            "min_max_processes",
        ):
            require_positive(getattr(self, name), name)
        require(bool(self.model), "model", "must be a non-empty model name")
        if self.max_output_tokens is not None:
            require_positive(self.max_output_tokens, "max_output_tokens")
        for name in ("home_dir", "workdir"):
            value = getattr(self, name)
            require(
                value == "" or value.startswith("/"),
                name,
                f"must be an absolute path or empty, got {value!r}",
            )
        # The wrapper empties HOME before each run: never let that be / or a top-level directory.
        require(
            self.home_dir == "" or self.home_dir.rstrip("/").count("/") >= 2,
            "home_dir",
            f"must be at least two levels deep (e.g. /tmp/agent-home), got {self.home_dir!r}",
        )
        require(
            "{problem_statement}" in self.prompt_template,
            "prompt_template",
            "must contain {problem_statement}",
        )


@dataclass(kw_only=True, frozen=True)
class AgentLaunch:
    """How to start one agent run: its argv, environment, files written into its HOME, and an optional shell
    snippet run after it exits (with ``$HOME`` set) whose output is read back as ``AgentExit.report``."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    home_files: Mapping[str, str] = field(default_factory=dict)  # path relative to HOME → text
    report_command: str = ""

    def __post_init__(self) -> None:
        require(len(self.argv) > 0, "argv", "needs the program to run")
        for path in self.home_files:
            require(
                bool(_SAFE_RELATIVE_PATH.match(path)) and ".." not in path.split("/"),
                "home_files",
                f"{path!r} must be a plain relative path",
            )


@dataclass(kw_only=True, frozen=True)
class AgentExit:
    """How the agent program ended, as read back from the sandbox."""

    exit_code: int | None  # None when the wrapper never reported (the sandbox killed it)
    timed_out: bool
    stdout: str
    stderr: str
    report: str = ""


@runtime_checkable
class BlackBoxAgent(Protocol):
    """One agent program. Contract: ``launch`` describes a run against ``base_url`` (a proxy session URL,
    ``http://HOST:PORT/s/{id}``) authenticating with ``api_key`` (the session's token) with ``home`` as its HOME (an absolute path inside the sandbox) that honours
    ``config.max_turns`` where the program can; ``read_exit`` maps the program's exit to a status (ok /
    turn_limit / timeout / agent_error …), a reason and metrics. ``turn_bound`` says who bounds its model calls:
    ``"agent"`` (its own setting, filled from ``max_turns``) or ``"proxy"`` for a program without one (its session
    is opened with ``max_calls = max_turns``; the call past it is refused and the session ends ``turn_limit``)."""

    name: str
    turn_bound: Literal["agent", "proxy"]

    def read_only_paths(self) -> tuple[str, ...]: ...

    def launch(
        self, *, prompt: str, base_url: str, api_key: str, home: str, config: BlackBoxConfig
    ) -> AgentLaunch: ...

    def read_exit(
        self, run: AgentExit, config: BlackBoxConfig
    ) -> tuple[TrajectoryStatus, str, dict[str, float]]: ...


def default_exit_status(run: AgentExit, config: BlackBoxConfig) -> tuple[TrajectoryStatus, str]:
    """Timeout when the wall clock ran out, ok on exit 0, agent_error (with the stderr tail) otherwise."""
    if run.timed_out:
        return TrajectoryStatus.TIMEOUT, f"agent ran past {config.wall_time_s:g} s"
    if run.exit_code == 0:
        return TrajectoryStatus.OK, ""
    tail = (run.stderr.strip() or run.stdout.strip())[-500:]
    return TrajectoryStatus.AGENT_ERROR, f"agent exited with status {run.exit_code}: {tail}"


def _launch_script(launch: AgentLaunch, *, home: str, config: BlackBoxConfig) -> str:
    """The bash wrapper: fresh HOME with the agent's files, the agent under ``timeout``, then its captured
    outputs written back base64-encoded between markers (so nothing the agent prints can confuse them)."""
    lines = [
        "set -u",
        f"export HOME={shlex.quote(home)}",
        'rm -rf "$HOME" && mkdir -p "$HOME/.rein"',
    ]
    for relative_path, text in launch.home_files.items():
        encoded = base64.b64encode(text.encode()).decode()
        target = f'"$HOME"/{shlex.quote(relative_path)}'
        lines.append(f'mkdir -p "$(dirname {target})" && printf %s {encoded} | base64 -d > {target}')
    if config.workdir:
        lines.append(f"cd {shlex.quote(config.workdir)}")
    lines += [
        f'timeout -k {config.kill_grace_s:g} {config.wall_time_s:g} "$@" '
        '< /dev/null > "$HOME/.rein/stdout" 2> "$HOME/.rein/stderr"',
        "code=$?",
    ]
    if launch.report_command:
        lines.append(f'( {launch.report_command} ) < /dev/null > "$HOME/.rein/report" 2>&1')
    for stream in _CAPTURED_STREAMS:
        lines.append(
            f'echo "{_MARKER} {stream}"; tail -c {config.max_capture_bytes} "$HOME/.rein/{stream}" 2>/dev/null '
            "| base64 -w0; echo"
        )
    lines.append(f'echo "{_MARKER} exit $code"')
    return "\n".join(lines)


def _parse_wrapper_output(stdout: str, stderr: str, *, exec_timed_out: bool) -> AgentExit:
    streams: dict[str, str] = {}
    exit_code: int | None = None
    lines = stdout.splitlines()
    for index, line in enumerate(lines):
        if not line.startswith(_MARKER + " "):
            continue
        word, _, value = line[len(_MARKER) + 1 :].partition(" ")
        if word == "exit":
            exit_code = int(value) if value.strip().lstrip("-").isdigit() else None
        elif word in _CAPTURED_STREAMS and index + 1 < len(lines):
            try:
                streams[word] = base64.b64decode(lines[index + 1]).decode("utf-8", errors="replace")
            except (binascii.Error, ValueError):
                streams[word] = ""
    if exit_code is None:  # the wrapper itself was cut short: keep whatever it printed
        return AgentExit(exit_code=None, timed_out=exec_timed_out, stdout=stdout, stderr=stderr)
    # coreutils `timeout` exits 124 when it had to stop the program (137 when it had to SIGKILL it).
    return AgentExit(
        exit_code=exit_code,
        timed_out=exit_code in (124, 137),
        stdout=streams.get("stdout", ""),
        stderr=streams.get("stderr", "") + (f"\n[wrapper] {stderr.strip()}" if stderr.strip() else ""),
        report=streams.get("report", ""),
    )


class BlackBoxHarness:
    """A ``Harness`` that runs one ``BlackBoxAgent`` program inside the rollout's sandbox."""

    def __init__(self, agent: BlackBoxAgent, config: BlackBoxConfig | None = None) -> None:
        require(isinstance(agent, BlackBoxAgent), "agent", f"{agent!r} does not implement BlackBoxAgent")
        self.agent = agent
        self.config = config or BlackBoxConfig()
        self.name = agent.name

    @property
    def max_policy_calls(self) -> int:
        """``CallBoundedHarness``: a program without a turn setting of its own (``turn_bound="proxy"``, e.g.
        OpenClaw, Codex) is bounded by the proxy at ``max_turns`` model calls; 0 (none) for the others."""
        return self.config.max_turns if self.agent.turn_bound == "proxy" else 0

    def adapt_sandbox_spec(self, spec: SandboxSpec, *, proxy_url: str) -> SandboxSpec:
        """The task's sandbox plus what the program needs: its install paths (read-only) and the proxy."""
        paths = tuple(dict.fromkeys((*spec.read_only_paths, *self.agent.read_only_paths())))
        limits = dataclasses.replace(
            spec.limits,
            memory_mb=max(spec.limits.memory_mb, self.config.min_memory_mb),
            max_processes=max(spec.limits.max_processes, self.config.min_max_processes),
            command_timeout_s=max(
                spec.limits.command_timeout_s, self.config.wall_time_s + self.config.kill_grace_s
            ),
            cpu_time_s=max(spec.limits.cpu_time_s, int(self.config.wall_time_s * 4)),
        )
        return dataclasses.replace(spec, read_only_paths=paths, proxy_url=proxy_url, limits=limits)

    @staticmethod
    async def _default_home(sandbox: Sandbox) -> str:
        """``$HOME/.rein-agent`` of the sandbox user (outside the workspace; reset with the sandbox)."""
        result = await sandbox.exec(["sh", "-c", 'printf %s "${HOME:-/tmp}"'], timeout_s=30)
        home = result.stdout.strip() if result.exit_code == 0 else ""
        return (home if home.startswith("/") else "/tmp").rstrip("/") + "/.rein-agent"

    async def run(self, *, task: Task, sandbox: Sandbox, base_url: str, api_key: str) -> HarnessOutcome:
        """Launch the agent in ``sandbox`` against ``base_url`` and classify how it ended."""
        config = self.config
        started = time.monotonic()
        prompt = config.prompt_template.format(problem_statement=task.problem_statement)
        try:
            home = config.home_dir or await self._default_home(sandbox)
            launch = self.agent.launch(
                prompt=prompt, base_url=base_url.rstrip("/"), api_key=api_key, home=home, config=config
            )
            env = {
                "PATH": search_path(config.path_prepend),
                "LANG": "C.UTF-8",
                "TERM": "dumb",
                **launch.env,
                **config.extra_env,
            }
            result = await sandbox.exec(
                [
                    "bash",
                    "-c",
                    _launch_script(launch, home=home, config=config),
                    self.agent.name,
                    *launch.argv,
                ],
                env=env,
                timeout_s=config.wall_time_s + config.kill_grace_s + 30.0,
            )
        except Exception as exc:  # a dead sandbox (SandboxError) or a broken adapter, classified
            return outcome_from_exception(exc, metrics={"agent_wall_time_s": time.monotonic() - started})
        run = _parse_wrapper_output(result.stdout, result.stderr, exec_timed_out=result.timed_out)
        if run.exit_code is None and not run.timed_out:
            status, reason, metrics = (
                TrajectoryStatus.SANDBOX_ERROR,
                f"the agent wrapper ended without reporting (sandbox exit {result.exit_code})",
                {},
            )
        else:
            try:
                status, reason, metrics = self.agent.read_exit(run, config)
            except Exception as exc:
                status, reason, metrics = (
                    TrajectoryStatus.AGENT_ERROR,
                    f"could not read the agent's exit: {exc}",
                    {},
                )
        metrics = {**metrics, "agent_exit_code": float(-1 if run.exit_code is None else run.exit_code)}
        metrics["agent_wall_time_s"] = time.monotonic() - started
        log = (
            f"$ {self.agent.name} (exit {run.exit_code}, timed out: {run.timed_out})\n"
            f"--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}\n"
            + (f"--- report\n{run.report}\n" if run.report else "")
        )
        return HarnessOutcome(
            status=status.value,
            failure_reason="" if status == TrajectoryStatus.OK else (reason or status.value),
            metrics=metrics,
            log=clip_text(log, config.max_log_chars),
        )


class HarnessBrickConfig(Protocol):
    """A registered kind of the ``harness`` seam (``components.registry.HARNESSES``): builds the agent a recipe
    trains, with the run's bounds (turns, wall time) and sampling (reply cap, temperature)."""

    def build(
        self, *, max_turns: int, wall_time_s: float, max_tokens: int, temperature: float
    ) -> Harness: ...

    def read_only_paths(self) -> tuple[str, ...]:
        """Host paths the agent's sandboxes need read-only (kept warm by the pool)."""
        ...


def black_box_harness(
    agent: BlackBoxAgent, *, max_turns: int, wall_time_s: float, max_tokens: int
) -> Harness:
    """``agent`` as a harness under the run's bounds (what every black-box kind's ``build`` returns)."""
    return BlackBoxHarness(
        agent, BlackBoxConfig(max_turns=max_turns, wall_time_s=wall_time_s, max_output_tokens=max_tokens)
    )


class BlackBoxBrickConfig:
    """The base of a black-box ``harness`` kind: a subclass (a frozen dataclass registered with
    ``@HARNESSES.register(name)``, its fields the agent's settings) says which ``agent()`` it runs."""

    def agent(self) -> BlackBoxAgent:
        """The agent this kind runs."""
        raise NotImplementedError

    def read_only_paths(self) -> tuple[str, ...]:
        """Host paths the agent's sandboxes need read-only (its executable, its runtime)."""
        return self.agent().read_only_paths()

    def build(self, *, max_turns: int, wall_time_s: float, max_tokens: int, temperature: float) -> Harness:
        """The agent as a harness under the run's bounds (it samples at the run's temperature via the proxy)."""
        return black_box_harness(
            self.agent(), max_turns=max_turns, wall_time_s=wall_time_s, max_tokens=max_tokens
        )
