"""Where per-step metrics go: ``RUN_DIR/metrics.jsonl`` (always), Weights & Biases (offline unless the user is
logged in), or both at once. Every logger honours the ``MetricsLogger`` contract: ``log`` never raises on a
backend hiccup (it logs a warning and carries on), ``close`` flushes and is idempotent."""

from __future__ import annotations

import json
import logging
import math
import netrc
import os
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlparse

from components.config import option, require, require_one_of
from components.protocols import MetricsLogger, MetricsLoggerProvider
from components.registry import LOGGERS

logger = logging.getLogger(__name__)

METRICS_FILE_NAME = "metrics.jsonl"
WANDB_DIR_NAME = "wandb"
WANDB_MODES = ("auto", "offline", "online", "disabled")
WANDB_FLUSH_TIMEOUT_S = 10.0
_WANDB_ENV_MODES = {
    "offline": "offline",
    "dryrun": "offline",
    "online": "online",
    "run": "online",
    "disabled": "disabled",
}


def _json_value(value: Any) -> Any:
    """A metric value as JSON can carry it: numpy scalars → Python numbers, NaN/inf → null."""
    if callable(getattr(value, "tolist", None)):  # numpy / torch scalars and arrays
        try:
            value = value.tolist()
        except (ValueError, RuntimeError, TypeError):
            return str(value)
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return str(value)


class JsonlLogger:
    """Appends one JSON object per ``log`` call (``{"step": n, ...metrics}``) to ``RUN_DIR/metrics.jsonl``,
    flushed per line, so a killed run loses at most the line being written."""

    def __init__(self, run_dir: Path | str, *, file_name: str = METRICS_FILE_NAME) -> None:
        self.path = Path(run_dir) / file_name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # A run killed mid-line leaves a torn last line; start on a fresh line so only that line is lost.
        needs_newline = (
            self.path.exists() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
        )
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        if needs_newline:
            self._handle.write("\n")
            self._handle.flush()

    def log(self, metrics: Mapping[str, Any], *, step: int) -> None:
        """Append ``{"step": step, **metrics}`` as one line."""
        try:
            record = {
                "step": int(step),
                **{str(k): _json_value(v) for k, v in metrics.items() if k != "step"},
            }
            line = json.dumps(record, allow_nan=False)
            with self._lock:
                if self._handle.closed:
                    logger.warning("JsonlLogger.log after close; dropping step %s", step)
                    return
                self._handle.write(line + "\n")
                self._handle.flush()
        except Exception as error:  # the contract: a logging hiccup never stops a run
            logger.warning("could not append metrics of step %s to %s: %s", step, self.path, error)

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        with self._lock:
            if not self._handle.closed:
                try:
                    self._handle.flush()
                    os.fsync(self._handle.fileno())
                except OSError as error:
                    logger.warning("could not flush %s: %s", self.path, error)
                self._handle.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def read_metrics(run_dir: Path | str, *, file_name: str = METRICS_FILE_NAME) -> list[dict[str, Any]]:
    """The per-step records of ``RUN_DIR/metrics.jsonl``, sorted by step; when a resumed run logged a step
    again, the last record of that step wins. Torn or non-JSON lines are skipped with a warning."""
    path = Path(run_dir) / file_name
    if not path.exists():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                logger.warning("skipping unreadable line %d of %s", number, path)
                continue
            by_step[step] = record
    return [by_step[step] for step in sorted(by_step)]


@dataclass(frozen=True, kw_only=True)
class WandbLoggerConfig:
    """A Weights & Biases run whose files live under ``RUN_DIR/wandb``."""

    run_dir: Path  # the run directory; wandb writes into run_dir/wandb
    project: str = "rein"
    # "auto": offline unless WANDB_MODE says otherwise or the user is logged in (WANDB_API_KEY or a netrc
    # entry for the wandb host) - then online. "offline" | "online" | "disabled" force that mode.
    mode: str = "auto"
    name: str | None = None  # the run's display name (wandb picks one when None)
    config: Mapping[str, Any] = field(default_factory=dict)  # the run's config, shown by wandb
    entity: str | None = None
    tags: Sequence[str] = ()
    record_system_stats: bool = False  # wandb's CPU/GPU/memory sampling (off: no extra process work in tests)

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        require(bool(self.project), "project", "must be a non-empty string")
        require_one_of(self.mode, "mode", WANDB_MODES)
        object.__setattr__(self, "tags", tuple(self.tags))

    def resolved_mode(self) -> str:
        """The mode wandb will run in once ``auto`` is decided."""
        if self.mode != "auto":
            return self.mode
        env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
        if env_mode in _WANDB_ENV_MODES:
            return _WANDB_ENV_MODES[env_mode]
        return "online" if _wandb_logged_in() else "offline"


def _wandb_logged_in() -> bool:
    """Whether an API key is at hand (environment or netrc), without touching the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    netrc_path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return netrc.netrc(str(netrc_path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger:
    """Logs to a wandb run under ``RUN_DIR/wandb``. Restarting a run with the same directory continues the same
    wandb run id (kept in ``RUN_DIR/wandb/run_id``)."""

    def __init__(self, config: WandbLoggerConfig) -> None:
        import wandb

        self.config = config
        self.mode = config.resolved_mode()
        self.directory = config.run_dir / WANDB_DIR_NAME
        self.directory.mkdir(parents=True, exist_ok=True)
        run_id = self._stable_run_id()
        self._lock = threading.Lock()
        self._run = wandb.init(
            project=config.project,
            entity=config.entity,
            name=config.name,
            config=_json_value(dict(config.config)),
            tags=list(config.tags) or None,
            dir=str(config.run_dir),  # wandb appends "wandb/"
            id=run_id,
            resume="allow",
            mode=self.mode,
            reinit="create_new",
            settings=wandb.Settings(
                console="off", silent=True, x_disable_stats=not config.record_system_stats
            ),
        )
        self.run_id: str = self._run.id
        # The wandb run's own folder (RUN_DIR/wandb/offline-run-… or run-…); None when disabled.
        self.run_path: Path | None = None if self.mode == "disabled" else Path(self._run.dir).parent

    def _stable_run_id(self) -> str:
        path = self.directory / "run_id"
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        run_id = uuid.uuid4().hex[:12]
        temp = path.with_name(".run_id.tmp")
        temp.write_text(run_id)
        os.replace(temp, path)
        return run_id

    def log(self, metrics: Mapping[str, Any], *, step: int) -> None:
        """Log one step's metrics (non-finite floats become None, so wandb's charts skip them)."""
        try:
            with self._lock:
                if self._run is None:
                    logger.warning("WandbLogger.log after close; dropping step %s", step)
                    return
                self._run.log({str(k): _json_value(v) for k, v in metrics.items()}, step=int(step))
        except Exception as error:  # the contract: a logging hiccup never stops a run
            logger.warning("wandb could not log step %s: %s", step, error)

    def close(self) -> None:
        """Finish the wandb run, flushing its files (idempotent)."""
        with self._lock:
            if self._run is None:
                return
            try:
                self._run.finish()
                if self.mode == "offline":
                    self._wait_for_offline_file()
            except Exception as error:
                logger.warning("wandb could not finish run %s: %s", self.config.run_dir, error)
            self._run = None

    def _wait_for_offline_file(self, timeout_s: float = WANDB_FLUSH_TIMEOUT_S) -> None:
        # wandb-core (a separate process) may still be writing the run file when finish() returns; wait for its
        # final "exit" record so that a closed logger's files are complete.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(
                record.WhichOneof("record_type") == "exit" for record in wandb_offline_records(self.run_path)
            ):
                return
            time.sleep(0.05)
        logger.warning(
            "wandb's offline run file under %s was not complete after %.0f s", self.run_path, timeout_s
        )


def wandb_offline_records(run_path: Path | None) -> Iterator[Any]:
    """The protobuf records of a wandb run's ``.wandb`` file (a LevelDB-style log: 7-byte file header, 32 KiB
    blocks, each record chunk with a 7-byte header: checksum, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2

    paths = sorted(run_path.glob("*.wandb")) if run_path is not None and run_path.is_dir() else []
    if not paths:
        return
    data = paths[0].read_bytes()
    block_size, position, pending = 32768, 7, b""
    while position + 7 <= len(data):
        left_in_block = block_size - position % block_size
        if left_in_block < 7:  # too short for a chunk header: padding up to the next block
            position += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if length == 0 and kind == 0:
            position += left_in_block
            continue
        if position + 7 + length > len(data):  # a chunk still being written
            return
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST completes a record
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(pending)
            except Exception:  # a torn record: stop at what was complete
                return
            yield record


def wandb_offline_history(run_path: Path | None) -> list[dict[str, Any]]:
    """The rows a wandb run logged (``_step`` included), read back from its ``.wandb`` file."""
    rows = []
    for record in wandb_offline_records(run_path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


class MultiLogger:
    """Fans every call out to several loggers; one failing logger never stops the others."""

    def __init__(self, loggers: Sequence[MetricsLogger]) -> None:
        self.loggers = tuple(loggers)
        for item in self.loggers:
            if not isinstance(item, MetricsLogger):
                raise ValueError(
                    f"loggers: {type(item).__name__} is not a MetricsLogger (needs log and close)"
                )

    def log(self, metrics: Mapping[str, Any], *, step: int) -> None:
        """Log to every logger."""
        for item in self.loggers:
            try:
                item.log(metrics, step=step)
            except Exception as error:
                logger.warning("%s.log failed at step %s: %s", type(item).__name__, step, error)

    def close(self) -> None:
        """Close every logger."""
        for item in self.loggers:
            try:
                item.close()
            except Exception as error:
                logger.warning("%s.close failed: %s", type(item).__name__, error)


class MetricsLoggersConfig(Protocol):
    """A registered kind of the ``logger`` seam: builds the provider of a run's trackers."""

    def build(self) -> MetricsLoggerProvider: ...


@LOGGERS.register("wandb")
@dataclass(kw_only=True, frozen=True)
class WandbLoggersConfig:
    """The ``logger`` seam's built-in kind: Weights & Biases besides ``metrics.jsonl`` (always written)."""

    wandb_mode: Literal["auto", "offline", "online", "disabled"] = option(
        "auto", "wandb: auto is offline unless logged in", flag="wandb-mode"
    )
    wandb_project: str = option("rein", "wandb project of the run")

    def __post_init__(self) -> None:
        require_one_of(self.wandb_mode, "wandb_mode", WANDB_MODES)

    def build(self) -> MetricsLoggerProvider:
        """The provider of this config."""
        return WandbLoggerProvider(self)


@dataclass(frozen=True)
class WandbLoggerProvider:
    """``MetricsLoggerProvider``: a Weights & Biases run under ``RUN_DIR/wandb`` in the brick's ``wandb_mode``
    (see ``WandbLoggerConfig``); no tracker when it is ``disabled``, or when wandb cannot start (the run keeps
    logging to ``metrics.jsonl`` and says so once). Its settings are the brick's config, not a copy of it."""

    settings: WandbLoggersConfig = WandbLoggersConfig()

    def open(
        self, run_dir: Path, *, run_name: str | None, run_config: Mapping[str, Any]
    ) -> list[MetricsLogger]:
        """The wandb logger of the run in ``run_dir`` (a list of at most one)."""
        mode, project = self.settings.wandb_mode, self.settings.wandb_project
        if mode == "disabled":
            return []
        run_dir = Path(run_dir)
        wandb_config = WandbLoggerConfig(
            run_dir=run_dir, project=project, name=run_name, config=dict(run_config), mode=mode
        )
        try:
            return [WandbLogger(wandb_config)]
        except Exception as error:
            logger.warning(
                "wandb could not start (%s); logging to %s only", error, run_dir / METRICS_FILE_NAME
            )
            return []


def run_loggers(
    run_dir: Path | str,
    *,
    project: str = "rein",
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    wandb_mode: str = "auto",
    trackers: MetricsLoggerProvider | None = None,
) -> MultiLogger:
    """The loggers of a run: ``metrics.jsonl`` (always) plus what ``trackers`` opens (default: wandb in
    ``wandb_mode``)."""
    run_dir = Path(run_dir)
    trackers = trackers or WandbLoggersConfig(wandb_mode=wandb_mode, wandb_project=project).build()
    return MultiLogger(
        [JsonlLogger(run_dir), *trackers.open(run_dir, run_name=name, run_config=config or {})]
    )
