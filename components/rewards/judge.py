"""A relative LLM judge (RULER's idea, our code): one call scores a whole GRPO group against a rubric.

GRPO only needs rewards that order a group correctly, and a judge ranks a set of attempts far more reliably
than it grades one in isolation. So the judge sees every trajectory of a group side by side (their final
conversations, tool calls and outcomes), with the task and a rubric, and answers with a score in [0, 1] per
trajectory as JSON.

- The judge is any ``JudgeClient``: an OpenAI-compatible endpoint through the official ``openai`` SDK (a hosted
  model, a local SGLang server) or an ``InferenceEngine`` called directly with token ids (e.g. a frozen copy of
  the base policy). Neither goes through a proxy session, so the judge's calls are never recorded into the
  policy's trajectories.
- Its reply is parsed strictly (one score per trajectory, each a number in [0, 1]); a malformed reply is retried
  with the parse error shown to the judge, and a judge that keeps failing yields ``RewardResult(reward=None,
  error=...)`` for every member, which the runner records as ``grading_error`` (never a silent 0).
- Verdicts are cached by a hash of everything the judge sees (rubric, model, task, conversations), and every
  call's tokens and cost are counted (``metrics``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from components.config import require, require_non_negative, require_positive
from components.protocols import InferenceEngine, RewardResult, SamplingParams, Task
from components.trajectory import Trajectory

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


class JudgeError(RuntimeError):
    """The judge gave no usable verdict (after all attempts)."""


@dataclass(frozen=True, kw_only=True)
class JudgeReply:
    """One judge completion and what it cost."""

    text: str
    num_input_tokens: int
    num_output_tokens: int


@runtime_checkable
class JudgeClient(Protocol):
    """Where the judge model runs. Contract: one chat completion per call; raises on transport failure."""

    model: str

    async def complete(
        self, messages: Sequence[Mapping[str, str]], *, max_tokens: int, temperature: float
    ) -> JudgeReply: ...


class OpenAIJudgeClient:
    """Any OpenAI-compatible chat endpoint (hosted model, SGLang's ``/v1``), through the official SDK."""

    def __init__(self, *, base_url: str, model: str, api_key: str = "none", timeout_s: float = 120.0) -> None:
        require(
            base_url.startswith(("http://", "https://")),
            "judge_url",
            f"must be an http(s) URL, got {base_url!r}",
        )
        require(bool(model), "judge_model", "must name the judge model")
        self.base_url, self.model, self.api_key, self.timeout_s = base_url, model, api_key, timeout_s
        self._client: AsyncOpenAI | None = None  # opened lazily, so the client pickles into Ray actors

    async def complete(
        self, messages: Sequence[Mapping[str, str]], *, max_tokens: int, temperature: float
    ) -> JudgeReply:
        if self._client is None:
            from openai import AsyncOpenAI

            self._client = AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=1
            )
        reply = await self._client.chat.completions.create(
            model=self.model, messages=list(messages), max_tokens=max_tokens, temperature=temperature
        )
        usage = reply.usage
        return JudgeReply(
            text=reply.choices[0].message.content or "",
            num_input_tokens=usage.prompt_tokens if usage else 0,
            num_output_tokens=usage.completion_tokens if usage else 0,
        )

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_client": None}


class EngineJudgeClient:
    """A judge served by an ``InferenceEngine`` directly (token ids in and out, no proxy session): e.g. a frozen
    copy of the base policy beside the trained one."""

    def __init__(
        self, engine: InferenceEngine, tokenizer: PreTrainedTokenizerBase, *, model: str = "engine-judge"
    ) -> None:
        self.engine, self.tokenizer, self.model = engine, tokenizer, model

    async def complete(
        self, messages: Sequence[Mapping[str, str]], *, max_tokens: int, temperature: float
    ) -> JudgeReply:
        prompt_ids = self.tokenizer.apply_chat_template(
            [dict(message) for message in messages], add_generation_prompt=True, tokenize=True
        )
        if isinstance(prompt_ids, Mapping):  # newer transformers return a BatchEncoding
            prompt_ids = prompt_ids["input_ids"]
        eos = self.tokenizer.eos_token_id
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            stop_token_ids=(eos,) if eos is not None else (),
        )
        result = await self.engine.generate(list(prompt_ids), params)
        return JudgeReply(
            text=self.tokenizer.decode(list(result.output_ids), skip_special_tokens=True),
            num_input_tokens=len(prompt_ids),
            num_output_tokens=len(result.output_ids),
        )


@dataclass(frozen=True, kw_only=True)
class JudgeConfig:
    """How the judge is asked and what it costs."""

    rubric: str  # what a good trajectory does (the judge's criteria), e.g. read from ``--rubric FILE``
    max_attempts: int = 3  # calls per group before the group is a grading_error
    max_tokens: int = 1024  # cap on the judge's reply
    temperature: float = 0.0
    max_conversation_chars: int = 12_000  # per trajectory; longer conversations keep their head and tail
    usd_per_million_input_tokens: float = 0.0  # for cost accounting (0: a local judge)
    usd_per_million_output_tokens: float = 0.0
    max_cache_entries: int = 10_000

    def __post_init__(self) -> None:
        require(bool(self.rubric.strip()), "rubric", "must not be empty")
        for name in ("max_attempts", "max_tokens", "max_conversation_chars", "max_cache_entries"):
            require_positive(getattr(self, name), name)
        for name in ("temperature", "usd_per_million_input_tokens", "usd_per_million_output_tokens"):
            require_non_negative(getattr(self, name), name)


_SYSTEM = (
    "You are a strict, fair judge of AI agent runs. You compare several attempts at the same task and score "
    "each from 0 (useless or harmful) to 1 (fully achieves the task) according to the rubric. Judge what the "
    "agent actually did and achieved, not what it claims. Attempts that are better must get higher scores."
)

_ANSWER_FORMAT = (
    'Answer with JSON only, no other text: {"scores": [{"trajectory": 1, "explanation": "...", "score": 0.0}, '
    "...]} with exactly one entry per trajectory, numbered as above, each score a number between 0 and 1."
)


def _clip_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


def render_conversation(trajectory: Trajectory) -> str:
    """A trajectory's final conversation as plain text: roles, contents, tool calls, and how the run ended."""
    lines = []
    for message in trajectory.messages:
        role = str(message.get("role", "?"))
        content = message.get("content")
        if isinstance(content, list):  # content blocks (Anthropic / OpenAI parts)
            content = "\n".join(
                str(block.get("text") or block.get("content") or json.dumps(block, sort_keys=True))
                if isinstance(block, Mapping)
                else str(block)
                for block in content
            )
        lines.append(f"[{role}] {content if content is not None else ''}".rstrip())
        for call in message.get("tool_calls") or ():
            function = call.get("function", call) if isinstance(call, Mapping) else {}
            lines.append(f"[{role} tool call] {function.get('name', '?')}({function.get('arguments', '')})")
    lines.append(f"[outcome] status={trajectory.status.value}")
    return "\n".join(lines)


def parse_scores(text: str, num_trajectories: int) -> list[float]:
    """The judge's reply → one score in [0, 1] per trajectory, in trajectory order; ``JudgeError`` says what
    is wrong otherwise. Tolerates prose or a code fence around the JSON object, nothing else."""
    start = text.find("{")
    end = text.rfind("}")
    if start < 0 or end <= start:
        raise JudgeError("the reply contains no JSON object")
    try:
        payload = json.loads(text[start : end + 1])
    except json.JSONDecodeError as error:
        raise JudgeError(f"the reply's JSON does not parse: {error}") from None
    entries = payload.get("scores") if isinstance(payload, dict) else None
    if not isinstance(entries, list):
        raise JudgeError('the JSON object has no "scores" list')
    scores: dict[int, float] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise JudgeError("every scores entry must be an object")
        number, score = entry.get("trajectory"), entry.get("score")
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= num_trajectories:
            raise JudgeError(f"trajectory number {number!r} is not one of 1..{num_trajectories}")
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0.0 <= score <= 1.0:
            raise JudgeError(f"score {score!r} of trajectory {number} is not a number in [0, 1]")
        if number in scores:
            raise JudgeError(f"trajectory {number} is scored twice")
        scores[number] = float(score)
    missing = sorted(set(range(1, num_trajectories + 1)) - set(scores))
    if missing:
        raise JudgeError(f"trajectories {missing} have no score")
    return [scores[number] for number in range(1, num_trajectories + 1)]


class RelativeJudge:
    """Scores a group of trajectories of one task in one judge call (a ``GroupReward``)."""

    def __init__(self, config: JudgeConfig, client: JudgeClient) -> None:
        self.config = config
        self.client = client
        self._cache: dict[str, list[float]] = {}
        self._counts = {
            "judge_calls": 0.0,
            "judge_failed_calls": 0.0,
            "judge_cache_hits": 0.0,
            "judge_input_tokens": 0.0,
            "judge_output_tokens": 0.0,
            "judge_cost_usd": 0.0,
        }

    @property
    def metrics(self) -> dict[str, float]:
        """Calls, failures, cache hits, tokens and cost so far."""
        return dict(self._counts)

    def build_messages(self, task: Task, trajectories: Sequence[Trajectory]) -> list[dict[str, str]]:
        """The judge's prompt: rubric, task, every trajectory numbered from 1, answer format."""
        limit = self.config.max_conversation_chars
        parts = [
            f"# Rubric\n{self.config.rubric.strip()}",
            f"# Task\n{task.problem_statement.strip()}",
        ]
        for number, trajectory in enumerate(trajectories, start=1):
            parts.append(f"# Trajectory {number}\n{_clip_middle(render_conversation(trajectory), limit)}")
        parts.append(_ANSWER_FORMAT)
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]

    def _cache_key(self, messages: Sequence[Mapping[str, str]]) -> str:
        digest = hashlib.sha256()
        digest.update(self.client.model.encode())
        digest.update(json.dumps(list(messages), sort_keys=True).encode())
        return digest.hexdigest()

    async def score_group(self, task: Task, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """One ``RewardResult`` per trajectory, in order: all scored, or all ``reward=None`` with the error."""
        if not trajectories:
            return []
        messages = self.build_messages(task, trajectories)
        key = self._cache_key(messages)
        if key in self._cache:
            self._counts["judge_cache_hits"] += 1
            return [RewardResult(reward=score, log="judge: cached verdict") for score in self._cache[key]]
        errors: list[str] = []
        conversation = list(messages)
        for _ in range(self.config.max_attempts):
            try:
                reply = await self.client.complete(
                    conversation, max_tokens=self.config.max_tokens, temperature=self.config.temperature
                )
            except asyncio.CancelledError:
                raise
            except Exception as error:  # transport or server failure: retry, then a grading error
                self._counts["judge_failed_calls"] += 1
                errors.append(f"judge call failed: {type(error).__name__}: {error}")
                continue
            self._account(reply)
            try:
                scores = parse_scores(reply.text, len(trajectories))
            except JudgeError as error:
                self._counts["judge_failed_calls"] += 1
                errors.append(f"unusable judge reply: {error}")
                conversation = [
                    *messages,
                    {"role": "assistant", "content": reply.text},
                    {"role": "user", "content": f"Your answer was unusable: {error}. {_ANSWER_FORMAT}"},
                ]
                continue
            self._remember(key, scores)
            return [
                RewardResult(reward=score, log=f"judge ({self.client.model}): {score:g}") for score in scores
            ]
        error = (
            f"the judge gave no usable verdict in {self.config.max_attempts} attempts: {'; '.join(errors)}"
        )
        logger.warning("%s (task %s)", error, task.task_id)
        return [RewardResult(reward=None, error=error) for _ in trajectories]

    def _account(self, reply: JudgeReply) -> None:
        self._counts["judge_calls"] += 1
        self._counts["judge_input_tokens"] += reply.num_input_tokens
        self._counts["judge_output_tokens"] += reply.num_output_tokens
        self._counts["judge_cost_usd"] += (
            reply.num_input_tokens * self.config.usd_per_million_input_tokens
            + reply.num_output_tokens * self.config.usd_per_million_output_tokens
        ) / 1e6

    def _remember(self, key: str, scores: list[float]) -> None:
        if len(self._cache) >= self.config.max_cache_entries:
            self._cache.pop(next(iter(self._cache)))  # oldest first (dicts keep insertion order)
        self._cache[key] = scores
