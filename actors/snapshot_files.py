"""A snapshot export's files: the directory, the log manager's part of it, the manifest,
and the start of a node from it (``shardnode start --from-snapshot``).

An export directory is laid out as a data dir is, so that a node starts from a copy of it
by its ordinary recovery:

    shards/t<id>-p<n>/     a RocksDB checkpoint of each shard (the shard writers take them)
    log/checkpoint-0.snap  the log manager's state as of the export's LSN L
    log/<first LSN>.log    the segments holding the LSNs the shards still need, up to L,
                           and an empty one from L + 1, where the new node appends
    MANIFEST.json          written last: format, L, shards, every file and its size

A directory without a manifest is an export cut short; one whose files do not match its
manifest is damaged; a manifest of a newer format was written by a newer shardnode. Each
is refused with a message saying so (``ExportRefused``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from actors import faults
from actors.durable import fsync_dir
from actors.truncator import ThreadJob
from actors.wal import SNAPSHOT_SLOTS, list_segments, segment_name, write_snapshot
from wire import formats, logrecord

MANIFEST = "MANIFEST.json"
COPY_CHUNK_BYTES = 1024 * 1024
HOLD_POLL_S = 0.02  # the seam export.hold_copy: how often it looks for its release file
RELEASE_SUFFIX = ".release"  # export.hold_copy
RELEASE_SHARDS_SUFFIX = ".release-shards"  # export.hold_shards
HOLD_SHARDS_S = 60.0  # export.hold_shards waits at most this long


class ExportRefused(Exception):
    """A directory that is not a whole export this node can start from, or a data dir it
    must not start into; the message says which and why."""


def export_dir_problem(directory: str, data_dir: Path) -> str:
    """Why ``directory`` cannot take an export of the node whose data dir is ``data_dir``,
    or "" (it is then created, with its ``shards`` directory)."""
    path = Path(directory)
    if not path.is_absolute():
        return f"the export directory {directory!r} must be an absolute path"
    # A path the system refuses (a NUL byte: ValueError; a name over 255 bytes:
    # ENAMETOOLONG) raises from resolve and exists too, not only from mkdir.
    try:
        resolved, data = path.resolve(), data_dir.resolve()
        if resolved == data or data in resolved.parents or resolved in data.parents:
            return (f"the export directory {directory} must lie outside the node's data dir "
                    f"{data} (and not contain it)")
        if path.exists():
            if not path.is_dir():
                return f"the export directory {directory} exists and is not a directory"
            if any(path.iterdir()):
                return (f"the export directory {directory} exists and is not empty: export "
                        f"into a new or empty directory")
        (path / "shards").mkdir(parents=True, exist_ok=True)
        fsync_dir(path)
        fsync_dir(path.parent)
    except (OSError, ValueError) as exc:
        return f"cannot create the export directory {directory!r}: {exc}"
    return ""


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- the log manager's part, on a thread ------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class CopyResult:
    export_id: int
    lsn: int
    bytes: int
    error: str


class ExportCopier(ThreadJob[CopyResult]):
    """The log manager's part of an export, on a thread of its own (as the checkpoint's
    ``Truncator``): write its state snapshot, copy the segments, fsync everything, write
    the manifest; then wake the actor's loop through an inproc socket. One job at a time."""

    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        super().__init__(zctx, "export")

    def start(self, export_id: int, directory: Path, lsn: int, snapshot: dict[str, Any],
              segments: list[Path], node_id: int, deadline: float) -> None:
        self._start(self._run, export_id, directory, lsn, snapshot, segments, node_id,
                    deadline)

    def _run(self, export_id: int, directory: Path, lsn: int, snapshot: dict[str, Any],
             segments: list[Path], node_id: int, deadline: float) -> CopyResult:
        size, error = 0, ""
        try:
            size = write_export(directory, lsn, snapshot, segments, node_id, deadline)
        except (OSError, TimeoutError) as exc:
            error = f"writing the log and manifest into {directory} failed: {exc}"
        return CopyResult(export_id, lsn, size, error)


def write_export(directory: Path, lsn: int, snapshot: dict[str, Any], segments: list[Path],
                 node_id: int, deadline: float) -> int:
    """The export's log (the snapshot at ``lsn``, the ``segments`` copied) and its manifest,
    written last, after every file and directory under ``directory`` is fsynced. Returns
    the bytes written here (the shards' checkpoints are the writers'). Raises
    ``TimeoutError`` past ``deadline`` (monotonic)."""
    if faults.armed("export.hold_copy"):
        hold(directory, RELEASE_SUFFIX, deadline)
    log_dir = directory / "log"
    log_dir.mkdir(exist_ok=True)
    write_snapshot(log_dir, 0, logrecord.encode_snapshot(snapshot))
    size = (log_dir / SNAPSHOT_SLOTS[0]).stat().st_size
    for src in segments:
        if time.monotonic() > deadline:
            raise TimeoutError("the export took longer than log.snapshot_timeout_ms")
        size += copy_file(src, log_dir / src.name)
    # The segment the new node appends to, from L + 1: it tells its shard writers where
    # the log starts when no segment was needed (every shard had everything up to L).
    header = logrecord.encode_segment_header(formats.LOG_SEGMENT.current)
    with open(log_dir / segment_name(lsn + 1), "xb") as f:
        f.write(header)
        f.flush()
        os.fsync(f.fileno())
    size += len(header)
    files = []
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            files.append([str(path.relative_to(directory)), path.stat().st_size])
    for path in sorted((p for p in directory.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(path)
    shards = sorted(p.name for p in (directory / "shards").iterdir() if p.is_dir())
    manifest = {"format": formats.EXPORT.current, "lsn": lsn, "node_id": node_id,
                "created_ms": int(time.time() * 1000), "shards": shards, "files": files}
    tmp = directory / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)
    fsync_dir(directory)
    return size


def hold(directory: Path, suffix: str, deadline: float,
         progress: Callable[[], None] | None = None) -> None:
    """The test seams ``export.hold_copy`` and ``export.hold_shards``: wait until the file
    ``<directory><suffix>`` exists (a test's signal), or the deadline passes."""
    release = directory.with_name(directory.name + suffix)
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test seam was not released ({release}) in time")
        if progress is not None:
            progress()
        time.sleep(HOLD_POLL_S)


def copy_file(src: Path, dst: Path) -> int:
    """Copy ``src`` to a new file ``dst`` and fsync it; returns its bytes."""
    size = 0
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while chunk := fin.read(COPY_CHUNK_BYTES):
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return size


def export_segments(log_dir: Path, floor: int, lsn: int, live: Path | None) -> list[Path]:
    """The segments an export at ``lsn`` needs: those holding any LSN in ``floor`` + 1 ..
    ``lsn``, the live segment (rolled past ``lsn``: it holds none of them) left out."""
    segments = list_segments(log_dir)
    needed = []
    for i, (first, path) in enumerate(segments):
        if path == live or first > lsn:
            continue
        last = segments[i + 1][0] - 1 if i + 1 < len(segments) else lsn
        if last > floor:
            needed.append(path)
    return needed


# ---- starting a node from an export ------------------------------------------------------


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a whole export; ``ExportRefused`` if it is missing, damaged, of a
    format this node does not read, or its files do not match it."""
    if not directory.is_dir():
        raise ExportRefused(f"the snapshot {directory} does not exist or is not a directory")
    path = directory / MANIFEST
    if not path.exists():
        raise ExportRefused(f"the snapshot {directory} has no {MANIFEST}: it is not a "
                            f"snapshot export, or one cut short (the manifest is written "
                            f"last); export again")
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except (ValueError, OSError) as exc:
        raise ExportRefused(f"the manifest {path} cannot be read: {exc}") from None
    try:
        formats.EXPORT.check(path, manifest.get("format"))
    except formats.FormatRefused as exc:
        raise ExportRefused(str(exc)) from None
    try:
        files = [(str(name), int(size)) for name, size in manifest["files"]]
        int(manifest["lsn"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportRefused(f"the manifest {path} is damaged: {exc!r}") from None
    for name, size in files:
        f = directory / name
        if not f.is_file():
            raise ExportRefused(f"the snapshot {directory} is incomplete: {name}, listed in "
                                f"its manifest, is missing")
        if f.stat().st_size != size:
            raise ExportRefused(f"the snapshot {directory} is damaged: {name} has "
                                f"{f.stat().st_size} bytes, its manifest says {size}")
    return manifest


def start_from_export(directory: Path, data_dir: Path) -> dict[str, Any]:
    """Fill the new data dir ``data_dir`` (absent or empty) from the export at
    ``directory``: the shards' SST files hard-linked when both are on one file system
    (RocksDB never changes an SST file), everything else copied (the log is appended to,
    the snapshot slots overwritten, RocksDB's MANIFEST appended). Returns the manifest."""
    manifest = read_manifest(directory)
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise ExportRefused(f"the data dir {data_dir} exists and is not empty: a node starts "
                            f"from a snapshot only into a new or empty data dir")
    data_dir.mkdir(parents=True, exist_ok=True)
    dirs: set[Path] = {data_dir}
    try:
        for name, _size in manifest["files"]:
            src, dst = directory / name, data_dir / name
            if dst.parent not in dirs:
                dst.parent.mkdir(parents=True, exist_ok=True)
                dirs.update([dst.parent, *dst.parent.parents])
            if dst.suffix == ".sst":
                try:
                    os.link(src, dst)
                    continue
                except OSError:
                    pass  # another file system: copy it
            copy_file(src, dst)
        for d in sorted((d for d in dirs if d == data_dir or data_dir in d.parents),
                        key=lambda d: len(d.parts), reverse=True):
            fsync_dir(d)
    except OSError as exc:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise ExportRefused(f"copying the snapshot {directory} into {data_dir} failed: "
                            f"{exc}") from None
    return manifest
