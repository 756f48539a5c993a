"""The embedded engine vs a real vLLM server on this machine: same model, prompts, sampling and thread count.

    python benchmarks/engines.py [--quick] [--vllm-url http://127.0.0.1:8000] [--model default]

Figures, each engine warmed up, then measured alternately in pairs whose order is drawn per pair (the machine is
shared); each figure is the median over the pairs with its min-max spread:
tokens/s at batch 1 and batch 8 (exactly ``--new-tokens`` sampled tokens per request on both engines: the embedded
engine runs without EOS ids and vLLM with ``ignore_eos``, so neither stops early; prefill included), and a 20-turn
agent session's total time (16 tokens per turn on both) (each turn's prompt = the previous prompt + its output + a
new user message, so both engines serve it from their prefix cache). Start-up is measured too (the engine's
model load; the vLLM server's launch to ``/health``), reported beside the figures, not inside them. Without
``--vllm-url`` a server is started as users do (``components/engine/vllm_server.py``, fp32, one thread, like the
embedded engine). ``--quick``: 1 pair, 32 new tokens, 5 turns (plus the server's start-up when it starts one).

Last line: ``engines: <vLLM tok/s ÷ embedded tok/s at batch 8>x (target reported)``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.vllm import VLLMEngine, VLLMEngineConfig
from components.engine.vllm_server import VLLMServerConfig, VLLMServerProcess
from components.models.registry import resolve_model
from components.protocols import SamplingParams

TOPICS = ["a cat", "the sea", "a robot", "winter", "a city at night", "a garden", "an old clock", "a train"]


def chat_prompt(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


class FixedLengthVLLMEngine(VLLMEngine):
    """vLLM sampling past EOS (``ignore_eos``), as the embedded engine does without EOS ids: both engines then
    produce exactly ``max_tokens`` per request, so their tokens/s count the same work."""

    def generate_payload(self, prompt, params, *, model=None):
        payload = super().generate_payload(prompt, params, model=model)
        payload["sampling_params"]["ignore_eos"] = True
        return payload


def embedded_engine(model_path) -> EmbeddedEngine:
    """The embedded engine as measured: one thread, batches of 8, no EOS ids (it samples ``max_tokens``)."""
    return EmbeddedEngine(EmbeddedEngineConfig(model_path=model_path, eos_token_ids=()))


def same_length(results, new_tokens: int) -> int:
    """The tokens of ``results``, each exactly ``new_tokens`` long (else ``ValueError``: the engines would be
    compared on different work)."""
    lengths = [len(result.output_ids) for result in results]
    if any(length != new_tokens for length in lengths):
        raise ValueError(
            f"an engine stopped early or ran long: {lengths} tokens, {new_tokens} asked for each"
        )
    return sum(lengths)


async def tokens_per_s(engine, prompts: list[list[int]], new_tokens: int, seed: int) -> float:
    params = [SamplingParams(max_tokens=new_tokens, seed=seed + i) for i in range(len(prompts))]
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, q) for p, q in zip(prompts, params, strict=True)))
    elapsed_s = time.perf_counter() - started
    return same_length(results, new_tokens) / elapsed_s


async def agent_session_s(engine, tokenizer, num_turns: int, new_tokens: int, seed: int) -> float:
    prompt = chat_prompt(tokenizer, "You are an agent. Explore the repository step by step.")
    started = time.perf_counter()
    for turn in range(num_turns):
        result = await engine.generate(prompt, SamplingParams(max_tokens=new_tokens, seed=seed + turn))
        same_length([result], new_tokens)
        follow_up = tokenizer.encode(f"\nObservation {turn}: ok. Next step?\n", add_special_tokens=False)
        prompt = prompt + list(result.output_ids) + follow_up
    return time.perf_counter() - started


async def measure(engine, tokenizer, args, seed: int) -> dict[str, float]:
    prompts = [chat_prompt(tokenizer, f"Write a short story about {topic}.") for topic in TOPICS]
    return {
        "batch1_tok_s": await tokens_per_s(engine, prompts[:1], args.new_tokens, seed),
        "batch8_tok_s": await tokens_per_s(engine, prompts, args.new_tokens, seed),
        "session_s": await agent_session_s(engine, tokenizer, args.num_turns, 16, seed),
    }


def spread(runs: list[dict[str, float]], key: str) -> str:
    """``median (min-max)`` of ``key`` over the runs."""
    values = [run[key] for run in runs]
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


async def main_async(args) -> None:
    model_path = resolve_model(args.model)
    started = time.perf_counter()
    embedded = embedded_engine(model_path)
    embedded_start_s = time.perf_counter() - started
    server = None
    vllm_start_s = float("nan")
    if not args.vllm_url:
        started = time.perf_counter()
        config = VLLMServerConfig(model_path=model_path, max_model_len=4096)
        server = VLLMServerProcess(config, log_path=Path(args.log)).start()
        args.vllm_url = server.url
    try:
        vllm = FixedLengthVLLMEngine(VLLMEngineConfig.for_url(args.vllm_url, startup_timeout_s=1200))
        await vllm.wait_until_healthy(poll_s=0.5)
        if server is not None:
            vllm_start_s = time.perf_counter() - started
        await vllm.refresh()
        warm_prompts = [chat_prompt(embedded.tokenizer, f"Say hi to {topic}.") for topic in TOPICS]
        for engine in (vllm, embedded):  # warm-up, discarded: a batch of 8 and a 2-turn session each
            await tokens_per_s(engine, warm_prompts, 8, 0)
            await agent_session_s(engine, embedded.tokenizer, 2, 8, 0)
        figures: dict[str, list[dict[str, float]]] = {"embedded": [], "vllm": []}
        order = random.Random(args.seed)
        for pair in range(args.pairs):
            names = ["embedded", "vllm"]
            order.shuffle(names)
            for name in names:
                engine = embedded if name == "embedded" else vllm
                figures[name].append(await measure(engine, embedded.tokenizer, args, seed=100 * pair))
                print(f"pair {pair} {name}: {figures[name][-1]}", flush=True)
        medians = {
            name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            for name, runs in figures.items()
        }
        for name, runs in figures.items():
            print(
                f"{name}: batch 1 {spread(runs, 'batch1_tok_s')} tok/s, batch 8 {spread(runs, 'batch8_tok_s')} "
                f"tok/s, {args.num_turns}-turn session {spread(runs, 'session_s')} s (median, min-max over "
                f"{len(runs)} pairs)"
            )
        print(
            f"start-up: embedded {embedded_start_s:.1f} s, vLLM server {vllm_start_s:.1f} s (launch to /health)"
        )
        ratio = medians["vllm"]["batch8_tok_s"] / medians["embedded"]["batch8_tok_s"]
        print(f"engines: {ratio:.2f}x (target reported)")
        await vllm.aclose()
    finally:
        await embedded.aclose()
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 pair, 32 new tokens, 5 turns")
    parser.add_argument(
        "--vllm-url", default="", help="a running vLLM server of the same model ('' = start one)"
    )
    parser.add_argument(
        "--model", default="default", help="'default' (SmolLM2-135M-Instruct) or an HF folder"
    )
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--num-turns", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", default="/tmp/rein-engines-vllm.log", help="the started server's log")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.new_tokens, args.num_turns = 1, 32, 5
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
