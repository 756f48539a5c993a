"""Tar archives for moving directory trees into and out of sandboxes."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path


def directory_archive(source: Path) -> bytes:
    """A tar archive of ``source``'s contents (a directory), or the bytes of ``source`` if it is an archive."""
    source = Path(source)
    if source.is_file():
        return source.read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for child in sorted(source.iterdir()):
            tar.add(child, arcname=child.name)
    return buffer.getvalue()


def _regular_files_and_dirs(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo | None:
    """tarfile's ``data`` filter, keeping only regular files and directories: an archive made inside a sandbox
    is untrusted; a relative symlink that is harmless in staging could point at a host file once moved to its
    destination, and a FIFO or device node has no business on the host."""
    if not (member.isreg() or member.isdir()):
        return None
    return tarfile.data_filter(member, dest_path)


def extract_single_entry(archive: bytes, local_path: Path) -> None:
    """Unpack a one-entry tar (a file or a directory tree) to exactly ``local_path``, atomically.

    The archive may come from a sandbox: links are dropped, and absolute or escaping paths refused."""
    local_path = Path(local_path)
    local_path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".rein-download-", dir=local_path.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            tar.extractall(staging, filter=_regular_files_and_dirs)
        entries = list(staging.iterdir())
        if len(entries) != 1:
            raise FileNotFoundError(f"{local_path.name}: nothing to download (a link, or an empty archive)")
        if local_path.is_dir() and not local_path.is_symlink():
            shutil.rmtree(local_path)
        os.replace(entries[0], local_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
