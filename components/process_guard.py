"""No orphans: a run's processes die with its driver, even when the driver is killed with SIGKILL.

``ProcessGuard.start()`` spawns a small watcher process (this file run as a script: standard library only, in its
own session so a signal to the driver's process group does not reach it). Every ``interval_s`` it records the
owner's descendants that were not there when it started (the local Ray cluster's gcs/raylet/workers, sandboxes,
inference servers, agent subprocesses), by pid and start time. When the owner dies without saying goodbye
(``close()``), it freezes every recorded process that is still the same process, plus everything those
processes started since (SIGSTOP, repeated until nothing new appears, so nothing forks away), kills them all
(SIGKILL) and writes one line per process to its log. Processes that were the owner's descendants before the
guard started are never touched (in a pytest run: the shared vLLM server of the session, other tests' parts).

The owner's death is seen at once through a pipe only the owner holds (its end is closed on exec), and checked
every ``interval_s`` as well, in case a forked child of the owner inherited the pipe's end. A process the owner
itself started less than ``interval_s`` before its death may escape the record: Rein's own children also die
with their parent (Ray's ``PR_SET_PDEATHSIG``, bubblewrap's ``--die-with-parent``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

STOP = b"stop\n"  # what ``close()`` writes: the owner ended normally, nothing to kill
READY = b"ready\n"  # the guard's first line: it has taken the owner's descendants to spare
SWEEP_SETTLE_S = 0.05  # between freeze rounds: a fork under way shows up in /proc


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, command name) of ``pid``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:  # cheaper than Path.read_text: read every second
            text = file.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    name_end = text.rindex(")")  # the command name may hold spaces and parentheses
    fields = text[name_end + 2 :].split()
    state, parent = fields[0], int(fields[1])
    if state in ("Z", "X"):  # exited; only waits to be reaped
        return None
    return parent, int(fields[19]), text[text.index("(") + 1 : name_end]


def process_table() -> dict[int, tuple[int, int, str]]:
    """Every live process: pid → (parent pid, start time, command name)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            table[int(entry)] = stat
    return table


def descendants(root: int, table: dict[int, tuple[int, int, str]]) -> set[int]:
    """The pids below ``root`` in ``table`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, frontier = set(), [root]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


class _Watch:
    """The guard's side: what it records, and the sweep."""

    def __init__(self, owner: int, owner_start: int, interval_s: float, log) -> None:
        self.owner, self.owner_start, self.interval_s, self.log = owner, owner_start, interval_s, log
        table = process_table()
        self.spared = {(pid, table[pid][1]) for pid in descendants(owner, table)}
        self.recorded: dict[int, tuple[int, str]] = {}  # pid -> (start time, name)

    def owner_alive(self) -> bool:
        stat = _stat(self.owner)
        return stat is not None and stat[1] == self.owner_start

    def record(self) -> None:
        table = process_table()
        self.recorded = {
            pid: (start, name)
            for pid, (start, name) in self.recorded.items()
            if pid in table and table[pid][1] == start
        }
        for pid in descendants(self.owner, table):
            start, name = table[pid][1], table[pid][2]
            if pid != os.getpid() and (pid, start) not in self.spared:
                self.recorded[pid] = (start, name)

    def sweep(self) -> None:
        """Freeze the recorded processes and whatever they started since, then kill them all."""
        frozen: dict[int, tuple[int, str]] = {}
        candidates = dict(self.recorded)
        while candidates:
            for pid, identity in candidates.items():
                try:
                    os.kill(pid, signal.SIGSTOP)
                    frozen[pid] = identity
                except ProcessLookupError:
                    pass
            time.sleep(SWEEP_SETTLE_S)
            table = process_table()
            frozen = {
                pid: ident for pid, ident in frozen.items() if pid in table and table[pid][1] == ident[0]
            }
            candidates = {}
            for pid in frozen:
                for child in descendants(pid, table):
                    if child not in frozen and child != os.getpid():
                        candidates[child] = (table[child][1], table[child][2])
        for pid, (_, name) in sorted(frozen.items()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.log(f"killed {name} (pid {pid})")
        self.log(f"owner {self.owner} died: killed {len(frozen)} processes of its run")

    def run(self, pipe: int) -> None:
        """Record until the owner says goodbye (nothing to do) or dies (sweep)."""
        while True:
            readable, _, _ = select.select([pipe], [], [], self.interval_s)
            if readable:
                message = os.read(pipe, len(STOP))
                if message == STOP:
                    return
                if not message and not self.owner_alive():  # EOF: the owner's end closed with it
                    break
            if not self.owner_alive():
                break
            self.record()
        self.sweep()


class ProcessGuard:
    """The owner's handle on its guard process (see the module doc)."""

    def __init__(self, process: subprocess.Popen, pipe: int) -> None:
        self.process, self._pipe = process, pipe

    @classmethod
    def start(cls, *, log_path: Path | None = None, interval_s: float = 1.0) -> ProcessGuard:
        """Spawn a guard over this process's descendants from now on; ``log_path``: where it says what it killed
        (default: nowhere)."""
        read_end, write_end = os.pipe()  # both close on exec: only the guard gets the read end (pass_fds)
        owner = os.getpid()
        command = [sys.executable, "-I", __file__, "--owner", str(owner), "--pipe", str(read_end)]
        command += ["--owner-start", str(_stat(owner)[1]), "--interval-s", str(interval_s)]
        if log_path is not None:
            command += ["--log", str(log_path)]
        process = subprocess.Popen(
            command,
            pass_fds=(read_end,),
            start_new_session=True,  # a signal to the owner's process group does not reach its guard
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        os.close(read_end)
        ready = process.stdout.readline()  # the guard has taken its spared set: what starts now is recorded
        process.stdout.close()
        if ready != READY:
            process.kill()
            process.wait()
            raise RuntimeError(f"the process guard did not start (exit status {process.returncode})")
        return cls(process, write_end)

    def close(self) -> None:
        """The owner ends normally: the guard stops without killing anything."""
        if self._pipe < 0:
            return
        with contextlib.suppress(BrokenPipeError):
            os.write(self._pipe, STOP)
        os.close(self._pipe)
        self._pipe = -1
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--owner-start", type=int, required=True)
    parser.add_argument("--pipe", type=int, required=True)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--log", type=Path)
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ctrl-C meant for the run must not stop its guard

    def log(line: str) -> None:
        if args.log is None:
            return
        with contextlib.suppress(OSError):  # a log that cannot be written never stops the sweep
            args.log.parent.mkdir(parents=True, exist_ok=True)
            with args.log.open("a") as file:
                file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} process_guard: {line}\n")

    watch = _Watch(args.owner, args.owner_start, args.interval_s, log)
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the owner stopped reading
    if watch.owner_alive():
        watch.run(args.pipe)
    else:
        watch.sweep()


if __name__ == "__main__":
    _main()
