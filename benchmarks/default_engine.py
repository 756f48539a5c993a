"""Which engine finishes ``make run`` sooner here: ``python recipes/swe_grpo.py`` on its embedded defaults against
the same command with ``--engine vllm --vllm-url URL`` on a vLLM server launched for it, start-up included.

    python benchmarks/default_engine.py [--quick] [--pairs N] [--seed S]

Each pair runs both sides back to back in an order drawn per pair; a side is timed from its launch (the vLLM
server's, or the recipe's for the embedded engine) to the recipe's exit, with the same run settings (the
recipe's defaults: model, tasks, steps, group size). The server is started as users start it
(``components/engine/vllm_server.py``: ``python -m vllm.entrypoints.openai.api_server`` from ``.vllm-venv``).
``--quick``: one pair of 1-step runs. Both sides must exit 0, else the pair is reported as failed and the
benchmark exits 1.

Last line: ``default_engine: <vLLM time ÷ embedded time, median over pairs>x (target < 1.00 makes vLLM the
default)``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from components.engine.vllm_server import VLLMServerConfig, VLLMServerProcess
from components.models.registry import resolve_model

REPO = Path(__file__).resolve().parent.parent


def run_recipe(run_dir: Path, flags: list[str]) -> float:
    """Seconds from the recipe's launch to its exit (``RuntimeError`` naming its log if it fails)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    log = run_dir.with_suffix(".log")
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "recipes/swe_grpo.py", "--run-dir", str(run_dir), *flags],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(flags) or 'embedded'}: exit {done.returncode}, see {log}")
    return time.monotonic() - started


def embedded_side(work: Path, flags: list[str]) -> tuple[float, str]:
    seconds = run_recipe(work / "embedded", flags)
    return seconds, f"run {seconds:.1f} s"


def vllm_side(work: Path, flags: list[str]) -> tuple[float, str]:
    started = time.monotonic()
    server = VLLMServerProcess(
        VLLMServerConfig(model_path=resolve_model("default"), max_model_len=8192),
        log_path=work / "vllm-server.log",
    ).start()
    try:
        while True:
            try:
                if httpx.get(f"{server.url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if not server.alive():
                raise RuntimeError(f"the vLLM server exited: {server.log_tail()}")
            time.sleep(0.5)
        up = time.monotonic() - started
        seconds = run_recipe(work / "vllm", [*flags, "--engine", "vllm", "--vllm-url", server.url])
    finally:
        server.stop()
    total = time.monotonic() - started
    return total, f"server start {up:.1f} s + run {seconds:.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one pair of 1-step runs")
    parser.add_argument("--pairs", type=int, default=None, help="pairs to run (default 1; --quick: 1)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the drawn orders")
    args = parser.parse_args()
    pairs = args.pairs or 1
    flags = ["--num-steps", "1"] if args.quick else []
    chance = random.Random(args.seed)
    ratios, failed = [], 0
    with tempfile.TemporaryDirectory(prefix="rein-default-engine-") as folder:
        work = Path(folder)
        for pair in range(pairs):
            sides = [("embedded", embedded_side), ("vllm", vllm_side)]
            chance.shuffle(sides)
            times = {}
            try:
                for name, side in sides:
                    at = time.strftime("%H:%M:%S", time.gmtime())
                    times[name], detail = side(work, flags)
                    print(f"pair {pair} {name} (from {at} UTC): {times[name]:.1f} s ({detail})", flush=True)
            except RuntimeError as error:
                failed += 1
                print(f"pair {pair} failed: {error}", flush=True)
                continue
            ratios.append(times["vllm"] / times["embedded"])
    if not ratios:
        print("default_engine: no pair finished (target < 1.00 makes vLLM the default)")
        return 1
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}, " if len(ratios) > 1 else ""
    print(
        f"default_engine: {statistics.median(ratios):.2f}x ({spread}{len(ratios)} pair(s), "
        f"{'1-step' if args.quick else 'default'} runs; target < 1.00 makes vLLM the default)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
