"""Rollout throughput of the rollout runner: one rollout at a time vs many at once.

Every rollout is the full path: a warm bubblewrap sandbox → a proxy session (real HTTP) → the white-box coding
agent driven by a scripted policy (ScriptedEngine: no model cost) that solves a built-in task in six tool calls
→ tamper-proof grading in a fresh sandbox (hidden tests, pytest) → finalized trajectory. The same batch of
rollouts runs with ``max_concurrency=1`` and with ``max_concurrency=N``, alternately, ``--repeats`` times; the
medians are compared. Every rollout must earn reward 1 (else the run is invalid).

    python benchmarks/rollout_concurrency.py [--quick] [--concurrency 8] [--num-rollouts 16]

Last line: ``rollout_concurrency: <ratio>x (target >= 1.5x)``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from components.engine.scripted import ScriptedEngine  # noqa: E402
from components.engine.scripted_policies import fixing_policy  # noqa: E402
from components.models.registry import default_model_dir  # noqa: E402
from components.proxy.config import ProxyConfig  # noqa: E402
from components.proxy.server import ProxyServer  # noqa: E402
from components.proxy.sessions import LocalSessionRegistry  # noqa: E402
from components.rollout import RolloutConfig, RolloutRunner  # noqa: E402
from components.tasks.builtin import load_builtin_tasks  # noqa: E402
from components.tasks.grading import SweGrader  # noqa: E402
from components.tasks.swe import python_tool_paths  # noqa: E402
from harnesses.swe_agent import SweAgentConfig, SweAgentHarness  # noqa: E402
from sandboxes.bwrap import BwrapSandbox  # noqa: E402
from sandboxes.pool import SandboxPool, SandboxPoolConfig  # noqa: E402


async def measure(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    tasks = load_builtin_tasks(cache_dir=Path(tempfile.mkdtemp(prefix="rein-bench-tasks-")))[: args.num_tasks]
    policies = {task.task_id: fixing_policy(task) for task in tasks}

    def policy(prompt: str) -> str:  # route by the task statement in the prompt
        task_id = next(t.task_id for t in tasks if t.problem_statement in prompt)
        return policies[task_id](prompt)

    config = ProxyConfig(port=0)
    registry = LocalSessionRegistry(ScriptedEngine(tokenizer, policy), tokenizer, config)
    server = ProxyServer(registry, config)
    await server.start()
    pool = SandboxPool(SandboxPoolConfig(num_warm=args.concurrency, read_only_paths=python_tool_paths()))
    await pool.start()
    group_size = args.num_rollouts // len(tasks)
    serial: list[float] = []
    concurrent: list[float] = []
    try:
        for repeat in range(args.repeats):
            for concurrency, times in ((1, serial), (args.concurrency, concurrent)):
                runner = RolloutRunner(
                    RolloutConfig(group_size=group_size, max_concurrency=concurrency),
                    harness=SweAgentHarness(SweAgentConfig(max_turns=10)),
                    sandboxes=pool,
                    sessions=registry,
                    proxy_url=server.url,
                    grader=SweGrader(BwrapSandbox.create),
                    session_keys=config.session_keys,  # closed proxy: each agent gets its session's token
                )
                started = time.perf_counter()
                trajectories = await runner.run(tasks, step=repeat)
                elapsed = time.perf_counter() - started
                bad = [t for t in trajectories if t.reward != 1.0]
                if bad:
                    raise SystemExit(f"invalid run: {bad[0].task_id} {bad[0].status} {bad[0].failure_reason}")
                rate = len(trajectories) / elapsed * 60
                times.append(rate)
                print(
                    f"repeat {repeat}: concurrency {concurrency:2d}: {len(trajectories)} rollouts in "
                    f"{elapsed:.1f} s = {rate:.1f} rollouts/min",
                    flush=True,
                )
    finally:
        await pool.close()
        await server.stop()
    return serial, concurrent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 rollouts, 1 repeat (< 1 minute)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num-rollouts", type=int, default=16)
    parser.add_argument("--num-tasks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.num_rollouts, args.repeats = 8, 1
    serial, concurrent = asyncio.run(measure(args))
    serial_rate, concurrent_rate = statistics.median(serial), statistics.median(concurrent)
    print(
        f"median rollouts/min: concurrency 1 = {serial_rate:.1f}, concurrency {args.concurrency} = "
        f"{concurrent_rate:.1f} (machine: {os.cpu_count()} CPUs)"
    )
    print(f"rollout_concurrency: {concurrent_rate / serial_rate:.2f}x (target >= 1.5x)")


if __name__ == "__main__":
    main()
