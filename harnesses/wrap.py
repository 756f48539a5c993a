"""Train your own Python agent without rewriting it: wrap it into a ``Harness``.

Keep your agent code; take an ``AgentContext`` and use its session-scoped clients::

    from harnesses.wrap import AgentContext, agent_harness

    @agent_harness(name="my-agent")
    async def my_agent(ctx: AgentContext) -> None:
        reply = await ctx.openai.chat.completions.create(
            model=ctx.model, messages=[{"role": "user", "content": ctx.task.problem_statement}]
        )
        await ctx.sandbox.exec(["bash", "-c", reply.choices[0].message.content or "true"])
        ctx.metrics["num_commands"] = 1

    runner = RolloutRunner(config, harness=my_agent, ...)   # my_agent is now a Harness

Every request your agent makes through ``ctx.openai`` / ``ctx.anthropic`` is recorded by the proxy session
(token ids, logprobs, loss mask), so the run becomes a trajectory. Return ``None`` (status ok), or a
``HarnessOutcome`` to set the status yourself; raise ``TurnLimitReached`` when your agent runs out of turns.
Exceptions are classified (``components.rollout.failures.classify_exception``): your crash is ``agent_error``, a dead
sandbox ``sandbox_error``, an unreachable or failing proxy ``engine_error``, a context overflow
``context_overflow``, exceeding ``wall_time_s`` ``timeout``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from openai import AsyncOpenAI

from components.config import require, require_positive
from components.protocols import HarnessOutcome, Sandbox, Task
from components.rollout.failures import outcome_from_exception
from components.rollout.log_text import clip_text
from components.trajectory import TrajectoryStatus

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic


@dataclass(kw_only=True, frozen=True)
class WrappedAgentConfig:
    """Bounds of a wrapped user agent."""

    wall_time_s: float = 600.0  # exceeding it cancels the agent: status timeout
    model: str = "policy"  # offered to the agent as ``ctx.model``
    max_log_chars: int = 100_000

    def __post_init__(self) -> None:
        require_positive(self.wall_time_s, "wall_time_s")
        require_positive(self.max_log_chars, "max_log_chars")
        require(bool(self.model), "model", "must be a non-empty model name")


@dataclass(kw_only=True)
class AgentContext:
    """What a wrapped agent gets: the task, its sandbox, clients bound to its proxy session, and places to put
    metrics and log lines."""

    task: Task
    sandbox: Sandbox
    base_url: str  # the proxy session URL (``.../s/{session_id}``)
    api_key: str  # the session's capability token (opens this session's model routes only)
    model: str
    metrics: dict[str, float] = field(default_factory=dict)
    log_lines: list[str] = field(default_factory=list)
    _openai: AsyncOpenAI | None = None
    _anthropic: AsyncAnthropic | None = None

    @property
    def openai(self) -> AsyncOpenAI:
        """An ``AsyncOpenAI`` client whose every request lands in this rollout's proxy session."""
        if self._openai is None:
            self._openai = AsyncOpenAI(
                base_url=f"{self.base_url.rstrip('/')}/v1", api_key=self.api_key, max_retries=1
            )
        return self._openai

    @property
    def anthropic(self) -> AsyncAnthropic:
        """An ``AsyncAnthropic`` client bound to this rollout's proxy session."""
        if self._anthropic is None:
            from anthropic import AsyncAnthropic

            self._anthropic = AsyncAnthropic(
                base_url=self.base_url.rstrip("/"), api_key=self.api_key, max_retries=1
            )
        return self._anthropic

    def log(self, line: str) -> None:
        """Add a line to the run log shown with the trajectory."""
        self.log_lines.append(line)

    async def aclose(self) -> None:
        """Close the clients that were opened."""
        for client in (self._openai, self._anthropic):
            if client is not None:
                await client.close()


AgentFunction = Callable[[AgentContext], Awaitable[HarnessOutcome | None]]


class FunctionHarness:
    """A user's ``async def agent(ctx)`` as a ``Harness``."""

    def __init__(self, agent: AgentFunction, *, name: str, config: WrappedAgentConfig | None = None) -> None:
        require(
            inspect.iscoroutinefunction(agent),
            "agent",
            "must be an `async def` function taking an AgentContext",
        )
        require(bool(name), "name", "a harness needs a non-empty name")
        self.agent = agent
        self.name = name
        self.config = config or WrappedAgentConfig()
        functools.update_wrapper(self, agent)

    async def run(self, *, task: Task, sandbox: Sandbox, base_url: str, api_key: str) -> HarnessOutcome:
        """Run the agent function once; its exceptions become a classified outcome."""
        ctx = AgentContext(
            task=task, sandbox=sandbox, base_url=base_url, api_key=api_key, model=self.config.model
        )
        started = time.monotonic()

        def finish(outcome: HarnessOutcome) -> HarnessOutcome:
            metrics = {**ctx.metrics, **outcome.metrics, "agent_wall_time_s": time.monotonic() - started}
            log = "\n".join(ctx.log_lines + ([outcome.log] if outcome.log else []))
            return HarnessOutcome(
                status=TrajectoryStatus(outcome.status).value,
                failure_reason=outcome.failure_reason,
                metrics=metrics,
                log=clip_text(log, self.config.max_log_chars),
            )

        try:
            async with asyncio.timeout(self.config.wall_time_s) as deadline:
                result = await self.agent(ctx)
        except TimeoutError as exc:
            if deadline.expired():
                return finish(
                    HarnessOutcome(
                        status=TrajectoryStatus.TIMEOUT.value,
                        failure_reason=f"agent ran past {self.config.wall_time_s:g} s",
                    )
                )
            return finish(outcome_from_exception(exc))
        except Exception as exc:
            return finish(outcome_from_exception(exc))
        finally:
            await ctx.aclose()
        if result is None:
            return finish(HarnessOutcome(status=TrajectoryStatus.OK.value))
        if not isinstance(result, HarnessOutcome) or result.status not in set(TrajectoryStatus):
            return finish(
                HarnessOutcome(
                    status=TrajectoryStatus.AGENT_ERROR.value,
                    failure_reason=f"agent returned {result!r:.200}; expected None or a HarnessOutcome whose "
                    f"status is one of {[s.value for s in TrajectoryStatus]}",
                )
            )
        return finish(result)


def agent_harness(
    agent: AgentFunction | None = None, *, name: str | None = None, config: WrappedAgentConfig | None = None
) -> FunctionHarness | Callable[[AgentFunction], FunctionHarness]:
    """Turn ``async def agent(ctx: AgentContext)`` into a ``Harness``; use as ``@agent_harness`` or
    ``@agent_harness(name=..., config=...)`` or call ``agent_harness(fn, name=...)``."""

    def wrap(fn: AgentFunction) -> FunctionHarness:
        return FunctionHarness(fn, name=name or fn.__name__.replace("_", "-"), config=config)

    return wrap(agent) if agent is not None else wrap
