"""What every recipe shares: the run directory, Ray, the engine + proxy + trainer stack, and resume bookkeeping.

A recipe builds its tasks, harness and grader, then drives ``RunStack`` step by step; the stack's own bricks
(engine, proxy, algorithm, sandbox provider: objects satisfying ``components.protocols``) come from ``Bricks.from_config``
unless the recipe passes its own, and the stack never asks which kind they are::

    run = RunDirectory.create(config, recipe="swe_grpo")
    async with RunStack.start(config, run, sandbox_paths=...) as stack:  # or bricks=Bricks(...)
        for step in stack.ledger.pending_steps(config.num_steps):
            trajectories, shard = await stack.rollout_or_load(step, runner, tasks)
            train_metrics = await stack.train_and_sync(step, shard)
            monitor.end_step(step, trajectories, train_metrics=train_metrics)  # the step's row first,
            await stack.checkpoint_if_due(step)  # then the checkpoint that marks it done

Run directory (``runs/<recipe>-<time>`` unless ``--run-dir``): ``config.json``, ``trajectories/`` (one Parquet
shard per step; in ``--rollout-mode async`` / ``partial`` one per GRPO group), ``metrics.jsonl``, ``checkpoints/step-N`` (HF folders + optimizer + ``trainer_state.json``),
``logs/driver.log``, ``wandb/`` (offline unless logged in), ``learning_curves.png``, ``viewer/index.html``.

Placement through Ray resources:
  - engine: one ``EngineActor`` with ``engine.num_cpus`` CPUs and ``engine.num_gpus`` GPUs (``--engine embedded``);
    with ``--engine sglang`` the SGLang servers run outside Ray and the recipe only talks HTTP to ``sglang.url``;
  - proxy: session-shard actors and ``proxy.replicas`` Ray Serve replicas, 0 CPUs each (they wait on I/O);
    ``--proxy local`` serves it from the driver process instead (one fewer moving part, no Serve start-up);
  - sandboxes: the driver's bubblewrap pool keeps ``sandbox.num_warm`` started (``--sandbox-backend e2b``: E2B's
    cloud); on a multi-node cluster use ``sandboxes.ray_pool`` whose capacity is the ``sandbox_slots`` resource;
  - trainer: ``trainer.num_workers`` Ray Train FSDP2 workers with ``trainer.cpus_per_worker`` CPUs (1 GPU each when
    ``trainer.use_gpu``);
  - rollout producer (harness runs, grading, the agents' sandboxes): in the driver, or with
    ``--rollout-placement actor`` one Ray actor with ``rollout.actor_num_cpus`` CPUs and the custom resources
    ``rollout.actor_resources`` (e.g. ``rollout=1`` that only sandbox nodes offer), its sandboxes started on its
    node; it needs ``--proxy serve`` (``components/rollout/producer.py``).

Resume rule (same ``--run-dir``): the trainer restarts from the newest complete checkpoint, whose
``consumed_shards`` lists the step shards already trained into it. Each step is then, in order: *done* when its
shard was consumed (skipped), *stored* when its shard exists but was not consumed (trained again from the shard,
never rolled out again), *new* otherwise (rolled out, written as one shard, trained). A shard is written
atomically, so a crash mid-rollout leaves no partial step: its rollouts are redone. No trajectory is lost or
duplicated, and the engine restarts from the checkpoint's weights and version.

Resume rule of ``--rollout-mode async`` and ``partial`` (``components/loop.py``): shards are per group, committed
as each group completes, and which shard went into which step (and which were dropped for staleness) is the
``trajectory_ledger`` in the checkpoint's trainer state, saved with the weights it describes. On restart the
steps in the ledger are done; every committed group the ledger does not name goes back into the buffer and is
trained exactly once; a group index handed out but never committed (in flight at the crash, or given up as too
stale) is rolled out again; the engine restarts from the checkpoint's weights and version. A run directory
keeps its mode's shard layout: resuming a sync run's untrained step shard in an overlapped mode is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import require, require_non_negative, require_positive
from components.engine.providers import EmbeddedEngineBrickConfig, EngineBrickConfig, EngineProvider
from components.errors import ReinError
from components.loop import RolloutBrickConfig
from components.models.registry import REPO_ROOT, default_model_dir, resolve_model
from components.protocols import (
    Algorithm,
    MetricsLoggerProvider,
    SandboxProvider,
    SessionControl,
    StartsAhead,
    Task,
)
from components.proxy.providers import ProxyBrickConfig, ProxyProvider, ServeProxyConfig
from components.recipe_config import config_to_json, option, slot
from components.registry import ALGORITHMS, ENGINES, LOGGERS, PROXIES, SANDBOXES
from components.sampling import SamplingDistribution
from components.training.algorithms import AlgorithmConfig, GRPOConfig
from components.training.distillation import DistillationConfig
from components.training.trainer_config import TrainerBrickConfig, TrainerConfig
from components.trajectory import Trajectory
from components.trajectory_store import TrajectoryStore
from monitoring.logger import MetricsLoggersConfig, WandbLoggersConfig
from sandboxes.provider import SandboxConfig, SandboxPoolConfig
from sandboxes.resilient import SandboxResilienceConfig

if TYPE_CHECKING:
    from components.proxy.config import ProxyConfig
    from components.rollout import RolloutRunner
    from components.training import Trainer

logger = logging.getLogger("rein.recipe")

# What `ray job submit --working-dir .` must not upload (Ray honours .gitignore too; this makes it explicit).
WORKING_DIR_EXCLUDES = [".venv", ".models", ".agents", "runs", ".git", "**/__pycache__", "*.egg-info"]


# Where a field goes: a field that configures one brick goes into that brick's config below (its flag is
# ``--<brick>-<field>``, or a historical flag kept with ``option(..., flag=...)``); a field the whole run shares
# (model, steps, seed, sampling) stays on ``RunConfig``. A recipe changes a brick's defaults by giving the brick
# field a new default instance: ``sampling: SamplingBrickConfig = option(SamplingBrickConfig(max_tokens=192))``.
# The trainer brick's config lives with the trainer (``components/training/trainer_config.py``).
# ``--config FILE`` takes the same fields nested by brick (``trainer: {workers: 2}``).


@dataclass(kw_only=True, frozen=True)
class SamplingBrickConfig:
    """How the policy samples (the proxy samples with it, each segment records it, the trainer recomputes
    logprobs under it)."""

    temperature: float = option(1.0, "sampling temperature of the policy", flag="temperature")
    top_p: float = option(
        1.0, "nucleus (top-p) mass of the policy's sampling; 1: no truncation", flag="top-p"
    )
    top_k: int = option(0, "top-k of the policy's sampling; 0: no truncation", flag="top-k")
    agent_sampling: bool = option(
        False,
        "sample with each agent's own temperature/top_p/top_k instead of the run's (recorded either way)",
        flag="agent-sampling",
    )
    max_tokens: int = option(128, "cap on the tokens of one model reply", flag="max-tokens")
    record_routed_experts: bool = option(
        False,
        "MoE policies: record the experts the engine routed each token to and replay them in training (R3)",
        flag="record-routed-experts",
    )

    def __post_init__(self) -> None:
        self.distribution  # noqa: B018 -- validates temperature / top_p / top_k, naming the bad one
        require_positive(self.max_tokens, "max_tokens")

    @property
    def distribution(self) -> SamplingDistribution:
        """The run's sampling distribution (the proxy samples with it; each segment records it)."""
        return SamplingDistribution(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    """Fields every recipe has: the run's own (model, run directory, steps, seed, Ray) and one config per brick
    (engine, sglang, proxy, rollout, sampling, sandbox, trainer, monitoring)."""

    model: str = option(
        "default", "policy: 'default' (SmolLM2-135M-Instruct), 'tiny' (test model) or an HF folder"
    )
    run_dir: str = option("", "run directory; '' makes runs/<recipe>-<time>; an existing one is resumed")
    num_steps: int = option(2, "training steps (rollout → train → weight sync → log/checkpoint)")
    group_size: int = option(2, "rollouts per task per step (one GRPO group)")
    algorithm: AlgorithmConfig = slot(
        ALGORITHMS,
        GRPOConfig(),
        "policy-gradient algorithm (components/training/algorithms/): GRPO, Dr.GRPO, GSPO (sequence-level ratio "
        "and clipping) or RLOO (leave-one-out baseline); its fields are its loss knobs: clip range, mismatch "
        "correction (importance_sampling), KL coefficient and estimator, loss aggregation (sample_weighting)",
    )
    checkpoint_every_steps: int = option(1, "write a checkpoint every N steps (and always after the last)")
    seed: int = option(0, "seed of the trainer and of task selection")
    engine: EngineBrickConfig = slot(
        ENGINES,
        EmbeddedEngineBrickConfig(),
        "the inference engine: the embedded torch engine in one Ray actor, or SGLang / vLLM servers outside Ray",
    )
    proxy: ProxyBrickConfig = slot(
        PROXIES,
        ServeProxyConfig(),
        "the inference proxy: Ray Serve deployment (serve) or in the driver (local)",
    )
    rollout: RolloutBrickConfig = option(RolloutBrickConfig(), "rollout scheduling")
    sampling: SamplingBrickConfig = option(SamplingBrickConfig(), "the policy's sampling")
    sandbox: SandboxConfig = slot(
        SANDBOXES,
        SandboxPoolConfig(num_warm=2),
        "the agents' sandboxes: local bubblewrap pool (bwrap) or E2B",
        flag="sandbox-backend",
    )
    sandbox_resilience: SandboxResilienceConfig = option(
        SandboxResilienceConfig(), "retries and circuit breaker around the sandbox backend"
    )
    trainer: TrainerBrickConfig = option(TrainerBrickConfig(), "the trainer")
    monitoring: MetricsLoggersConfig = slot(
        LOGGERS, WandbLoggersConfig(), "metrics loggers besides metrics.jsonl"
    )
    distillation: DistillationConfig = option(
        DistillationConfig(), "on-policy distillation from teachers (components/training/distillation.py)"
    )
    ray_address: str = option(
        "", "Ray cluster to join; '' joins $RAY_ADDRESS when set, else starts a local one"
    )
    ray_num_cpus: int = option(8, "logical CPUs of a local Ray instance (oversubscribing 2 cores is fine)")

    def __post_init__(self) -> None:
        for name in ("num_steps", "group_size", "ray_num_cpus"):
            require_positive(getattr(self, name), name)
        require_non_negative(self.checkpoint_every_steps, "checkpoint_every_steps")
        # Checks across bricks (each brick checks its own fields).
        self.engine.check_sampling(self.sampling.distribution)  # e.g. SGLang's logprobs ignore top-p / top-k
        require(
            not self.engine.colocated or self.rollout.mode == "sync",
            "engine.colocated",
            "needs rollout mode sync (the servers give their GPU memory up while training)",
        )
        require(
            self.rollout.placement == "driver" or self.proxy.reachable_from_other_processes,
            "rollout.placement",
            "actor needs proxy kind serve: the in-driver proxy (local) cannot be reached from the producer actor",
        )
        if self.model == "default":
            require(
                (default_model_dir() / "config.json").exists(),
                "model",
                f"the default model is missing at {default_model_dir()}: run `make setup`, or set REIN_MODELS_DIR "
                "to the folder holding it (e.g. on a cluster, where the job's working dir has no .models)",
            )
        elif self.model != "tiny":
            require((Path(self.model) / "config.json").exists(), "model", f"{self.model!r} is no HF folder")


@dataclass(frozen=True)
class RunDirectory:
    """The one directory a run writes everything into."""

    path: Path
    recipe: str
    model_path: Path

    @classmethod
    def create(cls, config: RunConfig, *, recipe: str) -> RunDirectory:
        """Make (or reopen, to resume) the run directory; write ``config.json``; log to ``logs/driver.log``."""
        path = Path(config.run_dir or REPO_ROOT / "runs" / f"{recipe}-{time.strftime('%Y%m%d-%H%M%S')}")
        path = path.resolve()
        (path / "logs").mkdir(parents=True, exist_ok=True)
        run = cls(path=path, recipe=recipe, model_path=resolve_model(config.model).resolve())
        recorded = {"recipe": recipe, "model_path": str(run.model_path), **json.loads(config_to_json(config))}
        (path / "config.json").write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        handler = logging.FileHandler(path / "logs" / "driver.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)
        for chatty in ("httpx", "httpx2", "httpcore"):  # one line per model call otherwise
            logging.getLogger(chatty).setLevel(logging.WARNING)
        return run


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


UNTRAINED_DIR = "untrained"  # under the run directory: a store of rollouts left out of training


class StepLedger:
    """Which steps are done, stored (shard written, not trained into the checkpoint) or new (see module doc)."""

    def __init__(self, store: TrajectoryStore, consumed_shards: Sequence[str]) -> None:
        self.store = store
        self.consumed = set(consumed_shards)
        self.shards: dict[int, Path] = {}
        for path in store.shard_paths():
            trajectories = store.read_shard(path)
            if trajectories:
                self.shards.setdefault(trajectories[0].step, path)

    def pending_steps(self, num_steps: int) -> list[int]:
        """Steps not yet trained into the checkpoint, in order."""
        return [step for step in range(num_steps) if self.shards.get(step, Path()).name not in self.consumed]

    def stored_shard(self, step: int) -> Path | None:
        """The shard of ``step`` written before a restart, if any."""
        return self.shards.get(step)


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
        self.ledger = StepLedger(self.store, self.trainer.state.consumed_shards)
        try:
            logger.info("trainer warmed up in %.1f s", await warm_up)
        except Exception as error:  # never stops a run: the first step just pays for it
            logger.warning("warming up the trainer failed: %s", error)

    async def _start_teachers(self) -> list[Any]:
        """Per ``distillation.teachers`` entry: an embedded engine in this process for a model folder, or the
        client of a ``vllm:URL`` / ``sglang:URL`` server (same tokenizer as the policy, else a ``ValueError``
        naming the field)."""
        from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
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
            engine_config = EmbeddedEngineConfig(
                model_path=folder,
                num_threads=self.config.engine.threads,
                max_batch_size=self.config.engine.max_batch_size,
                kv_cache_gb=0.0,
            )
            teacher = await _to_thread(EmbeddedEngine, engine_config)
            self._cleanups.append(teacher.aclose)
            teachers.append(teacher)
        return teachers

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
            tool_format=self.config.proxy.tool_format,
            reasoning_format=self.config.proxy.reasoning_format,
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

        shard = self.ledger.stored_shard(step)
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

    async def train_and_sync(self, step: int, shard: Path | None) -> dict[str, float]:
        """One optimizer step on the shard, then the new weights to the engine (the caller logs the step, then
        calls ``checkpoint_if_due``: a step's metrics are written before the checkpoint that covers it, so a
        kill between the two re-runs the step and re-logs it, never leaves a trained step without its row)."""
        trainer, version = self.trainer, self.trainer.state.weight_version
        metrics: dict[str, float] = {"trained": 0.0}
        colocated = self.config.engine.colocated  # the servers' GPU memory goes to the trainer meanwhile
        if colocated:
            await self.engine.release_memory_occupation()
        if shard is not None:
            metrics = await _to_thread(trainer.step, [shard], version)
        if colocated:
            await self.engine.resume_memory_occupation(["weights"])
        if metrics.get("trained"):
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


async def _to_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    import asyncio

    return await asyncio.to_thread(function, *args, **kwargs)


def tasks_for_step(tasks: Sequence[Task], *, step: int, num_tasks: int) -> list[Task]:
    """``num_tasks`` tasks for ``step``, walking through ``tasks`` in order (wrapping around)."""
    return [tasks[(step * num_tasks + index) % len(tasks)] for index in range(num_tasks)]


def main_entry(main: Callable[[Any], Awaitable[Any]], config_class: type, description: str) -> None:
    """Parse the command line into ``config_class`` and run ``main(config)``."""
    import asyncio

    from components.recipe_config import parse_config

    config = parse_config(config_class, sys.argv[1:], description=description)
    try:
        asyncio.run(main(config))
    except ValueError as error:  # a value only checkable at run time (e.g. an unknown task id): no traceback
        logger.info("run stopped", exc_info=True)  # the traceback goes to logs/driver.log only
        sys.exit(f"{Path(sys.argv[0]).name}: error: {error}")
    except ReinError as error:  # a fault the run did not survive (a sandbox backend down, a server gone)
        logger.info("run stopped", exc_info=True)  # the traceback: logs/driver.log only
        cause = getattr(error, "cause", None)  # raised in a Ray actor: Ray's wrapper carries the original
        error = cause if isinstance(cause, ReinError) else error
        sys.exit(
            f"{Path(sys.argv[0]).name}: the run stopped: {type(error).__name__}: {error} (traceback in the run "
            "directory's logs/driver.log; the same command resumes the run from its last checkpoint)"
        )
