"""Engines that cost nothing and decide nothing: for the proxy's overhead benchmark and for deterministic
end-to-end tests.

- ``EchoEngine`` answers every prompt with the same fixed token ids (then EOS) at zero cost: the proxy's own
  overhead is all that is left to measure.
- ``ScriptedEngine`` answers with pre-set assistant texts (in order, or chosen by a function of the prompt
  text): it returns the tokenizer's ids of that text followed by EOS, each with logprob 0.0, so that a test can
  drive a deterministic "policy" through a real harness and check exactly what the proxy recorded.

Both honour the ``InferenceEngine`` contract: a prompt at or over the context window raises
``ContextOverflowError``; ``max_tokens`` is clamped to the room left; every token carries the current weight
version.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from components.config import require, require_positive
from components.errors import ContextOverflowError
from components.protocols import FinishReason, GenerationResult, SamplingParams

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


def _finish(
    reply_ids: Sequence[int],
    input_ids: Sequence[int],
    params: SamplingParams,
    context_window: int,
    version: int,
) -> GenerationResult:
    num_prompt_tokens = len(input_ids)
    if num_prompt_tokens >= context_window:
        raise ContextOverflowError(num_prompt_tokens=num_prompt_tokens, context_window=context_window)
    budget = min(params.max_tokens, context_window - num_prompt_tokens)
    output_ids = tuple(reply_ids[:budget])
    stops = set(params.stop_token_ids)
    finish_reason = FinishReason.LENGTH if len(reply_ids) > budget else FinishReason.STOP
    for position, token_id in enumerate(output_ids):
        if token_id in stops:  # a stop id ends the completion (and is kept, as engines do with EOS)
            output_ids = output_ids[: position + 1]
            finish_reason = FinishReason.STOP
            break
    return GenerationResult(
        output_ids=output_ids,
        logprobs=(0.0,) * len(output_ids),
        weight_versions=(version,) * len(output_ids),
        finish_reason=finish_reason,
        num_prompt_tokens=num_prompt_tokens,
    )


def require_no_adapter(adapter: str | None) -> None:
    """A scripted engine has no LoRA adapters (``InferenceEngine.generate``'s contract)."""
    require(adapter is None, "adapter", f"a scripted engine serves no LoRA adapters, got {adapter!r}")


class EchoEngine:
    """Answers every prompt with ``reply_ids`` + EOS instantly (zero-cost engine for overhead measurements)."""

    def __init__(
        self, *, eos_token_id: int, reply_ids: Sequence[int] = (), context_window: int = 32768
    ) -> None:
        require_positive(context_window, "context_window")
        self._reply_ids = (*reply_ids, eos_token_id)
        self._context_window = context_window
        self._weight_version = 0

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult:
        """The fixed reply, clamped to ``params.max_tokens`` and the room left in the window."""
        require_no_adapter(adapter)
        return _finish(self._reply_ids, input_ids, params, self._context_window, self._weight_version)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Only bumps the version stamped on later tokens (there are no weights)."""
        self._weight_version = int(version)


Script = Sequence[str] | Callable[[str], str]


class ScriptedEngine:
    """Replies with pre-set assistant texts, tokenized, + EOS, each token with logprob 0.0.

    ``script`` is either a sequence of texts served in call order (the last one repeats once they run out) or
    a function from the decoded prompt text to the reply text (deterministic under concurrency).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        script: Script,
        *,
        context_window: int = 32768,
        eos_token_id: int | None = None,
    ) -> None:
        require_positive(context_window, "context_window")
        eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        require(eos is not None, "eos_token_id", "the tokenizer has none; pass one")
        if not callable(script):
            script = tuple(script)
            require(len(script) > 0, "script", "needs at least one reply text")
            require(all(isinstance(t, str) for t in script), "script", "entries must be strings")
        self._tokenizer = tokenizer
        self._script = script
        self._eos_token_id = int(eos)
        self._context_window = context_window
        self._weight_version = 0
        self._num_calls = 0
        self._lock = threading.Lock()
        self.prompts: list[tuple[int, ...]] = []  # every prompt seen, in call order (for tests)

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @property
    def num_calls(self) -> int:
        return self._num_calls

    def _next_text(self, input_ids: Sequence[int]) -> str:
        with self._lock:
            index = self._num_calls
            self._num_calls += 1
            self.prompts.append(tuple(input_ids))
        if callable(self._script):
            return self._script(self._tokenizer.decode(list(input_ids)))
        return self._script[min(index, len(self._script) - 1)]

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult:
        """The next scripted text as token ids + EOS (clamped like a real engine)."""
        require_no_adapter(adapter)
        if len(input_ids) >= self._context_window:
            raise ContextOverflowError(num_prompt_tokens=len(input_ids), context_window=self._context_window)
        text = self._next_text(input_ids)
        reply_ids = [*self._tokenizer.encode(text, add_special_tokens=False), self._eos_token_id]
        return _finish(reply_ids, input_ids, params, self._context_window, self._weight_version)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Only bumps the version stamped on later tokens (there are no weights)."""
        self._weight_version = int(version)

    def __getstate__(self) -> dict[str, object]:  # shipped into Ray actors: locks do not pickle
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
