"""The process that runs inside every bubblewrap sandbox and executes the host's requests.

Started by ``sandboxes.bwrap`` as ``python -I -S supervisor.py UID`` (the host's own interpreter, bound
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
import signal
import socket
import subprocess
import sys
import threading
import time

WORKSPACE = "/workspace"
INNER_UID = 1000
PROXY_SOCKET = "/run/rein/proxy.sock"
PRLIMIT = "/usr/bin/prlimit"
OUTPUT_READ_GRACE_S = 1.0

_write_lock = threading.Lock()
_active_sessions_lock = threading.Lock()
_active_sessions: set[int] = set()  # == the pids of running commands (each leads its own session)
# Held while a command is spawned and registered, so the orphan reaper never reaps a command's own exit status.
_spawn_lock = threading.Lock()
_reap_soon = threading.Event()  # set after killing processes, so their zombies go at once
_proxy_listener: socket.socket | None = None


def _send(message: dict) -> None:
    line = (json.dumps(message) + "\n").encode()
    with _write_lock:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()


def _drop_privileges(host_uid: int) -> str:
    """Become ``host_uid`` for good, then uid 1000 in a user namespace of our own. Returns the mode."""
    if os.geteuid() != 0:  # bwrap itself ran unprivileged with --unshare-user: already confined
        return "unprivileged"
    for path in (WORKSPACE, "/tmp", "/home/sandbox", "/dev/shm"):
        os.chown(path, host_uid, host_uid)
        os.chmod(path, 0o1777 if path in ("/tmp", "/dev/shm") else 0o755)
    os.setgroups([])
    os.setresgid(host_uid, host_uid, host_uid)
    os.setresuid(host_uid, host_uid, host_uid)
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
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


def _read_stream(stream, chunks: list, limit: int) -> None:
    total = 0
    try:
        while True:
            chunk = stream.read1(65536)
            if not chunk:
                return
            if total < limit:
                chunks.append(chunk[: limit - total])
            total += len(chunk)
    except (OSError, ValueError):
        return


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
    argv = [
        PRLIMIT,
        f"--cpu={limits['cpu_time_s']}",
        f"--as={limits['memory_mb'] * 1024 * 1024}",
        f"--nproc={limits['max_processes']}",
        "--",
        *argv,
    ]
    max_output = req["max_output_bytes"]
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
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [
        threading.Thread(target=_read_stream, args=(proc.stdout, out, max_output), daemon=True),
        threading.Thread(target=_read_stream, args=(proc.stderr, err, max_output), daemon=True),
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        exit_code = proc.wait(timeout=req["timeout_s"])
    except subprocess.TimeoutExpired:
        timed_out = True
    try:  # background jobs of the command die with it
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    if timed_out:
        with _active_sessions_lock:
            others = _active_sessions - {proc.pid}
        _kill_strays(others)  # also what the command detached (setsid) from its process group
        exit_code = proc.wait()
        _reap_soon.set()
    with _active_sessions_lock:
        _active_sessions.discard(proc.pid)
    deadline = time.monotonic() + OUTPUT_READ_GRACE_S
    for reader in readers:
        reader.join(max(0.0, deadline - time.monotonic()))
    proc.stdout.close()
    proc.stderr.close()
    return {
        "exit_code": -9 if timed_out else exit_code,
        "stdout": b"".join(out).decode("utf-8", "replace"),
        "stderr": b"".join(err).decode("utf-8", "replace"),
        "timed_out": timed_out,
    }


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


def _op_read_file(req: dict) -> dict:
    with open(_resolve(req["path"]), "rb") as f:
        return {"data": base64.b64encode(f.read()).decode()}


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
    import tarfile

    path = _resolve(req["path"])
    if not os.path.lexists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(path, arcname=os.path.basename(path.rstrip("/")) or ".")
    return {"data": base64.b64encode(buffer.getvalue()).decode()}


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


def _accept_loop(listener: socket.socket) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_forward, args=(client,), daemon=True).start()


def _op_proxy_listen(req: dict) -> dict:
    global _proxy_listener
    _stop_proxy()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", req["port"]))
    listener.listen(64)
    _proxy_listener = listener
    threading.Thread(target=_accept_loop, args=(listener,), daemon=True).start()
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


def _clear_dir(path: str) -> None:
    import shutil

    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            try:
                os.unlink(full)
            except OSError:
                pass


def _op_reset(req: dict) -> dict:
    _stop_proxy()
    _kill_strays(set())
    _reap_soon.set()
    for path in (WORKSPACE, "/tmp", "/home/sandbox", "/dev/shm"):
        _clear_dir(path)
    return {}


OPS = {
    "exec": _op_exec,
    "read_file": _op_read_file,
    "write_file": _op_write_file,
    "put_tar": _op_put_tar,
    "get_tar": _op_get_tar,
    "proxy_listen": _op_proxy_listen,
    "reset": _op_reset,
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
    except Exception as exc:  # reported to the host, which raises it as a typed error
        reply = {"error": f"{type(exc).__name__}: {exc}", "kind": "other"}
    reply["id"] = req["id"]
    _send(reply)


def main() -> None:
    # As PID 1 we only receive the signals from inside the sandbox that we handle: handle none.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    mode = _drop_privileges(int(sys.argv[1]))
    threading.Thread(target=_reap_orphans, daemon=True).start()
    _send({"id": 0, "ready": True, "mode": mode, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        req = json.loads(line)
        threading.Thread(target=_serve, args=(req,), daemon=True).start()
    # stdin closed: the host is gone or closing us. We are the PID namespace's init: it dies with us.


if __name__ == "__main__":
    main()
