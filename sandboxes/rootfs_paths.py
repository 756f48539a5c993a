"""Paths inside an unpacked image, resolved the way the sandbox sees them, never through the host (issue #28.6).

An image is data, not trust: its root filesystem may hold symlinks such as ``/opt -> /root`` or
``/testbed -> ../../../../home``. The host touches such paths while it prepares a sandbox (listing ``/opt``,
binding ``/usr``, ``/opt/conda``, copying ``/testbed``); a plain ``rootfs / path`` lets the host kernel follow
those links to the host's own files, which bubblewrap (as root) would then bind into the sandbox.

``resolve_in_root`` walks the path one component at a time with ``lstat``/``readlink``, with the semantics of
openat2's ``RESOLVE_IN_ROOT``: an absolute link target starts again at the image's root, a relative one from
the link's directory. Where a walk would step above the root (``..`` past ``/``) the layout is refused with
``ImageLayoutError``, as is a link chain longer than the kernel's 40. The result is a host path under the root
with no symlink left in it (except the last component with ``follow_last=False``).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from components.errors import SandboxError

MAX_SYMLINKS = 40  # the kernel's own bound (ELOOP)


class ImageLayoutError(SandboxError):
    """An image whose layout would lead a host-side path out of its root filesystem; the image is refused."""


def _components(path: str) -> list[str]:
    return [part for part in PurePosixPath(path).parts if part not in ("/", ".")]


def resolve_in_root(root: Path | str, path: str, *, follow_last: bool = True) -> Path:
    """``path`` (as the sandbox names it) → the host path under ``root`` it stands for, symlinks resolved
    inside ``root``; ``ImageLayoutError`` if resolving it would leave ``root``."""
    root = Path(root)
    pending = _components(path)
    resolved: list[str] = []
    num_links = 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            if not resolved:
                raise ImageLayoutError(
                    f"image path {path!r} leads above the image's root filesystem ({root})"
                )
            resolved.pop()
            continue
        candidate = root.joinpath(*resolved, name)
        if candidate.is_symlink() and (pending or follow_last):  # lstat: the link itself, never its target
            num_links += 1
            if num_links > MAX_SYMLINKS:
                raise ImageLayoutError(f"image path {path!r}: more than {MAX_SYMLINKS} symlinks (a loop?)")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []  # an absolute target means the image's root, never the host's
            pending = _components(target) + pending
            continue
        resolved.append(name)
    return root.joinpath(*resolved)


def in_root_path(root: Path | str, path: str) -> str:
    """``path`` normalised to the absolute path, inside the image, that it resolves to (``/bin`` → ``/usr/bin``)."""
    resolved = resolve_in_root(root, path)
    return "/" + str(resolved.relative_to(root)) if resolved != Path(root) else "/"
