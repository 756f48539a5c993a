"""LoRA vs full fine-tuning, side by side in one run: bytes per weight sync, sync wall time, trainer peak memory,
step time.

Both modes live in their own worker process for the whole run, forked from the parent after the heavy imports
(torch, transformers, peft: imported once), each with its peak RSS (``VmHWM``) reset when it starts, so each
peak is that mode's own (the shared imported code counts in both, as in any process), on the same model and the same packed micro-batches (GRPO loss, ``run_train_step``: the trainer's own step, fp32,
AdamW over the trainable parameters):
- ``full``: every weight trained; a sync copies the whole state dict out of the model and loads it into an
  embedded engine (``update_weights``).
- ``lora``: peft LoRA (default rank 8 with alpha 16 on every linear layer of the blocks, attention + MLP: the
  configuration ART trains with by default and what peft's ``all-linear`` gives); a sync copies only the
  adapter's tensors out and applies them in place (``update_adapter``): the base never moves.

Method: the parent drives both workers over pipes, one request at a time, in pairs (one full, one LoRA) whose
order is drawn at random per pair (seeded), so the two modes see the same load; the idle worker waits on its
pipe. First training steps (one warm-up step each, then ``--pairs`` step pairs), then each worker reports its
peak RSS (the trainer's: no engine exists yet), then each builds an embedded engine (same model, same threads)
and the syncs run the same way (one warm-up sync each, then ``--sync-pairs`` pairs). Every figure is the
median of the per-pair ratios (LoRA / full), with the range [min-max] over the pairs; the per-mode medians are
printed beside them. A sync is split into ``gather_s`` (copy the trained tensors out of the trainer's model,
for LoRA renamed to saved-adapter keys) and ``apply_s`` (the engine: wait for the scheduler's next step, copy
the tensors in, stamp the version, empty the prefix cache).

``--gradient-checkpointing`` turns activation recomputation on for both modes (off by default);
``--malloc-mmap-threshold BYTES`` fixes glibc's mmap threshold in both workers (``mallopt``): by default glibc
raises it as large blocks are freed, after which freed activations stay in the heap, so the peak RSS also holds
memory the trainer no longer uses.

    python benchmarks/lora.py [--quick] [--model default|tiny|PATH] [--rank 8] [--gradient-checkpointing]

Last line: ``lora: sync bytes <a>% of full, sync time <b>x, peak memory <c>x, step time <d>x
(target <= 2%, <= 0.1x, <= 0.6x)``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

MODES = ("full", "lora")


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


class Worker:
    """One mode in this process: its model, optimizer and (after the steps) engine; one request at a time."""

    def __init__(self, mode: str, model_dir: Path, args: argparse.Namespace) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from components.lora import AdapterGatherer, LoraSettings, wrap_with_lora
        from components.training.step import OptimizerConfig, build_optimizer

        torch.set_num_threads(args.threads)
        self.mode, self.model_dir, self.args = mode, model_dir, args
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if mode == "lora":
            settings = LoraSettings(rank=args.rank, alpha=2 * args.rank, target_modules="all-linear")
            model = wrap_with_lora(model, settings)
        self.model = model
        self.optimizer_config = OptimizerConfig(learning_rate=1e-4)
        self.optimizer = build_optimizer(model, self.optimizer_config)
        self.batches = micro_batches(
            args.rows, args.tokens, args.tokens // 4, model.config.vocab_size, seed=0
        )
        self.engine = None
        self.version = 0
        if mode == "lora":  # what the sync copies, found once (the trainer's gather)
            self.gatherer = AdapterGatherer(model)
        else:  # tied weights (embeddings = output head) travel once
            unique = {}
            for name, tensor in model.state_dict().items():
                unique.setdefault(tensor.data_ptr(), (name, tensor))
            self.full_tensors = list(unique.values())

    def step(self) -> dict:
        from components.training.grpo import GRPO
        from components.training.step import run_train_step

        started = time.perf_counter()
        run_train_step(
            self.model, self.optimizer, self.batches, GRPO(), optimizer_config=self.optimizer_config
        )
        return {"step_s": time.perf_counter() - started}

    def peak(self) -> dict:
        return {
            "peak_mb": peak_rss_mb(),
            "trainable": sum(p.numel() for p in self.model.parameters() if p.requires_grad),
        }

    def start_engine(self) -> dict:
        from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
        from components.engine.providers import EmbeddedEngineBrickConfig

        self.engine = EmbeddedEngine(
            EmbeddedEngineConfig(
                model_path=self.model_dir, settings=EmbeddedEngineBrickConfig(threads=self.args.threads)
            )
        )
        return {}

    async def sync(self) -> dict:
        self.version += 1
        started = time.perf_counter()
        if self.mode == "lora":
            adapter = self.gatherer.gather()
            gathered = time.perf_counter()
            await self.engine.update_adapter(adapter, self.version)
            sync_bytes = adapter.num_bytes
        else:
            state_dict = {name: tensor.detach().clone() for name, tensor in self.full_tensors}
            gathered = time.perf_counter()
            await self.engine.update_weights(state_dict, self.version)
            sync_bytes = sum(t.numel() * t.element_size() for t in state_dict.values())
        done = time.perf_counter()
        return {
            "sync_s": done - started,
            "gather_s": gathered - started,
            "apply_s": done - gathered,
            "sync_bytes": sync_bytes,
        }

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def serve_worker(mode: str, model_dir: Path, args: argparse.Namespace, channel: Connection) -> None:
    """Answer the parent's requests on ``channel`` until ``quit`` (runs in a forked child)."""
    reset_peak_rss()  # the peak from here on is this mode's own (the imports it shares with its parent count)
    if args.malloc_mmap_threshold:
        set_mmap_threshold(args.malloc_mmap_threshold)
    worker = Worker(mode, model_dir, args)
    loop = asyncio.new_event_loop()
    handlers = {
        "step": worker.step,
        "peak": worker.peak,
        "engine": worker.start_engine,
        "sync": lambda: loop.run_until_complete(worker.sync()),
    }
    channel.send({"ready": True})
    while (request := channel.recv()) != "quit":
        channel.send(handlers[request]())
    worker.close()
    loop.close()


def reset_peak_rss() -> None:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``) since the last ``reset_peak_rss``."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise OSError("no VmHWM in /proc/self/status")


def set_mmap_threshold(num_bytes: int) -> None:
    """glibc's ``mallopt(M_MMAP_THRESHOLD)``: blocks from this size are mmapped and returned on free (fixing it
    also stops glibc from raising the threshold as large blocks are freed)."""
    import ctypes

    m_mmap_threshold = -3
    if ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, num_bytes) != 1:
        raise OSError(f"mallopt(M_MMAP_THRESHOLD, {num_bytes}) failed")


class WorkerProcess:
    """The parent's end of one worker: a child forked after the heavy imports (torch, transformers, peft,
    the engine), so both workers start without importing them again."""

    def __init__(self, mode: str, model_dir: Path, args: argparse.Namespace) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self.mode = mode
        self.channel, child_end = context.Pipe()
        self.process = context.Process(
            target=serve_worker, args=(mode, model_dir, args, child_end), daemon=True
        )
        self.process.start()
        child_end.close()

    def ask(self, request: str | None) -> dict:
        """Send ``request`` (None: only wait for the next reply) and return the worker's reply."""
        if request is not None:
            self.channel.send(request)
        try:
            return self.channel.recv()
        except EOFError:
            self.process.join()
            sys.exit(f"{self.mode} worker died (exit {self.process.exitcode}); see its stderr above")

    def close(self) -> None:
        if self.process.is_alive():
            self.channel.send("quit")
            self.process.join(timeout=60)


def import_heavy_modules() -> None:
    """What both workers need, imported once in the parent before they are forked (no torch thread starts)."""
    import peft  # noqa: F401
    import transformers  # noqa: F401

    import components.engine.embedded  # noqa: F401
    import components.training.grpo  # noqa: F401
    import components.training.step  # noqa: F401


def run_pairs(
    workers: dict[str, WorkerProcess], request: str, num_pairs: int, rng: random.Random
) -> list[dict]:
    """One warm-up request each, then ``num_pairs`` pairs in a random order per pair: ``{mode: reply}`` each."""
    for worker in workers.values():
        worker.ask(request)
    pairs = []
    for _ in range(num_pairs):
        order = rng.sample(MODES, 2)
        pairs.append({mode: workers[mode].ask(request) for mode in order})
    return pairs


def summary(pairs: list[dict], key: str) -> dict:
    """Per-mode medians and the median, min and max of the per-pair ratio LoRA / full."""
    ratios = [pair["lora"][key] / pair["full"][key] for pair in pairs]
    return {
        "full": statistics.median(pair["full"][key] for pair in pairs),
        "lora": statistics.median(pair["lora"][key] for pair in pairs),
        "ratio": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model, short steps (under a minute)")
    parser.add_argument(
        "--model", default=None, help="default | tiny | an HF folder (default: default, tiny with --quick)"
    )
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument(
        "--rows", type=int, default=None, help="rows (micro-batches) per step (4; 2 with --quick)"
    )
    parser.add_argument("--tokens", type=int, default=None, help="tokens per row (256; 64 with --quick)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads per worker (2; 1 with --quick)"
    )
    parser.add_argument("--pairs", type=int, default=None, help="step pairs (default 5, 2 with --quick)")
    parser.add_argument(
        "--sync-pairs", type=int, default=None, help="sync pairs (default 30, 5 with --quick)"
    )
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="recompute activations (both modes)"
    )
    parser.add_argument("--seed", type=int, default=0, help="draws the order of each pair")
    parser.add_argument(
        "--malloc-mmap-threshold",
        type=int,
        default=0,
        help="both workers: glibc's MALLOC_MMAP_THRESHOLD_ in bytes (0: glibc's default, a threshold that grows)",
    )
    args = parser.parse_args()
    args.rows = args.rows or (2 if args.quick else 4)
    args.tokens = args.tokens or (64 if args.quick else 256)
    args.threads = args.threads or (1 if args.quick else 2)
    args.pairs = args.pairs or (2 if args.quick else 5)
    args.sync_pairs = args.sync_pairs or (5 if args.quick else 30)

    from components.models.registry import resolve_model

    model_dir = resolve_model(args.model or ("tiny" if args.quick else "default"))
    started = time.perf_counter()
    import_heavy_modules()
    rng = random.Random(args.seed)
    phases = [("start", started), ("imports", time.perf_counter())]
    workers = {mode: WorkerProcess(mode, model_dir, args) for mode in MODES}  # both load at once
    try:
        for worker in workers.values():
            worker.ask(None)  # ready
        phases.append(("load", time.perf_counter()))
        steps = run_pairs(workers, "step", args.pairs, rng)
        # the trainer's peak: no engine exists yet
        peaks = {mode: worker.ask("peak") for mode, worker in workers.items()}
        phases.append(("steps", time.perf_counter()))
        for worker in workers.values():  # both engines load at once
            worker.channel.send("engine")
        for worker in workers.values():
            worker.ask(None)
        phases.append(("engines", time.perf_counter()))
        syncs = run_pairs(workers, "sync", args.sync_pairs, rng)
        phases.append(("syncs", time.perf_counter()))
    finally:
        for worker in workers.values():
            worker.close()

    full_bytes, lora_bytes = syncs[-1]["full"]["sync_bytes"], syncs[-1]["lora"]["sync_bytes"]
    peak = {"full": peaks["full"]["peak_mb"], "lora": peaks["lora"]["peak_mb"]}
    rows = {key: summary(syncs, key) for key in ("sync_s", "gather_s", "apply_s")}
    rows["step_s"] = summary(steps, "step_s")
    checkpointing = ", gradient checkpointing" if args.gradient_checkpointing else ""
    if args.malloc_mmap_threshold:
        checkpointing += f", MALLOC_MMAP_THRESHOLD_={args.malloc_mmap_threshold}"
    print(
        f"model {model_dir.name}, rank {args.rank}, {args.rows} rows x {args.tokens} tokens per step{checkpointing}; "
        f"{args.pairs} step pairs, {args.sync_pairs} sync pairs (order random per pair, seed {args.seed})"
    )
    timings = (f"{name} {end - start:.1f} s" for (_, start), (name, end) in itertools.pairwise(phases))
    print("wall time: " + ", ".join(timings))
    print(f"{'':14s}{'full':>12s}{'lora':>12s}{'lora/full':>11s}  range over pairs")
    print(
        f"{'trainable':14s}{peaks['full']['trainable']:>12.4g}{peaks['lora']['trainable']:>12.4g}"
        f"{peaks['lora']['trainable'] / peaks['full']['trainable']:>11.4f}"
    )
    print(f"{'sync_bytes B':14s}{full_bytes:>12.4g}{lora_bytes:>12.4g}{lora_bytes / full_bytes:>11.4f}")
    print(f"{'peak_mb MB':14s}{peak['full']:>12.4g}{peak['lora']:>12.4g}{peak['lora'] / peak['full']:>11.4f}")
    for key, row in rows.items():
        print(
            f"{key + ' s':14s}{row['full']:>12.4g}{row['lora']:>12.4g}{row['ratio']:>11.4f}"
            f"  [{row['min']:.4f}-{row['max']:.4f}]"
        )
    print(
        f"lora: sync bytes {100 * lora_bytes / full_bytes:.2f}% of full, "
        f"sync time {rows['sync_s']['ratio']:.3f}x, peak memory {peak['lora'] / peak['full']:.2f}x, "
        f"step time {rows['step_s']['ratio']:.2f}x (target <= 2%, <= 0.1x, <= 0.6x)"
    )


if __name__ == "__main__":
    main()
