"""What the inference proxy costs: the same requests with the proxy in the path vs calling the engine directly.

"Directly" means what a caller without the proxy does for the same request: render the conversation with the
model's chat template, tokenize, ``engine.generate``, decode. "Through the proxy" means an OpenAI Chat
Completions request over real HTTP (httpx, keep-alive connection) to the proxy, which parses it, runs the
TITO core, calls the same engine and records the turn.

1. Added latency with the zero-cost ``EchoEngine`` (agent-like sessions: a growing conversation with
   tool-output-sized user turns), p50/p99 per request, standalone (uvicorn) and through Ray Serve (2 replicas
   over session shards). The headline compares with the bare engine call on pre-tokenized ids (the strictest
   baseline: everything the proxy does - HTTP, parsing, TITO, recording - counts as overhead); the comparison
   with a direct caller that renders the chat template itself is printed too (the proxy's incremental TITO
   rendering makes it cheaper than re-rendering a long conversation, so that difference can be negative).
2. Wall-clock ratio with a real model (full: the default SmolLM2-135M; quick: the tiny one), embedded engine:
   ``--pairs`` pairs (>= 30) of the same seeded single-turn request (so both paths sample the same tokens),
   sent once directly and once through the proxy, in an order drawn at random for each pair, after a warm-up
   pair that runs both paths. Per pair: proxy wall time / direct wall time. The headline is the median of the
   pair ratios with its spread (25th-75th percentile and min-max). The engine's prefix cache is off here so
   that the second request of a pair does not reuse the first one's KV (both paths do the same work).

    python benchmarks/proxy_overhead.py [--quick]      # --quick: fewer echo requests, tiny model, no Ray Serve

Last line: ``proxy_overhead: p50 +X ms standalone, ratio M [p25 A, p75 B] over N pairs (target p50 <= 2 ms,
ratio <= 1.02)``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402

from components.engine.scripted import EchoEngine  # noqa: E402
from components.protocols import SamplingParams  # noqa: E402
from components.proxy.config import ProxyConfig  # noqa: E402
from components.proxy.server import ProxyServer  # noqa: E402
from components.proxy.sessions import LocalSessionRegistry  # noqa: E402

TOOL_OUTPUT = "drwxr-xr-x  2 user user 4096 Nov 30 04:00 src\n-rw-r--r--  1 user user  812 README.md\n" * 6


def _conversation(session: int, num_turns: int) -> list[list[dict]]:
    """The message lists an agent sends over ``num_turns`` turns (the echo engine always answers "ok")."""
    messages = [
        {"role": "system", "content": "You are a coding agent. Use the tools to solve the task. " * 8},
        {"role": "user", "content": f"Task {session}: fix the failing test in src/."},
    ]
    requests = []
    for turn in range(num_turns):
        requests.append([dict(m) for m in messages])
        messages += [
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": f"[{turn}] {TOOL_OUTPUT}"},
        ]
    return requests


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _direct_latencies(engine, tokenizer, conversations, loop) -> tuple[list[float], list[float]]:
    """Per request: (template + tokenize + generate + decode) time, and the bare generate time."""
    with_template, bare = [], []
    params = SamplingParams(max_tokens=64)
    for requests in conversations:
        for messages in requests:
            start = time.perf_counter()
            ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            generate_start = time.perf_counter()
            result = loop.run_until_complete(engine.generate(ids, params))
            generate_s = time.perf_counter() - generate_start
            tokenizer.decode(result.output_ids, skip_special_tokens=True)
            with_template.append(time.perf_counter() - start)
            bare.append(generate_s)
    return with_template, bare


def _admin(config: ProxyConfig) -> dict[str, str]:
    """The host's credential for session control (the proxy's control plane is closed by default)."""
    return {"Authorization": f"Bearer {config.admin_key}"}


def _proxy_latencies(base_url: str, conversations, open_session, config: ProxyConfig) -> list[float]:
    latencies = []
    with httpx.Client(timeout=60) as client:
        for requests in conversations:
            session_id = open_session(client)
            session_url = f"{base_url}/s/{session_id}"
            token = {"Authorization": f"Bearer {config.session_keys.session_token(session_id)}"}
            for messages in requests:
                start = time.perf_counter()
                response = client.post(
                    f"{session_url}/v1/chat/completions",
                    json={"model": "m", "messages": messages},
                    headers=token,
                )
                response.json()
                latencies.append(time.perf_counter() - start)
                assert response.status_code == 200, response.text
    return latencies


def _summary(name: str, latencies: list[float]) -> str:
    ms = [x * 1000 for x in latencies]
    return (
        f"{name:38s} p50 {_percentile(ms, 0.5):7.3f} ms   p99 {_percentile(ms, 0.99):7.3f} ms   (n={len(ms)})"
    )


def echo_overhead(tokenizer, *, num_sessions: int, num_turns: int, with_serve: bool, model_dir: Path) -> dict:
    """Added p50/p99 latency per request with the zero-cost engine, standalone and (optionally) on Ray Serve."""
    engine = EchoEngine(eos_token_id=tokenizer.eos_token_id, reply_ids=tokenizer.encode("ok"))
    warmup = _conversation(999, 3)
    conversations = [_conversation(s, num_turns) for s in range(num_sessions)]
    loop = asyncio.new_event_loop()
    _direct_latencies(engine, tokenizer, [warmup], loop)
    direct, bare = _direct_latencies(engine, tokenizer, conversations, loop)

    config = ProxyConfig(port=0)
    server = ProxyServer(LocalSessionRegistry(engine, tokenizer, config), config)
    url = server.start_in_thread()

    def open_local(client: httpx.Client) -> str:
        return client.post(f"{url}/sessions", headers=_admin(config)).json()["session_id"]

    _proxy_latencies(url, [warmup], open_local, config)
    standalone = _proxy_latencies(url, conversations, open_local, config)
    server.stop_thread()
    out = {
        "direct": direct,
        "bare": bare,
        "standalone": standalone,
        "added_p50_ms": (statistics.median(standalone) - statistics.median(direct)) * 1000,
        "added_p99_ms": (_percentile(standalone, 0.99) - _percentile(direct, 0.99)) * 1000,
        "added_vs_bare_p50_ms": (statistics.median(standalone) - statistics.median(bare)) * 1000,
        "added_vs_bare_p99_ms": (_percentile(standalone, 0.99) - _percentile(bare, 0.99)) * 1000,
    }
    if with_serve:
        import ray
        from ray import serve

        from components.proxy.ray_sessions import start_session_shards
        from components.proxy.serve import run_proxy_on_serve

        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "ERROR"})
        registry = start_session_shards(engine, model_dir, config, num_shards=2)
        serve_url = run_proxy_on_serve(
            registry, config, app_name="bench", route_prefix="/bench", num_replicas=2
        )

        def open_sharded(client: httpx.Client) -> str:
            return client.post(f"{serve_url}/sessions", headers=_admin(config)).json()["session_id"]

        _proxy_latencies(serve_url, [warmup], open_sharded, config)
        on_serve = _proxy_latencies(serve_url, conversations, open_sharded, config)
        serve.shutdown()
        ray.shutdown()
        out["serve"] = on_serve
        out["serve_added_p50_ms"] = (statistics.median(on_serve) - statistics.median(direct)) * 1000
        out["serve_added_p99_ms"] = (_percentile(on_serve, 0.99) - _percentile(direct, 0.99)) * 1000
        out["serve_added_vs_bare_p50_ms"] = (statistics.median(on_serve) - statistics.median(bare)) * 1000
        out["serve_added_vs_bare_p99_ms"] = (_percentile(on_serve, 0.99) - _percentile(bare, 0.99)) * 1000
    loop.close()
    return out


def paired_ratios(direct, proxy, num_pairs: int, rng: random.Random) -> tuple[list[float], list[str]]:
    """Warm both paths, then ``num_pairs`` times run ``direct(i)`` and ``proxy(i)`` (each returns its wall time
    in seconds) in an order drawn per pair. Returns the ratios proxy / direct and the orders used."""
    direct(-1)
    proxy(-1)
    ratios, orders = [], []
    for index in range(num_pairs):
        order = rng.choice(["direct first", "proxy first"])
        if order == "direct first":
            direct_s = direct(index)
            proxy_s = proxy(index)
        else:
            proxy_s = proxy(index)
            direct_s = direct(index)
        ratios.append(proxy_s / direct_s)
        orders.append(order)
        print(f"   pair {index + 1:2d} ({order}): direct {direct_s:.3f} s, proxy {proxy_s:.3f} s", flush=True)
    return ratios, orders


def model_ratio(model_dir: Path, *, num_pairs: int, max_tokens: int, seed: int = 0) -> dict:
    """Wall-clock ratio proxy / direct with a real model: the same seeded request per pair, order randomised."""
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.engine.providers import EmbeddedEngineBrickConfig

    engine = EmbeddedEngine(
        EmbeddedEngineConfig(
            model_path=model_dir, settings=EmbeddedEngineBrickConfig(threads=2, kv_cache_gb=0)
        )
    )
    tokenizer = engine.tokenizer
    config = ProxyConfig(port=0)
    server = ProxyServer(LocalSessionRegistry(engine, tokenizer, config), config)
    url = server.start_in_thread()
    loop = asyncio.new_event_loop()
    client = httpx.Client(timeout=600)
    tokens = {"direct": 0, "proxy": 0}

    def messages(index: int) -> list[dict]:
        return [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Write a short poem about the number {index + 2}."},
        ]

    def direct(index: int) -> float:
        start = time.perf_counter()
        ids = tokenizer.apply_chat_template(messages(index), tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1000 + index)
        result = loop.run_until_complete(engine.generate(ids, params))
        tokenizer.decode(result.output_ids, skip_special_tokens=True)
        elapsed = time.perf_counter() - start
        tokens["direct"] += len(result.output_ids) if index >= 0 else 0
        return elapsed

    def proxy(index: int) -> float:
        session_id = client.post(f"{url}/sessions", headers=_admin(config)).json()["session_id"]  # not timed
        session_url = f"{url}/s/{session_id}"
        token = {"Authorization": f"Bearer {config.session_keys.session_token(session_id)}"}
        body = {
            "model": "m",
            "messages": messages(index),
            "max_tokens": max_tokens,
            "seed": 1000 + index,
            "temperature": 1.0,
        }
        start = time.perf_counter()
        response = client.post(f"{session_url}/v1/chat/completions", json=body, headers=token)
        response.raise_for_status()
        completion = response.json()
        elapsed = time.perf_counter() - start
        tokens["proxy"] += completion["usage"]["completion_tokens"] if index >= 0 else 0
        return elapsed

    try:
        ratios, orders = paired_ratios(direct, proxy, num_pairs, random.Random(seed))
    finally:
        client.close()
        server.stop_thread()
        engine.close()
        loop.close()
    return {
        "median": statistics.median(ratios),
        "p25": _percentile(ratios, 0.25),
        "p75": _percentile(ratios, 0.75),
        "min": min(ratios),
        "max": max(ratios),
        "num_pairs": len(ratios),
        "num_direct_first": orders.count("direct first"),
        "direct_tokens": tokens["direct"],
        "proxy_tokens": tokens["proxy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="< 1 minute: fewer requests, tiny model, no Ray Serve"
    )
    parser.add_argument("--pairs", type=int, default=30, help="direct/proxy pairs of the ratio (>= 30)")
    args = parser.parse_args()
    if args.pairs < 30:
        parser.error("--pairs: at least 30 pairs, so that the median and its spread mean something")
    import torch
    from transformers import AutoTokenizer

    from components.models.registry import default_model_dir, resolve_model

    torch.set_num_threads(2)
    model_dir = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sessions, turns = (4, 10) if args.quick else (20, 20)
    echo = echo_overhead(
        tokenizer, num_sessions=sessions, num_turns=turns, with_serve=not args.quick, model_dir=model_dir
    )
    print(f"-- zero-cost EchoEngine, {sessions} sessions x {turns} turns (growing agent conversations)")
    print(_summary("engine.generate only (pre-tokenized)", echo["bare"]))
    print(_summary("direct (template + generate + decode)", echo["direct"]))
    print(_summary("through proxy, standalone (uvicorn)", echo["standalone"]))
    if "serve" in echo:
        print(_summary("through proxy, Ray Serve (2 replicas)", echo["serve"]))
    print(
        f"added latency standalone, vs the bare engine call: p50 +{echo['added_vs_bare_p50_ms']:.3f} ms, "
        f"p99 +{echo['added_vs_bare_p99_ms']:.3f} ms; vs direct with template rendering: "
        f"p50 {echo['added_p50_ms']:+.3f} ms, p99 {echo['added_p99_ms']:+.3f} ms"
    )
    if "serve" in echo:
        print(
            f"added latency Ray Serve, vs the bare engine call: p50 +{echo['serve_added_vs_bare_p50_ms']:.3f} ms, "
            f"p99 +{echo['serve_added_vs_bare_p99_ms']:.3f} ms; vs direct with template rendering: "
            f"p50 {echo['serve_added_p50_ms']:+.3f} ms"
        )

    model_name = "tiny" if args.quick else "default"
    max_tokens = 32 if args.quick else 16
    print(f"-- {model_name} model, {args.pairs} pairs x {max_tokens} max tokens, order drawn per pair:")
    ratio = model_ratio(resolve_model(model_name), num_pairs=args.pairs, max_tokens=max_tokens)
    print(
        f"   proxy / direct per pair: median {ratio['median']:.4f}, p25 {ratio['p25']:.4f}, "
        f"p75 {ratio['p75']:.4f}, min {ratio['min']:.4f}, max {ratio['max']:.4f} "
        f"({ratio['num_direct_first']} of {ratio['num_pairs']} pairs ran direct first; sampled tokens "
        f"direct {ratio['direct_tokens']}, proxy {ratio['proxy_tokens']})"
    )
    print(
        f"proxy_overhead: p50 +{echo['added_vs_bare_p50_ms']:.2f} ms standalone"
        + (f" (Ray Serve +{echo['serve_added_vs_bare_p50_ms']:.1f} ms)" if "serve" in echo else "")
        + f", ratio {ratio['median']:.3f} [p25 {ratio['p25']:.3f}, p75 {ratio['p75']:.3f}]"
        + f" over {ratio['num_pairs']} pairs ({model_name} model)"
        + " (target p50 <= 2 ms, ratio <= 1.02)"
    )


if __name__ == "__main__":
    main()
