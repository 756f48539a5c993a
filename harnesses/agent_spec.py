"""A black-box agent declared as data: its install paths, argv, environment, config files and exit mapping.

An ``AgentSpec`` is a ``BlackBoxAgent``. Its argv words, environment values and config-file strings are
templates filled per run from ``LaunchValues`` (``{prompt}``, ``{base_url}``, ``{api_key}``, ``{home}``,
``{model}``, ``{max_turns}``, ``{max_output_tokens}``, ``{wall_time_s}``). A value that is not set (``None``:
``max_output_tokens`` when the run has no output bound) drops what names it: an environment variable, or a whole
argv group (a tuple of words, such as ``("--max-tokens", "{max_output_tokens}")``). Config files are written
from plain data (``JsonFile``, ``TomlFile``) whose strings are templates (a value may also be a function of
``LaunchValues``), so no agent builds its own config text.

How the program ended is read by ``exit``: ``ExitRules`` (exit code, then patterns over its output, in order)
covers most programs; an agent with a structured result (Claude Code's JSON line, Codex's events) gives a
function of its own. ``harnesses/opencode.py`` is a complete example in a screen.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import existing
from harnesses.blackbox import AgentExit, AgentLaunch, BlackBoxConfig, default_exit_status

ExitReader = Callable[[AgentExit, BlackBoxConfig], tuple[TrajectoryStatus, str, dict[str, float]]]
_FORMATTER = string.Formatter()
_WHOLE_PLACEHOLDER = re.compile(r"\{(\w+)\}")


class _Unset(Exception):
    """A template named a value this run does not set."""


@dataclass(kw_only=True, frozen=True)
class LaunchValues:
    """What one run's templates may name."""

    prompt: str
    base_url: str  # the proxy session URL, without /v1
    api_key: str  # the session's token
    home: str  # the throwaway HOME inside the sandbox
    model: str
    max_turns: int
    max_output_tokens: int | None
    wall_time_s: float

    @classmethod
    def of(
        cls, *, prompt: str, base_url: str, api_key: str, home: str, config: BlackBoxConfig
    ) -> LaunchValues:
        return cls(
            prompt=prompt,
            base_url=base_url,
            api_key=api_key,
            home=home,
            model=config.model,
            max_turns=config.max_turns,
            max_output_tokens=config.max_output_tokens,
            wall_time_s=config.wall_time_s,
        )

    def fill(self, template: str) -> str:
        """``template`` with its ``{names}`` filled; raises ``_Unset`` when one of them is ``None``."""
        values: dict[str, Any] = {}
        for _, name, _, _ in _FORMATTER.parse(template):
            if name is None:
                continue
            value = getattr(self, name)  # an unknown name is the spec's bug: AttributeError
            if value is None:
                raise _Unset(name)
            values[name] = f"{value:g}" if isinstance(value, float) else value
        return template.format_map(values)


def _fill_data(data: Any, values: LaunchValues) -> Any:
    """Every string of ``data`` (keys too) filled (a string that is one ``{name}`` keeps the value's type: a
    number stays a number), a function of ``LaunchValues`` called; a mapping entry whose value names an unset
    value is dropped."""
    if callable(data):
        return data(values)
    if isinstance(data, str):
        whole = _WHOLE_PLACEHOLDER.fullmatch(data)
        if whole:
            value = getattr(values, whole.group(1))
            if value is None:
                raise _Unset(whole.group(1))
            return value
        return values.fill(data)
    if isinstance(data, Mapping):
        filled = {}
        for key, value in data.items():
            try:
                filled[values.fill(key)] = _fill_data(value, values)
            except _Unset:
                continue
        return filled
    if isinstance(data, list | tuple):
        return [_fill_data(item, values) for item in data]
    return data


@dataclass(frozen=True)
class JsonFile:
    """A JSON config file written from ``data`` (its strings are templates)."""

    data: Mapping[str, Any]

    def render(self, values: LaunchValues) -> str:
        return json.dumps(_fill_data(self.data, values), indent=2) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string literal is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _toml_lines(table: Mapping[str, Any], prefix: str) -> list[str]:
    lines = [
        f"{key} = {_toml_value(value)}" for key, value in table.items() if not isinstance(value, Mapping)
    ]
    for key, value in table.items():
        if isinstance(value, Mapping):
            lines += ["", f"[{prefix}{key}]", *_toml_lines(value, f"{prefix}{key}.")]
    return lines


@dataclass(frozen=True)
class TomlFile:
    """A TOML config file written from ``data`` (nested mappings become tables; strings are templates)."""

    data: Mapping[str, Any]

    def render(self, values: LaunchValues) -> str:
        return "\n".join(_toml_lines(_fill_data(self.data, values), "")) + "\n"


HomeFile = str | JsonFile | TomlFile  # a str is a template of the whole file


@dataclass(frozen=True)
class OutputRule:
    """When ``pattern`` (a regular expression, case-insensitive) occurs in the program's stdout, stderr or
    report, the run ended with ``status``; ``reason`` may name ``{match}`` (the matched text)."""

    pattern: str
    status: TrajectoryStatus
    reason: str = "{match}"


@dataclass(frozen=True)
class ExitRules:
    """Exit → status, declared: the wall clock first (timeout), then ``exit_codes`` (code → status), then on any
    other non-zero exit ``rules`` in order over the output, else ``default_exit_status`` (ok on exit 0,
    agent_error otherwise)."""

    exit_codes: Mapping[int, TrajectoryStatus] = field(default_factory=dict)
    rules: tuple[OutputRule, ...] = ()
    metrics: Callable[[AgentExit], dict[str, float]] | None = None

    def __call__(
        self, run: AgentExit, config: BlackBoxConfig
    ) -> tuple[TrajectoryStatus, str, dict[str, float]]:
        metrics = self.metrics(run) if self.metrics else {}
        status, reason = default_exit_status(run, config)
        if run.timed_out:
            return status, reason, metrics
        if run.exit_code in self.exit_codes:
            status = self.exit_codes[run.exit_code]
            return status, "" if status == TrajectoryStatus.OK else reason, metrics
        if status == TrajectoryStatus.OK:
            return status, reason, metrics
        text = "\n".join((run.stdout, run.stderr, run.report))
        for rule in self.rules:
            found = re.search(rule.pattern, text, re.IGNORECASE)
            if found:
                return rule.status, rule.reason.format(match=found.group(0)[:300]), metrics
        return status, reason, metrics


@dataclass(kw_only=True, frozen=True)
class AgentSpec:
    """One agent program, declared (see the module docstring). Implements ``BlackBoxAgent``."""

    name: str  # the harness name recorded on trajectories
    paths: tuple[str | Path, ...]  # host paths the program needs, bound read-only (missing ones skipped)
    argv: tuple[str | tuple[str, ...], ...]  # words, or groups of words dropped together when unset
    env: Mapping[str, str] = field(default_factory=dict)
    home_files: Mapping[str, HomeFile] = field(default_factory=dict)  # path relative to HOME → content
    report_command: str = ""  # run after the program exits; its output is ``AgentExit.report``
    exit: ExitReader = field(default_factory=ExitRules)
    # Who bounds the program's model calls: "agent" (its own setting, filled from ``{max_turns}``) or "proxy"
    # for a program without one (the proxy refuses the session's call past ``max_turns``: turn_limit)
    turn_bound: Literal["agent", "proxy"] = "agent"

    def read_only_paths(self) -> tuple[str, ...]:
        """The install paths that exist on this host."""
        return existing(self.paths)

    def launch(
        self, *, prompt: str, base_url: str, api_key: str, home: str, config: BlackBoxConfig
    ) -> AgentLaunch:
        """The declared argv, environment and files, filled for this run."""
        values = LaunchValues.of(prompt=prompt, base_url=base_url, api_key=api_key, home=home, config=config)
        argv: list[str] = []
        for word in self.argv:
            group = (word,) if isinstance(word, str) else word
            try:
                argv += [values.fill(item) for item in group]
            except _Unset:
                continue
        files = {
            path: content.render(values) if isinstance(content, JsonFile | TomlFile) else values.fill(content)
            for path, content in self.home_files.items()
        }
        return AgentLaunch(
            argv=tuple(argv),
            env={name: str(value) for name, value in _fill_data(self.env, values).items()},
            home_files=files,
            report_command=self.report_command,
        )

    def read_exit(
        self, run: AgentExit, config: BlackBoxConfig
    ) -> tuple[TrajectoryStatus, str, dict[str, float]]:
        """The declared exit mapping."""
        return self.exit(run, config)
