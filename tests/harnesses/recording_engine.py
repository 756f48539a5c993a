"""A scripted policy that keeps what every call asked for (its ``max_tokens``), for output-bound checks."""

from __future__ import annotations

from components.engine.scripted import ScriptedEngine


class RecordingEngine(ScriptedEngine):
    """The scripted policy, keeping the ``max_tokens`` of every call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_tokens_seen: list[int] = []

    async def generate(self, input_ids, params):
        self.max_tokens_seen.append(params.max_tokens)
        return await super().generate(input_ids, params)
