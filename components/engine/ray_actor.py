"""One EmbeddedEngine inside a Ray actor, shared by the proxy (generation) and the trainer (weight sync).

The actor is async with a high ``max_concurrency``, so concurrent ``generate`` calls from any number of proxy
replicas are in flight at the same time inside the actor and the engine's scheduler batches them together.
Weights travel through Ray's object store: ``RayEngineClient.update_weights`` puts the state dict once and
passes the reference.

    handle = start_engine_actor(EmbeddedEngineConfig(model_path=...), name="rein-engine")
    engine = await RayEngineClient.connect(handle)          # an InferenceEngine
    result = await engine.generate(ids, SamplingParams(max_tokens=64))

Restarts: Ray restarts a dead engine actor (``max_restarts``) from its config, so it comes back with the weights it
was started with. It serves nothing until the run's driver has pushed the run's current weights and version again:
the driver's client (the one the trainer's ``WeightSync`` pushes through) remembers the last weights it pushed (one
object-store reference, or the LoRA adapters) and its watcher (``start_watching``) re-pushes them with ``restore``
as soon as it sees a restarted actor; meanwhile new requests wait in the actor, at most ``restart_wait_s``. Requests
in flight when it died fail as ``EngineError`` (``engine_error`` rollouts: replaced, never trained).

Multi-LoRA: ``engine.policy("alice")`` is the view that serves policy ``alice`` with its own adapter and
versions (``EmbeddedEngine.policy`` over the actor); the views are picklable like the client, so session shards
and trainers in other processes can hold them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.lora_adapters import DEFAULT_ADAPTER, PolicyEngine
from components.errors import EngineError, ReinError
from components.protocols import GenerationResult, SamplingParams, TokenChunk
from components.remote_waits import PENDING_WAITS, EngineStalledError

if TYPE_CHECKING:
    import torch
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from components.lora import LoraAdapter

logger = logging.getLogger(__name__)

T = TypeVar("T")
# What ``EngineActor.info`` answers: the context window, versions and scheduler counters, and ``restored``.
EngineInfo = dict[str, int | bool]

# The longest one engine-actor call may take (a generate or a weight load, on CPU under load); past it the
# call is an ``EngineStalledError`` naming the request, never a silent hang.
ENGINE_CALL_DEADLINE_S = 900.0
ENGINE_RESTART_WAIT_S = 300.0  # how long requests wait for a restarted actor to get the run's weights back
WATCH_POLL_S = 2.0  # how often the driver's client asks whether the actor was restarted


class EngineRestartingError(EngineError):
    """The engine actor died with the call in flight, or is being restarted by Ray: the call is lost."""


class EngineActor:
    """Hosts one ``EmbeddedEngine``; every method is async so that calls overlap and batch."""

    def __init__(self, config: EmbeddedEngineConfig, restart_wait_s: float = ENGINE_RESTART_WAIT_S) -> None:
        import ray

        self.engine = EmbeddedEngine(config)
        self.restart_wait_s = restart_wait_s
        # Restarted by Ray (max_restarts), the actor holds its start weights, not the run's: it serves nothing
        # until ``restore`` (or a new push) gives them back.
        self._restored = asyncio.Event()
        if not ray.get_runtime_context().was_current_actor_reconstructed:
            self._restored.set()

    async def _serving(self) -> None:
        """Return once the actor serves the run's weights (at once, unless it was restarted and awaits them)."""
        if self._restored.is_set():
            return
        try:
            await asyncio.wait_for(self._restored.wait(), self.restart_wait_s)
        except TimeoutError:
            raise EngineError(
                f"the engine actor was restarted and did not get the run's weights back within "
                f"{self.restart_wait_s:g} s (the driver that pushes them is gone or stalled)"
            ) from None

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, adapter: str | None = None
    ) -> GenerationResult:
        """``EmbeddedEngine.generate`` (``adapter``: the policy whose adapter serves it)."""
        await self._serving()
        return await self.engine.generate(input_ids, params, adapter=adapter)

    async def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """``EmbeddedEngine.generate_stream`` as a Ray streaming generator (cancelling the Ray task closes the
        engine's stream, which aborts the request)."""
        await self._serving()
        stream = self.engine.generate_stream(input_ids, params, adapter=adapter)
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> int:
        """``EmbeddedEngine.update_weights``; returns the new version (a restarted actor serves from now on)."""
        await self.engine.update_weights(state_dict, version)
        self._restored.set()
        return self.engine.weight_version

    async def restore(
        self,
        state_dict: Mapping[str, torch.Tensor] | None,
        version: int,
        adapters: Mapping[str, tuple[LoraAdapter, int]],
    ) -> bool:
        """After a restart: load the run's last pushed weights (None: it still serves its start weights) and
        adapters, then serve. A no-op (False) when the actor was not restarted or already has them."""
        if self._restored.is_set():
            return False
        if state_dict is not None:
            await self.engine.update_weights(state_dict, version)
        for name, (adapter, adapter_version) in adapters.items():
            await self.engine.update_adapter(adapter, adapter_version, name=name)
        self._restored.set()
        return True

    async def update_adapter(self, adapter: LoraAdapter, version: int, name: str = DEFAULT_ADAPTER) -> int:
        """``EmbeddedEngine.update_adapter`` (a LoRA adapter version of policy ``name``); returns the version
        that now serves that policy."""
        await self.engine.update_adapter(adapter, version, name=name)
        return self.engine.adapter_version(name)

    async def logprobs_of(
        self, input_ids: Sequence[int], start: int = 1, adapter: str | None = None
    ) -> tuple[float, ...]:
        """``EmbeddedEngine.logprobs_of`` (teacher-forced scoring under the current weights)."""
        await self._serving()
        return await self.engine.logprobs_of(input_ids, start, adapter=adapter)

    async def adapter_version(self, name: str) -> int:
        """``EmbeddedEngine.adapter_version``."""
        return self.engine.adapter_version(name)

    async def info(self) -> EngineInfo:
        """Context window, current weight version (and the one a policy has before its first adapter), whether
        it serves the run's weights (False: restarted, awaiting ``restore``), the actor's pid and scheduler
        counters."""
        import os

        return {
            "context_window": self.engine.context_window,
            "initial_weight_version": self.engine.config.initial_weight_version,
            "restored": self._restored.is_set(),
            "pid": os.getpid(),
            **self.engine.stats(),
        }

    async def close(self) -> None:
        """Stop the engine (in-flight requests finish with ``abort``)."""
        await self.engine.aclose()


def start_engine_actor(
    config: EmbeddedEngineConfig,
    *,
    name: str | None = None,
    namespace: str | None = None,
    max_concurrency: int = 1024,
    restart_wait_s: float = ENGINE_RESTART_WAIT_S,
) -> ActorHandle:
    """Start (or, when ``name`` is taken, reuse) the engine actor with the CPUs and GPUs of ``config.settings``,
    restarted by Ray up to its ``max_restarts`` times when it dies (calls in flight then fail: no retry of a
    generate). The caller must have called ``ray.init``."""
    import ray

    options: dict[str, object] = {
        "num_cpus": config.settings.num_cpus,
        "num_gpus": config.settings.num_gpus,
        "max_concurrency": max_concurrency,
        "max_restarts": config.settings.max_restarts,
        "max_task_retries": 0,
    }
    if name is not None:
        options.update(name=name, namespace=namespace, get_if_exists=True)
    return ray.remote(EngineActor).options(**options).remote(config, restart_wait_s)


class RayEngineClient:
    """``InferenceEngine`` over an ``EngineActor`` handle (picklable: pass it to Serve replicas and trainers).

    ``weight_version`` is the newest version this client has seen (from its own ``update_weights`` calls,
    generated tokens, or ``refresh``); per-token versions in each ``GenerationResult`` are always exact. A
    policy's ``weight_version`` (``policy(name)``) is likewise the newest version of its adapter this client has
    seen (``refresh_policy`` asks the actor).

    The client that pushes the run's weights (the original; copies in other processes never push) remembers the
    last ones it pushed and gives them back to a restarted actor (``restore_if_restarted``, ``start_watching``).
    """

    def __init__(
        self,
        actor: ActorHandle,
        *,
        context_window: int | None = None,
        weight_version: int = 0,
        initial_weight_version: int = 0,
    ) -> None:
        """Without ``context_window`` this blocks on one actor call; in async code use ``connect``."""
        self.actor = actor
        if context_window is None:
            info = PENDING_WAITS.get_within(
                actor.info.remote(),
                deadline_s=ENGINE_CALL_DEADLINE_S,
                component="engine actor",
                request="info",
                error=EngineStalledError,
            )
            context_window, weight_version = info["context_window"], info["weight_version"]
            initial_weight_version = info["initial_weight_version"]
        self._context_window = context_window
        self._weight_version = weight_version
        self._initial_weight_version = initial_weight_version
        self._adapter_versions: dict[str, int] = {}  # policy → newest version of its adapter seen
        # What a restarted actor is given back: the last pushed weights (an object-store reference: one copy of
        # the weights stays in the object store) and version, and each policy's last adapter and version.
        self._pushed_weights: tuple[ObjectRef[dict[str, torch.Tensor]], int] | None = None
        self._pushed_adapters: dict[str, tuple[LoraAdapter, int]] = {}
        self._pushes = True
        self._push_lock: asyncio.Lock | None = None
        self._watcher: asyncio.Task | None = None
        self.restores: list[int] = []  # the version given back at each restart seen
        self._restarting = (
            False  # a call of this client found the actor dead (restarting) since its last answer
        )

    def __getstate__(self) -> dict[str, object]:
        # A copy (a proxy session shard, a trainer) generates; only the original pushes and restores weights.
        state = dict(self.__dict__)
        state.update(_pushed_weights=None, _pushed_adapters={}, _pushes=False, _push_lock=None, _watcher=None)
        return state

    @property
    def push_lock(self) -> asyncio.Lock:
        if self._push_lock is None:
            self._push_lock = asyncio.Lock()
        return self._push_lock

    @classmethod
    async def connect(cls, actor: ActorHandle) -> RayEngineClient:
        """A client for ``actor``, reading its context window and weight version."""
        info: EngineInfo = await cls._call(actor.info.remote(), "info")
        return cls(
            actor,
            context_window=info["context_window"],
            weight_version=info["weight_version"],
            initial_weight_version=info["initial_weight_version"],
        )

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult:
        """Generate in the actor (batched there with every other in-flight call, whatever their policy);
        ``adapter``: the policy that serves it (see ``policy``)."""
        if self._restarting:  # this client saw the actor die: new requests wait for it to be back
            await self._actor_info()
        result: GenerationResult = await self._request(
            self.actor.generate.remote(list(input_ids), params, adapter), "generate"
        )
        if result.weight_versions:
            self._saw_version(adapter, result.weight_versions[-1])
        return result

    async def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """``generate`` as the actor samples it (``StreamingEngine``), through a Ray streaming generator; closing
        this iterator early cancels the actor's task, which aborts the engine's request."""
        import ray

        if self._restarting:
            await self._actor_info()
        stream = self.actor.generate_stream.options(num_returns="streaming").remote(
            list(input_ids), params, adapter
        )
        finished = False
        try:
            async for reference in stream:
                item: TokenChunk | GenerationResult = await self._request(reference, "generate_stream")
                if isinstance(item, GenerationResult):
                    finished = True
                    if item.weight_versions:
                        self._saw_version(adapter, item.weight_versions[-1])
                yield item
        finally:
            if not finished:
                ray.cancel(stream)

    def policy(self, name: str) -> PolicyEngine:
        """Multi-LoRA: the view of the actor's engine that serves policy ``name`` with its own adapter and
        versions, as ``EmbeddedEngine.policy`` (an ``InferenceEngine`` + ``AdapterEngine``, picklable)."""
        return PolicyEngine(self, name)

    def adapter_version(self, name: str) -> int:
        """The newest version of policy ``name``'s adapter this client has seen (``refresh_policy`` asks the
        actor; before either, the engine's initial version: a policy's version before its first adapter)."""
        if name == DEFAULT_ADAPTER:
            return self._weight_version
        return self._adapter_versions.get(name, self._initial_weight_version)

    async def refresh_policy(self, name: str) -> int:
        """Ask the actor for the version of policy ``name``'s adapter (and remember it)."""
        version: int = await self._call(self.actor.adapter_version.remote(name), "adapter_version")
        self._saw_version(name, version)
        return version

    def _saw_version(self, adapter: str | None, version: int) -> None:
        if adapter in (None, DEFAULT_ADAPTER):
            self._weight_version = max(self._weight_version, version)
        else:
            self._adapter_versions[adapter] = max(self._adapter_versions.get(adapter, version), version)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Put the state dict in the object store once and load it into the actor's engine."""
        import ray

        await self.update_weights_from_ref(ray.put(dict(state_dict)), version)

    async def update_adapter(
        self, adapter: LoraAdapter, version: int, *, name: str = DEFAULT_ADAPTER
    ) -> None:
        """``AdapterEngine``: only the LoRA adapter's tensors travel to the actor (policy ``name``'s adapter)."""
        async with self.push_lock:
            served: int = await self._push(
                lambda: self.actor.update_adapter.remote(adapter, version, name),
                f"update_adapter({name}, version {version})",
            )
            if self._pushes:
                self._pushed_adapters[name] = (adapter, version)
        if name == DEFAULT_ADAPTER:
            self._weight_version = served
        else:
            self._adapter_versions[name] = served

    async def update_weights_from_ref(
        self, state_dict_ref: ObjectRef[dict[str, torch.Tensor]], version: int
    ) -> None:
        """``ObjectStoreWeightsEngine``: the actor resolves the trainer's object ref itself (no driver copy)."""
        async with self.push_lock:
            self._weight_version = await self._push(
                lambda: self.actor.update_weights.remote(state_dict_ref, version),
                f"update_weights(version {version})",
            )
            if self._pushes:
                self._pushed_weights = (state_dict_ref, int(version))

    async def restore_if_restarted(self) -> bool:
        """Ask the actor whether Ray restarted it; if so (and this client pushes the run's weights), give it
        the last pushed weights, version and adapters before it serves again. True when it restored them."""
        info = await self._actor_info()
        if info["restored"] or not self._pushes:
            return False
        async with self.push_lock:
            reference, version = self._pushed_weights or (None, info["weight_version"])
            restored: bool = await self._push(
                lambda: self.actor.restore.remote(reference, version, dict(self._pushed_adapters)),
                f"restore(version {version})",
            )
        if restored:
            self.restores.append(version)
            logger.warning(
                "the engine actor was restarted (pid %s): the run's weights at version %d pushed again",
                info["pid"],
                version,
            )
        return restored

    async def await_live_server(self) -> None:
        """``AwaitsLiveServer`` (before a sync step's replacements): wait for a restarted actor and give it the
        run's weights; ``EngineError`` when it is gone for good or does not come back in time."""
        await self.restore_if_restarted()

    def start_watching(self) -> None:
        """Ask the actor every ``WATCH_POLL_S`` whether it was restarted (this process's event loop), and give
        a restarted one the run's weights at once (``restore_if_restarted``)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self.watch())

    async def watch(self) -> None:
        """Until cancelled: ``restore_if_restarted`` every ``WATCH_POLL_S``."""
        while True:
            await asyncio.sleep(WATCH_POLL_S)
            try:
                await self.restore_if_restarted()
            except EngineError as error:  # dying, or restarting: asked again at the next poll
                logger.warning("engine actor not back yet: %s", error)

    async def aclose(self) -> None:
        """Stop watching."""
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def logprobs_of(
        self, input_ids: Sequence[int], start: int = 1, *, adapter: str | None = None
    ) -> tuple[float, ...]:
        """Teacher-forced scoring in the actor under its current weights (policy ``adapter``'s when named)."""
        if self._restarting:
            await self._actor_info()
        return await self._request(
            self.actor.logprobs_of.remote(list(input_ids), start, adapter), "logprobs_of"
        )

    async def refresh(self) -> EngineInfo:
        """Ask the actor for its current state (and update ``weight_version``)."""
        info = await self._actor_info()
        self._weight_version = info["weight_version"]
        return info

    async def _push(self, submit: Callable[[], ObjectRef[T]], request: str) -> T:
        """A weight push (loading the same weights twice is harmless): sent again once a restarting actor is back."""
        while True:
            try:
                return await self._call(submit(), request)
            except EngineRestartingError:
                await self._actor_info()

    async def _request(self, reference: ObjectRef[T], request: str) -> T:
        """``_call``, remembering when the actor was found dead (this client's new requests then wait for it)."""
        try:
            return await self._call(reference, request)
        except EngineRestartingError:
            self._restarting = True
            raise

    async def _actor_info(self) -> EngineInfo:
        """The actor's ``info``, waiting while Ray restarts it (at most ``ENGINE_RESTART_WAIT_S``; then, or when
        it is dead for good, ``EngineError``)."""
        deadline = time.monotonic() + ENGINE_RESTART_WAIT_S
        while True:
            try:
                info: EngineInfo = await self._call(self.actor.info.remote(), "info")
            except EngineRestartingError as error:
                self._restarting = True
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"the engine actor did not come back within {ENGINE_RESTART_WAIT_S:g} s: {error}"
                    ) from error
                await asyncio.sleep(0.5)
                continue
            self._restarting = False
            return info

    @staticmethod
    async def _call(reference: ObjectRef[T], request: str) -> T:
        """Await an actor call for at most ``deadline_s`` (``EngineStalledError`` past it, naming ``request``);
        re-raise Rein's own errors as themselves, Ray failures as ``EngineError``."""
        import ray.exceptions

        try:
            return await PENDING_WAITS.within(
                reference,
                deadline_s=ENGINE_CALL_DEADLINE_S,
                component="engine actor",
                request=request,
                error=EngineStalledError,
            )
        except ray.exceptions.RayTaskError as error:
            cause = error.cause
            if isinstance(cause, ReinError | ValueError):
                raise cause from None
            raise EngineError(f"engine actor call failed: {cause!r}") from error
        except ray.exceptions.ActorUnavailableError as error:  # died in flight, or restarting now
            raise EngineRestartingError(
                f"the engine actor died or is restarting during {request} (this call is lost): {error}"
            ) from error
        except ray.exceptions.RayActorError as error:
            raise EngineError(
                f"the engine actor died during {request} and is not restarted (max_restarts spent): {error}"
            ) from error
        except (
            ray.exceptions.ObjectLostError
        ) as error:  # e.g. remembered weights whose owner (a trainer rank) died
            raise EngineError(f"engine actor call {request}: an argument was lost: {error}") from error
