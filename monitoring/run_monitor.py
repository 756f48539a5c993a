"""Everything a recipe needs to watch a run, behind four calls: the loggers (``metrics.jsonl`` + wandb), the
progress display, per-step rollout statistics, and at the end the learning-curve PNG and the viewer page.

    with RunMonitor(RunMonitorConfig(run_dir=..., num_steps=..., rollouts_per_step=...)) as monitor:
        for step in range(first_step, num_steps):
            monitor.start_step(step)
            ...  monitor.rollout_finished(trajectory)  # as each rollout ends
            monitor.end_step(step, trajectories, train_metrics=..., rollout_wall_time_s=...)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console

from components.config import require, require_non_negative, require_one_of, require_positive
from components.protocols import MetricsLoggerProvider
from components.trajectory import Trajectory
from monitoring.logger import WANDB_MODES, run_loggers
from monitoring.plots import write_learning_curves
from monitoring.progress import RunProgress
from monitoring.rollout_stats import rollout_metrics
from monitoring.viewer import write_viewer

logger = logging.getLogger(__name__)

TRAIN_PREFIX = "train/"


@dataclass(frozen=True, kw_only=True)
class RunMonitorConfig:
    """How a run is watched. Files land in ``run_dir``: metrics.jsonl, wandb/, learning_curves.png, viewer/."""

    run_dir: Path
    num_steps: int
    rollouts_per_step: int
    first_step: int = 0  # a resumed run starts here
    project: str = "rein"  # wandb project
    run_name: str | None = None  # wandb run name (default: the run directory's name)
    wandb_mode: str = "auto"  # "auto" (offline unless logged in) | "offline" | "online" | "disabled"
    run_config: Mapping[str, Any] = field(default_factory=dict)  # the recipe's config, recorded by wandb
    plot_every_n_steps: int = 1  # rewrite learning_curves.png every N steps (0: only at close)
    viewer_every_n_steps: int = 0  # rewrite the viewer page every N steps (0: only at close)
    model: Path | None = None  # tokenizer for the viewer (default: the model named in run_dir/config.json)

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        require_positive(self.num_steps, "num_steps")
        require_positive(self.rollouts_per_step, "rollouts_per_step")
        require_non_negative(self.first_step, "first_step")
        require(
            self.first_step <= self.num_steps, "first_step", f"must be <= num_steps, got {self.first_step}"
        )
        require_one_of(self.wandb_mode, "wandb_mode", WANDB_MODES)
        require_non_negative(self.plot_every_n_steps, "plot_every_n_steps")
        require_non_negative(self.viewer_every_n_steps, "viewer_every_n_steps")


def train_metric_names(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Trainer metrics under ``train/`` (keys that already carry a namespace are kept as they are)."""
    return {(key if "/" in key else TRAIN_PREFIX + key): value for key, value in metrics.items()}


class RunMonitor:
    """Loggers + progress display + rollout statistics + end-of-run artifacts for one run directory."""

    def __init__(
        self,
        config: RunMonitorConfig,
        *,
        trackers: MetricsLoggerProvider | None = None,
        console: Console | None = None,
    ) -> None:
        """``trackers``: where metrics go besides ``metrics.jsonl`` (a recipe's brick; default: wandb in
        ``config.wandb_mode``)."""
        self.config = config
        config.run_dir.mkdir(parents=True, exist_ok=True)
        self.loggers = run_loggers(
            config.run_dir,
            project=config.project,
            name=config.run_name or config.run_dir.name,
            config=config.run_config,
            wandb_mode=config.wandb_mode,
            trackers=trackers,
        )
        self.progress = RunProgress(
            num_steps=config.num_steps,
            rollouts_per_step=config.rollouts_per_step,
            first_step=config.first_step,
            console=console,
        )
        self._step_started_at = time.monotonic()
        self._closed = False

    def __enter__(self) -> RunMonitor:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start_step(self, step: int, *, num_rollouts: int | None = None) -> None:
        """A step's rollouts begin."""
        self._step_started_at = time.monotonic()
        self.progress.start_step(step, num_rollouts=num_rollouts)

    def rollout_finished(self, trajectory: Trajectory) -> None:
        """One rollout ended (any status)."""
        self.progress.rollout_finished(trajectory)

    def pipeline_changed(self, *, in_flight: int, buffered: int) -> None:
        """Rollouts in flight and complete groups buffered (``async`` / ``partial`` loops), for the display."""
        self.progress.pipeline_changed(in_flight=in_flight, buffered=buffered)

    def end_step(
        self,
        step: int,
        trajectories: Sequence[Trajectory],
        *,
        train_metrics: Mapping[str, Any] | None = None,
        rollout_wall_time_s: float | None = None,
        extra_metrics: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Log the step's rollout statistics, trainer metrics and timing; return everything logged."""
        metrics: dict[str, Any] = rollout_metrics(trajectories, wall_time_s=rollout_wall_time_s)
        metrics.update(train_metric_names(train_metrics or {}))
        metrics.update(extra_metrics or {})
        metrics["time/step_s"] = time.monotonic() - self._step_started_at
        self.loggers.log(metrics, step=step)
        self.progress.finish_step(metrics)
        done = step + 1
        if self.config.plot_every_n_steps and done % self.config.plot_every_n_steps == 0:
            self._write_learning_curves()
        if self.config.viewer_every_n_steps and done % self.config.viewer_every_n_steps == 0:
            self._write_viewer()
        return metrics

    def _write_learning_curves(self) -> Path | None:
        try:
            return write_learning_curves(self.config.run_dir)
        except Exception as error:  # a plot never stops a run
            logger.warning("could not write the learning curves of %s: %s", self.config.run_dir, error)
            return None

    def _write_viewer(self) -> Path | None:
        try:
            return write_viewer(self.config.run_dir, model=self.config.model)
        except Exception as error:  # nor does the viewer
            logger.warning("could not write the viewer of %s: %s", self.config.run_dir, error)
            return None

    def close(self) -> None:
        """Stop the display, flush the loggers, write learning_curves.png and viewer/index.html (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.progress.stop()
        self.loggers.close()
        self._write_learning_curves()
        page = self._write_viewer()
        if page is not None:
            self.progress.message(f"trajectory viewer: {page}  (rein view {self.config.run_dir} --serve)")
