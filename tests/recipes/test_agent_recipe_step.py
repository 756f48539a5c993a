"""The four added agents each fix a built-in task in one step of the SWE recipe, run as users run it
(``recipes/swe_grpo.py --harness opencode,qwen_code,openclaw,gemini_cli --engine sglang --sglang-url …``): one
GRPO group per agent, each agent unmodified in its bubblewrap sandbox, the real grader, the trainer's step and
the weight sync to the server. The policy is scripted (``tests/recipes/agent_fix_policies.py``; the tiny model
cannot fix anything) behind the protocol-faithful SGLang stand-in run as its own process."""

from __future__ import annotations

import json

import pytest

from components.trajectory import TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.components.engine.fake_sglang import FakeSGLangProcess
from tests.recipes.recipe_runs import assert_complete_run, run_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

AGENTS = {
    "opencode": "opencode",
    "qwen_code": "qwen-code",
    "openclaw": "openclaw",
    "gemini_cli": "gemini-cli",
}
# how each run ends: on the agent's turn bound, or (OpenClaw has none) on its own
STATUSES = {"opencode": "turn_limit", "qwen-code": "turn_limit", "gemini-cli": "turn_limit", "openclaw": "ok"}


def test_added_agents_fix_builtin_tasks_in_a_recipe_step(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    policy = "tests.recipes.agent_fix_policies:fix_with_any_agent"
    with FakeSGLangProcess(tiny_model_dir, scripted_policy=policy, context_window=65536) as server:
        run_recipe(
            "swe_grpo",
            "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--engine", "sglang",
            "--sglang-url", server.url, "--harness", ",".join(AGENTS), "--num-steps", "1",
            "--num-tasks", str(len(AGENTS)), "--group-size", "1", "--max-turns", "3",
            "--sampling-max-tokens", "2048", "--proxy", "local", "--wandb-mode", "offline",
            "--wall-time-s", "300",
            timeout_s=840,
        )  # fmt: skip
    assert_complete_run(run_dir, num_steps=1, rollouts_per_step=len(AGENTS))
    trajectories = TrajectoryStore(run_dir).read_all().trajectories
    outcomes = {t.harness: (t.status.value, t.reward, t.failure_reason[:300]) for t in trajectories}
    assert sorted(outcomes) == sorted(AGENTS.values()), outcomes
    for trajectory in trajectories:
        tool_results = [m["content"][:300] for m in trajectory.messages if m["role"] == "tool"]
        detail = f"{trajectory.harness} on {trajectory.task_id}: {outcomes}\n{tool_results}\n{trajectory.log[-2000:]}"
        assert trajectory.reward == 1.0, detail
        assert trajectory.status == TrajectoryStatus(STATUSES[trajectory.harness]), detail
        assert trajectory.segments and trajectory.trainable, detail
    [metrics] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    for name in AGENTS.values():
        assert metrics[f"harness/{name}/reward_mean"] == 1.0, sorted(metrics)
