"""Claude Code (npm ``@anthropic-ai/claude-code``) as a black-box agent: print mode with a turn limit,
``ANTHROPIC_BASE_URL`` pointed at the proxy session, a JSON result on stdout."""

from __future__ import annotations

import json
from dataclasses import dataclass

from components.config import option
from components.registry import HARNESSES
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import AGENTS_DIR, npm_agent_executable
from harnesses.agent_spec import AgentSpec, JsonFile
from harnesses.blackbox import AgentExit, BlackBoxBrickConfig, BlackBoxConfig, default_exit_status


def _last_json_object(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def read_claude_result(
    run: AgentExit, config: BlackBoxConfig
) -> tuple[TrajectoryStatus, str, dict[str, float]]:
    """Read the ``{"type": "result", "subtype": …}`` line: success, error_max_turns, or an error."""
    if run.timed_out:
        status, reason = default_exit_status(run, config)
        return status, reason, {}
    result = _last_json_object(run.stdout)
    if result is None or result.get("type") != "result":
        status, reason = default_exit_status(run, config)
        if status == TrajectoryStatus.OK:
            status, reason = TrajectoryStatus.AGENT_ERROR, "claude printed no JSON result"
        return status, reason, {}
    usage = result.get("usage") or {}
    metrics = {
        "num_turns": float(result.get("num_turns") or 0),
        "num_response_tokens": float(usage.get("output_tokens") or 0),
    }
    subtype = str(result.get("subtype", ""))
    text = str(result.get("result") or result.get("errors") or "")[:500]
    if subtype == "error_max_turns":
        return TrajectoryStatus.TURN_LIMIT, f"claude reached --max-turns {config.max_turns}", metrics
    if subtype == "success" and not result.get("is_error"):
        return TrajectoryStatus.OK, "", metrics
    lowered = text.lower()
    if "output token maximum" in lowered:
        # The policy kept writing past its reply budget and Claude Code gave up: the policy's doing.
        metrics["output_limit_reached"] = 1.0
        return TrajectoryStatus.OK, "", metrics
    if "prompt is too long" in lowered or "context" in lowered and "413" in lowered:
        return TrajectoryStatus.CONTEXT_OVERFLOW, f"claude: {text}", metrics
    if "api error" in lowered and any(code in lowered for code in ("500", "502", "503", "529", "connection")):
        return TrajectoryStatus.ENGINE_ERROR, f"claude: {text}", metrics
    return TrajectoryStatus.AGENT_ERROR, f"claude ended with {subtype or 'an error'}: {text}", metrics


def ClaudeCodeAgent(*, bare: bool = False, max_retries: int = 2) -> AgentSpec:
    """``claude -p PROMPT --max-turns N --output-format json --dangerously-skip-permissions``.

    ``bare``: Claude Code's documented minimal mode (tools Bash/Edit/Read, no hooks, plugins, memory or
    CLAUDE.md discovery, ~1k prompt tokens instead of ~20k); off: the full agent as users run it.
    ``max_retries``: API retries (CLAUDE_CODE_MAX_RETRIES); Claude Code's default of 10 with backoff spends
    minutes on a failing proxy before the run can be classified. The sandbox, not Claude Code, is the
    permission boundary. Its npm install is a native binary: no Node needed.
    """
    return AgentSpec(
        name="claude-code",
        paths=(AGENTS_DIR,),
        argv=(
            str(npm_agent_executable("claude")),
            *("-p", "{prompt}", "--max-turns", "{max_turns}", "--output-format", "json"),
            *("--model", "{model}", "--dangerously-skip-permissions"),
            *(("--bare",) if bare else ()),
        ),
        env={
            "ANTHROPIC_BASE_URL": "{base_url}",
            "ANTHROPIC_API_KEY": "{api_key}",
            "ANTHROPIC_SMALL_FAST_MODEL": "{model}",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": str(max_retries),
            "IS_SANDBOX": "1",  # allows --dangerously-skip-permissions when the sandbox user is root
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "{max_output_tokens}",
        },
        home_files={
            ".claude.json": JsonFile({"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True})
        },
        exit=read_claude_result,
    )


@HARNESSES.register("claude_code")
@dataclass(kw_only=True, frozen=True)
class ClaudeCodeBrickConfig(BlackBoxBrickConfig):
    """The ``harness`` kind ``claude_code``: the unmodified ``claude`` CLI (a black-box agent)."""

    bare: bool = option(
        True, "claude_code: --bare mode (~1k prompt tokens instead of ~20k)", flag="claude-code-bare"
    )

    def agent(self) -> AgentSpec:
        return ClaudeCodeAgent(bare=self.bare)
