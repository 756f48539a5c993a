"""Bricks that fail on purpose, for the tests of what a failure becomes (an outcome, a status, a verdict)."""

from __future__ import annotations

from components.errors import SandboxError


class FailingEngine:
    """An ``InferenceEngine`` whose every generation fails (a crashed GPU worker, say): the proxy answers 5xx."""

    context_window = 65536  # larger than any agent's prompt (Codex, Gemini CLI: > 4k): the call reaches it
    weight_version = 0

    async def generate(self, input_ids, params):
        raise RuntimeError("CUDA error: device-side assert triggered")

    async def update_weights(self, state_dict, version):
        pass


class DeadSandbox:
    """A ``Sandbox`` whose backend died: every call raises ``SandboxError``."""

    sandbox_id = "dead-sandbox"

    def __getattr__(self, name):
        async def fail(*args, **kwargs):
            raise SandboxError("the sandbox died", sandbox_id=self.sandbox_id)

        return fail
