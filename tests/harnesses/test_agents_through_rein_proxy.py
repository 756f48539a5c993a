"""The four added agents (opencode, Qwen Code, OpenClaw, Gemini CLI), unmodified, each fix a built-in task
through ``rein proxy`` started as the README shows it in front of SGLang (``rein proxy --engine sglang
--sglang-url URL --model M --port 0 --run-dir RUN_DIR``, closed by default: the admin key from
``--admin-key-file``). The rollout runner drives it over the proxy's HTTP control routes (open, describe,
finalize with the admin key; each agent gets only its session's token), the agent runs in a real bubblewrap
sandbox, the real grader gives the fix 1, and the trajectory comes back from the proxy's own run directory.

The policy is scripted (the tiny model cannot fix anything): a ``ScriptedEngine`` behind the protocol-faithful
SGLang stand-in (``tests/components/engine/fake_sglang.py``, a real HTTP server; SGLang itself needs a GPU).
One stand-in and one ``rein proxy`` serve the whole module; each test swaps the script."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from components.engine.scripted_policies import first_hunk_edit, step_policy, tool_call
from components.protocols import SessionDescription, SessionOpen, SessionOutcome
from components.proxy.auth import SessionKeys
from components.rollout import RolloutConfig, RolloutRunner
from components.tasks.swe import SweTask
from components.trajectory import Trajectory, TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from harnesses.agent_spec import AgentSpec
from harnesses.blackbox import BlackBoxConfig, BlackBoxHarness
from harnesses.gemini_cli import GeminiCliAgent
from harnesses.openclaw import OPENCLAW
from harnesses.opencode import OPENCODE
from harnesses.qwen_code import QWEN_CODE
from tests.components.engine.fake_sglang import FakeSGLangServer, ScriptedSGLangEngine
from tests.components.proxy.proxy_helpers import read_rein_proxy_start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REIN = Path(sys.executable).parent / "rein"
MAX_TURNS = 2


class ReinProxySessions:
    """``SessionControl`` over a ``rein proxy``'s HTTP control routes (admin key); a finalized session's
    trajectory is read back from the proxy's run directory, where ``--run-dir`` has it written."""

    def __init__(self, url: str, admin_key: str, run_dir: Path) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {admin_key}"}
        self.run_dir = run_dir

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60) as client:
            response = await client.post(f"{self.url}{path}", headers=self.headers, json=body)
        assert response.status_code == 200, response.text
        return response.json()

    async def open_session(self, request: SessionOpen = SessionOpen()) -> str:
        body = {key: value for key, value in dataclasses.asdict(request).items() if value is not None}
        return (await self._post("/sessions", body))["session_id"]

    async def describe(self, session_id: str) -> SessionDescription:
        async with httpx.AsyncClient(timeout=60) as client:
            response = await client.get(f"{self.url}/s/{session_id}/trajectory", headers=self.headers)
        assert response.status_code == 200, response.text
        return SessionDescription.from_json(response.json())

    async def finalize(self, session_id: str, outcome: SessionOutcome = SessionOutcome()) -> Trajectory:
        body = dataclasses.asdict(outcome)
        body["metrics"] = dict(outcome.metrics)
        if outcome.turn_rewards is not None:
            body["turn_rewards"] = list(outcome.turn_rewards)
        finalized = await self._post(f"/s/{session_id}/finalize", body)
        stored = TrajectoryStore(self.run_dir).read_all().trajectories
        [trajectory] = [t for t in stored if t.trajectory_id == finalized["trajectory_id"]]
        return trajectory

    async def discard(self, session_id: str) -> None:
        await self._post(f"/s/{session_id}/discard", {})


@dataclass
class SwappedPolicy:
    """The scripted policy behind the shared stand-in; each test sets its replies."""

    replies: list[str] = field(default_factory=lambda: ["Done."])

    def __call__(self, prompt: str) -> str:
        return step_policy(self.replies)(prompt)


@dataclass
class RunningReinProxy:
    url: str
    keys: SessionKeys
    run_dir: Path
    policy: SwappedPolicy
    engine: ScriptedSGLangEngine


@pytest.fixture(scope="module")
def rein_proxy(default_model_dir, tokenizer, tmp_path_factory) -> Iterator[RunningReinProxy]:
    policy = SwappedPolicy()
    engine = ScriptedSGLangEngine(tokenizer, policy, context_window=65536)
    run_dir = tmp_path_factory.mktemp("rein-proxy-run")
    key_file = run_dir / "admin.key"
    with FakeSGLangServer(engine, default_model_dir) as sglang:
        command = [
            *(str(REIN), "proxy", "--engine", "sglang", "--sglang-url", sglang.url),
            *("--model", str(default_model_dir), "--port", "0", "--run-dir", str(run_dir)),
            *("--admin-key-file", str(key_file)),
        ]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url, _, _ = read_rein_proxy_start(process)
            # keep draining its output: a full pipe would block the proxy
            threading.Thread(target=lambda: process.stdout.read(), daemon=True).start()
            keys = SessionKeys(admin_key=key_file.read_text().strip())
            yield RunningReinProxy(url=url, keys=keys, run_dir=run_dir, policy=policy, engine=engine)
        finally:
            process.terminate()
            process.wait(timeout=30)


def _patch_command(task: SweTask) -> str:
    return f"patch -p1 <<'REIN_EOF'\n{task.reference_patch}REIN_EOF\necho patched"


@dataclass(frozen=True)
class Case:
    agent: AgentSpec
    replies: Callable[[SweTask], list[str]]
    status: TrajectoryStatus


def _shell_then_more(tool: str, argument: str) -> Callable[[SweTask], list[str]]:
    """The fix through the agent's shell tool, then shell calls until its turn bound stops it."""
    call = lambda command: tool_call(tool, **{argument: command})  # noqa: E731
    return lambda task: [call(_patch_command(task)), call("grep -n 'strip(separator)' minilib/text.py")]


def _gemini_replies(task: SweTask) -> list[str]:
    path, old, new = first_hunk_edit(task.reference_patch)  # its own edit tool (its shell refuses ``$(``)
    edit = tool_call("replace", file_path=path, old_string=old, new_string=new, instruction="fix the bug")
    return [edit, "The bug is fixed."]


CASES = {
    "opencode": Case(OPENCODE, _shell_then_more("bash", "command"), TrajectoryStatus.TURN_LIMIT),
    "qwen-code": Case(
        QWEN_CODE, _shell_then_more("run_shell_command", "command"), TrajectoryStatus.TURN_LIMIT
    ),
    "openclaw": Case(
        OPENCLAW,
        lambda task: [tool_call("exec", command=_patch_command(task)), "Done: the fix is in."],
        TrajectoryStatus.OK,
    ),
    "gemini-cli": Case(GeminiCliAgent(), _gemini_replies, TrajectoryStatus.OK),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_agent_fixes_a_builtin_task_through_rein_proxy(
    name, rein_proxy, slugify_task, sandbox_pool, swe_grader
):
    case = CASES[name]
    rein_proxy.policy.replies = case.replies(slugify_task)
    harness = BlackBoxHarness(
        case.agent, BlackBoxConfig(max_turns=MAX_TURNS, wall_time_s=300, max_output_tokens=1024)
    )
    runner = RolloutRunner(
        RolloutConfig(group_size=1, max_concurrency=1, harness_timeout_s=400),
        harness=harness,
        sandboxes=sandbox_pool,
        sessions=ReinProxySessions(rein_proxy.url, rein_proxy.keys.admin_key, rein_proxy.run_dir),
        proxy_url=rein_proxy.url,
        grader=swe_grader,
        session_keys=rein_proxy.keys,  # each agent gets its own session's token, never the admin key
    )
    [trajectory] = await runner.run([slugify_task], step=0)
    detail = f"{trajectory.failure_reason}\n{trajectory.log[-4000:]}"
    assert trajectory.reward == 1.0, detail
    assert trajectory.status == case.status, detail
    assert trajectory.harness == case.agent.name and trajectory.trainable
    assert trajectory.segments and sum(s.num_sampled_tokens for s in trajectory.segments) > 0
