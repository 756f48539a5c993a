"""The run's config tree: the fields every recipe shares (``RunConfig``) and one config per brick.

Where a field goes: a field that configures one brick goes into that brick's config (its flag is
``--<brick>-<field>``, or a historical flag kept with ``option(..., flag=...)``); a field the whole run shares
(model, steps, seed, sampling) stays on ``RunConfig``. A recipe changes a brick's defaults by giving the brick
field a new default instance: ``sampling: SamplingBrickConfig = option(SamplingBrickConfig(max_tokens=192))``.
Most bricks' configs live with their brick (the trainer's in ``components/training/trainer_config.py``); the
sampling and rollout-scheduling configs live here, as the run wing reads them. ``--config FILE`` takes the same
fields nested by brick (``trainer: {workers: 2}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from components.config import require, require_non_negative, require_one_of, require_positive
from components.engine.providers import EmbeddedEngineBrickConfig, EngineBrickConfig
from components.models.registry import default_model_dir
from components.proxy.providers import ProxyBrickConfig, ServeProxyConfig
from components.recipe_config import option, slot
from components.registry import ALGORITHMS, ENGINES, LOGGERS, PROXIES, SANDBOXES
from components.rollout.dynamic_sampling import DynamicSamplingConfig
from components.rollout.partial_groups import PartialGroupConfig
from components.sampling import SamplingDistribution
from components.training.algorithms import AlgorithmConfig, GRPOConfig
from components.training.distillation import DistillationConfig
from components.training.trainer_config import TrainerBrickConfig
from monitoring.logger import MetricsLoggersConfig, WandbLoggersConfig
from sandboxes.provider import SandboxConfig, SandboxPoolConfig
from sandboxes.resilient import SandboxResilienceConfig

RolloutMode = Literal["sync", "async", "partial"]
ROLLOUT_MODES: tuple[RolloutMode, ...] = ("sync", "async", "partial")


@dataclass(kw_only=True, frozen=True)
class RolloutBrickConfig:
    """How rollouts are scheduled against training (the loop: ``components/run/loop.py``)."""

    mode: RolloutMode = option(
        "sync",
        "sync: roll out, then train (the reference); async: rollouts stay in flight across steps, the trainer "
        "takes complete groups as they come; partial: step n+1 rolls out while step n trains, in-flight "
        "rollouts continue on new weights (see components/run/loop.py)",
    )
    max_staleness: int = option(
        1,
        "async/partial: drop (and count) a group whose oldest sampled token is more versions behind",
        flag="max-staleness",
    )
    max_steps_ahead: int = option(
        1,
        "async/partial: while the trainer is the bottleneck (its last step found its groups complete), start "
        "groups at most this many steps beyond its step (capped by max_staleness; each step more would be a "
        "version of staleness on every group); while rollouts are (it waits for groups), up to max_staleness",
        flag="max-steps-ahead",
    )
    max_concurrency: int = option(4, "rollouts in flight at once", flag="max-concurrency")
    placement: Literal["driver", "actor"] = option(
        "driver",
        "where the rollout producer runs: in the driver, or in a Ray actor placed by actor_num_cpus / "
        "actor_resources on any node (needs proxy kind serve; see components/rollout/producer.py)",
    )
    actor_num_cpus: float = option(1.0, "Ray CPUs of the rollout producer actor (placement actor)")
    actor_resources: str = option(
        "", "custom Ray resources the producer actor needs, name=amount,... e.g. rollout=1 (placement actor)"
    )
    dynamic_sampling: DynamicSamplingConfig = option(
        DynamicSamplingConfig(), "DAPO dynamic sampling (components/rollout/dynamic_sampling.py)"
    )
    partial_groups: PartialGroupConfig = option(
        PartialGroupConfig(),
        "groups that lost members to infrastructure failures (components/rollout/partial_groups.py)",
    )
    stall_report_after_s: float = option(
        120.0,
        "report any wait on a remote component (actor call, engine request) pending longer than this, naming "
        "it, in the log and the run's stalls.jsonl (components/remote_waits.py)",
    )

    def __post_init__(self) -> None:
        require_one_of(self.mode, "mode", ROLLOUT_MODES)
        require_positive(self.max_concurrency, "max_concurrency")
        require_positive(self.stall_report_after_s, "stall_report_after_s")
        require_one_of(self.placement, "placement", ("driver", "actor"))
        require_non_negative(self.actor_num_cpus, "actor_num_cpus")
        self.actor_resource_amounts  # noqa: B018 -- validates actor_resources
        require_non_negative(self.max_staleness, "max_staleness")
        require_non_negative(self.max_steps_ahead, "max_steps_ahead")
        require(
            self.mode != "partial" or self.max_staleness >= 1,
            "max_staleness",
            "must be >= 1 in rollout mode partial (step n+1's rollouts start under step n's weights)",
        )

    @property
    def actor_resource_amounts(self) -> dict[str, float]:
        """``actor_resources`` as Ray custom resources."""
        from components.rollout.producer import parse_resources

        return parse_resources(self.actor_resources)

    def steps_in_line(self, *, rollout_bound: bool) -> int:
        """How many steps' groups may be in line for the trainer, counting the step it is on (collecting or
        training: the engine serves that step's version meanwhile). While the trainer is the bottleneck
        (``rollout_bound`` false): ``max_steps_ahead`` more, never more than ``max_staleness``. Starting further
        ahead buys nothing then (the buffer just fills) and costs a version of staleness per step ahead. While
        rollouts are the bottleneck: ``max_staleness`` more, the most that keeps a group started now within
        ``max_staleness`` when it is trained, in order; the slots then serve later groups instead of idling
        behind a slow tail. ``max_staleness`` beyond ``max_steps_ahead`` is also the slack that lets a slow group
        overtaken by faster ones still be trained instead of dropped."""
        ahead = self.max_staleness if rollout_bound else min(self.max_staleness, self.max_steps_ahead)
        return ahead + 1


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
