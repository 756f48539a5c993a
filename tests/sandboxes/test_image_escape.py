"""The escape battery (``test_bwrap_escape.py``), re-run on image sandboxes: every attack there that works on
an ``attacker`` sandbox runs here against a sandbox whose root is the test OCI image, with an image-sandbox
bystander. The attacks are imported, not copied, so the battery stays one list."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from components.protocols import SandboxSpec
from sandboxes.image import ImageSandboxConfig, create_image_sandbox
from tests.components.tasks.swebench_fixtures import ENV_IMAGE, IMAGE_LAYOUT, require_fixtures
from tests.sandboxes import test_bwrap_escape as battery
from tests.sandboxes.sandbox_test_support import SMALL_LIMITS

CONFIG = ImageSandboxConfig(cache_dir=Path.home() / ".cache" / "rein" / "images")


async def _image_sandbox():
    require_fixtures(IMAGE_LAYOUT)
    return await create_image_sandbox(SandboxSpec(limits=SMALL_LIMITS, root_image=ENV_IMAGE), CONFIG)


@pytest.fixture(scope="module")
async def bystander():
    """An image sandbox that must stay healthy whatever the attacker does."""
    async with await _image_sandbox() as sandbox:
        await sandbox.write_file("bystander-secret.txt", "BYSTANDER-SECRET-7731")
        yield sandbox


@pytest.fixture
async def attacker(bystander):
    async with await _image_sandbox() as sandbox:
        yield sandbox
    check = await bystander.exec("cat bystander-secret.txt")
    assert check.stdout == "BYSTANDER-SECRET-7731"


# Every attack of the battery that takes the ``attacker`` fixture, collected here under the same name.
for _name, _test in inspect.getmembers(battery, inspect.iscoroutinefunction):
    if _name.startswith("test_") and "attacker" in inspect.signature(_test).parameters:
        globals()[_name] = _test


# -- images are data, not trust (issue #28.6) ---------------------------------------------------------------
# A poisoned image: the test image's root filesystem (hard-linked, so the copy is cheap) with one entry made a
# symlink pointing at a host directory that holds a secret. The host prepares the sandbox from that tree; on the
# real code nothing of the host directory reaches the sandbox (or the image is refused with ImageLayoutError),
# on the weakened variant ``host-resolution`` (paths joined onto the root and left to the host kernel, as
# before) the same image shows the secret to the agent.

HOST_SECRET = "HOST-SECRET-7f3e"


@pytest.fixture(scope="module")
def env_rootfs():
    from sandboxes.image import ImageCache

    require_fixtures(IMAGE_LAYOUT)
    return ImageCache(CONFIG.cache_dir).unpack(ENV_IMAGE)


@pytest.fixture
def host_secret_dir(tmp_path):
    secret_dir = tmp_path / "host-secrets"
    (secret_dir / "sub").mkdir(parents=True)
    (secret_dir / "sub" / "secret.txt").write_text(HOST_SECRET)
    return secret_dir


@pytest.fixture(params=["real", "host-resolution"])
def variant(request, monkeypatch):
    """``host-resolution``: the weakened variant, the host kernel resolving every image path."""
    if request.param == "host-resolution":
        import sandboxes.bwrap
        import sandboxes.image

        def on_the_host(root, path, *, follow_last=True):
            return Path(root) / path.lstrip("/")

        monkeypatch.setattr(sandboxes.image, "resolve_in_root", on_the_host)
        monkeypatch.setattr(sandboxes.bwrap, "resolve_in_root", on_the_host)
        monkeypatch.setattr(sandboxes.bwrap, "in_root_path", lambda root, path: path)
    return request.param


def _poisoned(unpacked, links: dict[str, str]):
    """A copy of ``unpacked`` (hard links, beside the cache's own) with ``links``: entry -> symlink target."""
    import dataclasses
    import shutil
    import subprocess
    import tempfile

    parent = Path(tempfile.mkdtemp(prefix="poisoned-", dir=unpacked.rootfs.parent.parent))
    rootfs = parent / "rootfs"
    subprocess.run(["cp", "-al", str(unpacked.rootfs), str(rootfs)], check=True)
    for entry, target in links.items():
        path = rootfs / entry.lstrip("/")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.symlink_to(target)
    return dataclasses.replace(unpacked, rootfs=rootfs, reference="poisoned"), parent


async def _sees(unpacked, command: str) -> str:
    from sandboxes.bwrap import BwrapSandbox
    from sandboxes.image import image_bwrap_config

    bwrap = image_bwrap_config(unpacked, base=CONFIG.bwrap)
    spec = SandboxSpec(limits=SMALL_LIMITS, root_image=unpacked.reference)
    async with await BwrapSandbox.create(spec, bwrap) as sandbox:
        result = await sandbox.exec(["/bin/sh", "-c", command])
    return result.stdout + result.stderr


async def test_an_absolute_opt_link_does_not_bind_host_directories(env_rootfs, host_secret_dir, variant):
    import shutil

    unpacked, parent = _poisoned(env_rootfs, {"/opt": str(host_secret_dir)})
    try:
        seen = await _sees(unpacked, "cat /opt/sub/secret.txt; ls /opt")
    finally:
        shutil.rmtree(parent)
    if variant == "host-resolution":
        assert HOST_SECRET in seen  # the attack lands: the host's directory is bound at /opt/sub
    else:
        assert HOST_SECRET not in seen and "rein" in seen  # /opt holds the supervisor only


async def test_a_dot_dot_link_out_of_the_image_is_refused(env_rootfs, host_secret_dir, variant):
    import shutil

    from sandboxes.rootfs_paths import ImageLayoutError

    escape = "../" * 40 + str(host_secret_dir).lstrip("/")
    unpacked, parent = _poisoned(env_rootfs, {"/opt": escape, "/testbed": escape})
    try:
        if variant == "host-resolution":
            assert HOST_SECRET in await _sees(unpacked, "cat /opt/sub/secret.txt")
            assert (unpacked.path("/testbed") / "sub" / "secret.txt").read_text() == HOST_SECRET
            return
        with pytest.raises(ImageLayoutError, match="above the image's root"):
            await _sees(unpacked, "true")
        with pytest.raises(ImageLayoutError, match="above the image's root"):
            unpacked.path("/testbed")  # what the task's repository is copied from
    finally:
        shutil.rmtree(parent)


@pytest.mark.parametrize("checked", [True, False], ids=["real", "no-git-check"])
def test_an_image_repository_whose_git_dir_points_at_a_host_repository_is_refused(
    tmp_path, monkeypatch, checked
):
    """The host runs git on its copy of the image's repository (rows with an ``eval_script`` keep history): a
    ``.git/commondir`` naming a host repository would have the host's git delete that repository's refs."""
    import subprocess

    import components.tasks.swebench as swebench
    from sandboxes.rootfs_paths import ImageLayoutError

    def git(cwd, *args):
        return subprocess.run(
            ["git", "-c", "safe.directory=*", *args], cwd=cwd, check=True, capture_output=True
        )

    host = tmp_path / "host-repo"
    host.mkdir()
    git(host, "init", "-q", "-b", "main")
    (host / "f.txt").write_text("host\n")
    git(host, "add", "f.txt")
    git(host, "-c", "user.name=h", "-c", "user.email=h@h", "commit", "-qm", "host")
    git(host, "branch", "host-only-branch")
    image_repo = tmp_path / "image-rootfs" / "testbed"
    (image_repo / ".git").mkdir(parents=True)
    (image_repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (image_repo / ".git" / "commondir").write_text(str(host / ".git") + "\n")
    (image_repo / "f.txt").write_text("host\n")
    git(image_repo, "reset", "-q")  # the index, as a checked-out repository has one
    if not checked:
        monkeypatch.setattr(swebench, "_require_self_contained_git", lambda task_id, git_dir: None)
        swebench._materialise("t", image_repo, tmp_path / "cache", keep_history=True)
        branches = subprocess.run(["git", "branch"], cwd=host, capture_output=True, text=True).stdout
        assert "host-only-branch" not in branches  # the attack lands: the host repository lost its refs
        return
    with pytest.raises(ImageLayoutError, match="points outside the image"):
        swebench._materialise("t", image_repo, tmp_path / "cache", keep_history=True)
    assert (
        "host-only-branch"
        in subprocess.run(["git", "branch"], cwd=host, capture_output=True, text=True).stdout
    )


def _weakened_host_git(monkeypatch):
    """``unsanitised-git``: the weakened variant, the host's git reading the image's config and hooks (the
    command ``_prune_to_head`` ran before: ``git -c safe.directory=*`` and nothing else)."""
    import components.tasks.swebench as swebench

    monkeypatch.setattr(swebench, "_own_git_config", lambda git_dir: None)
    monkeypatch.setattr(swebench, "UNTRUSTED_REPO_GIT_OPTIONS", ("-c", "safe.directory=*"))
    monkeypatch.setattr(swebench, "_untrusted_git_env", swebench._git_env)


@pytest.mark.parametrize("sanitised", [True, False], ids=["real", "unsanitised-git"])
def test_an_image_repository_runs_no_command_on_the_host(tmp_path, monkeypatch, sanitised):
    """The host prunes its copy of an image's repository (rows with an ``eval_script`` keep history). The image
    names commands git would run on the host - a ``post-checkout`` hook, ``core.fsmonitor``, a clean/smudge
    filter, ``core.sshCommand`` - each writing a marker on the host; on the real code none runs."""
    import os
    import subprocess

    import components.tasks.swebench as swebench

    markers = tmp_path / "host-markers"
    markers.mkdir()
    image_repo = tmp_path / "image-rootfs" / "testbed"
    image_repo.mkdir(parents=True)

    def git(*args):
        subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", *args],
                       cwd=image_repo, check=True, capture_output=True)  # fmt: skip

    git("init", "-q", "-b", "main")
    (image_repo / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("-c", "user.name=i", "-c", "user.email=i@i", "commit", "-qm", "base")
    (image_repo / ".gitattributes").write_text("* filter=evil\n")
    script = image_repo / ".git" / "evil.sh"
    script.write_text(f'#!/bin/sh\ntouch "{markers}/$1"\ncat\n')
    script.chmod(0o755)
    hook = image_repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f'#!/bin/sh\ntouch "{markers}/post-checkout"\n')
    hook.chmod(0o755)
    with (image_repo / ".git" / "config").open("a") as config:
        config.write(
            f"[core]\n\tfsmonitor = {script} fsmonitor\n\tsshCommand = {script} ssh\n"
            f'[filter "evil"]\n\tclean = {script} clean\n\tsmudge = {script} smudge\n'
        )
    os.utime(image_repo / "code.py", (0, 0))  # stat-dirty: git re-reads the file through its filter
    if not sanitised:
        _weakened_host_git(monkeypatch)
    snapshot = swebench._materialise("t", image_repo, tmp_path / "cache", keep_history=True)
    ran = sorted(path.name for path in markers.iterdir())
    if not sanitised:
        assert {"post-checkout", "fsmonitor", "clean"} <= set(
            ran
        )  # the attack lands: the image ran code on the host
        return
    assert ran == []
    assert (snapshot.workspace_dir / "code.py").read_text() == "x = 1\n"
    assert "evil" not in (snapshot.workspace_dir / ".git" / "config").read_text()
