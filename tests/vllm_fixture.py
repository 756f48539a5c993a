"""One real vLLM server per test run, started as users start it (its own process, its own venv).

Its start-up (minutes on CPU) overlaps the other tests: ``start_vllm_server_early`` (called from
``pytest_collection_finish`` in ``tests/conftest.py``) spawns the process as soon as collection finds a test that
uses the ``vllm_server`` fixture; the fixture only waits for ``/health``. The served model is a tiny random Llama
with the SmolLM2 tokenizer whose head size (64) vLLM's CPU attention supports (the suite's 16 is not). Tests
marked ``vllm_kills_server`` run last (``order_server_killers_last``). ``REIN_TEST_VLLM_URL=URL[#WINDOW]`` points the
tests at a server already serving that model (``python -m tests.vllm_fixture`` prints how to start one)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

VLLM_HIDDEN_SIZE = 256  # 4 heads of 64
VLLM_MAX_POSITIONS = 4096
VLLM_CONTEXT_WINDOW = 1024
STARTUP_TIMEOUT_S = 900.0


@dataclass
class RunningVLLM:
    """The session's server: its URL, the model folders, and the process (to kill it in the last test)."""

    url: str
    served_model: str
    model_dir: Path  # what it was started with (version 0)
    next_model_dir: Path  # the same architecture, other weights
    process: object  # VLLMServerProcess (None: a server started outside the tests)
    log_path: Path
    context_window: int = VLLM_CONTEXT_WINDOW


_state: dict[str, object] = {}


def _build_models(root: Path) -> tuple[Path, Path]:
    from components.models.registry import default_model_dir
    from components.models.tiny import build_tiny_model

    options = dict(
        tokenizer_dir=default_model_dir(), hidden_size=VLLM_HIDDEN_SIZE, max_positions=VLLM_MAX_POSITIONS
    )
    return (
        build_tiny_model(root / "vllm-tiny", seed=0, **options),
        build_tiny_model(root / "vllm-tiny-next", seed=1, **options),
    )


def start_vllm_server_early(session: pytest.Session) -> None:
    """Spawn the server when a collected test needs it (once; it starts while other tests run)."""
    if _state or not any("vllm_server" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    from components.engine.vllm_server import VLLMServerConfig, VLLMServerProcess

    root = Path(tempfile.mkdtemp(prefix="rein-vllm-"))
    _state["root"] = root
    try:
        model_dir, next_dir = _build_models(root)
        if os.environ.get("REIN_TEST_VLLM_URL"):  # a server already serving _build_models' first model
            url, _, window = os.environ["REIN_TEST_VLLM_URL"].partition("#")
            _state["server"] = RunningVLLM(
                url=url, served_model="tiny", model_dir=model_dir, next_model_dir=next_dir, process=None,
                log_path=root / "server.log", context_window=int(window or VLLM_CONTEXT_WINDOW),
            )  # fmt: skip
            return
        config = VLLMServerConfig(
            model_path=model_dir, served_model="tiny", max_model_len=VLLM_CONTEXT_WINDOW, enable_lora=True
        )
        server = VLLMServerProcess(config, log_path=root / "server.log").start()
    except Exception as error:  # reported by the fixture, in the tests that need the server
        _state["error"] = error
        return
    _state["server"] = RunningVLLM(
        url=server.url,
        served_model="tiny",
        model_dir=model_dir,
        next_model_dir=next_dir,
        process=server,
        log_path=root / "server.log",
    )


def stop_vllm_server() -> None:
    server = _state.get("server")
    if server is not None and server.process is not None:
        server.process.stop()
    root = _state.get("root")
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
    _state.clear()


def order_server_killers_last(items: list[pytest.Item]) -> None:
    """Tests that kill the session's server run after every other test; those that start it again
    (``@pytest.mark.vllm_kills_server(restarts=True)``) before those that leave it dead."""

    def rank(item: pytest.Item) -> int:
        marker = item.get_closest_marker("vllm_kills_server")
        return 0 if marker is None else 1 if marker.kwargs.get("restarts") else 2

    items.sort(key=rank)


def restart_vllm_server(server: RunningVLLM) -> None:
    """Start the session's (killed) server again on its port, with its start-up weights; the fixture stops it."""
    from components.engine.vllm_server import VLLMServerProcess

    old = server.process
    assert old is not None and not old.alive(), "restart a server only after it died"
    config = dataclasses.replace(old.config, port=old.port)
    server.process = VLLMServerProcess(config, log_path=server.log_path).start()


@pytest.fixture(scope="session")
def vllm_server() -> RunningVLLM:
    """The session's vLLM server, healthy (waits for its start-up)."""
    if "error" in _state:
        pytest.fail(f"the vLLM server could not be started: {_state['error']}")
    server = _state.get("server")
    assert isinstance(server, RunningVLLM), "start_vllm_server_early did not run (tests/conftest.py)"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if server.process is not None and not server.process.alive():
            pytest.fail(f"the vLLM server exited during start-up: {server.process.log_tail()}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"the vLLM server was not healthy after {STARTUP_TIMEOUT_S:g} s: {server.process.log_tail()}"
            )
        time.sleep(2.0)
