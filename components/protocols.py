"""The interfaces Rein's bricks meet at, and the small frozen records they exchange.

Each Protocol's docstring is its contract: any implementation (embedded engine or SGLang, bubblewrap or E2B,
white-box or black-box harness, GRPO or another algorithm) must honour it, and each has one contract test
suite under ``tests/`` that every implementation passes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from components.config import require, require_non_negative, require_positive
from components.json_types import JsonObject, JsonValue

if TYPE_CHECKING:  # torch is heavy; only the type checker needs it here
    import numpy as np
    import torch
    from ray import ObjectRef

    from components.trajectory import Trajectory


# ----------------------------------------------------------------------------------------------------------
# Inference
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to sample one completion."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k truncation (the distribution is components.sampling's)
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    return_routed_experts: bool = False

    def __post_init__(self) -> None:
        require_positive(self.max_tokens, "max_tokens")
        require_non_negative(self.temperature, "temperature")
        require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        require(self.top_k >= 0, "top_k", f"must be >= 0 (0: no top-k truncation), got {self.top_k!r}")


class FinishReason(StrEnum):
    STOP = "stop"  # an EOS / stop token id / stop string ended the completion
    LENGTH = "length"  # max_tokens (or the context window) was reached
    ABORT = "abort"  # the request was aborted (engine shut down, explicit abort)


def _require_one_per_output_id(
    output_ids: Sequence[int], logprobs: Sequence[float], weight_versions: Sequence[int]
) -> None:
    n = len(output_ids)
    require(len(logprobs) == n, "logprobs", f"has {len(logprobs)} entries for {n} output ids")
    require(
        len(weight_versions) == n, "weight_versions", f"has {len(weight_versions)} entries for {n} output ids"
    )


@dataclass(frozen=True, kw_only=True)
class GenerationResult:
    """One completion: exactly the ids the engine sampled, each with the logprob it had under the
    distribution it was sampled from and the weight version that produced it."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...]
    finish_reason: FinishReason
    num_prompt_tokens: int
    # R3 routing replay: per forwarded position (prompt + output tokens, minus the last sampled one, which is
    # never fed back), per MoE layer, the top-k expert ids routed to - SGLang's [positions, layers, top_k]
    # layout. None when not asked or not an MoE model.
    routed_experts: tuple[tuple[tuple[int, ...], ...], ...] | None = None

    def __post_init__(self) -> None:
        _require_one_per_output_id(self.output_ids, self.logprobs, self.weight_versions)


@runtime_checkable
class InferenceEngine(Protocol):
    """Token-in, token-out generation.

    Contract: ``generate`` takes prompt token ids (never text) and returns the sampled ids with the logprob of
    each under the distribution it was sampled from (after temperature, top-k, top-p), and the weight version that
    produced each token. A prompt at or over ``context_window`` raises ``ContextOverflowError`` and generates
    nothing; otherwise ``max_tokens`` is clamped to the room left. ``update_weights`` is atomic with respect
    to in-flight requests: every token is produced entirely by one version, and tokens sampled after the call
    returns carry the new version. Many ``generate`` calls may be in flight at once. ``adapter`` names the LoRA
    policy that serves the request (multi-LoRA engines: ``policy(name)``); None is the engine's own policy, and an
    engine without adapters refuses any other value with a ``ValueError`` naming ``adapter``.
    """

    @property
    def context_window(self) -> int: ...

    @property
    def weight_version(self) -> int: ...

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult: ...

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...


@dataclass(frozen=True, kw_only=True)
class TokenChunk:
    """Tokens of a completion as they are sampled: their ids, logprobs and weight versions (the next slice of
    what the finished ``GenerationResult`` holds)."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...]

    def __post_init__(self) -> None:
        _require_one_per_output_id(self.output_ids, self.logprobs, self.weight_versions)


@runtime_checkable
class StreamingEngine(InferenceEngine, Protocol):
    """An ``InferenceEngine`` that also hands out tokens as they are sampled.

    Contract: ``generate_stream`` takes what ``generate`` takes and raises what it raises (before the first
    item for a refused request); it yields ``TokenChunk``s in sampling order, then exactly one
    ``GenerationResult``, the last item, equal to what ``generate`` returns: its ids are the chunks' ids
    joined. Closing the iterator before its end (``aclose``, or cancelling the task that iterates it, e.g. a
    client that disconnected) aborts the engine's request: no more tokens are sampled for it. Engines that do not
    stream implement only ``InferenceEngine``; their callers replay the finished generation.
    """

    def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]: ...


# ----------------------------------------------------------------------------------------------------------
# Sandboxes
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    """The outcome of one command in a sandbox."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """Resource limits of one sandbox."""

    command_timeout_s: float = 60.0  # default wall-clock limit per exec
    cpu_time_s: int = 600  # RLIMIT_CPU per command
    memory_mb: int = 1024  # address-space / cgroup memory limit per command
    max_processes: int = 128  # processes inside the sandbox
    workspace_mb: int = 256  # size of the writable workspace (and /tmp)

    def __post_init__(self) -> None:
        for name in ("command_timeout_s", "cpu_time_s", "memory_mb", "max_processes", "workspace_mb"):
            require_positive(getattr(self, name), name)


@dataclass(frozen=True, kw_only=True)
class SandboxSpec:
    """What a sandbox is made of."""

    # Directory or .tar.gz copied into the workspace (the sandbox's cwd, ``/workspace``) at creation.
    workspace_source: Path | None = None
    # Host paths made visible read-only at the same path inside (tool directories, a venv).
    read_only_paths: tuple[str, ...] = ()
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    # When set (``http://127.0.0.1:PORT``), that proxy address - and nothing else - is reachable from inside,
    # at the same URL. None: no network at all.
    proxy_url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # A container image the sandbox runs on instead of the host's root filesystem, in skopeo's transport
    # syntax (``oci:DIR:TAG`` or ``docker-archive:PATH``); the workspace is then also reachable at the image's
    # repository path (e.g. ``/testbed``). None: the host's root. A backend that cannot provide the image must
    # refuse the spec (``sandboxes/image.py`` provides it; the host-root bubblewrap pool refuses it).
    root_image: str | None = None


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run an agent's commands.

    Contract: every method is async and never hangs past its timeout; a command that overruns ``timeout_s``
    is killed with its whole process tree and reported with ``timed_out=True``. Paths are relative to the
    workspace unless absolute. A sandbox that died raises ``SandboxError`` (carrying ``sandbox_id``) from
    every later call. ``close`` is idempotent and leaves no process or temporary directory behind.
    """

    sandbox_id: str

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes | str) -> None: ...

    async def upload_dir(self, local_dir: Path, remote_dir: str) -> None: ...

    async def download(self, remote_path: str, local_path: Path) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SandboxProvider(Protocol):
    """Hands out sandboxes (``sandboxes.SandboxPool``, ``E2BSandboxProvider``, ``ImageSandboxProvider``).

    Contract: ``acquire(spec)`` returns a ready-to-use ``Sandbox`` for ``spec`` (its first call may wait for
    the workspace copy) or raises ``SandboxError``; ``release`` takes it back, dead or alive, and ends the lease:
    the handle never reaches a sandbox again (``SandboxError`` from every later call), and no later tenant gets
    anything the last one could have touched (bubblewrap and E2B destroy it); ``release`` never blocks on the
    teardown; ``close`` destroys everything the provider made.
    """

    async def acquire(self, spec: SandboxSpec | None = None) -> Sandbox: ...

    async def release(self, sandbox: Sandbox) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class StartsAhead(Protocol):
    """A ``SandboxProvider`` that can start its sandboxes before the first ``acquire`` (``sandboxes.SandboxPool``).

    Contract: ``start(wait=False)`` begins filling the provider in the background and returns at once; an
    ``acquire`` meanwhile waits for a start already under way rather than starting one more. The stack calls it
    while the trainer warms up, so the first step's rollouts find warm sandboxes.
    """

    async def start(self, *, wait: bool = True) -> None: ...


# ----------------------------------------------------------------------------------------------------------
# Tasks, rewards, harnesses
# ----------------------------------------------------------------------------------------------------------


@runtime_checkable
class Task(Protocol):
    """Something an agent is asked to do.

    Contract: ``sandbox_spec`` describes the agent's starting workspace, which must not contain anything the
    grader keeps hidden (hidden tests, the reference fix, history that reveals it).
    """

    task_id: str
    problem_statement: str

    def sandbox_spec(self) -> SandboxSpec: ...


@runtime_checkable
class TaskSource(Protocol):
    """Which tasks make each training step's groups (what a recipe hands ``components.run.loop`` as
    ``tasks_for_step``).

    Contract: ``source(step)`` returns the same non-empty number of tasks for every step, and the same tasks
    (ids, statements, starting workspaces) each time it is asked for one step: the overlapped loop asks again
    for every group, a resumed run for the steps it replays. Task ids are non-empty and fit in a file name.
    """

    def __call__(self, step: int) -> Sequence[Task]: ...


@dataclass(frozen=True, kw_only=True)
class RewardResult:
    """A verdict. ``reward`` is None exactly when grading itself failed (then ``error`` says why)."""

    reward: float | None
    log: str = ""
    error: str = ""
    # With ``error``: which part failed, one of ``components.errors.GRADING_ERROR_KINDS`` ("" counts as other).
    error_kind: str = ""
    # A process reward per model call of the rollout, in call order (turn-level credit); () gives none and
    # keeps the harness's (``HarnessOutcome.turn_rewards``), if any.
    turn_rewards: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        require((self.reward is None) == bool(self.error), "error", "must be set exactly when reward is None")
        require(not self.error_kind or bool(self.error), "error_kind", "is only set with an error")


@runtime_checkable
class Reward(Protocol):
    """Grades what the agent left in its sandbox.

    Contract: nothing the agent can do inside its sandbox changes the grade except a correct solution;
    grading failures return ``RewardResult(reward=None, error=...)`` rather than a reward of 0.
    """

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult: ...


@runtime_checkable
class GroupReward(Protocol):
    """Scores a whole GRPO group of one task at once (e.g. a relative LLM judge), after its rollouts finished.

    Contract: returns one ``RewardResult`` per trajectory, in order; a failure returns ``reward=None`` with
    the error for the members it could not score (they become ``grading_error``), never a silent 0. Its own
    model calls are never recorded into the policy's trajectories.
    """

    async def score_group(self, task: Task, trajectories: Sequence[Trajectory]) -> list[RewardResult]: ...


@dataclass(frozen=True, kw_only=True)
class HarnessOutcome:
    """How an agent run ended. ``status`` is a ``TrajectoryStatus`` value."""

    status: str
    failure_reason: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)
    log: str = ""
    # A process reward per model call, in call order (turn-level credit, ``components/training/turn_credit.py``);
    # () gives none. The count must match the calls the proxy recorded, or the trajectory is not finalized.
    turn_rewards: tuple[float, ...] = ()


@runtime_checkable
class Harness(Protocol):
    """The agent program being trained.

    Contract: the harness talks to the policy only through ``base_url`` (an OpenAI / Anthropic compatible
    proxy session URL), authenticating with ``api_key`` (the session's capability token: it opens that
    session's model routes and nothing else, see ``components.proxy.auth``), and acts only inside
    ``sandbox``; it returns within its own turn and time bounds and reports crashes as an outcome, never by
    raising.
    """

    name: str

    async def run(self, *, task: Task, sandbox: Sandbox, base_url: str, api_key: str) -> HarnessOutcome: ...


# ----------------------------------------------------------------------------------------------------------
# Training and monitoring
# ----------------------------------------------------------------------------------------------------------


@runtime_checkable
class Algorithm(Protocol):
    """A policy-gradient algorithm as three swappable pieces.

    Contract: ``advantages`` maps per-trajectory rewards (grouped by ``group_ids``) to per-trajectory
    advantages; ``sample_weights`` gives, for every training segment of one step (its number of sampled
    tokens and the index of its trajectory), the weight of each of its sampled tokens, normalised over the
    whole step so that a trajectory's total weight does not grow with the number of segments it was split
    into; ``loss`` is a pure function of 1-D per-token tensors and returns the weighted *sum* to minimise
    (micro-batch and rank losses add up to the step loss) plus float statistics (``*_sum`` keys are summed
    over tokens, ``num_tokens`` counts them). Tokens with ``loss_mask == 0`` contribute nothing.
    ``needs_reference_logprobs`` asks the trainer for a frozen reference policy's logprobs.
    """

    @property
    def needs_reference_logprobs(self) -> bool: ...

    def advantages(self, rewards: np.ndarray, group_ids: Sequence[str]) -> np.ndarray: ...

    def sample_weights(self, num_sampled_tokens: np.ndarray, trajectory_index: np.ndarray) -> np.ndarray: ...

    def loss(
        self,
        *,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        weights: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        proximal_logprobs: torch.Tensor | None = None,
        sequence_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


@runtime_checkable
class MetricsLogger(Protocol):
    """Where metrics go. Contract: ``log`` never raises on a backend hiccup; ``close`` flushes."""

    def log(self, metrics: Mapping[str, object], *, step: int) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class MetricsLoggerProvider(Protocol):
    """Opens the trackers a run's metrics go to besides ``RUN_DIR/metrics.jsonl`` (always written: resume, the
    learning curves and ``rein`` read it): Weights & Biases (``monitoring.logger.WandbLoggerProvider``), or yours.

    Contract: ``open`` is called once per run, when its monitor starts, and returns ``MetricsLogger``s (none is
    fine); a tracker that cannot start is left out with a warning, never stops the run. The monitor closes what
    ``open`` returned when the run ends.
    """

    def open(
        self, run_dir: Path, *, run_name: str, run_config: Mapping[str, JsonValue]
    ) -> Sequence[MetricsLogger]: ...


@runtime_checkable
class SandboxAwareHarness(Protocol):
    """A harness that runs programs inside the sandbox (black-box agents) and needs more from it: host paths
    bound read-only, the proxy reachable, higher limits."""

    def adapt_sandbox_spec(self, spec: SandboxSpec, *, proxy_url: str) -> SandboxSpec: ...


@runtime_checkable
class CallBoundedHarness(Protocol):
    """A harness whose sessions the proxy bounds: at most ``max_policy_calls`` model calls each (0: no bound);
    the runner opens its sessions with that ``SessionOpen.max_calls``."""

    @property
    def max_policy_calls(self) -> int: ...


@runtime_checkable
class TaskWithSetup(Protocol):
    """A task with set-up commands to run in its fresh sandbox before the agent starts (``SweTask``)."""

    async def run_setup(self, sandbox: Sandbox) -> None: ...


@dataclass(frozen=True, kw_only=True)
class SessionOutcome:
    """How a rollout ended, handed to ``SessionControl.finalize``: the trajectory's fields the proxy cannot know
    (a field left None keeps what the session was opened with)."""

    reward: float | None = None
    status: str | None = (
        None  # a ``TrajectoryStatus`` value; None: ok (context_overflow / turn_limit when the proxy refused)
    )
    failure_reason: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)
    task_id: str | None = None
    group_id: str | None = None
    harness: str | None = None
    step: int | None = None
    log: str = ""
    turn_rewards: tuple[float, ...] | None = None  # a process reward per model call, in call order

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", dict(self.metrics))
        if self.turn_rewards is not None:
            object.__setattr__(self, "turn_rewards", tuple(float(r) for r in self.turn_rewards))


@dataclass(frozen=True, kw_only=True)
class SessionOpen:
    """What a session is opened with (``SessionControl.open_session``): who it belongs to, the defaults for the
    trajectory it becomes, and the policy that samples every turn ("": the registry's default engine)."""

    session_id: str | None = None  # None: a fresh id
    task_id: str = ""
    group_id: str = ""
    harness: str = ""
    step: int = 0
    policy: str = ""
    # Model calls the proxy answers in this session; the next one is refused (HTTP 400 in the protocol's error
    # shape) and the session is marked ``turn_limit``. 0: no bound. The turn bound of agents that have none of
    # their own (OpenClaw, Codex), and a backstop for every other.
    max_calls: int = 0


@dataclass(frozen=True, kw_only=True)
class SessionDescription:
    """A session's record so far (``SessionControl.describe``); ``to_json`` is the proxy's
    ``GET /s/{id}/trajectory`` body. ``segments`` are JSON objects (token ids, mask, logprobs, versions ...)."""

    session_id: str
    policy: str = ""
    # "open"; ``context_overflow`` once the proxy refused an overlong prompt; ``turn_limit`` once it refused a
    # call past the session's ``max_calls``
    status: str = "open"
    num_turns: int = 0
    num_engine_errors: int = 0  # engine calls that failed
    num_malformed_tool_calls: int = 0
    tool_format: str = ""
    reasoning_format: str = ""
    last_engine_error: str = ""
    segments: tuple[Mapping[str, JsonValue], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(self.segments))

    @property
    def num_segments(self) -> int:
        return len(self.segments)

    def to_json(self) -> JsonObject:
        """The HTTP body: every field, plus ``num_segments``."""
        return {
            "session_id": self.session_id,
            "policy": self.policy,
            "status": self.status,
            "num_turns": self.num_turns,
            "num_engine_errors": self.num_engine_errors,
            "num_malformed_tool_calls": self.num_malformed_tool_calls,
            "tool_format": self.tool_format,
            "reasoning_format": self.reasoning_format,
            "last_engine_error": self.last_engine_error,
            "num_segments": self.num_segments,
            "segments": [dict(segment) for segment in self.segments],
        }

    @classmethod
    def from_json(cls, body: Mapping[str, JsonValue]) -> SessionDescription:
        """Read back ``to_json``'s body (an HTTP client of the proxy)."""
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in body.items() if key in names})


@runtime_checkable
class SessionControl(Protocol):
    """What the rollout runner needs of the proxy: open, describe, finalize or discard a recorded session
    (``components.proxy.sessions.SessionRegistry`` provides it, in-process or over Ray session shards).

    Contract: ``describe`` reports ``status`` (``context_overflow`` when the proxy refused an overlong prompt),
    ``num_turns`` and ``num_engine_errors`` (engine calls that failed, with ``last_engine_error``), so that the
    runner can tell an agent that gave up on a failing engine from one that failed by itself.
    """

    async def open_session(self, request: SessionOpen = SessionOpen()) -> str: ...

    async def describe(self, session_id: str) -> SessionDescription: ...

    async def finalize(self, session_id: str, outcome: SessionOutcome = SessionOutcome()) -> Trajectory: ...

    async def discard(self, session_id: str) -> None: ...


# ----------------------------------------------------------------------------------------------------------
# Weight sync: how a trainer's new policy reaches an engine (``components/training/weight_sync.py``)
# ----------------------------------------------------------------------------------------------------------


@runtime_checkable
class WeightBroadcaster(Protocol):
    """A trainer whose rank 0 can broadcast its current policy to engine servers over a weight-update group
    (``components.training.trainer.Trainer``).

    Contract: ``broadcast_weights`` sends every weight of the current policy, stamped ``version``, to the
    ``servers`` over the group ``sync`` describes, and returns its timings.
    """

    def broadcast_weights(
        self, servers: Sequence[object], sync: object, version: int
    ) -> dict[str, float]: ...


class AdapterWeights(Protocol):
    """One LoRA adapter version as it travels to an engine (``components.lora.LoraAdapter``): peft's
    ``LoraConfig`` as a dict and the adapter's tensors in saved-adapter key form."""

    config: Mapping[str, JsonValue]
    tensors: Mapping[str, torch.Tensor]

    @property
    def num_bytes(self) -> int: ...


@runtime_checkable
class ObjectStoreWeightsEngine(Protocol):
    """An engine in another Ray process that loads a new policy straight from Ray's object store.

    Contract: ``update_weights_from_ref`` resolves ``state_dict_ref`` (an ``ObjectRef`` to a full state dict)
    where the weights live, applies it between two decode steps and stamps later tokens with ``version``; the
    state dict never travels through the caller's process.
    """

    async def update_weights_from_ref(
        self, state_dict_ref: ObjectRef[dict[str, torch.Tensor]], version: int
    ) -> None: ...


@runtime_checkable
class DiskReloadingEngine(Protocol):
    """An engine that reloads its weights from an HF folder it can read (SGLang's update-from-disk).

    Contract: after ``update_weights_from_disk`` returns, new requests are served by the folder's weights and
    their tokens carry ``version``.
    """

    async def update_weights_from_disk(self, model_path: str, version: int) -> object: ...


@runtime_checkable
class TrainerBroadcastEngine(Protocol):
    """An engine whose servers receive new weights straight from the trainer's rank 0 (SGLang's NCCL
    weight-update group).

    Contract: after ``update_weights_from_trainer`` returns, new requests are served by the trainer's current
    weights and their tokens carry ``version``; generation was paused on every server meanwhile. It returns its
    timings (seconds by name) or None.
    """

    async def update_weights_from_trainer(
        self, trainer: WeightBroadcaster, version: int
    ) -> Mapping[str, float] | None: ...


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that serves a LoRA adapter over fixed base weights and takes new adapter versions in place.

    Contract: ``update_adapter`` applies ``adapter`` (``AdapterWeights``, e.g. ``components.lora.LoraAdapter``)
    between two decode steps without reloading the base weights; tokens sampled afterwards carry ``version``,
    and KV computed under an earlier version is never reused for them.
    """

    async def update_adapter(self, adapter: AdapterWeights, version: int) -> None: ...


@runtime_checkable
class LoraServingEngine(Protocol):
    """An engine server that loads PEFT adapter folders by name (SGLang ``--enable-lora``).

    Contract: after ``load_lora_adapter(lora_path, version)`` returns, new requests are served with the adapter
    at ``lora_path`` (a PEFT folder the server can read) and their tokens carry ``version``; adapters of older
    versions are unloaded once no request uses them.
    """

    async def load_lora_adapter(self, lora_path: str, version: int) -> object: ...
