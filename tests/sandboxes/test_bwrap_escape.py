"""The escape battery: everything an agent might try from inside a bwrap sandbox fails safely, while the host
and a bystander sandbox keep working throughout."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.bwrap import BwrapSandbox
from tests.sandboxes.sandbox_test_support import HOST_PYTHON, SMALL_LIMITS, processes_of_uid

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
async def bystander():
    """A second sandbox that must stay healthy whatever the attacker does."""
    async with await BwrapSandbox.create(SandboxSpec(limits=SMALL_LIMITS)) as sandbox:
        await sandbox.write_file("bystander-secret.txt", "BYSTANDER-SECRET-7731")
        yield sandbox


@pytest.fixture
async def attacker(bystander):
    async with await BwrapSandbox.create(SandboxSpec(limits=SMALL_LIMITS)) as sandbox:
        yield sandbox
    # After every attack: the bystander still works and still has its file, and the host still forks.
    check = await bystander.exec("cat bystander-secret.txt")
    assert check.stdout == "BYSTANDER-SECRET-7731"
    proc = await asyncio.create_subprocess_exec("true")
    assert await proc.wait() == 0


async def python_in(sandbox, code: str, **kwargs):
    return await sandbox.exec([HOST_PYTHON, "-c", code], **kwargs)


async def test_cannot_read_shadow_repo_or_root(attacker):
    assert Path("/etc/shadow").exists() and (REPO_ROOT / "pyproject.toml").exists()
    shadow = await attacker.exec("cat /etc/shadow")
    assert shadow.exit_code != 0 and "root:" not in shadow.stdout
    repo = await attacker.exec(f"ls {REPO_ROOT}; cat {REPO_ROOT}/pyproject.toml; ls /root /work /home")
    assert "rein-rl" not in repo.stdout and "pyproject.toml" not in repo.stdout
    assert repo.exit_code != 0


async def test_cannot_see_another_sandboxs_workspace(attacker, bystander):
    found = await attacker.exec(
        "grep -rs BYSTANDER-SECRET /workspace /tmp /home /run /opt /proc/*/root/workspace 2>/dev/null; "
        "cat /workspace/bystander-secret.txt"
    )
    assert "BYSTANDER-SECRET" not in found.stdout
    # Nor through the host filesystem: the bystander's workspace has no host path at all.
    assert await bystander.read_file("bystander-secret.txt") == b"BYSTANDER-SECRET-7731"


async def test_cannot_write_outside_the_workspace(attacker):
    targets = [
        "/etc/evil",
        "/usr/evil",
        "/evil",
        "/root/evil",
        "/run/rein/evil",
        "/opt/rein/evil",
        "/proc/evil",
    ]
    script = "; ".join(f"touch {target} 2>/dev/null && echo WROTE {target}" for target in targets)
    result = await attacker.exec(script)
    assert "WROTE" not in result.stdout
    assert not any(Path(target).exists() for target in ("/etc/evil", "/usr/evil", "/evil", "/root/evil"))
    inside = await attacker.exec("touch /workspace/ok /tmp/ok $HOME/ok && echo fine")
    assert inside.stdout == "fine\n"


async def test_symlink_planted_in_workspace_does_not_leak_host_files(attacker, tmp_path):
    await attacker.exec("ln -s /etc/shadow leak; ln -s / rootlink")
    with pytest.raises((FileNotFoundError, PermissionError)):
        data = await attacker.read_file("leak")
        assert b"root:" not in data  # the sandbox's own /etc/shadow is masked; never the host's
        raise FileNotFoundError
    await attacker.write_file("rootlink/tmp/through-link", "x")  # lands in the sandbox's /tmp, not the host's
    assert not Path("/tmp/through-link").exists()


async def test_only_the_proxy_port_is_reachable(tcp_banner_server):
    proxy_port = await tcp_banner_server(b"PROXY-OK")
    other_port = await tcp_banner_server(b"SECRET-SERVICE")
    spec = SandboxSpec(limits=SMALL_LIMITS, proxy_url=f"http://127.0.0.1:{proxy_port}")
    async with await BwrapSandbox.create(spec) as sandbox:
        code = (
            "import socket, sys\n"
            "def banner(port):\n"
            "    try:\n"
            "        s = socket.create_connection(('127.0.0.1', port), timeout=3)\n"
            "        return s.recv(100).decode()\n"
            "    except OSError as e:\n"
            "        return 'ERR ' + type(e).__name__\n"
            f"print(banner({proxy_port})); print(banner({other_port}))\n"
        )
        result = await python_in(sandbox, code)
        proxy_line, other_line = result.stdout.splitlines()
        assert proxy_line == "PROXY-OK"
        assert other_line.startswith("ERR") and "SECRET" not in result.stdout
        # Many connections in parallel through the path (an agent streaming several requests).
        many = await sandbox.exec(
            f'for i in $(seq 1 20); do {HOST_PYTHON} -c "import socket; '
            f"print(socket.create_connection(('127.0.0.1', {proxy_port})).recv(8).decode())\" & done; wait"
        )
        assert many.stdout.count("PROXY-OK") == 20


async def test_no_dns_and_no_other_address(attacker):
    code = (
        "import socket\n"
        "try:\n    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
        "except OSError as e: print('noresolve')\n"
        "for host in ('1.1.1.1', '8.8.8.8', '192.0.2.2', '10.0.0.1'):\n"
        "    try:\n        socket.create_connection((host, 53), timeout=2); print('REACHED', host)\n"
        "    except OSError: print('unreachable', host)\n"
        "print(sorted(n for _, n in socket.if_nameindex()))\n"
    )
    result = await python_in(attacker, code)
    assert "RESOLVED" not in result.stdout and "REACHED" not in result.stdout
    assert result.stdout.count("unreachable") == 4
    assert result.stdout.strip().endswith("['lo']")


async def test_cannot_see_host_processes(attacker):
    result = await attacker.exec("ps -eo pid,comm --no-headers")
    commands = {line.split()[1] for line in result.stdout.splitlines()}
    # bwrap's init, the supervisor (python3.11), this shell and ps: nothing of the host.
    assert commands <= {"bwrap", "python3.11", "sh", "ps"}, commands
    assert len(result.stdout.splitlines()) <= 5
    assert str(os.getpid()) not in (await attacker.exec("ls /proc")).stdout.split()


async def test_fork_bomb_fails_safely(attacker, bystander):
    async def others_meanwhile():
        await asyncio.sleep(1.0)  # the bomb is at its process limit by now
        host = await asyncio.create_subprocess_exec("true")
        return await bystander.exec("echo fine"), await host.wait()

    start = time.monotonic()
    bomb, (bystander_result, host_code) = await asyncio.gather(
        attacker.exec("bomb() { bomb | bomb & }; bomb; sleep 60", timeout_s=3), others_meanwhile()
    )
    assert bomb.timed_out and time.monotonic() - start < 15
    assert bystander_result.stdout == "fine\n" and host_code == 0
    # The bound is the sandbox's own process limit, not the timeout.
    counted = await python_in(
        attacker,
        "import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n            time.sleep(3); os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)\n",
        timeout_s=10,
    )
    assert "stopped" in counted.stdout, counted
    assert int(counted.stdout.split()[1]) <= SMALL_LIMITS.max_processes
    assert (await attacker.exec("echo recovered")).stdout == "recovered\n"
    assert attacker.mode in ("userns", "uid")  # a per-sandbox unprivileged host uid bounds the bomb


async def test_memory_limit(attacker):
    ten_times = 10 * SMALL_LIMITS.memory_mb * 1024 * 1024
    result = await python_in(attacker, f"b = bytearray({ten_times}); print('ALLOCATED')")
    assert result.exit_code != 0 and "ALLOCATED" not in result.stdout
    assert "MemoryError" in result.stderr
    shm = await attacker.exec("head -c 64M /dev/zero > /dev/shm/fill; echo rc=$?")
    assert "No space left" in shm.stderr


async def test_disk_limit(attacker):
    limit_mb = SMALL_LIMITS.workspace_mb
    for where in ("/workspace/big", "/tmp/big", "$HOME/big"):
        result = await attacker.exec(f"head -c {2 * limit_mb}M /dev/zero > {where}; du -m {where}")
        assert "No space left" in result.stderr
        assert int(result.stdout.split()[0]) <= limit_mb
        await attacker.exec(f"rm -f {where}")
    assert (await attacker.exec("echo writable-again > w.txt && cat w.txt")).stdout == "writable-again\n"


async def test_run_past_timeout_kills_the_whole_tree(attacker):
    start = time.monotonic()
    result = await attacker.exec(
        "sleep 300 & setsid sleep 301 & (sleep 302 &) ; echo started; sleep 303", timeout_s=1
    )
    assert result.timed_out and result.stdout == "started\n"
    assert time.monotonic() - start < 6
    left = await attacker.exec("ps -eo comm,args --no-headers | grep -c '[s]leep 30' || true")
    assert left.stdout.strip() == "0"
    deadline = time.monotonic() + 2
    while len(processes_of_uid(attacker.host_uid)) > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # killed processes are zombies until the supervisor reaps them
    assert len(processes_of_uid(attacker.host_uid)) == 1  # only the supervisor is left


async def test_cpu_time_limit():
    # 1 s of CPU can take many seconds of wall time on a loaded host (the sandbox's cgroup gets one share):
    # what proves the rlimit is that the loop ends, killed, long before the 60 s wall-clock timeout.
    spec = SandboxSpec(limits=SandboxLimits(cpu_time_s=1, command_timeout_s=60, workspace_mb=16))
    async with await BwrapSandbox.create(spec) as sandbox:
        start = time.monotonic()
        result = await sandbox.exec("while :; do :; done")
        assert not result.timed_out and result.exit_code != 0  # SIGXCPU/SIGKILL from RLIMIT_CPU
        assert time.monotonic() - start < 40


async def test_download_never_follows_or_plants_links(attacker, tmp_path):
    (tmp_path / "host-secret.txt").write_text("HOST-SECRET")
    await attacker.exec(
        "mkdir -p out && echo real > out/real.txt && ln -s ../host-secret.txt out/sneaky && "
        "ln -s /etc/shadow out/abs && ln -s ../host-secret.txt lone-link"
    )
    await attacker.download("out", tmp_path / "out")
    assert (tmp_path / "out" / "real.txt").read_text() == "real\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["real.txt"]  # links dropped
    with pytest.raises(FileNotFoundError):
        await attacker.download("lone-link", tmp_path / "lone")
    assert not (tmp_path / "lone").exists()


async def test_commands_cannot_tamper_with_the_supervisor(attacker):
    result = await attacker.exec(
        "pid=$(pgrep -o -u $(id -u) -f 'supervisor.py'); echo fds=$(ls /proc/$pid/fd 2>/dev/null | wc -l); "
        "echo '{}' > /proc/$pid/fd/0 && echo WROTE; head -c 1 /proc/$pid/mem && echo READ"
    )
    assert "fds=0" in result.stdout.split()  # not even the list of its pipes
    assert not {"WROTE", "READ"} & set(result.stdout.split())
    assert (await attacker.exec("echo intact")).stdout == "intact\n"
