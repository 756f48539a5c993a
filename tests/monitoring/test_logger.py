"""Metrics loggers against real files: metrics.jsonl and a real wandb offline run directory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from components.protocols import MetricsLogger
from monitoring.logger import (
    JsonlLogger,
    MultiLogger,
    WandbLogger,
    WandbLoggerConfig,
    read_metrics,
    run_loggers,
    wandb_offline_history,
)


def test_jsonl_logger_appends_one_flushed_line_per_step(tmp_path):
    logger = JsonlLogger(tmp_path)
    assert isinstance(logger, MetricsLogger)
    logger.log(
        {"rollout/reward_mean": np.float32(0.5), "train/loss": 1.25, "nan": math.nan, "name": "x"}, step=0
    )
    # Flushed before close: a killed run keeps every finished line.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {
        "step": 0,
        "rollout/reward_mean": 0.5,
        "train/loss": 1.25,
        "nan": None,
        "name": "x",
    }
    logger.log({"rollout/reward_mean": 0.75}, step=1)
    logger.close()
    logger.close()
    logger.log({"late": 1.0}, step=2)  # after close: dropped, never raised
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]


def test_jsonl_logger_survives_a_torn_line_and_a_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 0, "reward": 0.1}\n{"step": 1, "reward": 0.2}\n{"step": 2, "rew'
    )  # killed mid-line
    logger = JsonlLogger(tmp_path)
    logger.log({"reward": 0.25}, step=1)  # the resumed run redoes step 1
    logger.log({"reward": 0.3}, step=2)
    logger.close()
    assert read_metrics(tmp_path) == [
        {"step": 0, "reward": 0.1},
        {"step": 1, "reward": 0.25},
        {"step": 2, "reward": 0.3},
    ]


def test_jsonl_logger_never_raises_on_unserialisable_values(tmp_path):
    logger = JsonlLogger(tmp_path)
    logger.log({"path": Path("/x"), "array": np.arange(2), "object": object()}, step=3)
    logger.close()
    (record,) = read_metrics(tmp_path)
    assert record["path"] == "/x" and record["array"] == [0, 1]


def test_wandb_logger_writes_an_offline_run_under_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(
        WandbLoggerConfig(run_dir=tmp_path, project="rein-test", config={"lr": 1e-5, "model": Path("/m")})
    )
    assert isinstance(logger, MetricsLogger)
    assert logger.mode == "offline"
    logger.log({"rollout/reward_mean": np.float64(0.5), "failures/timeout": 2}, step=0)
    logger.log({"rollout/reward_mean": 0.75, "train/loss": math.inf}, step=1)
    run_path = logger.run_path
    logger.close()
    logger.close()
    logger.log({"after": 1}, step=2)  # after finish: a warning, never an exception
    assert run_path.parent == tmp_path / "wandb" and run_path.name.startswith("offline-run-")
    rows = wandb_offline_history(run_path)
    assert [(r["_step"], r["rollout/reward_mean"]) for r in rows] == [(0, 0.5), (1, 0.75)]
    assert rows[0]["failures/timeout"] == 2 and rows[1]["train/loss"] is None

    # Restarting with the same run directory continues the same wandb run id.
    again = WandbLogger(WandbLoggerConfig(run_dir=tmp_path, project="rein-test"))
    assert again.run_id == logger.run_id == (tmp_path / "wandb" / "run_id").read_text()
    again.close()


def test_wandb_mode_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = WandbLoggerConfig(run_dir=tmp_path)
    assert config.resolved_mode() == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    assert config.resolved_mode() == "online"  # logged in
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert config.resolved_mode() == "offline"  # the environment overrides auto
    assert WandbLoggerConfig(run_dir=tmp_path, mode="disabled").resolved_mode() == "disabled"
    with pytest.raises(ValueError, match="mode"):
        WandbLoggerConfig(run_dir=tmp_path, mode="sometimes")
    with pytest.raises(ValueError, match="project"):
        WandbLoggerConfig(run_dir=tmp_path, project="")


class ExplodingLogger:
    def __init__(self) -> None:
        self.closed = False

    def log(self, metrics, *, step):
        raise ConnectionError("backend down")

    def close(self):
        self.closed = True
        raise ConnectionError("backend down")


def test_multi_logger_fans_out_and_isolates_failures(tmp_path):
    exploding = ExplodingLogger()
    logger = MultiLogger([exploding, JsonlLogger(tmp_path)])
    logger.log({"reward": 1.0}, step=4)
    logger.close()
    assert exploding.closed
    assert read_metrics(tmp_path) == [{"step": 4, "reward": 1.0}]
    with pytest.raises(ValueError, match="MetricsLogger"):
        MultiLogger([object()])


def test_run_loggers_write_both_backends(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = run_loggers(tmp_path, project="rein-test", name="unit", config={"steps": 2})
    assert [type(item).__name__ for item in logger.loggers] == ["JsonlLogger", "WandbLogger"]
    logger.log({"rollout/pass_rate": 0.5}, step=0)
    logger.close()
    assert read_metrics(tmp_path)[0]["rollout/pass_rate"] == 0.5
    assert wandb_offline_history(logger.loggers[1].run_path)[0]["rollout/pass_rate"] == 0.5
    only_file = run_loggers(tmp_path / "b", wandb_mode="disabled")
    assert [type(item).__name__ for item in only_file.loggers] == ["JsonlLogger"]
    only_file.close()
