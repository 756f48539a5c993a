"""Codex CLI (npm ``@openai/codex``) as a black-box agent: ``codex exec`` with a ``config.toml`` provider
(``wire_api = "responses"``) whose ``base_url`` is the proxy session. Codex has no turn flag, so only the wall
clock bounds it; its ``--json`` events give the turn and command counts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from components.registry import HARNESSES
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import AGENTS_DIR
from harnesses.agent_spec import AgentSpec, TomlFile
from harnesses.blackbox import AgentExit, BlackBoxBrickConfig, BlackBoxConfig, default_exit_status

API_KEY_ENV = "REIN_API_KEY"


# npm's ``codex`` launcher is a Node script that only picks this static (musl) binary for the platform, sets two
# environment variables and execs it. Running the binary directly needs no Node, so Codex also runs in image
# sandboxes, whose /usr is the image's own.
NATIVE_CODEX = (
    AGENTS_DIR
    / "node_modules"
    / "@openai"
    / "codex-linux-x64"
    / "vendor"
    / "x86_64-unknown-linux-musl"
    / "bin"
    / "codex"
)


def read_codex_events(
    run: AgentExit, config: BlackBoxConfig
) -> tuple[TrajectoryStatus, str, dict[str, float]]:
    """Exit status plus the JSONL events: completed turns, commands run, and failure messages."""
    num_turns = num_commands = 0
    num_output_tokens = 0
    errors: list[str] = []
    for line in run.stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        if kind == "turn.completed":
            num_turns += 1
            num_output_tokens += int((event.get("usage") or {}).get("output_tokens") or 0)
        elif kind == "item.completed" and (event.get("item") or {}).get("type") == "command_execution":
            num_commands += 1
        elif kind in ("turn.failed", "error"):
            errors.append(str(event.get("message") or event.get("error") or event)[:300])
    metrics = {
        "num_turns": float(num_turns),
        "num_tool_calls": float(num_commands),
        "num_response_tokens": float(num_output_tokens),
    }
    status, reason = default_exit_status(run, config)
    if status == TrajectoryStatus.OK and errors and num_turns == 0:
        status, reason = TrajectoryStatus.AGENT_ERROR, "codex: " + "; ".join(errors)
    if status == TrajectoryStatus.AGENT_ERROR and errors:
        text = "; ".join(errors)
        lowered = text.lower()
        if "context window" in lowered or "context_length" in lowered or "413" in lowered:
            return TrajectoryStatus.CONTEXT_OVERFLOW, f"codex: {text}", metrics
        if any(word in lowered for word in ("500", "502", "503", "stream disconnected", "connection")):
            return TrajectoryStatus.ENGINE_ERROR, f"codex: {text}", metrics
        reason = f"codex: {text}"
    return status, reason, metrics


def CodexAgent(
    *,
    executable: Path = NATIVE_CODEX,
    auto_compact_token_limit: int | None = None,
    multi_agent: bool = False,
) -> AgentSpec:
    """``codex exec --skip-git-repo-check --json --dangerously-bypass-approvals-and-sandbox PROMPT`` with one
    provider in ``$CODEX_HOME/config.toml`` pointing at the proxy session; codex's own sandbox is off because
    bwrap already is one. ``auto_compact_token_limit``: its ``model_auto_compact_token_limit`` (compact the
    history once a turn's tokens pass it); None: its default for the model. ``multi_agent``: its
    ``[features] multi_agent`` (its sub-agent tools, ``spawn_agent`` … in the ``multi_agent_v1`` namespace: each
    sub-agent is a conversation of its own through the same session, labelled ``subagent`` under the call that
    spawned it)."""
    compaction = (
        {}
        if auto_compact_token_limit is None
        else {"model_auto_compact_token_limit": auto_compact_token_limit}
    )
    features = {"features": {"multi_agent": True}} if multi_agent else {}
    return AgentSpec(
        name="codex",
        paths=(AGENTS_DIR,),  # the native binary; no Node needed
        argv=(
            str(executable),
            *("exec", "--skip-git-repo-check", "--json", "--dangerously-bypass-approvals-and-sandbox"),
            *("--color", "never", "{prompt}"),
        ),
        env={
            API_KEY_ENV: "{api_key}",
            "CODEX_HOME": "{home}/.codex",
            "NO_COLOR": "1",
            # What the npm launcher sets before it execs the binary (no self-update prompts).
            "CODEX_MANAGED_BY_NPM": "1",
            "CODEX_MANAGED_PACKAGE_ROOT": str(AGENTS_DIR / "node_modules" / "@openai" / "codex"),
        },
        home_files={
            ".codex/config.toml": TomlFile(
                {
                    "model": "{model}",
                    "model_provider": "rein",
                    "approval_policy": "never",
                    "sandbox_mode": "danger-full-access",
                    "check_for_update_on_startup": False,
                    **compaction,
                    "model_providers": {
                        "rein": {
                            "name": "rein",
                            "base_url": "{base_url}/v1",
                            "wire_api": "responses",
                            "env_key": API_KEY_ENV,
                            "request_max_retries": 1,
                            "stream_max_retries": 1,
                        }
                    },
                    "analytics": {"enabled": False},
                    **features,
                }
            )
        },
        exit=read_codex_events,
        turn_bound="proxy",  # `codex exec` has no turn setting
    )


@HARNESSES.register("codex")
@dataclass(kw_only=True, frozen=True)
class CodexBrickConfig(BlackBoxBrickConfig):
    """The ``harness`` kind ``codex``: the unmodified Codex CLI (a black-box agent)."""

    multi_agent: bool = False  # Codex's sub-agent tools (``[features] multi_agent``)

    def agent(self) -> AgentSpec:
        return CodexAgent(multi_agent=self.multi_agent)
