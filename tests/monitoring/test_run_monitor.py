"""A (simulated) two-step run watched by ``RunMonitor``, then killed and resumed: every artifact lands in the
run directory, for real (Parquet, metrics.jsonl, a wandb offline run, a PNG, the viewer page)."""

from __future__ import annotations

import io
import json
import re

import pytest
from PIL import Image
from rich.console import Console

from components.trajectory_store import TrajectoryStore
from monitoring.logger import read_metrics, wandb_offline_history
from monitoring.run_monitor import RunMonitor, RunMonitorConfig, train_metric_names
from tests.monitoring.monitoring_run_builder import build_trajectories


def run_steps(monitor: RunMonitor, store: TrajectoryStore, steps: dict[int, list]) -> list[dict]:
    logged = []
    for step, trajectories in steps.items():
        monitor.start_step(step, num_rollouts=len(trajectories))
        for trajectory in trajectories:
            monitor.rollout_finished(trajectory)
        store.write(trajectories)
        train = {"loss": 0.5 / (step + 1), "logprob_pearson": 0.995, "is_weight/mean": 1.01}
        logged.append(monitor.end_step(step, trajectories, train_metrics=train, rollout_wall_time_s=2.0))
    return logged


def test_a_watched_run_leaves_every_artifact_and_resumes(tmp_path, monkeypatch, tokenizer, default_model_dir):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"model": str(default_model_dir)}))
    trajectories = build_trajectories(tokenizer)
    by_step = {1: [t for t in trajectories if t.step == 1], 2: [t for t in trajectories if t.step == 2]}
    stream = io.StringIO()
    config = RunMonitorConfig(run_dir=run_dir, num_steps=3, rollouts_per_step=4, run_config={"lr": 1e-6})
    store = TrajectoryStore(run_dir)

    with RunMonitor(config, console=Console(file=stream, force_terminal=False)) as monitor:
        logged = run_steps(monitor, store, {1: by_step[1]})
    # "Killed" after step 1 (the monitor closed); the resumed run redoes step 1 and goes on.
    resumed = RunMonitorConfig(run_dir=run_dir, num_steps=3, rollouts_per_step=4, first_step=1)
    with RunMonitor(resumed, console=Console(file=stream, force_terminal=False)) as monitor:
        logged += run_steps(monitor, store, {1: by_step[1], 2: by_step[2]})

    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]  # step 1 logged twice: the last record wins
    assert records[1]["rollout/num_trajectories"] == 4
    assert records[1]["failures/sandbox_error"] == 1
    assert records[1]["train/loss"] == pytest.approx(0.5 / 3)
    assert records[1]["is_weight/mean"] == pytest.approx(1.01)
    assert records[1]["throughput/rollouts_per_min"] == pytest.approx(120.0)
    assert records[1]["time/step_s"] >= 0
    assert logged[-1]["segments/history_rewritten"] == 1

    wandb_runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    # ``offline-run-<date>_<time>-<run id>``; wandb appends ``-1`` when both runs start within the same second.
    run_ids = {re.fullmatch(r"offline-run-\d{8}_\d{6}-([^-]+)(-\d+)?", p.name).group(1) for p in wandb_runs}
    assert len(wandb_runs) == 2 and len(run_ids) == 1  # same run id
    history = wandb_offline_history(wandb_runs[-1]) or wandb_offline_history(wandb_runs[0])
    assert any(row.get("train/logprob_pearson") == pytest.approx(0.995) for row in history)

    with Image.open(run_dir / "learning_curves.png") as image:
        assert image.format == "PNG"
    page = (run_dir / "viewer" / "index.html").read_text()
    data = json.loads(re.search(r'id="rein-data">(.*?)</script>', page, re.S).group(1))
    # The resumed step 1 wrote its shard again, so the store holds step 1 twice: the viewer shows what is stored.
    assert {t["id"] for t in data["trajectories"]} == {t.trajectory_id for t in trajectories}
    assert data["run"]["tokenizer"] == str(default_model_dir)
    output = stream.getvalue()
    assert "step 2 started: 4 rollouts" in output and "trajectory viewer:" in output


def test_train_metric_names_get_a_namespace():
    assert train_metric_names({"loss": 1.0, "is/ratio_mean": 2.0}) == {
        "train/loss": 1.0,
        "is/ratio_mean": 2.0,
    }


def test_bad_config_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="wandb_mode"):
        RunMonitorConfig(run_dir=tmp_path, num_steps=1, rollouts_per_step=1, wandb_mode="cloud")
    with pytest.raises(ValueError, match="first_step"):
        RunMonitorConfig(run_dir=tmp_path, num_steps=1, rollouts_per_step=1, first_step=2)
    with pytest.raises(ValueError, match="rollouts_per_step"):
        RunMonitorConfig(run_dir=tmp_path, num_steps=1, rollouts_per_step=0)
