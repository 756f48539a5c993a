"""Prefix cache of the embedded engine: one agent session, per-turn latency with and without the cache.

An agent turn re-sends the whole conversation. The session here starts with a system prompt and a task, then
for each turn the model writes a reply of ``--new-tokens`` tokens (greedy, EOS disabled, so both sides do the
same work) and a tool result of about ``--tool-tokens`` tokens (real text: this repository's source files) is
appended, ChatML-framed, ids concatenated without re-encoding. At 20 turns the history passes 6k tokens.

Two engines over the same model, in one process: one with the prefix cache (``kv_cache_gb=4``), one without
(``kv_cache_gb=0``). Turns alternate between them (which goes first alternates too, since the machine is
shared). Both must produce the same tokens with logprobs within 1e-5, which the run checks.

    python benchmarks/prefix_cache.py [--quick] [--turns 20] [--model default|tiny|PATH]

Last line: ``prefix_cache: <x>x less total time, turn-N latency <y>x turn-2 (target >= 4x, <= 2x)``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from pathlib import Path

import numpy as np

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.providers import EmbeddedEngineBrickConfig
from components.models.registry import resolve_model
from components.protocols import SamplingParams

REPOSITORY = Path(__file__).resolve().parents[1]


def tool_results(tokenizer, num_turns: int, tool_tokens: int) -> list[list[int]]:
    """One tool result per turn: consecutive ~``tool_tokens``-token slices of this repository's Python files."""
    text = "\n".join(path.read_text() for path in sorted((REPOSITORY / "components").rglob("*.py")))
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) >= num_turns * tool_tokens, "not enough source text for the tool results"
    return [ids[turn * tool_tokens : (turn + 1) * tool_tokens] for turn in range(num_turns)]


def chatml(tokenizer, role: str, text: str, *, open_assistant: bool = False) -> list[int]:
    framed = f"<|im_start|>{role}\n{text}<|im_end|>\n" + ("<|im_start|>assistant\n" if open_assistant else "")
    return tokenizer.encode(framed, add_special_tokens=False)


async def run_turn(engine: EmbeddedEngine, history: list[int], new_tokens: int):
    """One turn: its result, wall time and CPU time (every thread of this process: the engine's scheduler
    thread and torch's intra-op threads; the other engine is idle meanwhile)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    result = await engine.generate(history, SamplingParams(max_tokens=new_tokens, temperature=0.0))
    return result, time.perf_counter() - start, time.process_time() - start_cpu


async def run_session(
    model_dir: Path, turns: int, new_tokens: int, tool_tokens: int, threads: int, cached_only: bool = False
) -> dict:
    settings = EmbeddedEngineBrickConfig(threads=threads, max_batch_size=1, kv_cache_gb=4.0)
    common = {"model_path": model_dir, "eos_token_ids": ()}
    cached = EmbeddedEngine(EmbeddedEngineConfig(**common, settings=settings))
    no_cache = dataclasses.replace(settings, kv_cache_gb=0.0)
    cold = None if cached_only else EmbeddedEngine(EmbeddedEngineConfig(**common, settings=no_cache))
    engines = {"cached": cached} if cold is None else {"cached": cached, "cold": cold}
    tokenizer = cached.tokenizer
    system = chatml(tokenizer, "system", "You are a coding agent. Use the tools to read files, then answer.")
    task = chatml(
        tokenizer, "user", "Explain how the embedded engine schedules requests.", open_assistant=True
    )
    results = tool_results(tokenizer, turns, tool_tokens)
    end_of_tool = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    tool_header = tokenizer.encode("<|im_end|>\n<|im_start|>tool\n", add_special_tokens=False)
    try:
        for engine in engines.values():  # warm-up: first forward passes allocate and pick kernels
            await engine.generate(system[:16], SamplingParams(max_tokens=4, temperature=0.0))
        history = system + task
        latencies: dict[str, list[float]] = {name: [] for name in engines}
        cpu_times: dict[str, list[float]] = {name: [] for name in engines}
        max_logprob_gap = 0.0
        for turn in range(turns):
            order = list(engines.items())
            if turn % 2:
                order.reverse()
            outputs = {}
            for name, engine in order:
                outputs[name], elapsed, cpu = await run_turn(engine, history, new_tokens)
                latencies[name].append(elapsed)
                cpu_times[name].append(cpu)
            if cold is not None:
                if outputs["cached"].output_ids != outputs["cold"].output_ids:
                    raise AssertionError(
                        f"turn {turn + 1}: the cached run sampled other tokens than the cold run"
                    )
                gap = np.max(np.abs(np.subtract(outputs["cached"].logprobs, outputs["cold"].logprobs)))
                max_logprob_gap = max(max_logprob_gap, float(gap))
            sides = ", ".join(
                f"{name} {latencies[name][-1]:6.2f} s (cpu {cpu_times[name][-1]:6.2f} s)" for name in engines
            )
            print(f"turn {turn + 1:2d}: prompt {len(history):5d} tokens, {sides}", flush=True)
            # The reply (its last token is the pending one, EOS disabled) then the tool result, ids as-is.
            history = history + list(outputs["cached"].output_ids) + tool_header + results[turn] + end_of_tool
        return {
            "latencies": latencies,
            "cpu_times": cpu_times,
            "max_logprob_gap": max_logprob_gap,
            "stats": cached.stats(),
            "final_prompt": len(history) - len(results[-1]) - len(tool_header) - len(end_of_tool),
        }
    finally:
        for engine in engines.values():
            engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="6 shorter turns (< 1 minute on an idle machine)"
    )
    parser.add_argument("--model", default="default", help="'default', 'tiny' or an HF folder")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None, help="reply tokens per turn")
    parser.add_argument("--tool-tokens", type=int, default=None, help="tool-result tokens per turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--cached-only",
        action="store_true",
        help="only the cached side (profiling: per-turn wall and CPU time)",
    )
    args = parser.parse_args()
    turns = args.turns or (6 if args.quick else 20)
    new_tokens = args.new_tokens or (8 if args.quick else 24)
    tool_tokens = args.tool_tokens or (100 if args.quick else 300)
    model_dir = resolve_model(args.model)
    print(
        f"model {model_dir.name}, {turns} turns, {new_tokens} reply tokens + {tool_tokens} tool tokens per turn, "
        f"{args.threads} threads"
    )
    run = asyncio.run(
        run_session(model_dir, turns, new_tokens, tool_tokens, args.threads, cached_only=args.cached_only)
    )
    cached, cached_cpu = run["latencies"]["cached"], run["cpu_times"]["cached"]
    growth = cached[-1] / cached[1]
    growth_cpu = cached_cpu[-1] / cached_cpu[1]
    stats = run["stats"]
    cache_line = (
        f"cache: {stats['prefix_cache_hits']} hits, {stats['prefix_cache_reused_tokens']} reused tokens, "
        f"{stats['prefix_cache_bytes'] / 2**20:.0f} MiB held"
    )
    if args.cached_only:
        print(
            f"total: cached {sum(cached):.1f} s (cpu {sum(cached_cpu):.1f} s); last prompt {run['final_prompt']} "
            f"tokens; turn {turns} / turn 2: wall {growth:.2f}x, cpu {growth_cpu:.2f}x"
        )
        print(cache_line)
        print(f"prefix_cache: cached side only, turn-{turns} latency {growth:.2f}x turn-2 (target <= 2x)")
        return
    cold, cold_cpu = run["latencies"]["cold"], run["cpu_times"]["cold"]
    speedup = sum(cold) / sum(cached)
    print(
        f"total: cached {sum(cached):.1f} s, cold {sum(cold):.1f} s; last prompt {run['final_prompt']} tokens; "
        f"turn {turns} / turn 2 latency: cached {growth:.2f}x, cold {cold[-1] / cold[1]:.2f}x"
    )
    print(
        f"cpu time: cached {sum(cached_cpu):.1f} s, cold {sum(cold_cpu):.1f} s -> {sum(cold_cpu) / sum(cached_cpu):.2f}x "
        f"less; turn {turns} / turn 2: cached {growth_cpu:.2f}x"
    )
    print(f"{cache_line}; max |logprob cached - cold| {run['max_logprob_gap']:.2e}")
    print(
        f"prefix_cache: {speedup:.2f}x less total time, turn-{turns} latency {growth:.2f}x turn-2 "
        f"(target >= 4x, <= 2x)"
    )


if __name__ == "__main__":
    main()
