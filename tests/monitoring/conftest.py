"""A realistic run directory for the monitoring tests: real Parquet shards written by ``TrajectoryStore``,
token ids from the real SmolLM2 tokenizer, train logprobs, a ``config.json`` naming the model, and a
``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.trajectory_store import TrajectoryStore
from monitoring.train_logprobs import write_train_logprobs
from tests.monitoring.monitoring_run_builder import build_trajectories, train_logprob_rows


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory, tokenizer, default_model_dir) -> Path:
    """A finished two-step run directory (read-only for the tests)."""
    directory = tmp_path_factory.mktemp("run") / "swe-grpo-test"
    trajectories = build_trajectories(tokenizer)
    store = TrajectoryStore(directory)
    store.write(trajectories[:2])
    store.write(trajectories[2:])
    write_train_logprobs(directory, 2, train_logprob_rows(trajectories))
    (directory / "config.json").write_text(
        json.dumps({"engine": {"model": str(default_model_dir)}, "num_steps": 2})
    )
    with open(directory / "metrics.jsonl", "w") as handle:
        for step, reward, loss in ((1, 0.5, 0.31), (2, 0.25, 0.27)):
            handle.write(
                json.dumps(
                    {
                        "step": step,
                        "rollout/reward_mean": reward,
                        "rollout/pass_rate": reward,
                        "train/loss": loss,
                        "train/logprob_pearson": 0.99,
                    }
                )
                + "\n"
            )
    return directory
