"""The run's stack: Ray, then the bricks (engine, proxy, trainer + weight sync, sandboxes, loggers) started in
order and stopped newest first, and the sync step's rollout → train → sync weights → checkpoint (see
``components/run/__init__.py`` for placement and resume)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.engine.providers import EngineProvider
from components.models.registry import REPO_ROOT, resolve_model
from components.protocols import (
    Algorithm,
    MetricsLoggerProvider,
    SandboxProvider,
    SessionControl,
    StartsAhead,
    Task,
)
from components.proxy.providers import ProxyProvider
from components.rollout.buffer import LEDGER_KEY, TrajectoryLedger
from components.run.directory import UNTRAINED_DIR, RunDirectory
from components.trajectory import Trajectory
from components.trajectory_store import TrajectoryStore

if TYPE_CHECKING:
    from components.engine.embedded import EmbeddedEngineConfig
    from components.proxy.config import ProxyConfig
    from components.rollout import RolloutRunner
    from components.run.config import RunConfig
    from components.training import Trainer
    from components.training.checkpoint import TrainerState
    from components.training.trainer_config import TrainerConfig

logger = logging.getLogger("rein.recipe")

# What `ray job submit --working-dir .` must not upload (Ray honours .gitignore too; this makes it explicit).
WORKING_DIR_EXCLUDES = [".venv", ".models", ".agents", "runs", ".git", "**/__pycache__", "*.egg-info"]


def connect_ray(config: RunConfig) -> None:
    """Join ``ray_address`` / ``$RAY_ADDRESS`` (e.g. under ``ray job submit``), or start a local Ray."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if ray.is_initialized():
        return
    address = config.ray_address or os.environ.get("RAY_ADDRESS", "")
    # Workers import recipes' modules from the repository; on a cluster the job's working_dir provides them.
    if address:  # a job's own runtime env (working_dir, env vars) applies; adding one here would replace it
        ray.init(address=address, log_to_driver=False)
    else:
        env_vars = {
            "RAY_AUTH_MODE": "disabled",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(REPO_ROOT),
        }
        ray.init(
            address="local",  # a new instance: never a cluster another process left on this machine
            num_cpus=config.ray_num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": env_vars},
            object_store_memory=1024 * 1024 * 1024,
        )


@dataclass(kw_only=True)
class Bricks:
    """The objects the stack snaps together, each satisfying a Protocol of ``components.protocols``. A recipe
    builds them from its config (``from_config``: the one place a config name picks a class) or passes its own
    (a new algorithm or sandbox is one file implementing the Protocol; ``tests/contracts`` checks it)."""

    engine: EngineProvider  # starts the inference engine and says how new weights reach it
    proxy: ProxyProvider  # serves the proxy sessions over that engine
    algorithm: Algorithm
    sandboxes: SandboxProvider  # the agents' sandboxes (closed with the stack)
    loggers: MetricsLoggerProvider  # where metrics go besides metrics.jsonl (opened by the run's monitor)

    @classmethod
    def from_config(cls, config: RunConfig, *, sandbox_paths: Sequence[str] = ()) -> Bricks:
        """The bricks ``config`` names; ``sandbox_paths``: host paths the sandboxes bind read-only."""
        from sandboxes.resilient import ResilientSandboxProvider

        sandboxes = config.sandbox.build(read_only_paths=sandbox_paths)
        return cls(
            engine=config.engine.build(
                sampling=config.sampling.distribution,
                record_routed_experts=config.sampling.record_routed_experts,
            ),
            proxy=config.proxy.build(),
            algorithm=config.algorithm.build(),
            sandboxes=ResilientSandboxProvider(sandboxes, config.sandbox_resilience),  # retries, breaker
            loggers=config.monitoring.build(),
        )


async def start_sandboxes_ahead(sandboxes: SandboxProvider, placement: str) -> None:
    """Begin filling a provider that can start ahead (``StartsAhead``: the bubblewrap pool) while the rest of
    the stack warms up, so the first step's rollouts do not wait for cold starts. Not with ``placement actor``:
    the provider is then shipped to the producer actor and started on its node."""
    if placement == "driver" and isinstance(sandboxes, StartsAhead):
        await sandboxes.start(wait=False)


class RunStack:
    """Engine + proxy + trainer + weight sync + sandboxes + trajectory store of one run."""

    def __init__(self, config: RunConfig, run: RunDirectory, bricks: Bricks) -> None:
        self.config = config
        self.run = run
        self.bricks = bricks
        self.store = TrajectoryStore(run.path)
        # a sync step's groups left out of training (replaced short groups, dynamic sampling's dropped ones):
        # every rollout is kept, outside the step shards the trainer and the resume ledger read
        self.untrained_store = TrajectoryStore(run.path / UNTRAINED_DIR)
        self._cleanups: list[Callable[[], Awaitable[Any]]] = []
        self.teachers: list[Any] = []  # distillation teachers (``_start_teachers``)

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls,
        config: RunConfig,
        run: RunDirectory,
        *,
        sandbox_paths: Sequence[str] = (),
        bricks: Bricks | None = None,
    ):
        """Start everything (Ray first); stop it all on exit, crash or not. ``bricks``: default
        ``Bricks.from_config(config, sandbox_paths=sandbox_paths)``."""
        stack = cls(config, run, bricks or Bricks.from_config(config, sandbox_paths=sandbox_paths))
        try:
            await stack._start()
            yield stack
        finally:
            await stack.close()

    async def _start(self) -> None:
        from components.process_guard import ProcessGuard
        from components.training import latest_checkpoint

        config, run = self.config, self.run
        # First: the local Ray, sandboxes, servers and agents started from here on die with this driver, even
        # when it is SIGKILLed (the guard closes last, after every other cleanup).
        guard = ProcessGuard.start(log_path=run.path / "logs" / "process_guard.log")
        self._cleanups.append(lambda: _to_thread(guard.close))
        connect_ray(config)
        checkpoint = latest_checkpoint(run.path / "checkpoints")
        # A LoRA checkpoint is an adapter folder: the engine starts on the base and gets the resumed adapter
        # pushed (as the checkpoint's version) before any rollout.
        lora_checkpoint = checkpoint is not None and (checkpoint.path / "adapter_config.json").exists()
        # The engine starts (e.g. its actor loads the model) while the trainer's workers start.
        engine_start = asyncio.create_task(
            self.bricks.engine.start(
                model_path=checkpoint.path if checkpoint and not lora_checkpoint else run.model_path,
                weight_version=checkpoint.state.weight_version if checkpoint else 0,
                run_dir=run.path,
                resumed=checkpoint is not None,
            )
        )
        self._cleanups.append(self.bricks.engine.close)
        await asyncio.sleep(0)  # let the engine start launch before the trainer blocks this thread
        try:
            self.trainer = self._start_trainer()
        except BaseException:
            engine_start.cancel()
            raise
        self._cleanups.append(lambda: _to_thread(self.trainer.shutdown))
        if self.trainer.resumed_from:
            logger.info("resumed from %s (state %s)", self.trainer.resumed_from, self.trainer.state)
        # Ray Data, its workers and the trainer's first step start now, while the engine and the proxy start, not
        # inside the first step.
        warm_up = asyncio.create_task(_to_thread(self.trainer.warm_up))
        try:
            self.engine, self.weight_sync = await engine_start
            if lora_checkpoint:
                await self.weight_sync.push(self.trainer, self.trainer.state.weight_version)
            self.proxy_url, self.sessions = await self._start_proxy()
        except BaseException:
            warm_up.cancel()
            raise
        self.teachers = await self._start_teachers()
        self.sandboxes = self.bricks.sandboxes
        self._cleanups.append(self.sandboxes.close)
        await start_sandboxes_ahead(self.sandboxes, self.config.rollout.placement)
        self.stored_shards = self._stored_step_shards()  # a sync run's step shards written before a restart
        self.ledger = resume_ledger(self.trainer.state, self.stored_shards)
        try:
            logger.info("trainer warmed up in %.1f s", await warm_up)
        except Exception as error:  # never stops a run: the first step just pays for it
            logger.warning("warming up the trainer failed: %s", error)

    async def _start_teachers(self) -> list[Any]:
        """Per ``distillation.teachers`` entry: an embedded engine in this process for a model folder, or the
        client of a ``vllm:URL`` / ``sglang:URL`` server (same tokenizer as the policy, else a ``ValueError``
        naming the field)."""
        from components.engine.embedded import EmbeddedEngine
        from components.training.distillation import require_same_tokenizer
        from components.training.server_teachers import connect_server_teacher, server_kind

        teachers = []
        for name in self.config.distillation.teachers:
            if server_kind(name):
                teacher = await connect_server_teacher(name, policy_model=self.run.model_path)
                self._cleanups.append(teacher.aclose)
                teachers.append(teacher)
                continue
            folder = resolve_model(name)
            require_same_tokenizer(self.run.model_path, folder, field="distillation.teachers")
            teacher = await _to_thread(EmbeddedEngine, self.teacher_engine_config(folder))
            self._cleanups.append(teacher.aclose)
            teachers.append(teacher)
        return teachers

    def teacher_engine_config(self, folder: Path) -> EmbeddedEngineConfig:
        """The config of a model-folder teacher's engine in this process: the policy engine's settings when it is
        embedded (threads, batch size; the brick's defaults beside a server engine), without a prefix cache (a
        teacher only scores)."""
        from components.engine.embedded import EmbeddedEngineConfig
        from components.engine.providers import EmbeddedEngineBrickConfig

        policy = self.config.engine
        settings = policy if isinstance(policy, EmbeddedEngineBrickConfig) else EmbeddedEngineBrickConfig()
        return EmbeddedEngineConfig(
            model_path=folder, settings=dataclasses.replace(settings, kv_cache_gb=0.0)
        )

    async def score_with_teachers(self, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
        """The trajectories with their teachers' logprobs recorded (as they are without distillation)."""
        from components.training.distillation import score_with_teachers

        if not self.teachers:
            return list(trajectories)
        return await score_with_teachers(self.config.distillation, self.teachers, trajectories)

    def _start_trainer(self) -> Trainer:
        return self.trainer_config().build(algorithm=self.bricks.algorithm)

    def trainer_config(self) -> TrainerConfig:
        """The config the run's trainer starts with (the trainer brick, the sampling temperature, the seed)."""
        return self.config.trainer.for_run(
            model_path=self.run.model_path,
            run_dir=self.run.path,
            temperature=self.config.sampling.temperature,
            seed=self.config.seed,
            distillation=self.config.distillation,
        )

    async def _start_proxy(self) -> tuple[str, SessionControl]:
        from components.proxy.auth import generate_admin_key

        proxy_config = self.proxy_config(admin_key=generate_admin_key())
        self.session_keys = proxy_config.session_keys
        url, registry = await self.bricks.proxy.start(
            self.engine, model_path=self.run.model_path, config=proxy_config, run_name=self.run.path.name
        )
        self._cleanups.append(self.bricks.proxy.close)
        return url, registry

    def proxy_config(self, *, admin_key: str) -> ProxyConfig:
        """The proxy's config. Isolated mode: the admin key stays on the host; agents get per-session tokens."""
        from components.proxy.config import ProxyConfig

        return ProxyConfig(
            port=0,
            default_max_tokens=self.config.sampling.max_tokens,
            max_completion_tokens=self.config.sampling.max_tokens,
            # every rollout is sampled with the run's distribution unless agents may choose (recorded per segment)
            sampling=self.config.sampling.distribution,
            agent_sampling=self.config.sampling.agent_sampling,
            record_routed_experts=self.config.sampling.record_routed_experts,
            admin_key=admin_key,
            formats=self.config.proxy,  # the policy's tool-call and reasoning formats
        )

    async def rollout_or_load(
        self,
        step: int,
        runner: RolloutRunner,
        tasks: Sequence[Task],
        *,
        replacement_tasks: Callable[[int], Sequence[Task]] = lambda round_: (),
    ) -> tuple[list[Trajectory], Path | None]:
        """This step's trajectories and their shard: read back when stored before a restart, else rolled out
        (``runner.run(tasks, step)``) and written as one shard. With ``rollout.dynamic_sampling`` groups whose
        rewards are all equal are replaced by groups of ``replacement_tasks(round)``, and groups left with too
        few survivors of infrastructure failures (``rollout.partial_groups``) by new groups of their task; both
        are left out of the shard (the returned trajectories hold them; ``last_sampling_metrics`` counts them) and
        written, with their reasons, to ``RUN_DIR/untrained`` (``untrained_store``), never trained."""
        from components.rollout.dynamic_sampling import sample_step
        from components.rollout.engine_failures import before_replacements

        shard = self.stored_shards.get(step)
        self.last_sampling_metrics: dict[str, float] = {}
        if shard is not None:
            logger.info("step %d: training again from stored shard %s", step, shard.name)
            return self.store.read_shard(shard), shard

        async def roll_out(batch: Sequence[Task], first_index: int) -> list[Trajectory]:
            if first_index > 0:  # replacements: a server that died is back, with the run's weights, first
                await before_replacements(self.engine)
            return await runner.run(batch, step, first_index=first_index)

        sampled = await sample_step(
            self.config.rollout.dynamic_sampling,
            roll_out,
            tasks,
            replacement_tasks,
            partial=self.config.rollout.partial_groups,
        )
        if self.config.rollout.dynamic_sampling.enabled:
            self.last_sampling_metrics = sampled.metrics()
        self.last_sampling_metrics.update(sampled.partial_group_metrics())
        if sampled.left_out:  # before the step's shard: a restart then rolls the step out anew, keeping both
            await _to_thread(self.untrained_store.write, sampled.left_out)
        trained = await self.score_with_teachers(sampled.trained)
        return sampled.trajectories, self.store.write(trained)

    def _stored_step_shards(self) -> dict[int, Path]:
        """A sync run's step shards in the store, by step (the first shard of a step wins)."""
        shards: dict[int, Path] = {}
        for path in self.store.shard_paths():
            trajectories = self.store.read_shard(path)
            if trajectories:
                shards.setdefault(trajectories[0].step, path)
        return shards

    def pending_steps(self, num_steps: int) -> list[int]:
        """The steps of a sync run not yet trained into the checkpoint, in order."""
        return [step for step in range(num_steps) if step not in self.ledger.step_shards]

    async def train_and_sync(self, step: int, shards: Sequence[Path]) -> dict[str, float]:
        """The one train-and-sync step of every rollout mode: the step enters the resume ledger (in the trainer
        state, checkpointed with the weights it describes), one optimizer step on ``shards`` (none: nothing
        trained, nothing pushed), then the new weights to the engine. Colocated servers give their GPU memory to
        the trainer meanwhile. The caller logs the step, then calls ``checkpoint_if_due``: a step's metrics are
        written before the checkpoint that covers it, so a kill between the two re-runs the step and re-logs it,
        never leaves a trained step without its row."""
        trainer = self.trainer
        self.ledger.record_step(step, shards)
        trainer.state = replace(
            trainer.state, extra={**trainer.state.extra, LEDGER_KEY: self.ledger.to_state()}
        )
        version = trainer.state.weight_version
        metrics: dict[str, float] = {"trained": 0.0}
        colocated = self.config.engine.colocated
        if colocated:
            await self.engine.release_memory_occupation()
        if shards:
            metrics = await _to_thread(trainer.step, list(shards), version)
        if colocated:
            await self.engine.resume_memory_occupation(["weights"])
        if metrics.get("trained"):  # rollouts in flight (overlapped modes) continue on the new weights
            metrics.update(await self.weight_sync.push(trainer, trainer.state.weight_version))
        if colocated:
            await self.engine.resume_memory_occupation(["kv_cache"])
        return metrics

    async def checkpoint_if_due(self, step: int) -> None:
        """Write the trainer's checkpoint after ``step`` when ``checkpoint_every_steps`` (or the last step) says so."""
        every, num_steps = self.config.checkpoint_every_steps, self.config.num_steps
        if step + 1 == num_steps or (every and (step + 1) % every == 0):
            started = time.perf_counter()
            await _to_thread(self.trainer.save_checkpoint)
            logger.info(
                "step %d: checkpoint written in %.1f s (trainer state %s)",
                step,
                time.perf_counter() - started,
                self.trainer.state,
            )

    async def close(self) -> None:
        """Stop what was started, newest first; a failing cleanup never hides the others."""
        while self._cleanups:
            cleanup = self._cleanups.pop()
            try:
                await cleanup()
            except Exception as error:
                logger.warning("cleanup failed: %s", error)


def resume_ledger(state: TrainerState, stored_shards: Mapping[int, Path]) -> TrajectoryLedger:
    """The run's one resume ledger: which shards went into which step (and which were dropped, and why), kept in
    the trainer state, so it is exactly as old as the checkpoint's weights. A sync checkpoint written before the
    ledger was shared by every mode holds only ``consumed_shards``: its done steps are those of the consumed
    shards among ``stored_shards`` (a sync run's step shards, by step)."""
    ledger = TrajectoryLedger.from_state(state.extra)
    if LEDGER_KEY not in state.extra and state.consumed_shards:
        consumed = set(state.consumed_shards)
        for step, shard in sorted(stored_shards.items()):
            if shard.name in consumed:
                ledger.record_step(step, [shard])
    return ledger


async def _to_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    import asyncio

    return await asyncio.to_thread(function, *args, **kwargs)
