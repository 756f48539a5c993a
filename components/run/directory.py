"""The run directory (``runs/<recipe>-<time>`` unless ``--run-dir``); which steps of it are done is the resume
ledger in the checkpoint (``RunStack.ledger``, a ``TrajectoryLedger``), shared by every rollout mode."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from components.models.registry import REPO_ROOT, resolve_model
from components.recipe_config import config_to_json

if TYPE_CHECKING:
    from components.run.config import RunConfig


@dataclass(frozen=True)
class RunDirectory:
    """The one directory a run writes everything into."""

    path: Path
    recipe: str
    model_path: Path

    @classmethod
    def create(cls, config: RunConfig, *, recipe: str) -> RunDirectory:
        """Make (or reopen, to resume) the run directory; write ``config.json``; log to ``logs/driver.log``."""
        path = Path(config.run_dir or REPO_ROOT / "runs" / f"{recipe}-{time.strftime('%Y%m%d-%H%M%S')}")
        path = path.resolve()
        (path / "logs").mkdir(parents=True, exist_ok=True)
        run = cls(path=path, recipe=recipe, model_path=resolve_model(config.model).resolve())
        recorded = {"recipe": recipe, "model_path": str(run.model_path), **json.loads(config_to_json(config))}
        (path / "config.json").write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        handler = logging.FileHandler(path / "logs" / "driver.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)
        for chatty in ("httpx", "httpx2", "httpcore"):  # one line per model call otherwise
            logging.getLogger(chatty).setLevel(logging.WARNING)
        return run


UNTRAINED_DIR = "untrained"  # under the run directory: a store of rollouts left out of training
