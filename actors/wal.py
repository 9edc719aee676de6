"""The write-ahead log on disk: segments, snapshot slots, scanning and recovery.

``<log dir>/<first LSN>.log`` segments hold records (``wire/logrecord.py`` is their byte
format), appended by one ``SegmentWriter`` and rolled at a size limit and at checkpoints.
The live segment is written in place: zeros are written ahead of its records (up to
``ZERO_AHEAD_BYTES`` at a time), so that a group commit's fdatasync makes its data durable
without the file's size and block map; a segment is cut back to its records when the next
one starts, so only the last segment ever ends in zeros.
Next to them, two snapshot slots, ``checkpoint-0.snap`` and ``checkpoint-1.snap``, hold the
log manager's state as of an LSN; a checkpoint overwrites them in place by turns, then
deletes the segments below it, so recovery never needs a deleted record.

Segments are read by one scanner, ``SegmentScan``, a chunk at a time: recovery and a shard
writer's catch-up hold about a chunk (``SCAN_CHUNK_BYTES``) plus one record, whatever the
segment's size. It tells a torn tail from corruption: a bad record with nothing valid after
it in the last segment is a write cut short by a crash (recovery cuts it off; a writer
reading the live tail stops there, the rest is not written yet); a bad record followed by a
valid one, or any bad record in a segment that is not the last, is damage, and the node
must not start on it. Zeros after the last segment's records are not a torn tail: they were
written ahead.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors import faults
from actors.durable import fsync_dir
from wire import formats, logrecord
from wire.logrecord import (
    BODY_BYTES_MAX,
    CRC_FROM,
    HEADER,
    HEADER_BYTES,
    INCOMPLETE_BODY,
    INCOMPLETE_HEADER,
    MAGIC,
    MAGIC_BYTES,
    SEGMENT_HEADER_BYTES,
    Entry,
    decode_at,
    encode_segment_header,
    segment_header,
)

if TYPE_CHECKING:
    from actors.log_state import LogState

log = logging.getLogger("shardnode")

SEGMENT_SUFFIX = ".log"
SNAPSHOT_SLOTS = ("checkpoint-0.snap", "checkpoint-1.snap")
SNAPSHOT_GROW_BYTES = 64 * 1024
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
# The live segment is extended with zeros this far ahead of its records at a time, by a
# group commit smaller than ``ZERO_AHEAD_WRITE_BYTES_MAX``. Its fdatasync then writes the
# records only: appending grew the file at every group commit, and each fdatasync wrote the
# file's size and block map as well, in a second device round trip (measured here: 190-330 µs
# and 50-110 µs of CPU a group commit of 11 KB in place, against 270-1 400 µs and 100-450 µs
# appending; docs/BENCHMARKS.md, "Session 16"). One fdatasync in ``ZERO_AHEAD_BYTES`` of
# log still writes them.
ZERO_AHEAD_BYTES = 4 * 1024 * 1024
# A group this large or larger grows the file by itself: zeros written ahead of it would
# double the bytes a log of large groups writes, and its one metadata write is shared by
# many bytes.
ZERO_AHEAD_WRITE_BYTES_MAX = 1024 * 1024
ZERO_CHUNK_BYTES = 1024 * 1024  # zeros are written from one buffer of this size
# A group of records this large is written with writev, its records as they are; a smaller
# one is joined first (a writev of many small pieces costs more than their copy).
WRITEV_BYTES_MIN = 256 * 1024
# Pieces one writev takes: the system's IOV_MAX, at most 1024 (sysconf says -1 where the
# limit is indeterminate; 1024 is Linux's).
_IOV_MAX = os.sysconf("SC_IOV_MAX")
IOV_PIECES_MAX = 1024 if _IOV_MAX < 0 else max(1, min(1024, _IOV_MAX))
_INCOMPLETE = (INCOMPLETE_HEADER, INCOMPLETE_BODY)


class CorruptLog(Exception):
    """A damaged record with valid records after it: the node refuses to start on this."""

    def __init__(self, segment: Path, position: int, reason: str) -> None:
        super().__init__(
            f"log segment {segment} is corrupt at byte {position}: {reason}; valid records "
            f"follow, so this is not a torn tail. Restore the segment or move it aside."
        )
        self.segment = segment
        self.position = position


class LogStartMissing(CorruptLog):
    """The log's first segment starts after what the snapshot holds: the records between
    are gone (older segments, or the snapshot files, deleted). Not a damaged record, so
    not one to move aside."""

    def __init__(self, segment: Path, first_lsn: int, snapshot_lsn: int | None) -> None:
        held = (f"the snapshot ends at LSN {snapshot_lsn}" if snapshot_lsn is not None
                else "there is no snapshot (checkpoint-*.snap)")
        Exception.__init__(
            self, f"the log's first segment {segment} starts at LSN {first_lsn}, and {held}: "
                  f"the records before it are missing (older segments or the snapshot files "
                  f"were deleted). Put them back, or restore the data dir from a backup or a "
                  f"snapshot export (shardnode start --from-snapshot).")
        self.segment = segment
        self.position = 0


class CorruptSnapshot(CorruptLog):
    """Every snapshot present fails its check. Recovery rebuilds the state from the
    segments when they still hold the log from its first LSN (the first snapshot's write
    was cut short); otherwise the records before the segments are held by a snapshot only,
    and the node refuses to start on this (``needed``)."""

    def __init__(self, path: Path, reason: str, needed: bool = False,
                 log_starts: int | None = None) -> None:
        if not needed:
            text = f"snapshot {path} fails its check: {reason}"
        else:
            where = ("no log segment is left" if log_starts is None else
                     f"the log's segments start at LSN {log_starts}")
            text = (f"snapshot {path} is corrupt ({reason}) and no other snapshot is valid; "
                    f"{where}, so the records before them are held by a snapshot only. It "
                    f"cannot be rebuilt here: restore the data directory from a backup, or "
                    f"start a node from a snapshot export (shardnode start --from-snapshot)")
        Exception.__init__(self, text)
        self.segment = path
        self.position = 0
        self.reason = reason


class SnapshotRefused(Exception):
    """A snapshot that checks out but that this node cannot restore (written in another
    format): the node refuses to start on it rather than crash on it at every restart."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"snapshot {path} cannot be restored: {reason}; it was written by "
                         f"another version of shardnode, and no conversion exists")
        self.path = path


# ---- segments of a directory ------------------------------------------------------------


def segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}{SEGMENT_SUFFIX}"


def list_segments(log_dir: Path) -> list[tuple[int, Path]]:
    """Segments of a log directory as (first LSN, path), oldest first."""
    found = []
    for p in log_dir.glob(f"*{SEGMENT_SUFFIX}"):
        stem = p.name[: -len(SEGMENT_SUFFIX)]
        if stem.isdigit():
            found.append((int(stem), p))
    found.sort()
    return found


def zeros_at_end(path: Path, floor: int = 0, chunk_bytes: int = SCAN_CHUNK_BYTES,
                 size: int | None = None) -> int:
    """How many zero bytes end the file ``path`` (or its first ``size`` bytes; none below
    byte ``floor`` counted), read from the end back a chunk at a time: the zeros a live
    segment was written ahead with."""
    with open(path, "rb", buffering=0) as f:
        end = size = os.fstat(f.fileno()).st_size if size is None else size
        while end > floor:
            start = max(floor, end - chunk_bytes)
            kept = len(os.pread(f.fileno(), end - start, start).rstrip(b"\0"))
            if kept:
                return size - start - kept
            end = start
    return size - floor


def segments_bytes(log_dir: Path) -> int:
    """Bytes in a log directory's segments. A checkpoint may delete a segment between the
    listing and its stat, so one that has gone counts as empty (the caller may be another
    process watching a live node)."""
    total = 0
    for _first, p in list_segments(log_dir):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            continue
    return total


def delete_segments_upto(log_dir: Path, upto: int) -> int:
    """Delete the segments whose every record has LSN ≤ ``upto`` (never the newest one).

    No directory fsync: a deletion that a crash undoes brings back a segment whose records
    are all in the durable snapshot and every shard, which recovery and the writers skip,
    and the next checkpoint deletes it again."""
    segments = list_segments(log_dir)
    deleted = 0
    for (_first, path), (next_first, _next) in itertools.pairwise(segments):
        if next_first - 1 <= upto:
            path.unlink()
            deleted += 1
    return deleted


class SegmentWriter:
    """Appends to the newest segment of a log directory, rolling at a size limit."""

    def __init__(self, log_dir: Path, segment_bytes_max: int) -> None:
        self.log_dir = log_dir
        self.segment_bytes_max = segment_bytes_max
        self.fd = -1
        self.size = 0  # where the next record goes: the end of the records
        self.zeroed = 0  # the file's size: from ``size`` to here it holds zeros written ahead
        self.start = 0  # where the current segment's records start (after its header)
        self.path: Path | None = None
        self._zeros = b""  # ZERO_CHUNK_BYTES of them, once some are written

    def open_existing(self, path: Path, size: int) -> None:
        """Append to ``path`` from byte ``size`` (its valid length, as recovery found it and
        cut it to). An empty segment, or one of an older format with no record, is given
        this node's header; after one of an older format with records, the next append
        starts a new segment (a segment holds records of its header's format only)."""
        version: int | None = 1
        start = 0
        if size > 0:
            with open(path, "rb") as f:
                version, start = segment_header(f.read(SEGMENT_HEADER_BYTES))
        if version != formats.LOG_SEGMENT.current and size > start:
            return  # left closed: ``append`` rolls
        self.fd = os.open(path, os.O_WRONLY)
        self.path = path
        self.size = size
        self.zeroed = os.fstat(self.fd).st_size
        if self.zeroed != size:  # not cut to its records: what follows them is not known zeros
            os.ftruncate(self.fd, size)
            self.zeroed = size
        if version != formats.LOG_SEGMENT.current:  # no record: empty, or an older header
            os.ftruncate(self.fd, 0)
            self.zeroed = 0
            self._write_header()
        else:
            self.start = start

    def _write_header(self) -> None:
        """The segment's header, written before its first record; the fdatasync of that
        record's group makes both durable (a crash before it leaves a segment that is
        empty or holds part of a header, which recovery cuts back to empty)."""
        header = encode_segment_header(formats.LOG_SEGMENT.current)
        _write_all(self.fd, header, 0)
        self.size = self.start = len(header)
        self.zeroed = max(self.zeroed, self.size)

    def roll(self, first_lsn: int) -> None:
        """Start the segment whose first record will have ``first_lsn``."""
        if self.fd >= 0 and self.size == self.start:
            return  # the current segment is still empty: keep it
        if self.fd >= 0:
            self._cut_zeros()
            os.close(self.fd)
        self.path = self.log_dir / segment_name(first_lsn)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.zeroed = 0
        self._write_header()
        fsync_dir(self.log_dir)

    def _cut_zeros(self) -> None:
        """Cut the segment back to its records, durably, before another one starts: only the
        last segment may end in zeros (a scan takes a bad record in any other for damage)."""
        if self.zeroed > self.size:
            os.ftruncate(self.fd, self.size)
            os.fsync(self.fd)
            self.zeroed = self.size

    def _zero_ahead(self, end: int) -> None:
        """Write zeros from the file's end to ``ZERO_AHEAD_BYTES`` past ``end`` (rounded),
        not past the segment's size limit; the next fdatasync makes them durable."""
        target = max(end, min(-(-(end + 1) // ZERO_AHEAD_BYTES) * ZERO_AHEAD_BYTES,
                              self.segment_bytes_max))
        if not self._zeros:
            self._zeros = bytes(ZERO_CHUNK_BYTES)
        was = self.zeroed
        try:
            while self.zeroed < target:
                n = min(target - self.zeroed, ZERO_CHUNK_BYTES)
                _write_all(self.fd, memoryview(self._zeros)[:n], self.zeroed)
                self.zeroed += n
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # A disk too full for zeros ahead may still hold the group: written as it is.
            os.ftruncate(self.fd, was)
            self.zeroed = was

    @property
    def ahead_bytes(self) -> int:
        """The zeros written ahead of the records (counted in the segments' sizes)."""
        return self.zeroed - self.size

    def append(self, data: bytes | Sequence[bytes], first_lsn: int) -> None:
        """Write ``data`` (bytes, or records to write one after the other) and fdatasync it.
        Raises OSError, which the caller treats as fatal."""
        pieces = [data] if isinstance(data, bytes) else data
        size = sum(map(len, pieces))
        if self.fd < 0 or (self.size > self.start
                           and self.size + size > self.segment_bytes_max):
            self.roll(first_lsn)
        end = self.size + size
        if end > self.zeroed and size < ZERO_AHEAD_WRITE_BYTES_MAX:
            self._zero_ahead(end)
        write_pieces(self.fd, pieces, size, self.size)
        if faults.fails("log.fsync", self.log_dir.parent):
            raise OSError(errno.EIO, "injected fsync failure")
        os.fdatasync(self.fd)
        self.size = end
        self.zeroed = max(self.zeroed, end)

    def close(self) -> None:
        """Close the segment, cut back to its records (a node stopped cleanly leaves no
        zeros; after a crash, recovery cuts them)."""
        if self.fd >= 0:
            try:
                self._cut_zeros()
            except OSError as exc:  # recovery cuts them at the next start
                log.warning("could not cut the zeros off %s: %s", self.path, exc)
            os.close(self.fd)
            self.fd = -1


def write_pieces(fd: int, pieces: Sequence[bytes], size: int, offset: int) -> None:
    """Write ``pieces`` (``size`` bytes in all) one after the other from byte ``offset``.
    Many small ones are joined and written at once; larger ones go to ``pwritev`` as they
    are, up to ``IOV_PIECES_MAX`` a call, rather than copied into one buffer first (a group
    of requests of 0.5 MB each under the Spark sink)."""
    if len(pieces) == 1 or size < WRITEV_BYTES_MIN:
        _write_all(fd, pieces[0] if len(pieces) == 1 else b"".join(pieces), offset)
        return
    todo: list[bytes | memoryview] = list(pieces)
    while todo:
        n = os.pwritev(fd, todo[:IOV_PIECES_MAX], offset)
        offset += n
        done = 0
        while done < len(todo) and n >= len(todo[done]):  # the pieces written whole
            n -= len(todo[done])
            done += 1
        del todo[:done]
        if n:  # one written in part: its rest first
            todo[0] = memoryview(todo[0])[n:]


# ---- snapshot slots ---------------------------------------------------------------------


def write_snapshot(log_dir: Path, slot: int, data: bytes) -> None:
    """Overwrite snapshot slot ``slot`` in place with ``data`` and make it durable.

    A slot's file only grows, in steps of ``SNAPSHOT_GROW_BYTES`` filled with zeros, so most
    writes change no metadata and the fdatasync costs no journal commit; no rename and no
    directory fsync either, which on ext4 would contend with the log's own fdatasyncs. The
    other slot keeps the previous snapshot until this one is durable."""
    path = log_dir / SNAPSHOT_SLOTS[slot]
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        need = -(-len(data) // SNAPSHOT_GROW_BYTES) * SNAPSHOT_GROW_BYTES
        if size < need:
            _write_all(fd, bytes(need - size), size)
        # A kill here leaves a new slot's file zeros: the first snapshot has no other slot.
        faults.crash_point("checkpoint.snapshot_created", log_dir.parent)
        _write_all(fd, data, 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(log_dir)


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def load_snapshot(log_dir: Path) -> tuple[dict[str, Any] | None, int | None]:
    """The newest valid snapshot of a log directory and the slot it is in (None, None if
    there is none). A slot that fails its check is a write cut short and is passed over;
    if every snapshot present fails, ``CorruptSnapshot`` is raised (``recover`` decides
    whether the log can do without it). A snapshot of a format this node does not read
    raises ``FormatRefused``."""
    best, best_slot, failed = read_snapshots(log_dir)
    if best is None and failed is not None:
        raise failed
    return best, best_slot


def read_snapshots(log_dir: Path
                   ) -> tuple[dict[str, Any] | None, int | None, CorruptSnapshot | None]:
    """The newest valid snapshot, its slot, and the last slot that failed its check."""
    best: dict[str, Any] | None = None
    best_slot: int | None = None
    failed: CorruptSnapshot | None = None
    for slot, name in enumerate(SNAPSHOT_SLOTS):
        path = log_dir / name
        try:
            data = path.read_bytes()  # a snapshot is read whole: it is the state itself
        except FileNotFoundError:
            continue
        try:
            snap = logrecord.decode_snapshot(data)
        except ValueError as exc:
            failed = CorruptSnapshot(path, str(exc))
            continue
        form = snap.get("format") if isinstance(snap, dict) else None
        if not isinstance(form, int) or form > formats.SNAPSHOT.current:
            # A newer shardnode wrote it: its LSN may be the newest, so it is never passed over.
            formats.SNAPSHOT.check(path, form)
        if best is None or snap["last_lsn"] > best["last_lsn"]:
            best, best_slot = snap, slot
    if best is not None:
        assert best_slot is not None
        formats.SNAPSHOT.check(log_dir / SNAPSHOT_SLOTS[best_slot], best.get("format"))
    return best, best_slot, failed


# ---- reading segments -------------------------------------------------------------------


class SegmentScan:
    """One pass over a segment's records, a chunk at a time.

    Iterate it for the records, a list per chunk read (about ``chunk_bytes`` of them); it
    holds about one chunk, plus a record longer than a chunk while it is handed on, which
    is checked a chunk at a time before it is read whole. It raises ``CorruptLog`` on
    damage: LSNs that do not increase, a bad record with a valid one (of a higher LSN) after
    it anywhere in the segment, or any bad record when the segment is not the ``last``.
    A bad record with nothing valid after it in the last segment ends the scan: a torn tail
    after a crash, zeros written ahead, or, while the log manager runs, the tail it has not
    finished writing. Then ``valid_bytes`` is where the valid records end and ``file_bytes``
    the file's size.
    """

    def __init__(self, path: Path, last: bool, chunk_bytes: int = SCAN_CHUNK_BYTES) -> None:
        assert chunk_bytes > 0
        self.path = path
        self.last = last
        self.chunk_bytes = max(chunk_bytes, HEADER_BYTES)  # a chunk holds at least a header
        self.valid_bytes = 0
        self.file_bytes = 0

    @property
    def torn_bytes(self) -> int:
        """The bytes after the records up to the zeros written ahead, if any: what a crash
        cut short (read from the file's end back, when asked)."""
        if self.file_bytes <= self.valid_bytes:
            return 0
        zeros = zeros_at_end(self.path, self.valid_bytes, self.chunk_bytes, self.file_bytes)
        return self.file_bytes - zeros - self.valid_bytes

    def __iter__(self) -> Iterator[list[Entry]]:
        with open(self.path, "rb", buffering=0) as f:
            yield from self._scan(f.fileno())

    def _scan(self, fd: int) -> Iterator[list[Entry]]:
        chunk = self.chunk_bytes
        prev_lsn = 0
        base = 0  # where ``buf`` starts in the file
        buf = os.pread(fd, chunk, 0)
        version, pos = segment_header(buf[:SEGMENT_HEADER_BYTES])  # records from ``buf[pos]``
        if version is None:  # the start of a header: the segment's creation was cut short
            if not self.last:
                raise CorruptLog(self.path, 0, "a header cut short in a segment that is not "
                                 "the last one")
            self.valid_bytes = 0
            self.file_bytes = os.fstat(fd).st_size
            return
        formats.LOG_SEGMENT.check(self.path, version)
        while True:
            batch: list[Entry] = []
            while True:
                entry, why = decode_at(buf, pos, True, base)
                if entry is None:
                    break
                if entry.lsn <= prev_lsn:
                    raise CorruptLog(self.path, entry.position,
                                     f"LSN {entry.lsn} does not follow {prev_lsn}")
                prev_lsn = entry.lsn
                batch.append(entry)
                pos = entry.end - base
            if batch:
                yield batch
            at = base + pos
            if why in _INCOMPLETE:  # the buffer ends inside the record: read on
                rest = len(buf) - pos
                need = HEADER_BYTES
                if rest >= HEADER_BYTES:
                    need += HEADER.unpack_from(buf, pos)[1]
                if need > chunk:  # longer than a chunk: checked where it lies, then read
                    entry, why = self._record_at(fd, at)
                    if entry is not None:
                        if entry.lsn <= prev_lsn:
                            raise CorruptLog(self.path, at,
                                             f"LSN {entry.lsn} does not follow {prev_lsn}")
                        prev_lsn = entry.lsn
                        yield [entry]
                        base, buf, pos = entry.end, os.pread(fd, chunk, entry.end), 0
                        continue
                else:
                    more = os.pread(fd, chunk - rest, base + len(buf))
                    if more:
                        buf, base, pos = buf[pos:] + more, at, 0
                        continue
                    if rest == 0:  # the end of the file, at a record boundary
                        self.valid_bytes = self.file_bytes = at
                        return
            self._bad_record(fd, at, why, prev_lsn)
            return

    def _bad_record(self, fd: int, at: int, why: str, prev_lsn: int) -> None:
        """The record at ``at`` does not check out: end the scan there if it is a torn
        tail, raise ``CorruptLog`` if it is damage."""
        after = self._valid_record_after(fd, at, prev_lsn)
        if after is not None:
            if self._record_at(fd, at)[0] is not None:
                # Whole now: the log manager was writing it while this scan read the live
                # tail (in order, so what follows it became readable after it). What
                # follows is read next time.
                self.valid_bytes = self.file_bytes = at
                return
            raise CorruptLog(self.path, at, f"{why}, and a valid record follows at byte {after}")
        if not self.last:
            raise CorruptLog(self.path, at, f"{why} in a segment that is not the last one")
        self.valid_bytes = at
        self.file_bytes = os.fstat(fd).st_size

    def _valid_record_after(self, fd: int, at: int, prev_lsn: int) -> int | None:
        """Where the first record after ``at`` starts that checks out and continues the LSNs
        (above ``prev_lsn``), if any; the rest of the file is searched a chunk at a time.
        A valid-looking record with an older LSN is not evidence of damage: it can be a
        client's value that happens to hold log bytes."""
        window = max(self.chunk_bytes, 2 * HEADER_BYTES)
        off = at + 1
        while True:
            buf = os.pread(fd, window, off)
            i = buf.find(MAGIC_BYTES)
            while i != -1:
                entry, why = decode_at(buf, i, True, off)
                if why in _INCOMPLETE:  # runs past this window: check it in the file
                    entry, why = self._record_at(fd, off + i)
                if entry is not None and entry.lsn > prev_lsn:
                    return off + i
                i = buf.find(MAGIC_BYTES, i + 1)
            if len(buf) < window:
                return None  # the end of the file
            off += len(buf) - (len(MAGIC_BYTES) - 1)  # a magic cut by the window's end

    def _record_at(self, fd: int, at: int) -> tuple[Entry | None, str]:
        """The record at byte ``at`` of the file, read where it lies. Its checksum is
        computed a chunk at a time before its body is read whole, so that a damaged length
        field cannot make a scan hold most of a segment."""
        head = os.pread(fd, HEADER_BYTES, at)
        if len(head) < HEADER_BYTES:
            return None, INCOMPLETE_HEADER
        magic, length, crc, kind, lsn = HEADER.unpack(head)
        if magic != MAGIC:
            return None, "bad magic"
        if length > BODY_BYTES_MAX:
            return None, f"body length {length} is over {BODY_BYTES_MAX}"
        start = at + HEADER_BYTES
        if start + length > os.fstat(fd).st_size:
            return None, INCOMPLETE_BODY
        running = zlib.crc32(head[CRC_FROM:])
        off, end = start, start + length
        while off < end:
            piece = os.pread(fd, min(self.chunk_bytes, end - off), off)
            if not piece:
                return None, INCOMPLETE_BODY
            running = zlib.crc32(piece, running)
            off += len(piece)
        if running != crc:
            return None, "checksum mismatch"
        payload = os.pread(fd, length, start)
        # Checked again on the bytes handed on (assert in pairs around the disk).
        if len(payload) != length or zlib.crc32(payload, zlib.crc32(head[CRC_FROM:])) != crc:
            return None, "checksum mismatch"
        return Entry(at, lsn, kind, payload), ""


# ---- recovery ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recovered:
    replayed_bytes: int
    torn_bytes: int
    last_segment: Path | None
    last_segment_bytes: int  # its valid length, where appends continue
    snapshot_slot: int | None  # the slot of the snapshot loaded (None: there was none)


def recover(log_dir: Path, state: LogState, chunk_bytes: int = SCAN_CHUNK_BYTES) -> Recovered:
    """Load the newest snapshot, replay every later record into ``state``, cut a torn tail.

    Reads each segment a chunk at a time (``SegmentScan``). Raises ``CorruptLog`` when
    damage is followed by valid records or LSNs skip, ``CorruptSnapshot`` when no snapshot
    is valid and the segments do not start at the first LSN, ``FormatRefused`` when the snapshot
    or a segment is of a format this node does not read (``wire/formats.py``), and
    ``SnapshotRefused`` when a snapshot of a format it reads cannot be restored.
    """
    segments = list_segments(log_dir)
    snap, slot, failed = read_snapshots(log_dir)
    if snap is not None:
        assert slot is not None
        try:
            state.restore(snap)
        except ValueError as exc:
            raise SnapshotRefused(log_dir / SNAPSHOT_SLOTS[slot], str(exc)) from None
    # Records missing before the segments: held only by a snapshot that failed its check,
    # or lost.
    if segments:
        missing = segments[0][0] > state.last_lsn + 1
    else:
        missing = snap is None and failed is not None
    if missing and failed is not None:
        raise CorruptSnapshot(failed.segment, failed.reason, needed=True,
                              log_starts=segments[0][0] if segments else None)
    if missing:
        raise LogStartMissing(segments[0][1], segments[0][0],
                              state.last_lsn if snap is not None else None)
    if failed is not None and snap is None:
        # The segments hold the log from its first LSN: the first snapshot's write was cut
        # short (a kill between its file's creation and its fdatasync), and nothing was
        # truncated yet, since that waits for the snapshot.
        log.warning("%s; the log's segments hold it from its first LSN, so the state is "
                    "rebuilt from them, and the next checkpoint writes the snapshot again",
                    failed)
    replayed = 0
    torn = 0
    last_path: Path | None = None
    last_size = 0
    for i, (_first_lsn, path) in enumerate(segments):
        is_last = i == len(segments) - 1
        scan = SegmentScan(path, is_last, chunk_bytes)
        for batch in scan:
            for entry in batch:
                if entry.lsn <= state.last_lsn:
                    continue  # in the snapshot already
                if entry.lsn != state.last_lsn + 1:
                    raise CorruptLog(path, entry.position, f"LSN {entry.lsn} follows "
                                     f"{state.last_lsn}: records are missing")
                state.replay(entry)
                replayed += HEADER_BYTES + len(entry.payload)
        if is_last:
            last_path, last_size = path, scan.valid_bytes
            if scan.file_bytes > scan.valid_bytes:  # a torn tail, or zeros written ahead
                torn = scan.torn_bytes
                if torn:
                    log.warning("cutting a torn tail of %d bytes off %s at byte %d",
                                torn, path.name, scan.valid_bytes)
                with open(path, "r+b") as f:
                    f.truncate(scan.valid_bytes)
                    os.fsync(f.fileno())
    return Recovered(replayed, torn, last_path, last_size, slot)
