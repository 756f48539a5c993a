"""Typed errors. A user mistake is a ``ValueError`` subclass; an infrastructure failure is a ``ReinError``
that a rollout records as ``failure_reason`` instead of crashing the run."""

from __future__ import annotations

import functools


class ReinError(Exception):
    """Base class of Rein's own runtime failures."""


class ContextOverflowError(ReinError):
    """The prompt is at or over the model's context window; nothing was generated."""

    def __init__(self, *, num_prompt_tokens: int, context_window: int) -> None:
        self.num_prompt_tokens = num_prompt_tokens
        self.context_window = context_window
        super().__init__(
            f"prompt has {num_prompt_tokens} tokens but the context window is {context_window}; "
            "shorten the conversation or raise the model's context window"
        )

    def __reduce__(self):  # keyword-only __init__: pickle (Ray, multiprocessing) needs the fields explicitly
        return (
            functools.partial(
                ContextOverflowError,
                num_prompt_tokens=self.num_prompt_tokens,
                context_window=self.context_window,
            ),
            (),
        )


class MissingLogprobsError(ReinError):
    """An engine returned sampled tokens without their logprobs: training on them would be silently wrong."""


class EngineError(ReinError):
    """The inference engine failed or answered something that breaks its contract."""


class SandboxError(ReinError):
    """A sandbox could not be created, died, or failed an operation that is not the agent's fault."""

    def __init__(self, message: str, *, sandbox_id: str = "") -> None:
        self.sandbox_id = sandbox_id
        super().__init__(f"[sandbox {sandbox_id}] {message}" if sandbox_id else message)


class SandboxBackendDownError(ReinError):
    """The sandbox backend failed so many acquires in a row that its circuit breaker opened
    (``sandboxes.resilient``). Not a ``SandboxError``: it is not recorded per rollout but stops the step, with
    this message, so a dead backend does not turn a whole batch into ``sandbox_error`` records."""


class GradingError(ReinError):
    """Grading could not produce a verdict (not the same thing as reward 0)."""


class TrajectoryStoreError(ReinError):
    """A shard could not be written."""
