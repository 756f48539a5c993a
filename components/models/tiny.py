"""A tiny random-initialised Llama-style (or Mixtral-style MoE) model with the SmolLM2 tokenizer, for tests.

Same vocabulary and chat template as the default policy, a 32k-position window so that 20k-token agent
prompts fit, and few enough parameters (≈ 3 M) that the test suite stays quick.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from components.models.registry import default_model_dir


def build_tiny_model(
    out_dir: Path | str,
    *,
    tokenizer_dir: Path | str | None = None,
    seed: int = 0,
    moe: bool = False,
    num_layers: int = 2,
    hidden_size: int = 64,
    max_positions: int = 32768,
) -> Path:
    """Write a tiny model + the SmolLM2 tokenizer into ``out_dir`` (atomically) and return it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, MixtralConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or default_model_dir())
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    )
    config = (
        MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **common) if moe else LlamaConfig(**common)
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(staging, out_dir)
    return out_dir
