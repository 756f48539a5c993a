"""The grader's test launcher: copied into a fresh grading sandbox and run as ``python -I grading_runner.py
BUNDLE``. Standalone on purpose (stdlib + pytest only), because it runs inside the sandbox.

Order matters, so that nothing the agent's patch left behind can run before pytest has started:
1. ``python -I``: the workspace is not on ``sys.path``; PYTHON* variables and user site-packages are ignored.
2. Neutralise test infrastructure in the workspace: ``conftest.py``, ``sitecustomize.py``/``usercustomize.py``,
   ``*.pth``, ``__pycache__``/``*.pyc`` (pytest would load a planted cached test module), symlinks.
3. Write the hidden tests (replacing whatever is at their paths).
4. Import pytest, then write the *started* marker: from here on, the agent's code may run.
5. Append (not prepend) the workspace to ``sys.path`` so agent files cannot shadow the stdlib or pytest, and
   run pytest with a grader-written ini (``-c``), ``--rootdir``, ``--noconftest``, ``-p no:cacheprovider``,
   ``--import-mode=importlib``, and ``addopts`` cleared.
6. Per-test outcomes go to a JSON report written atomically at session end to the bundle's random path; a
   run that the code under test cuts short (``sys.exit``/``os._exit`` at import, a crash) leaves none.
"""

import json
import os
import shutil
import sys

_NEUTRALISED_NAMES = {"conftest.py", "sitecustomize.py", "usercustomize.py"}
_NEUTRALISED_SUFFIXES = (".pth", ".pyc", ".pyo")


def neutralise(workspace):
    """Remove agent-made test infrastructure; returns the workspace-relative paths removed."""
    removed = []
    for root, dirs, files in os.walk(workspace):
        if root == workspace and ".git" in dirs:
            dirs.remove(".git")
        for name in list(dirs):
            path = os.path.join(root, name)
            if os.path.islink(path) or name == "__pycache__":
                (os.unlink if os.path.islink(path) else shutil.rmtree)(path)
                removed.append(os.path.relpath(path, workspace))
                dirs.remove(name)
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path) or name in _NEUTRALISED_NAMES or name.endswith(_NEUTRALISED_SUFFIXES):
                os.unlink(path)
                removed.append(os.path.relpath(path, workspace))
    return removed


def write_hidden_tests(workspace, hidden_tests):
    """Write each hidden test file, clearing anything (file, directory) that blocks its path."""
    for relative, content in hidden_tests.items():
        path = os.path.join(workspace, relative)
        parent = workspace
        for part in os.path.dirname(relative).split("/") if os.path.dirname(relative) else []:
            parent = os.path.join(parent, part)
            if os.path.lexists(parent) and not os.path.isdir(parent):
                os.unlink(parent)
            os.makedirs(parent, exist_ok=True)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(content)


class OutcomeRecorder:
    """A pytest plugin: one outcome per test id (passed only if setup, call and teardown all passed)."""

    def __init__(self, report_path):
        self.report_path = report_path
        self.outcomes = {}
        self.collection_errors = []

    def pytest_collectreport(self, report):
        if report.failed:
            self.collection_errors.append(report.nodeid)

    def pytest_runtest_logreport(self, report):
        previous = self.outcomes.get(report.nodeid)
        if previous in ("failed", "error"):
            return
        if report.failed:
            self.outcomes[report.nodeid] = "failed" if report.when == "call" else "error"
        elif report.skipped:
            self.outcomes[report.nodeid] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        elif report.when == "call":
            self.outcomes[report.nodeid] = "passed"

    def pytest_sessionfinish(self, session, exitstatus):
        body = {
            "outcomes": self.outcomes,
            "collection_errors": self.collection_errors,
            "exit_status": int(exitstatus),
        }
        temporary = self.report_path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(body, handle)
        os.replace(temporary, self.report_path)


def main():
    with open(sys.argv[1], encoding="utf-8") as handle:
        bundle = json.load(handle)
    os.unlink(
        sys.argv[1]
    )  # the report path now lives only in this process, not on disk for the code under test
    workspace = bundle["workspace"]
    removed = neutralise(workspace)
    write_hidden_tests(workspace, bundle["hidden_tests"])
    with open(bundle["neutralised_path"], "w", encoding="utf-8") as handle:
        json.dump(removed, handle)
    sys.dont_write_bytecode = True
    import pytest

    ini_path = os.path.join(os.path.dirname(sys.argv[1]), "grader-pytest.ini")
    with open(ini_path, "w", encoding="utf-8") as handle:
        handle.write("[pytest]\naddopts =\n")
    with open(bundle["started_path"], "w", encoding="utf-8") as handle:
        handle.write("started\n")
    sys.path.append(workspace)
    os.chdir(workspace)
    arguments = [
        "-c",
        ini_path,
        "--rootdir",
        workspace,
        "--noconftest",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--import-mode=importlib",
        "-q",
        "-rN",
        "--tb=short",
    ]
    for plugin in bundle.get("plugins", []):
        arguments += ["-p", plugin]
    arguments += sorted(bundle["hidden_tests"])
    exit_code = pytest.main(arguments, plugins=[OutcomeRecorder(bundle["report_path"])])
    sys.exit(int(exit_code))


if __name__ == "__main__":
    main()
