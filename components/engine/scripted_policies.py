"""Deterministic "policies" for ``ScriptedEngine``: functions from the prompt text to the next reply, written
as the Hermes-style tool-call text the proxy parses."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from components.tasks.swe import SweTask


def tool_call(name: str, **arguments: object) -> str:
    """One tool call as the text the model writes."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def first_hunk_edit(patch: str) -> tuple[str, str, str]:
    """``(path, old_text, new_text)`` of the first hunk of a unified diff (context lines kept on both sides)."""
    path = ""
    old: list[str] = []
    new: list[str] = []
    in_hunk = False
    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ "):
            path = line[4:].strip().removeprefix("b/")
        elif line.startswith("@@"):
            if in_hunk:
                break
            in_hunk = True
        elif in_hunk and line[:1] in (" ", "-", "+"):
            if line[0] in (" ", "-"):
                old.append(line[1:])
            if line[0] in (" ", "+"):
                new.append(line[1:])
        elif in_hunk and line.startswith("\\"):
            continue
    return path, "".join(old), "".join(new)


def step_policy(replies: Sequence[str]) -> Callable[[str], str]:
    """The k-th reply once the prompt holds k tool results (deterministic under concurrency)."""

    def policy(prompt: str) -> str:
        step = prompt.count("<tool_response>")
        return replies[min(step, len(replies) - 1)]

    return policy


def fixing_policy(task: SweTask) -> Callable[[str], str]:
    """Looks at the file, makes one malformed call, applies the reference fix, re-reads, checks, submits."""
    path, old, new = first_hunk_edit(task.reference_patch)
    return step_policy(
        [
            "Let me look at the code first.\n" + tool_call("view_file", path=path),
            tool_call("open_file", path=path),  # no such tool: the harness must answer with an error
            "I see the bug.\n" + tool_call("edit_file", path=path, old_str=old, new_str=new),
            tool_call("view_file", path=path),
            tool_call("bash", command="python -m pytest -q -p no:cacheprovider tests && git diff --stat"),
            "The fix is in place.\n" + tool_call("submit"),
        ]
    )
