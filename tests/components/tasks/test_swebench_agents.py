"""Agents inside the image: the white-box SWE agent, the unmodified mini-swe-agent and Claude Code (its native
binary) work on an image task
(repository at /testbed, the image's Python), driven by a scripted policy through the real proxy, and the
grader, in a fresh sandbox of the same image, gives the fix 1. The agent program itself comes from a read-only
bind of its install directory (the venv), not from the image."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.engine.scripted import ScriptedEngine
from components.engine.scripted_policies import step_policy, tool_call
from components.rollout import RolloutConfig, RolloutRunner
from components.tasks.swe import python_tool_paths
from components.tasks.swebench import RepoSources, load_swebench
from components.tasks.swebench_grading import SweBenchGrader
from components.trajectory import TrajectoryStatus
from harnesses.blackbox import BlackBoxConfig, BlackBoxHarness
from harnesses.claude_code import ClaudeCodeAgent
from harnesses.codex import CodexAgent
from harnesses.mini_swe_agent import MiniSweAgent
from harnesses.swe_agent import SweAgentConfig, SweAgentHarness
from sandboxes.image import ImageCache, ImageSandboxConfig, ImageSandboxProvider
from tests.components.tasks.swebench_fixtures import (
    IMAGE_LAYOUT,
    INSTANCES,
    SNAPSHOTS,
    env_image_store,
    require_fixtures,
)
from tests.harnesses.harness_fixtures import running_proxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
IMAGE_CACHE = Path.home() / ".cache" / "rein" / "images"
INSTANCE = "parse-1.20.2"


def _apply_gold(patch: str) -> str:
    """A shell command that applies the gold patch in the image's repository path."""
    return f"cd /testbed && cat > /tmp/fix.patch <<'REIN_EOF'\n{patch}REIN_EOF\ngit apply /tmp/fix.patch && echo applied"


@pytest.mark.parametrize("harness_name", ["swe_agent", "mini_swe_agent", "claude_code", "codex"])
async def test_agent_in_the_image_fixes_the_instance(harness_name, tmp_path: Path, tokenizer) -> None:
    require_fixtures(INSTANCES, SNAPSHOTS, IMAGE_LAYOUT)
    sources = RepoSources(
        images_dir=env_image_store(tmp_path / "images"),
        snapshots_dir=SNAPSHOTS,
        cache_dir=tmp_path / "workspaces",
        image_cache=ImageCache(IMAGE_CACHE),
    )
    [task] = [task for task in load_swebench(INSTANCES, sources).tasks if task.task_id == INSTANCE]
    check = (
        'cd /testbed && python3 -c \'import parse; print(parse.parse("{my-field}", "hello")["my-field"])\''
    )
    if harness_name == "swe_agent":
        harness = SweAgentHarness(SweAgentConfig(max_turns=4, wall_time_s=240, max_tokens=4096))
        replies = [
            tool_call("bash", command=_apply_gold(task.instance.patch)),
            tool_call("bash", command=check),
            "Fixed.\n" + tool_call("submit"),
        ]
        program_paths = python_tool_paths()
    elif harness_name == "claude_code":  # its native binary: only .agents is bound
        agent = ClaudeCodeAgent(bare=True)
        harness = BlackBoxHarness(agent, BlackBoxConfig(max_turns=4, wall_time_s=240, max_output_tokens=4096))
        replies = [
            tool_call("Bash", command=_apply_gold(task.instance.patch), description="apply the fix"),
            tool_call("Bash", command=check, description="check it"),
            "Done.",
        ]
        program_paths = agent.read_only_paths()
    elif harness_name == "codex":  # its native binary, run without npm's Node launcher: only .agents is bound
        agent = CodexAgent()
        harness = BlackBoxHarness(agent, BlackBoxConfig(max_turns=4, wall_time_s=240, max_output_tokens=4096))
        replies = [
            tool_call("exec_command", cmd=_apply_gold(task.instance.patch)),
            tool_call("exec_command", cmd=check),
            "Done.",
        ]
        program_paths = agent.read_only_paths()
    else:
        agent = MiniSweAgent()
        harness = BlackBoxHarness(agent, BlackBoxConfig(max_turns=4, wall_time_s=240, max_output_tokens=4096))
        replies = [
            tool_call("bash", command=_apply_gold(task.instance.patch)),
            tool_call("bash", command=check),
            tool_call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        ]
        program_paths = (*python_tool_paths(), *agent.read_only_paths())
    engine = ScriptedEngine(tokenizer, step_policy(replies), context_window=32768)
    agents = ImageSandboxProvider(ImageSandboxConfig(cache_dir=IMAGE_CACHE, read_only_paths=program_paths))
    grading = ImageSandboxProvider(ImageSandboxConfig(cache_dir=IMAGE_CACHE, num_warm_per_image=0))
    async with running_proxy(engine, tokenizer, default_max_tokens=4096) as proxy, agents, grading:
        runner = RolloutRunner(
            RolloutConfig(group_size=1, max_concurrency=1, harness_timeout_s=400),
            harness=harness,
            sandboxes=agents,
            sessions=proxy.registry,
            proxy_url=proxy.url,
            grader=SweBenchGrader(grading),
        )
        [trajectory] = await runner.run([task], step=0)
    assert trajectory.status == TrajectoryStatus.OK, f"{trajectory.failure_reason}\n{trajectory.log[-3000:]}"
    seen = trajectory.log + str(
        trajectory.messages
    )  # tool results: the image's python3 ran the fixed /testbed
    assert "hello" in seen, seen[-3000:]
    assert trajectory.reward == 1.0, trajectory.log[-3000:]
