"""The learning-curve PNG from a real metrics.jsonl."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from monitoring.logger import JsonlLogger
from monitoring.plots import _series, write_learning_curves


def test_learning_curves_png_from_metrics_jsonl(tmp_path):
    logger = JsonlLogger(tmp_path)
    for step in range(6):
        logger.log(
            {
                "rollout/reward_mean": 0.1 * step,
                "rollout/pass_rate": 0.05 * step,
                "train/loss": 1.0 / (step + 1),
                "train/logprob_pearson": 0.99,
            },
            step=step,
        )
    logger.close()
    path = write_learning_curves(tmp_path)
    assert path == tmp_path / "learning_curves.png"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1200, 720)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
        assert len(colours) > 50  # curves, text and axes were drawn, not a blank canvas
    assert not list(tmp_path.glob(".*.tmp"))


def test_missing_series_and_empty_runs_still_plot(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward": 0.2}) + "\n")
    path = write_learning_curves(tmp_path, out=tmp_path / "plots" / "curves.png")
    with Image.open(path) as image:
        assert image.format == "PNG"
    empty = tmp_path / "empty"
    empty.mkdir()
    with Image.open(write_learning_curves(empty)) as image:
        assert image.format == "PNG"


def test_series_picks_the_first_logged_key_and_skips_non_finite_values():
    records = [
        {"step": 0, "loss": 1.0},
        {"step": 1, "loss": None},
        {"step": 2, "loss": 0.5, "train/loss": 0.4},
    ]
    assert _series(records, ("train/loss", "loss")) == ("train/loss", [2], [0.4])
    assert _series(records, ("loss",)) == ("loss", [0, 2], [1.0, 0.5])
    assert _series(records, ("absent",)) == (None, [], [])
    assert _series(
        [{"step": 3, "train/rollout_logprob_pearson_r": 0.9}], ("logprob_pearson", "*pearson")
    ) == (
        "train/rollout_logprob_pearson_r",
        [3],
        [0.9],
    )


def test_missing_run_dir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run_dir"):
        write_learning_curves(tmp_path / "nope")
