"""Files made durable: directory fsyncs and atomic replacement of small files.

A file's own ``fsync`` does not make its name durable: creating, renaming or deleting a
file changes its directory, which needs an ``fsync`` of its own. Every place that must
survive a crash with a file's name intact goes through here.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (files created, renamed or deleted) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, durably: after a crash it holds either the old bytes
    or the new ones, never a part of either."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def rename_durably(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` and make the rename durable."""
    os.replace(src, dst)
    fsync_dir(dst.parent)
