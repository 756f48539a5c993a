"""Inference engines: token ids in, sampled ids + logprobs + weight versions out (``InferenceEngine``).

- ``EmbeddedEngine`` (``components.engine.embedded``): in-process PyTorch with continuous batching, the CPU default.
- ``EngineActor`` / ``RayEngineClient`` (``components.engine.ray_actor``): one embedded engine in a Ray actor,
  shared by the proxy and the trainer.
- ``SGLangEngine`` (``components.engine.sglang``): a client of SGLang's native HTTP API for GPU clusters.

Submodules are imported on demand so that importing the package stays light (no torch, no ray).
"""
