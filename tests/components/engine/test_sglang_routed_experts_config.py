"""R3 over SGLang: the run's ``--record-routed-experts`` gives the client the experts per token it needs to decode
SGLang's flat ``routed_experts`` array (read from the policy's config.json)."""

from __future__ import annotations

import json

import pytest

from components.engine.providers import SGLangBrickConfig
from components.engine.sglang_fleet import sglang_fleet_config
from components.run.config import RunConfig, SamplingBrickConfig
from components.run.stack import Bricks


def fleet_config(config: RunConfig):
    """The fleet the run's engine brick connects to (what ``SGLangEngineProvider.start`` builds)."""
    provider = Bricks.from_config(config).engine
    return sglang_fleet_config(
        provider.config,
        model_path=config.model,
        record_routed_experts=provider.record_routed_experts,
        initial_weight_version=0,
    )


def test_record_routed_experts_sets_the_experts_per_token(tiny_moe_model_dir, tiny_model_dir):
    sglang = {"engine": SGLangBrickConfig(url="http://127.0.0.1:9")}
    record = SamplingBrickConfig(record_routed_experts=True)
    experts = json.loads((tiny_moe_model_dir / "config.json").read_text())["num_experts_per_tok"]
    moe = RunConfig(model=str(tiny_moe_model_dir), sampling=record, **sglang)
    assert fleet_config(moe).server.routed_experts_top_k == experts
    plain = RunConfig(model=str(tiny_moe_model_dir), **sglang)
    assert fleet_config(plain).server.routed_experts_top_k is None
    dense = RunConfig(model=str(tiny_model_dir), sampling=record, **sglang)
    with pytest.raises(ValueError, match="record_routed_experts: .* is not an MoE model"):
        fleet_config(dense)
