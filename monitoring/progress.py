"""A live terminal display of a run (step, rollouts done, reward, pass rate, failures, tokens/s) that turns
into plain log lines when the output is not a terminal (CI, ``ray job`` logs, redirected output)."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Mapping
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from components.config import require, require_non_negative, require_positive
from components.trajectory import Trajectory, TrajectoryStatus

# Trainer metrics shown after a step when present (first matching key wins).
TRAIN_METRIC_KEYS = {
    "loss": ("train/loss", "loss"),
    "logprob pearson": ("train/logprob_pearson", "logprob_pearson", "train/rollout_train_logprob_pearson"),
    "grad norm": ("train/grad_norm", "grad_norm"),
}
PLAIN_PROGRESS_FRACTIONS = (0.25, 0.5, 0.75)  # non-TTY: a line when a step's rollouts pass these fractions


def _format(value: float, digits: int = 3) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


class RunProgress:
    """Shows a run's progress; use as a context manager. Calls may come from any thread."""

    def __init__(
        self,
        *,
        num_steps: int,
        rollouts_per_step: int,
        first_step: int = 0,
        console: Console | None = None,
        refresh_per_second: float = 4.0,
    ) -> None:
        require_positive(num_steps, "num_steps")
        require_positive(rollouts_per_step, "rollouts_per_step")
        require_non_negative(first_step, "first_step")
        require(
            first_step <= num_steps, "first_step", f"must be <= num_steps ({num_steps}), got {first_step}"
        )
        self.num_steps = num_steps
        self.rollouts_per_step = rollouts_per_step
        self.console = console or Console(stderr=True)
        self.interactive = self.console.is_terminal
        self._lock = threading.RLock()
        self._steps = Progress(
            TextColumn("[bold]steps   "),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._rollouts = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._steps_task = self._steps.add_task("steps", total=num_steps, completed=first_step)
        self._rollouts_task = self._rollouts.add_task("rollouts", total=rollouts_per_step)
        self._live = Live(self, console=self.console, refresh_per_second=refresh_per_second, transient=False)
        self._started = False
        self.step = first_step
        self._reset_step_stats(rollouts_per_step)
        self._train_metrics: dict[str, float] = {}
        self.pipeline: tuple[int, int] | None = None  # (rollouts in flight, complete groups buffered)

    def _reset_step_stats(self, num_rollouts: int) -> None:
        self.num_rollouts = num_rollouts
        self.rollouts_done = 0
        self.rewards: list[float] = []
        self.failures: Counter[str] = Counter()
        self.sampled_tokens = 0
        self.step_started_at = time.monotonic()
        self._plain_fractions_said: set[float] = set()

    # ---- statistics of the current step -------------------------------------------------------------------
    @property
    def reward_mean(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else math.nan

    @property
    def pass_rate(self) -> float:
        return sum(r == 1.0 for r in self.rewards) / len(self.rewards) if self.rewards else math.nan

    @property
    def tokens_per_s(self) -> float:
        elapsed = time.monotonic() - self.step_started_at
        return self.sampled_tokens / elapsed if elapsed > 0 else math.nan

    def summary(self) -> str:
        """One line saying where the run stands."""
        failures = sum(self.failures.values())
        failure_text = str(failures)
        if failures:
            failure_text += " (" + ", ".join(f"{k}={v}" for k, v in sorted(self.failures.items())) + ")"
        parts = [
            f"step {self.step} ({self._steps.tasks[0].completed:.0f}/{self.num_steps} done)",
            f"rollouts {self.rollouts_done}/{self.num_rollouts}",
            f"reward {_format(self.reward_mean)}",
            f"pass {_format(self.pass_rate, 2)}",
            f"failures {failure_text}",
            f"{_format(self.tokens_per_s, 1)} tok/s",
        ]
        if self.pipeline is not None:
            parts.append(f"in flight {self.pipeline[0]} | buffered groups {self.pipeline[1]}")
        parts += [f"{label} {_format(value, 4)}" for label, value in self._train_metrics.items()]
        return " | ".join(parts)

    # ---- events -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Begin displaying (the context manager calls this)."""
        with self._lock:
            if self.interactive and not self._started:
                self._live.start()
            self._started = True

    def stop(self) -> None:
        """Stop displaying, leaving the last state on screen (idempotent)."""
        with self._lock:
            if self.interactive and self._started:
                self._live.refresh()
                self._live.stop()
            self._started = False

    def __enter__(self) -> RunProgress:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start_step(self, step: int, *, num_rollouts: int | None = None) -> None:
        """A step's rollouts begin."""
        num_rollouts = self.rollouts_per_step if num_rollouts is None else num_rollouts
        require_positive(num_rollouts, "num_rollouts")
        with self._lock:
            self.step = step
            self._reset_step_stats(num_rollouts)
            self._rollouts.reset(self._rollouts_task, total=num_rollouts, completed=0)
            self._plain(f"step {step} started: {num_rollouts} rollouts")

    def rollout_finished(self, trajectory: Trajectory) -> None:
        """One rollout of the current step finished (any status)."""
        with self._lock:
            self.rollouts_done += 1
            if trajectory.reward is not None:
                self.rewards.append(trajectory.reward)
            if trajectory.status != TrajectoryStatus.OK:
                self.failures[trajectory.status.value] += 1
            self.sampled_tokens += sum(s.num_sampled_tokens for s in trajectory.segments)
            self._rollouts.update(self._rollouts_task, completed=self.rollouts_done)
            fraction = self.rollouts_done / self.num_rollouts
            due = [
                f for f in PLAIN_PROGRESS_FRACTIONS if fraction >= f and f not in self._plain_fractions_said
            ]
            if due:
                self._plain_fractions_said.update(due)
                self._plain(self.summary())

    def finish_step(self, metrics: Mapping[str, float] | None = None) -> None:
        """The step (rollouts + training) is done; ``metrics`` are its trainer metrics, shown when known."""
        with self._lock:
            metrics = dict(metrics or {})
            for label, keys in TRAIN_METRIC_KEYS.items():
                value = next((metrics[k] for k in keys if k in metrics), None)
                if isinstance(value, int | float):
                    self._train_metrics[label] = float(value)
            self._steps.update(
                self._steps_task, completed=min(self.num_steps, self._steps.tasks[0].completed + 1)
            )
            self._plain(self.summary())

    def pipeline_changed(self, *, in_flight: int, buffered: int) -> None:
        """The overlapped loops' producer state: rollouts in flight, complete groups waiting for the trainer."""
        require_non_negative(in_flight, "in_flight")
        require_non_negative(buffered, "buffered")
        with self._lock:
            self.pipeline = (in_flight, buffered)

    def message(self, text: str) -> None:
        """A free-form line above the display (or in the log)."""
        with self._lock:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _plain(self, line: str) -> None:
        if not self.interactive:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    # ---- rendering ----------------------------------------------------------------------------------------
    def __rich__(self) -> Group:
        with self._lock:
            stats = Table.grid(padding=(0, 2))
            cells = [
                f"[bold]step[/] {self.step}",
                f"[bold]reward[/] {_format(self.reward_mean)}",
                f"[bold]pass[/] {_format(self.pass_rate, 2)}",
                f"[bold]failures[/] {sum(self.failures.values())}",
                f"[bold]tok/s[/] {_format(self.tokens_per_s, 1)}",
            ]
            if self.pipeline is not None:
                cells += [f"[bold]in flight[/] {self.pipeline[0]}", f"[bold]buffered[/] {self.pipeline[1]}"]
            stats.add_row(*(Text.from_markup(cell) for cell in cells))
            extra = [f"[bold]{k}[/] {v}" for k, v in sorted(self.failures.items())]
            extra += [f"[bold]{label}[/] {_format(value, 4)}" for label, value in self._train_metrics.items()]
            if extra:
                stats.add_row(*(Text.from_markup(cell) for cell in extra))
            return Group(self._steps, self._rollouts, stats)
