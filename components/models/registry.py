"""Where models live and how a model name resolves to an HF folder."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = Path(os.environ.get("REIN_MODELS_DIR", REPO_ROOT / ".models"))
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
TINY_MODEL_NAME = "tiny"


def default_model_dir() -> Path:
    """The set-up default policy (SmolLM2-135M-Instruct as an HF folder)."""
    return MODELS_DIR / DEFAULT_MODEL_NAME


def resolve_model(name_or_path: str | Path | None = None) -> Path:
    """``None``/``"default"`` → the default model; ``"tiny"`` → the tiny test model (built on first use);
    anything else → an existing HF causal-LM folder."""
    if name_or_path in (None, "default", DEFAULT_MODEL_NAME):
        path = default_model_dir()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"default model missing at {path}: run `make setup` first")
        return path
    if name_or_path == TINY_MODEL_NAME:
        from components.models.tiny import build_tiny_model

        path = MODELS_DIR / TINY_MODEL_NAME
        if not (path / "config.json").exists():
            build_tiny_model(path)
        return path
    path = Path(name_or_path)
    if not (path / "config.json").exists():
        raise ValueError(
            f"model: {path} is not an HF model folder (no config.json); pass 'default', 'tiny' or a folder"
        )
    return path
