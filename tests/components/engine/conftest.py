"""Fixtures for the engine tests: embedded engines over the tiny models (one thread each, shared per module)."""

from __future__ import annotations

import sys
from pathlib import Path

# ``tests/components`` has no __init__.py; keep the real ``components`` package first on sys.path.
_REPO_ROOT = str(Path(__file__).resolve().parents[3])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

import pytest  # noqa: E402

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig  # noqa: E402


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """An embedded engine over the tiny dense model, shared by a test module."""
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, num_threads=1, max_batch_size=8))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_model_v1_dir(tmp_path_factory, default_model_dir) -> Path:
    """A second tiny model: same architecture, different random weights (the 'next version' of the policy)."""
    from components.models.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-v1", tokenizer_dir=default_model_dir, seed=1
    )
