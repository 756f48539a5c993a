"""The run's trackers are a brick (``MetricsLoggerProvider``): a recipe passes its own and every step's metrics
reach it, next to ``metrics.jsonl``; the default brick is wandb in the run's ``--wandb-mode``."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from components.protocols import MetricsLogger, MetricsLoggerProvider
from components.recipe_config import parse_config
from components.run.config import RunConfig
from components.run.stack import Bricks
from monitoring.logger import WandbLoggerProvider, WandbLoggersConfig, read_metrics
from monitoring.run_monitor import RunMonitor, RunMonitorConfig


class ListLogger:
    """A tracker in a dozen lines: keeps every logged row."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.closed = False

    def log(self, metrics: Mapping[str, Any], *, step: int) -> None:
        self.rows.append({"step": step, **metrics})

    def close(self) -> None:
        self.closed = True


class BrokenLogger:
    def log(self, metrics: Mapping[str, Any], *, step: int) -> None:
        raise ConnectionError("tracker down")

    def close(self) -> None:
        raise ConnectionError("tracker down")


class ListTrackers:
    def __init__(self) -> None:
        self.opened: list[tuple[Path, str, dict]] = []
        self.logger = ListLogger()

    def open(self, run_dir: Path, *, run_name: str, run_config: Mapping[str, Any]) -> list[MetricsLogger]:
        self.opened.append((run_dir, run_name, dict(run_config)))
        return [BrokenLogger(), self.logger]


def test_a_recipes_trackers_get_every_step_next_to_metrics_jsonl(tmp_path):
    trackers = ListTrackers()
    assert isinstance(trackers, MetricsLoggerProvider) and isinstance(trackers.logger, MetricsLogger)
    config = RunMonitorConfig(run_dir=tmp_path, num_steps=2, rollouts_per_step=1, run_config={"seed": 3})
    console = Console(file=io.StringIO(), force_terminal=False)
    with RunMonitor(config, trackers=trackers, console=console) as monitor:
        for step in range(2):
            monitor.start_step(step)
            monitor.end_step(step, [], train_metrics={"loss": 0.25 * step}, extra_metrics={"custom/x": step})
    assert trackers.opened == [(tmp_path, tmp_path.name, {"seed": 3})]
    assert trackers.logger.closed  # closed by the monitor, although the broken tracker's close raised
    assert [row["step"] for row in trackers.logger.rows] == [0, 1]  # the broken tracker stopped nothing
    assert [row["train/loss"] for row in trackers.logger.rows] == [0.0, 0.25]
    records = read_metrics(tmp_path)  # metrics.jsonl is always written, with the same rows
    assert [(r["step"], r["train/loss"], r["custom/x"]) for r in records] == [(0, 0.0, 0), (1, 0.25, 1)]
    assert set(records[1]) == set(trackers.logger.rows[1])
    assert not (tmp_path / "wandb").exists()  # the recipe's trackers replace wandb


def test_bricks_from_config_log_to_wandb_in_the_runs_mode(tmp_path):
    for mode in ("auto", "offline", "disabled"):
        bricks = Bricks.from_config(parse_config(RunConfig, ["--model", "tiny", "--wandb-mode", mode]))
        assert isinstance(bricks.loggers, MetricsLoggerProvider)
        assert bricks.loggers == WandbLoggerProvider(WandbLoggersConfig(wandb_mode=mode))
    assert WandbLoggersConfig(wandb_mode="disabled").build().open(tmp_path, run_name="r", run_config={}) == []
    assert not (tmp_path / "wandb").exists()
