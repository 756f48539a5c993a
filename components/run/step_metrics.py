"""What the loops measure around each step besides the trajectories: the engine's idle fraction, the trainer's
and the rollout slots' idle time, and the run's monitor that writes each step's row."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from components.trajectory import Trajectory

if TYPE_CHECKING:
    from components.run.loop import LoopInputs
    from monitoring.run_monitor import RunMonitor

logger = logging.getLogger("rein.loop")


@runtime_checkable
class ReportsLoad(Protocol):
    """An engine that reports its queues (``RayEngineClient.refresh``: num_running / num_prefilling /
    num_waiting)."""

    async def refresh(self) -> dict[str, Any]: ...


class EngineIdleProbe:
    """Samples the engine's queues a few times a second: the fraction of samples with no request in it is the
    engine idle fraction (an engine that does not report its queues reports nothing)."""

    def __init__(self, engine: Any, *, interval_s: float = 0.25) -> None:
        self.engine = engine if isinstance(engine, ReportsLoad) else None
        self.interval_s = interval_s
        self._samples = 0
        self._idle = 0

    async def run(self) -> None:
        if self.engine is None:
            return
        while True:
            try:
                info = await self.engine.refresh()
            except Exception as error:  # a probe never takes the run down
                logger.debug("engine probe failed: %s", error)
            else:
                busy = sum(int(info.get(key, 0)) for key in ("num_running", "num_prefilling", "num_waiting"))
                self._samples += 1
                self._idle += busy == 0
            await asyncio.sleep(self.interval_s)

    def take(self) -> dict[str, float]:
        """The idle fraction since the last call (empty when nothing was sampled)."""
        samples, idle = self._samples, self._idle
        self._samples = self._idle = 0
        return {"pipeline/engine_idle_fraction": idle / samples} if samples else {}


@contextlib.asynccontextmanager
async def engine_probe(engine: Any):
    probe = EngineIdleProbe(engine)
    task = asyncio.create_task(probe.run())
    try:
        yield probe
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def step_monitor(inputs: LoopInputs, *, rollouts_per_step: int, first_step: int) -> RunMonitor:
    """The run's monitor: ``metrics.jsonl`` plus the trackers of the stack's ``loggers`` brick."""
    from components.recipe_config import config_to_json
    from monitoring.run_monitor import RunMonitor, RunMonitorConfig

    config, run = inputs.config, inputs.run
    return RunMonitor(
        RunMonitorConfig(
            run_dir=run.path,
            num_steps=config.num_steps,
            rollouts_per_step=rollouts_per_step,
            first_step=min(first_step, config.num_steps),
            run_config=json.loads(config_to_json(config)),
            model=run.model_path,
        ),
        trackers=inputs.stack.bricks.loggers,
    )


def _slot_occupancy(trajectories: Sequence[Trajectory], *, max_concurrency: int, wall_s: float) -> float:
    """The fraction of the rollout slots' time spent rolling out (1 - engine idle fraction)."""
    busy = sum(t.metrics.get("rollout_wall_time_s", 0.0) for t in trajectories)
    return min(1.0, busy / (max_concurrency * wall_s)) if wall_s > 0 else 0.0


def timing_metrics(
    trajectories: Sequence[Trajectory],
    *,
    max_concurrency: int,
    wall_s: float,
    train_s: float,
    trained_tokens: float,
) -> dict[str, float]:
    return {
        "pipeline/trainer_idle_fraction": max(0.0, 1.0 - train_s / wall_s) if wall_s > 0 else 0.0,
        "pipeline/rollout_slot_idle_fraction": 1.0
        - _slot_occupancy(trajectories, max_concurrency=max_concurrency, wall_s=wall_s),
        "pipeline/rollouts_per_min": 60.0 * len(trajectories) / wall_s if wall_s > 0 else 0.0,
        "pipeline/trained_tokens_per_s": trained_tokens / wall_s if wall_s > 0 else 0.0,
    }
