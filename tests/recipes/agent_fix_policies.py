"""A scripted policy that fixes the built-in tasks with each added agent's own tools, for the recipe step run
against the SGLang stand-in (``fake_sglang --scripted-policy tests.recipes.agent_fix_policies:fix_with_any_agent``):
the tiny model cannot fix anything. It finds the task by its problem statement in the prompt and the agent by
the tools the prompt offers, and applies the task's reference patch: opencode through its ``bash`` tool,
OpenClaw through ``exec``, Qwen Code through its shell, Gemini CLI through ``write_file`` then its shell (its
shell refuses any command holding ``$(`` or backticks). After the fix the agents with a turn setting keep
calling their shell until it stops them; OpenClaw, which has none, says it is done."""

from __future__ import annotations

import functools

from components.engine.scripted_policies import step_policy, tool_call
from components.tasks.builtin import load_builtin_tasks

CHECK = "python -m pytest -q -p no:cacheprovider tests"


@functools.cache
def _patches_by_statement() -> dict[str, str]:
    return {task.problem_statement.strip(): task.reference_patch for task in load_builtin_tasks()}


def _patch_for(prompt: str) -> str:
    found = [patch for statement, patch in _patches_by_statement().items() if statement in prompt]
    assert len(found) == 1, f"{len(found)} built-in tasks match the prompt"
    return found[0]


def _offers(prompt: str, tool: str) -> bool:
    return f'"name": "{tool}"' in prompt


def fix_with_any_agent(prompt: str) -> str:
    """The next reply of whichever added agent sent ``prompt``."""
    patch = _patch_for(prompt)
    heredoc = f"patch -p1 <<'REIN_EOF'\n{patch}REIN_EOF\necho patched"
    shell = lambda command: tool_call("run_shell_command", command=command, description="run")  # noqa: E731
    if _offers(prompt, "run_shell_command") and "Qwen Code" in prompt:  # its system prompt names it
        replies = [shell(heredoc), shell(CHECK)]
    elif _offers(prompt, "run_shell_command"):  # Gemini CLI
        replies = [
            tool_call("write_file", file_path="fix.patch", content=patch),
            shell("patch -p1 < fix.patch && rm fix.patch && echo patched"),
            shell(CHECK),
        ]
    elif _offers(prompt, "exec"):  # OpenClaw
        replies = [tool_call("exec", command=heredoc), "Done: the fix is in."]
    else:  # opencode
        replies = [tool_call("bash", command=heredoc), tool_call("bash", command=CHECK)]
    return step_policy(replies)(prompt)
