"""opencode (npm ``opencode-ai``) as a black-box agent: ``opencode run --format json``, with the proxy session as
a custom OpenAI-compatible provider in ``$HOME/.config/opencode/opencode.json`` (opencode's bundled
``@ai-sdk/openai-compatible``: Chat Completions), the turn bound as the build agent's ``steps``, the output bound as the model's ``limit.output``.
Its turn bound, read in its source (``SessionRunner.runTurn``): once a session has made ``steps`` steps, the
next request ends the conversation with an assistant message (its ``MAX_STEPS`` text, a prefill) with tools
off. The proxy refuses that request (400: TITO does not continue prefilled replies, ``PREFILL_REFUSAL``), and
``read_opencode_events`` reads exactly that refusal after ``max_turns`` steps as the turn bound; ``steps`` is
``max_turns + 1`` so that ``max_turns`` model calls are made (the wrap-up is never sampled, never trained). Its npm install is a native
(Bun) binary that needs only libc, so it also runs in image sandboxes."""

from __future__ import annotations

import json
from dataclasses import dataclass

from components.registry import HARNESSES
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import AGENTS_DIR
from harnesses.agent_spec import AgentSpec, ExitRules, JsonFile, OutputRule
from harnesses.blackbox import AgentExit, BlackBoxBrickConfig, BlackBoxConfig

NATIVE_OPENCODE = AGENTS_DIR / "node_modules" / "opencode-linux-x64" / "bin" / "opencode"
CONTEXT_WINDOW = 32_768  # what opencode is told (it compacts near it); the proxy enforces the real one


def _events(run: AgentExit) -> list[dict]:
    events = []
    for line in run.stdout.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def opencode_metrics(run: AgentExit) -> dict[str, float]:
    """Steps, tool calls and output tokens from the ``--format json`` events."""
    events = _events(run)
    steps = [e for e in events if e.get("type") == "step_finish"]
    return {
        "num_turns": float(len(steps)),
        "num_tool_calls": float(sum(e.get("type") == "tool_use" for e in events)),
        "num_response_tokens": float(
            sum((e.get("part") or {}).get("tokens", {}).get("output", 0) for e in steps)
        ),
    }


# What the proxy answers (400) to a request whose last message is an assistant message (components/tito/session.py)
PREFILL_REFUSAL = "continuing a prefilled reply is not supported"


def read_opencode_events(
    run: AgentExit, config: BlackBoxConfig
) -> tuple[TrajectoryStatus, str, dict[str, float]]:
    """The declared rules, then opencode's own turn bound: after ``steps`` model calls it sends one more request
    ending in an assistant message (its wrap-up prefill, tools off); the proxy refuses it, opencode prints that
    error and exits. A run that made its ``max_turns`` steps and whose only failure is that refusal (or none)
    ended on its turn bound; the same refusal before the bound is the agent's error; any other failure after
    the bound goes through the declared rules; a run that printed an error event and made no step failed."""
    status, reason, metrics = OPENCODE_EXIT(run, config)
    if run.timed_out:
        return status, reason, metrics
    errors = [json.dumps(e.get("error") or e)[:500] for e in _events(run) if e.get("type") == "error"]
    other_errors = [text for text in errors if PREFILL_REFUSAL not in text]
    if metrics["num_turns"] >= config.max_turns and not other_errors:
        refused = "its wrap-up (an assistant prefill) refused by the proxy" if errors else "no wrap-up sent"
        return (
            TrajectoryStatus.TURN_LIMIT,
            f"opencode reached its {config.max_turns} steps; {refused}",
            metrics,
        )
    if len(other_errors) < len(errors) and metrics["num_turns"] < config.max_turns:
        return (
            TrajectoryStatus.AGENT_ERROR,
            "opencode sent an assistant prefill before its step bound",
            metrics,
        )
    if status == TrajectoryStatus.OK and other_errors and metrics["num_turns"] == 0:
        return TrajectoryStatus.ENGINE_ERROR, f"opencode: {other_errors[-1]}", metrics
    return status, reason, metrics


OPENCODE_EXIT = ExitRules(
    rules=(
        OutputRule(r"context.{0,40}(window|length|too long)", TrajectoryStatus.CONTEXT_OVERFLOW),
        OutputRule(
            r"(ECONNREFUSED|Unable to connect|fetch failed|\"statusCode\":\s*5\d\d)[^\n]{0,200}",
            TrajectoryStatus.ENGINE_ERROR,
            "opencode: {match}",
        ),
    ),
    metrics=opencode_metrics,
)

OPENCODE = AgentSpec(
    name="opencode",
    paths=(AGENTS_DIR,),
    argv=(
        str(NATIVE_OPENCODE),
        "run",
        "--format",
        "json",
        "--pure",
        "--auto",
        "--model",
        "rein/{model}",
        "{prompt}",
    ),
    env={
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",  # no models.dev catalogue download
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",  # no plugin installs from npm
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",  # no ~/.claude prompts or skills
        "NO_COLOR": "1",
    },
    home_files={
        ".config/opencode/opencode.json": JsonFile(
            {
                "$schema": "https://opencode.ai/config.json",
                "model": "rein/{model}",
                "small_model": "rein/{model}",
                "autoupdate": False,
                "share": "disabled",
                "provider": {
                    "rein": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Rein policy",
                        "options": {"baseURL": "{base_url}/v1", "apiKey": "{api_key}"},
                        "models": {
                            "{model}": {
                                "name": "{model}",
                                "tool_call": True,
                                "limit": {"context": CONTEXT_WINDOW, "output": "{max_output_tokens}"},
                            }
                        },
                    }
                },
                "agent": {"build": {"steps": lambda values: values.max_turns + 1}},
            }
        )
    },
    exit=read_opencode_events,
)


def OpencodeAgent() -> AgentSpec:
    """opencode as a black-box agent (see the module docstring)."""
    return OPENCODE


@HARNESSES.register("opencode")
@dataclass(kw_only=True, frozen=True)
class OpencodeBrickConfig(BlackBoxBrickConfig):
    """The ``harness`` kind ``opencode``: the unmodified opencode (npm ``opencode-ai``) CLI (a black-box agent)."""

    def agent(self) -> AgentSpec:
        return OpencodeAgent()
