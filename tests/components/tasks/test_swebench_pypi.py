"""Building instances from PyPI releases: an sdist is data, not trust."""

from __future__ import annotations

import re
import tarfile

import pytest

import components.tasks.swebench_pypi as swebench_pypi


def _sdist(tmp_path, version: str, code: str, marker=None) -> object:
    """A release's sdist; with ``marker`` its top folder ships a ``.git`` with a ``post-commit`` hook."""
    root = tmp_path / f"src-{version}" / f"pkg-{version}"
    root.mkdir(parents=True)
    if marker is not None:
        (root / ".git" / "hooks").mkdir(parents=True)
        hook = root / ".git" / "hooks" / "post-commit"
        hook.write_text(f'#!/bin/sh\ntouch "{marker}"\n')
        hook.chmod(0o755)
    (root / "pkg.py").write_text(code)
    archive = tmp_path / f"pkg-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname=root.name)
    return archive


@pytest.mark.parametrize("filtered", [True, False], ids=["real", "git-dir-kept"])
def test_an_sdist_git_directory_runs_no_hook_on_the_host(tmp_path, monkeypatch, filtered):
    """``release_diff`` commits the old release on the host; a ``.git/hooks`` shipped in the sdist would run
    there. The weakened variant ``git-dir-kept`` (the noise filter before ``.git`` was added) runs the hook."""
    if not filtered:
        monkeypatch.setattr(
            swebench_pypi,
            "_NOISE",
            re.compile(r"(^|/)(PKG-INFO|[^/]+\.egg-info(/.*)?|\.gitignore|setup\.cfg|MANIFEST\.in)$"),
        )
    marker = tmp_path / "host-marker"
    old = swebench_pypi.extract_sdist(_sdist(tmp_path, "1.0", "x = 1\n", marker), tmp_path / "old")
    new = swebench_pypi.extract_sdist(_sdist(tmp_path, "1.1", "x = 2\n"), tmp_path / "new")
    patch, _ = swebench_pypi.release_diff(old, new)
    assert "+x = 2" in patch
    assert marker.exists() is not filtered  # the weakened variant: the sdist's hook ran on the host
    assert (old / ".git").exists() is not filtered
