"""``ProcessGuard``: an owner killed with SIGKILL leaves none of the processes it started behind (the unguarded
owner, the weakened variant, leaves its tree running); what ran before the guard, and a guard closed normally,
kill nothing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# The owner: optionally a guard, then a child in its own session (as inference servers and graders are
# started) with a grandchild of its own; prints every pid, then sleeps until killed.
OWNER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from components.process_guard import ProcessGuard
    guarded, log = sys.argv[1] == "guarded", sys.argv[2]
    early = subprocess.Popen(["sleep", "600"], start_new_session=True)  # there before the guard: spared
    guard = ProcessGuard.start(log_path=__import__("pathlib").Path(log), interval_s=0.2) if guarded else None
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "g = subprocess.Popen(['sleep', '600']); print(g.pid, flush=True); time.sleep(600)"],
        start_new_session=True, stdout=subprocess.PIPE, text=True,
    )
    grandchild = int(child.stdout.readline())
    time.sleep(0.6)  # the guard records at least once
    print(json.dumps({"guard": guard.process.pid if guard else None, "run": [child.pid, grandchild],
                      "early": early.pid}), flush=True)
    if sys.argv[3] == "close":
        guard.close()
        print("closed", flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@contextlib.contextmanager
def _owner(tmp_path: Path, mode: str, after: str = "kill"):
    log = tmp_path / "guard.log"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, mode, str(log), after],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        started = json.loads(owner.stdout.readline())
        pids = [*started["run"], started["early"]]
        yield owner, started, log
    finally:
        for pid in pids:  # whatever a failing (or weakened) case left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            owner.kill()
        owner.wait()


def test_sigkilled_owner_leaves_no_process_it_started(tmp_path):
    with _owner(tmp_path, "guarded") as (owner, started, log):
        assert all(_alive(pid) for pid in started["run"])
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        started_at = time.monotonic()
        assert _wait_gone(started["run"], timeout_s=5.0) == [], "the owner's tree outlived it"
        assert time.monotonic() - started_at < 5.0
        assert _wait_gone([started["guard"]], timeout_s=5.0) == [], "the guard did not exit"
        text = log.read_text()
        assert f"owner {owner.pid} died: killed 2 processes" in text, text
        assert "killed sleep" in text
        assert _alive(started["early"]), "the guard killed a process that ran before it started"


def test_unguarded_owner_leaves_its_tree_running(tmp_path):
    """The weakened variant: without the guard, the child in its own session and its grandchild survive."""
    with _owner(tmp_path, "unguarded") as (owner, started, _):
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        time.sleep(1.0)
        assert all(_alive(pid) for pid in started["run"]), "the orphans died without a guard"


def test_closed_guard_kills_nothing(tmp_path):
    with _owner(tmp_path, "guarded", after="close") as (owner, started, log):
        assert owner.stdout.readline().strip() == "closed"
        assert _wait_gone([started["guard"]], timeout_s=5.0) == []
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        time.sleep(0.5)
        assert all(_alive(pid) for pid in started["run"]), "a closed guard killed the run's processes"
        assert not log.exists() or "killed" not in log.read_text()


def test_a_sigkilled_pytest_run_leaves_no_process_its_tests_started(tmp_path):
    """``tests/conftest.py`` guards every pytest run: a test's process in its own session dies with pytest."""
    pid_file = tmp_path / "pid"
    (tmp_path / "test_sleeper.py").write_text(
        textwrap.dedent(
            f"""
            import pathlib, subprocess, time
            def test_sleeps():
                child = subprocess.Popen(["sleep", "600"], start_new_session=True)
                pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))
                time.sleep(600)
            """
        )
    )
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    child = 0
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()):
            assert run.poll() is None and time.monotonic() < deadline, (
                "the inner pytest did not start its test"
            )
            time.sleep(0.2)
        child = int(pid_file.read_text())
        time.sleep(1.5)  # the guard records it
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        assert _wait_gone([child], timeout_s=5.0) == [], "the test's process outlived the killed pytest"
    finally:
        with contextlib.suppress(ProcessLookupError):
            run.kill()
        run.wait()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
