"""The cluster launch files (``launch/``) are accepted by the tools' own loaders, offline, and the recipe command
inside each is one the recipe's own parser accepts:

- ``launch/skypilot.yaml``: SkyPilot's task loader (``sky.Task.from_yaml``, the ``skypilot`` package pinned in
  ``.sky-venv`` by ``make setup-test``, apart from the project's own dependencies), which checks the file
  against SkyPilot's task schema; a misspelt field is refused (the loader is no rubber stamp).
- ``launch/kuberay-rayjob.yaml``: its RayJob against the ``ray.io/v1`` RayJob CRD schema of KubeRay v1.7.0
  (``ray.io_rayjobs-v1.7.0.yaml.gz`` beside this file: ``ray-operator/config/crd/bases/ray.io_rayjobs.yaml`` of
  the KubeRay repository at tag v1.7.0, sha256 01a5cf3b...49121f5, Apache-2.0; no registry this project reaches
  serves it), with unknown fields refused as ``kubectl apply --validate=strict`` refuses them.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from components.recipe_config import parse_config
from recipes.swe_grpo import SweGrpoConfig
from tests.required_tools import require_tool

REPO_ROOT = Path(__file__).resolve().parents[2]
SKYPILOT_TASK = REPO_ROOT / "launch" / "skypilot.yaml"
RAYJOB = REPO_ROOT / "launch" / "kuberay-rayjob.yaml"
SKY_PYTHON = REPO_ROOT / ".sky-venv" / "bin" / "python"
RAYJOB_CRD = Path(__file__).with_name("ray.io_rayjobs-v1.7.0.yaml.gz")
RECIPE = "recipes/swe_grpo.py"

LOAD_TASK = """
import json, sys
import sky
task = sky.Task.from_yaml(sys.argv[1])
print(json.dumps({
    "num_nodes": task.num_nodes,
    "envs": task.envs,
    "run": task.run,
    "setup": task.setup,
    "accelerators": sorted(count for r in task.resources for count in r.accelerators.values()),
    "storage_mounts": sorted(task.storage_mounts),
}))
"""


def _load_skypilot_task(path: Path, home: Path) -> subprocess.CompletedProcess:
    python = require_tool(SKY_PYTHON, "run `make setup-test` (the pinned skypilot venv)")
    return subprocess.run(
        [str(python), "-c", LOAD_TASK, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(home)},  # SkyPilot writes its state under ~/.sky: not in the repository
    )


def _recipe_argv(script: str, variables: dict[str, str]) -> list[str]:
    """The recipe command of a shell script (continuation lines joined, ``&&`` lists split), its ``$VAR`` /
    ``${VAR}`` expanded."""
    joined = script.replace("\\\n", " ").replace("&&", "\n")
    lines = [line.strip() for line in joined.splitlines() if line.strip().startswith(f"python {RECIPE}")]
    assert len(lines) == 1, f"expected one `python {RECIPE}` line, got {lines}"

    def expand(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in variables, f"the recipe command uses ${name}, which nothing defines"
        return variables[name]

    argv = shlex.split(re.sub(r"\$\{(\w+)\}|\$(\w+)", expand, lines[0]))
    return argv[2:]


def _parse_recipe(argv: list[str], *, model_dir: str, local_model_dir: Path) -> SweGrpoConfig:
    """The recipe's parser on ``argv``, with the policy folder the file downloads on the cluster (``model_dir``)
    standing for a local one (the parser checks that ``--model`` is an HF folder)."""
    assert argv.count(model_dir) == 1 and argv[argv.index(model_dir) - 1] == "--model", argv
    return parse_config(SweGrpoConfig, [str(local_model_dir) if a == model_dir else a for a in argv])


@pytest.mark.timeout(300)
def test_skypilot_task_loads_and_its_recipe_command_parses(tmp_path, default_model_dir):
    loaded = _load_skypilot_task(SKYPILOT_TASK, tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    task = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert task["num_nodes"] == 2 and task["storage_mounts"] == ["/mnt/rein-runs"]
    assert task["accelerators"] == [8, 8]  # 8 GPUs a node, whichever kind is found
    assert "pip install" in task["setup"] and "vllm.entrypoints.openai.api_server" in task["run"]
    # what the script itself sets, and what SkyPilot sets on every node
    variables = {
        **task["envs"],
        "VLLM_IP": "10.0.0.2",
        "HEAD_IP": "10.0.0.1",
        "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    }
    argv = _recipe_argv(task["run"], variables)
    assert 'hf download "$MODEL" --local-dir "$MODEL_DIR"' in task["setup"]
    config = _parse_recipe(argv, model_dir=task["envs"]["MODEL_DIR"], local_model_dir=default_model_dir)
    assert (
        config.num_steps == int(task["envs"]["NUM_STEPS"]) and str(config.run_dir) == task["envs"]["RUN_DIR"]
    )
    assert config.rollout.mode == "async" and config.checkpoint_every_steps == 5

    broken = tmp_path / "skypilot.yaml"  # the weakened file: one misspelt field
    broken.write_text(SKYPILOT_TASK.read_text().replace("num_nodes: 2", "num_node: 2"))
    refused = _load_skypilot_task(broken, tmp_path)
    assert refused.returncode != 0 and "num_node" in refused.stderr, refused.stderr[-2000:]


def _strict(schema: dict) -> dict:
    """The CRD's structural schema with unknown fields refused wherever it lists the fields (as the API server's
    strict field validation does), except where it preserves unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def _rayjob_validator() -> jsonschema.Validator:
    crd = yaml.safe_load(gzip.decompress(RAYJOB_CRD.read_bytes()))
    assert crd["spec"]["names"]["kind"] == "RayJob" and crd["spec"]["group"] == "ray.io"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def test_kuberay_rayjob_matches_the_crd_and_its_entrypoint_parses(default_model_dir):
    documents = list(yaml.safe_load_all(RAYJOB.read_text()))
    (job,) = [d for d in documents if d["kind"] == "RayJob"]
    (service,) = [d for d in documents if d["kind"] == "Service"]
    assert job["apiVersion"] == "ray.io/v1"
    validator = _rayjob_validator()
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)]
    assert not errors, errors
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    (inference,) = [g for g in groups if g["groupName"] == "inference"]
    assert service["spec"]["selector"].items() <= inference["template"]["metadata"]["labels"].items()
    entrypoint = job["spec"]["entrypoint"]
    assert entrypoint.startswith("hf download Qwen/Qwen3-8B --local-dir /runs/models/Qwen3-8B &&")
    argv = _recipe_argv(entrypoint, {})
    config = _parse_recipe(argv, model_dir="/runs/models/Qwen3-8B", local_model_dir=default_model_dir)
    assert config.num_steps == 100 and str(config.run_dir).startswith("/runs/")
    assert f"http://{service['metadata']['name']}:8000" in job["spec"]["entrypoint"]

    for weakened in (  # the weakened manifests: a misspelt field, a wrong type
        {**job, "spec": {**job["spec"], "entryPoint": job["spec"]["entrypoint"]}},
        {**job, "spec": {**job["spec"], "backoffLimit": "two"}},
    ):
        assert list(validator.iter_errors(weakened)), "the schema let a broken RayJob through"


def test_a_recipe_command_the_parser_refuses_fails_the_check(default_model_dir):
    with pytest.raises(SystemExit):
        _parse_recipe(
            ["--model", "M", "--num-steps", "many"], model_dir="M", local_model_dir=default_model_dir
        )
