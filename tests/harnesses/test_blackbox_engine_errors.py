"""An agent that stopped because the engine failed is an ``engine_error`` (infrastructure: not trained on), not
an ``agent_error``, even when the agent is a black box that only saw an HTTP 5xx and exited in its own way.

The proxy records each failed engine call on the session; the runner reads that record (``describe``) and
reclassifies the agent's failure. Real proxy (real HTTP), real bubblewrap sandbox, real grader.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import existing, python_environment_paths
from harnesses.blackbox import AgentExit, AgentLaunch, BlackBoxConfig, BlackBoxHarness, default_exit_status
from harnesses.mini_swe_agent import MiniSweAgent
from tests.failing_bricks import FailingEngine
from tests.harnesses.harness_fixtures import running_proxy

# One chat completion with the OpenAI wire format over plain urllib; any HTTP error makes the agent exit 1
# with its own message (which is all a black-box agent would say about a failing engine).
_ONE_CALL = """
import json, sys, urllib.request
request = urllib.request.Request(
    sys.argv[1] + "/v1/chat/completions",
    data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + sys.argv[2]},
)
try:
    urllib.request.urlopen(request, timeout=60).read()
except Exception as error:
    sys.exit(f"my model call failed: {error}")
"""


@dataclass(frozen=True)
class OneCallAgent:
    """A minimal black-box agent: one model call, exit 1 on any failure."""

    name: str = "one-call-agent"
    turn_bound: Literal["agent", "proxy"] = "agent"

    def read_only_paths(self) -> tuple[str, ...]:
        return existing(python_environment_paths())

    def launch(
        self, *, prompt: str, base_url: str, api_key: str, home: str, config: BlackBoxConfig
    ) -> AgentLaunch:
        python = shlex.quote(str(Path(sys.prefix) / "bin" / "python"))
        return AgentLaunch(
            argv=("bash", "-c", f'{python} -c "$1" "$2" "$3"', "agent", _ONE_CALL, base_url, api_key)
        )

    def read_exit(
        self, run: AgentExit, config: BlackBoxConfig
    ) -> tuple[TrajectoryStatus, str, dict[str, float]]:
        status, reason = default_exit_status(run, config)
        return status, reason, {}


async def _roll_out(agent, tokenizer, task, sandbox_pool, grader):
    harness = BlackBoxHarness(agent, BlackBoxConfig(max_turns=2, wall_time_s=240, max_output_tokens=16))
    async with running_proxy(FailingEngine(), tokenizer) as proxy:
        runner = RolloutRunner(
            RolloutConfig(group_size=1, max_concurrency=1, harness_timeout_s=300),
            harness=harness,
            sandboxes=sandbox_pool,
            sessions=proxy.registry,
            proxy_url=proxy.url,
            grader=grader,
        )
        [trajectory] = await runner.run([task], step=0)
    return trajectory


async def test_black_box_agent_that_exits_on_a_failing_engine_is_an_engine_error(
    tokenizer, slugify_task, sandbox_pool, swe_grader
):
    trajectory = await _roll_out(OneCallAgent(), tokenizer, slugify_task, sandbox_pool, swe_grader)
    assert trajectory.status == TrajectoryStatus.ENGINE_ERROR, trajectory.failure_reason
    assert "CUDA error" in trajectory.failure_reason  # the proxy's evidence, not only the agent's words
    assert "my model call failed" in trajectory.failure_reason
    assert trajectory.reward is None and not trajectory.trainable


async def test_mini_swe_agent_on_a_failing_engine_is_an_engine_error(
    tokenizer, slugify_task, sandbox_pool, swe_grader
):
    trajectory = await _roll_out(MiniSweAgent(), tokenizer, slugify_task, sandbox_pool, swe_grader)
    assert trajectory.status == TrajectoryStatus.ENGINE_ERROR, (
        f"{trajectory.failure_reason}\n{trajectory.log[-3000:]}"
    )
    assert trajectory.reward is None and not trajectory.trainable
