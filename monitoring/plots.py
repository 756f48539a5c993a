"""The learning-curve PNG of a run: reward, pass rate, loss and train-vs-rollout logprob Pearson per step,
read from ``RUN_DIR/metrics.jsonl`` and written to ``RUN_DIR/learning_curves.png`` (atomically)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monitoring.logger import METRICS_FILE_NAME, read_metrics

LEARNING_CURVES_FILE_NAME = "learning_curves.png"

# Each panel: title → the metric keys that may carry it, first present wins (the rollout stats' names first);
# a key starting with "*" matches any logged key containing the rest.
PANELS: dict[str, tuple[str, ...]] = {
    "mean reward": ("rollout/reward_mean", "reward_mean", "reward"),
    "pass rate": ("rollout/pass_rate", "pass_rate"),
    "loss": ("train/loss", "loss"),
    "train vs rollout logprob Pearson": ("train/logprob_pearson", "logprob_pearson", "*pearson"),
}


def _series(
    records: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> tuple[str | None, list[int], list[float]]:
    """The first key of ``keys`` any record carries, and its (step, value) points with finite values."""
    logged = sorted({key for record in records for key in record})
    expanded = []
    for key in keys:
        expanded += [k for k in logged if key[1:] in k] if key.startswith("*") else [key]
    for key in expanded:
        points = [
            (int(r["step"]), float(r[key]))
            for r in records
            if isinstance(r.get(key), int | float)
            and not isinstance(r.get(key), bool)
            and math.isfinite(r[key])
        ]
        if points:
            return key, [p[0] for p in points], [p[1] for p in points]
    return None, [], []


def write_learning_curves(
    run_dir: Path | str,
    *,
    out: Path | str | None = None,
    panels: Mapping[str, Sequence[str]] = PANELS,
    title: str | None = None,
) -> Path:
    """Plot ``RUN_DIR/metrics.jsonl`` into a PNG (default ``RUN_DIR/learning_curves.png``); return its path.

    A panel whose metric was never logged says so instead of failing; a missing run directory raises."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run_dir: {run_dir} is not a directory")
    records = read_metrics(run_dir)
    out = Path(out) if out is not None else run_dir / LEARNING_CURVES_FILE_NAME
    out.parent.mkdir(parents=True, exist_ok=True)

    columns = 2
    rows = max(1, math.ceil(len(panels) / columns))
    figure = Figure(figsize=(6 * columns, 3.6 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)  # Agg, without pyplot's global state: safe in threads and headless
    figure.suptitle(title or f"{run_dir.name} - {len(records)} steps", fontsize=12)
    for index, (panel_title, keys) in enumerate(panels.items()):
        axes = figure.add_subplot(rows, columns, index + 1)
        key, steps, values = _series(records, keys)
        axes.set_title(panel_title, fontsize=10)
        axes.set_xlabel("step")
        axes.grid(True, alpha=0.3)
        if key is None:
            axes.text(
                0.5, 0.5, f"not logged\n({keys[0]})", ha="center", va="center", transform=axes.transAxes
            )
            axes.set_xticks([])
            axes.set_yticks([])
            continue
        axes.plot(steps, values, marker="o" if len(steps) <= 50 else None, markersize=3, linewidth=1.5)
        axes.set_ylabel(key, fontsize=8)
    if not records:
        figure.text(0.5, 0.02, f"{run_dir / METRICS_FILE_NAME} has no records yet", ha="center", fontsize=9)

    temp = out.with_name(f".{out.name}.tmp")
    try:
        figure.savefig(temp, format="png")
        os.replace(temp, out)
    finally:
        temp.unlink(missing_ok=True)
    return out
