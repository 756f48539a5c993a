"""Running recipes as users do (a subprocess: ``python recipes/NAME.py --flags``) and reading back their runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = (
    "config.json",
    "metrics.jsonl",
    "learning_curves.png",
    "viewer/index.html",
    "logs/driver.log",
)


def recipe_env() -> dict[str, str]:
    """The environment a recipe subprocess runs with (few threads, wandb offline, no Ray auth)."""
    return {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def recipe_command(recipe: str, *flags: str) -> list[str]:
    return [sys.executable, str(REPO_ROOT / "recipes" / f"{recipe}.py"), *flags]


def spawn_recipe(recipe: str, *flags: str, output: bool = True) -> subprocess.Popen:
    """Start a recipe in its own session (so the test can kill its whole tree when it cleans up); its stdout and
    stderr together as text when ``output``, else discarded."""
    stream = subprocess.PIPE if output else subprocess.DEVNULL
    return subprocess.Popen(
        recipe_command(recipe, *flags),
        cwd=REPO_ROOT,
        env=recipe_env(),
        stdout=stream,
        stderr=subprocess.STDOUT if output else subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def run_recipe(recipe: str, *flags: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Run a recipe to its end; fail with its output when it exits non-zero."""
    completed = subprocess.run(
        recipe_command(recipe, *flags),
        cwd=REPO_ROOT,
        env=recipe_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert completed.returncode == 0, (
        f"{recipe} failed:\n{completed.stdout[-4000:]}\n{completed.stderr[-8000:]}"
    )
    return completed


def shard_steps(run_dir: Path) -> dict[str, tuple[int, list[str]]]:
    """Each trajectory shard's step and trajectory ids."""
    shards = {}
    for path in sorted((run_dir / "trajectories").glob("shard-*.parquet")):
        table = pq.read_table(path, columns=["step", "trajectory_id"])
        steps = set(table.column("step").to_pylist())
        assert len(steps) == 1, f"shard {path.name} mixes steps {steps}"
        shards[path.name] = (steps.pop(), table.column("trajectory_id").to_pylist())
    return shards


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def latest_trainer_state(run_dir: Path) -> dict:
    states = sorted((run_dir / "checkpoints").glob("step-*/trainer_state.json"))
    assert states, f"no complete checkpoint in {run_dir / 'checkpoints'}"
    return json.loads(states[-1].read_text())


def assert_complete_run(run_dir: Path, *, num_steps: int, rollouts_per_step: int) -> None:
    """Every artifact is there; one shard per step with every rollout; the last checkpoint consumed them all."""
    for name in ARTIFACTS:
        assert (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0, f"missing {name}"
    assert list((run_dir / "wandb").rglob("*.wandb")), "no offline wandb files"
    shards = shard_steps(run_dir)
    assert sorted(step for step, _ in shards.values()) == list(range(num_steps))
    assert all(len(ids) == rollouts_per_step for _, ids in shards.values())
    all_ids = [trajectory_id for _, ids in shards.values() for trajectory_id in ids]
    assert len(all_ids) == len(set(all_ids)), "duplicated trajectories"
    state = latest_trainer_state(run_dir)
    assert sorted(state["consumed_shards"]) == sorted(shards), "a shard was not trained or trained twice"
    assert len(state["consumed_shards"]) == len(set(state["consumed_shards"]))
    assert set(metric_steps(run_dir)) == set(range(num_steps))
    config = json.loads((run_dir / "config.json").read_text())
    assert config["num_steps"] == num_steps and Path(config["model_path"]).is_dir()
    viewer = (run_dir / "viewer" / "index.html").read_text()
    assert all_ids[0] in viewer, "the viewer does not list the run's trajectories"
