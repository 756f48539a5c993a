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
2. Wall-clock ratio with the real default model (SmolLM2-135M, embedded engine): identical single-turn
   requests with fixed seeds (so both paths sample the same tokens), alternating direct / proxy; the
   alternating ratio (median over pairs) is what was asked for, but on a loaded shared machine the speed of
   two consecutive identical generations differs by up to 2x, so the headline also gives the in-situ ratio:
   each proxy request's wall time over the ``engine.generate`` call inside that same request (same moment,
   same load) - everything outside the engine call is the proxy's cost.

    python benchmarks/proxy_overhead.py [--quick]      # --quick: fewer requests, tiny model, no Ray Serve

Last line: ``proxy_overhead: p50 +X ms standalone, ratio Y (target p50 <= 2 ms, ratio <= 1.02)``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


def _proxy_latencies(base_url: str, conversations, open_session) -> list[float]:
    latencies = []
    with httpx.Client(timeout=60) as client:
        for requests in conversations:
            session_url = f"{base_url}/s/{open_session(client)}"
            for messages in requests:
                start = time.perf_counter()
                response = client.post(
                    f"{session_url}/v1/chat/completions", json={"model": "m", "messages": messages}
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
        return client.post(f"{url}/sessions").json()["session_id"]

    _proxy_latencies(url, [warmup], open_local)
    standalone = _proxy_latencies(url, conversations, open_local)
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
            return client.post(f"{serve_url}/sessions").json()["session_id"]

        _proxy_latencies(serve_url, [warmup], open_sharded)
        on_serve = _proxy_latencies(serve_url, conversations, open_sharded)
        serve.shutdown()
        ray.shutdown()
        out["serve"] = on_serve
        out["serve_added_p50_ms"] = (statistics.median(on_serve) - statistics.median(direct)) * 1000
        out["serve_added_p99_ms"] = (_percentile(on_serve, 0.99) - _percentile(direct, 0.99)) * 1000
        out["serve_added_vs_bare_p50_ms"] = (statistics.median(on_serve) - statistics.median(bare)) * 1000
        out["serve_added_vs_bare_p99_ms"] = (_percentile(on_serve, 0.99) - _percentile(bare, 0.99)) * 1000
    loop.close()
    return out


class TimedEngine:
    """Wraps an engine and records how long each ``generate`` took (the engine's share of a proxy request)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.durations_s: list[float] = []

    @property
    def context_window(self) -> int:
        return self.inner.context_window

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, input_ids, params):
        start = time.perf_counter()
        try:
            return await self.inner.generate(input_ids, params)
        finally:
            self.durations_s.append(time.perf_counter() - start)

    async def update_weights(self, state_dict, version: int) -> None:
        await self.inner.update_weights(state_dict, version)


def model_ratio(model_dir: Path, *, num_requests: int, max_tokens: int) -> dict:
    """Wall-clock ratio proxy / direct with a real model, identical seeded requests, alternating paths."""
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig

    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=model_dir, num_threads=2))
    tokenizer = engine.tokenizer
    config = ProxyConfig(port=0)
    timed = TimedEngine(engine)
    server = ProxyServer(LocalSessionRegistry(timed, tokenizer, config), config)
    url = server.start_in_thread()
    loop = asyncio.new_event_loop()
    in_situ_ratios = []
    prompts = [
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Write a short poem about the number {i}."},
        ]
        for i in range(num_requests)
    ]
    direct_s = proxy_s = 0.0
    direct_tokens = proxy_tokens = 0
    pair_ratios = []
    with httpx.Client(timeout=600) as client:
        for index, messages in enumerate([prompts[0], *prompts]):  # the first one warms both paths up
            seed = 1000 + index
            start = time.perf_counter()
            ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            result = loop.run_until_complete(
                engine.generate(ids, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed))
            )
            tokenizer.decode(result.output_ids, skip_special_tokens=True)
            elapsed_direct = time.perf_counter() - start

            session_url = f"{url}/s/{client.post(f'{url}/sessions').json()['session_id']}"
            start = time.perf_counter()
            response = client.post(
                f"{session_url}/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "seed": seed,
                    "temperature": 1.0,
                },
            ).json()
            elapsed_proxy = time.perf_counter() - start
            if index == 0:
                continue
            direct_s += elapsed_direct
            proxy_s += elapsed_proxy
            pair_ratios.append(elapsed_proxy / elapsed_direct)
            in_situ_ratios.append(elapsed_proxy / timed.durations_s[-1])
            print(
                f"   pair {index}: direct {elapsed_direct:.2f} s, proxy {elapsed_proxy:.2f} s "
                f"(of which engine.generate {timed.durations_s[-1]:.2f} s)",
                flush=True,
            )
            direct_tokens += len(result.output_ids)
            proxy_tokens += response["usage"]["completion_tokens"]
    server.stop_thread()
    engine.close()
    loop.close()
    return {
        "direct_s": direct_s,
        "proxy_s": proxy_s,
        "ratio": proxy_s / direct_s,
        "median_pair_ratio": statistics.median(pair_ratios),
        "in_situ_ratio": statistics.median(in_situ_ratios),
        "direct_tokens": direct_tokens,
        "proxy_tokens": proxy_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="< 1 minute: fewer requests, tiny model, no Ray Serve"
    )
    args = parser.parse_args()
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
    num_requests, max_tokens = (4, 32) if args.quick else (6, 24)
    ratio = model_ratio(resolve_model(model_name), num_requests=num_requests, max_tokens=max_tokens)
    print(
        f"-- {model_name} model, {num_requests} seeded requests x {max_tokens} max tokens, alternating paths: "
        f"direct {ratio['direct_s']:.2f} s ({ratio['direct_tokens']} tokens), "
        f"proxy {ratio['proxy_s']:.2f} s ({ratio['proxy_tokens']} tokens), total ratio {ratio['ratio']:.4f}, "
        f"median per-pair ratio {ratio['median_pair_ratio']:.4f}"
    )
    print(
        f"   in-situ: proxy request wall time / the engine.generate call inside it, median {ratio['in_situ_ratio']:.4f}"
    )
    print(
        f"proxy_overhead: p50 +{echo['added_vs_bare_p50_ms']:.2f} ms standalone"
        + (f" (Ray Serve +{echo['serve_added_vs_bare_p50_ms']:.1f} ms)" if "serve" in echo else "")
        + f", ratio {ratio['in_situ_ratio']:.4f} in situ / {ratio['median_pair_ratio']:.3f} alternating"
        + f" ({model_name} model)"
        + " (target p50 <= 2 ms, ratio <= 1.02)"
    )


if __name__ == "__main__":
    main()
