"""One policy's view of a shared multi-adapter engine (embedded ``PolicyEngine``, SGLang ``SGLangPolicy``).

The view is an ``InferenceEngine`` whose requests run with the adapter ``name`` (batched with other policies'
requests on the shared base) and whose ``weight_version`` is that adapter's own. A proxy session bound to a view
samples only with its policy; a ``WeightSync`` over it moves only its adapter. Subclasses check the name and add
their engine's way of receiving an adapter. A ``StreamingPolicyView`` (embedded, Ray actor, vLLM, SGLang) also
streams with its adapter (``StreamingEngine``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Generic, Protocol, TypeVar

from components.config import require
from components.protocols import GenerationResult, SamplingParams, TokenChunk


class MultiPolicyEngine(Protocol):
    """What a view needs of its shared engine: the window, each policy's adapter version, and generation
    with a named adapter."""

    @property
    def context_window(self) -> int: ...

    def adapter_version(self, name: str) -> int: ...

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult: ...


class StreamingMultiPolicyEngine(MultiPolicyEngine, Protocol):
    """A shared engine that also streams a named adapter's generation (``StreamingEngine.generate_stream``)."""

    def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]: ...


E = TypeVar("E", bound=MultiPolicyEngine)
S = TypeVar("S", bound=StreamingMultiPolicyEngine)


class PolicyView(Generic[E]):
    """The shared part of a policy view: the adapter name on every request, the adapter's own version."""

    def __init__(self, engine: E, name: str) -> None:
        self.engine = engine
        self.name = name

    @property
    def context_window(self) -> int:
        return self.engine.context_window

    @property
    def weight_version(self) -> int:
        return self.engine.adapter_version(self.name)

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult:
        """Generate with this view's policy (``adapter``, when given, must name it)."""
        require(
            adapter in (None, self.name), "adapter", f"this view serves policy {self.name!r}, got {adapter!r}"
        )
        return await self.engine.generate(input_ids, params, adapter=self.name)


class StreamingPolicyView(PolicyView[S]):
    """A view of an engine that streams: a ``StreamingEngine`` whose streams run with the view's adapter."""

    async def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """Stream with this view's policy (``adapter``, when given, must name it); closing it aborts the request."""
        require(
            adapter in (None, self.name), "adapter", f"this view serves policy {self.name!r}, got {adapter!r}"
        )
        stream = self.engine.generate_stream(input_ids, params, adapter=self.name)
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()
