"""The process that runs inside every bubblewrap sandbox and executes the host's requests.

Started by ``sandboxes.bwrap`` as ``python -I -S supervisor.py UID MAX_INODES`` (the host's own interpreter, bound
read-only), first as root inside the sandbox's mount/PID/net namespaces: it hands the workspace and ``/tmp``
to the sandbox's host uid, drops to that uid for good (no capabilities, ``no_new_privs``), then enters a user
namespace of its own where it is uid 1000. From then on every command it starts, and every file it touches,
has exactly the sandbox user's rights: file operations can never follow a symlink out of the sandbox.

Protocol: one JSON object per line on stdin (``{"id": n, "op": ..., ...}``), one reply per line on stdout
(``{"id": n, ...}`` or ``{"id": n, "error": ..., "kind": ...}``); bytes travel base64-encoded. Requests are
served concurrently (a thread each). Standard library only: this file must start in a few milliseconds.
"""

import base64
import io
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

WORKSPACE = "/workspace"
INNER_UID = 1000
PROXY_SOCKET = "/run/rein/proxy.sock"
PRLIMIT = "/usr/bin/prlimit"
# After a command exits, how long its output pipes are still drained. A process it detached (setsid) may hold
# them open for ever; exec must not wait for it.
OUTPUT_READ_GRACE_S = 0.25
# When the sandbox's cgroup runs out of memory the kernel kills its "worst" process: make that a command (and
# what it forks), not the supervisor: files in a tmpfs belong to no process, so the supervisor would often be
# the largest. choom (util-linux) sets it after exec, the first moment the command's /proc entry is its own.
# A command may lower its score back to the supervisor's (0), never below. (An image root without choom: skipped.)
CHOOM = "/usr/bin/choom"
COMMAND_OOM_SCORE_ADJ = 500
TMPFS_MOUNTS = (WORKSPACE, "/tmp", "/home/sandbox", "/dev/shm")
MS_NOSUID, MS_NODEV, MS_REMOUNT = 2, 4, 32

_write_lock = threading.Lock()
_active_sessions_lock = threading.Lock()
_active_sessions: set[int] = set()  # == the pids of running commands (each leads its own session)
# Held while a command is spawned and registered, so the orphan reaper never reaps a command's own exit status.
_spawn_lock = threading.Lock()
_reap_soon = threading.Event()  # set after killing processes, so their zombies go at once
_proxy_listener: socket.socket | None = None


class Refused(Exception):
    """A file operation the host must not get an answer to: not a regular file, or over its size cap."""


def _send(message: dict) -> None:
    line = (json.dumps(message) + "\n").encode()
    with _write_lock:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()


def _limit_inodes(libc, max_inodes: int) -> None:
    """Cap the number of files (inodes) of every writable tmpfs: bwrap's ``--tmpfs`` takes only a size, and a
    tmpfs' default inode count (half the host's RAM pages) would let millions of empty files through."""
    for path in TMPFS_MOUNTS:
        data = f"nr_inodes={max_inodes}".encode()
        if libc.mount(b"none", path.encode(), b"tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV, data) != 0:
            import ctypes

            raise OSError(ctypes.get_errno(), f"cannot cap the inodes of {path}")


def _drop_privileges(host_uid: int, max_inodes: int) -> str:
    """Cap the tmpfs inodes, become ``host_uid`` for good, then uid 1000 in a user namespace of our own.
    Returns the mode."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() != 0:  # bwrap itself ran unprivileged with --unshare-user: already confined
        return "unprivileged"
    _limit_inodes(libc, max_inodes)
    for path in TMPFS_MOUNTS:
        os.chown(path, host_uid, host_uid)
        os.chmod(path, 0o1777 if path in ("/tmp", "/dev/shm") else 0o755)
    os.setgroups([])
    os.setresgid(host_uid, host_uid, host_uid)
    os.setresuid(host_uid, host_uid, host_uid)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: the uid change cleared it, which locks /proc/self
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER; refused where unprivileged user namespaces are off
        return "uid"
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{INNER_UID} {host_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{INNER_UID} {host_uid} 1")
    # Not dumpable again: commands run as the same uid, and must not ptrace us or open our /proc/PID/fd pipes.
    libc.prctl(4, 0, 0, 0, 0)
    return "userns"


def _resolve(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(WORKSPACE, path)


def _kill_strays(keep_sessions: set[int]) -> None:
    """SIGKILL every process of the sandbox except us (its PID 1) and the sessions still running."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        try:
            sid = os.getsid(pid)
        except OSError:
            continue
        if sid in keep_sessions or sid == os.getsid(me):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _op_exec(req: dict) -> dict:
    limits = req["limits"]
    if req.get("shell") is not None:
        argv = ["/bin/sh", "-c", req["shell"]]
    else:
        argv = list(req["argv"])
    choom = [CHOOM, "-n", str(COMMAND_OOM_SCORE_ADJ), "--"] if os.path.exists(CHOOM) else []
    argv = [
        *choom,
        PRLIMIT,
        f"--cpu={limits['cpu_time_s']}",
        f"--as={limits['memory_mb'] * 1024 * 1024}",
        f"--nproc={limits['max_processes']}",
        "--",
        *argv,
    ]
    with _spawn_lock:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=_resolve(req.get("cwd") or WORKSPACE),
                env=req["env"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:  # bad cwd, no such program, fork refused: the command's fault, reported as 127
            return {
                "exit_code": 127,
                "stdout": "",
                "stderr": f"{type(exc).__name__}: {exc}\n",
                "timed_out": False,
            }
        with _active_sessions_lock:
            _active_sessions.add(proc.pid)
    try:
        out, err, exited = _collect_output(proc, req["timeout_s"], req["max_output_bytes"])
    finally:
        try:  # background jobs of the command die with it
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        if not exited:
            with _active_sessions_lock:
                others = _active_sessions - {proc.pid}
            _kill_strays(others)  # also what the command detached (setsid) from its process group
            _reap_soon.set()
        exit_code = proc.wait()
        with _active_sessions_lock:
            _active_sessions.discard(proc.pid)
        proc.stdout.close()  # raw pipes no thread reads: closing never waits on a detached writer
        proc.stderr.close()
    return {
        "exit_code": -9 if not exited else exit_code,
        "stdout": b"".join(out).decode("utf-8", "replace"),
        "stderr": b"".join(err).decode("utf-8", "replace"),
        "timed_out": not exited,
    }


def _collect_output(proc: subprocess.Popen, timeout_s: float, limit: int) -> tuple[list, list, bool]:
    """Read the command's stdout/stderr (each capped at ``limit`` bytes; the rest is read and dropped) until it
    exits and its pipes close, or ``OUTPUT_READ_GRACE_S`` after it exits (a detached job may hold the pipes
    for ever), or until ``timeout_s``. One poll loop over raw fds and a pidfd: no reader thread can block."""
    start = time.monotonic()
    streams = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    out, err = streams[proc.stdout.fileno()], streams[proc.stderr.fileno()]
    sizes = dict.fromkeys(streams, 0)
    pidfd = os.pidfd_open(proc.pid)
    poller = select.poll()
    for fd in (*streams, pidfd):
        poller.register(fd, select.POLLIN)
    open_fds = set(streams)
    exited_at = None
    try:
        while open_fds or exited_at is None:
            now = time.monotonic()
            end = (
                start + timeout_s
                if exited_at is None
                else min(start + timeout_s, exited_at) + OUTPUT_READ_GRACE_S
            )
            if now >= end:
                break
            for fd, _ in poller.poll(max(1, int((end - now) * 1000))):
                if fd == pidfd:
                    exited_at = time.monotonic()
                    poller.unregister(pidfd)
                    try:  # its pgrp's background jobs hold the pipes too: they die now, not at the grace
                        os.killpg(proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                if sizes[fd] < limit:
                    streams[fd].append(chunk[: limit - sizes[fd]])
                sizes[fd] += len(chunk)
    finally:
        os.close(pidfd)
    return out, err, exited_at is not None


def _reap_orphans() -> None:
    """We are the sandbox's PID 1: reap the processes that commands detached, once they exit."""
    while True:
        _reap_soon.wait(0.2)
        _reap_soon.clear()
        with _spawn_lock:
            while True:
                try:
                    info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:
                    break
                if info is None:
                    break
                with _active_sessions_lock:
                    if info.si_pid in _active_sessions:
                        break  # a command's own exit: its waiting thread reaps it
                try:
                    os.waitpid(info.si_pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def _open_regular(path: str, max_bytes: int, *, follow: bool = True) -> tuple[int, os.stat_result]:
    """Open a file for the host only if it is a regular file of at most ``max_bytes``: never a FIFO (would block),
    a device (endless), a socket, or a sparse file claiming terabytes. The type is checked on the open fd
    (``O_NONBLOCK``: opening a FIFO does not wait), so swapping the file after a check changes nothing."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Refused(f"{path} is not a regular file (mode {stat.filemode(info.st_mode)})")
    if info.st_size > max_bytes:
        os.close(fd)
        raise Refused(f"{path} is {info.st_size} bytes, over the cap of {max_bytes}")
    return fd, info


def _op_read_file(req: dict) -> dict:
    path, max_bytes = _resolve(req["path"]), req["max_bytes"]
    fd, _ = _open_regular(path, max_bytes)
    chunks, total = [], 0
    try:
        while chunk := os.read(fd, 1 << 20):  # a file may grow after fstat (or be a /proc file of size 0)
            total += len(chunk)
            if total > max_bytes:
                raise Refused(f"{path} is over the cap of {max_bytes} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return {"data": base64.b64encode(b"".join(chunks)).decode()}


def _op_write_file(req: dict) -> dict:
    path = _resolve(req["path"])
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    with open(path, "wb") as f:
        f.write(base64.b64decode(req["data"]))
    return {}


def _op_put_tar(req: dict) -> dict:
    import tarfile

    target = _resolve(req["dir"])
    os.makedirs(target, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(req["data"])), mode="r:*") as tar:
        tar.extractall(target, filter="data")
    return {}


def _op_get_tar(req: dict) -> dict:
    """A tar of the file or directory at ``path``: regular files and directories only (links, FIFOs, devices
    and sockets are left out), at most ``max_bytes`` of file data and ``max_entries`` entries."""
    import tarfile

    path = _resolve(req["path"])
    max_bytes, max_entries = req["max_bytes"], req["max_entries"]
    top = os.lstat(path)
    if not (stat.S_ISREG(top.st_mode) or stat.S_ISDIR(top.st_mode) or stat.S_ISLNK(top.st_mode)):
        raise Refused(f"{path} is not a regular file or directory (mode {stat.filemode(top.st_mode)})")
    budget = {"bytes": max_bytes, "entries": max_entries}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add_tree(tar, path, os.path.basename(path.rstrip("/")) or ".", budget)
    return {"data": base64.b64encode(buffer.getvalue()).decode()}


def _add_tree(tar, path: str, arcname: str, budget: dict) -> None:
    import tarfile

    info = os.lstat(path)
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        return  # a link or a special file: never part of a download
    budget["entries"] -= 1
    if budget["entries"] < 0:
        raise Refused("the download has more entries than its cap")
    if stat.S_ISDIR(info.st_mode):
        member = tarfile.TarInfo(arcname)
        member.type, member.mode, member.mtime = tarfile.DIRTYPE, info.st_mode & 0o7777, int(info.st_mtime)
        tar.addfile(member)
        for name in sorted(os.listdir(path)):
            _add_tree(tar, os.path.join(path, name), f"{arcname}/{name}", budget)
        return
    fd, opened = _open_regular(path, budget["bytes"], follow=False)
    with os.fdopen(fd, "rb") as f:
        budget["bytes"] -= opened.st_size
        member = tarfile.TarInfo(arcname)
        member.size, member.mode, member.mtime = opened.st_size, opened.st_mode & 0o7777, int(opened.st_mtime)
        tar.addfile(member, f)  # exactly st_size bytes; a file that shrank meanwhile fails the download


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _forward(client: socket.socket) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(PROXY_SOCKET)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _forward_counted(client: socket.socket, slots: threading.BoundedSemaphore) -> None:
    try:
        _forward(client)
    finally:
        slots.release()


def _accept_loop(listener: socket.socket, slots: threading.BoundedSemaphore) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        if not slots.acquire(blocking=False):  # over the sandbox's connection cap: refused at once
            client.close()
            continue
        try:
            threading.Thread(target=_forward_counted, args=(client, slots), daemon=True).start()
        except RuntimeError:  # no task left for a thread (the sandbox's pids cap)
            client.close()
            slots.release()


def _op_proxy_listen(req: dict) -> dict:
    global _proxy_listener
    _stop_proxy()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", req["port"]))
    listener.listen(64)
    _proxy_listener = listener
    slots = threading.BoundedSemaphore(req["max_connections"])
    threading.Thread(target=_accept_loop, args=(listener, slots), daemon=True).start()
    return {}


def _stop_proxy() -> None:
    global _proxy_listener
    if _proxy_listener is not None:
        try:
            _proxy_listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        _proxy_listener.close()
        _proxy_listener = None


OPS = {
    "exec": _op_exec,
    "read_file": _op_read_file,
    "write_file": _op_write_file,
    "put_tar": _op_put_tar,
    "get_tar": _op_get_tar,
    "proxy_listen": _op_proxy_listen,
    "ping": lambda req: {},
}


def _serve(req: dict) -> None:
    try:
        reply = OPS[req["op"]](req)
    except FileNotFoundError as exc:
        reply = {"error": f"{exc.strerror}: {exc.filename}", "kind": "not_found"}
    except IsADirectoryError as exc:
        reply = {"error": f"{exc.strerror}: {exc.filename}", "kind": "is_a_directory"}
    except PermissionError as exc:
        reply = {"error": f"{exc.strerror}: {exc.filename}", "kind": "permission"}
    except Refused as exc:
        reply = {"error": str(exc), "kind": "refused"}
    except Exception as exc:  # reported to the host, which raises it as a typed error
        reply = {"error": f"{type(exc).__name__}: {exc}", "kind": "other"}
    reply["id"] = req["id"]
    _send(reply)


def main() -> None:
    # As PID 1 we only receive the signals from inside the sandbox that we handle: handle none.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    mode = _drop_privileges(int(sys.argv[1]), int(sys.argv[2]))
    threading.Thread(target=_reap_orphans, daemon=True).start()
    _send({"id": 0, "ready": True, "mode": mode, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        req = json.loads(line)
        try:
            threading.Thread(target=_serve, args=(req,), daemon=True).start()
        except RuntimeError as exc:  # the sandbox's processes hold every task its pids cap allows
            _send({"id": req["id"], "error": f"supervisor cannot start a thread: {exc}", "kind": "other"})
    # stdin closed: the host is gone or closing us. We are the PID namespace's init: it dies with us.


if __name__ == "__main__":
    main()
