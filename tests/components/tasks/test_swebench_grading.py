"""SWE-bench-format grading in image sandboxes, on instances built from real upstream bug fixes (PyPI releases).

Through the real loader from the Parquet file the set-up built: the gold patch earns 1 and the empty patch 0 for
every accepted instance; the repository can also come from an instance image's /testbed; an agent that edits
the tests or plants test infrastructure gains nothing; ``--check`` reports an instance whose gold patch fails.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.tasks.swebench import RepoSources, load_swebench
from components.tasks.swebench_grading import SweBenchGrader, check_instances
from sandboxes.image import ImageCache, ImageSandboxConfig, ImageSandboxProvider
from tests.components.tasks.swebench_fixtures import (
    IMAGE_LAYOUT,
    INSTANCES,
    MANIFEST,
    ROOT,
    SNAPSHOTS,
    env_image_store,
    require_fixtures,
)

IMAGE_CACHE = Path.home() / ".cache" / "rein" / "images"  # shared across runs: each image unpacks once


@pytest.fixture
def loaded(tmp_path: Path):
    require_fixtures(INSTANCES, SNAPSHOTS, IMAGE_LAYOUT)
    sources = RepoSources(
        images_dir=env_image_store(tmp_path / "images"),
        snapshots_dir=SNAPSHOTS,
        cache_dir=tmp_path / "workspaces",
        image_cache=ImageCache(IMAGE_CACHE),
    )
    return load_swebench(INSTANCES, sources)


@pytest.mark.slow
def test_check_cli_gold_earns_1_and_empty_earns_0_on_every_instance(tmp_path: Path) -> None:
    """The README's ``--check`` command, through the real loader from the Parquet file."""
    require_fixtures(INSTANCES, SNAPSHOTS, IMAGE_LAYOUT)
    images = env_image_store(tmp_path / "images")
    completed = subprocess.run(
        [sys.executable, "-m", "components.tasks.swebench_grading", "--check", "--tasks", f"swebench:{INSTANCES}",
         "--images", str(images), "--snapshots", str(SNAPSHOTS)],
        capture_output=True, text=True, timeout=1200, cwd=ROOT,
    )  # fmt: skip
    verdicts = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    manifest_ids = {entry["instance_id"] for entry in json.loads(MANIFEST.read_text())}
    assert len(manifest_ids) >= 10
    assert {verdict["instance_id"] for verdict in verdicts} == manifest_ids
    assert all(
        verdict["gold"] == 1.0 and verdict["empty"] == 0.0 and not verdict["bad"] for verdict in verdicts
    )
    # Every instance runs pytest: its outcomes came through the observer's authenticated channel, not the log.
    assert all("observer: RESOLVED_FULL" in verdict["log"] for verdict in verdicts), verdicts


async def test_repository_from_the_instance_image_and_tampering(tmp_path: Path) -> None:
    """Rows naming their baked instance image, no snapshot store: the repository is the image's /testbed."""
    require_fixtures(INSTANCES, IMAGE_LAYOUT)
    sources = RepoSources(
        images_dir=IMAGE_LAYOUT.parent, cache_dir=tmp_path / "workspaces", image_cache=ImageCache(IMAGE_CACHE)
    )
    first = load_swebench(INSTANCES, sources, check_patches=False).tasks[0]
    task = dataclasses.replace(first)
    assert task.image.endswith(f":{task.task_id}") and task.snapshot_source is None
    assert (task.snapshot().workspace_dir / ".git").is_dir()
    config = ImageSandboxConfig(cache_dir=IMAGE_CACHE, num_warm_per_image=0)
    async with ImageSandboxProvider(config) as provider:
        grader = SweBenchGrader(provider)
        gold = await grader.grade_patch(task, task.instance.patch)
        assert gold.reward == 1.0, gold.log + gold.error
        # Attack 1: a conftest that reports every test as passed. Restored away by the grader -> 0; against a
        # grader that does not restore test infrastructure (the weakened variant) the same diff earns 1.
        forged = await _agent_diff(provider, grader, task, {"conftest.py": FORGING_CONFTEST})
        assert "conftest.py" in forged
        result = await grader.grade_patch(task, forged)
        assert result.reward == 0.0, result.log
        assert "FLAGGED: test infrastructure" in result.log and "conftest.py" in result.log
        weakened = await _NoRestoreGrader(provider).grade_patch(task, forged)
        assert weakened.reward == 1.0, weakened.log + weakened.error
        # Attack 2: rewriting the failing tests themselves: they are restored before test_patch -> 0.
        gutted = await _agent_diff(
            provider, grader, task, {task.instance.test_files[0]: "def test_nothing():\n    pass\n"}
        )
        result = await grader.grade_patch(task, gutted)
        assert result.reward == 0.0, result.log + result.error


FORGING_CONFTEST = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


class _NoRestoreGrader(SweBenchGrader):
    """The weakened variant: leaves whatever the agent did to tests and test infrastructure in place, and reads
    the log (the observer would also see that each rewritten report's phase raised: not a plain pass)."""

    async def _restore_paths(self, sandbox, base, paths) -> None:
        return None

    def _observer_invocation(self, task):
        return None


async def _agent_diff(provider, grader: SweBenchGrader, task, files: dict[str, str]) -> str:
    """What an agent that wrote ``files`` leaves behind, read the way the grader reads it."""
    sandbox = await provider.acquire(task.sandbox_spec())
    try:
        for path, content in files.items():
            await sandbox.write_file(path, content)
        return await grader._diff_reader.extract_diff(task, sandbox)
    finally:
        await provider.release(sandbox)


async def test_forged_test_output_earns_1_from_the_log_and_0_through_the_observer(loaded) -> None:
    """Code under test that prints fake ``PASSED <id>`` lines, or a whole fake report (a pytest summary and a
    forged observer verdict), after the real summary: the log-parsing path (the weakened variant, SWE-bench's
    own) reads them and earns 1; the observer path reads only the authenticated channel and earns 0."""
    task = loaded.tasks[0]
    test_ids = [*task.instance.fail_to_pass, *task.instance.pass_to_pass]
    module = "parse.py"  # the library module the gold patch fixes; every test imports it
    original = (task.snapshot().workspace_dir / module).read_text()
    fake_passes = "".join(f"PASSED {test_id}\n" for test_id in test_ids)
    forged_verdict = json.dumps({"finished": True, "outcomes": dict.fromkeys(test_ids, "passed")})
    fake_report = (
        f"===== short test summary info =====\n{fake_passes}===== {len(test_ids)} passed in 0.01s =====\n"
        f"REIN-GRADER-VERDICT {'0' * 64} {forged_verdict}\n"
    )
    forgeries = {  # run at interpreter exit: after pytest's own summary, whose lines they override
        "fake PASSED lines": f"\nimport atexit as _a\n_a.register(lambda: print({fake_passes!r}, flush=True))\n",
        "fake report": f"\nimport atexit as _a, os as _o\n_a.register(lambda: _o.write(1, {fake_report.encode()!r}))\n",
    }
    config = ImageSandboxConfig(cache_dir=IMAGE_CACHE, num_warm_per_image=0)
    async with ImageSandboxProvider(config) as provider:
        hardened = SweBenchGrader(provider)
        gold = await hardened.grade_patch(task, task.instance.patch)
        assert gold.reward == 1.0 and "observer: RESOLVED_FULL" in gold.log, gold.log + gold.error
        for name, forgery in forgeries.items():
            forged = await _agent_diff(provider, hardened, task, {module: original + forgery})
            weakened = await _LogParsingGrader(provider).grade_patch(task, forged)
            assert weakened.reward == 1.0, f"{name}: {weakened.log}{weakened.error}"
            result = await hardened.grade_patch(task, forged)
            assert result.reward == 0.0, f"{name}: {result.log}{result.error}"
            assert "observer: RESOLVED_NO" in result.log, result.log


class _LogParsingGrader(SweBenchGrader):
    """The weakened variant: every row takes the log-parsing path, as SWE-bench itself grades."""

    def _observer_invocation(self, task):
        return None


async def test_check_reports_an_instance_whose_gold_patch_fails(loaded) -> None:
    task = loaded.tasks[0]
    wrong_gold = dataclasses.replace(task, instance=dataclasses.replace(task.instance, patch=""))
    config = ImageSandboxConfig(cache_dir=IMAGE_CACHE, num_warm_per_image=0)
    async with ImageSandboxProvider(config) as provider:
        checks = await check_instances([wrong_gold], SweBenchGrader(provider))
    assert not checks[0].ok and checks[0].gold.reward == 0.0 and checks[0].empty.reward == 0.0


async def test_test_runner_tampering_is_rejected_except_in_pytests_own_repository(tmp_path: Path) -> None:
    from components.errors import SandboxError
    from components.tasks.swebench import SweBenchTask, instance_from_row
    from tests.components.tasks.test_swebench_loader import _row

    snapshot = tmp_path / "repo"
    snapshot.mkdir()
    (snapshot / "calc.py").write_text("x = 1\n")
    tampering = (
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x = 1\n+import _pytest\n"
    )

    async def no_sandbox(spec):
        raise SandboxError("no sandbox in this test")

    def task_of(repo: str) -> SweBenchTask:
        instance = instance_from_row(_row("calc-1", repo=repo))
        return SweBenchTask(instance=instance, image=None, snapshot_source=snapshot, cache_dir=tmp_path / "c")

    grader = SweBenchGrader(no_sandbox)
    rejected = await grader.grade_patch(task_of("example/calc"), tampering)
    assert rejected.reward == 0.0 and "reaches into the test runner" in rejected.log
    graded = await grader.grade_patch(task_of("pytest-dev/pytest"), tampering)  # goes on to the tests
    assert graded.reward is None and "no sandbox in this test" in graded.error


async def test_rows_with_an_eval_script_are_graded_by_it(tmp_path: Path) -> None:
    """A swebench >= 4 row (``eval_script`` in SWE-bench's own shape, base commit = the image repository's HEAD):
    the workspace keeps that history, the script restores the tests and applies test_patch, markers delimit the
    log. Gold -> 1, empty -> 0."""
    require_fixtures(INSTANCES, IMAGE_LAYOUT)
    sources = RepoSources(
        images_dir=IMAGE_LAYOUT.parent, cache_dir=tmp_path / "workspaces", image_cache=ImageCache(IMAGE_CACHE)
    )
    task = load_swebench(INSTANCES, sources, check_patches=False).tasks[1]
    repo = task.unpacked_image().rootfs / "testbed"
    base = subprocess.run(
        ["git", "-c", "safe.directory=*", "rev-parse", "HEAD"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    files = " ".join(task.instance.test_files)
    script = "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            f"git checkout {base} {files}",
            "git apply -v - <<'EOF_114329324912'",
            task.instance.test_patch.rstrip("\n"),
            "EOF_114329324912",
            ": '>>>>> Start Test Output'",
            task.instance.test_command,
            ": '>>>>> End Test Output'",
            f"git checkout {base} {files}",
        ]
    )
    instance = dataclasses.replace(task.instance, extra={**task.instance.extra, "eval_script": script})
    task = dataclasses.replace(task, instance=instance)
    assert task.snapshot().base_commit == base
    config = ImageSandboxConfig(cache_dir=IMAGE_CACHE, num_warm_per_image=0)
    async with ImageSandboxProvider(config) as provider:
        grader = SweBenchGrader(provider)
        gold = await grader.grade_patch(task, task.instance.patch)
        empty = await grader.grade_patch(task, "")
    assert gold.reward == 1.0 and "eval_script: RESOLVED_FULL" in gold.log, gold.log + gold.error
    assert empty.reward == 0.0 and "eval_script: RESOLVED_NO" in empty.log, empty.log + empty.error


NESTED_TEST_PATCH = """diff --git a/tests/unit/test_calc.py b/tests/unit/test_calc.py
new file mode 100644
--- /dev/null
+++ b/tests/unit/test_calc.py
@@ -0,0 +1,7 @@
+from calc import add
+
+def test_add(numbers):
+    assert add(*numbers) == 5
+
+def test_numbers(numbers):
+    assert numbers == (2, 3)
"""


async def test_pytest_rows_report_through_the_observer_with_the_repositorys_own_conftests(
    tmp_path: Path,
) -> None:
    """A repository whose fixture lives in a nested ``conftest.py`` that pytest loads while collecting (after the
    observer's fingerprint is taken): the repository's own conftests are not tampering. Gold -> 1 and empty -> 0,
    both read from the observer's channel; ids map to FAIL_TO_PASS / PASS_TO_PASS as swebench maps them."""
    from components.tasks.swe import python_tool_paths
    from components.tasks.swebench import SweBenchTask, instance_from_row
    from components.tasks.swebench_grading import pytest_invocation
    from sandboxes.bwrap import BwrapSandbox
    from tests.components.tasks.test_swebench_loader import PATCH, _row

    snapshot = tmp_path / "repo"
    (snapshot / "tests" / "unit").mkdir(parents=True)
    (snapshot / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (snapshot / "tests" / "unit" / "conftest.py").write_text(
        "import pytest\n\n\n@pytest.fixture\ndef numbers():\n    return (2, 3)\n"
    )
    row = _row(
        "calc-nested",
        patch=PATCH,
        test_patch=NESTED_TEST_PATCH,
        test_cmd="python3 -m pytest --no-header -rA --tb=no -p no:cacheprovider tests",
        FAIL_TO_PASS=json.dumps(["tests/unit/test_calc.py::test_add"]),
        PASS_TO_PASS=json.dumps(["tests/unit/test_calc.py::test_numbers"]),
    )
    task = SweBenchTask(
        instance=instance_from_row(row),
        image=None,
        snapshot_source=snapshot,
        cache_dir=tmp_path / "cache",
        tool_paths=python_tool_paths(),
    )
    assert pytest_invocation(task) is not None
    grader = SweBenchGrader(BwrapSandbox.create)
    gold = await grader.grade_patch(task, task.instance.patch)
    assert gold.reward == 1.0 and "observer: RESOLVED_FULL" in gold.log, gold.log + gold.error
    empty = await grader.grade_patch(task, "")
    assert empty.reward == 0.0 and "observer: RESOLVED_NO: FAIL_TO_PASS 0/1, PASS_TO_PASS 1/1" in empty.log, (
        empty.log + empty.error
    )
