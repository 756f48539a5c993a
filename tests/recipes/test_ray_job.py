"""``ray job submit --working-dir . -- python recipes/swe_grpo.py ...`` against a running Ray head completes a
step: the recipe joins the cluster ($RAY_ADDRESS), deploys the proxy on Ray Serve, trains, and leaves a run dir.
The job's agent is the README's one-line swap ``--harness mini_swe_agent`` (the unmodified PyPI agent)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from components.run.stack import WORKING_DIR_EXCLUDES
from tests.recipes.recipe_runs import REPO_ROOT, assert_complete_run, recipe_env
from tests.recipes.test_swe_grpo_vllm import assert_one_vllm_step
from tests.required_tools import require_tool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RAY = Path(sys.executable).parent / "ray"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def ray_head():
    """A local head (its own ports and temp dir); torn down by killing its process group, never `ray stop`,
    which would kill every Ray instance on the machine."""
    temp_dir = tempfile.mkdtemp(prefix="rein-ray-")  # short: Ray's socket paths must stay < 108 bytes
    dashboard_port = free_port()
    command = [
        str(RAY), "start", "--head", "--block", "--port", str(free_port()), "--num-cpus", "6",
        "--disable-usage-stats", "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
        "--dashboard-port", str(dashboard_port), "--dashboard-agent-listen-port", str(free_port()),
        "--ray-client-server-port", str(free_port()), "--temp-dir", temp_dir,
    ]  # fmt: skip
    head = subprocess.Popen(
        command,
        env=recipe_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # every process the head starts stays in this group
    )
    address = f"http://127.0.0.1:{dashboard_port}"
    try:
        for _ in range(120):  # the job server answers once the dashboard is up
            probe = subprocess.run(
                [str(RAY), "job", "list", "--address", address],
                env=recipe_env(),
                capture_output=True,
                timeout=60,
            )
            if probe.returncode == 0:
                break
            assert head.poll() is None, f"ray start failed: {head.communicate()[0][-4000:]}"
            subprocess.run(["sleep", "1"])
        else:
            pytest.fail("the Ray head's job server did not come up")
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit_one_step(ray_head: str, run_dir: Path, *flags: str) -> list[dict]:
    """``ray job submit ... -- python recipes/swe_grpo.py --run-dir RUN_DIR <one step> FLAGS``: it succeeds and
    leaves a complete run; its trajectory rows."""
    command = [
        str(RAY), "job", "submit", "--address", ray_head, "--working-dir", str(REPO_ROOT),
        "--runtime-env-json", json.dumps({"excludes": WORKING_DIR_EXCLUDES}), "--",
        sys.executable, "recipes/swe_grpo.py", "--run-dir", str(run_dir), "--num-steps", "1", "--num-tasks", "1",
        "--group-size", "2", "--max-turns", "2", "--proxy-replicas", "1", "--wandb-mode", "offline", *flags,
    ]  # fmt: skip
    completed = subprocess.run(command, env=recipe_env(), capture_output=True, text=True, timeout=540)
    output = completed.stdout[-6000:] + completed.stderr[-6000:]
    assert completed.returncode == 0 and "succeeded" in output, output
    assert_complete_run(run_dir, num_steps=1, rollouts_per_step=2)
    return [
        row
        for path in (run_dir / "trajectories").glob("*.parquet")
        for row in pq.read_table(path).to_pylist()
    ]


def test_ray_job_submit_runs_one_swe_step(ray_head, tmp_path, tiny_model_dir):
    require_tool(Path(sys.prefix) / "bin" / "mini", "pip install mini-swe-agent (the test extra)")
    run_dir = tmp_path / "run"
    flags = ("--model", str(tiny_model_dir), "--proxy", "serve", "--harness", "mini_swe_agent")
    rows = submit_one_step(ray_head, run_dir, *flags)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["proxy"]["kind"] == "serve" and config["recipe"] == "swe_grpo"
    assert {row["harness"] for row in rows} == {"mini-swe-agent"}
    assert not [row["failure_reason"] for row in rows if row["status"] in ("agent_error", "sandbox_error")]
    assert any(row["segments"] for row in rows), "mini-swe-agent never reached the policy"


def test_ray_job_submit_runs_one_swe_step_on_vllm(ray_head, tmp_path, vllm_server):
    """The README's ``ray job submit ... --engine vllm --vllm-url ...``: the job's proxy shards (Ray actors)
    generate on the session's real vLLM server, and the step's weights reach it as version 1."""
    run_dir = tmp_path / "run"
    flags = ("--model", str(vllm_server.model_dir), "--engine", "vllm", "--vllm-url", vllm_server.url)
    rows = submit_one_step(ray_head, run_dir, *flags)
    assert not [row["failure_reason"] for row in rows if row["status"] in ("agent_error", "engine_error")]
    assert any(row["segments"] for row in rows), "no rollout reached the vLLM server"
    # the README's one-server command (`python recipes/swe_grpo.py ... --engine vllm`), here inside the job:
    # sampled by version 0, the step's weights on the server as version 1
    assert_one_vllm_step(run_dir, vllm_server, vllm_server.url)
