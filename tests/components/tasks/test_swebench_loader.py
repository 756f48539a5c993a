"""The SWE-bench-format loader: real Parquet / JSONL files, lossless rows, bad rows reported and skipped."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.tasks.swebench import (
    RepoSources,
    RowError,
    SweBenchInstance,
    instance_from_row,
    load_swebench,
    load_task_set,
    parse_r2e_log,
    r2e_row,
    swebench_image_name,
)

PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
TEST_PATCH = """diff --git a/tests/test_calc.py b/tests/test_calc.py
new file mode 100644
--- /dev/null
+++ b/tests/test_calc.py
@@ -0,0 +1,4 @@
+from calc import add
+
+def test_add():
+    assert add(2, 3) == 5
"""


def _row(instance_id: str, **changes) -> dict:
    row = {
        "instance_id": instance_id,
        "repo": "example/calc",
        "base_commit": "0" * 40,
        "patch": PATCH,
        "test_patch": TEST_PATCH,
        "problem_statement": "add() subtracts",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "1.0",
        "environment_setup_commit": "1" * 40,
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "PASS_TO_PASS": json.dumps([]),
    }
    row.update(changes)
    return row


@pytest.fixture
def snapshots(tmp_path: Path) -> Path:
    directory = tmp_path / "snapshots"
    for instance_id in ("calc-1", "calc-2", "calc-unapplicable", "calc-dup", "calc-extra"):
        repo = directory / instance_id
        repo.mkdir(parents=True)
        (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return directory


def _sources(tmp_path: Path, snapshots: Path) -> RepoSources:
    return RepoSources(snapshots_dir=snapshots, cache_dir=tmp_path / "cache")


def test_parquet_rows_load_losslessly_and_bad_rows_are_reported(tmp_path: Path, snapshots: Path) -> None:
    rows = [
        _row("calc-1"),
        _row(
            "calc-extra",
            image_name="org/calc:v1",
            difficulty="<15 min",
            test_cmd="python3 -m pytest -rA tests",
        ),
        _row("calc-missing-field", problem_statement=None),
        _row("calc-bad-json", FAIL_TO_PASS="[not json"),
        _row("calc-unapplicable", patch=PATCH.replace("return a - b", "return a * b")),
        _row("calc-no-snapshot"),
        _row("calc-dup"),
        _row("calc-dup"),
        _row("calc-2", log_parser="parse_log_nonexistent"),
    ]
    columns = list(dict.fromkeys(key for row in rows for key in row))  # a Parquet file has one schema
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows]), path)

    loaded = load_swebench(path, _sources(tmp_path, snapshots))

    assert [task.task_id for task in loaded.tasks] == ["calc-1", "calc-extra", "calc-dup"]
    reasons = {row.instance_id: row.reason for row in loaded.rejected}
    assert set(reasons) == {
        "calc-missing-field", "calc-bad-json", "calc-unapplicable", "calc-no-snapshot", "calc-dup", "calc-2"
    }  # fmt: skip
    assert "problem_statement" in reasons["calc-missing-field"]
    assert "FAIL_TO_PASS" in reasons["calc-bad-json"] and "JSON" in reasons["calc-bad-json"]
    assert "patch does not apply" in reasons["calc-unapplicable"]
    assert "no snapshot" in reasons["calc-no-snapshot"]
    assert "earlier row" in reasons["calc-dup"]
    assert "log_parser" in reasons["calc-2"]
    # Lossless: the row comes back in the data set's own encoding, extra columns included.
    extra_task = loaded.tasks[1]
    assert extra_task.instance.to_row() == rows[1]
    assert extra_task.instance.extra == {"difficulty": "<15 min"}
    assert extra_task.test_command == "python3 -m pytest -rA tests"
    assert loaded.tasks[0].test_command.endswith("-p no:cacheprovider tests/test_calc.py")


def test_workspace_is_the_base_without_the_hidden_tests_and_history(tmp_path: Path, snapshots: Path) -> None:
    subprocess.run(["git", "init", "-q"], cwd=snapshots / "calc-1", check=True)
    (snapshots / "calc-1" / "FIX_NOTES").write_text("history would live in .git")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row("calc-1")) + "\n")
    task = load_swebench(path, _sources(tmp_path, snapshots)).tasks[0]
    snapshot = task.snapshot()
    assert not (snapshot.workspace_dir / "tests" / "test_calc.py").exists()
    log = subprocess.run(
        ["git", "log", "--all", "--oneline"], cwd=snapshot.workspace_dir, capture_output=True, text=True
    )
    assert len(log.stdout.splitlines()) == 1
    spec = task.sandbox_spec()
    assert spec.root_image is None and spec.workspace_source == snapshot.workspace_dir


def test_jsonl_garbage_line_is_reported_with_its_line(tmp_path: Path, snapshots: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row("calc-1")) + "\n{oops\n[1, 2]\n")
    loaded = load_swebench(path, _sources(tmp_path, snapshots))
    assert [task.task_id for task in loaded.tasks] == ["calc-1"]
    assert [row.reason.split(" ")[:2] for row in loaded.rejected] == [["line", "2"], ["line", "3"]]


def test_images_named_by_row_by_mapping_or_by_swebench_convention(tmp_path: Path) -> None:
    images = tmp_path / "images"
    layout = images / "sweb.eval.x86_64.django_1776_django-11099"
    layout.mkdir(parents=True)
    (layout / "index.json").write_text("{}")
    (images / "calc.tar").write_bytes(b"")
    sources = RepoSources(images_dir=images, cache_dir=tmp_path / "cache")
    django = instance_from_row(_row("django__django-11099"))
    assert (
        swebench_image_name("django__django-11099")
        == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )
    assert sources.image_for(django) == f"oci:{layout}:latest"
    swegym = images / "sweb.eval.x86_64.getmoto_s_moto-5752"  # SWE-Gym's naming, found as well
    swegym.mkdir()
    (swegym / "index.json").write_text("{}")
    assert sources.image_for(instance_from_row(_row("getmoto__moto-5752"))) == f"oci:{swegym}:latest"
    calc = instance_from_row(_row("calc-1", image_name="docker.io/org/calc:v2"))
    assert sources.image_for(calc) == f"docker-archive:{images / 'calc.tar'}"
    (images / "images.json").write_text(json.dumps({"calc-1": "docker-archive:calc.tar"}))
    assert sources.image_for(instance_from_row(_row("calc-1"))) == f"docker-archive:{images / 'calc.tar'}"
    # A plain image name, as a row's image_name (issue #28.9): found in the store the same way.
    (images / "images.json").write_text(json.dumps({"calc-1": "swebench/sweb.eval.x86_64.django_1776_django-11099:latest", "calc-2": "org/absent:v1"}))  # fmt: skip
    assert sources.image_for(instance_from_row(_row("calc-1"))) == f"oci:{layout}:latest"
    with pytest.raises(RowError, match="unknown image 'org/absent:v1'"):
        sources.image_for(instance_from_row(_row("calc-2")))
    unknown = tmp_path / "rows.jsonl"
    unknown.write_text(json.dumps(_row("calc-9", image_name="org/nothing:latest")) + "\n")
    loaded = load_swebench(unknown, sources)
    assert loaded.tasks == [] and "unknown image 'org/nothing:latest'" in loaded.rejected[0].reason
    with pytest.raises(ValueError, match="tasks: expected"):
        load_task_set("huggingface:foo", images=images)


def test_r2e_gym_rows_convert_to_swebench_rows(tmp_path: Path) -> None:
    before = "== short test summary info ==\nPASSED r2e_tests/test_1.py::TestA::test_ok\nFAILED r2e_tests/test_1.py::TestA::test_bug - AssertionError\n"
    row = {
        "repo_name": "aiohttp",
        "docker_image": "namanjain12/aiohttp_final:f0d74880deec",
        "commit_hash": "f0d74880deec",
        "parsed_commit_content": json.dumps({"old_commit_hash": "abc123", "new_commit_hash": "f0d74880deec"}),
        "problem_statement": "[ISSUE]crash[/ISSUE]",
        "expected_output_json": json.dumps(
            {"TestA.test_ok": "PASSED", "TestA.test_bug": "PASSED", "TestA.test_xfail": "FAILED"}
        ),
        "execution_result_content": json.dumps({"old_commit_res_stdout": before}),
        "relevant_files": ["aiohttp/web.py"],
    }
    converted = r2e_row(row)
    instance: SweBenchInstance = instance_from_row(converted)
    assert instance.instance_id == "r2e__aiohttp-f0d74880deec"
    assert instance.fail_to_pass == ("TestA.test_bug",) and instance.pass_to_pass == ("TestA.test_ok",)
    assert instance.base_commit == "abc123" and instance.image_name == row["docker_image"]
    assert instance.extra["relevant_files"] == ["aiohttp/web.py"]
    assert "run_tests.sh" in instance.test_command
    assert parse_r2e_log(before) == {"TestA.test_ok": "PASSED", "TestA.test_bug": "FAILED"}
    bad = dict(row, expected_output_json="{nope")
    with pytest.raises(ValueError, match="JSON column unreadable"):
        r2e_row(bad)


def test_swebench_images_conda_env_leads_path(tmp_path: Path, snapshots: Path) -> None:
    """SWE-bench images keep the repository's environment in /opt/miniconda3/envs/testbed: it leads PATH."""
    from components.tasks.swebench import SweBenchTask
    from sandboxes.image import UnpackedImage

    rootfs = tmp_path / "rootfs"
    (rootfs / "opt" / "miniconda3" / "envs" / "testbed" / "bin").mkdir(parents=True)

    class UnpackedAlready:  # an image cache whose image is already unpacked at ``rootfs``
        def unpack(self, reference: str) -> UnpackedImage:
            return UnpackedImage(
                reference=reference, digest="sha256:0", rootfs=rootfs, env={"PATH": "/usr/bin"}, workdir="/"
            )

    task = SweBenchTask(
        instance=instance_from_row(_row("calc-1")),
        image="oci:/store/calc:latest",
        snapshot_source=snapshots / "calc-1",
        cache_dir=tmp_path / "cache",
        image_cache=UnpackedAlready(),
    )
    spec = task.sandbox_spec()
    assert spec.root_image == "oci:/store/calc:latest"
    assert spec.env["PATH"] == "/opt/miniconda3/envs/testbed/bin:/usr/bin"


def test_prefetcher_materialises_workspaces_in_the_background(tmp_path: Path, snapshots: Path) -> None:
    from components.tasks.swebench import SnapshotPrefetcher

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(_row(i)) + "\n" for i in ("calc-1", "calc-2")))
    tasks = load_swebench(path, _sources(tmp_path, snapshots), check_patches=False).tasks
    assert not (tmp_path / "cache").exists()
    prefetcher = SnapshotPrefetcher(tasks).start()
    prefetcher.join(timeout_s=120)
    assert prefetcher.num_prepared == 2
    assert all((tmp_path / "cache" / task.task_id).is_dir() for task in tasks)


def test_eval_script_rows_keep_history_up_to_the_base_and_nothing_later(
    tmp_path: Path, snapshots: Path
) -> None:
    repo = snapshots / "calc-1"
    env = {
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@b",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@b",
    }

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, env={**env, "PATH": "/usr/bin:/bin"}, check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip

    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    base = git("rev-parse", "HEAD")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git("commit", "-q", "-am", "the fix (the future)")
    git("tag", "v-fixed")
    git("checkout", "-q", "-b", "at-base", base)
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row("calc-1", base_commit=base, eval_script="#!/bin/bash\n")) + "\n")
    task = load_swebench(path, _sources(tmp_path, snapshots)).tasks[0]
    snapshot = task.snapshot()
    assert snapshot.base_commit == base
    everything = subprocess.run(
        ["git", "log", "--all", "--format=%s"], cwd=snapshot.workspace_dir, capture_output=True, text=True
    )
    assert everything.stdout.split("\n")[0] == "base" and "future" not in everything.stdout
    assert "return a - b" in (snapshot.workspace_dir / "calc.py").read_text()
