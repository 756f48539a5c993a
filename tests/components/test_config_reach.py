"""Every config field travels from its flag to the object it configures.

For every field of every kind of every brick of the SWE recipe's config (the kinds each slot has registered),
the test sets a non-default value on the command line, reads it back from the parsed config (flag → dotted
field), then builds the bricks from that config without starting them (providers, the trainer's and the
proxy's configs, the engine actor's config, the SGLang fleet's config, the harness, the rewards) and checks
that the built objects differ from those built from the defaults: a field that stops reaching its brick fails.
An engine field must change what the engine itself runs with (the embedded engine's config, the fleet's
per-server config), not only its provider: the provider holding the brick config is not enough.
Fields the run wing reads itself (steps, Ray, rollout scheduling, the task list) are listed with their reader.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from components.engine.providers import EmbeddedEngineBrickConfig, VLLMBrickConfig
from components.engine.sglang_fleet import sglang_fleet_config
from components.engine.vllm_fleet import vllm_fleet_config
from components.recipe_config import _leaves, parse_config
from components.registry import HARNESSES
from components.run.directory import RunDirectory
from components.run.stack import Bricks, RunStack
from recipes.swe_grpo import SweGrpoConfig, build_harness, harness_kinds

# Read by the run wing (components/run/) or the recipe's own task loading, not by a
# brick's build: each is checked by the tests of its reader (tests/components/test_loop_scheduling.py,
# tests/recipes/).
RUN_WING_FIELDS = {
    "model": "RunDirectory.create (resolve_model)",
    "run_dir": "RunDirectory.create",
    "num_steps": "the loop",
    "group_size": "RolloutConfig in the recipe",
    "checkpoint_every_steps": "RunStack.checkpoint_if_due",
    "ray_address": "connect_ray",
    "ray_num_cpus": "connect_ray",
    "num_tasks": "tasks_for_step in the recipe",
    "harness": "the recipe's harness mix (recipes/swe_grpo.py: harness_weights)",
    "harness_mix_within_groups": "the recipe's harness mix",
}
RUN_WING_BRICKS = {
    "rollout": "the loop (components/run/loop.py) and RolloutConfig in the recipe",
    "tasks": "the task source's build and environment (tests/components/tasks/test_task_sources.py)",
}

SGLANG_URL = "http://127.0.0.1:9"
# Fields valid only beside another field's value: that flag is given to both sides of the comparison.
COMPANION_FLAGS = {
    "trainer.batching.overlong.buffer_tokens": lambda model_dir: [
        "--trainer-overlong-max-sampled-tokens",
        "64",
    ],
    "distillation.teacher_rules": lambda model_dir: ["--distillation-teachers", str(model_dir)],
}
# (engine kind, field) whose value shows in what the engine runs with only beside another flag (an NCCL address
# is used only when weights travel over NCCL): that flag is given to both sides of the comparison.
ENGINE_COMPANION_FLAGS = {
    ("sglang", "engine.nccl_address"): ["--sglang-weight-sync", "nccl"],
    ("vllm", "engine.nccl_address"): ["--vllm-weight-transfer", "nccl"],
    ("vllm", "engine.nccl_server_world_size"): ["--vllm-weight-transfer", "nccl"],
}
# (engine kind, field) the run's stack reads itself, not the engine: it reaches the bricks, not the engine's config.
ENGINE_FIELDS_READ_BY_THE_STACK = {("sglang", "engine.colocated"): "RunStack.train_and_sync"}
# (kind, field) with a single valid value in that kind.
FIXED_FIELDS = {("gspo", "algorithm.loss.ratio_level"): "GSPO's clipped ratio is per sequence by definition"}


@pytest.fixture(scope="module")
def rubric(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("rubric") / "rubric.md"
    path.write_text("a good run fixes the bug\n")
    Path(f"{path}.2").write_text("a good run fixes the bug and adds a test\n")  # a second rubric
    return str(path)


def kind_flags(kinds: dict[str, str], rubric: str) -> list[str]:
    """The flags a choice of kinds needs to be valid (the SGLang servers' URL, the judge's endpoint)."""
    flags = ["--model", "tiny"]
    for slot, kind in kinds.items():
        flags += ["--sandbox-backend" if slot == "sandbox" else f"--{slot}", kind]
    if kinds.get("engine") == "sglang":
        flags += ["--sglang-url", SGLANG_URL]
    if kinds.get("tasks") in ("swebench", "r2e"):
        flags += ["--tasks-path", "rows.parquet"]
    if kinds.get("engine") == "vllm":
        flags += ["--vllm-url", SGLANG_URL]
    if kinds.get("reward") in ("judge", "tests+judge"):
        flags += ["--judge-url", f"{SGLANG_URL}/v1", "--rubric", rubric]
    return flags


def candidates(annotation: Any, default: Any, rubric: str) -> list[str]:
    """Command-line texts of values unlike ``default``, most plausible first."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return [str(choice) for choice in typing.get_args(annotation) if choice != default]
    if origin in (typing.Union, __import__("types").UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
        default = default if default is not None else 0
    if annotation is bool:
        return [str(not default).lower()]
    if annotation is int:
        return [str(default + 1), str(default + 2), "1", "2"]
    if annotation is float:
        return [repr(value) for value in (default * 2 if default else 0.5, default + 0.1, 0.25, 1.0)]
    if typing.get_origin(annotation) is tuple:
        return ["/opt", "/opt,/srv", "task-*=0", "a,b"]
    # a URL, a file, a directory, an executable, a mode some str fields take, a plain word
    return [
        f"{SGLANG_URL.replace('9', '10')}",
        rubric,
        f"{rubric}.2",
        "/tmp",
        "/usr/bin/env",
        "rlimit",
        "task-*=0",
        "raw_logprobs",
        "processed_logprobs",
        "hermes",
        "think",
        "x1",
    ]


def dotted(config: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        config = getattr(config, name)
    return config


def state(value: Any, seen: frozenset[int] = frozenset()) -> Any:
    """The built objects as plain nested data: dataclasses and Rein's own objects by their attributes, anything
    else (locks, event loops, threads) by its type's name."""
    if value is None or isinstance(value, str | int | float | bool | Path):
        return value
    if id(value) in seen:
        return "<cycle>"
    seen = seen | {id(value)}
    if isinstance(value, list | tuple):
        return [state(item, seen) for item in value]
    if isinstance(value, dict):
        return {str(key): state(item, seen) for key, item in value.items()}
    if dataclasses.is_dataclass(value):
        return {f.name: state(getattr(value, f.name), seen) for f in dataclasses.fields(value)}
    package = type(value).__module__.split(".")[0]
    if package in ("components", "sandboxes", "harnesses", "monitoring", "examples") and hasattr(
        value, "__dict__"
    ):
        return {type(value).__qualname__: {key: state(item, seen) for key, item in vars(value).items()}}
    return type(value).__qualname__


def built(config: SweGrpoConfig, model_dir: Path, run_dir: Path) -> Any:
    """Everything the stack and the recipe build from ``config`` before anything starts."""
    bricks = Bricks.from_config(config, sandbox_paths=("/usr",))
    engine = bricks.engine
    if hasattr(engine, "engine_config"):  # the embedded engine: the actor's config
        engine_state = engine.engine_config(model_path=model_dir, weight_version=0)
    elif isinstance(engine.config, VLLMBrickConfig):  # vLLM: the fleet it connects to
        engine_state = vllm_fleet_config(engine.config, initial_weight_version=0)
    else:  # SGLang: the fleet it connects to
        engine_state = sglang_fleet_config(
            engine.config, model_path=model_dir, record_routed_experts=False, initial_weight_version=0
        )
    stack = RunStack(config, RunDirectory(path=run_dir, recipe="swe_grpo", model_path=model_dir), bricks)
    trainer = stack.trainer_config()
    every_kind = dataclasses.replace(config, harness=",".join(HARNESSES.kinds()))
    harnesses = [build_harness(config, kind) for kind in harness_kinds(every_kind).values()]
    rewards = config.reward.build(tests=None)
    proxy = stack.proxy_config(admin_key="a-fixed-admin-key-of-the-test")
    return {
        "bricks": state((bricks.engine, bricks.proxy, bricks.algorithm, bricks.sandboxes, bricks.loggers)),
        "engine": state(engine_state),  # what the engine runs with (an engine field must change it)
        "built": state((trainer, harnesses, rewards, proxy)),
    }


def slot_kinds() -> list[tuple[str, str]]:
    """(slot, kind) for every kind of every slot of the recipe's config."""
    pairs = []
    for leaf in _leaves(SweGrpoConfig):
        if leaf.choices is not None:
            pairs += [(leaf.path[0], kind) for kind in leaf.choices]
    return pairs


@pytest.mark.parametrize(("slot", "kind"), [(None, None), *slot_kinds()])
def test_every_field_reaches_the_object_it_configures(slot, kind, rubric, tiny_model_dir, tmp_path):
    kinds = {slot: kind} if slot else {}
    base_flags = kind_flags(kinds, rubric)
    base = parse_config(SweGrpoConfig, base_flags)
    reference = built(base, tiny_model_dir, tmp_path)
    leaves = [
        leaf
        for leaf in _leaves(SweGrpoConfig, kinds={(slot,): kind} if slot else {})
        if leaf.choices is None and (leaf.path[0] == slot if slot else leaf.path[0] not in dict(slot_kinds()))
    ]
    assert leaves or slot, "no field found"
    unreached, unset = [], []
    for leaf in leaves:
        if leaf.path[0] in RUN_WING_BRICKS or (len(leaf.path) == 1 and leaf.path[0] in RUN_WING_FIELDS):
            continue
        if (kind, leaf.dotted) in FIXED_FIELDS:
            continue
        flags, expected = base_flags, reference
        companions = COMPANION_FLAGS.get(leaf.dotted, lambda model_dir: [])(tiny_model_dir)
        companions += ENGINE_COMPANION_FLAGS.get((kind, leaf.dotted), [])
        if companions:
            flags = [*base_flags, *companions]
            expected = built(parse_config(SweGrpoConfig, flags), tiny_model_dir, tmp_path)
        default = dotted(base if flags is base_flags else parse_config(SweGrpoConfig, flags), leaf.path)
        for text in candidates(leaf.annotation, default, rubric):
            try:
                config = parse_config(SweGrpoConfig, [*flags, f"--{leaf.flags[0]}", text])
            except SystemExit:  # not a valid value of this field: the next candidate
                continue
            if dotted(config, leaf.path) != default:
                break
        else:
            unset.append(leaf.dotted)
            continue
        changed = built(config, tiny_model_dir, tmp_path)
        engine_field = leaf.path[0] == "engine" and (kind, leaf.dotted) not in ENGINE_FIELDS_READ_BY_THE_STACK
        if changed == expected or (engine_field and changed["engine"] == expected["engine"]):
            unreached.append(f"{leaf.dotted}={text}")
    assert not unset, f"no non-default value of these fields parses from the command line: {unset}"
    assert not unreached, f"these fields never reach the object they configure: {unreached}"


@pytest.mark.parametrize("engine", ["embedded", "sglang"])
def test_model_folder_teachers_run_with_the_policy_engines_settings(engine, rubric, tiny_model_dir, tmp_path):
    threads = ["--engine-threads", "3"] if engine == "embedded" else []
    config = parse_config(SweGrpoConfig, [*kind_flags({"engine": engine}, rubric), *threads])
    run = RunDirectory(path=tmp_path, recipe="swe_grpo", model_path=tiny_model_dir)
    teacher = RunStack(config, run, Bricks.from_config(config)).teacher_engine_config(tiny_model_dir)
    # the policy's embedded settings (threads, batch size) without a prefix cache; a server engine's run: defaults
    policy = config.engine if engine == "embedded" else EmbeddedEngineBrickConfig()
    assert teacher.settings == dataclasses.replace(policy, kv_cache_gb=0.0)
    assert teacher.settings.threads == (3 if engine == "embedded" else 1)


# ``rein proxy``: the standalone proxy's tree (components/proxy/cli.py). The tree IS the ProxyConfig the server
# and the session registry run with, so a proxy field reaches its object when its value reads back from the parsed
# tree, from every spelling of its flag and from a --config file alike; an engine field must also change what the
# engine runs with (the embedded engine's config, the fleet's), as above.
STANDALONE_ENGINE_FLAGS = {
    "embedded": [],
    "sglang": ["--sglang-url", SGLANG_URL],
    "vllm": ["--vllm-url", SGLANG_URL],
}
# (engine kind, field) with no valid non-default value beside that kind
STANDALONE_FIXED_FIELDS = {
    ("sglang", "sampling.top_p"): "SGLang's logprobs ignore top-p (refused: test_proxy_cli_sampling)",
    ("sglang", "sampling.top_k"): "SGLang's logprobs ignore top-k (refused: test_proxy_cli_sampling)",
}
# values a field takes only in a form the generic candidates lack
STANDALONE_VALUES = {"admin_key": "k" * 40}


def standalone_engine_state(engine: Any, model_dir: Path) -> Any:
    """What ``start_standalone`` runs the engine with (built, not started)."""
    from components.engine.embedded import EmbeddedEngineConfig

    if isinstance(engine, EmbeddedEngineBrickConfig):
        return state(EmbeddedEngineConfig(model_path=model_dir, settings=engine))
    if isinstance(engine, VLLMBrickConfig):
        return state(vllm_fleet_config(engine, initial_weight_version=0))
    return state(
        sglang_fleet_config(
            engine, model_path=model_dir, record_routed_experts=False, initial_weight_version=0
        )
    )


def file_fields(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``a.b = value`` as a config file's nested mapping (paths as text, tuples as lists)."""
    plain = str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value
    for name in reversed(path):
        plain = {name: plain}
    return plain


@pytest.mark.parametrize("kind", sorted(STANDALONE_ENGINE_FLAGS))
def test_every_rein_proxy_field_reaches_the_object_it_configures(
    kind, rubric, tiny_model_dir, tmp_path, monkeypatch
):
    from components.proxy.cli import StandaloneProxyConfig, parse_proxy_config

    monkeypatch.delenv("REIN_PROXY_ADMIN_KEY", raising=False)
    base_flags = ["--engine", kind, *STANDALONE_ENGINE_FLAGS[kind]]
    leaves = [
        leaf for leaf in _leaves(StandaloneProxyConfig, kinds={("engine",): kind}) if leaf.choices is None
    ]
    assert {leaf.dotted for leaf in leaves} >= {
        "port",
        "sampling.temperature",
        "formats.tool_format",
        "engine.url",
    } - ({"engine.url"} if kind == "embedded" else set())
    unset, unreached, other_spellings, from_file = [], [], [], []
    for leaf in leaves:
        if (kind, leaf.dotted) in STANDALONE_FIXED_FIELDS:
            continue
        flags = [*base_flags, *ENGINE_COMPANION_FLAGS.get((kind, leaf.dotted), [])]
        reference = parse_proxy_config(flags)
        default = dotted(reference, leaf.path)
        texts = [STANDALONE_VALUES[leaf.dotted]] if leaf.dotted in STANDALONE_VALUES else []
        for text in [*texts, *candidates(leaf.annotation, default, rubric)]:
            try:
                config = parse_proxy_config([*flags, f"--{leaf.flags[0]}", text])
            except SystemExit:  # not a valid value of this field: the next candidate
                continue
            if dotted(config, leaf.path) != default:
                break
        else:
            unset.append(leaf.dotted)
            continue
        value = dotted(config, leaf.path)
        for flag in leaf.flags[1:]:  # a historical spelling sets the same field
            if dotted(parse_proxy_config([*flags, f"--{flag}", text]), leaf.path) != value:
                other_spellings.append(f"--{flag}")
        config_file = tmp_path / "proxy.json"
        config_file.write_text(json.dumps(file_fields(leaf.path, value)))
        pairs = zip(flags[::2], flags[1::2], strict=True)  # the base flags but the field's own (a URL)
        others = [
            word
            for flag, given in pairs
            if flag.removeprefix("--") not in leaf.flags
            for word in (flag, given)
        ]
        if dotted(parse_proxy_config([*others, "--config", str(config_file)]), leaf.path) != value:
            from_file.append(leaf.dotted)
        if leaf.path[0] == "engine" and standalone_engine_state(config.engine, tiny_model_dir) == (
            standalone_engine_state(reference.engine, tiny_model_dir)
        ):
            unreached.append(f"{leaf.dotted}={text}")
    assert not unset, f"no non-default value of these fields parses from the command line: {unset}"
    assert not other_spellings, f"these spellings do not set their field: {other_spellings}"
    assert not from_file, f"these fields do not read back from a --config file: {from_file}"
    assert not unreached, f"these engine fields never reach what the engine runs with: {unreached}"
