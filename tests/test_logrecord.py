"""Unit tests of the on-disk record and snapshot formats (``wire.logrecord``): bytes only;
reading files is ``tests/test_wal.py``."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack
import pytest

from tests.logsamples import build, sample_bodies
from wire import logrecord
from wire.logrecord import (
    BODY_BYTES_MAX,
    HEADER_BYTES,
    INCOMPLETE_BODY,
    INCOMPLETE_HEADER,
    MAGIC,
    SEGMENT_HEADER_BYTES,
    Kind,
    decode_at,
    encode,
    encode_segment_header,
    iter_buffer,
    segment_header,
)


def test_header_layout_is_as_documented() -> None:
    body = [1, "orders", 4]
    rec = encode(42, Kind.TOPIC_CREATE, body)
    payload = msgpack.packb(body, use_bin_type=True)
    assert HEADER_BYTES == 24
    assert len(rec) == 24 + len(payload)
    magic, length, crc = struct.unpack_from("<III", rec, 0)
    kind = rec[12]
    lsn = struct.unpack_from("<Q", rec, 16)[0]
    assert (magic, length, kind, lsn) == (MAGIC, len(payload), Kind.TOPIC_CREATE, 42)
    assert rec[13:16] == b"\x00\x00\x00"
    assert crc == zlib.crc32(rec[12:24] + payload)  # covers kind, padding, lsn and body
    assert rec[24:] == payload


def test_a_record_with_large_values_joined_in_has_the_same_bytes() -> None:
    big = bytes(range(256)) * 1024  # 256 KiB: joined in (wire.packer.JOIN_BYTES_MIN)
    for kind, body in [(Kind.PRODUCE, [7, 1, 1_700_000_000_000, [(3, 0, 10, 4, big)]]),
                       (Kind.TXN_WRITE, [9, 1_700_000_000_000, [(3, 1, 2, big), (3, 2, 1, b"v")],
                                         []]),
                       *sample_bodies()]:
        assert encode(5, kind, body, large=True) == encode(5, kind, body)


def test_encode_then_iter_buffer_round_trips() -> None:
    bodies = sample_bodies()
    buf, starts = build(first_lsn=100, bodies=bodies)
    for verify in (False, True):
        entries = list(iter_buffer(buf, verify=verify))
        assert [e.lsn for e in entries] == list(range(100, 100 + len(bodies)))
        assert [e.kind for e in entries] == [k for k, _ in bodies]
        assert [e.body() for e in entries] == [b for _, b in bodies]
        assert [e.position for e in entries] == starts[:-1]
        assert [e.end for e in entries] == starts[1:]


def test_iter_buffer_accepts_a_memoryview_and_an_empty_buffer() -> None:
    buf, _ = build()
    assert [e.lsn for e in iter_buffer(memoryview(buf))] == [e.lsn for e in iter_buffer(buf)]
    assert list(iter_buffer(b"")) == []


def test_iter_buffer_raises_on_damage() -> None:
    buf, starts = build()
    with pytest.raises(ValueError, match=f"byte {starts[-2]}"):
        list(iter_buffer(buf[:-1]))
    damaged = bytearray(buf)
    damaged[starts[1] + HEADER_BYTES] ^= 0xFF
    with pytest.raises(ValueError, match=f"byte {starts[1]}.*checksum"):
        list(iter_buffer(bytes(damaged), verify=True))


def test_a_record_moved_to_another_lsn_fails_its_checksum() -> None:
    rec = bytearray(encode(5, Kind.TOPIC_DELETE, [1, "x"]))
    struct.pack_into("<Q", rec, 16, 6)
    with pytest.raises(ValueError, match="checksum"):
        list(iter_buffer(bytes(rec), verify=True))


def test_decode_at_says_why_a_record_is_not_there() -> None:
    buf, starts = build()
    entry, why = decode_at(buf, starts[1], base=1000)
    assert entry is not None and why == ""
    assert entry.position == 1000 + starts[1] and entry.end == 1000 + starts[2]
    assert decode_at(buf[: starts[1] + HEADER_BYTES - 1], starts[1]) == (None, INCOMPLETE_HEADER)
    assert decode_at(buf[: starts[2] - 1], starts[1]) == (None, INCOMPLETE_BODY)
    assert decode_at(buf, starts[1] + 1) == (None, "bad magic")
    huge = bytearray(buf)
    struct.pack_into("<I", huge, starts[1] + 4, BODY_BYTES_MAX + 1)
    assert "over" in decode_at(bytes(huge), starts[1])[1]
    damaged = bytearray(buf)
    damaged[starts[2] - 1] ^= 0x01
    assert decode_at(bytes(damaged), starts[1]) == (None, "checksum mismatch")
    assert decode_at(bytes(damaged), starts[1], verify=False)[0] is not None



# ---- the snapshot format ----------------------------------------------------------------


def snap(last_lsn: int, producers: int = 0) -> dict[str, Any]:
    return {"format": 2, "last_lsn": last_lsn, "catalog_lsn": 1, "next_topic_id": 2,
            "topics": [[1, "t", 1]], "next_offset": [[1, 0, last_lsn]],
            "producers": [[p, 9, {8: msgpack.packb([last_lsn, [[0, 1, 1]]])}]
                          for p in range(producers)]}


def test_snapshot_encoding_round_trips_a_big_producer_list() -> None:
    state = snap(70, producers=200)  # packed a producer at a time
    assert logrecord.decode_snapshot(logrecord.encode_snapshot(state)) == state


def test_a_snapshot_that_fails_its_check_raises_value_error() -> None:
    data = bytearray(logrecord.encode_snapshot(snap(5)))
    assert logrecord.decode_snapshot(bytes(data) + b"\0" * 100) == snap(5)  # a slot's padding
    with pytest.raises(ValueError, match="shorter"):
        logrecord.decode_snapshot(bytes(data[:5]))
    data[-1] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        logrecord.decode_snapshot(bytes(data))


def test_a_segments_header_gives_its_format_and_where_its_records_start() -> None:
    header = encode_segment_header(2)
    record = encode(1, Kind.PRODUCE, [1, 0, 0, []])
    assert len(header) == SEGMENT_HEADER_BYTES
    assert segment_header(header + record) == (2, SEGMENT_HEADER_BYTES)
    assert segment_header(record) == (1, 0)  # format 1: no header, records from byte 0
    assert segment_header(b"") == (1, 0)
    for cut in range(1, SEGMENT_HEADER_BYTES):
        assert segment_header(header[:cut]) == (None, 0)  # a creation cut short
