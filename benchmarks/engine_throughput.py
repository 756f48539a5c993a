"""Decode throughput at batch 8: Rein's EmbeddedEngine vs plain ``transformers`` ``model.generate``.

Same model, dtype, thread count, prompts (8 chat prompts), sampling (temperature 1, top-p 1, no top-k) and
number of new tokens per request (EOS disabled in both so that each produces exactly ``--new-tokens`` tokens).
Throughput = sampled tokens / wall time, prefill included, for 8 concurrent requests. The two are run
alternately ``--repeats`` times in one process and the medians are compared (the machine is shared).

    python benchmarks/engine_throughput.py [--quick] [--dtype float32|bfloat16|both] [--mixed]

``--mixed`` adds an agent-like load (16 requests of 16-128 new tokens): plain ``generate`` must run them as
static batches to the longest request, the engine refills a slot whenever a request ends. Informational only.

Last line: ``engine_throughput: <ratio>x (target >= 2x)`` for the first dtype measured.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import torch

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig  # noqa: E402
from components.engine.providers import EmbeddedEngineBrickConfig  # noqa: E402
from components.models.registry import resolve_model  # noqa: E402
from components.protocols import SamplingParams  # noqa: E402

BATCH = 8
TOPICS = ["a cat", "the sea", "a robot", "winter", "a city at night", "a garden", "an old clock", "a train"]


def chat_prompts(tokenizer) -> list[list[int]]:
    """Eight chat-formatted prompts of slightly different lengths."""
    prompts = []
    for index, topic in enumerate(TOPICS[:BATCH]):
        messages = [
            {"role": "user", "content": f"Write story number {index + 1}, a short story about {topic}."}
        ]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return prompts


def run_hf_generate(model, tokenizer, prompts: list[list[int]], new_tokens: int, seed: int) -> float:
    """Plain ``model.generate`` on a left-padded batch; returns sampled tokens / s."""
    length = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (length - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad,
        )
    elapsed = time.perf_counter() - start
    assert output.shape == (len(prompts), length + new_tokens), output.shape
    return len(prompts) * new_tokens / elapsed


async def run_engine(engine: EmbeddedEngine, prompts: list[list[int]], new_tokens: int, seed: int) -> float:
    """Eight concurrent ``generate`` calls; returns sampled tokens / s."""
    params = [
        SamplingParams(max_tokens=new_tokens, temperature=1.0, top_p=1.0, seed=seed + i) for i in range(BATCH)
    ]
    start = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
    elapsed = time.perf_counter() - start
    total = sum(len(r.output_ids) for r in results)
    assert total == len(prompts) * new_tokens, total
    return total / elapsed


MIXED_NEW_TOKENS = [16, 128, 32, 96, 24, 64, 16, 112, 48, 128, 16, 80, 32, 24, 128, 40]


def run_hf_generate_mixed(model, tokenizer, prompts: list[list[int]], seed: int) -> float:
    """Agent-like load for plain generate: 16 requests with different lengths, in arrival order as two static
    batches of 8, each run to its longest request. Returns requested tokens / s."""
    start = time.perf_counter()
    for first in (0, BATCH):
        batch_tokens = MIXED_NEW_TOKENS[first : first + BATCH]
        run_hf_generate(model, tokenizer, prompts, max(batch_tokens), seed=seed + first)
    return sum(MIXED_NEW_TOKENS) / (time.perf_counter() - start)


async def run_engine_mixed(engine: EmbeddedEngine, prompts: list[list[int]], seed: int) -> float:
    """The same 16 requests submitted at once; the engine refills a batch slot as soon as a request ends."""
    requests = [
        engine.generate(prompts[i % BATCH], SamplingParams(max_tokens=n, seed=seed + i))
        for i, n in enumerate(MIXED_NEW_TOKENS)
    ]
    start = time.perf_counter()
    results = await asyncio.gather(*requests)
    elapsed = time.perf_counter() - start
    assert [len(r.output_ids) for r in results] == MIXED_NEW_TOKENS
    return sum(MIXED_NEW_TOKENS) / elapsed


def measure(
    dtype: str, model_dir: Path, new_tokens: int, repeats: int, threads: int, mixed: bool = False
) -> tuple[float, float]:
    """Median tokens/s of (engine, hf generate) for one dtype (and, with ``mixed``, the agent-like load)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = chat_prompts(tokenizer)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(
            model_path=model_dir,
            dtype=dtype,
            settings=EmbeddedEngineBrickConfig(max_batch_size=BATCH, threads=threads),
            eos_token_ids=(),
        )
    )
    loop = asyncio.new_event_loop()
    try:
        run_hf_generate(model, tokenizer, prompts, 4, seed=0)  # warm-up
        loop.run_until_complete(run_engine(engine, prompts, 4, seed=0))
        engine_rates, hf_rates = [], []
        for repeat in range(repeats):
            hf_rates.append(run_hf_generate(model, tokenizer, prompts, new_tokens, seed=repeat))
            engine_rates.append(loop.run_until_complete(run_engine(engine, prompts, new_tokens, seed=repeat)))
            print(
                f"  [{dtype}] repeat {repeat + 1}: engine {engine_rates[-1]:.1f} tok/s, "
                f"hf generate {hf_rates[-1]:.1f} tok/s",
                flush=True,
            )
        if mixed:
            hf_mixed = run_hf_generate_mixed(model, tokenizer, prompts, seed=100)
            engine_mixed = loop.run_until_complete(run_engine_mixed(engine, prompts, seed=100))
            print(
                f"  [{dtype}] mixed lengths (16 requests, {sum(MIXED_NEW_TOKENS)} tokens): engine "
                f"{engine_mixed:.1f} tok/s vs hf generate in static batches {hf_mixed:.1f} tok/s "
                f"-> {engine_mixed / hf_mixed:.2f}x",
                flush=True,
            )
    finally:
        engine.close()
        loop.close()
    return statistics.median(engine_rates), statistics.median(hf_rates)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats (< 1 minute)")
    parser.add_argument("--model", default="default", help="'default', 'tiny' or an HF folder")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "both"])
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--mixed", action="store_true", help="also an agent-like load: 16 requests of different lengths"
    )
    args = parser.parse_args()
    new_tokens = args.new_tokens or (24 if args.quick else 96)
    repeats = args.repeats or (2 if args.quick else 3)
    model_dir = resolve_model(args.model)
    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]
    print(
        f"model {model_dir.name}, batch {BATCH}, {new_tokens} new tokens, {repeats} repeats, {args.threads} threads"
    )
    ratios = {}
    for dtype in dtypes:
        engine_rate, hf_rate = measure(
            dtype, model_dir, new_tokens, repeats, args.threads, mixed=args.mixed and dtype == dtypes[0]
        )
        ratios[dtype] = engine_rate / hf_rate
        print(
            f"{dtype}: engine {engine_rate:.1f} tok/s vs hf generate {hf_rate:.1f} tok/s -> {ratios[dtype]:.2f}x"
        )
    print(f"engine_throughput: {ratios[dtypes[0]]:.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
