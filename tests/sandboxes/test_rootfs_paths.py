"""``resolve_in_root``: an image's paths resolved inside its root filesystem, never through the host."""

from __future__ import annotations

import pytest

from sandboxes.rootfs_paths import ImageLayoutError, in_root_path, resolve_in_root


def test_links_resolve_inside_the_root(tmp_path):
    root = tmp_path / "rootfs"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")  # relative, as Debian ships it
    (root / "usr" / "local").symlink_to("/usr/bin")  # absolute: the image's /usr/bin, not the host's
    (root / "etc").symlink_to(tmp_path)  # absolute, naming a host directory: stays inside the root
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("../usr")
    assert resolve_in_root(root, "/bin") == root / "usr" / "bin"
    assert resolve_in_root(root, "/usr/local/x") == root / "usr" / "bin" / "x"
    assert resolve_in_root(root, "/etc/passwd") == root / str(tmp_path).lstrip("/") / "passwd"
    assert resolve_in_root(root, "/var/run/bin") == root / "usr" / "bin"
    assert resolve_in_root(root, "/bin", follow_last=False) == root / "bin"
    assert in_root_path(root, "/bin") == "/usr/bin" and in_root_path(root, "/") == "/"


def test_escapes_and_loops_are_refused(tmp_path):
    root = tmp_path / "rootfs"
    (root / "usr").mkdir(parents=True)
    (root / "opt").symlink_to("../../..")
    (root / "usr" / "up").symlink_to("../../x")
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    for path in ("/opt", "/opt/etc", "/usr/up", "/.."):
        with pytest.raises(ImageLayoutError, match="above the image's root"):
            resolve_in_root(root, path)
    with pytest.raises(ImageLayoutError, match="symlinks"):
        resolve_in_root(root, "/a")
