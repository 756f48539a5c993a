"""Training throughput: Rein's Ray Train FSDP2 trainer vs a plain single-process torch loop.

Same model (a small random Llama with the SmolLM2 vocabulary), same batches of synthetic agent trajectories,
same GRPO loss, AdamW and clipping; ``--workers`` Ray Train workers with ``--threads`` torch threads each,
against one process with workers × threads threads and with one thread (the faster is the baseline). Both sides are timed
end to end per step: the plain loop builds micro-batches with pyarrow and runs the step; the trainer's
``step()`` includes its Ray Data pipeline and the command round trip to the live workers.
Throughput = tokens / wall time, median over ``--steps`` steps after one warm-up step; each step runs\nthe plain loops and the trainer back to back (the machine is shared, its load drifts).

    python benchmarks/trainer_throughput.py [--quick]

Last line: ``trainer_throughput: <ratio>x (target >= 0.9x)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from components.models.registry import default_model_dir  # noqa: E402
from components.models.tiny import build_tiny_model  # noqa: E402
from components.training.data import (  # noqa: E402
    SampleBatchConfig,
    build_micro_batches_locally,
    micro_batches_from_table,
)
from components.training.grpo import GRPO  # noqa: E402
from components.training.step import OptimizerConfig, build_optimizer, run_train_step  # noqa: E402
from components.training.trainer import Trainer, TrainerConfig  # noqa: E402
from components.trajectory import Segment, Trajectory, TrajectoryStatus  # noqa: E402


def make_batch(step: int, *, num_trajectories: int, tokens_per_segment: int) -> list[Trajectory]:
    """Groups of 8 trajectories with two segments each, half of each segment sampled."""
    rng = np.random.default_rng(step)
    out = []
    for index in range(num_trajectories):
        segments = []
        for _ in range(2):
            n = tokens_per_segment
            mask = np.array([0] * (n // 2) + [1] * (n - n // 2), dtype=np.int8)
            segments.append(
                Segment(
                    token_ids=rng.integers(0, 49152, n),
                    loss_mask=mask,
                    logprobs=np.where(mask == 1, -rng.random(n), 0).astype(np.float32),
                    weight_versions=np.where(mask == 1, step, -1),
                )
            )
        out.append(
            Trajectory(
                trajectory_id=f"s{step}-t{index}",
                group_id=f"s{step}-g{index // 8}",
                task_id="bench",
                harness="bench",
                status=TrajectoryStatus.OK,
                reward=float(rng.random()),
                segments=tuple(segments),
            )
        )
    return out


def _runs(rates: list[float]) -> str:
    return "steps: " + ", ".join(f"{rate:,.0f}" for rate in rates)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model (< 1 minute after start-up)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    hidden, layers, num_trajectories, tokens_per_segment = (
        (64, 2, 16, 256) if args.quick else (128, 4, 12, 512)
    )
    steps = args.steps or 3

    import ray
    import torch
    from transformers import AutoModelForCausalLM

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    optimizer_config = OptimizerConfig(learning_rate=1e-5)
    batching = SampleBatchConfig(max_tokens_per_micro_batch=2048)
    batches = [
        make_batch(step, num_trajectories=num_trajectories, tokens_per_segment=tokens_per_segment)
        for step in range(steps + 1)
    ]
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_tiny_model(
            Path(scratch) / "model", tokenizer_dir=default_model_dir(), hidden_size=hidden, num_layers=layers
        )
        num_parameters = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())

        ray.init(
            num_cpus=max(os.cpu_count() or 1, args.workers + 1), include_dashboard=False, log_to_driver=False
        )
        started = time.perf_counter()
        trainer = Trainer(
            TrainerConfig(
                model_path=model_dir,
                run_dir=Path(scratch) / "run",
                num_workers=args.workers,
                cpus_per_worker=1,
                torch_threads_per_worker=args.threads,
                optimizer=optimizer_config,
                batching=batching,
            ),
            algorithm=GRPO(),
        )
        start_s = time.perf_counter() - started
        # plain single-process loops, with the trainer's total number of threads and with one thread (on a
        # busy shared machine more intra-op threads can be slower; the faster is the baseline). Each step
        # runs the plain loops and then the trainer back to back, so a shift in machine load hits all alike.
        thread_counts = sorted({args.workers * args.threads, 1})
        plain_models = {}
        for threads in thread_counts:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            plain_models[threads] = (model, build_optimizer(model, optimizer_config))
        plain_by_threads: dict[int, list[float]] = {threads: [] for threads in thread_counts}
        fsdp, inner = [], []
        try:
            for step, batch in enumerate(batches):
                for threads, (model, optimizer) in plain_models.items():
                    torch.set_num_threads(threads)
                    started = time.perf_counter()
                    local = build_micro_batches_locally(batch, GRPO(), batching, current_version=step)
                    metrics = run_train_step(
                        model,
                        optimizer,
                        micro_batches_from_table(local.micro_batches),
                        GRPO(),
                        optimizer_config=optimizer_config,
                    )
                    if step > 0:
                        plain_by_threads[threads].append(
                            metrics["num_tokens"] / (time.perf_counter() - started)
                        )
                torch.set_num_threads(1)
                started = time.perf_counter()
                metrics = trainer.step(batch, current_version=step)
                if step > 0:
                    fsdp.append(metrics["train/num_tokens"] / (time.perf_counter() - started))
                    inner.append(metrics["train/tokens_per_s"])
        finally:
            trainer.shutdown()
            ray.shutdown()
        best_threads = max(plain_by_threads, key=lambda t: statistics.median(plain_by_threads[t]))
        plain = plain_by_threads[best_threads]
    plain_rate, fsdp_rate = statistics.median(plain), statistics.median(fsdp)
    print(
        f"model: {num_parameters / 1e6:.1f}M parameters (hidden {hidden}, {layers} layers, vocab 49152), fp32, CPU"
    )
    print(
        f"batch: {num_trajectories} trajectories × 2 segments × {tokens_per_segment} tokens; {steps} timed steps"
    )
    print(f"trainer: {args.workers} workers × {args.threads} thread(s); start-up (once): {start_s:.1f} s")
    for threads, rates in sorted(plain_by_threads.items()):
        print(f"plain loop, {threads} thread(s): {statistics.median(rates):,.0f} tokens/s ({_runs(rates)})")
    print(f"baseline: the plain loop with {best_threads} thread(s)")
    print(f"FSDP2 trainer, end to end: {fsdp_rate:,.0f} tokens/s ({_runs(fsdp)})")
    print(f"FSDP2 trainer, inside the workers' step: {statistics.median(inner):,.0f} tokens/s")
    print(f"trainer_throughput: {fsdp_rate / plain_rate:.2f}x (target >= 0.9x)")


if __name__ == "__main__":
    main()
