"""The registry of each seam: kinds listed in errors and ``--help``, and a third-party brick registered through
the ``rein.bricks`` entry point group with no edit of Rein (a distribution on ``sys.path``, as pip installs one)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from components import registry as registry_module
from components.registry import HARNESSES, SEAMS, Registry


def test_every_seam_lists_its_built_in_kinds():
    kinds = {registry.seam: set(registry.kinds()) for registry in SEAMS}
    assert kinds["engine"] >= {"embedded", "sglang", "vllm"} and kinds["proxy"] >= {"serve", "local"}
    assert kinds["sandbox"] >= {"bwrap", "e2b"} and kinds["logger"] >= {"wandb"}
    assert kinds["harness"] >= {"swe_agent", "mini_swe_agent", "claude_code", "codex"}
    assert kinds["reward"] >= {"tests", "judge", "tests+judge"}
    with pytest.raises(ValueError, match=r"engine: must be one of \['embedded', 'sglang', 'vllm'"):
        SEAMS[0].get("tgi")


def test_a_kind_needs_a_build_method_and_a_name_is_taken_once():
    seam = Registry("example")

    @dataclass(frozen=True)
    class WithBuild:
        def build(self) -> str:
            return "built"

    seam.register("a")(WithBuild)
    seam.register("a")(WithBuild)  # the same class again (a module imported twice) is fine
    assert seam.build("a") == "built" and seam.name_of(WithBuild()) == "a"
    with pytest.raises(TypeError, match="no build"):
        seam.register("b")(type("NoBuild", (), {}))
    with pytest.raises(ValueError, match="taken by"):
        seam.register("a")(type("Other", (), {"build": lambda self: None}))


@pytest.fixture
def installed_one_shot(tmp_path, monkeypatch):
    """A distribution whose entry point registers ``examples.bricks.one_shot_harness:OneShotHarnessConfig`` as
    ``--harness one_shot`` (what ``pip install`` of a package with that pyproject table leaves)."""
    dist_info = tmp_path / "rein_one_shot-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: rein-one-shot\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(
        "[rein.bricks]\nharness.one_shot = examples.bricks.one_shot_harness:OneShotHarnessConfig\n"
    )
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    registry_module._entry_points.cache_clear()
    monkeypatch.setattr(HARNESSES, "_loaded", False)
    monkeypatch.setattr(HARNESSES, "_classes", dict(HARNESSES._classes))
    yield
    registry_module._entry_points.cache_clear()


def test_an_entry_point_brick_is_picked_by_name(installed_one_shot):
    from examples.bricks.one_shot_harness import OneShotHarness, OneShotHarnessConfig

    assert "one_shot" in HARNESSES.kinds() and HARNESSES.get("one_shot") is OneShotHarnessConfig
    harness = HARNESSES.get("one_shot")().build(max_turns=1, wall_time_s=1.0, max_tokens=8, temperature=1.0)
    assert isinstance(harness, OneShotHarness)


def test_a_harness_mix_names_registered_kinds_and_a_kind_keeps_its_recipe_settings(capsys):
    from components.recipe_config import parse_config
    from harnesses.claude_code import ClaudeCodeBrickConfig
    from harnesses.codex import CodexBrickConfig
    from recipes.swe_grpo import SweGrpoConfig, harness_kinds, harness_weights

    config = parse_config(SweGrpoConfig, ["--harness", "claude_code:2,codex", "--claude-code-bare", "false"])
    kinds = harness_kinds(config)
    assert harness_weights(config.harness) == {"claude_code": 2.0, "codex": 1.0}
    assert (
        kinds["claude_code"] == ClaudeCodeBrickConfig(bare=False) and type(kinds["codex"]) is CodexBrickConfig
    )
    assert "--bare" not in kinds["claude_code"].agent().argv  # the recipe's setting reached the agent
    with pytest.raises(SystemExit):
        parse_config(SweGrpoConfig, ["--harness", "claude_code,aider"])
    assert f"'aider' is not one of {list(HARNESSES.kinds())}" in capsys.readouterr().err
