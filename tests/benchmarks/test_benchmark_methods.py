"""The benchmarks measure what they claim: paired, randomised, warmed comparisons; same windows at both ends."""

from __future__ import annotations

import importlib.util
import random
import statistics
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    """A benchmark script as a module (benchmarks/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass resolves its module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_proxy_overhead_pairs_are_warmed_randomised_and_compare_the_same_request():
    proxy_overhead = load("proxy_overhead")
    calls: list[tuple[str, int]] = []

    def direct(index: int) -> float:
        calls.append(("direct", index))
        return 2.0

    def proxy(index: int) -> float:
        calls.append(("proxy", index))
        return 2.1

    ratios, orders = proxy_overhead.paired_ratios(direct, proxy, 30, random.Random(0))
    assert calls[:2] == [("direct", -1), ("proxy", -1)]  # both paths warmed before anything is timed
    pairs = [calls[i : i + 2] for i in range(2, len(calls), 2)]
    assert len(pairs) == 30 and all({path for path, _ in pair} == {"direct", "proxy"} for pair in pairs)
    assert all(pair[0][1] == pair[1][1] for pair in pairs)  # one pair = the same request on both paths
    firsts = [pair[0][0] for pair in pairs]
    assert 5 <= firsts.count("direct") <= 25  # order drawn per pair, not alternating or fixed
    assert [f"{first} first" for first in firsts] == orders
    assert statistics.median(ratios) == pytest.approx(1.05)  # proxy / direct, not proxy / its own engine call


def test_learning_curve_names_its_results_by_the_variants_run():
    """One variant's run never overwrites another's results."""
    learning_curve = load("learning_curve")
    assert learning_curve.results_name(["async", "sync", "lora"], quick=False) == "learning_curve"
    assert learning_curve.results_name(["async"], quick=False) == "learning_curve_async"
    assert learning_curve.results_name(["sync", "lora"], quick=True) == "learning_curve_sync_lora_quick"


def test_learning_curve_uses_the_same_window_at_both_ends():
    learning_curve = load("learning_curve")
    rows = [(step, reward, 0.0) for step, reward in enumerate([0.1, 0.3, 0.2, 0.4, 0.6, 0.8])]
    start, end, delta = learning_curve.window_delta(rows, 2)
    assert start == pytest.approx(0.2) and end == pytest.approx(0.7) and delta == pytest.approx(0.5)
    with pytest.raises(ValueError, match="window"):
        learning_curve.window_delta(rows[:3], 2)


@pytest.mark.parametrize("quick", [False, True])
def test_learning_curve_variants_share_the_budget_and_keep_their_own_flags(tmp_path, quick):
    from dataclasses import replace

    from components.recipe_config import parse_config
    from recipes.tictactoe_grpo import TicTacToeGrpoConfig

    learning_curve = load("learning_curve")
    args = learning_curve.build_parser().parse_args(["--quick"] if quick else ["--model", "tiny"])
    args.num_steps = 7
    configs = {  # the recipe's own parser reads each variant's command line
        name: parse_config(TicTacToeGrpoConfig, learning_curve.recipe_flags(args, variant, tmp_path, 3))
        for name, variant in learning_curve.variants(args).items()
    }
    assert tuple(configs) == learning_curve.VARIANT_NAMES
    sync, asynchronous, lora = configs["sync"], configs["async"], configs["lora"]
    assert (sync.rollout.mode, sync.trainer.lora.rank) == ("sync", 0)
    assert (asynchronous.rollout.mode, asynchronous.rollout.max_staleness) == ("async", 2)
    assert (lora.rollout.mode, lora.trainer.lora.rank, lora.trainer.lora.target_modules) == (
        "sync",
        16,
        "all-linear",
    )
    assert lora.trainer.optimizer.learning_rate == pytest.approx(10 * sync.trainer.optimizer.learning_rate)
    # Beyond its own fields each variant is the sync run: same model, steps, games, group, tokens, seed, lr.
    assert replace(asynchronous, rollout=sync.rollout) == sync
    lora_trainer = replace(lora.trainer, lora=sync.trainer.lora, optimizer=sync.trainer.optimizer)
    assert replace(lora, trainer=lora_trainer) == sync
    assert (sync.num_steps, sync.seed, sync.model) == (7, 3, "tiny")
    if not quick:
        assert (sync.games_per_step, sync.group_size, sync.sampling.max_tokens) == (3, 4, 24)


def test_data_pipeline_warms_both_sides_before_timing(monkeypatch):
    data_pipeline = load("data_pipeline")
    import ray

    calls: list[str] = []
    monkeypatch.setattr(data_pipeline, "write_shards", lambda run_dir, **_: [])
    monkeypatch.setattr(
        data_pipeline, "run_plain", lambda paths, config: (calls.append("plain"), (1.0, 10))[1]
    )
    monkeypatch.setattr(data_pipeline, "run_ray", lambda paths, config: (calls.append("ray"), (1.0, 10))[1])
    monkeypatch.setattr(ray, "init", lambda **_: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr("sys.argv", ["data_pipeline.py", "--repeats", "2"])
    data_pipeline.main()
    assert sorted(calls[:2]) == ["plain", "ray"]  # one untimed run of each side first
    assert calls[2:] == ["plain", "ray", "plain", "ray"]


async def test_engines_compare_the_same_number_of_tokens(vllm_server):
    """``benchmarks/engines.py`` counts the same work on both sides: the embedded engine (no EOS ids) and the
    real vLLM server (``ignore_eos``) each sample exactly ``new_tokens`` per request, and a request that stops
    early or runs long is refused rather than counted."""
    from dataclasses import replace

    from components.engine.vllm import VLLMEngineConfig

    engines = load("engines")
    vllm = engines.FixedLengthVLLMEngine(VLLMEngineConfig.for_url(vllm_server.url))
    embedded = engines.embedded_engine(vllm_server.model_dir)
    try:
        await vllm.refresh()
        params = engines.SamplingParams(max_tokens=12)
        assert vllm.generate_payload([1, 2], params)["sampling_params"]["ignore_eos"] is True
        prompts = [[1, 100 + i, 200, 300] for i in range(3)]
        for engine in (vllm, embedded):
            assert (
                await engines.tokens_per_s(engine, prompts, 12, seed=0) > 0
            )  # raises unless all are 12 long
        results = [await engine.generate(prompts[0], params) for engine in (vllm, embedded)]
        assert [len(result.output_ids) for result in results] == [12, 12]
        first = results[0]
        short = replace(
            first,
            output_ids=first.output_ids[:7],
            logprobs=first.logprobs[:7],
            weight_versions=first.weight_versions[:7],
        )
        with pytest.raises(ValueError, match=r"stopped early or ran long: \[12, 7\] tokens, 12 asked"):
            engines.same_length([results[0], short], 12)
    finally:
        await vllm.aclose()
        await embedded.aclose()
