"""A compact white-box coding agent: an OpenAI-SDK tool loop (``bash``, ``view_file``, ``edit_file``,
``submit``) against the proxy session, acting in the task's sandbox, bounded by turns and wall time.

Process reward (turn-level credit, ``components/training/turn_credit.py``): with ``tool_call_reward`` w > 0
every model call gets w × the mean over its tool calls of +1 for a call the tools ran (a command, whatever its
exit code: a failing test run is information, not a mistake; a file viewed or edited; ``submit``) and −1 for a
call they refused (unknown tool, arguments that are not a JSON object of the right fields, an ``old_str`` that
does not match exactly once, a missing file); a reply with no tool call gets −w. It rewards well-formed actions,
never progress on the task (the final reward's job). w = 0 (the default) gives no turn rewards."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI

from components.config import option, require, require_non_negative, require_positive
from components.protocols import Harness, HarnessOutcome, Sandbox, Task
from components.registry import HARNESSES
from components.rollout.failures import outcome_from_exception
from components.rollout.log_text import clip_text
from components.trajectory import TrajectoryStatus
from harnesses.agent_paths import project_bin_dirs, search_path
from harnesses.coding_tools import TOOL_SPECS, CodingTools

DEFAULT_SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in the repository at /workspace. Use the tools: `bash` to run "
    "commands, `view_file` to read a file, `edit_file` to replace an exact snippet of a file. Find the bug, fix "
    "it in the source (not the tests), check your fix, then call `submit`."
)
NO_TOOL_CALL_REMINDER = (
    "Your reply had no tool call. Every reply must call one of the tools: bash, view_file, edit_file, or submit "
    "when you are done."
)


@HARNESSES.register("swe_agent")
@dataclass(kw_only=True, frozen=True)
class SweAgentBrickConfig:
    """The ``harness`` kind ``swe_agent``: the white-box coding agent (OpenAI SDK tool loop). Its fields are the
    agent's own settings, with one home: ``SweAgentConfig.settings`` holds this object; the run adds its
    bounds and sampling."""

    command_timeout_s: float = option(60.0, "swe_agent: bound of one bash command")
    tool_call_reward: float = option(
        0.0,
        "swe_agent: process reward per model call (turn credit): w x mean(+1 per tool call run, -1 per call "
        "refused), -w for a reply with no tool call; 0 = none",
    )
    max_retries: int = option(
        1,
        "swe_agent: the OpenAI client's retries of a failed model call (connection errors, 5xx; 0 = none); a "
        "rollout whose call the engine failed is engine_error either way (the proxy counts the failure)",
    )

    def __post_init__(self) -> None:
        require_positive(self.command_timeout_s, "command_timeout_s")
        require_non_negative(self.tool_call_reward, "tool_call_reward")
        require_non_negative(self.max_retries, "max_retries")

    def read_only_paths(self) -> tuple[str, ...]:
        return ()

    def build(self, *, max_turns: int, wall_time_s: float, max_tokens: int, temperature: float) -> Harness:
        """The harness: these settings plus the run's bounds and sampling."""
        config = SweAgentConfig(
            max_turns=max_turns,
            wall_time_s=wall_time_s,
            max_tokens=max_tokens,
            temperature=temperature,
            settings=self,
        )
        return SweAgentHarness(config)


@dataclass(kw_only=True, frozen=True)
class SweAgentConfig:
    """Bounds and sampling of the white-box coding agent."""

    max_turns: int = 30  # model calls; running out ends the run with status turn_limit
    wall_time_s: float = 600.0  # the whole run; running out ends it with status timeout
    max_tokens: int = 1024  # per model reply
    temperature: float = 1.0
    model: str = "policy"  # the model name sent to the proxy
    max_output_chars: int = 8000  # tool output shown to the model (head and tail kept)
    max_log_chars: int = 100_000  # the run log kept in the trajectory
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # Directories put before the system ones on PATH for `bash` (default: the project venv's bin, so that
    # `python` / `pytest` work inside a sandbox that mounts the venv, as SWE tasks do).
    path_prepend: tuple[str, ...] = field(default_factory=project_bin_dirs)
    # The brick's own settings (bash command bound, turn reward, client retries): flags --swe-agent-*.
    settings: SweAgentBrickConfig = SweAgentBrickConfig()

    def __post_init__(self) -> None:
        for name in ("max_turns", "wall_time_s", "max_tokens", "max_output_chars"):
            require_positive(getattr(self, name), name)
        for name in ("temperature", "max_log_chars"):
            require_non_negative(getattr(self, name), name)
        require(bool(self.model), "model", "must be a non-empty model name")


class _Run:
    """Mutable state of one agent run (kept apart so a timeout still reports what happened)."""

    def __init__(self, tools: CodingTools) -> None:
        self.tools = tools
        self.started = time.monotonic()
        self.num_turns = 0
        self.num_response_tokens = 0
        self.num_text_only_replies = 0
        self.submitted = False
        self.log_lines: list[str] = []
        self.turn_rewards: list[float] = []  # per model call (with ``tool_call_reward``)

    def metrics(self) -> dict[str, float]:
        return {
            "num_turns": float(self.num_turns),
            "num_response_tokens": float(self.num_response_tokens),
            "num_text_only_replies": float(self.num_text_only_replies),
            "submitted": float(self.submitted),
            "agent_wall_time_s": time.monotonic() - self.started,
            **self.tools.metrics(),
        }


class SweAgentHarness:
    """The white-box coding agent as a ``Harness``."""

    def __init__(self, config: SweAgentConfig | None = None, *, name: str = "swe-agent") -> None:
        self.config = config or SweAgentConfig()
        self.name = name

    def initial_messages(self, task: Task) -> list[dict[str, Any]]:
        """The system prompt and the task statement the conversation starts from."""
        return [
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": task.problem_statement},
        ]

    async def run(self, *, task: Task, sandbox: Sandbox, base_url: str, api_key: str) -> HarnessOutcome:
        """Run the tool loop until ``submit``, the turn bound or the wall-time bound."""
        config = self.config
        state = _Run(
            CodingTools(
                sandbox,
                command_timeout_s=config.settings.command_timeout_s,
                max_output_chars=config.max_output_chars,
                env={"PATH": search_path(config.path_prepend)},
            )
        )
        client = AsyncOpenAI(
            base_url=f"{base_url.rstrip('/')}/v1",
            api_key=api_key,
            max_retries=config.settings.max_retries,
            timeout=config.wall_time_s,
        )
        try:
            async with asyncio.timeout(config.wall_time_s) as deadline:
                status = await self._loop(client, task, state)
        except TimeoutError as exc:
            if not deadline.expired():
                return outcome_from_exception(exc, metrics=state.metrics(), log=self._log(state))
            status = TrajectoryStatus.TIMEOUT
        except Exception as exc:
            return outcome_from_exception(exc, metrics=state.metrics(), log=self._log(state))
        finally:
            await client.close()
        reasons = {
            TrajectoryStatus.OK: "",
            TrajectoryStatus.TURN_LIMIT: f"no submit within {config.max_turns} turns",
            TrajectoryStatus.TIMEOUT: f"no submit within {config.wall_time_s:g} s",
        }
        return HarnessOutcome(
            status=status.value,
            failure_reason=reasons[status],
            metrics=state.metrics(),
            log=self._log(state),
            # a timed-out run may have lost the call it was waiting for: its count could be off
            turn_rewards=tuple(state.turn_rewards)
            if config.settings.tool_call_reward > 0 and status != TrajectoryStatus.TIMEOUT
            else (),
        )

    async def _loop(self, client: AsyncOpenAI, task: Task, state: _Run) -> TrajectoryStatus:
        config = self.config
        messages = self.initial_messages(task)
        while state.num_turns < config.max_turns:
            state.num_turns += 1
            response = await client.chat.completions.create(
                model=config.model,
                messages=messages,
                tools=list(TOOL_SPECS),
                max_tokens=config.max_tokens,
                temperature=config.temperature,
            )
            if response.usage is not None:
                state.num_response_tokens += response.usage.completion_tokens
            message = response.choices[0].message
            tool_calls = message.tool_calls or []
            assistant: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
            if tool_calls:
                assistant["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments},
                    }
                    for call in tool_calls
                ]
            messages.append(assistant)
            state.log_lines.append(f"--- turn {state.num_turns}: {clip_text(message.content or '', 2000)}")
            if not tool_calls:
                state.turn_rewards.append(-config.settings.tool_call_reward)
                state.num_text_only_replies += 1
                messages.append({"role": "user", "content": NO_TOOL_CALL_REMINDER})
                continue
            state.turn_rewards.append(0.0)
            scores: list[
                float
            ] = []  # +1 per tool call run, -1 per call refused (the ones run before a submit)
            for call in tool_calls:
                result = await state.tools.call(call.function.name, call.function.arguments)
                scores.append(-1.0 if result.refused else 1.0)
                state.turn_rewards[-1] = config.settings.tool_call_reward * sum(scores) / len(scores)
                state.log_lines.append(
                    f"> {call.function.name} {clip_text(call.function.arguments, 1000)}\n{clip_text(result.output, 2000)}"
                )
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result.output})
                if result.submitted:
                    state.submitted = True
                    return TrajectoryStatus.OK
        return TrajectoryStatus.TURN_LIMIT

    def _log(self, state: _Run) -> str:
        return clip_text("\n".join(state.log_lines), self.config.max_log_chars)
