"""mini-swe-agent (PyPI ``mini-swe-agent``, from the project's virtual environment) as a black-box agent:
litellm ``api_base`` pointed at the proxy session, ``agent.step_limit`` as the turn bound, and the exit status
read from the trajectory file it writes."""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from components.registry import HARNESSES
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import python_environment_paths
from harnesses.agent_spec import AgentSpec
from harnesses.blackbox import AgentExit, BlackBoxBrickConfig, BlackBoxConfig, default_exit_status

_ENGINE_FAILURES = (
    "APIConnectionError",
    "InternalServerError",
    "ServiceUnavailableError",
    "Timeout",
    "APIError",
)


TRAJECTORY = "{home}/mini.traj.json"


def read_mini_exit_status(
    run: AgentExit, config: BlackBoxConfig
) -> tuple[TrajectoryStatus, str, dict[str, float]]:
    """Map mini's ``info.exit_status`` (Submitted, LimitsExceeded, an exception name …) to a status."""
    if run.timed_out:
        status, reason = default_exit_status(run, config)
        return status, reason, {}
    try:
        info = json.loads(run.report.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        status, reason = default_exit_status(run, config)
        if status == TrajectoryStatus.OK:
            status, reason = (
                TrajectoryStatus.AGENT_ERROR,
                f"mini wrote no trajectory: {run.report[-300:]}",
            )
        return status, reason, {}
    exit_status = str(info.get("exit_status", ""))
    metrics = {"num_turns": float(info.get("api_calls") or 0)}
    if exit_status in ("Submitted", "RepeatedFormatError"):
        # RepeatedFormatError: the policy kept answering without a usable tool call; that is its doing.
        return TrajectoryStatus.OK, "", metrics
    if exit_status == "LimitsExceeded":
        return TrajectoryStatus.TURN_LIMIT, f"mini reached agent.step_limit={config.max_turns}", metrics
    if exit_status == "TimeExceeded":
        return TrajectoryStatus.TIMEOUT, "mini reached its wall-time limit", metrics
    if exit_status == "ContextWindowExceededError":
        return TrajectoryStatus.CONTEXT_OVERFLOW, "mini: context window exceeded", metrics
    if exit_status in _ENGINE_FAILURES:
        return TrajectoryStatus.ENGINE_ERROR, f"mini: {exit_status}", metrics
    return (
        TrajectoryStatus.AGENT_ERROR,
        f"mini ended with {exit_status or f'exit code {run.exit_code}'}",
        metrics,
    )


def MiniSweAgent(*, executable: Path | None = None, max_attempts: int = 2) -> AgentSpec:
    """``mini -y --exit-immediately -m openai/MODEL -c mini.yaml -c model.model_kwargs.api_base=…`` from the
    project's virtual environment (bound read-only with the Python it was made from), its global config dir
    and trajectory file in HOME. ``max_attempts``: its attempts per model call
    (``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT``, read by ``minisweagent.models.utils.retry``; its own default 10,
    with exponential back-off)."""
    return AgentSpec(
        name="mini-swe-agent",
        paths=python_environment_paths(),
        argv=(
            str(executable or Path(sys.prefix) / "bin" / "mini"),
            *("-y", "--exit-immediately", "-m", "openai/{model}", "-t", "{prompt}", "-o", TRAJECTORY),
            *("-c", "mini.yaml", "-c", "model.model_kwargs.api_base={base_url}/v1"),
            *("-c", "model.model_kwargs.api_key={api_key}", "-c", "environment.environment_class=local"),
            *("-c", "agent.step_limit={max_turns}", "-c", "agent.cost_limit=0"),
            ("-c", "model.model_kwargs.max_tokens={max_output_tokens}"),
        ),
        env={
            "MSWEA_CONFIGURED": "true",
            "MSWEA_GLOBAL_CONFIG_DIR": "{home}/.mini",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(max_attempts),
            "MSWEA_SILENT_STARTUP": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        report_command=(
            f"{shlex.quote(str(Path(sys.prefix) / 'bin' / 'python'))} -c 'import json,sys; "
            'info=json.load(open(sys.argv[1]))["info"]; '
            'print(json.dumps({"exit_status": info.get("exit_status", ""), '
            '"api_calls": info.get("model_stats", {}).get("api_calls", 0)}))\' '
            '"$HOME/mini.traj.json"'
        ),
        exit=read_mini_exit_status,
    )


@HARNESSES.register("mini_swe_agent")
@dataclass(kw_only=True, frozen=True)
class MiniSweAgentBrickConfig(BlackBoxBrickConfig):
    """The ``harness`` kind ``mini_swe_agent``: the unmodified PyPI mini-swe-agent (a black-box agent)."""

    def agent(self) -> AgentSpec:
        return MiniSweAgent()
