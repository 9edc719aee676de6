"""The on-disk log record format, and the byte format of the log manager's snapshot.

A record is a 24-byte header followed by a msgpack body::

    magic u32 | body_len u32 | crc32 u32 | kind u8 | 3 bytes zero | lsn u64     (little endian)

The CRC covers the header bytes after the crc field (kind, padding, lsn) and the body,
so a record moved to the wrong place or given the wrong LSN fails its check too.

Bodies, by kind (msgpack arrays, fields in this order):

    PRODUCE        [producer_id, seq, timestamp_ms, [[topic_id, partition, first_offset, count, blob], ...]]
    TOPIC_CREATE   [topic_id, name, partitions, owners, settings]   owners: the owning member's
                   id of each partition in a cluster, [] on a single node (and absent before
                   clusters); settings: a map of those not at their defaults
                   (``wire.protocol.TOPIC_SETTINGS``; absent when there are none)
    TOPIC_DELETE   [topic_id, name]
    OFFSET_COMMIT  [group, topic_id, partition, offset]
    TOPIC_ALTER    [topic_id, name, settings]   the topic's settings from now on, whole
    DELETE         [topic_id, partition, offset, key]   a record deleted: the one at ``offset``,
                   or (offset -1) the latest with ``key`` (the one read_by_key answers)

Transactions (Qpid CLFS's transaction records; ``actors/txn_ledger.py`` writes and reads them):

    TX_START       [txn]                                      a local transaction began
    DTX_START      [txn, format_id, global_id, branch_id]     an XA branch began (its xid)
    TXN_WRITE      [txn, timestamp_ms, [[topic_id, partition, count, blob], ...],
                    [[group, topic_id, partition, offset], ...]]
                   records and consumer offsets staged in it: no offsets yet, invisible
    PREPARE        [txn]                                      phase one of two: durable, in doubt
    COMMIT         [txn, [[topic_id, partition, first_offset, count], ...],
                    [[group, topic_id, partition, offset], ...]]
                   the staged records take these offsets and become visible, with the offsets
    ROLLBACK       [txn, [[topic_id, partition], ...], reason]
                   the staged records are dropped; ``reason`` (format 3 on) is why:
                   ``wire.messages.ROLLBACK_REASONS``

``blob`` is the packed records array exactly as the client sent it (see ``wire.records``).

A segment (format 2 on; ``wire/formats.py``) starts with an 8-byte header, then its records::

    segment magic u32 ("SHNL") | format version u32      (little endian)

Format 1 segments have no header: they start with their first record (or are empty).

A snapshot (the log manager's state as of an LSN, written at each checkpoint) is a 12-byte
header (magic, body length, CRC-32 of the body) and a msgpack map.

This module only encodes and decodes bytes. Files — segments, their scanning, snapshot
slots, recovery — are ``actors/wal.py``.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from wire.packer import pack, pieces

MAGIC = 0x53484E31  # "SHN1"
HEADER = struct.Struct("<IIIB3xQ")
HEADER_BYTES = HEADER.size  # 24
assert HEADER_BYTES == 24
MAGIC_BYTES = struct.pack("<I", MAGIC)  # how a record starts, to search for one
CRC_FROM = 12  # the CRC covers the header from this byte (kind, padding, lsn), then the body
BODY_BYTES_MAX = 256 * 1024 * 1024  # a sanity bound for reading back; real bodies are far smaller

# Why ``decode_at`` found no record: the buffer ends inside it (it may be whole in the file).
INCOMPLETE_HEADER = "incomplete header"
INCOMPLETE_BODY = "incomplete body"


class Kind(enum.IntEnum):
    PRODUCE = 1
    TOPIC_CREATE = 2
    TOPIC_DELETE = 3
    OFFSET_COMMIT = 4
    TX_START = 5
    DTX_START = 6
    TXN_WRITE = 7
    PREPARE = 8
    COMMIT = 9
    ROLLBACK = 10
    DELETE = 11
    TOPIC_ALTER = 12


def encode(lsn: int, kind: Kind, body: Any, large: bool = False) -> bytes:
    """One record, header and body. ``body`` is packed with msgpack; ``large``: it holds
    large binary values (a batch of records), which are joined in with the header rather
    than copied through msgpack's buffer and then again (``wire.packer.pack_joined``)."""
    if not large:
        return encode_packed(lsn, kind, pack(body))
    parts = pieces(body)
    crc = zlib.crc32(struct.pack("<B3xQ", kind, lsn))
    for part in parts:
        crc = zlib.crc32(part, crc)
    return b"".join([HEADER.pack(MAGIC, sum(map(len, parts)), crc, kind, lsn), *parts])


def encode_packed(lsn: int, kind: int, payload: bytes) -> bytes:
    tail = struct.pack("<B3xQ", kind, lsn)  # the header from CRC_FROM on
    crc = zlib.crc32(payload, zlib.crc32(tail))
    return HEADER.pack(MAGIC, len(payload), crc, kind, lsn) + payload


@dataclass(frozen=True, slots=True)
class Entry:
    """One record read back: where it starts, its LSN, kind and packed body."""

    position: int
    lsn: int
    kind: int
    payload: bytes | memoryview  # a view into a group's bytes (``iter_buffer``)

    @property
    def end(self) -> int:
        return self.position + HEADER_BYTES + len(self.payload)

    def body(self) -> Any:
        return msgpack.unpackb(self.payload, raw=False, strict_map_key=False)


def decode_at(buf: bytes | memoryview, pos: int, verify: bool = True,
              base: int = 0, view: bool = False) -> tuple[Entry | None, str]:
    """The record at ``pos`` of ``buf``, or None and why it is not one (``INCOMPLETE_HEADER``
    and ``INCOMPLETE_BODY`` when ``buf`` ends inside it). ``base`` is where ``buf`` starts
    in its file: the entry's position is ``base + pos``. With ``view`` (``buf`` a view of
    bytes that never change) the payload is a view into ``buf``, not a copy."""
    if len(buf) - pos < HEADER_BYTES:
        return None, INCOMPLETE_HEADER
    magic, length, crc, kind, lsn = HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        return None, "bad magic"
    if length > BODY_BYTES_MAX:
        return None, f"body length {length} is over {BODY_BYTES_MAX}"
    start = pos + HEADER_BYTES
    if len(buf) - start < length:
        return None, INCOMPLETE_BODY
    payload = buf[start:start + length] if view else bytes(buf[start:start + length])
    if verify and zlib.crc32(payload, zlib.crc32(bytes(buf[pos + CRC_FROM:start]))) != crc:
        return None, "checksum mismatch"
    return Entry(base + pos, lsn, kind, payload), ""


def iter_buffer(buf: bytes | memoryview, verify: bool = False) -> Iterator[Entry]:
    """Records of a buffer known to be whole (a group just written or received; bytes that
    do not change); raises on damage. Their payloads are views into ``buf``: a group's
    records are read without copying them."""
    pos = 0
    end = len(buf)
    view = memoryview(buf)
    while pos < end:
        entry, why = decode_at(view, pos, verify, view=True)
        if entry is None:
            raise ValueError(f"bad record at byte {pos} of a group: {why}")
        yield entry
        pos = entry.end


# ---- a segment's header -----------------------------------------------------------------

SEGMENT_MAGIC = 0x4C4E4853  # "SHNL"
SEGMENT_HEADER = struct.Struct("<II")  # magic, format version
SEGMENT_HEADER_BYTES = SEGMENT_HEADER.size  # 8
assert SEGMENT_HEADER_BYTES == 8
SEGMENT_MAGIC_BYTES = struct.pack("<I", SEGMENT_MAGIC)
assert SEGMENT_MAGIC_BYTES != MAGIC_BYTES


def encode_segment_header(version: int) -> bytes:
    return SEGMENT_HEADER.pack(SEGMENT_MAGIC, version)


def segment_header(head: bytes) -> tuple[int | None, int]:
    """A segment's format version and where its records start, from its first bytes:
    ``(1, 0)`` for a segment without a header (format 1), ``(None, 0)`` when ``head`` is only
    the start of a header (a segment whose creation a crash cut short)."""
    magic = head[:len(SEGMENT_MAGIC_BYTES)]
    if not magic or magic != SEGMENT_MAGIC_BYTES[:len(magic)]:
        return 1, 0  # empty, or a record's magic: no header
    if len(head) < SEGMENT_HEADER_BYTES:
        return None, 0
    return SEGMENT_HEADER.unpack_from(head)[1], SEGMENT_HEADER_BYTES


# ---- the log manager's state snapshot, written at each checkpoint ------------------------

SNAPSHOT_MAGIC = 0x53484E53  # "SHNS"
SNAPSHOT_HEADER = struct.Struct("<III")  # magic, body length, crc32 of the body


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


def decode_snapshot(data: bytes) -> Any:
    """The snapshot's state; raises ``ValueError`` if it does not check out. Bytes after
    the body (a slot's file is longer than the snapshot it holds) are ignored."""
    if len(data) < SNAPSHOT_HEADER.size:
        raise ValueError("snapshot is shorter than its header")
    magic, length, crc = SNAPSHOT_HEADER.unpack_from(data)
    body = data[SNAPSHOT_HEADER.size:SNAPSHOT_HEADER.size + length]
    if magic != SNAPSHOT_MAGIC or length != len(body) or zlib.crc32(body) != crc:
        raise ValueError("snapshot fails its magic, length or checksum")
    return msgpack.unpackb(body, raw=False, strict_map_key=False)
