"""One EmbeddedEngine inside a Ray actor, shared by the proxy (generation) and the trainer (weight sync).

The actor is async with a high ``max_concurrency``, so concurrent ``generate`` calls from any number of proxy
replicas are in flight at the same time inside the actor and the engine's scheduler batches them together.
Weights travel through Ray's object store: ``RayEngineClient.update_weights`` puts the state dict once and
passes the reference.

    handle = start_engine_actor(EmbeddedEngineConfig(model_path=...), name="rein-engine")
    engine = await RayEngineClient.connect(handle)          # an InferenceEngine
    result = await engine.generate(ids, SamplingParams(max_tokens=64))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.errors import EngineError, ReinError
from components.protocols import GenerationResult, SamplingParams

if TYPE_CHECKING:
    import torch
    from ray.actor import ActorHandle


class EngineActor:
    """Hosts one ``EmbeddedEngine``; every method is async so that calls overlap and batch."""

    def __init__(self, config: EmbeddedEngineConfig) -> None:
        self.engine = EmbeddedEngine(config)

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        """``EmbeddedEngine.generate``."""
        return await self.engine.generate(input_ids, params)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> int:
        """``EmbeddedEngine.update_weights``; returns the new version."""
        await self.engine.update_weights(state_dict, version)
        return self.engine.weight_version

    async def update_adapter(self, adapter: Any, version: int) -> int:
        """``EmbeddedEngine.update_adapter`` (a LoRA adapter version); returns the new version."""
        await self.engine.update_adapter(adapter, version)
        return self.engine.weight_version

    async def logprobs_of(self, input_ids: Sequence[int], start: int = 1) -> tuple[float, ...]:
        """``EmbeddedEngine.logprobs_of`` (teacher-forced scoring under the current weights)."""
        return await self.engine.logprobs_of(input_ids, start)

    async def info(self) -> dict[str, Any]:
        """Context window, current weight version and scheduler counters."""
        return {"context_window": self.engine.context_window, **self.engine.stats()}

    async def close(self) -> None:
        """Stop the engine (in-flight requests finish with ``abort``)."""
        await self.engine.aclose()


def start_engine_actor(
    config: EmbeddedEngineConfig,
    *,
    name: str | None = None,
    namespace: str | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    max_concurrency: int = 1024,
) -> ActorHandle:
    """Start (or, when ``name`` is taken, reuse) the engine actor. The caller must have called ``ray.init``."""
    import ray

    options: dict[str, Any] = {
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "max_concurrency": max_concurrency,
    }
    if name is not None:
        options.update(name=name, namespace=namespace, get_if_exists=True)
    return ray.remote(EngineActor).options(**options).remote(config)


class RayEngineClient:
    """``InferenceEngine`` over an ``EngineActor`` handle (picklable: pass it to Serve replicas and trainers).

    ``weight_version`` is the newest version this client has seen (from its own ``update_weights`` calls,
    generated tokens, or ``refresh``); per-token versions in each ``GenerationResult`` are always exact.
    """

    def __init__(
        self, actor: ActorHandle, *, context_window: int | None = None, weight_version: int = 0
    ) -> None:
        """Without ``context_window`` this blocks on one actor call; in async code use ``connect``."""
        self.actor = actor
        if context_window is None:
            import ray

            info = ray.get(actor.info.remote())
            context_window, weight_version = info["context_window"], info["weight_version"]
        self._context_window = context_window
        self._weight_version = weight_version

    @classmethod
    async def connect(cls, actor: ActorHandle) -> RayEngineClient:
        """A client for ``actor``, reading its context window and weight version."""
        info = await cls._call(actor.info.remote())
        return cls(actor, context_window=info["context_window"], weight_version=info["weight_version"])

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        """Generate in the actor (batched there with every other in-flight call)."""
        result: GenerationResult = await self._call(self.actor.generate.remote(list(input_ids), params))
        if result.weight_versions:
            self._weight_version = max(self._weight_version, result.weight_versions[-1])
        return result

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Put the state dict in the object store once and load it into the actor's engine."""
        import ray

        reference = ray.put(dict(state_dict))
        self._weight_version = await self._call(self.actor.update_weights.remote(reference, version))

    async def update_adapter(self, adapter: Any, version: int) -> None:
        """``AdapterEngine``: only the LoRA adapter's tensors travel to the actor."""
        self._weight_version = await self._call(self.actor.update_adapter.remote(adapter, version))

    async def update_weights_from_ref(self, state_dict_ref: Any, version: int) -> None:
        """``ObjectStoreWeightsEngine``: the actor resolves the trainer's object ref itself (no driver copy)."""
        self._weight_version = await self._call(self.actor.update_weights.remote(state_dict_ref, version))

    async def logprobs_of(self, input_ids: Sequence[int], start: int = 1) -> tuple[float, ...]:
        """Teacher-forced scoring in the actor under its current weights."""
        return await self._call(self.actor.logprobs_of.remote(list(input_ids), start))

    async def refresh(self) -> dict[str, Any]:
        """Ask the actor for its current state (and update ``weight_version``)."""
        info = await self._call(self.actor.info.remote())
        self._weight_version = info["weight_version"]
        return info

    @staticmethod
    async def _call(reference: Any) -> Any:
        """Await an actor call; re-raise Rein's own errors as themselves, Ray failures as ``EngineError``."""
        import ray.exceptions

        try:
            return await reference
        except ray.exceptions.RayTaskError as error:
            cause = error.cause
            if isinstance(cause, ReinError | ValueError):
                raise cause from None
            raise EngineError(f"engine actor call failed: {cause!r}") from error
        except ray.exceptions.RayActorError as error:
            raise EngineError(f"engine actor is gone: {error}") from error
