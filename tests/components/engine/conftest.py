"""Fixtures for the engine tests: embedded engines over the tiny models (one thread each, shared per module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """An embedded engine over the tiny dense model, shared by a test module."""
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_model_v1_dir(tmp_path_factory, default_model_dir) -> Path:
    """A second tiny model: same architecture, different random weights (the 'next version' of the policy)."""
    from components.models.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-v1", tokenizer_dir=default_model_dir, seed=1
    )
