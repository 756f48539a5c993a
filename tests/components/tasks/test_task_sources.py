"""The task-source seam: each kind is picked by name (``--tasks KIND`` or ``KIND:PATH``) and its fields reach
the tasks it loads and the environment it gives the agents."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from components.recipe_config import parse_config
from components.registry import TASK_SOURCES
from components.tasks.sources import BuiltinTaskSourceConfig, R2ETaskSourceConfig, SweBenchTaskSourceConfig
from recipes.swe_grpo import SweGrpoConfig
from tests.components.tasks.test_swebench_loader import _row


def test_the_built_in_source_and_its_task_ids(capsys):
    assert set(TASK_SOURCES.kinds()) >= {"builtin", "swebench", "r2e"}
    config = parse_config(SweGrpoConfig, ["--model", "tiny"])
    assert config.tasks == BuiltinTaskSourceConfig() and len(config.tasks.build()) == 45
    some = parse_config(SweGrpoConfig, ["--model", "tiny", "--task-ids", "minilib-text-slugify-edges,minilib-roman-ninety"]).tasks
    assert [task.task_id for task in some.build()] == ["minilib-text-slugify-edges", "minilib-roman-ninety"]
    with pytest.raises(ValueError, match=r"task_ids: unknown task ids \['nope'\]"):
        BuiltinTaskSourceConfig(task_ids=("nope",)).build()
    for bad, message in (
        (["--tasks", "csv:rows"], "invalid choice: 'csv:rows' (choose from 'builtin', 'r2e', 'swebench'"),
        (["--tasks", "builtin:rows"], "tasks: kind 'builtin' has no builtin:VALUE form"),
        (["--tasks", "swebench"], "tasks.path: names the rows file"),
    ):
        with pytest.raises(SystemExit):
            parse_config(SweGrpoConfig, ["--model", "tiny", *bad])
        assert message in capsys.readouterr().err


async def test_a_swebench_set_from_flags_or_a_file_reaches_the_loader(tmp_path: Path):
    snapshots = tmp_path / "snapshots"
    (snapshots / "calc-1").mkdir(parents=True)
    (snapshots / "calc-1" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in (_row("calc-1"), _row("calc-no-snapshot"))))
    flags = ["--model", "tiny", "--tasks", f"swebench:{rows}", "--snapshots", str(snapshots)]
    config = parse_config(SweGrpoConfig, flags)
    assert config.tasks == SweBenchTaskSourceConfig(path=str(rows), snapshots=str(snapshots))
    long_form = ["--model", "tiny", "--tasks", "swebench", "--tasks-path", str(rows), "--tasks-snapshots"]
    assert parse_config(SweGrpoConfig, [*long_form, str(snapshots)]) == config
    (tmp_path / "run.yaml").write_text(f"tasks: {{kind: 'swebench:{rows}', snapshots: {snapshots}}}\n")
    assert parse_config(SweGrpoConfig, ["--model", "tiny", "--config", str(tmp_path / "run.yaml")]) == config
    tasks = config.tasks.build()
    assert [task.task_id for task in tasks] == ["calc-1"]  # the row without a snapshot is reported, skipped
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="path: no usable instance"):
        SweBenchTaskSourceConfig(path=str(rows), snapshots=str(tmp_path / "empty")).build()
    with pytest.raises(ValueError, match="give images_dir, snapshots_dir or both"):
        SweBenchTaskSourceConfig(path=str(rows)).build()  # neither store: no row can have a repository
    # without an image store the agents share the run's sandboxes; R2E-Gym's hidden tests stay hidden
    run_sandboxes = object()
    async with AsyncExitStack() as exits:
        sandboxes, _ = await config.tasks.environment(tasks, run_sandboxes, (), exits)
    assert sandboxes is run_sandboxes
    r2e = parse_config(SweGrpoConfig, ["--model", "tiny", "--tasks", f"r2e:{rows}"]).tasks
    assert type(r2e) is R2ETaskSourceConfig and r2e.hidden_paths() == ("/r2e_tests",)
