"""Qwen Code (npm ``@qwen-code/qwen-code``) as a black-box agent: headless ``qwen -p PROMPT --yolo
--output-format json`` on Node 24, its ``$HOME/.qwen/settings.json`` selecting the OpenAI-compatible auth with
the proxy session as ``baseUrl`` (Chat Completions), ``model.maxSessionTurns`` as the turn bound (exit 53 when
reached) and ``samplingParams.max_tokens`` as the output bound.

``model.generationConfig.maxRetries`` (``QwenCodeAgent(max_retries=…)``) bounds its OpenAI client's retries and its
rate-limit retries; its stream retry of a failing call (``retryWithBackoff`` in ``GeminiChat``: 7 attempts from
1.5 s, doubling) has no setting, so only its wall time bounds a run against an engine that keeps failing."""

from __future__ import annotations

import json
from dataclasses import dataclass

from components.registry import HARNESSES
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import AGENTS_DIR, NODE24
from harnesses.agent_spec import AgentSpec, ExitRules, JsonFile, OutputRule
from harnesses.blackbox import AgentExit, BlackBoxBrickConfig

QWEN_ENTRY = AGENTS_DIR / "node_modules" / "@qwen-code" / "qwen-code" / "cli-entry.js"


def qwen_metrics(run: AgentExit) -> dict[str, float]:
    """Turns and output tokens of the ``result`` entry of its JSON output (a list of messages)."""
    try:
        entries = json.loads(run.stdout.strip() or "[]")
    except json.JSONDecodeError:
        return {}
    results = (
        [e for e in entries if isinstance(e, dict) and e.get("type") == "result"]
        if isinstance(entries, list)
        else []
    )
    if not results:
        return {}
    usage = results[-1].get("usage") or {}
    return {
        "num_turns": float(results[-1].get("num_turns") or 0),
        "num_response_tokens": float(usage.get("output_tokens") or 0),
    }


def QwenCodeAgent(*, max_retries: int = 1) -> AgentSpec:
    """Qwen Code as a black-box agent (see the module docstring)."""
    return AgentSpec(
        name="qwen-code",
        paths=(AGENTS_DIR,),
        argv=(str(NODE24), str(QWEN_ENTRY), "-p", "{prompt}", "--yolo", "--output-format", "json"),
        env={
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",  # bwrap, not Qwen Code, is the sandbox
            "NO_COLOR": "1",
        },
        home_files={
            ".qwen/settings.json": JsonFile(
                {
                    "security": {
                        "auth": {"selectedType": "openai", "apiKey": "{api_key}", "baseUrl": "{base_url}/v1"}
                    },
                    "model": {
                        "name": "{model}",
                        "maxSessionTurns": "{max_turns}",
                        "generationConfig": {
                            "maxRetries": max_retries,
                            "samplingParams": {"max_tokens": "{max_output_tokens}"},
                        },
                    },
                    "privacy": {"usageStatisticsEnabled": False},
                    "telemetry": {"enabled": False},
                    "general": {"enableAutoUpdate": False},
                }
            )
        },
        exit=ExitRules(
            # Its FatalError exit codes: 53 turn limit, 55 budget (wall time / tool calls), 52 bad config.
            exit_codes={53: TrajectoryStatus.TURN_LIMIT, 55: TrajectoryStatus.TIMEOUT},
            rules=(
                OutputRule(
                    r"(context|token).{0,40}(window|length|limit exceeded|too long)",
                    TrajectoryStatus.CONTEXT_OVERFLOW,
                ),
                OutputRule(
                    r"(Connection error|ECONNREFUSED|fetch failed|\b50[0234]\b (status code|Internal|Bad|Service))[^\n]{0,200}",
                    TrajectoryStatus.ENGINE_ERROR,
                    "qwen: {match}",
                ),
            ),
            metrics=qwen_metrics,
        ),
    )


QWEN_CODE = QwenCodeAgent()


@HARNESSES.register("qwen_code")
@dataclass(kw_only=True, frozen=True)
class QwenCodeBrickConfig(BlackBoxBrickConfig):
    """The ``harness`` kind ``qwen_code``: the unmodified Qwen Code (npm ``@qwen-code/qwen-code``) CLI (a black-box agent)."""

    def agent(self) -> AgentSpec:
        return QwenCodeAgent()
