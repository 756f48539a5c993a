"""The coding agent's tools (``bash``, ``view_file``, ``edit_file``, ``submit``), executed in a sandbox.

Malformed calls (unknown tool, arguments that are not a JSON object, missing or mistyped fields, an
``old_str`` that does not match exactly once) come back as an error text for the policy to read, never as an
exception: the policy learns from them. Only a failing sandbox raises (``SandboxError``).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.protocols import Sandbox
from components.rollout.log_text import clip_text

WORKSPACE = "/workspace"

TOOL_SPECS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the repository (cwd /workspace) and see its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "view_file",
            "description": "Show a file with line numbers, optionally only lines start_line..end_line (1-based).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "start_line": {"type": "integer"},
                    "end_line": {"type": "integer"},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": (
                "Replace old_str by new_str in a file. old_str must occur exactly once (copy it exactly, with "
                "indentation). An empty old_str creates a new file with new_str as its content."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                },
                "required": ["path", "old_str", "new_str"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish: your changes to the repository are your answer.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
)

TOOL_NAMES = tuple(spec["function"]["name"] for spec in TOOL_SPECS)
_READ_COMMANDS = re.compile(r"(?:^|[;&|]\s*)(?:cat|head|tail|less|more|nl|sed\s+-n)\b")


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    """What one tool call returned to the policy."""

    output: str
    is_error: bool = False  # the call failed: refused, a non-zero exit code, a command that timed out
    refused: bool = (
        False  # the tools did not run it: unknown tool, malformed arguments, an edit that did not apply
    )
    submitted: bool = False


class _BadArguments(ValueError):
    pass


def _normalize_path(path: str) -> str:
    """A workspace-relative spelling of ``path`` so that ``./a.py``, ``a.py`` and ``/workspace/a.py`` agree."""
    if path.startswith(WORKSPACE + "/"):
        path = path[len(WORKSPACE) + 1 :]
    return posixpath.normpath(path)


def _field(arguments: dict[str, Any], name: str, kind: type, *, required: bool = True) -> Any:
    if name not in arguments:
        if required:
            raise _BadArguments(f"missing required argument {name!r}")
        return None
    value = arguments[name]
    if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _BadArguments(f"argument {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


class CodingTools:
    """The four coding tools bound to one sandbox, counting what the metrics report."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        command_timeout_s: float,
        max_output_chars: int,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.env = dict(env or {})  # added to the environment of `bash` commands
        self.command_timeout_s = command_timeout_s
        self.max_output_chars = max_output_chars
        self.calls_by_name: Counter[str] = Counter()
        self.num_invalid_calls = 0
        self.num_rereads_after_edit = 0
        self.edited_paths: set[str] = set()

    def metrics(self) -> dict[str, float]:
        """Tool-call counters: total, per tool, invalid ones, and files re-read after being edited."""
        out = {f"num_tool_calls_{name}": float(self.calls_by_name[name]) for name in TOOL_NAMES}
        out["num_tool_calls"] = float(sum(self.calls_by_name.values()))
        out["num_invalid_tool_calls"] = float(self.num_invalid_calls)
        out["num_rereads_after_edit"] = float(self.num_rereads_after_edit)
        out["num_files_edited"] = float(len(self.edited_paths))
        return out

    async def call(self, name: str, arguments: str) -> ToolResult:
        """Run tool ``name`` with JSON ``arguments``; a malformed call yields an error result."""
        self.calls_by_name[name if name in TOOL_NAMES else "unknown"] += 1
        try:
            if name not in TOOL_NAMES:
                raise _BadArguments(f"unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}")
            try:
                parsed = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                raise _BadArguments(
                    f"arguments are not valid JSON ({exc.msg}): {arguments[:200]!r}"
                ) from None
            if not isinstance(parsed, dict):
                raise _BadArguments(f"arguments must be a JSON object, got {type(parsed).__name__}")
            return await getattr(self, f"_{name}")(parsed)
        except _BadArguments as exc:
            self.num_invalid_calls += 1
            return ToolResult(output=f"error: {exc}", is_error=True, refused=True)

    async def _bash(self, arguments: dict[str, Any]) -> ToolResult:
        command = _field(arguments, "command", str)
        for path in self.edited_paths:
            if _READ_COMMANDS.search(command) and path in command:
                self.num_rereads_after_edit += 1
                break
        result = await self.sandbox.exec(
            ["bash", "-c", command], timeout_s=self.command_timeout_s, env=self.env
        )
        text = result.stdout + (("\n" if result.stdout and result.stderr else "") + result.stderr)
        text = clip_text(text, self.max_output_chars)
        if result.timed_out:
            return ToolResult(
                output=f"{text}\n[command timed out after {self.command_timeout_s:g} s]", is_error=True
            )
        return ToolResult(output=f"exit code {result.exit_code}\n{text}", is_error=result.exit_code != 0)

    async def _is_file(self, path: str) -> bool:
        result = await self.sandbox.exec(["test", "-f", path], timeout_s=self.command_timeout_s)
        return result.exit_code == 0

    async def _read_text(self, path: str) -> str:
        if not await self._is_file(path):
            raise _BadArguments(f"no such file: {path}")
        data = await self.sandbox.read_file(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise _BadArguments(f"{path} is not a UTF-8 text file") from None

    async def _view_file(self, arguments: dict[str, Any]) -> ToolResult:
        path = _field(arguments, "path", str)
        start = _field(arguments, "start_line", int, required=False) or 1
        end = _field(arguments, "end_line", int, required=False)
        text = await self._read_text(path)
        if _normalize_path(path) in self.edited_paths:
            self.num_rereads_after_edit += 1
        lines = text.splitlines()
        end = len(lines) if end is None else min(end, len(lines))
        if start < 1 or (lines and start > len(lines)) or end < start - 1:
            raise _BadArguments(f"line range {start}..{end} is outside the file's {len(lines)} lines")
        shown = "\n".join(f"{number:6d}\t{lines[number - 1]}" for number in range(start, end + 1))
        return ToolResult(output=clip_text(shown, self.max_output_chars) or "(empty file)")

    async def _edit_file(self, arguments: dict[str, Any]) -> ToolResult:
        path = _field(arguments, "path", str)
        old_str = _field(arguments, "old_str", str)
        new_str = _field(arguments, "new_str", str)
        if old_str == "":
            if await self._is_file(path):
                raise _BadArguments(f"{path} exists; give a non-empty old_str to edit it")
            parent = posixpath.dirname(path)
            if parent:
                await self.sandbox.exec(f"mkdir -p {shlex.quote(parent)}", timeout_s=self.command_timeout_s)
            await self.sandbox.write_file(path, new_str)
            self.edited_paths.add(_normalize_path(path))
            return ToolResult(output=f"created {path}")
        text = await self._read_text(path)
        count = text.count(old_str)
        if count == 0:
            raise _BadArguments(
                f"old_str was not found in {path}; view the file and copy the exact text, including whitespace"
            )
        if count > 1:
            raise _BadArguments(
                f"old_str occurs {count} times in {path}; include more context to make it unique"
            )
        await self.sandbox.write_file(path, text.replace(old_str, new_str, 1))
        self.edited_paths.add(_normalize_path(path))
        return ToolResult(output=f"edited {path}: replaced 1 occurrence")

    async def _submit(self, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(output="submitted", submitted=True)
