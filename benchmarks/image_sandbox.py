"""Image sandboxes (an OCI image's root filesystem as ``/``) side by side with host-root bwrap sandboxes.

  * first unpack: ``ImageCache.unpack`` of the test image into an empty cache (``umoci unpack``), once per
    run; the docker-archive form (``skopeo copy`` to an OCI layout first) too.
  * cold bwrap true: bubblewrap building the sandbox's full namespace + mount layout and running ``true``
    (``run_once_cold``), host root vs the cached image root.
  * sandbox start (the cold start): ``BwrapSandbox.start_generic`` — bwrap + the supervisor answering.
  * pooled acquire (warm): ``ImageSandboxProvider.acquire`` / ``SandboxPool.acquire`` with a warm sandbox.
  * writable layer: copying a repository into the sandbox's tmpfs workspace (what image sandboxes do) vs
    mounting fuse-overlayfs over the cached root filesystem and unmounting it (the alternative not taken).

Needs the test image (``make setup-test`` builds ``.images/rein-py-env``). Usage: ``python
benchmarks/image_sandbox.py [--quick]``; the last line is the summary against the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.bwrap import BwrapSandbox, BwrapSandboxConfig, run_once_cold
from sandboxes.image import ImageCache, ImageSandboxConfig, ImageSandboxProvider, image_bwrap_config
from sandboxes.pool import SandboxPool, SandboxPoolConfig

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / ".images" / "rein-py-env"
IMAGE = f"oci:{LAYOUT}:latest"
ARCHIVE = f"docker-archive:{ROOT / '.images' / 'rein-py-env.tar'}"


async def start_time(config: BwrapSandboxConfig) -> float:
    start = time.perf_counter()
    sandbox = await BwrapSandbox.start_generic(config, workspace_mb=64)
    elapsed = time.perf_counter() - start
    await sandbox.close()
    return elapsed


async def acquire_times(acquire, release, num_warm_of, num_runs: int) -> list[float]:
    times = []
    for _ in range(num_runs):
        while num_warm_of() == 0:
            await asyncio.sleep(0.005)
        start = time.perf_counter()
        sandbox = await acquire()
        times.append(time.perf_counter() - start)
        await release(sandbox)
    return times


async def copy_in_time(config: BwrapSandboxConfig, repo: Path) -> float:
    sandbox = await BwrapSandbox.start_generic(config, workspace_mb=64)
    try:
        start = time.perf_counter()
        await sandbox.prepare(SandboxSpec(workspace_source=repo, root_image=IMAGE))
        await sandbox.exec("true")
        return time.perf_counter() - start
    finally:
        await sandbox.close()


def overlay_time(rootfs: Path) -> float:
    scratch = Path(tempfile.mkdtemp(prefix="rein-overlay-"))
    upper, work, merged = scratch / "upper", scratch / "work", scratch / "merged"
    for directory in (upper, work, merged):
        directory.mkdir()
    start = time.perf_counter()
    overlay = ["fuse-overlayfs", "-o", f"lowerdir={rootfs},upperdir={upper},workdir={work}", str(merged)]
    subprocess.run(overlay, check=True, capture_output=True)
    subprocess.run(["fusermount", "-u", str(merged)], check=True, capture_output=True)
    elapsed = time.perf_counter() - start
    shutil.rmtree(scratch, ignore_errors=True)
    return elapsed


async def main(quick: bool) -> None:
    if not (LAYOUT / "index.json").is_file():
        raise SystemExit(f"no test image at {LAYOUT}: run `make setup-test` first")
    num_runs = 20 if quick else 100
    num_starts = 8 if quick else 40
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rein-image-bench-") as scratch:
        cache = ImageCache(Path(scratch) / "cache")
        start = time.perf_counter()
        unpacked = cache.unpack(IMAGE)
        rows["first unpack (oci)"] = [time.perf_counter() - start]
        if not quick:
            start = time.perf_counter()
            cache.unpack(ARCHIVE)
            rows["first unpack (archive)"] = [time.perf_counter() - start]
        host = BwrapSandboxConfig()
        image = image_bwrap_config(unpacked, base=host)
        for _ in range(3):  # page cache
            await run_once_cold(host)
            await run_once_cold(image)
        rows["host: cold bwrap true"] = [await run_once_cold(host) for _ in range(num_runs)]
        rows["image: cold bwrap true"] = [await run_once_cold(image) for _ in range(num_runs)]
        rows["host: sandbox start"] = [await start_time(host) for _ in range(num_starts)]
        rows["image: sandbox start"] = [await start_time(image) for _ in range(num_starts)]
        repo = ROOT / "components" / "tasks" / "builtin" / "minilib"
        rows["image: copy repo in"] = [await copy_in_time(image, repo) for _ in range(num_starts)]
        rows["fuse-overlayfs mount"] = [overlay_time(unpacked.rootfs) for _ in range(num_starts)]
        host_spec = SandboxSpec(limits=SandboxLimits(workspace_mb=64))
        async with SandboxPool(SandboxPoolConfig(num_warm=2, workspace_mb=64, bwrap=host)) as pool:
            rows["host: pooled acquire"] = await acquire_times(
                lambda: pool.acquire(host_spec), pool.release, lambda: pool.num_warm, num_runs
            )
        image_spec = SandboxSpec(limits=SandboxLimits(workspace_mb=64), root_image=IMAGE)
        config = ImageSandboxConfig(cache_dir=Path(scratch) / "cache", num_warm_per_image=2, workspace_mb=64)
        async with ImageSandboxProvider(config, cache=cache) as provider:
            image_pool = await provider.pool_for(IMAGE)
            await image_pool.start()
            rows["image: pooled acquire"] = await acquire_times(
                lambda: provider.acquire(image_spec), provider.release, lambda: image_pool.num_warm, num_runs
            )
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"{'what':<24} {'median ms':>10} {'p90 ms':>10} {'runs':>6}")
    medians = {}
    for name, times in rows.items():
        times_ms = sorted(t * 1000 for t in times)
        medians[name] = statistics.median(times_ms)
        p90 = times_ms[int(0.9 * (len(times_ms) - 1))]
        print(f"{name:<24} {medians[name]:>10.3f} {p90:>10.3f} {len(times_ms):>6}")
    cold, host_cold = medians["image: sandbox start"], medians["host: sandbox start"]
    print(
        f"image_sandbox: cold start {cold:.1f} ms ({cold / host_cold:.2f}x host {host_cold:.1f} ms), acquire "
        f"{medians['image: pooled acquire']:.3f} ms, first unpack {medians['first unpack (oci)'] / 1000:.1f} s "
        "(target cold <= 100 ms and <= 5x host, acquire <= 1 ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (< 1 minute)")
    asyncio.run(main(parser.parse_args().quick))
