"""The grader's in-sandbox test runner: an *observer* process and the *test process* it starts.

Copied into a fresh grading sandbox and run as ``python -I grading_runner.py BUNDLE``; standalone on purpose
(stdlib + pytest only). No code of the agent has run in that sandbox yet (setup, then ``git apply``), so the
observer starts trusted and stays out of the reach of what it then runs:

1. It reads the bundle (hidden test sources, a per-verdict secret ``nonce``), deletes it, makes itself
   non-dumpable (a same-uid process can then neither ptrace it nor open its ``/proc/PID/{mem,fd}``) and a child
   subreaper (every process the tests fork, detached or not, stays its descendant), and prints an
   authenticated *started* line.
2. Tree scan, before any code of the agent runs: every file of the patched tree that differs from the base
   commit (compared by content to ``git ls-tree HEAD``: any name, any git attribute, binary files included).
   Test infrastructure is removed (``conftest.py``, ``sitecustomize.py``/``usercustomize.py``, ``*.pth``,
   ``__pycache__``/``*.pyc``, symlinks); the agent's own test files and pytest configuration files are restored
   to the base (they are never what is graded, so library code cannot import agent-written code from them);
   the lines every other changed file adds are searched for references to the test runner and for reaches into
   the interpreter.
3. The hidden tests never touch the disk: each hidden path holds a placeholder, and the test process receives
   the sources over a pipe it reads (and closes) before it imports anything of the agent's, then compiles
   them from memory (with pytest's assertion rewriting).
4. The agent's code never runs in the test process: the observer starts a *code-under-test process* (``python
   -I``, workspace appended to ``sys.path``) that holds its end of one socket to the test process and, as
   stdout/stderr, the write end of the output pipe (shared with the test process; the observer keeps only its
   tail, for the log: text there decides nothing), and nothing else, and imports and runs the agent's modules at the test process's request; the test process sees each workspace
   module as a ``RemoteModule``, each value as a plain builtin value rebuilt by its own JSON decoder or a
   ``Remote`` handle (see "the code under test, in a process of its own" below). The test process is
   non-dumpable, imports nothing from the workspace (no ``conftest.py``, no package ``__init__.py``) and runs
   pytest with a grader-written ini, ``--noconftest``, no plugin autoload, ``-p no:cacheprovider``. It sends
   one event per test phase over a ``SOCK_SEQPACKET`` socket with ``SO_PASSCRED``: the kernel stamps each
   message with its sender's pid, and only the test process's own messages count (a process it forked cannot
   speak for it); a ``done`` event closes its session, nothing after it counts, and a session without one
   earns 0. Its stdout/stderr go to the observer, never to the exec's output, and it is given nothing else.
   Before the tests run it fingerprints pytest, pluggy, builtins, unittest and its registered plugins
   (every callable's identity and code, every class's attributes); after each test's teardown and at the end
   of the session a change is reported (reward 0).
5. When the session is done, the test process is gone, or at the deadline, the observer SIGKILLs every process
   in the sandbox but its own ancestors (repeating until none is left), reads what the channels still hold,
   then prints the verdict: per-test outcomes (``passed`` only when setup, call and teardown all reported
   passed) as one line authenticated with HMAC-SHA256 under the nonce, which only the host and the observer
   know. Anything else on the exec's output is ignored.

Repository mode (bundle key ``pytest_args``, used by ``components/tasks/swebench_grading.py``): the tests are the
repository's own, already restored by the host (test files, test infrastructure, ``test_patch``), so steps 2
and 3 are skipped; the test process runs pytest with the given arguments and the repository's own
configuration and ``conftest.py`` files, the working tree placed before site-packages (as ``python -m pytest``
finds it) but after the stdlib. Channel, fingerprint, kill loop and verdict are the same; the comparisons the
tests' asserts make go through ``ProbingComparisons``.

Known limit (repository mode only): the repository's tests import its code, so the code under test runs in the
test process there, and code aimed at this grader's internals (its event socket, found among the process's
descriptors, or its ``send`` reached through frames) can forge that process's events; the fingerprint and the
host's diff scan catch only the plain forms.
"""

import ast
import builtins
import ctypes
import hashlib
import hmac
import json
import os
import re
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

STARTED_PREFIX = "REIN-GRADER-STARTED"
VERDICT_PREFIX = "REIN-GRADER-VERDICT"
PLACEHOLDER = "# hidden tests: the grader serves this module from memory\n"
_REMOVED_NAMES = {"conftest.py", "sitecustomize.py", "usercustomize.py"}
_REMOVED_SUFFIXES = (".pth", ".pyc", ".pyo")
# What pytest and Python's start-up read besides the code under test, by role (see read_by_the_test_runner).
_CONFIG_SUFFIXES = (
    ".ini",
    ".cfg",
    ".toml",
)  # pytest.ini, .pytest.ini, tox.ini, setup.cfg, pyproject.toml, ...
_STARTUP_MODULES = {"conftest", "sitecustomize", "usercustomize"}  # as modules or packages
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")  # entry points (pytest11 plugins), finders
_BYTECODE_SUFFIXES = (".pyc", ".pyo")
_OUTPUT_TAIL_CHARS = 4000
_COLLECTION_ERROR_CHARS = 2000  # the tail of each collection error's text kept in the verdict
_MAX_COLLECTION_ERRORS = 20
_MAX_NODEID_CHARS = 1000
_MAX_EVENTS = 30_000  # test phase events kept (three per test); more marks the run as flooded (reward 0)
_SAFE_GIT = ["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]


def sign(nonce, kind, payload):
    """The authenticated line for ``payload`` (host and observer share ``nonce``; nothing else knows it)."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    mac = hmac.new(nonce.encode(), f"{kind}\n{body}".encode(), hashlib.sha256).hexdigest()
    return f"{kind} {mac} {body}"


# -- the tree scan ------------------------------------------------------------------------------------------


def is_test_file(relative):
    """Whether ``relative`` is a test file by its name: ``test_*.py``, ``*_test.py``, ``tests.py`` (Django's
    layout) or anything under a ``tests``, ``test`` or ``testing`` directory."""
    name = relative.rsplit("/", 1)[-1]
    return (
        (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
        or name == "tests.py"
        or any(f"/{directory}/" in f"/{relative}" for directory in ("tests", "test", "testing"))
    )


def read_by_the_test_runner(relative):
    """Whether pytest or the interpreter reads ``relative`` as its own configuration or start-up code rather than
    as the code under test: any ``*.ini``/``*.cfg``/``*.toml`` file (every file pytest may take as its inifile,
    dotted variants included), ``conftest``/``sitecustomize``/``usercustomize`` (modules or packages), ``*.pth``,
    package metadata (``*.dist-info``/``*.egg-info``: entry points, ``*.egg-link``) and bytecode caches
    (``__pycache__``, ``*.pyc``/``*.pyo``). Such files are restored to the base (or removed) before grading."""
    parts = relative.split("/")
    name = parts[-1]
    return (
        name.endswith(_CONFIG_SUFFIXES)
        or name.endswith((".pth", *_BYTECODE_SUFFIXES))
        or any(part.removesuffix(".py") in _STARTUP_MODULES for part in parts)
        or any(part.endswith(_METADATA_SUFFIXES) or part == "__pycache__" for part in parts)
    )


def _git(workspace, *args):
    return subprocess.run(
        [*_SAFE_GIT, *args], cwd=workspace, capture_output=True, check=True, stdin=subprocess.DEVNULL
    ).stdout


def _base_tree(workspace):
    """``{path: blob id}`` of the base commit (what the agent started from)."""
    listing = _git(workspace, "ls-tree", "-r", "-z", "--full-tree", "HEAD")
    tree = {}
    for entry in listing.split(b"\0"):
        if entry:
            meta, path = entry.split(b"\t", 1)
            tree[path.decode("utf-8", "surrogateescape")] = meta.split()[2].decode()
    return tree


def _blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _remove(path):
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


def scan_tree(workspace, runner_pattern, reach_pattern):
    """Neutralise, restore and scan the patched tree (see the module docstring, step 2)."""
    base = _base_tree(workspace)
    report = {"removed": [], "restored": [], "test_runner": [], "interpreter": [], "changed": 0}
    changed = []
    for root, dirs, files in os.walk(workspace):
        if root == workspace and ".git" in dirs:
            dirs.remove(".git")
        for name in list(dirs):
            path = os.path.join(root, name)
            if os.path.islink(path) or name == "__pycache__":
                _remove(path)
                report["removed"].append(os.path.relpath(path, workspace))
                dirs.remove(name)
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, workspace)
            regular = stat.S_ISREG(os.lstat(path).st_mode)
            if not regular or name in _REMOVED_NAMES or name.endswith(_REMOVED_SUFFIXES):
                _remove(path)
                report["removed"].append(relative)
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            if base.get(relative) != _blob_id(data):
                changed.append((relative, data))
    report["changed"] = len(changed)
    for relative, data in changed:
        path = os.path.join(workspace, relative)
        if is_test_file(relative) or read_by_the_test_runner(relative):
            if relative in base:
                with open(path, "wb") as handle:
                    handle.write(_git(workspace, "cat-file", "blob", base[relative]))
            else:
                os.unlink(path)
            report["restored"].append(relative)
            continue
        old_lines = set()
        if relative in base:
            old_lines = set(_git(workspace, "cat-file", "blob", base[relative]).splitlines())
        for line in data.splitlines():
            if line in old_lines:
                continue
            shown = f"{relative}: {line.strip()[:120].decode('utf-8', 'replace')}"
            if runner_pattern.search(line):
                report["test_runner"].append(shown)
            elif reach_pattern.search(line):
                report["interpreter"].append(shown)
    return report


def write_hidden_placeholders(workspace, relatives):
    """A placeholder at each hidden path (pytest needs a file to collect), clearing whatever blocks it."""
    for relative in relatives:
        path = os.path.join(workspace, relative)
        parent = workspace
        for part in os.path.dirname(relative).split("/") if os.path.dirname(relative) else []:
            parent = os.path.join(parent, part)
            if os.path.lexists(parent) and (os.path.islink(parent) or not os.path.isdir(parent)):
                os.unlink(parent)
            os.makedirs(parent, exist_ok=True)
        if os.path.lexists(path):
            _remove(path)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(PLACEHOLDER)


# -- the observer -------------------------------------------------------------------------------------------


def _prctl(option, value):
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _ancestors():
    pids, pid = {os.getpid()}, os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids | {1}


def kill_everything_else(deadline_s=10.0):
    """SIGKILL every process of the sandbox except our ancestors (and PID 1), until none is left."""
    keep = _ancestors()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        others = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in keep]
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        while True:  # reap what we inherited as subreaper
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not others:
            return True
        time.sleep(0.01)
    return False


_PHASES = ("setup", "call", "teardown")


def is_plain_pass(event):
    """A phase that reported ``passed``, raised nothing at all (``call.excinfo`` was None: no skip, xfail,
    failure or any other outcome exception, however it was raised) and was not expected to fail."""
    return event.get("outcome") == "passed" and not event.get("raised") and not event.get("xfail")


def outcomes_from_events(events):
    """``passed`` only for a plain pass of setup, call and teardown (``is_plain_pass``); otherwise ``failed``
    (only the call failed), ``error`` (setup/teardown failed), ``xfailed``, ``skipped``, ``xpassed`` (an
    unexpected pass), ``raised`` (a phase raised, yet its report says passed: a plugin changed it) or
    ``incomplete`` (the process died or was stopped inside the test, or a phase never reported)."""
    phases = {}
    for event in events:
        phases.setdefault(event["nodeid"], {})[event["when"]] = event
    outcomes = {}
    for nodeid, seen in phases.items():
        failed = [when for when in _PHASES if seen.get(when, {}).get("outcome") == "failed"]
        skipped = [event for event in seen.values() if event.get("outcome") == "skipped"]
        if failed:
            outcomes[nodeid] = "failed" if failed == ["call"] else "error"
        elif skipped:
            outcomes[nodeid] = "xfailed" if any(event.get("xfail") for event in skipped) else "skipped"
        elif any(when not in seen for when in _PHASES):
            outcomes[nodeid] = "incomplete"
        elif all(is_plain_pass(seen[when]) for when in _PHASES):
            outcomes[nodeid] = "passed"
        elif any(seen[when].get("xfail") for when in _PHASES):
            outcomes[nodeid] = "xpassed"
        elif all(seen[when].get("outcome") == "passed" for when in _PHASES):
            outcomes[nodeid] = "raised"
        else:
            outcomes[nodeid] = "incomplete"
    return outcomes


def observe(bundle, nonce):
    workspace = os.path.abspath(bundle["workspace"])
    runner_pattern = re.compile(bundle["test_runner_pattern"].encode())
    reach_pattern = re.compile(bundle["interpreter_pattern"].encode())
    verdict = {"outcomes": {}, "collection_errors": [], "timed_out": False, "exit_code": None}
    if bundle.get("pytest_args") is not None:  # repository mode: the host restored the tree itself
        return run_test_process(bundle, workspace, {}, verdict)
    try:
        verdict["scan"] = scan_tree(workspace, runner_pattern, reach_pattern)
    except (RecursionError, OSError, UnicodeError) as error:  # a tree the patch made (too deep, odd names)
        verdict["skipped"] = f"the patched tree cannot be scanned: {type(error).__name__}: {error}"[:1000]
        return verdict
    if bundle.get("skip_tests_on_tampering") and verdict["scan"]["test_runner"]:
        verdict["skipped"] = "the patched tree references the test runner"
        return verdict
    hidden = bundle["hidden_tests"]
    write_hidden_placeholders(workspace, sorted(hidden))
    return run_test_process(bundle, workspace, hidden, verdict)


def run_test_process(bundle, workspace, hidden, verdict):
    """Start the test process, collect its events, kill every other process, and complete ``verdict``."""
    pytest_args = bundle.get("pytest_args")
    ini_dir = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(ini_dir, "grader-pytest.ini"), "w", encoding="utf-8") as handle:
        handle.write("[pytest]\naddopts =\n")
    source_read, source_write = os.pipe()
    # Events: a SOCK_SEQPACKET pair with SO_PASSCRED, so every message carries its sender's pid as the kernel
    # saw it; only the test process's own messages count (not those of a process it forked).
    event_socket, child_socket = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    event_socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    event_write = child_socket.fileno()
    output_read, output_write = os.pipe()  # the test process's and the code under test's output, for the tail
    child_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    code_under_test, bridge_fds = None, ()
    if pytest_args is None:  # built-in mode: the agent's code runs in a process of its own (its one socket)
        bridge_test, bridge_code = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        bridge_fds = (bridge_test.fileno(),)
        code_under_test = subprocess.Popen(
            [sys.executable, "-I", "-B", os.path.abspath(__file__), "--code-under-test", str(bridge_code.fileno()), workspace],
            cwd=workspace, env=child_env, stdin=subprocess.DEVNULL, stdout=output_write, stderr=output_write,
            pass_fds=(bridge_code.fileno(),), start_new_session=True,
        )  # fmt: skip
        bridge_code.close()
    child = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-B",  # -I ignores PYTHONDONTWRITEBYTECODE: no bytecode of the agent's code is written or kept
            os.path.abspath(__file__),
            "--test-process",
            str(source_read),
            str(event_write),
            json.dumps(
                {
                    "workspace": workspace,
                    "ini_dir": ini_dir,
                    "plugins": bundle.get("plugins", []),
                    "pytest_args": pytest_args,
                    "bridge_fd": bridge_fds[0] if bridge_fds else None,
                    "changed_paths": bundle.get("changed_paths", []),
                }
            ),
        ],
        cwd=workspace,
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=output_write,
        stderr=subprocess.STDOUT,
        pass_fds=(source_read, event_write, *bridge_fds),
        start_new_session=True,
    )
    os.close(source_read)
    os.close(output_write)
    child_socket.close()
    if code_under_test is not None:
        bridge_test.close()
    output = os.fdopen(output_read, "rb", buffering=0)
    with os.fdopen(source_write, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(hidden))
    collector = _EventCollector(verdict, child.pid)
    selector = selectors.DefaultSelector()
    selector.register(event_socket, selectors.EVENT_READ, collector.receive)
    selector.register(output, selectors.EVENT_READ, collector.read_output)
    deadline = time.monotonic() + float(bundle["timeout_s"])
    while child.poll() is None and not collector.finished:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            verdict["timed_out"] = True
            break
        for key, _ in selector.select(timeout=min(remaining, 0.2)):
            key.data(selector, key.fileobj)
    # The session finished (or the test process is gone, or out of time): nothing of the agent's may run on
    # while we read the rest, so every process goes first; then the channels hold only what was sent before.
    if not kill_everything_else():
        verdict["survivors"] = True  # processes kept appearing: nothing read from here on is trusted
    while selector.get_map():
        for key, _ in selector.select(timeout=1.0):
            key.data(selector, key.fileobj)
    event_socket.close()
    output.close()
    verdict["finished"] = collector.finished
    verdict["foreign_events"] = collector.foreign_events
    verdict["exit_code"] = child.poll()
    verdict["outcomes"] = {} if verdict.get("flooded") else outcomes_from_events(collector.events)
    verdict["output_tail"] = collector.output.decode("utf-8", "replace")
    return verdict


class _EventCollector:
    def __init__(self, verdict, test_pid):
        self.verdict = verdict
        self.test_pid = test_pid
        self.events = []
        self.output = bytearray()
        self.finished = False  # the test process itself reported the end of its session
        self.foreign_events = 0

    def read_output(self, selector, stream):
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            selector.unregister(stream)
            return
        self.output += chunk
        del self.output[: max(0, len(self.output) - _OUTPUT_TAIL_CHARS)]

    def receive(self, selector, sock):
        data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(struct.calcsize("3i")))
        if not data and not ancillary:
            selector.unregister(sock)
            return
        sender = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                sender = struct.unpack("3i", payload[: struct.calcsize("3i")])[0]
        if sender != self.test_pid:
            self.foreign_events += 1  # a process the test process forked (or anything else): ignored
            return
        if self.finished:
            return  # nothing after the end of the session counts
        if len(self.events) >= _MAX_EVENTS:
            self.verdict["flooded"] = True  # the test process sent more than any test run does: a 0
            return
        try:
            event = json.loads(data)
            kind = event.get("kind")
            if kind == "done":
                self.finished = True
            elif kind == "collect":
                errors = self.verdict["collection_errors"]
                if len(errors) < _MAX_COLLECTION_ERRORS:
                    text = str(event.get("text", ""))[-_COLLECTION_ERROR_CHARS:]
                    errors.append({"nodeid": str(event["nodeid"])[:_MAX_NODEID_CHARS], "text": text})
            elif kind == "tampered":
                self.verdict.setdefault("tampered", []).extend(str(name) for name in event["names"])
            else:
                self.events.append(
                    {
                        "nodeid": str(event["nodeid"])[:_MAX_NODEID_CHARS],
                        "when": str(event["when"]),
                        "outcome": str(event["outcome"]),
                        "xfail": event.get("xfail") is not False,
                        "raised": event.get("raised") is not False,
                    }
                )
        except Exception:  # noqa: BLE001 - garbage of any shape (too deep: RecursionError) counts for nothing
            pass


def main():
    with open(sys.argv[1], encoding="utf-8") as handle:
        bundle = json.load(handle)
    os.unlink(sys.argv[1])  # the nonce and the hidden tests now live only in this (non-dumpable) process
    nonce = bundle.pop("nonce")
    _prctl(4, 0)  # PR_SET_DUMPABLE = 0
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER = 1
    print(sign(nonce, STARTED_PREFIX, {"pid": os.getpid()}), flush=True)
    try:
        verdict = observe(bundle, nonce)
    except Exception as error:  # the observer's own failure, reported as such (the host decides)
        kill_everything_else()
        verdict = {"observer_error": f"{type(error).__name__}: {error}"}
    print(sign(nonce, VERDICT_PREFIX, verdict), flush=True)


# -- honest comparisons in the hidden tests ------------------------------------------------------------------


class DishonestComparison(AssertionError):
    """A hidden test compared a value of the agent's own type with one that is not: such a comparison runs the
    agent's ``__eq__`` (or ``__ne__``, ``__lt__``, ``__contains__``…) against the expected value, so it proves
    nothing and fails the test."""


# Builtin value types and, for each, the C-level copy that turns an instance (of a subclass too) into an exact
# instance without calling anything the subclass overrides.
_EXACT = (type(None), bool, int, float, complex, str, bytes)
_EXACT_COPY = (
    (bool, bool),
    (int, int.__index__),
    (float, float.__float__),
    (complex, complex.__complex__),
    (str, str.__str__),
    (bytes, bytes.__bytes__),
    (bytearray, bytearray.copy),
    (list, list.copy),
    (tuple, lambda value: tuple.__getnewargs__(value)[0]),
    (dict, dict.copy),
    (set, set.copy),
    (frozenset, frozenset.copy),
)
_MAX_COMPARED_DEPTH = 64
_COMPARISONS = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
    "is": lambda a, b: a is b,
    "is not": lambda a, b: a is not b,
}
_AST_OPERATORS = {
    "Eq": "==", "NotEq": "!=", "Lt": "<", "LtE": "<=", "Gt": ">", "GtE": ">=",
    "In": "in", "NotIn": "not in", "Is": "is", "IsNot": "is not",
}  # fmt: skip


class HonestComparisons:
    """Comparisons in hidden tests' ``assert`` statements, made so that a value cannot lie about equality.

    Each operand is first turned into its *canonical* form: values of builtin types, and of their subclasses, are
    copied into exact builtin values by the builtin types' own C code (a ``str`` subclass whose ``__eq__`` always
    says yes becomes a plain ``str``), containers element by element. What is left is either foreign (types from
    outside the workspace: the stdlib, pytest, site-packages) or the agent's own (a type from a module of the
    workspace, or whose methods were compiled from one). A comparison where exactly one side holds a value of the
    agent's own type raises ``DishonestComparison`` (for ``in``: an own value looked up in a container that is not
    the agent's); otherwise the operator runs on the canonical forms. Two values of the agent's own types, or
    membership in the agent's own container, still run the agent's code: that is the code under test."""

    def __init__(self, workspace, hidden_paths=()):
        self.workspace = os.path.realpath(workspace) + os.sep
        self.hidden_paths = {os.path.realpath(path) for path in hidden_paths}  # the tests' own types are not

    def __call__(self, operators, *operands):
        values = [self.canonical(operand, 0) for operand in operands]
        result = True
        for index, operator in enumerate(operators):
            left, right = values[index], values[index + 1]
            reason = self.dishonesty(operator, left, right)
            if reason:
                raise DishonestComparison(
                    f"a test compared {type(operands[index]).__name__} with "
                    f"{type(operands[index + 1]).__name__} using {operator!r}: {reason}"
                )
            result = _COMPARISONS[operator](left, right)
            if len(operators) > 1 and not result:  # a chain stops at its first false link, as Python's does
                return result
        return result  # one comparison: its own result (an array stays an array)

    def dishonesty(self, operator, left, right):
        """Why this comparison cannot be trusted, or "" (see the class docstring)."""
        if operator in ("in", "not in"):  # an own container's membership is the code under test's
            dishonest = self.holds_own(left) and not self.holds_own(right)
        else:
            dishonest = operator not in ("is", "is not") and self.holds_own(left) != self.holds_own(right)
        if dishonest:
            return "one side is a value of the code under test's own type, the other is not"
        return ""

    def canonical(self, value, depth):
        if depth > _MAX_COMPARED_DEPTH:
            raise DishonestComparison("a compared value is nested too deeply to compare honestly")
        if type(value) in _EXACT:
            return value
        for kind, copy in _EXACT_COPY:
            if isinstance(value, kind):
                exact = copy(value)
                if kind in (list, tuple):
                    return kind(self.canonical(item, depth + 1) for item in exact)
                if kind is dict:
                    return {
                        self.canonical(key, depth + 1): self.canonical(item, depth + 1)
                        for key, item in dict.items(exact)
                    }
                if kind in (set, frozenset):
                    return kind(self.canonical(item, depth + 1) for item in set.__iter__(set(exact)))
                return exact
        return value

    def holds_own(self, value, depth=0):
        """Whether ``value`` (a canonical form) is, or contains, a value of the agent's own type."""
        if depth > _MAX_COMPARED_DEPTH:
            return True
        kind = type(value)
        if kind in (list, tuple, set, frozenset):
            return any(self.holds_own(item, depth + 1) for item in value)
        if kind is dict:
            return any(self.holds_own(item, depth + 1) for pair in value.items() for item in pair)
        return kind not in _EXACT and kind not in (bytearray,) and self.is_own_type(kind)

    def is_own_type(self, kind):
        if issubclass(kind, Remote):  # a value of the code-under-test process
            return True
        for klass in kind.__mro__:
            module = sys.modules.get(getattr(klass, "__module__", "") or "")
            if self._inside(getattr(module, "__file__", None)):
                return True
            for member in vars(klass).values():
                function = getattr(member, "__func__", member)
                code = getattr(function, "__code__", None)
                if code is not None and self._inside(code.co_filename):
                    return True
        return False

    def _inside(self, filename):
        if not filename:
            return False
        path = os.path.realpath(filename)
        return path.startswith(self.workspace) and path not in self.hidden_paths


class ProbingComparisons(HonestComparisons):
    """Honest comparisons for a repository's own tests (SWE-bench rows, repository mode), whose types compare with
    builtin values legitimately: nothing is refused or copied. A value is the agent's when its type (or a class of
    its MRO) was defined, or has a method compiled, in a file the agent's patch changed. When such a value is
    compared with a value that is not the agent's, its answer is checked:

    - ``==`` (or ``in`` a container that is not the agent's): asked again against two *probes* of the other side's
      shape - every leaf changed (``"x"`` becomes ``"x\\0rein-probe"``, ``3`` becomes ``7922``, ...), every leaf a
      fresh object. An honest ``__eq__`` says no to both; one that says yes cannot tell values apart.
    - ``!=``: it must say "unequal" to both probes, agree with ``==`` (``a != b`` is ``not a == b``), and not be
      unequal to itself.
    - ``<``, ``<=``, ``>``, ``>=``: it must not say yes to a fresh object, nor to the operator's complement
      (``a < b`` and ``a >= b`` both true).

    A failed check fails the test. A comparison it cannot answer (an exception, an array's truth) is no lie. A
    liar that recognises the probes (it reads the test's frame: it shares the test's process) is not caught; nor
    is a comparison nested in a call (``(a == b).all()``, ``assertTrue(a == b)``), which is not rewritten."""

    def __init__(self, own_files):
        super().__init__(os.sep)
        self.own_files = {os.path.realpath(path) for path in own_files}

    def canonical(self, value, depth):
        return value

    def _inside(self, filename):
        return bool(filename) and os.path.realpath(filename) in self.own_files

    def dishonesty(self, operator, left, right):
        own_left, own_right = self.holds_own(left), self.holds_own(right)
        if operator in ("in", "not in"):
            if own_left and not own_right:
                return self._equal_to_a_probe(left, lambda probe: left in probe, right)
            return ""
        if own_left == own_right or operator in ("is", "is not"):
            return ""
        own, other = (left, right) if own_left else (right, left)

        def asked(op, probe):  # the comparison with ``probe`` in the other side's place
            return _COMPARISONS[op](own, probe) if own_left else _COMPARISONS[op](probe, own)

        if operator == "==":
            return self._equal_to_a_probe(own, lambda probe: asked("==", probe), other)
        if operator == "!=":
            for probe in (_probe_of(other, False), _probe_of(other, True)):
                if _answer(asked, "!=", probe) is False:
                    return self._lie(own, "says it is not unequal to a probe of the other side")
            unequal, equal = _answer(asked, "!=", other), _answer(asked, "==", other)
            if unequal is not None and equal is not None and unequal == equal:
                return self._lie(own, "says != and == alike for the same value")
            if _answer(_COMPARISONS["!="], own, own) and _answer(_COMPARISONS["=="], own, own) is False:
                return self._lie(own, "is unequal to itself")
            return ""
        if _answer(asked, operator, _Probe()) is True:
            return self._lie(own, f"says {operator!r} holds against a fresh object")
        if _answer(asked, operator, other) and _answer(asked, _COMPLEMENT[operator], other):
            return self._lie(own, f"says both {operator!r} and {_COMPLEMENT[operator]!r} hold")
        return ""

    def _equal_to_a_probe(self, own, says_equal, other):
        for fresh in (False, True):
            if _answer(says_equal, _probe_of(other, fresh)):
                return self._lie(
                    own, "also equals a probe of the other side (every leaf changed or replaced)"
                )
        return ""

    @staticmethod
    def _lie(own, what):
        return f"the value of the agent's type {type(own).__name__} {what}: its comparisons cannot be trusted"


_COMPLEMENT = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def _answer(compare, *operands):
    """``bool(compare(*operands))``, or None when there is no plain answer (it raised, or its result has no
    truth)."""
    try:
        return bool(compare(*operands))
    except Exception:  # noqa: BLE001 - a comparison it cannot answer is not a lie
        return None


class _Probe:
    """A fresh object no honest ``__eq__`` equals."""

    __slots__ = ()


def _probe_of(value, fresh, depth=0):
    """``value``'s shape with every leaf changed (``fresh``: replaced by a ``_Probe``)."""
    kind = type(value)
    if depth > _MAX_COMPARED_DEPTH:
        return _Probe()
    if kind in (list, tuple):
        return kind(_probe_of(item, fresh, depth + 1) for item in value)
    if kind is dict:
        return {key: _probe_of(item, fresh, depth + 1) for key, item in value.items()}
    if kind in (set, frozenset):
        return kind(_Probe() for _ in value)
    changed = None if fresh else _PROBE_CHANGES.get(kind)
    return _Probe() if changed is None else changed(value)


_PROBE_CHANGES = {
    bool: lambda value: not value,
    int: lambda value: value + 7919,
    float: lambda value: value + max(1.0, abs(value)) if abs(value) < 1e300 else _Probe(),
    str: lambda value: value + "\0rein-probe",
    bytes: lambda value: value + b"\0rein-probe",
}


COMPARE_NAME = "@rein_compare"  # not an identifier: no test source can name it


class _HonestAsserts(ast.NodeTransformer):
    """Every comparison inside an ``assert`` becomes a call of ``HonestComparisons`` (operands still evaluated
    once each, left to right; a chain's later operands are evaluated even when an earlier link is false). With
    ``top_level_only``, only comparisons the assert itself tests (``assert a == b``, ``assert a == b and not
    c in d``), never one whose result a call uses (``assert (a == b).all()``: an array, not a truth)."""

    def __init__(self, top_level_only=False):
        self.top_level_only = top_level_only

    def visit_Assert(self, node):
        node.test = (
            _top_level_compares(node.test) if self.top_level_only else _CompareCalls().visit(node.test)
        )
        return node


def _top_level_compares(test):
    if isinstance(test, ast.Compare):
        return _CompareCalls().compare_call(test)
    if isinstance(test, ast.BoolOp):
        test.values = [_top_level_compares(value) for value in test.values]
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test.operand = _top_level_compares(test.operand)
    return test


class _CompareCalls(ast.NodeTransformer):
    def visit_Compare(self, node):
        self.generic_visit(node)
        return self.compare_call(node)

    def compare_call(self, node):
        operators = ast.Constant(tuple(_AST_OPERATORS[type(op).__name__] for op in node.ops))
        call = ast.Call(
            func=ast.Name(COMPARE_NAME, ast.Load()),
            args=[operators, node.left, *node.comparators],
            keywords=[],
        )
        return ast.copy_location(call, node)


def honest_asserts(tree, top_level_only=False):
    """``tree`` with every comparison in its ``assert`` statements routed through ``HonestComparisons``."""
    return ast.fix_missing_locations(_HonestAsserts(top_level_only).visit(tree))


def honest_repository_asserts(comparisons):
    """Repository mode: every module pytest's assertion rewriting rewrites (the repository's test modules and
    conftests, as they are on disk: the data set's tests are not edited) first routes the comparisons its
    asserts test through ``comparisons``, found under a name no source can spell, in builtins."""
    from _pytest.assertion import rewrite

    rewrite_asserts = rewrite.rewrite_asserts

    def rewrite_honestly(mod, source, module_path=None, config=None):
        rewrite_asserts(honest_asserts(mod, top_level_only=True), source, module_path, config)

    rewrite.rewrite_asserts = rewrite_honestly
    setattr(builtins, COMPARE_NAME, comparisons)
    honest_unittest_asserts(comparisons)


# unittest's comparison asserts and the operator each one tests (aliases included: they hold the original)
_UNITTEST_COMPARISONS = {
    "assertEqual": "==", "assertEquals": "==", "failUnlessEqual": "==", "assertAlmostEqual": "==",
    "assertNotEqual": "!=", "assertNotEquals": "!=", "failIfEqual": "!=",
    "assertLess": "<", "assertLessEqual": "<=", "assertGreater": ">", "assertGreaterEqual": ">=",
    "assertIn": "in", "assertNotIn": "not in",
}  # fmt: skip


def honest_unittest_asserts(comparisons):
    """``unittest.TestCase``'s comparison asserts first put their two operands through ``comparisons`` (as an
    ``assert a == b`` would), then run as before."""
    import unittest

    def checked(method, operator):
        def assert_method(self, first, second, *args, **kwargs):
            comparisons((operator,), first, second)
            return method(self, first, second, *args, **kwargs)

        assert_method.__name__ = assert_method.__qualname__ = method.__name__
        return assert_method

    for name, operator in _UNITTEST_COMPARISONS.items():
        method = vars(unittest.TestCase).get(name)
        if method is not None:
            setattr(unittest.TestCase, name, checked(method, operator))


# -- the code under test, in a process of its own -----------------------------------------------------------
#
# In built-in mode no code of the agent runs in the test process. Every module of the workspace the hidden tests
# import is a ``RemoteModule``: the *code-under-test process* (started by the observer, holding nothing but its
# end of one socket and the output pipe) imports and runs the agent's code, and the test process sees only plain
# values copied by its own JSON decoder (exact builtin types: a ``str`` subclass arrives as a ``str``) or ``Remote`` handles,
# whose every operation is a request to that process. The test process lends it only callables the tests pass
# in (a ``key=`` function), which it may call, test for truth, hash, compare and print, and nothing else.

_MAX_BRIDGE_MESSAGE_BYTES = 64 << 20
_MAX_BRIDGED_DEPTH = 64
_BRIDGE_SIZE = struct.Struct("!I")


class CodeUnderTestGone(RuntimeError):
    """The code-under-test process ended (it exited or was killed) or broke the bridge's protocol."""


class Remote:
    """A value living in the other process of the bridge; every operation on it is a request there."""

    __slots__ = ("_Remote__bridge", "_Remote__id")

    def __init__(self, bridge, handle):
        object.__setattr__(self, "_Remote__bridge", bridge)
        object.__setattr__(self, "_Remote__id", handle)

    def __getattr__(self, name):
        return self.__bridge.request("getattr", self, name)

    def __setattr__(self, name, value):
        self.__bridge.request("setattr", self, name, value)

    def __delattr__(self, name):
        self.__bridge.request("delattr", self, name)

    def __call__(self, *args, **kwargs):
        return self.__bridge.request("call", self, *args, **kwargs)

    def __iter__(self):
        return self.__bridge.request("iter", self)

    def __next__(self):
        return self.__bridge.request("next", self)

    def __enter__(self):
        return self.__bridge.request("enter", self)

    def __exit__(self, *exc_info):
        return self.__bridge.request("exit", self, None, None, None)


def _forward(operation, reflected=False):
    def method(self, *args):
        arguments = (args[0], self) if reflected else (self, *args)
        return object.__getattribute__(self, "_Remote__bridge").request(operation, *arguments)

    return method


_BRIDGE_OPERATIONS = {
    "len": len, "contains": lambda container, item: item in container, "getitem": lambda o, k: o[k],
    "setitem": lambda o, k, v: o.__setitem__(k, v), "delitem": lambda o, k: o.__delitem__(k), "bool": bool,
    "repr": repr, "str": str, "hash": hash, "int": int, "float": float, "index": lambda o: o.__index__(),
    "neg": lambda o: -o, "pos": lambda o: +o, "abs": abs, "invert": lambda o: ~o,
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "add": lambda a, b: a + b, "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b, "truediv": lambda a, b: a / b, "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b, "pow": lambda a, b: a**b, "and": lambda a, b: a & b, "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b, "lshift": lambda a, b: a << b, "rshift": lambda a, b: a >> b,
    "matmul": lambda a, b: a @ b,
}  # fmt: skip
for _name in ("len", "contains", "getitem", "setitem", "delitem", "bool", "repr", "str", "hash", "int",
              "float", "index", "neg", "pos", "abs", "invert", "eq", "ne", "lt", "le", "gt", "ge"):  # fmt: skip
    setattr(Remote, f"__{_name}__", _forward(_name))
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift",
              "matmul"):  # fmt: skip
    setattr(Remote, f"__{_name}__", _forward(_name))
    setattr(Remote, f"__r{_name}__", _forward(_name, reflected=True))


class Bridge:
    """One end of the bridge: requests to the other process and the requests it serves (``serves``)."""

    def __init__(self, sock, serves, lends):
        self.sock = sock
        self.serves = serves  # operation name -> function
        self.lends = lends  # which non-plain values of this process the other may hold (and only call)
        self.owned, self.remotes = {}, {}
        self.next_seq = 0

    def request(self, operation, *args, **kwargs):
        seq = self.next_seq = self.next_seq + 1
        encoded = [self.encode(arg) for arg in args]
        self.send(["q", seq, operation, encoded, {str(k): self.encode(v) for k, v in kwargs.items()}])
        while True:
            message = self.receive()
            if message[0] == "q":
                self.serve(message)
                continue
            kind, reply_seq, payload = message
            if reply_seq != seq:
                raise CodeUnderTestGone("the code-under-test process answered out of turn")
            if kind == "r":
                return self.decode(payload)
            raise self.exception(payload)

    def serve(self, message):
        _, seq, operation, args, kwargs = message
        try:
            if operation not in self.serves:
                raise TypeError(f"the grader's bridge does not serve {operation!r} here")
            decoded = [self.decode(arg) for arg in args]
            result = self.serves[operation](*decoded, **{k: self.decode(v) for k, v in kwargs.items()})
            reply = ["r", seq, self.encode(result)]
        except BaseException as error:  # noqa: BLE001 - SystemExit too: the other process decides what it means
            reply = ["x", seq, self.encode_exception(error)]
        self.send(reply)

    def serve_forever(self):
        while True:
            self.serve(self.receive())

    def send(self, message):
        data = json.dumps(message, separators=(",", ":")).encode()
        try:
            self.sock.sendall(_BRIDGE_SIZE.pack(len(data)) + data)
        except OSError as error:
            raise CodeUnderTestGone(f"the code-under-test process is gone: {error}") from None

    def _read(self, size):
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(min(size - len(data), 1 << 20))
            if not chunk:
                raise CodeUnderTestGone("the code-under-test process ended (it exited or was killed)")
            data += chunk
        return bytes(data)

    def receive(self):
        (size,) = _BRIDGE_SIZE.unpack(self._read(_BRIDGE_SIZE.size))
        if size > _MAX_BRIDGE_MESSAGE_BYTES:
            raise CodeUnderTestGone(f"the code-under-test process sent {size} bytes in one message")
        message = json.loads(self._read(size))
        if not isinstance(message, list) or len(message) not in (3, 5) or message[0] not in ("q", "r", "x"):
            raise CodeUnderTestGone("the code-under-test process broke the bridge's protocol")
        return message

    def encode(self, value, depth=0):
        if depth > _MAX_BRIDGED_DEPTH:
            raise ValueError("a value crossing the grader's bridge is nested too deeply")
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return ["f", value.hex()]
        if isinstance(value, Remote) and object.__getattribute__(value, "_Remote__bridge") is self:
            return ["p", object.__getattribute__(value, "_Remote__id")]
        for base, copy in _EXACT_COPY:
            if isinstance(value, base):
                return self._encode_exact(base, copy(value), depth)
        if isinstance(value, range):
            return ["r", value.start, value.stop, value.step]
        if not self.lends(value):
            raise TypeError(
                f"the grader's bridge passes only plain values and callables, not {kind.__name__}"
            )
        handle = id(value)
        self.owned[handle] = value
        return ["o", handle]

    def _encode_exact(self, base, exact, depth):
        if base in (bool, int, str):
            return exact
        if base is float:
            return ["f", exact.hex()]
        if base is complex:
            return ["j", exact.real.hex(), exact.imag.hex()]
        if base in (bytes, bytearray):
            return ["b" if base is bytes else "a", bytes(exact).hex()]
        if base is dict:
            return [
                "d",
                [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in dict.items(exact)],
            ]
        items = exact if base in (list, tuple) else list(set.__iter__(set(exact)))
        return [
            {list: "l", tuple: "t", set: "s", frozenset: "z"}[base],
            [self.encode(i, depth + 1) for i in items],
        ]

    def decode(self, payload, depth=0):
        if depth > _MAX_BRIDGED_DEPTH:
            raise ValueError("a value crossing the grader's bridge is nested too deeply")
        if payload is None or type(payload) in (bool, int, str):
            return payload
        tag, *rest = payload
        if tag == "f":
            return float.fromhex(rest[0])
        if tag == "j":
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag in ("b", "a"):
            return (bytes if tag == "b" else bytearray).fromhex(rest[0])
        if tag == "r":
            return range(int(rest[0]), int(rest[1]), int(rest[2]))
        if tag == "d":
            return {self.decode(k, depth + 1): self.decode(v, depth + 1) for k, v in rest[0]}
        if tag in ("l", "t", "s", "z"):
            items = [self.decode(item, depth + 1) for item in rest[0]]
            return {"l": list, "t": tuple, "s": set, "z": frozenset}[tag](items)
        if tag == "p":
            return self.owned[int(rest[0])]
        if tag == "o":
            handle = int(rest[0])
            if handle not in self.remotes:
                self.remotes[handle] = Remote(self, handle)
            return self.remotes[handle]
        raise CodeUnderTestGone(f"the code-under-test process sent an unknown value tag {tag!r}")

    def encode_exception(self, error):
        """The exception as the nearest builtin exception class, its arguments if they are plain."""
        name = next(k.__name__ for k in type(error).__mro__ if getattr(builtins, k.__name__, None) is k)
        if not isinstance(error, Exception):
            name, args = "RuntimeError", (f"the code under test raised {type(error).__name__}{error.args!r}",)
        else:
            args = error.args
        try:
            encoded = [self.encode(arg) for arg in args]
        except (TypeError, ValueError):
            encoded = [str(error)]
        return [name, encoded]

    def exception(self, payload):
        name, args = payload
        kind = getattr(builtins, str(name), None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind = RuntimeError
        try:
            return kind(*[self.decode(arg) for arg in args])
        except Exception:  # noqa: BLE001 - arguments that class refuses: keep the text
            return kind(repr(args)[:1000])


class RemoteModule(type(sys)):
    """A workspace module as the test process sees it: its attributes are requests to the code-under-test
    process (which imported it). A package path of its own lets ``import pkg.sub`` reach the finder."""

    def __getattr__(self, name):
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        return getattr(self.__dict__["_rein_remote"], name)


class RemoteModules:
    """The meta-path finder and loader of ``RemoteModule``: it claims every top-level name the workspace
    provides that the stdlib and site-packages do not."""

    def __init__(self, bridge, workspace):
        import importlib.machinery

        self.bridge = bridge
        elsewhere = [entry for entry in sys.path if os.path.realpath(entry) != os.path.realpath(workspace)]
        self.claimed = set()
        for name in os.listdir(workspace):
            top = name[: -len(".py")] if name.endswith(".py") else name
            path = os.path.join(workspace, name)
            if not top.isidentifier() or not (name.endswith(".py") or os.path.isdir(path)):
                continue
            if top in sys.builtin_module_names or importlib.machinery.PathFinder.find_spec(top, elsewhere):
                continue
            self.claimed.add(top)

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        if fullname.split(".", 1)[0] not in self.claimed:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = RemoteModule(spec.name)
        module.__dict__["_rein_remote"] = self.bridge.request("import", spec.name)
        return module

    def exec_module(self, module):
        pass


def _lent_to_the_code_under_test(value):
    return callable(value)


def bridge_to_the_code_under_test(workspace, bridge_fd):
    """In the test process: workspace modules come from the code-under-test process (the module comment)."""
    lent = {
        "call": _call,
        **{name: _BRIDGE_OPERATIONS[name] for name in ("bool", "hash", "repr", "eq", "ne")},
    }
    bridge = Bridge(socket.socket(fileno=int(bridge_fd)), lent, _lent_to_the_code_under_test)
    sys.meta_path.insert(0, RemoteModules(bridge, workspace))


def _call(function, *args, **kwargs):
    return function(*args, **kwargs)


def code_under_test_process(bridge_fd, workspace):
    """The code-under-test process: imports and runs the agent's code at the test process's request."""
    import importlib

    sys.dont_write_bytecode = True
    sys.path.append(workspace)  # after the stdlib and site-packages, as the test process had it
    serves = {
        "import": importlib.import_module,
        "getattr": getattr,
        "setattr": setattr,
        "delattr": delattr,
        "call": _call,
        "iter": iter,
        "next": next,
        "enter": lambda value: value.__enter__(),
        "exit": lambda value, *exc_info: value.__exit__(*exc_info),
        **_BRIDGE_OPERATIONS,
    }
    bridge = Bridge(socket.socket(fileno=int(bridge_fd)), serves, lambda value: True)
    try:
        bridge.serve_forever()
    except CodeUnderTestGone:  # the test process closed its end: nothing more to run
        os._exit(0)


# -- the test process ---------------------------------------------------------------------------------------


_WATCHED_PREFIXES = ("pytest", "_pytest", "pluggy", "builtins", "unittest")  # unittest: its checked asserts
_PLAIN_DATA = (bool, int, float, str, bytes, type(None))


def _code_of(value):
    function = getattr(value, "__func__", value)  # classmethod / staticmethod / bound method
    return id(getattr(function, "__code__", None))


_repository_mode = False  # set by the test process in repository mode (see runner_fingerprint)


def runner_fingerprint(plugin_manager):
    """What code under test would have to change to forge outcomes from inside the test process: every
    callable and class of pytest/pluggy/builtins/unittest (their identity, their code, every class's own attributes),
    the registered plugins, and the tracing hooks. Taken before any code of the agent runs, compared after
    every test phase. In repository mode the repository's own ``conftest.py`` modules, which pytest registers as
    plugins while it collects (the host restored them to the base), do not count as a change."""
    fingerprint, classes = {}, {}
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.split(".", 1)[0] not in _WATCHED_PREFIXES:
            continue
        for name, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__.split(".", 1)[0] in _WATCHED_PREFIXES:
                if id(value) not in classes:  # a class re-exported by several modules is read once
                    # Plain data attributes are flags pytest sets on classes; instances shadow them anyway.
                    # ``__pytest_*`` are the xunit-setup fixtures pytest injects into every class it collects
                    # as a test class (``unittest.TestCase`` itself, when a test module imports it).
                    classes[id(value)] = {
                        key: (id(item), _code_of(item))
                        for key, item in list(vars(value).items())
                        if not isinstance(item, _PLAIN_DATA) and "__pytest_" not in key
                    }
                fingerprint[f"{module_name}.{name}"] = (id(value), classes[id(value)])
            elif callable(value) and not isinstance(value, type(sys)):
                fingerprint[f"{module_name}.{name}"] = (id(value), _code_of(value))
    plugins = plugin_manager.get_plugins()
    if _repository_mode:
        plugins = [plugin for plugin in plugins if not _is_conftest_module(plugin)]
    fingerprint["<plugins>"] = tuple(sorted(id(plugin) for plugin in plugins))
    fingerprint["<trace>"] = (id(sys.gettrace()), id(sys.getprofile()))
    return fingerprint


def _is_conftest_module(plugin):
    return (
        isinstance(plugin, type(sys))
        and os.path.basename(getattr(plugin, "__file__", "") or "") == "conftest.py"
    )


def fingerprint_changes(before, after):
    """Names whose fingerprint changed or vanished (additions of new names are allowed: lazy imports)."""
    return sorted(name for name, value in before.items() if after.get(name) != value)


def test_process(source_fd, event_fd, options):
    # Not dumpable: the code-under-test process can neither ptrace us nor open /proc/PID/{mem,fd}.
    _prctl(4, 0)
    with os.fdopen(int(source_fd), encoding="utf-8") as handle:
        hidden = json.loads(handle.read())
    channel = socket.socket(fileno=int(event_fd))

    def send(event):
        channel.send(json.dumps(event).encode())

    workspace = options["workspace"]
    sys.dont_write_bytecode = True
    import linecache
    import types

    import pytest
    from _pytest.assertion.rewrite import rewrite_asserts

    by_path = {os.path.join(workspace, relative): source for relative, source in hidden.items()}
    hidden.clear()
    honest_comparisons = HonestComparisons(workspace, by_path)

    class HiddenModule(pytest.Module):
        """A hidden test module compiled from the source received over the pipe, not read from disk."""

        def _getobj(self):
            filename = str(self.path)
            source = by_path[filename]
            dotted = os.path.relpath(filename, workspace)[: -len(".py")].replace("/", ".")
            tree = honest_asserts(ast.parse(source, filename=filename))
            rewrite_asserts(tree, source.encode(), filename, self.config)
            module = types.ModuleType(dotted)
            module.__dict__[COMPARE_NAME] = honest_comparisons
            module.__file__ = filename
            module.__package__ = dotted.rpartition(".")[0]
            sys.modules[dotted] = module
            lines = source.splitlines(keepends=True)
            linecache.cache[filename] = (
                len(source),
                None,
                lines,
                filename,
            )  # tracebacks show the real source
            try:
                exec(compile(tree, filename, "exec", dont_inherit=True), module.__dict__)
            except Exception as error:
                raise self.CollectError(f"importing the hidden test module failed: {error!r}") from error
            return module

    global _repository_mode
    _repository_mode = options.get("pytest_args") is not None

    raised = {}  # (nodeid, phase) -> whether the phase raised anything (see pytest_runtest_makereport)

    class EventSender:
        def __init__(self):
            self.fingerprint = None
            self.tampered = False

        @pytest.hookimpl(trylast=True)
        def pytest_sessionstart(self, session):
            # Plugins are loaded and collection has not begun: no code of the agent has run yet.
            self.fingerprint = runner_fingerprint(session.config.pluginmanager)
            self.plugin_manager = session.config.pluginmanager

        def _check(self):
            if self.tampered or self.fingerprint is None:
                return
            changed = fingerprint_changes(self.fingerprint, runner_fingerprint(self.plugin_manager))
            if changed:
                self.tampered = True
                send({"kind": "tampered", "names": changed[:20]})

        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionfinish(self, session, exitstatus):
            self._check()  # before unconfigure undoes pytest's own patches
            send({"kind": "done", "exit_status": int(exitstatus)})

        def pytest_pycollect_makemodule(self, module_path, parent):
            if str(module_path) in by_path:
                return HiddenModule.from_parent(parent, path=module_path)
            return None

        def pytest_collectreport(self, report):
            if report.failed:
                text = str(report.longrepr)[-_COLLECTION_ERROR_CHARS:]
                send({"kind": "collect", "nodeid": report.nodeid, "text": text})

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_makereport(self, item, call):
            # The outermost wrapper: it sees the report as every other plugin left it, and the phase's raw
            # CallInfo, whose excinfo says whether anything at all was raised (skip, xfail, any exception).
            outcome = yield
            raised[(item.nodeid, call.when)] = call.excinfo is not None or outcome.excinfo is not None

        def pytest_runtest_logreport(self, report):
            if report.when == "teardown":  # after fixtures (monkeypatch) undid what the test itself changed
                self._check()
            event = {
                "kind": "test",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "xfail": hasattr(report, "wasxfail"),
                # A report that did not come from makereport (a plugin made it up) counts as raised.
                "raised": raised.pop((report.nodeid, report.when), True),
            }
            send(event)

    ini_path = os.path.join(options["ini_dir"], "grader-pytest.ini")
    pytest_args = options.get("pytest_args")
    if pytest_args is not None:
        # Repository mode: the tree must shadow an installed copy of its own package (``python -m pytest`` puts
        # it first), but not the stdlib or pytest, which are imported already or come before it.
        site = [
            index
            for index, entry in enumerate(sys.path)
            if entry.endswith(("site-packages", "dist-packages"))
        ]
        sys.path.insert(site[0] if site else len(sys.path), workspace)
        changed = [os.path.join(workspace, path) for path in options.get("changed_paths", [])]
        honest_repository_asserts(ProbingComparisons(changed))  # before the fingerprint (sessionstart)
        arguments = ["-p", "no:cacheprovider"]
        for plugin in options.get("plugins", []):
            arguments += ["-p", plugin]
        exit_code = pytest.main([*arguments, *pytest_args], plugins=[EventSender()])
        sys.stdout.flush()
        os._exit(int(exit_code))
    bridge_to_the_code_under_test(workspace, options["bridge_fd"])  # no code of the agent runs here
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
    for plugin in options.get("plugins", []):
        arguments += ["-p", plugin]
    arguments += sorted(os.path.relpath(path, workspace) for path in by_path)
    sender = EventSender()

    class DirectoriesNotPackages:
        """No ``__init__.py`` of the workspace is imported here (pytest imports a package's to set it up)."""

        @pytest.hookimpl(tryfirst=True)
        def pytest_collect_directory(self, path, parent):
            return pytest.Dir.from_parent(parent, path=path)

    exit_code = pytest.main(arguments, plugins=[sender, DirectoriesNotPackages()])
    sys.stdout.flush()
    os._exit(int(exit_code))


if __name__ == "__main__":
    if sys.argv[1] == "--test-process":
        test_process(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    elif sys.argv[1] == "--code-under-test":
        code_under_test_process(sys.argv[2], sys.argv[3])
    else:
        main()
