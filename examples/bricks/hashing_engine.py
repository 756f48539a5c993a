"""A third-party engine brick in one file: a deterministic toy "model" whose next-token distribution is a hash
of its weights and the last token. It shows the seam only — it knows no language.

    pytest tests/contracts/test_engine_contract.py --brick examples.bricks.hashing_engine:HashingEngine
"""

import hashlib
import random

import numpy as np

from components.errors import ContextOverflowError
from components.protocols import FinishReason, GenerationResult


class HashingEngine:
    """Implements ``components.protocols.InferenceEngine``."""

    vocab_size, context_window = 64, 512

    def __init__(self) -> None:
        self.version, self.weights_digest = 0, "initial"

    @property
    def weight_version(self) -> int:
        return self.version

    def _logprobs(self, last_token: int, temperature: float) -> np.ndarray:
        seed = int(hashlib.sha256(f"{self.weights_digest}/{last_token}".encode()).hexdigest()[:15], 16)
        logits = np.random.default_rng(seed).normal(size=self.vocab_size) / max(temperature, 1e-6)
        return logits - np.logaddexp.reduce(logits)

    async def generate(self, input_ids, params, *, adapter=None) -> GenerationResult:
        if adapter is not None:
            raise ValueError(f"adapter: this engine serves no LoRA adapters, got {adapter!r}")
        prompt = [int(token) for token in input_ids]
        if not prompt or not all(0 <= token < self.vocab_size for token in prompt):
            raise ValueError(f"input_ids: must be non-empty ids in [0, {self.vocab_size})")
        if len(prompt) >= self.context_window:
            raise ContextOverflowError(num_prompt_tokens=len(prompt), context_window=self.context_window)
        sampler, tokens, logprobs = random.Random(params.seed), [], []
        finish = FinishReason.LENGTH
        for _ in range(min(params.max_tokens, self.context_window - len(prompt))):
            distribution = self._logprobs((prompt + tokens)[-1], params.temperature)
            token = sampler.choices(range(self.vocab_size), weights=np.exp(distribution))[0]
            tokens.append(token)
            logprobs.append(float(distribution[token]))
            if token in params.stop_token_ids:
                finish = FinishReason.STOP
                break
        return GenerationResult(
            output_ids=tuple(tokens), logprobs=tuple(logprobs), weight_versions=(self.version,) * len(tokens),
            finish_reason=finish, num_prompt_tokens=len(prompt),
        )  # fmt: skip

    async def update_weights(self, state_dict, version: int) -> None:
        digest = hashlib.sha256()
        for name in sorted(state_dict):
            digest.update(name.encode() + state_dict[name].float().numpy().tobytes())
        self.weights_digest, self.version = digest.hexdigest(), int(version)
