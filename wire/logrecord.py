"""The on-disk log record format and the segment scanner.

A record is a 24-byte header followed by a msgpack body::

    magic u32 | body_len u32 | crc32 u32 | kind u8 | 3 bytes zero | lsn u64     (little endian)

The CRC covers the header bytes after the crc field (kind, padding, lsn) and the body,
so a record moved to the wrong place or given the wrong LSN fails its check too.

Bodies, by kind (msgpack arrays, fields in this order):

    PRODUCE        [producer_id, seq, timestamp_ms, [[topic_id, partition, first_offset, count, blob], ...]]
    TOPIC_CREATE   [topic_id, name, partitions]
    TOPIC_DELETE   [topic_id, name]
    OFFSET_COMMIT  [group, topic_id, partition, offset]

``blob`` is the packed records array exactly as the client sent it (see ``wire.records``).

At each checkpoint the log manager also writes a snapshot (its state as of an LSN: the
catalog, every shard's next offset, the producers' recent sequence numbers) before it
deletes old segments, so recovery never needs a deleted record. Snapshots go to two slots,
``checkpoint-0.snap`` and ``checkpoint-1.snap``, overwritten in place by turns: a write cut
short by a crash spoils only the slot being written, and recovery takes the valid slot with
the higher LSN. (``checkpoint.snap``, from before the slots, is still read.)

Scanning tells a torn tail from corruption: a bad record with nothing valid after it is a
write cut short by a crash (cut it off); a bad record followed by a valid one is damage in
the middle of the log, and the node must not start on it.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

MAGIC = 0x53484E31  # "SHN1"
HEADER = struct.Struct("<IIIB3xQ")
HEADER_BYTES = HEADER.size  # 24
_MAGIC_BYTES = struct.pack("<I", MAGIC)
BODY_BYTES_MAX = 256 * 1024 * 1024  # a sanity bound for scanning; real bodies are far smaller
SEGMENT_SUFFIX = ".log"


class Kind(enum.IntEnum):
    PRODUCE = 1
    TOPIC_CREATE = 2
    TOPIC_DELETE = 3
    OFFSET_COMMIT = 4


class CorruptLog(Exception):
    """A damaged record with valid records after it: the node refuses to start on this."""

    def __init__(self, segment: Path, position: int, reason: str) -> None:
        super().__init__(
            f"log segment {segment} is corrupt at byte {position}: {reason}; valid records "
            f"follow, so this is not a torn tail. Restore the segment or move it aside."
        )
        self.segment = segment
        self.position = position


def encode(lsn: int, kind: Kind, body: Any) -> bytes:
    """One record, header and body. ``body`` is packed with msgpack."""
    payload = msgpack.packb(body, use_bin_type=True)
    return encode_packed(lsn, kind, payload)


def encode_packed(lsn: int, kind: int, payload: bytes) -> bytes:
    tail = struct.pack("<B3xQ", kind, lsn)
    crc = zlib.crc32(payload, zlib.crc32(tail))
    return HEADER.pack(MAGIC, len(payload), crc, kind, lsn) + payload


@dataclass(frozen=True, slots=True)
class Entry:
    """One record read back: where it starts, its LSN, kind and packed body."""

    position: int
    lsn: int
    kind: int
    payload: bytes

    @property
    def end(self) -> int:
        return self.position + HEADER_BYTES + len(self.payload)

    def body(self) -> Any:
        return msgpack.unpackb(self.payload, raw=False, strict_map_key=False)


def _check_at(buf: bytes | memoryview, pos: int, verify: bool) -> tuple[Entry | None, str]:
    """The record at ``pos``, or None and why it is not one."""
    if len(buf) - pos < HEADER_BYTES:
        return None, "incomplete header"
    magic, length, crc, kind, lsn = HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        return None, "bad magic"
    if length > BODY_BYTES_MAX:
        return None, f"body length {length} is over {BODY_BYTES_MAX}"
    start = pos + HEADER_BYTES
    if len(buf) - start < length:
        return None, "incomplete body"
    payload = bytes(buf[start:start + length])
    if verify:
        tail = bytes(buf[pos + 12:pos + HEADER_BYTES])
        if zlib.crc32(payload, zlib.crc32(tail)) != crc:
            return None, "checksum mismatch"
    return Entry(pos, lsn, kind, payload), ""


def iter_buffer(buf: bytes | memoryview, verify: bool = False) -> Iterator[Entry]:
    """Records of a buffer known to be whole (a group just written); raises on damage."""
    pos = 0
    end = len(buf)
    while pos < end:
        entry, why = _check_at(buf, pos, verify)
        if entry is None:
            raise ValueError(f"bad record at byte {pos} of a group: {why}")
        yield entry
        pos = entry.end


READ_CHUNK_BYTES = 4 * 1024 * 1024


def read_entries(path: Path, last: bool,
                 chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[list[Entry]]:
    """The records of a segment file, a chunk at a time (lists of about ``chunk_bytes``),
    so that reading a 64 MiB segment needs a few MiB, not twice its size.

    Stops at the first record that is not whole: in the last segment that is the tail
    still being written (or torn by a crash); anywhere else it raises ``CorruptLog``.
    """
    with open(path, "rb") as f:
        buf = b""
        offset = 0  # of buf[0] in the file
        while True:
            data = f.read(chunk_bytes)
            buf = buf + data if buf else data
            pos = 0
            batch: list[Entry] = []
            why = ""
            while pos < len(buf):
                entry, why = _check_at(buf, pos, verify=True)
                if entry is None:
                    break
                pos = entry.end
                # _check_at places records in ``buf``; past the first chunk, in the file.
                batch.append(Entry(offset + entry.position, entry.lsn, entry.kind, entry.payload)
                             if offset else entry)
            if batch:
                yield batch
            whole = pos == len(buf)
            if not data or (not whole and not why.startswith("incomplete")):
                if not whole and not last:
                    raise CorruptLog(path, offset + pos, f"record cannot be read: {why}")
                return
            buf, offset = buf[pos:], offset + pos


def _valid_record_after(buf: bytes, pos: int, prev_lsn: int) -> int | None:
    """Position of the first record after ``pos`` that checks out and continues the LSNs
    (above ``prev_lsn``), if any. A valid-looking record with an older LSN is not evidence
    of damage: it can be a client's value that happens to hold log bytes."""
    at = buf.find(_MAGIC_BYTES, pos + 1)
    while at != -1:
        entry, _ = _check_at(buf, at, verify=True)
        if entry is not None and entry.lsn > prev_lsn:
            return at
        at = buf.find(_MAGIC_BYTES, at + 1)
    return None


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """What scanning a segment found: its records and where the valid part ends."""

    path: Path
    entries: list[Entry]
    valid_bytes: int
    file_bytes: int

    @property
    def torn_bytes(self) -> int:
        return self.file_bytes - self.valid_bytes


def scan_bytes(path: Path, buf: bytes, last: bool) -> SegmentScan:
    """Check every record of a segment's bytes.

    A bad record with nothing valid after it ends the segment (a torn tail), which only the
    last segment may have; anything else raises ``CorruptLog``.
    """
    entries: list[Entry] = []
    pos = 0
    prev_lsn = 0
    while pos < len(buf):
        entry, why = _check_at(buf, pos, verify=True)
        if entry is None:
            after = _valid_record_after(buf, pos, prev_lsn)
            if after is not None:
                raise CorruptLog(path, pos, f"{why}, and a valid record follows at byte {after}")
            if not last:
                raise CorruptLog(path, pos, f"{why} in a segment that is not the last one")
            break
        if entry.lsn <= prev_lsn:
            raise CorruptLog(path, pos, f"LSN {entry.lsn} does not follow {prev_lsn}")
        prev_lsn = entry.lsn
        entries.append(entry)
        pos = entry.end
    return SegmentScan(path, entries, pos, len(buf))


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


# ---- the log manager's state snapshot, written at each checkpoint ------------------------

SNAPSHOT_MAGIC = 0x53484E53  # "SHNS"
SNAPSHOT_HEADER = struct.Struct("<III")  # magic, body length, crc32 of the body
SNAPSHOT_SLOTS = ("checkpoint-0.snap", "checkpoint-1.snap")
SNAPSHOT_NAME_BEFORE_SLOTS = "checkpoint.snap"


def encode_snapshot(state: dict[str, Any]) -> bytes:
    """Header and msgpack body. The body is packed a piece at a time (one producer's window
    per piece), so a thread packing a big snapshot lets others run between pieces."""
    packer = msgpack.Packer(use_bin_type=True)
    pieces = [packer.pack_map_header(len(state))]
    for key, value in state.items():
        pieces.append(packer.pack(key))
        if type(value) is list and len(value) > 64:
            pieces.append(packer.pack_array_header(len(value)))
            pieces.extend(packer.pack(item) for item in value)
        else:
            pieces.append(packer.pack(value))
    body = b"".join(pieces)
    return SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, len(body), zlib.crc32(body)) + body


def decode_snapshot(path: Path, data: bytes) -> Any:
    """The snapshot's state; raises ``CorruptLog`` if it does not check out. Bytes after
    the body (a slot's file is longer than the snapshot it holds) are ignored."""
    if len(data) < SNAPSHOT_HEADER.size:
        raise CorruptLog(path, 0, "snapshot is shorter than its header")
    magic, length, crc = SNAPSHOT_HEADER.unpack_from(data)
    body = data[SNAPSHOT_HEADER.size:SNAPSHOT_HEADER.size + length]
    if magic != SNAPSHOT_MAGIC or length != len(body) or zlib.crc32(body) != crc:
        raise CorruptLog(path, 0, "snapshot fails its magic, length or checksum")
    return msgpack.unpackb(body, raw=False, strict_map_key=False)


def load_snapshot(log_dir: Path) -> tuple[dict[str, Any] | None, int]:
    """The newest valid snapshot of a log directory (None if there is none) and the slot it
    is in (-1 for none or the file from before slots). A slot that fails its check is a
    write cut short and is passed over; if every snapshot present fails, the log cannot be
    trusted and ``CorruptLog`` is raised."""
    best: dict[str, Any] | None = None
    best_slot = -1
    failed: CorruptLog | None = None
    names = [(slot, name) for slot, name in enumerate(SNAPSHOT_SLOTS)]
    names.append((-1, SNAPSHOT_NAME_BEFORE_SLOTS))
    for slot, name in names:
        path = log_dir / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        try:
            snap = decode_snapshot(path, data)
        except CorruptLog as exc:
            failed = exc
            continue
        if best is None or snap["last_lsn"] > best["last_lsn"]:
            best, best_slot = snap, slot
    if best is None and failed is not None:
        raise failed
    return best, best_slot
