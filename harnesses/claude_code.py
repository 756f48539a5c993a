"""Claude Code (npm ``@anthropic-ai/claude-code``) as a black-box agent: print mode with a turn limit,
``ANTHROPIC_BASE_URL`` pointed at the proxy session, a JSON result on stdout."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from components.config import option
from components.protocols import Harness
from components.registry import HARNESSES
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import AGENTS_DIR, existing, npm_agent_executable
from harnesses.blackbox import AgentExit, AgentLaunch, BlackBoxConfig, black_box_harness, default_exit_status


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


@dataclass(frozen=True)
class ClaudeCodeAgent:
    """``claude -p PROMPT --max-turns N --output-format json --dangerously-skip-permissions``."""

    executable: Path = npm_agent_executable("claude")
    name: str = "claude-code"
    # ``--bare``: Claude Code's documented minimal mode (tools Bash/Edit/Read, no hooks, plugins, memory or
    # CLAUDE.md discovery, ~1k prompt tokens instead of ~20k). Off: the full agent as users run it.
    bare: bool = False
    # API retries (CLAUDE_CODE_MAX_RETRIES); Claude Code's default of 10 with backoff spends minutes on a
    # failing proxy before the run can be classified.
    max_retries: int = 2

    def read_only_paths(self) -> tuple[str, ...]:
        """The npm install (a native binary; no Node needed)."""
        return existing([AGENTS_DIR])

    def launch(
        self, *, prompt: str, base_url: str, api_key: str, home: str, config: BlackBoxConfig
    ) -> AgentLaunch:
        """Print mode against the session; the sandbox, not Claude Code, is the permission boundary."""
        return AgentLaunch(
            argv=(
                str(self.executable),
                "-p",
                prompt,
                "--max-turns",
                str(config.max_turns),
                "--output-format",
                "json",
                "--model",
                config.model,
                "--dangerously-skip-permissions",
                *(("--bare",) if self.bare else ()),
            ),
            env={
                "ANTHROPIC_BASE_URL": base_url,
                "ANTHROPIC_API_KEY": api_key,
                "ANTHROPIC_SMALL_FAST_MODEL": config.model,
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_AUTOUPDATER": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CODE_MAX_RETRIES": str(self.max_retries),
                "IS_SANDBOX": "1",  # allows --dangerously-skip-permissions when the sandbox user is root
                **(
                    {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(config.max_output_tokens)}
                    if config.max_output_tokens
                    else {}
                ),
            },
            home_files={
                ".claude.json": json.dumps(
                    {"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True}
                )
            },
        )

    def read_exit(
        self, run: AgentExit, config: BlackBoxConfig
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
        if "api error" in lowered and any(
            code in lowered for code in ("500", "502", "503", "529", "connection")
        ):
            return TrajectoryStatus.ENGINE_ERROR, f"claude: {text}", metrics
        return TrajectoryStatus.AGENT_ERROR, f"claude ended with {subtype or 'an error'}: {text}", metrics


@HARNESSES.register("claude_code")
@dataclass(kw_only=True, frozen=True)
class ClaudeCodeBrickConfig:
    """The ``harness`` kind ``claude_code``: the unmodified ``claude`` CLI (a black-box agent)."""

    bare: bool = option(
        True, "claude_code: --bare mode (~1k prompt tokens instead of ~20k)", flag="claude-code-bare"
    )

    def agent(self) -> ClaudeCodeAgent:
        return ClaudeCodeAgent(bare=self.bare)

    def read_only_paths(self) -> tuple[str, ...]:
        return self.agent().read_only_paths()

    def build(self, *, max_turns: int, wall_time_s: float, max_tokens: int, temperature: float) -> Harness:
        return black_box_harness(
            self.agent(), max_turns=max_turns, wall_time_s=wall_time_s, max_tokens=max_tokens
        )
