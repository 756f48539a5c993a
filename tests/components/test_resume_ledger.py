"""The run's one resume ledger (``components.run.stack.resume_ledger``): every rollout mode records its steps in
the ``TrajectoryLedger`` of the trainer state; a sync checkpoint from before that holds only ``consumed_shards``."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.rollout.buffer import LEDGER_KEY, TrajectoryLedger
from components.run.stack import resume_ledger
from components.training import TrainerState

STORED = {0: Path("shard-a.parquet"), 1: Path("shard-b.parquet"), 2: Path("shard-c.parquet")}


def test_the_checkpoint_ledger_decides_which_steps_are_done():
    ledger = TrajectoryLedger()
    ledger.record_step(0, ["shard-a.parquet"])
    ledger.record_step(1, [])  # a step that trained nothing is done too
    ledger.record_dropped(["shard-x.parquet"], "too stale")
    state = TrainerState(consumed_shards=("shard-a.parquet",), extra={LEDGER_KEY: ledger.to_state()})

    resumed = resume_ledger(state, STORED)

    assert resumed.step_shards == {0: ["shard-a.parquet"], 1: []}
    assert resumed.dropped == {"shard-x.parquet": "too stale"}
    with pytest.raises(ValueError, match="already"):  # a done step is never trained again
        resumed.record_step(1, ["shard-b.parquet"])


def test_a_sync_checkpoint_without_a_ledger_resumes_from_its_consumed_shards():
    state = TrainerState(consumed_shards=("shard-a.parquet", "shard-b.parquet"))

    resumed = resume_ledger(state, STORED)

    assert resumed.step_shards == {
        0: ["shard-a.parquet"],
        1: ["shard-b.parquet"],
    }  # step 2: stored, not trained
    with pytest.raises(ValueError, match="already trained"):
        resumed.record_step(2, ["shard-a.parquet"])


def test_a_fresh_run_has_every_step_pending():
    assert resume_ledger(TrainerState(), STORED).step_shards == {}
