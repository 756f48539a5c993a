"""OpenClaw (npm ``openclaw``) as a black-box agent: ``openclaw agent exec --config FILE --json`` (its documented
headless CI entry point: temporary state, no Gateway) on Node 24, with the proxy session declared as a custom
provider in the pinned config (``api: "openai-completions"``: Chat Completions) and the output bound as the
model's ``maxTokens``. OpenClaw has no turn setting for an embedded run: its own ``--timeout`` (the wall time) and
the sandbox's ``timeout`` bound it, as Codex. Exit 0 ok, 1 a model or result error, 2 its deadline.

Its run state lives in ``--state-dir`` (``$HOME/.openclaw``: the run's own, so runs share nothing), whose agent
directory (``agents/main/agent``) holds the embedded agent's ``settings.json``: ``retry.provider.maxRetries``
(its docs, concepts/retry.md; read by ``SettingsManager.getProviderRetrySettings`` as the transient retry budget
of a model call: eight retries in a 90 s window by default, 0 none) is ``OpenClawAgent(max_retries=…)``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from components.registry import HARNESSES
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import AGENTS_DIR, NODE24
from harnesses.agent_spec import AgentSpec, ExitRules, JsonFile, OutputRule
from harnesses.blackbox import AgentExit, BlackBoxBrickConfig

OPENCLAW_ENTRY = AGENTS_DIR / "node_modules" / "openclaw" / "openclaw.mjs"
CONTEXT_WINDOW = 32_768
STATE_DIR = ".openclaw"  # under the run's HOME
AGENT_SETTINGS = (
    f"{STATE_DIR}/agents/main/agent/settings.json"  # the default agent's directory in the state dir
)


def openclaw_metrics(run: AgentExit) -> dict[str, float]:
    """Assistant turns, tool calls and output tokens from the ``--json`` envelope."""
    start = run.stdout.find("{")
    try:
        envelope = json.loads(run.stdout[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        return {}
    if not isinstance(envelope, dict):
        return {}
    return {
        "num_turns": float(envelope.get("assistantTurns") or 0),
        "num_tool_calls": float((envelope.get("toolSummary") or {}).get("calls") or 0),
        "num_response_tokens": float((envelope.get("usage") or {}).get("output") or 0),
    }


def OpenClawAgent(*, max_retries: int | None = None) -> AgentSpec:
    """OpenClaw as a black-box agent (see the module docstring). ``max_retries``: its provider retry budget per
    model call (``retry.provider.maxRetries``); None: its default."""
    retry = {} if max_retries is None else {"retry": {"provider": {"maxRetries": max_retries}}}
    return dataclasses.replace(
        _OPENCLAW, home_files={**_OPENCLAW.home_files, AGENT_SETTINGS: JsonFile(retry)}
    )


_OPENCLAW = AgentSpec(
    name="openclaw",
    paths=(AGENTS_DIR,),
    argv=(
        *(str(NODE24), str(OPENCLAW_ENTRY), "agent", "exec", "--config", "{home}/openclaw.json"),
        *("--state-dir", f"{{home}}/{STATE_DIR}"),  # exists: the settings file below is written into it
        *("--model", "rein/{model}", "--json", "--timeout", "{wall_time_s}", "{prompt}"),
    ),
    # documented switches (docs/gateway/config-runtime.md, telemetry.md): no update request or notice
    env={"NO_COLOR": "1", "OPENCLAW_NO_AUTO_UPDATE": "1"},
    home_files={
        "openclaw.json": JsonFile(
            {
                "models": {
                    "mode": "replace",  # only this provider: no catalogue discovery
                    "providers": {
                        "rein": {
                            "baseUrl": "{base_url}/v1",
                            "apiKey": "{api_key}",
                            "api": "openai-completions",
                            "models": [
                                {
                                    "id": "{model}",
                                    "name": "{model}",
                                    "reasoning": False,
                                    "input": ["text"],
                                    "contextWindow": CONTEXT_WINDOW,
                                    "maxTokens": "{max_output_tokens}",
                                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                                }
                            ],
                        }
                    },
                },
                "agents": {"defaults": {"model": {"primary": "rein/{model}"}}},
                "update": {"checkOnStart": False},
            }
        )
    },
    exit=ExitRules(
        exit_codes={2: TrajectoryStatus.TIMEOUT},
        rules=(
            OutputRule(r"context.{0,40}(window|overflow|too long)", TrajectoryStatus.CONTEXT_OVERFLOW),
            OutputRule(
                r"(ECONNREFUSED|fetch failed|Connection error|(status|HTTP)[ :]*5\d\d\b|\b5\d\d (Internal|Bad Gateway|Service))[^\n]{0,200}",
                TrajectoryStatus.ENGINE_ERROR,
                "openclaw: {match}",
            ),
        ),
        metrics=openclaw_metrics,
    ),
    turn_bound="proxy",  # no turn setting for an embedded run
)
OPENCLAW = OpenClawAgent()


@HARNESSES.register("openclaw")
@dataclass(kw_only=True, frozen=True)
class OpenClawBrickConfig(BlackBoxBrickConfig):
    """The ``harness`` kind ``openclaw``: the unmodified OpenClaw CLI (a black-box agent)."""

    def agent(self) -> AgentSpec:
        return OpenClawAgent()
