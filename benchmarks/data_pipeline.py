"""Trajectory shards → packed training micro-batches: Rein's Ray pipeline vs a plain pyarrow loop.

Both run the same three functions (explode segments → plan advantages/weights → pack) over the same Parquet
shards written by ``TrajectoryStore``: the plain loop in this process, one shard after another; the Ray
pipeline reads+explodes groups of shards in parallel tasks, plans on the driver over the summary columns, packs
each block in a parallel task and wraps the packed blocks as the Ray Dataset a trainer splits per rank; the
packed rows are then pulled to the driver, as a trainer would consume them. Both sides run once untimed first
(Ray: worker processes and imports; plain: imports, allocator, page cache of the shards), then throughput =
tokens / wall time, median of ``--repeats`` alternating runs. Ray gets the machine's real cores
(``num_cpus=os.cpu_count()``).

    python benchmarks/data_pipeline.py [--quick]

Last line: ``data_pipeline: <ratio>x (target >= 0.5x)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from components.training.data import (  # noqa: E402
    SampleBatchConfig,
    build_micro_batches_locally,
    build_micro_batches_with_ray,
)
from components.training.grpo import GRPO  # noqa: E402
from components.trajectory import Segment, Trajectory, TrajectoryStatus  # noqa: E402
from components.trajectory_store import TrajectoryStore  # noqa: E402


def write_shards(run_dir: Path, *, num_shards: int, trajectories_per_shard: int, seed: int = 0) -> list[Path]:
    """Synthetic agent trajectories: 1-4 segments of 200-1200 tokens, ~30% of them sampled, groups of 8."""
    rng = np.random.default_rng(seed)
    store = TrajectoryStore(run_dir)
    paths = []
    for shard in range(num_shards):
        trajectories = []
        for index in range(trajectories_per_shard):
            segments = []
            for _ in range(int(rng.integers(1, 5))):
                length = int(rng.integers(200, 1200))
                mask = (rng.random(length) < 0.3).astype(np.int8)
                mask[0] = 0
                segments.append(
                    Segment(
                        token_ids=rng.integers(0, 49152, length),
                        loss_mask=mask,
                        logprobs=np.where(mask == 1, -rng.random(length), 0).astype(np.float32),
                        weight_versions=np.where(mask == 1, 0, -1),
                    )
                )
            failed = rng.random() < 0.05
            trajectories.append(
                Trajectory(
                    trajectory_id=f"s{shard}-t{index}",
                    group_id=f"s{shard}-g{index // 8}",
                    task_id=f"task{index // 8}",
                    harness="bench",
                    status=TrajectoryStatus.SANDBOX_ERROR if failed else TrajectoryStatus.OK,
                    failure_reason="bench failure" if failed else "",
                    reward=None if failed else float(rng.random()),
                    segments=tuple(segments),
                    messages_json="[]",
                )
            )
        paths.append(store.write(trajectories))
    return paths


def run_plain(paths: list[Path], config: SampleBatchConfig) -> tuple[float, int]:
    started = time.perf_counter()
    result = build_micro_batches_locally(paths, GRPO(), config, current_version=0)
    tokens = int(sum(result.micro_batches["num_tokens"].to_pylist()))
    return time.perf_counter() - started, tokens


def run_ray(paths: list[Path], config: SampleBatchConfig) -> tuple[float, int]:
    import pyarrow as pa
    import ray

    started = time.perf_counter()
    result = build_micro_batches_with_ray(paths, GRPO(), config, current_version=0)
    rows = pa.concat_tables(ray.get(result.dataset.to_arrow_refs()))
    tokens = int(sum(rows["num_tokens"].to_pylist()))
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small data set, 2 repeats (< 1 minute)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    num_shards, per_shard = (8, 32) if args.quick else (32, 64)
    repeats = args.repeats or (2 if args.quick else 3)

    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    config = SampleBatchConfig(max_tokens_per_micro_batch=8192)
    with tempfile.TemporaryDirectory() as run_dir:
        paths = write_shards(Path(run_dir), num_shards=num_shards, trajectories_per_shard=per_shard)
        size_mb = sum(p.stat().st_size for p in paths) / 1e6
        run_plain(paths, config)  # warm-up: imports, first allocations, the shards in the page cache
        run_ray(paths, config)  # warm-up: worker processes, imports
        plain, distributed = [], []
        for _ in range(repeats):
            seconds, plain_tokens = run_plain(paths, config)
            plain.append(plain_tokens / seconds)
            seconds, ray_tokens = run_ray(paths, config)
            distributed.append(ray_tokens / seconds)
        assert plain_tokens == ray_tokens, (plain_tokens, ray_tokens)
    ray.shutdown()
    plain_rate, ray_rate = statistics.median(plain), statistics.median(distributed)
    print(
        f"shards: {num_shards} × {per_shard} trajectories, {size_mb:.1f} MB Parquet, {plain_tokens:,} packed tokens"
    )
    print(f"cores: {os.cpu_count()}; repeats: {repeats}")
    print(f"plain pyarrow loop: {plain_rate:,.0f} tokens/s (runs: {', '.join(f'{r:,.0f}' for r in plain)})")
    print(
        f"Ray pipeline:       {ray_rate:,.0f} tokens/s (runs: {', '.join(f'{r:,.0f}' for r in distributed)})"
    )
    print(f"data_pipeline: {ray_rate / plain_rate:.2f}x (target >= 0.5x)")


if __name__ == "__main__":
    main()
