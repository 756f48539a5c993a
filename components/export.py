"""``rein export RUN_DIR --merged OUT``: a run's newest checkpoint as one full HF model folder.

A LoRA checkpoint (a PEFT adapter folder) is loaded over its base model with plain ``peft`` and merged
(``merge_and_unload``: W + scale * B @ A per adapted layer), so the result is served like any model
(transformers, SGLang or vLLM without LoRA flags). A full fine-tuning checkpoint is already an HF folder; it
is copied without the trainer's state. OUT is written atomically and must not exist yet.
"""

from __future__ import annotations

import argparse
import json
import shutil
import uuid
from pathlib import Path

from components.errors import ReinError
from components.lora import ADAPTER_CONFIG_FILE
from components.training.checkpoint import TOKENIZER_FILES, latest_checkpoint


class ExportError(ReinError):
    """Nothing to export, or the output would overwrite something."""


def export_merged(run_dir: Path, out: Path, *, base_model: Path | None = None) -> Path:
    """Write the newest checkpoint of ``run_dir`` as a full HF model into ``out``; returns the checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    run_dir, out = Path(run_dir), Path(out)
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    if checkpoint is None:
        raise ExportError(f"RUN_DIR: {run_dir} has no complete checkpoint under checkpoints/")
    if out.exists():
        raise ExportError(f"--merged: {out} already exists")
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.parent / f".tmp-{out.name}-{uuid.uuid4().hex[:8]}"
    temp.mkdir()
    try:
        adapter_config = checkpoint.path / ADAPTER_CONFIG_FILE
        if adapter_config.exists():
            from peft import PeftModel

            base = base_model or json.loads(adapter_config.read_text()).get("base_model_name_or_path")
            if not base or not (Path(base) / "config.json").exists():
                raise ExportError(
                    f"--base: the adapter's base model {base!r} is not an HF folder; pass --base"
                )
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            merged = PeftModel.from_pretrained(model, checkpoint.path).merge_and_unload()
            merged.save_pretrained(temp, safe_serialization=True)
            tokenizer_source = Path(base)
        else:
            for name in ("model.safetensors", "config.json"):
                shutil.copy2(checkpoint.path / name, temp / name)
            tokenizer_source = checkpoint.path
        for name in TOKENIZER_FILES:
            if (tokenizer_source / name).exists() and not (temp / name).exists():
                shutil.copy2(tokenizer_source / name, temp / name)
        temp.rename(out)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return checkpoint.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rein export", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="a run directory (with checkpoints/)")
    parser.add_argument("--merged", metavar="OUT", type=Path, required=True, help="the HF folder to write")
    parser.add_argument(
        "--base", type=Path, default=None, help="LoRA: the base model (default: the adapter's)"
    )
    args = parser.parse_args(argv)
    try:
        checkpoint = export_merged(args.run_dir, args.merged, base_model=args.base)
    except ExportError as error:
        parser.exit(2, f"rein export: {error}\n")
    print(f"exported {checkpoint} -> {args.merged}")
    return 0
