"""LoRA vs full fine-tuning, side by side in one run: bytes per weight sync, sync wall time, trainer peak memory,
step time.

Each mode runs in its own fresh process (so peak RSS is that mode's alone), on the same model and the same
packed micro-batches (GRPO loss, ``run_train_step``: the trainer's own step, one process, fp32, AdamW):
- ``full``: every weight trained; a sync gathers the whole state dict (CPU copy) and loads it into an embedded
  engine (``update_weights``).
- ``lora``: peft LoRA (default rank 8 with alpha 16 on every linear layer of the blocks, attention + MLP: the
  configuration ART trains with by default and what peft's ``all-linear`` gives); a sync gathers only the
  adapter and applies it in place (``update_adapter``): the base never moves.
Peak memory is the process's peak RSS right after the training steps (before the engine is built). Syncs
alternate with nothing else running; each figure is the median of ``--syncs`` syncs after one warm-up, and the
sync is split into its parts: ``gather_s`` (copy the trained tensors out of the trainer's model and, for LoRA,
peft's conversion to saved-adapter keys) and ``apply_s`` (the engine: wait for the scheduler's next step, copy
the tensors in, empty the prefix cache).

    python benchmarks/lora.py [--quick] [--model default|tiny|PATH] [--rank 8]

Last line: ``lora: sync bytes <a>% of full, sync time <b>x, peak memory <c>x, step time <d>x
(target <= 2%, <= 0.1x, <= 0.6x)``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def micro_batches(num_rows: int, tokens_per_row: int, prompt_tokens: int, vocab: int, seed: int):
    import torch

    from components.training.data import MicroBatch

    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(num_rows):
        n = tokens_per_row
        mask = torch.cat([torch.zeros(prompt_tokens), torch.ones(n - prompt_tokens)])
        rows.append(
            MicroBatch(
                input_ids=torch.randint(0, vocab, (n,), generator=generator),
                position_ids=torch.arange(n),
                sequence_ids=torch.zeros(n, dtype=torch.long),
                loss_mask=mask,
                old_logprobs=-torch.rand(n, generator=generator) * 3 * mask,
                advantages=(torch.rand(n, generator=generator) - 0.5) * mask,
                weights=mask / (mask.sum() * num_rows),
                weight_versions=torch.zeros(n, dtype=torch.long),
            )
        )
    return rows


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


async def measure(mode: str, model_dir: Path, args: argparse.Namespace) -> dict:
    """One mode in this process: train ``--steps`` steps, then ``--syncs`` syncs into an embedded engine."""
    import torch
    from transformers import AutoModelForCausalLM

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.lora import LoraSettings, adapter_from_peft_model, wrap_with_lora
    from components.training.grpo import GRPO
    from components.training.step import OptimizerConfig, build_optimizer, run_train_step

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if mode == "lora":
        model = wrap_with_lora(
            model, LoraSettings(rank=args.rank, alpha=2 * args.rank, target_modules="all-linear")
        )
    optimizer_config = OptimizerConfig(learning_rate=1e-4)
    optimizer = build_optimizer(model, optimizer_config)
    batches = micro_batches(args.rows, args.tokens, args.tokens // 4, model.config.vocab_size, seed=0)
    step_s = []
    for _ in range(args.steps + 1):  # the first step warms up (allocations, AdamW state)
        started = time.perf_counter()
        run_train_step(model, optimizer, batches, GRPO(), optimizer_config=optimizer_config)
        step_s.append(time.perf_counter() - started)
    peak_mb = peak_rss_mb()

    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=model_dir, num_threads=args.threads))
    sync_s, gather_s, apply_s, sync_bytes = [], [], [], 0
    try:
        for version in range(1, args.syncs + 2):
            started = time.perf_counter()
            if mode == "lora":
                trainable = {
                    n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad
                }
                adapter = adapter_from_peft_model(model, trainable)
                gathered = time.perf_counter()
                await engine.update_adapter(adapter, version)
                sync_bytes = adapter.num_bytes
            else:
                # tied weights (embeddings = output head) travel once
                unique = {}
                for name, tensor in model.state_dict().items():
                    unique.setdefault(tensor.data_ptr(), (name, tensor))
                state_dict = {name: tensor.detach().cpu().clone() for name, tensor in unique.values()}
                gathered = time.perf_counter()
                await engine.update_weights(state_dict, version)
                sync_bytes = sum(t.numel() * t.element_size() for t in state_dict.values())
            sync_s.append(time.perf_counter() - started)
            gather_s.append(gathered - started)
            apply_s.append(time.perf_counter() - gathered)
    finally:
        await engine.aclose()
    return {
        "mode": mode,
        "step_s": statistics.median(step_s[1:]),
        "peak_mb": peak_mb,
        "sync_s": statistics.median(sync_s[1:]),
        "gather_s": statistics.median(gather_s[1:]),
        "apply_s": statistics.median(apply_s[1:]),
        "sync_bytes": sync_bytes,
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter steps (under a minute)")
    parser.add_argument("--model", default="default", help="default | tiny | an HF folder")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", choices=("full", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.steps, args.syncs, args.rows, args.tokens = (2, 2, 2, 64) if args.quick else (5, 5, 4, 256)

    from components.models.registry import resolve_model

    model_dir = resolve_model(args.model)
    if args.worker:
        print(json.dumps(asyncio.run(measure(args.worker, model_dir, args))))
        return

    results = {}
    for mode in ("full", "lora"):  # each in a fresh process: peak RSS is that mode's own
        command = [
            sys.executable,
            __file__,
            "--worker",
            mode,
            "--model",
            str(model_dir),
            "--rank",
            str(args.rank),
        ]
        command += ["--threads", str(args.threads)] + (["--quick"] if args.quick else [])
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPOSITORY, check=False)
        if done.returncode != 0:
            sys.exit(f"{mode} worker failed:\n{done.stderr[-3000:]}")
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    full, lora = results["full"], results["lora"]
    print(f"model {model_dir.name}, rank {args.rank}, {args.rows} rows x {args.tokens} tokens per step")
    print(f"{'':12s}{'full':>14s}{'lora':>14s}{'lora/full':>12s}")
    for key, unit in (
        ("trainable", ""),
        ("sync_bytes", "B"),
        ("sync_s", "s"),
        ("gather_s", "s"),
        ("apply_s", "s"),
        ("peak_mb", "MB"),
        ("step_s", "s"),
    ):
        print(
            f"{key + (' ' + unit if unit else ''):12s}{full[key]:>14.4g}{lora[key]:>14.4g}{lora[key] / full[key]:>12.4f}"
        )
    print(
        f"lora: sync bytes {100 * lora['sync_bytes'] / full['sync_bytes']:.2f}% of full, "
        f"sync time {lora['sync_s'] / full['sync_s']:.3f}x, peak memory {lora['peak_mb'] / full['peak_mb']:.2f}x, "
        f"step time {lora['step_s'] / full['step_s']:.2f}x (target <= 2%, <= 0.1x, <= 0.6x)"
    )


if __name__ == "__main__":
    main()
