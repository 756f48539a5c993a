"""Gemini CLI (npm ``@google/gemini-cli``) as a black-box agent: headless mode (``-p``) speaking Google's
Gemini API to the proxy session.

Configured the way its source reads it (``packages/core/src/core/contentGenerator.ts``,
``packages/cli/src/config/auth.ts``, settings schema): ``GOOGLE_GEMINI_BASE_URL`` is the base URL of the
``@google/genai`` client (it appends ``/v1beta/models/{model}:streamGenerateContent?alt=sse``),
``GEMINI_API_KEY`` travels as ``x-goog-api-key``, and ``$HOME/.gemini/settings.json`` selects the API-key auth
(``security.auth.selectedType = "gemini-api-key"``: the ``gateway`` type the base URL would imply is refused
in headless mode), turns folder trust off (an untrusted folder silently downgrades ``--yolo``), telemetry,
usage statistics and update checks off, bounds the session (``model.maxSessionTurns``) and the API retries
(``general.maxAttempts``), and caps every reply (``modelConfigs.customOverrides`` on the ``base`` alias, which
every chat and utility model config extends: ``generationConfig.maxOutputTokens``).

Exit: 0 with a ``response`` → ok; 53 (``FatalTurnLimitedError``) → turn_limit; an API error naming the
context window or 413 → context_overflow, a 5xx → engine_error; anything else → agent_error. The JSON
result's ``stats`` give the request, tool-call and token counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from components.registry import HARNESSES
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import AGENTS_DIR, NODE24
from harnesses.agent_spec import AgentSpec, JsonFile
from harnesses.blackbox import AgentExit, BlackBoxBrickConfig, BlackBoxConfig, default_exit_status

# A Node (>= 20) bundle, run on the Node 24 under .agents: no system Node is needed, so it runs in images too.
GEMINI_EXECUTABLE = AGENTS_DIR / "node_modules" / "@google" / "gemini-cli" / "bundle" / "gemini.js"
TURN_LIMIT_EXIT_CODE = 53  # FatalTurnLimitedError (packages/core/src/utils/errors.ts)


def _last_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in ``text`` (Gemini CLI pretty-prints its result over many lines)."""
    decoder = json.JSONDecoder()
    found = None
    position = text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict):
            found = value
        position = text.find("{", end)
    return found


def read_gemini_result(
    run: AgentExit, config: BlackBoxConfig
) -> tuple[TrajectoryStatus, str, dict[str, float]]:
    """The exit code and the JSON result: its ``response`` or ``error``, and its ``stats``."""
    if run.timed_out:
        status, reason = default_exit_status(run, config)
        return status, reason, {}
    result = _last_json_object(run.stdout) or _last_json_object(run.stderr) or {}
    stats = result.get("stats") or {}
    models = (stats.get("models") or {}).values()
    metrics = {
        "num_turns": float(sum(int((m.get("api") or {}).get("totalRequests") or 0) for m in models)),
        "num_tool_calls": float((stats.get("tools") or {}).get("totalCalls") or 0),
        "num_response_tokens": float(
            sum(int((m.get("tokens") or {}).get("candidates") or 0) for m in models)
        ),
    }
    error = result.get("error") or {}
    message = str(error.get("message") or "")[:500]
    if run.exit_code == TURN_LIMIT_EXIT_CODE or error.get("type") == "FatalTurnLimitedError":
        return TrajectoryStatus.TURN_LIMIT, f"gemini reached maxSessionTurns {config.max_turns}", metrics
    if run.exit_code == 0 and "response" in result and not error:
        return TrajectoryStatus.OK, "", metrics
    status, reason = default_exit_status(run, config)
    if status == TrajectoryStatus.OK:
        return TrajectoryStatus.AGENT_ERROR, "gemini printed no JSON result", metrics
    lowered = message.lower()
    if "context_overflow" in lowered or "context window" in lowered or "413" in lowered:
        return TrajectoryStatus.CONTEXT_OVERFLOW, f"gemini: {message}", metrics
    if any(code in lowered for code in ("500", "502", "503", "unavailable", "fetch failed")):
        return TrajectoryStatus.ENGINE_ERROR, f"gemini: {message}", metrics
    return status, f"gemini: {message}" if message else reason, metrics


def GeminiCliAgent(*, max_attempts: int = 2) -> AgentSpec:
    """``gemini -p PROMPT --output-format json --model M --yolo`` with ``$HOME/.gemini/settings.json``.

    ``max_attempts``: API attempts per request (its default of 10 with backoff hides a failing proxy).
    ``--yolo`` because the sandbox, not Gemini CLI, is the permission boundary."""
    return AgentSpec(
        name="gemini-cli",
        paths=(AGENTS_DIR,),
        argv=(
            str(NODE24),
            str(GEMINI_EXECUTABLE),
            "-p",
            "{prompt}",
            "--output-format",
            "json",
            "--model",
            "{model}",
            "--yolo",
        ),
        env={
            "GOOGLE_GEMINI_BASE_URL": "{base_url}",
            "GEMINI_API_KEY": "{api_key}",
            "GEMINI_CLI_NO_RELAUNCH": "true",  # no child process re-spawned with a larger Node heap
            # Wasm memories (undici's llhttp, tree-sitter) reserve ~10 GB of address space each for
            # trap-handler bounds checks: under the sandbox's RLIMIT_AS the second one fails to start.
            # Node's documented switch for running under address-space limits:
            "NODE_OPTIONS": "--disable-wasm-trap-handler",
            "NO_COLOR": "1",
        },
        home_files={
            ".gemini/settings.json": JsonFile(
                {
                    "security": {
                        "auth": {"selectedType": "gemini-api-key"},
                        "folderTrust": {"enabled": False},
                    },
                    "privacy": {"usageStatisticsEnabled": False},
                    "telemetry": {"enabled": False},
                    "general": {
                        "disableAutoUpdate": True,
                        "disableUpdateNag": True,
                        "maxAttempts": max_attempts,
                    },
                    "model": {"maxSessionTurns": "{max_turns}"},
                    # every chat and utility model config extends the ``base`` alias; an unset output
                    # bound leaves the override empty
                    "modelConfigs": {
                        "customOverrides": [
                            {
                                "match": {"model": "base"},
                                "modelConfig": {
                                    "generateContentConfig": {"maxOutputTokens": "{max_output_tokens}"}
                                },
                            }
                        ]
                    },
                }
            )
        },
        exit=read_gemini_result,
    )


@HARNESSES.register("gemini_cli")
@dataclass(kw_only=True, frozen=True)
class GeminiCliBrickConfig(BlackBoxBrickConfig):
    """The ``harness`` kind ``gemini_cli``: the unmodified Gemini CLI (npm ``@google/gemini-cli``)."""

    def agent(self) -> AgentSpec:
        return GeminiCliAgent()
