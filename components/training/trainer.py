"""The policy trainer: one Ray Train ``TorchTrainer`` worker group (FSDP2) kept alive across steps.

Starting a ``TorchTrainer`` costs tens of seconds, so ``Trainer`` starts ``fit()`` once, in a background
thread, with a train loop that never ends on its own: every worker pulls commands (train on this step's
micro-batches, gather the full state dict, write a checkpoint, score sequences, stop) from a small
coordinator actor and reports back to it. Each step's micro-batches come from the data pipeline
(``components.training.data``) as contiguous shards of its materialized Ray Dataset, handed to the live workers.

    trainer = Trainer(TrainerConfig(model_path=..., run_dir=...), algorithm=GRPO(GRPOConfig()))
    sync = WeightSync(WeightSyncConfig(mode="memory"), engine)      # engine: e.g. RayEngineClient
    metrics = trainer.step(shard_paths_or_trajectories, current_version=engine.weight_version)
    await sync.push(trainer, trainer.state.weight_version)
    trainer.shutdown()
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

import numpy as np

from components.errors import ReinError
from components.lora import AdapterGatherer, LoraAdapter, LoraSettings
from components.protocols import Algorithm
from components.remote_waits import PENDING_WAITS, RemoteStalledError
from components.training.checkpoint import (
    Checkpoint,
    TrainerState,
    latest_checkpoint,
    remove_temp_checkpoints,
    restore_rng_state,
    write_checkpoint,
)
from components.training.data import TrajectorySource, build_micro_batches_with_ray
from components.training.trainer_config import TrainerConfig
from components.trajectory import Trajectory

if TYPE_CHECKING:
    import ray.data
    import torch
    from ray import ObjectRef
    from ray.actor import ActorHandle
    from ray.train.torch import TorchTrainer
    from transformers import PretrainedConfig

    from components.engine.sglang import SGLangEngine
    from components.engine.sglang_weight_transfer import (
        DistributedWeightSyncConfig,
        RankZeroWeightBroadcaster,
    )

logger = logging.getLogger(__name__)

COORDINATOR_DEADLINE_S = 120.0  # handing a command to the workers' coordinator actor (no work in it)


class TrainerError(ReinError):
    """The trainer's worker group failed or did not answer in time."""


class TrainerStalledError(TrainerError, RemoteStalledError):
    """A wait on the trainer's workers (or on an object they produced) passed its deadline."""


# ------------------------------------------------------------------------------------------------------------
# The command channel between the driver and the live workers: typed commands through a coordinator actor
# ------------------------------------------------------------------------------------------------------------


ReplyT = TypeVar("ReplyT")
FetchedT = TypeVar("FetchedT")


class _Command(Generic[ReplyT]):
    """A worker command whose rank-0 reply is a ``ReplyT`` (the other ranks reply None where rank 0 alone has
    the answer)."""


@dataclass(frozen=True)
class TrainOnShards(_Command[dict[str, float]]):
    """One optimizer step: rank ``r`` trains on ``shards[r]`` padded to ``micro_batches_per_rank`` rows
    (``apply_update=False``: everything but the update, see ``run_train_step``)."""

    shards: Sequence[ray.data.Dataset]
    micro_batches_per_rank: int
    apply_update: bool = True


@dataclass(frozen=True)
class GatherFullStateDict(_Command[list["ObjectRef[dict[str, torch.Tensor]]"]]):
    """Rank 0 replies with ``[ObjectRef]`` of the full (unsharded, CPU) state dict."""


@dataclass(frozen=True)
class GatherAdapter(_Command[list["ObjectRef[LoraAdapter]"]]):
    """LoRA: every rank gathers the adapter's (trainable) tensors only; rank 0 replies with ``[ObjectRef]`` of
    the ``LoraAdapter``."""


@dataclass(frozen=True)
class WriteCheckpoint(_Command[str]):
    """Rank 0 writes a complete checkpoint carrying ``state`` and replies with its folder."""

    state: TrainerState


class SequenceToScore(TypedDict):
    """One sequence ``Trainer.score`` sends: its tokens and, for an MoE policy, its routes to replay."""

    token_ids: list[int]
    routed_experts: np.ndarray | None  # [positions, layers, top_k]


@dataclass(frozen=True)
class ScoreSequences(_Command[list[np.ndarray]]):
    """Rank 0 replies with the current policy's logprobs of each sequence (``token_ids``, ``routed_experts``)."""

    sequences: Sequence[SequenceToScore]


@dataclass(frozen=True)
class StopWorkers(_Command[None]):
    """Every worker leaves its command loop."""


@dataclass(frozen=True)
class BroadcastWeights(_Command[dict[str, float]]):
    """Every rank gathers the full state dict; rank 0 broadcasts it as ``version`` to SGLang ``servers`` over
    their weight-update group (``sglang_weight_transfer``: NCCL on GPUs, gloo on CPU) and replies with its
    figures - the weights never pass through the driver."""

    servers: tuple[SGLangEngine, ...]  # clients: they carry only their config
    sync: DistributedWeightSyncConfig
    version: int


WorkerCommand = (
    TrainOnShards
    | GatherFullStateDict
    | GatherAdapter
    | WriteCheckpoint
    | ScoreSequences
    | StopWorkers
    | BroadcastWeights
)


class _Coordinator:
    """Per-rank command queues and per-command result slots; the restore point of a restarted worker group.

    When Ray Train restarts the worker group (a worker died), its new workers start from ``restore_from`` (the
    newest checkpoint the driver wrote) and report ``worker_ready`` again; once all of them have, the queues are
    emptied and every command still pending is answered ``None`` ("the group restarted"): the driver trains the
    steps since that checkpoint again and re-sends the command (``Trainer._call``)."""

    def __init__(self, world_size: int, restore_from: str | None) -> None:
        self.world_size = world_size
        self.queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(world_size)]
        self.results: dict[str, dict[int, object]] = {}
        self.complete: dict[str, asyncio.Event] = {}
        self.restore_from = restore_from
        self.num_restarts = 0
        self._ready: set[int] = set()
        self._group_ready = asyncio.Event()
        self._restarted: set[str] = set()  # pending commands of a group that died
        self._started = False  # a whole group has been ready once

    async def set_restore_from(self, path: str) -> None:
        self.restore_from = path

    async def restore_point(self) -> str | None:
        return self.restore_from

    async def worker_ready(self, rank: int) -> None:
        """A worker has built its model; returns once every worker of its group has (a rank that reports twice
        is a worker of a new group: Ray Train restarted it)."""
        if rank in self._ready:
            self._ready, self._group_ready = set(), asyncio.Event()
            self.num_restarts += 1
        group_ready = self._group_ready
        self._ready.add(rank)
        if len(self._ready) == self.world_size:
            self.queues = [asyncio.Queue() for _ in range(self.world_size)]
            for command_id, event in self.complete.items():
                if not event.is_set() and command_id != "ready":
                    self._restarted.add(command_id)
                    event.set()
            if not self._started:  # the driver's start waits for the first complete group
                self._started = True
                self.results["ready"] = {}
                self._event("ready").set()
            group_ready.set()
        await group_ready.wait()

    def _event(self, command_id: str) -> asyncio.Event:
        return self.complete.setdefault(command_id, asyncio.Event())

    async def submit(self, command_id: str, command: WorkerCommand, restarts_seen: int) -> int:
        """Queue ``command`` for every rank, unless the group restarted since the driver last looked
        (``restarts_seen``): then it is answered None at once (its restored workers lack the steps since the
        checkpoint). Returns the number of restarts so far."""
        self._event(command_id)
        if restarts_seen != self.num_restarts:
            self._restarted.add(command_id)
            self._event(command_id).set()
        else:
            for queue in self.queues:
                queue.put_nowait((command_id, command))
        return self.num_restarts

    async def next_command(self, rank: int) -> tuple[str, WorkerCommand]:
        return await self.queues[rank].get()

    async def report(self, command_id: str, rank: int, result: object) -> None:
        slot = self.results.setdefault(command_id, {})
        slot[rank] = result
        if len(slot) == self.world_size:
            self._event(command_id).set()

    async def wait(self, command_id: str) -> list[object] | None:
        """One reply per rank; None when the worker group restarted before every rank replied."""
        await self._event(command_id).wait()
        slot = self.results.pop(command_id, {})
        self.complete.pop(command_id, None)
        if command_id in self._restarted:
            self._restarted.discard(command_id)
            return None
        return [slot.get(rank) for rank in range(self.world_size)]


# ------------------------------------------------------------------------------------------------------------
# The worker side (runs inside Ray Train workers)
# ------------------------------------------------------------------------------------------------------------


def _build_sharded_model(
    model_dir: Path,
    *,
    use_gpu: bool,
    device: torch.device,
    trainable: bool,
    lora: LoraSettings | None = None,
    adapter_dir: Path | None = None,
    seed: int = 0,
    gradient_checkpointing: bool = False,
) -> torch.nn.Module:
    """The policy sharded with FSDP2; with ``lora`` enabled, a ``PeftModel`` whose base weights are frozen
    (FSDP2 shards frozen and trainable parameters side by side; only the adapter reaches the optimizer)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if gradient_checkpointing and trainable:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora is not None and lora.enabled:
        from components.lora import wrap_with_lora

        model = wrap_with_lora(model, lora, adapter_dir=adapter_dir, seed=seed)
    model = model.to(device)
    layers = model.get_base_model().model.layers if lora is not None and lora.enabled else model.model.layers
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if use_gpu
        else MixedPrecisionPolicy()
    )
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    if not trainable:
        model.eval()
        model.requires_grad_(False)
    return model


def _score_sequences(
    model: torch.nn.Module, sequences: Sequence[SequenceToScore], *, temperature: float, device: torch.device
) -> list[np.ndarray]:
    import torch

    from components.training.data import MicroBatch
    from components.training.forward import forward_sampled_tokens

    out = []
    with torch.no_grad():
        for sequence in sequences:
            ids = torch.as_tensor(np.asarray(sequence["token_ids"]), dtype=torch.long)
            n = ids.numel()
            routes = sequence.get("routed_experts")
            batch = MicroBatch(
                input_ids=ids,
                position_ids=torch.arange(n),
                sequence_ids=torch.zeros(n, dtype=torch.long),
                loss_mask=torch.cat([torch.zeros(1), torch.ones(n - 1)]),
                old_logprobs=torch.zeros(n),
                advantages=torch.zeros(n),
                weights=torch.zeros(n),
                weight_versions=torch.zeros(n, dtype=torch.long),
                routed_experts=torch.as_tensor(routes) if routes is not None else None,
                temperature=torch.tensor([temperature]),
            )
            view = forward_sampled_tokens(model, batch, device=device, with_entropy=False)
            out.append(view.logprobs.float().cpu().numpy())
    return out


class TrainLoopConfig(TypedDict):
    """What ``Trainer`` hands every Ray Train worker (``train_loop_config``)."""

    config: TrainerConfig
    algorithm: Algorithm
    coordinator: ActorHandle[_Coordinator]


def _train_loop(loop_config: TrainLoopConfig) -> None:
    """Ray Train worker: build the sharded model and optimizer once, then serve commands until 'stop'."""
    import ray
    import ray.train
    import ray.train.torch
    import torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )
    from transformers import AutoConfig

    from components.training.step import build_optimizer

    config: TrainerConfig = loop_config["config"]
    algorithm: Algorithm = loop_config["algorithm"]
    coordinator = loop_config["coordinator"]
    # the newest checkpoint the driver wrote (a restarted group resumes there), else the run's start point
    restore_point: str | None = ray.get(coordinator.restore_point.remote())
    resume_from = Path(restore_point) if restore_point is not None else None
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    torch.set_num_threads(config.torch_threads_per_worker)
    torch.manual_seed(config.seed)
    device = ray.train.torch.get_device() if config.use_gpu else torch.device("cpu")

    lora = config.lora if config.lora.enabled else None
    model = _build_sharded_model(
        config.model_path if lora else resume_from or config.model_path,
        use_gpu=config.use_gpu,
        device=device,
        trainable=True,
        lora=lora,
        adapter_dir=resume_from if lora else None,
        seed=config.seed,
        gradient_checkpointing=config.gradient_checkpointing,
    )
    reference = (
        _build_sharded_model(config.model_path, use_gpu=config.use_gpu, device=device, trainable=False)
        if algorithm.needs_reference_logprobs
        else None
    )
    optimizer = build_optimizer(model, config.optimizer)
    # the adapter's trainable (sharded) parameters and saved-adapter keys, found once: each gather all-gathers
    # only those tensors (a collective every rank calls, in the same order), never the frozen base
    adapter_gatherer = AdapterGatherer(model) if lora is not None else None
    if resume_from is not None and (resume_from / "optimizer.pt").exists():
        full = torch.load(resume_from / "optimizer.pt", weights_only=False)
        set_optimizer_state_dict(
            model, optimizer, optim_state_dict=full, options=StateDictOptions(full_state_dict=True)
        )
        restore_rng_state(torch.load(resume_from / "rng.pt", weights_only=False))
    worker = _Worker(
        config=config,
        algorithm=algorithm,
        rank=rank,
        world_size=world_size,
        device=device,
        model=model,
        reference=reference,
        optimizer=optimizer,
        adapter_gatherer=adapter_gatherer,
        model_config=AutoConfig.from_pretrained(config.model_path),
    )
    ray.get(coordinator.worker_ready.remote(rank))
    while True:
        command_id, command = ray.get(coordinator.next_command.remote(rank))
        handler = _HANDLERS.get(type(command))
        if handler is None:
            raise TypeError(f"unknown trainer command {command!r}")
        result = handler(worker, command)
        ray.get(coordinator.report.remote(command_id, rank, result))
        if handler is _Worker.stop:
            return


@dataclass(kw_only=True)
class _Worker:
    """One Ray Train worker's model, optimizer and reference, and one method per ``WorkerCommand`` (the
    command's reply; ranks other than 0 reply None where rank 0 alone has the answer)."""

    config: TrainerConfig
    algorithm: Algorithm
    rank: int
    world_size: int
    device: torch.device
    model: torch.nn.Module  # the FSDP2-sharded policy
    reference: torch.nn.Module | None  # the frozen reference policy when the algorithm needs one
    optimizer: torch.optim.Optimizer
    adapter_gatherer: AdapterGatherer | None  # LoRA: gathers the adapter's tensors only
    model_config: PretrainedConfig  # the policy's transformers config
    broadcaster: RankZeroWeightBroadcaster | None = None  # rank 0's weight-update group, kept across steps

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def _full_optimizer_state(self) -> dict[str, object]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.model, self.optimizer, options=options)

    def train_on_shards(self, command: TrainOnShards) -> dict[str, float]:
        from components.training.data import MicroBatch, padding_micro_batches
        from components.training.step import run_train_step

        rows = list(command.shards[self.rank].iter_rows())
        rows += padding_micro_batches(command.micro_batches_per_rank - len(rows)).to_pylist()
        batches = [MicroBatch.from_row(row) for row in rows]
        result = run_train_step(
            self.model,
            self.optimizer,
            batches,
            self.algorithm,
            optimizer_config=self.config.optimizer,
            device=self.device,
            loss_scale=float(self.world_size),
            reference_model=self.reference,
            num_updates=self.config.num_updates_per_step,
            apply_update=command.apply_update,
            entropy_coef=self.config.entropy_coef,
        )
        result["num_micro_batches_rank0"] = float(len(batches))
        return result

    def gather_full_state_dict(
        self, command: GatherFullStateDict
    ) -> list[ObjectRef[dict[str, torch.Tensor]]] | None:
        import ray

        state_dict = self._full_state_dict()
        return [ray.put(state_dict)] if self.rank == 0 else None

    def gather_adapter(self, command: GatherAdapter) -> list[ObjectRef[LoraAdapter]] | None:
        import ray

        if self.adapter_gatherer is None:
            raise TrainerError("gather_adapter: the trainer trains every weight (LoRA rank 0)")
        adapter = self.adapter_gatherer.gather()
        return [ray.put(adapter)] if self.rank == 0 else None

    def write_checkpoint(self, command: WriteCheckpoint) -> str | None:
        from components.lora import write_adapter_folder

        if self.adapter_gatherer is not None:
            adapter = self.adapter_gatherer.gather()
            model_state_dict, write_model = None, lambda folder: write_adapter_folder(folder, adapter)
        else:
            model_state_dict, write_model = self._full_state_dict(), None
        optimizer_state = self._full_optimizer_state()
        if self.rank != 0:
            return None
        return str(
            write_checkpoint(
                self.config.checkpoints_dir,
                state=command.state,
                model_state_dict=model_state_dict,
                optimizer_state_dict=optimizer_state,
                model_config=self.model_config,
                tokenizer_source=self.config.model_path,
                keep_last=self.config.keep_checkpoints,
                write_model=write_model,
            )
        )

    def broadcast_weights(self, command: BroadcastWeights) -> dict[str, float] | None:
        state_dict = self._full_state_dict()
        if self.rank != 0:
            return None
        from components.engine.sglang_weight_transfer import RankZeroWeightBroadcaster

        self.broadcaster = self.broadcaster or RankZeroWeightBroadcaster()
        return self.broadcaster.push(command.servers, command.sync, state_dict, command.version)

    def score_sequences(self, command: ScoreSequences) -> list[np.ndarray] | None:
        scored = _score_sequences(
            self.model, command.sequences, temperature=self.config.temperature, device=self.device
        )
        return scored if self.rank == 0 else None

    def stop(self, command: StopWorkers) -> None:
        if self.broadcaster is not None:
            self.broadcaster.close()


# How each command is served: one worker method per command type (no isinstance chain).
_HANDLERS: dict[type, Callable[[_Worker, Any], object]] = {
    TrainOnShards: _Worker.train_on_shards,
    GatherFullStateDict: _Worker.gather_full_state_dict,
    GatherAdapter: _Worker.gather_adapter,
    WriteCheckpoint: _Worker.write_checkpoint,
    BroadcastWeights: _Worker.broadcast_weights,
    ScoreSequences: _Worker.score_sequences,
    StopWorkers: _Worker.stop,
}


# ------------------------------------------------------------------------------------------------------------
# The driver side
# ------------------------------------------------------------------------------------------------------------


def _shard_names(source: TrajectorySource) -> tuple[str, ...]:
    return tuple(Path(item).name for item in source if not isinstance(item, Trajectory))


class Trainer:
    """Drives the live FSDP2 worker group: ``step``, ``full_state_dict_ref``, ``save_checkpoint``, ``shutdown``."""

    def __init__(self, config: TrainerConfig, *, algorithm: Algorithm) -> None:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not ray.is_initialized():
            raise TrainerError("Trainer needs a running Ray session (ray.init())")
        self.config = config
        self.algorithm = algorithm
        self._ids = itertools.count()
        remove_temp_checkpoints(config.checkpoints_dir)
        resumed: Checkpoint | None = latest_checkpoint(config.checkpoints_dir) if config.resume else None
        self.state = resumed.state if resumed else TrainerState()
        self.resumed_from = resumed.path if resumed else None
        # a control-plane actor of the driver's: on the driver's node, whose loss ends the run anyway, never on a
        # node that can be lost under a running step (tests/chaos/test_node_loss.py)
        on_this_node = NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False
        )
        self._coordinator = (
            ray.remote(num_cpus=0)(_Coordinator)
            .options(scheduling_strategy=on_this_node)
            .remote(config.num_workers, None if self.resumed_from is None else str(self.resumed_from))
        )
        # TrainOnShards sent since the restore point: a restarted worker group trains them again (the same
        # shards, from the same weights, optimizer and RNG state) before the interrupted command is sent again
        self._since_restore_point: list[TrainOnShards] = []
        self._restarts_seen = 0  # the worker-group restarts the commands sent since have accounted for
        torch_trainer = TorchTrainer(
            _train_loop,
            train_loop_config={
                "config": config,
                "algorithm": algorithm,
                "coordinator": self._coordinator,
            },
            scaling_config=ScalingConfig(
                num_workers=config.num_workers,
                use_gpu=config.use_gpu,
                resources_per_worker={
                    "CPU": config.cpus_per_worker,
                    **({"GPU": 1} if config.use_gpu else {}),
                },
            ),
            torch_config=TorchConfig(backend="nccl" if config.use_gpu else "gloo"),
            run_config=RunConfig(
                name=f"trainer-{uuid.uuid4().hex[:8]}",
                storage_path=str(config.run_dir / "ray_train"),
                failure_config=FailureConfig(max_failures=config.max_worker_restarts),
            ),
        )
        self._fit_error: BaseException | None = None
        self._fit_thread = threading.Thread(
            target=self._fit, args=(torch_trainer,), daemon=True, name="rein-fit"
        )
        self._fit_thread.start()
        self._closed = False
        try:
            self._wait("ready", timeout_s=config.start_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    def _fit(self, torch_trainer: TorchTrainer) -> None:
        try:
            torch_trainer.fit()
        except BaseException as error:  # surfaced to the caller by _wait
            self._fit_error = error

    def _wait(self, command_id: str, *, timeout_s: float) -> list[Any] | None:  # ray.get of a reply: untyped
        import ray

        reply = self._coordinator.wait.remote(command_id)
        deadline = time.monotonic() + timeout_s
        with PENDING_WAITS.waiting("trainer workers", command_id, timeout_s):  # reported when it stalls
            while True:
                done, _ = ray.wait([reply], timeout=0.5)
                if done:
                    return ray.get(reply)
                if not self._fit_thread.is_alive():
                    raise TrainerError(f"the trainer's worker group stopped: {self._fit_error!r}")
                if time.monotonic() > deadline:
                    raise TrainerError(f"trainer command {command_id} did not finish within {timeout_s:.0f}s")

    def _call(self, command: _Command[ReplyT], *, timeout_s: float | None = None) -> list[ReplyT]:
        """Run ``command`` on every worker; one reply per rank. When Ray Train restarted the worker group
        meanwhile (a worker died), the new group, restored from the newest checkpoint, first trains the steps
        sent since again, then gets ``command`` again."""
        replies = self._send(command, timeout_s=timeout_s)
        while replies is None:
            logger.warning(
                "the trainer's worker group was restarted during %s: training the %d step(s) since the newest "
                "checkpoint again, then sending it again",
                type(command).__name__,
                len(self._since_restore_point),
            )
            if all(self._send(step) is not None for step in self._since_restore_point):
                replies = self._send(command, timeout_s=timeout_s)
        return replies

    def _send(self, command: _Command[ReplyT], *, timeout_s: float | None = None) -> list[ReplyT] | None:
        """Submit ``command`` and wait for it: one reply per rank, or None when the group restarted meanwhile."""
        if self._closed:
            raise TrainerError("the trainer was shut down")
        command_id = f"{type(command).__name__}-{next(self._ids)}"
        self._restarts_seen = PENDING_WAITS.get_within(
            self._coordinator.submit.remote(command_id, command, self._restarts_seen),
            deadline_s=COORDINATOR_DEADLINE_S,
            component="trainer coordinator",
            request=f"submit {command_id}",
        )
        return self._wait(command_id, timeout_s=timeout_s or self.config.step_timeout_s)

    def step(self, trajectories: TrajectorySource, current_version: int) -> dict[str, float]:
        """One optimizer step on these shards / trajectories; ``current_version`` is the policy version the
        engine serves now (staleness is measured against it). The updated policy is version
        ``current_version + 1`` (``state.weight_version``). Returns the step's metrics."""
        try:
            current_version = operator.index(current_version)
        except TypeError:
            raise ValueError(f"current_version: must be an int, got {current_version!r}") from None
        if current_version < 0:
            raise ValueError(f"current_version: must be >= 0, got {current_version}")
        started = time.perf_counter()
        batches = build_micro_batches_with_ray(
            trajectories, self.algorithm, self.config.batching, current_version=current_version
        )
        data_s = time.perf_counter() - started
        metrics = {f"data/{key}": value for key, value in batches.metrics.items()}
        metrics["data/pipeline_s"] = data_s
        consumed = self.state.consumed_shards + _shard_names(trajectories)
        if batches.metrics["num_trained_segments"] == 0:
            logger.warning("step has no trainable segments; no optimizer update")
            self.state = replace(self.state, consumed_shards=consumed)
            return {**metrics, "trained": 0.0, "step": float(self.state.step)}
        # Materialized contiguous shards, one per rank (``streaming_split`` would start a coordinator actor
        # per step: ≈ 3 s here); every rank runs ``per_rank`` micro-batches (FSDP collectives).
        shards, per_rank = batches.split_for_ranks(self.config.num_workers)
        command = TrainOnShards(shards=shards, micro_batches_per_rank=per_rank)
        results = self._call(command)
        self._since_restore_point.append(command)
        metrics.update({f"train/{key}": value for key, value in results[0].items()})
        self.state = replace(
            self.state, step=self.state.step + 1, weight_version=current_version + 1, consumed_shards=consumed
        )
        metrics.update(
            {"trained": 1.0, "step": float(self.state.step), "weight_version": float(current_version + 1)}
        )
        metrics["step_s"] = time.perf_counter() - started
        metrics["tokens_per_s"] = metrics["train/num_tokens"] / metrics["step_s"]
        return metrics

    def warm_up(self, *, num_shards: int = 4) -> float:
        """Run one step's whole path once, without its update: the data pipeline over ``num_shards`` one-token
        shards (in a temporary folder, not the run's store), then every worker's forward and backward on the
        result (``TrainOnShards(apply_update=False)``: the weights, the optimizer and the state do not change). The
        first execution starts the worker processes that import the pipeline and Ray Data (10-20 s on two busy
        cores), and a worker's first training step pays autograd's, FSDP's and its command path's first-call
        costs (tiny model, 8 rollouts of ~360 tokens: the first step took 5.9 s without this warm-up, 3.5 s with
        it; later steps 3.0-3.6 s): the first step would otherwise wait for all of it. ``RunStack`` calls it
        while the engine and the proxy start. Returns the seconds it took."""
        import tempfile

        from components.trajectory import Segment, TrajectoryStatus
        from components.trajectory_store import TrajectoryStore

        started = time.perf_counter()
        segment = Segment(
            token_ids=np.array([0, 0]),
            loss_mask=np.array([0, 1], dtype=np.int8),
            logprobs=np.array([0.0, 0.0]),
            weight_versions=np.array([-1, 0]),
        )
        with tempfile.TemporaryDirectory(prefix="rein-warm-up-") as scratch:
            store = TrajectoryStore(Path(scratch))
            shards = [
                store.write(
                    [
                        Trajectory(
                            trajectory_id=f"warm-up-{index}",
                            group_id=f"warm-up-{index}",
                            task_id="warm-up",
                            harness="warm-up",
                            status=TrajectoryStatus.OK,
                            reward=0.0,
                            segments=(segment,),
                        )
                    ]
                )
                for index in range(num_shards)
            ]
            batches = build_micro_batches_with_ray(
                shards, self.algorithm, self.config.batching, current_version=0
            )
            rank_shards, per_rank = batches.split_for_ranks(self.config.num_workers)
            # at least one micro-batch per rank (padding when the pipeline kept none): the backward must run
            self._call(
                TrainOnShards(shards=rank_shards, micro_batches_per_rank=max(per_rank, 1), apply_update=False)
            )
        return time.perf_counter() - started

    def full_state_dict_ref(self) -> ObjectRef[dict[str, torch.Tensor]]:
        """A Ray ObjectRef to the full (unsharded, CPU) state dict of the current policy (LoRA: the PeftModel's,
        keyed ``base_model.model.…`` with the adapter's tensors; engines get ``adapter_ref`` instead)."""
        return self._call(GatherFullStateDict())[0][0]

    def broadcast_weights(
        self, servers: Sequence[SGLangEngine], sync: DistributedWeightSyncConfig, version: int
    ) -> dict[str, float]:
        """Rank 0 broadcasts the current policy as ``version`` to SGLang ``servers`` (``BroadcastWeights``)."""
        if self.config.lora.enabled:
            raise TrainerError("broadcast_weights: a LoRA trainer syncs its adapter (WeightSync mode 'disk')")
        return self._call(BroadcastWeights(servers=tuple(servers), sync=sync, version=version))[0]

    def adapter_ref(self) -> ObjectRef[LoraAdapter]:
        """LoRA: a Ray ObjectRef to the current ``LoraAdapter`` (only the adapter's tensors are gathered)."""
        if not self.config.lora.enabled:
            raise TrainerError(
                "adapter_ref: the trainer does full fine-tuning (lora.rank 0); there is no adapter"
            )
        return self._call(GatherAdapter())[0][0]

    def adapter(self) -> LoraAdapter:
        """LoRA: the current adapter."""
        return self._fetch(self.adapter_ref(), "adapter")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full (unsharded, CPU) state dict of the current policy."""
        return self._fetch(self.full_state_dict_ref(), "full state dict")

    def _fetch(self, reference: ObjectRef[FetchedT], what: str) -> FetchedT:
        """``ray.get`` of an object rank 0 produced, within the step deadline (``TrainerStalledError`` past it)."""
        return PENDING_WAITS.get_within(
            reference,
            deadline_s=self.config.step_timeout_s,
            component="trainer workers",
            request=f"fetch the {what}",
            error=TrainerStalledError,
        )

    def save_checkpoint(self) -> Path:
        """Write a complete checkpoint of the current step now; returns its folder."""
        folder = self._call(WriteCheckpoint(state=self.state))[0]
        PENDING_WAITS.get_within(
            self._coordinator.set_restore_from.remote(folder),
            deadline_s=COORDINATOR_DEADLINE_S,
            component="trainer coordinator",
            request="set_restore_from",
            error=TrainerStalledError,
        )
        self._since_restore_point.clear()
        return Path(folder)

    def score(
        self, sequences: Sequence[Sequence[int]], routed_experts: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """The current policy's logprob of every token after the first of each sequence (routes replayed when
        given, one [positions, layers, top_k] array per sequence)."""
        payload: list[SequenceToScore] = [
            {"token_ids": list(ids), "routed_experts": None if routed_experts is None else routed_experts[i]}
            for i, ids in enumerate(sequences)
        ]
        return self._call(ScoreSequences(sequences=payload))[0]

    def shutdown(self) -> None:
        """Stop the workers and the coordinator (idempotent)."""
        import ray

        if self._closed:
            return
        try:
            if self._fit_thread.is_alive():
                command_id = f"StopWorkers-{next(self._ids)}"
                try:
                    PENDING_WAITS.get_within(
                        self._coordinator.submit.remote(command_id, StopWorkers(), self._restarts_seen),
                        deadline_s=COORDINATOR_DEADLINE_S,
                        component="trainer coordinator",
                        request=f"submit {command_id}",
                        error=TrainerStalledError,
                    )
                    self._wait(command_id, timeout_s=60)
                except TrainerError as error:
                    logger.warning("trainer workers did not stop cleanly: %s", error)
                self._fit_thread.join(timeout=60)
        finally:
            self._closed = True
            ray.kill(self._coordinator)
