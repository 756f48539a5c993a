"""The ``engine`` seam's built-in kinds: each a registered config class whose ``build()`` makes its
``EngineProvider`` (``components.protocols``): ``embedded`` (the torch engine in one Ray actor; weights travel
through Ray's object store) or ``sglang`` (SGLang servers outside Ray, reached over HTTP)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from components.config import option, require, require_non_negative, require_one_of, require_positive
from components.protocols import InferenceEngine
from components.registry import ENGINES
from components.sampling import SamplingDistribution

if TYPE_CHECKING:
    import ray
    from transformers import PreTrainedTokenizerBase

    from components.engine.embedded import EmbeddedEngineConfig
    from components.engine.ray_actor import RayEngineClient
    from components.engine.sglang_fleet import SGLangFleet
    from components.engine.sglang_weight_transfer import DistributedWeightSyncConfig
    from components.engine.vllm_fleet import VLLMFleet
    from components.training.weight_sync import WeightSync


@runtime_checkable
class EngineProvider(Protocol):
    """Starts a run's inference engine and says how the trainer's new weights reach it (embedded actor,
    SGLang servers, or a user's engine).

    Contract: ``start`` returns an engine serving the weights at ``model_path`` (the newest checkpoint when
    ``resumed``) stamped ``weight_version``, and the ``WeightSync`` that pushes later versions to it; ``close``
    stops what ``start`` started, is idempotent, and is safe to call when ``start`` failed or never ran.
    """

    async def start(
        self, *, model_path: Path, weight_version: int, run_dir: Path, resumed: bool
    ) -> tuple[InferenceEngine, WeightSync]: ...

    async def close(self) -> None: ...


@runtime_checkable
class StandaloneEngine(Protocol):
    """An engine kind ``rein proxy`` can serve alone (no trainer, no Ray)."""

    async def start_standalone(
        self, *, model_path: Path, sampling: SamplingDistribution, record_routed_experts: bool = False
    ) -> tuple[InferenceEngine, PreTrainedTokenizerBase]:
        """The started engine and the tokenizer the proxy encodes with (refusing ``sampling`` it cannot record
        logprobs under)."""
        ...

    def standalone_label(self, model_path: Path) -> str:
        """What generates, for ``rein proxy``'s start-up line (``SGLang URL``, ``vLLM URL``, the model folder)."""
        ...


class EngineBrickConfig(Protocol):
    """A registered kind of the ``engine`` seam."""

    @property
    def colocated(self) -> bool:
        """Whether the engine gives its GPU memory to the trainer during each train step."""
        ...

    def check_sampling(self, sampling: SamplingDistribution) -> None:
        """Raise ``ValueError`` naming the flags to change when the engine cannot record logprobs under
        ``sampling``."""
        ...

    def build(
        self, *, sampling: SamplingDistribution | None = None, record_routed_experts: bool = False
    ) -> EngineProvider: ...


@ENGINES.register("embedded")
@dataclass(kw_only=True, frozen=True)
class EmbeddedEngineBrickConfig:
    """The embedded torch engine in one Ray actor."""

    num_cpus: float = option(1.0, "Ray CPUs reserved for the embedded engine actor")
    num_gpus: float = option(0.0, "Ray GPUs for the embedded engine actor (device cuda when > 0)")
    threads: int = option(1, "torch threads of the embedded engine", flag="threads")
    max_batch_size: int = option(8, "requests the embedded engine decodes together")
    kv_cache_gb: float = option(1.0, "GiB of the embedded engine's prefix cache (KV of past turns); 0 = off")
    max_restarts: int = option(
        3, "times Ray restarts the engine actor after it dies (the run's weights are pushed to it again)"
    )

    def __post_init__(self) -> None:
        for name in ("threads", "max_batch_size"):
            require_positive(getattr(self, name), name)
        for name in ("num_cpus", "num_gpus", "kv_cache_gb", "max_restarts"):
            require_non_negative(getattr(self, name), name)

    @property
    def colocated(self) -> bool:
        return False

    def check_sampling(self, sampling: SamplingDistribution) -> None:
        """No refusal: the engine records logprobs under the truncated distribution itself."""

    def build(
        self, *, sampling: SamplingDistribution | None = None, record_routed_experts: bool = False
    ) -> EmbeddedEngineProvider:
        """The provider of this config."""
        return EmbeddedEngineProvider(self)

    async def start_standalone(
        self, *, model_path: Path, sampling: SamplingDistribution, record_routed_experts: bool = False
    ) -> tuple[InferenceEngine, PreTrainedTokenizerBase]:
        """The torch engine in this process."""
        from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig

        engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=model_path, settings=self))
        return engine, engine.tokenizer

    def standalone_label(self, model_path: Path) -> str:
        return str(model_path)


@ENGINES.register("sglang")
@dataclass(kw_only=True, frozen=True)
class SGLangBrickConfig:
    """SGLang servers outside Ray, reached over HTTP."""

    url: str = option(
        "",
        "SGLang server URL(s), comma-separated (a router URL stands for its workers), "
        "e.g. http://10.0.0.5:30000,http://10.0.0.6:30000",
        flag="sglang-url",
    )
    api_key: str = option("", "the servers' --api-key ('' = none)", flag="sglang-api-key")
    admin_api_key: str = option(
        "",
        "the servers' --admin-api-key for weight/pause/memory calls ('' = none)",
        flag="sglang-admin-api-key",
    )
    startup_timeout_s: float = option(
        600.0, "how long to wait for every server's /health at start", flag="sglang-startup-timeout-s"
    )
    request_timeout_s: float = option(600.0, "bound of one /generate call", flag="sglang-request-timeout-s")
    context_window: int = option(
        0,
        "tokens per sequence; 0 = the servers' max_model_len (/v1/models)",
        flag=("sglang-context-window", "context-window"),
    )
    weight_sync: Literal["disk", "nccl"] = option(
        "disk",
        "new weights via RUN_DIR/weights (shared storage) or an NCCL broadcast from the trainer's rank 0",
        flag="sglang-weight-sync",
    )
    nccl_address: str = option(
        "",
        "address the servers reach the trainer's rank 0 at (nccl); '' = its Ray node IP",
        flag="sglang-nccl-address",
    )
    colocated: bool = option(
        False,
        "trainer and servers share GPUs: servers release memory while training (rollout mode sync)",
        flag="sglang-colocated",
    )
    server_return_timeout_s: float = option(
        600.0,
        "how long the run waits for a server that went down to come back (0 = fail at once)",
        flag="sglang-server-return-timeout-s",
    )

    def __post_init__(self) -> None:
        from components.engine.sglang_fleet import parse_server_urls

        parse_server_urls(self.url, field="url")
        for name in ("startup_timeout_s", "request_timeout_s"):
            require_positive(getattr(self, name), name)
        require_non_negative(self.server_return_timeout_s, "server_return_timeout_s")
        require_non_negative(self.context_window, "context_window")
        require_one_of(self.weight_sync, "weight_sync", ("disk", "nccl"))

    @property
    def distributed_weight_sync(self) -> DistributedWeightSyncConfig | None:
        """Where the NCCL weight-update group meets (``weight_sync`` nccl; the group's other settings: their
        defaults); None: new weights travel through disk."""
        from components.engine.sglang_weight_transfer import DistributedWeightSyncConfig

        if self.weight_sync != "nccl":
            return None
        # '' : the node IP of the trainer's rank 0, found there
        return DistributedWeightSyncConfig(master_address=self.nccl_address, backend="nccl")

    def check_sampling(self, sampling: SamplingDistribution) -> None:
        """SGLang's logprobs ignore top-p / top-k truncation."""
        from components.engine.sglang import require_untruncated_sampling

        require_untruncated_sampling(sampling)

    def build(
        self, *, sampling: SamplingDistribution | None = None, record_routed_experts: bool = False
    ) -> SGLangEngineProvider:
        """The provider of this config."""
        return SGLangEngineProvider(self, record_routed_experts=record_routed_experts)

    async def start_standalone(
        self, *, model_path: Path, sampling: SamplingDistribution, record_routed_experts: bool = False
    ) -> tuple[InferenceEngine, PreTrainedTokenizerBase]:
        """The fleet over ``url`` (waits for every server), checked against ``sampling`` first."""
        from transformers import AutoTokenizer

        from components.engine.sglang_fleet import SGLangFleet, sglang_fleet_config

        self.check_sampling(sampling)  # before any server is contacted
        config = sglang_fleet_config(
            self, model_path=model_path, record_routed_experts=record_routed_experts, initial_weight_version=0
        )
        return await SGLangFleet.connect(config), AutoTokenizer.from_pretrained(model_path)

    def standalone_label(self, model_path: Path) -> str:
        return f"SGLang {self.url}"


class EmbeddedEngineProvider:
    """``EngineProvider``: the embedded torch engine in one Ray actor; weights travel through Ray's object
    store."""

    def __init__(self, config: EmbeddedEngineBrickConfig) -> None:
        self.config = config
        self._actor: ray.actor.ActorHandle | None = None
        self._engine: RayEngineClient | None = None

    def engine_config(self, *, model_path: Path, weight_version: int) -> EmbeddedEngineConfig:
        """The config the engine actor runs with."""
        from components.engine.embedded import EmbeddedEngineConfig

        return EmbeddedEngineConfig(
            model_path=model_path,
            settings=self.config,
            device="cuda" if self.config.num_gpus > 0 else "cpu",
            initial_weight_version=weight_version,
        )

    async def start(
        self, *, model_path: Path, weight_version: int, run_dir: Path, resumed: bool
    ) -> tuple[InferenceEngine, WeightSync]:
        from components.engine.ray_actor import RayEngineClient, start_engine_actor
        from components.training.weight_sync import WeightSync, WeightSyncConfig

        self._actor = start_engine_actor(
            self.engine_config(model_path=model_path, weight_version=weight_version)
        )
        engine = self._engine = await RayEngineClient.connect(self._actor)
        engine.start_watching()  # a restarted actor gets the run's weights back (``RayEngineClient.restore``)
        return engine, WeightSync(WeightSyncConfig(mode="memory"), engine)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.aclose()
            self._engine = None
        if self._actor is not None:
            self._actor.close.remote()
            self._actor = None


class SGLangEngineProvider:
    """``EngineProvider``: SGLang servers outside Ray, reached over HTTP."""

    def __init__(self, config: SGLangBrickConfig, *, record_routed_experts: bool = False) -> None:
        self.config = config
        self.record_routed_experts = record_routed_experts
        self._engine: SGLangFleet | None = None

    async def start(
        self, *, model_path: Path, weight_version: int, run_dir: Path, resumed: bool
    ) -> tuple[InferenceEngine, WeightSync]:
        from components.engine.sglang_fleet import SGLangFleet, sglang_fleet_config
        from components.training.weight_sync import WeightSync, WeightSyncConfig

        fleet_config = sglang_fleet_config(
            self.config,
            model_path=model_path,
            record_routed_experts=self.record_routed_experts,
            initial_weight_version=weight_version,
        )
        # Waits for /health on every server (clear timeout message), reads the context window.
        engine = self._engine = await SGLangFleet.connect(fleet_config)
        weight_sync = (
            WeightSync(WeightSyncConfig(mode="distributed"), engine)  # trainer rank 0 → servers (NCCL)
            if self.config.weight_sync == "nccl"
            else WeightSync(WeightSyncConfig(mode="disk", weights_dir=run_dir / "weights"), engine)
        )
        if resumed:  # the server still serves whatever it was started with
            await engine.update_weights_from_disk(str(model_path), weight_version)
        engine.remember_weights(model_path, weight_version)  # what a server that comes back is given
        engine.start_watching()
        return engine, weight_sync

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.aclose()
            self._engine = None


@ENGINES.register("vllm")
@dataclass(kw_only=True, frozen=True)
class VLLMBrickConfig:
    """vLLM servers outside Ray, reached over HTTP (``components/engine/vllm.py``)."""

    url: str = option(
        "",
        "vLLM server URL(s), comma-separated (a vllm-router URL stands for its workers), e.g. http://10.0.0.5:8000",
        flag="vllm-url",
    )
    api_key: str = option("", "the servers' --api-key ('' = none)", flag="vllm-api-key")
    startup_timeout_s: float = option(
        600.0, "how long to wait for every server's /health at start", flag="vllm-startup-timeout-s"
    )
    request_timeout_s: float = option(600.0, "bound of one generate call", flag="vllm-request-timeout-s")
    context_window: int = option(
        0,
        "tokens per sequence; 0 = the servers' max_model_len (/v1/models)",
        flag=("vllm-context-window", "context-window"),
    )
    logprobs_mode: str = option(
        "",
        "the servers' --logprobs-mode; '' = read it from /server_info (VLLM_SERVER_DEV_MODE=1)",
        flag="vllm-logprobs-mode",
    )
    pause_mode: Literal["wait", "keep", "abort"] = option(
        "wait",
        "weight updates: running requests finish on the old weights (wait), freeze (keep) or abort",
        flag="vllm-pause-mode",
    )
    server_return_timeout_s: float = option(
        600.0,
        "how long the run waits for a server that went down to come back (0 = fail at once)",
        flag="vllm-server-return-timeout-s",
    )
    weight_transfer: Literal["disk", "nccl"] = option(
        "disk",
        "new weights via RUN_DIR/weights (every server reloads the folder) or an NCCL broadcast from the process "
        "running the loop (GPU clusters: needs CUDA and `pip install vllm` there, servers started with "
        '--weight-transfer-config \'{"backend": "nccl"}\')',
        flag="vllm-weight-transfer",
    )
    nccl_address: str = option(
        "",
        "address the servers reach the loop's process at (nccl); '' = its host's",
        flag="vllm-nccl-address",
    )
    nccl_server_world_size: int = option(
        1, "GPU workers per server, tensor x pipeline parallel (nccl)", flag="vllm-nccl-server-world-size"
    )

    def __post_init__(self) -> None:
        from components.engine.server_fleet import parse_server_urls

        parse_server_urls(self.url, field="url")
        for name in ("startup_timeout_s", "request_timeout_s", "nccl_server_world_size"):
            require_positive(getattr(self, name), name)
        require_non_negative(self.server_return_timeout_s, "server_return_timeout_s")
        require_non_negative(self.context_window, "context_window")
        require_one_of(self.pause_mode, "pause_mode", ("wait", "keep", "abort"))
        require_one_of(self.weight_transfer, "weight_transfer", ("disk", "nccl"))
        if self.logprobs_mode:
            from components.engine.vllm import LOGPROBS_MODES

            require_one_of(self.logprobs_mode, "logprobs_mode", LOGPROBS_MODES)

    @property
    def colocated(self) -> bool:
        return False

    def check_sampling(self, sampling: SamplingDistribution) -> None:
        """The run's sampling against the servers' --logprobs-mode when given (else checked at start)."""
        if self.logprobs_mode:
            from components.engine.vllm import require_matching_logprobs

            require_matching_logprobs(sampling, self.logprobs_mode)

    def build(
        self, *, sampling: SamplingDistribution | None = None, record_routed_experts: bool = False
    ) -> VLLMEngineProvider:
        """The provider of this config."""
        return VLLMEngineProvider(self, sampling=sampling or SamplingDistribution())

    async def start_standalone(
        self, *, model_path: Path, sampling: SamplingDistribution, record_routed_experts: bool = False
    ) -> tuple[InferenceEngine, PreTrainedTokenizerBase]:
        """The fleet over ``url`` (waits for every server), checked against each server's --logprobs-mode."""
        from transformers import AutoTokenizer

        from components.engine.vllm import require_matching_logprobs
        from components.engine.vllm_fleet import VLLMFleet, vllm_fleet_config

        require(not record_routed_experts, "record_routed_experts", "vLLM does not return routed experts")
        fleet = await VLLMFleet.connect(vllm_fleet_config(self, initial_weight_version=0))
        try:
            for server in fleet.servers:  # the run's sampling against each server's own --logprobs-mode
                require_matching_logprobs(sampling, server.logprobs_mode)
        except BaseException:
            await fleet.aclose()
            raise
        return fleet, AutoTokenizer.from_pretrained(model_path)

    def standalone_label(self, model_path: Path) -> str:
        return f"vLLM {self.url}"


class VLLMEngineProvider:
    """``EngineProvider``: vLLM servers outside Ray, reached over HTTP; new weights via ``RUN_DIR/weights`` (an HF
    folder each server reloads in place), or (``weight_transfer`` nccl) gathered into this process and broadcast
    over NCCL (``vllm_weight_transfer.py``)."""

    def __init__(self, config: VLLMBrickConfig, *, sampling: SamplingDistribution) -> None:
        self.config = config
        self.sampling = sampling
        self._engine: VLLMFleet | None = None

    async def start(
        self, *, model_path: Path, weight_version: int, run_dir: Path, resumed: bool
    ) -> tuple[InferenceEngine, WeightSync]:
        from components.engine.vllm import require_matching_logprobs
        from components.engine.vllm_fleet import VLLMFleet, vllm_fleet_config
        from components.engine.vllm_weight_transfer import require_nccl_available

        fleet_config = vllm_fleet_config(self.config, initial_weight_version=weight_version)
        if fleet_config.weights_over_nccl:  # refused before any server is contacted
            require_nccl_available()
        engine = self._engine = await VLLMFleet.connect(fleet_config)
        for server in engine.servers:  # the run's sampling against each server's own --logprobs-mode
            require_matching_logprobs(self.sampling, server.logprobs_mode)
        if resumed or engine.weight_version != weight_version:  # the servers serve what they last loaded
            await engine.update_weights_from_disk(str(model_path), weight_version)
        engine.remember_weights(model_path, weight_version)  # what a server that comes back is given
        engine.start_watching()
        return engine, self.weight_sync(engine, run_dir=run_dir)

    def weight_sync(self, engine: VLLMFleet, *, run_dir: Path) -> WeightSync:
        """How the trainer's new weights reach ``engine``: rank 0's gathered state dict through this process to
        ``VLLMFleet.update_weights`` (NCCL broadcast), or an HF folder under ``RUN_DIR/weights`` every server
        reloads."""
        from components.training.weight_sync import WeightSync, WeightSyncConfig

        if engine.config.weights_over_nccl:
            return WeightSync(WeightSyncConfig(mode="memory"), engine)
        return WeightSync(WeightSyncConfig(mode="disk", weights_dir=run_dir / "weights"), engine)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.aclose()
            self._engine = None
