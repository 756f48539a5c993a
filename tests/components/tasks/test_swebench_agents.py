"""Agents inside the image: the white-box SWE agent and the unmodified black-box agents (mini-swe-agent, Claude
Code's and Codex's native binaries, opencode's native binary, OpenClaw, Qwen Code and Gemini CLI on the Node 24
under ``.agents``) work on an image task (repository at /testbed, the image's Python), driven by a scripted
policy through the real proxy, and the grader, in a fresh sandbox of the same image, gives the fix 1. The agent
program itself comes from a read-only bind of its install directory (the venv, ``.agents``), not from the
image, which has neither Python agents nor Node. Every model call asked for at most the run's output bound;
the agents with a turn setting that keep being asked to work stop on it (turn_limit)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.engine.scripted_policies import step_policy, tool_call
from components.rollout import RolloutConfig, RolloutRunner
from components.tasks.swe import python_tool_paths
from components.tasks.swebench import RepoSources, load_swebench
from components.tasks.swebench_grading import SweBenchGrader
from components.trajectory import TrajectoryStatus
from harnesses.blackbox import BlackBoxConfig, BlackBoxHarness
from harnesses.claude_code import ClaudeCodeAgent
from harnesses.codex import CodexAgent
from harnesses.gemini_cli import GeminiCliAgent
from harnesses.mini_swe_agent import MiniSweAgent
from harnesses.openclaw import OPENCLAW
from harnesses.opencode import OPENCODE
from harnesses.qwen_code import QWEN_CODE
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
from tests.harnesses.recording_engine import RecordingEngine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
IMAGE_CACHE = Path.home() / ".cache" / "rein" / "images"
INSTANCE = "parse-1.20.2"
MAX_TURNS = 4
MAX_OUTPUT_TOKENS = 4096
CHECK = 'cd /testbed && python3 -c \'import parse; print(parse.parse("{my-field}", "hello")["my-field"])\''
# the check's output line as each agent reports it: bare, after "Output: " (Gemini CLI), JSON-quoted (mini)
CHECK_OUTPUT = re.compile(r'(^|Output: |"output": ")hello(\\n|$)', re.MULTILINE)
BOUNDS = BlackBoxConfig(max_turns=MAX_TURNS, wall_time_s=240, max_output_tokens=MAX_OUTPUT_TOKENS)


def _apply_gold(patch: str) -> str:
    """A shell command that applies the gold patch in the image's repository path."""
    return f"cd /testbed && cat > /tmp/fix.patch <<'REIN_EOF'\n{patch}REIN_EOF\ngit apply /tmp/fix.patch && echo applied"


@dataclass(frozen=True)
class Case:
    """One agent in the image: its harness, the paths bound for its program, how its shell tool is called,
    its last reply after the fix and check, and the status that ends the run."""

    harness: Callable[[], object]
    program_paths: Callable[[], tuple[str, ...]]
    shell: Callable[[str], str]  # command → the agent's own shell tool call
    last_reply: str | None = "Done."  # None: keep calling the shell (the turn bound ends the run)
    status: TrajectoryStatus = TrajectoryStatus.OK
    # the replies that apply the gold patch; default: one shell call with the patch in a here-document
    apply: Callable[[Case, str], list[str]] = lambda case, patch: [case.shell(_apply_gold(patch))]


def _black_box(agent) -> Callable[[], BlackBoxHarness]:
    return lambda: BlackBoxHarness(agent, BOUNDS)


def _shell(tool: str, argument: str, **extra: str) -> Callable[[str], str]:
    return lambda command: tool_call(tool, **{argument: command}, **extra)


CASES = {
    "swe_agent": Case(
        lambda: SweAgentHarness(SweAgentConfig(max_turns=MAX_TURNS, wall_time_s=240, max_tokens=4096)),
        python_tool_paths,
        _shell("bash", "command"),
        last_reply="Fixed.\n" + tool_call("submit"),
    ),
    "mini_swe_agent": Case(
        _black_box(MiniSweAgent()),
        lambda: (*python_tool_paths(), *MiniSweAgent().read_only_paths()),
        _shell("bash", "command"),
        last_reply=tool_call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    ),
    "claude_code": Case(  # its native binary: only .agents is bound
        _black_box(ClaudeCodeAgent(bare=True)),
        ClaudeCodeAgent(bare=True).read_only_paths,
        _shell("Bash", "command", description="run it"),
    ),
    "codex": Case(  # its native binary, run without npm's Node launcher
        _black_box(CodexAgent()), CodexAgent().read_only_paths, _shell("exec_command", "cmd")
    ),
    "opencode": Case(  # its native (Bun) binary
        _black_box(OPENCODE),
        OPENCODE.read_only_paths,
        _shell("bash", "command"),
        last_reply=None,
        status=TrajectoryStatus.TURN_LIMIT,
    ),
    "qwen-code": Case(
        _black_box(QWEN_CODE),
        QWEN_CODE.read_only_paths,
        _shell("run_shell_command", "command"),
        last_reply=None,
        status=TrajectoryStatus.TURN_LIMIT,
    ),
    "gemini-cli": Case(
        _black_box(GeminiCliAgent()),
        GeminiCliAgent().read_only_paths,
        _shell("run_shell_command", "command", description="run it"),
        last_reply=None,
        status=TrajectoryStatus.TURN_LIMIT,
        # its shell tool blocks any command with ``$(`` or backticks, which the patch text holds: the patch
        # goes through its own write_file tool, and only ``git apply`` through the shell (a later reply)
        apply=lambda case, patch: [
            tool_call("write_file", file_path="fix.patch", content=patch),
            case.shell("cd /testbed && git apply fix.patch && rm fix.patch && echo applied"),
        ],
    ),
    "openclaw": Case(  # no turn setting: it ends on its reply
        _black_box(OPENCLAW), OPENCLAW.read_only_paths, _shell("exec", "command")
    ),
}


@pytest.mark.parametrize("harness_name", list(CASES))
async def test_agent_in_the_image_fixes_the_instance(harness_name, tmp_path: Path, tokenizer) -> None:
    require_fixtures(INSTANCES, SNAPSHOTS, IMAGE_LAYOUT)
    case = CASES[harness_name]
    harness = case.harness()
    sources = RepoSources(
        images_dir=env_image_store(tmp_path / "images"),
        snapshots_dir=SNAPSHOTS,
        cache_dir=tmp_path / "workspaces",
        image_cache=ImageCache(IMAGE_CACHE),
    )
    [task] = [task for task in load_swebench(INSTANCES, sources).tasks if task.task_id == INSTANCE]
    replies = [*case.apply(case, task.instance.patch), case.shell(CHECK)]
    replies.append(case.shell(CHECK) if case.last_reply is None else case.last_reply)
    engine = RecordingEngine(tokenizer, step_policy(replies), context_window=32768)
    agents = ImageSandboxProvider(
        ImageSandboxConfig(cache_dir=IMAGE_CACHE, read_only_paths=case.program_paths())
    )
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
    tool_results = [m["content"][:600] for m in trajectory.messages if m["role"] == "tool"]
    detail = f"{trajectory.failure_reason}\n{trajectory.log[-3000:]}\n{tool_results}"
    assert trajectory.status == case.status, detail
    # The check's output (not its command, which names "hello" too): the image's python3 ran the fixed /testbed.
    assert any(CHECK_OUTPUT.search(text) for text in tool_results), detail
    assert trajectory.reward == 1.0, detail
    assert trajectory.trainable and trajectory.segments
    assert max(engine.max_tokens_seen) <= MAX_OUTPUT_TOKENS, engine.max_tokens_seen
    if case.status == TrajectoryStatus.TURN_LIMIT:
        assert len(engine.max_tokens_seen) <= MAX_TURNS + 1, engine.max_tokens_seen  # +1: a refused wrap-up
