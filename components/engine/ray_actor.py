"""One EmbeddedEngine inside a Ray actor, shared by the proxy (generation) and the trainer (weight sync).

The actor is async with a high ``max_concurrency``, so concurrent ``generate`` calls from any number of proxy
replicas are in flight at the same time inside the actor and the engine's scheduler batches them together.
Weights travel through Ray's object store: ``RayEngineClient.update_weights`` puts the state dict once and
passes the reference.

    handle = start_engine_actor(EmbeddedEngineConfig(model_path=...), name="rein-engine")
    engine = await RayEngineClient.connect(handle)          # an InferenceEngine
    result = await engine.generate(ids, SamplingParams(max_tokens=64))

Multi-LoRA: ``engine.policy("alice")`` is the view that serves policy ``alice`` with its own adapter and
versions (``EmbeddedEngine.policy`` over the actor); the views are picklable like the client, so session shards
and trainers in other processes can hold them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.lora_adapters import DEFAULT_ADAPTER, PolicyEngine
from components.errors import EngineError, ReinError
from components.protocols import GenerationResult, SamplingParams
from components.remote_waits import PENDING_WAITS, EngineStalledError

if TYPE_CHECKING:
    import torch
    from ray.actor import ActorHandle

# The longest one engine-actor call may take (a generate or a weight load, on CPU under load); past it the
# call is an ``EngineStalledError`` naming the request, never a silent hang.
ENGINE_CALL_DEADLINE_S = 900.0


class EngineActor:
    """Hosts one ``EmbeddedEngine``; every method is async so that calls overlap and batch."""

    def __init__(self, config: EmbeddedEngineConfig) -> None:
        self.engine = EmbeddedEngine(config)

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, adapter: str | None = None
    ) -> GenerationResult:
        """``EmbeddedEngine.generate`` (``adapter``: the policy whose adapter serves it)."""
        return await self.engine.generate(input_ids, params, adapter=adapter)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> int:
        """``EmbeddedEngine.update_weights``; returns the new version."""
        await self.engine.update_weights(state_dict, version)
        return self.engine.weight_version

    async def update_adapter(self, adapter: Any, version: int, name: str = DEFAULT_ADAPTER) -> int:
        """``EmbeddedEngine.update_adapter`` (a LoRA adapter version of policy ``name``); returns the version
        that now serves that policy."""
        await self.engine.update_adapter(adapter, version, name=name)
        return self.engine.adapter_version(name)

    async def logprobs_of(
        self, input_ids: Sequence[int], start: int = 1, adapter: str | None = None
    ) -> tuple[float, ...]:
        """``EmbeddedEngine.logprobs_of`` (teacher-forced scoring under the current weights)."""
        return await self.engine.logprobs_of(input_ids, start, adapter=adapter)

    async def adapter_version(self, name: str) -> int:
        """``EmbeddedEngine.adapter_version``."""
        return self.engine.adapter_version(name)

    async def info(self) -> dict[str, Any]:
        """Context window, current weight version (and the one a policy has before its first adapter) and
        scheduler counters."""
        return {
            "context_window": self.engine.context_window,
            "initial_weight_version": self.engine.config.initial_weight_version,
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
    generated tokens, or ``refresh``); per-token versions in each ``GenerationResult`` are always exact. A
    policy's ``weight_version`` (``policy(name)``) is likewise the newest version of its adapter this client has
    seen (``refresh_policy`` asks the actor).
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

    @classmethod
    async def connect(cls, actor: ActorHandle) -> RayEngineClient:
        """A client for ``actor``, reading its context window and weight version."""
        info = await cls._call(actor.info.remote(), "info")
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
        result: GenerationResult = await self._call(
            self.actor.generate.remote(list(input_ids), params, adapter), "generate"
        )
        if result.weight_versions:
            self._saw_version(adapter, result.weight_versions[-1])
        return result

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
        version = await self._call(self.actor.adapter_version.remote(name), "adapter_version")
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

        reference = ray.put(dict(state_dict))
        self._weight_version = await self._call(
            self.actor.update_weights.remote(reference, version), f"update_weights(version {version})"
        )

    async def update_adapter(self, adapter: Any, version: int, *, name: str = DEFAULT_ADAPTER) -> None:
        """``AdapterEngine``: only the LoRA adapter's tensors travel to the actor (policy ``name``'s adapter)."""
        served = await self._call(
            self.actor.update_adapter.remote(adapter, version, name),
            f"update_adapter({name}, version {version})",
        )
        if name == DEFAULT_ADAPTER:
            self._weight_version = served
        else:
            self._adapter_versions[name] = served

    async def update_weights_from_ref(self, state_dict_ref: Any, version: int) -> None:
        """``ObjectStoreWeightsEngine``: the actor resolves the trainer's object ref itself (no driver copy)."""
        self._weight_version = await self._call(
            self.actor.update_weights.remote(state_dict_ref, version), f"update_weights(version {version})"
        )

    async def logprobs_of(
        self, input_ids: Sequence[int], start: int = 1, *, adapter: str | None = None
    ) -> tuple[float, ...]:
        """Teacher-forced scoring in the actor under its current weights (policy ``adapter``'s when named)."""
        return await self._call(self.actor.logprobs_of.remote(list(input_ids), start, adapter), "logprobs_of")

    async def refresh(self) -> dict[str, Any]:
        """Ask the actor for its current state (and update ``weight_version``)."""
        info = await self._call(self.actor.info.remote(), "info")
        self._weight_version = info["weight_version"]
        return info

    @staticmethod
    async def _call(reference: Any, request: str) -> Any:
        """Await an actor call for at most ``ENGINE_CALL_DEADLINE_S`` (``EngineStalledError`` past it, naming
        ``request``); re-raise Rein's own errors as themselves, Ray failures as ``EngineError``."""
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
        except ray.exceptions.RayActorError as error:
            raise EngineError(f"engine actor is gone: {error}") from error
