"""One full ``swe_grpo`` step on a SWE-bench-format task set in image sandboxes, with the tiny model: the rows
come from the set-up's Parquet file, the agent and the grader run on the test OCI image, and every rollout is
graded (a reward, not a grading error)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.components.tasks.swebench_fixtures import (
    IMAGE_LAYOUT,
    INSTANCES,
    SNAPSHOTS,
    env_image_store,
    require_fixtures,
)
from tests.recipes.recipe_runs import assert_complete_run, run_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_swe_grpo_one_step_on_image_tasks(tmp_path: Path, tiny_model_dir: Path) -> None:
    require_fixtures(INSTANCES, SNAPSHOTS, IMAGE_LAYOUT)
    images = env_image_store(tmp_path / "images")
    run_dir = tmp_path / "run"
    completed = run_recipe(
        "swe_grpo",
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", "1", "--num-tasks", "1",
        "--group-size", "2", "--max-turns", "2", "--proxy", "local", "--wandb-mode", "offline",
        "--tasks", f"swebench:{INSTANCES}", "--images", str(images), "--snapshots", str(SNAPSHOTS),
        timeout_s=540,
    )  # fmt: skip
    assert "skipped instance" not in completed.stdout
    assert_complete_run(run_dir, num_steps=1, rollouts_per_step=2)
    rows = []
    for path in (run_dir / "trajectories").glob("*.parquet"):
        rows += pq.read_table(path, columns=["task_id", "status", "failure_reason", "reward"]).to_pylist()
    first_instance = pq.read_table(INSTANCES, columns=["instance_id"]).to_pylist()[0]["instance_id"]
    assert {row["task_id"] for row in rows} == {first_instance}
    for row in rows:  # graded the data set's way (the tiny model fixes nothing: 0), never a grading error
        assert row["failure_reason"] != "grading_error", row
        assert row["reward"] == 0.0, row
