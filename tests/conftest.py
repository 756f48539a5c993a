"""Session-wide fixtures: one Ray session and one tiny model per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import vllm_fixture

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--brick",
        action="append",
        default=[],
        metavar="MODULE:OBJECT",
        help="run the contract suites in tests/contracts against this brick instead of the built-in ones "
        "(e.g. examples.bricks.reinforce:Reinforce); repeatable",
    )


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session shared by every test that needs Ray (starting one costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            object_store_memory=512 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
        )
    yield ray
    # Left running for the rest of the session; pytest's exit tears the local cluster down.


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The set-up default policy (SmolLM2-135M-Instruct)."""
    from components.models.registry import default_model_dir as path

    if not (path() / "config.json").exists():
        pytest.fail(f"default model missing at {path()}: run `make setup`")
    return path()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """A tiny random Llama with the SmolLM2 tokenizer (built once per session)."""
    from components.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", tokenizer_dir=default_model_dir)


@pytest.fixture(scope="session")
def tiny_moe_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """A tiny random Mixtral-style MoE with the SmolLM2 tokenizer."""
    from components.models.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-moe", tokenizer_dir=default_model_dir, moe=True
    )


@pytest.fixture(scope="session")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


# One real vLLM server per test run, spawned right after collection so its start-up overlaps other tests.
vllm_server = vllm_fixture.vllm_server


_PROCESS_GUARD = pytest.StashKey()


def pytest_configure(config):
    from components.process_guard import ProcessGuard

    # A pytest run killed with SIGKILL leaves none of its tests' processes behind (local Ray clusters, the
    # shared vLLM server, sandboxes, recipe subprocesses): ``components/process_guard.py``.
    config.stash[_PROCESS_GUARD] = ProcessGuard.start()


def pytest_unconfigure(config):
    config.stash[_PROCESS_GUARD].close()


def pytest_collection_modifyitems(config, items):
    vllm_fixture.order_server_killers_last(items)


def pytest_collection_finish(session):
    vllm_fixture.start_vllm_server_early(session)


def pytest_sessionfinish(session, exitstatus):
    vllm_fixture.stop_vllm_server()
