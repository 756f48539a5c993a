"""Each recipe runs end to end with the tiny model (real Ray, engine, proxy, bubblewrap, FSDP2 trainer) and leaves
a complete run directory (``swe_grpo`` runs under ``ray job submit`` in ``test_ray_job.py``); a SIGKILLed run
resumes from its checkpoint without losing or duplicating a trajectory."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.chaos.recipe_faults import still_running
from tests.recipes.recipe_runs import (
    REPO_ROOT,
    assert_complete_run,
    latest_trainer_state,
    recipe_command,
    recipe_env,
    run_recipe,
    shard_steps,
)
from tests.required_tools import require_tool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CLAUDE = REPO_ROOT / ".agents" / "node_modules" / ".bin" / "claude"


def test_recipe_help_lists_every_field_and_bad_values_fail_fast():
    from components.recipe_config import config_flags
    from recipes.tictactoe_grpo import TicTacToeGrpoConfig

    completed = subprocess.run(
        recipe_command("tictactoe_grpo", "--help"),
        capture_output=True,
        text=True,
        env=recipe_env(),
        timeout=60,
    )
    assert completed.returncode == 0
    flags = config_flags(TicTacToeGrpoConfig)
    assert {
        "engine.num_cpus",
        "engine.kind",
        "proxy.kind",
        "rollout.mode",
        "monitoring.wandb_mode",
    } <= set(flags)
    assert {"algorithm.kind", "algorithm.loss.clip_low", "algorithm.loss.kl_coef", "sandbox.num_warm"} <= set(
        flags
    )
    assert "--proxy {local,serve}" in completed.stdout  # a slot's flag lists the registered kinds
    for flag in flags.values():  # every field of every brick
        assert f"{flag} " in completed.stdout, flag
    assert "(default: 2e-05)" in completed.stdout  # learning_rate, with its meaning
    bad = subprocess.run(
        recipe_command("swe_grpo", "--group-size", "0"),
        capture_output=True,
        text=True,
        env=recipe_env(),
        timeout=60,
    )
    assert bad.returncode == 2 and "group_size" in bad.stderr
    bad = subprocess.run(
        recipe_command("swe_grpo", "--engine", "sglang"),
        capture_output=True,
        text=True,
        env=recipe_env(),
        timeout=60,
    )
    assert bad.returncode == 2 and "engine.url" in bad.stderr
    assert "--sglang-url" in config_flags(TicTacToeGrpoConfig, kinds={"engine": "sglang"}).values()


GONE_WITHIN_S = 30.0  # from the driver's SIGKILL until no process of its run is left


def _wait_for(predicate, *, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert process.poll() is None, f"recipe exited early: {process.communicate()[0][-4000:]}"
        assert time.monotonic() < deadline, "recipe did not get there in time"
        time.sleep(0.2)


def test_tictactoe_killed_run_resumes_without_lost_or_duplicated_trajectories(tmp_path, tiny_model_dir):
    """The driver SIGKILLed mid-step (its pid only, not its process group: issue #27 point 5) leaves no process of
    its run behind within ``GONE_WITHIN_S`` (the local Ray it started, the engine, the Serve proxy, the trainer's
    workers, its sandboxes: ``components/process_guard.py`` kills them and says so in ``logs/process_guard.log``),
    and the same command resumes it with nothing lost or duplicated. With LoRA (``--lora-rank``): the checkpoints
    are adapter folders, and the resumed run starts the engine on the base weights with the checkpoint's adapter
    pushed (full-weight resume: ``test_async_loop``'s kill test)."""
    run_dir = tmp_path / "run"
    flags = (
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", "4", "--group-size", "2",
        "--games-per-step", "1", "--checkpoint-every-steps", "2", "--wandb-mode", "offline",
        "--lora-rank", "8", "--lora-target", "q_proj,v_proj",
    )  # fmt: skip
    process = subprocess.Popen(
        recipe_command("tictactoe_grpo", *flags),
        cwd=REPO_ROOT,
        env=recipe_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: only for this test's clean-up when it fails
    )
    recorded: list[psutil.Process] = []
    try:
        # Step 1's checkpoint (steps 0-1 trained) exists and step 2's shard is written, not yet checkpointed.
        _wait_for(lambda: len(shard_steps(run_dir)) >= 3, process=process, timeout_s=300)
        recorded = psutil.Process(process.pid).children(recursive=True)
        names = {p.name() for p in recorded if p.is_running()}
        assert {"raylet", "gcs_server"} <= names, f"the run's local Ray is not among its processes: {names}"
        os.kill(process.pid, signal.SIGKILL)  # the fault: the driver alone
        process.wait()
        killed_at = time.monotonic()
        while (left := still_running(recorded)) and time.monotonic() - killed_at < GONE_WITHIN_S:
            time.sleep(0.2)
        assert not left, f"left behind after {GONE_WITHIN_S:g} s: {[(p.pid, p.name()) for p in left]}"
        guard_log = (run_dir / "logs" / "process_guard.log").read_text()
        assert f"owner {process.pid} died: killed" in guard_log, guard_log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for leftover in still_running(recorded):
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()
    before = shard_steps(run_dir)
    checkpointed = latest_trainer_state(run_dir)
    assert len(checkpointed["consumed_shards"]) == 2 and checkpointed["step"] == 2
    ledger = checkpointed["extra"]["trajectory_ledger"]["step_shards"]  # the one resume ledger, every mode
    assert sorted(ledger) == ["0", "1"] and sorted(sum(ledger.values(), [])) == sorted(
        checkpointed["consumed_shards"]
    )

    completed = run_recipe("tictactoe_grpo", *flags)

    assert_complete_run(run_dir, num_steps=4, rollouts_per_step=2)
    after = shard_steps(run_dir)
    assert {name: after[name] for name in before} == before, "stored shards were changed or dropped"
    assert sorted(step for step, _ in after.values()) == [0, 1, 2, 3]  # step 2 was not rolled out again
    log = (run_dir / "logs" / "driver.log").read_text()
    assert "resumed from" in log and "step-00000002" in log
    assert "step 2: training again from stored shard" in log
    final = latest_trainer_state(run_dir)
    assert final["step"] == 4
    assert final["extra"]["trajectory_ledger"]["step_shards"] == {
        str(step): [name] for name, (step, _) in after.items()
    }
    assert "run directory" in completed.stdout
    adapter = json.loads((run_dir / "checkpoints" / "step-00000004" / "adapter_config.json").read_text())
    targets = {name.rsplit(".", 1)[-1] for name in adapter["target_modules"]}
    assert adapter["r"] == 8 and targets == {"q_proj", "v_proj"}, adapter
    assert not list(
        (run_dir / "checkpoints").rglob("model*.safetensors")
    )  # adapters only, never full weights


def test_claude_code_recipe_one_step(tmp_path, tiny_model_dir):
    require_tool(CLAUDE, "run `make setup-test` (npm install of the agents)")
    run_dir = tmp_path / "run"
    run_recipe(
        "claude_code_grpo",
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", "1", "--num-tasks", "1",
        "--group-size", "2", "--max-turns", "2", "--proxy", "local", "--wandb-mode", "offline",
        "--wall-time-s", "120",
    )  # fmt: skip
    assert_complete_run(run_dir, num_steps=1, rollouts_per_step=2)
    rows = _trajectory_rows(run_dir)
    assert {row["harness"] for row in rows} == {"claude-code"}
    for row in rows:  # Claude Code itself ran in the sandbox and called the policy through the proxy
        assert dict(row["metrics"])["num_policy_calls"] >= 1, row["failure_reason"]
        assert '"type":"result"' in row["log"], row["log"][:2000]


def test_mixed_harness_recipe_one_step(tmp_path, tiny_model_dir):
    """One policy across two agents: the white-box SWE agent and the unmodified mini-swe-agent, a group each;
    with turn-level credit on (the README's flags), the white-box agent's process rewards (one per model call)
    are stored per turn and the black-box agent's trajectory has none."""
    run_dir = tmp_path / "run"
    run_recipe(
        "swe_grpo",
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", "1", "--num-tasks", "2",
        "--group-size", "1", "--max-turns", "2", "--proxy", "local", "--wandb-mode", "offline",
        "--wall-time-s", "150", "--harness", "swe_agent,mini_swe_agent", *SWE_TURN_CREDIT_FLAGS, timeout_s=540,
    )  # fmt: skip
    assert_complete_run(run_dir, num_steps=1, rollouts_per_step=2)
    rows = _trajectory_rows(run_dir)
    assert sorted(row["harness"] for row in rows) == ["mini-swe-agent", "swe-agent"], [
        row["failure_reason"] for row in rows
    ]
    for row in rows:  # each agent called the policy through the proxy
        assert dict(row["metrics"])["num_policy_calls"] >= 1, row["failure_reason"] + row["log"][-2000:]
    [metrics] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    for name in ("mini-swe-agent", "swe-agent"):
        assert metrics[f"harness/{name}/num_trajectories"] == 1, sorted(metrics)
        assert f"harness/{name}/reward_mean" in metrics and f"harness/{name}/failures" in metrics
    num_turns = 0
    for harness, status, segments in _segment_rows(run_dir):
        for segment in segments:
            mask, turn_rewards = segment["loss_mask"], segment["turn_rewards"]
            if harness == "mini-swe-agent" or status not in ("ok", "turn_limit"):
                assert turn_rewards is None
                continue
            starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
            assert turn_rewards is not None and len(turn_rewards) == len(starts)  # one per model call
            assert all(abs(r) <= 0.2 + 1e-6 for r in turn_rewards), turn_rewards  # w = 0.2
            num_turns += len(starts)
    assert metrics["data/num_turns_with_rewards"] == num_turns


SWE_TURN_CREDIT_FLAGS = (
    "--swe-agent-tool-call-reward", "0.2", "--trainer-turn-credit-enabled", "true",
    "--trainer-turn-credit-discount", "0.9",
)  # fmt: skip


def _segment_rows(run_dir: Path) -> list[tuple[str, str, list[dict]]]:
    import pyarrow.parquet as pq

    return [
        (row["harness"], row["status"], row["segments"])
        for path in (run_dir / "trajectories").glob("*.parquet")
        for row in pq.read_table(path, columns=["harness", "status", "segments"]).to_pylist()
    ]


def _trajectory_rows(run_dir: Path) -> list[dict]:
    import pyarrow.parquet as pq

    rows = []
    for path in (run_dir / "trajectories").glob("*.parquet"):
        rows += pq.read_table(
            path, columns=["harness", "status", "failure_reason", "metrics", "log"]
        ).to_pylist()
    return rows
