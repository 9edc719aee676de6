"""Unit tests of the on-disk log record format and the segment scanner (``wire.logrecord``)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest

from wire import logrecord
from wire.logrecord import (
    HEADER_BYTES,
    MAGIC,
    CorruptLog,
    Kind,
    encode,
    iter_buffer,
    list_segments,
    scan_bytes,
    segment_name,
)

SEG = Path("/var/shardnode/log/00000000000000000001.log")


def sample_bodies() -> list[tuple[Kind, Any]]:
    blob = msgpack.packb([b"a", [b"b", b"k", ["t"], 5]], use_bin_type=True)
    return [
        (Kind.TOPIC_CREATE, [1, "orders", 4]),
        (Kind.PRODUCE, [7, 0, 1_700_000_000_000, [[1, 0, 0, 2, blob], [1, 3, 0, 2, blob]]]),
        (Kind.OFFSET_COMMIT, ["group-1", 1, 0, 2]),
        (Kind.PRODUCE, [7, 1, 1_700_000_000_001, [[1, 0, 2, 1, b"\x91\xa1x" * 50]]]),
        (Kind.TOPIC_DELETE, [1, "orders"]),
    ]


def build(first_lsn: int = 1,
          bodies: list[tuple[Kind, Any]] | None = None) -> tuple[bytes, list[int]]:
    """A segment's bytes and the start position of each record (plus the end, last)."""
    bodies = sample_bodies() if bodies is None else bodies
    buf = b""
    starts = []
    for i, (kind, body) in enumerate(bodies):
        starts.append(len(buf))
        buf += encode(first_lsn + i, kind, body)
    starts.append(len(buf))
    return buf, starts


# ---- the record format ------------------------------------------------------------------


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


# ---- scanning a segment -----------------------------------------------------------------


@pytest.mark.parametrize("last", [True, False])
def test_scan_of_a_clean_segment_finds_every_record(last: bool) -> None:
    bodies = sample_bodies()
    buf, starts = build(first_lsn=10, bodies=bodies)
    scan = scan_bytes(SEG, buf, last=last)
    assert scan.path == SEG
    assert [e.lsn for e in scan.entries] == list(range(10, 10 + len(bodies)))
    assert [e.body() for e in scan.entries] == [b for _, b in bodies]
    assert [e.position for e in scan.entries] == starts[:-1]
    assert scan.valid_bytes == scan.file_bytes == len(buf)
    assert scan.torn_bytes == 0


def test_scan_of_an_empty_segment() -> None:
    scan = scan_bytes(SEG, b"", last=True)
    assert scan.entries == [] and scan.valid_bytes == 0 and scan.file_bytes == 0


def _cut_points(starts: list[int]) -> list[int]:
    """Lengths that cut the last record: in its header, at the header's end, in its body."""
    last_start, end = starts[-2], starts[-1]
    cuts = {last_start + 1, last_start + 4, last_start + 11, last_start + HEADER_BYTES - 1,
            last_start + HEADER_BYTES, last_start + HEADER_BYTES + 1,
            (last_start + HEADER_BYTES + end) // 2, end - 1}
    return sorted(c for c in cuts if last_start < c < end)


def test_a_torn_tail_is_cut_off_in_the_last_segment() -> None:
    buf, starts = build()
    cuts = _cut_points(starts)
    assert len(cuts) >= 6
    for cut in cuts:
        scan = scan_bytes(SEG, buf[:cut], last=True)
        assert scan.valid_bytes == starts[-2], cut  # the end of the last whole record
        assert scan.file_bytes == cut
        assert scan.torn_bytes == cut - starts[-2]
        assert len(scan.entries) == len(starts) - 2


def test_a_torn_first_record_leaves_nothing() -> None:
    buf, starts = build()
    scan = scan_bytes(SEG, buf[: starts[1] - 3], last=True)
    assert scan.entries == [] and scan.valid_bytes == 0


@pytest.mark.parametrize("zeros", [1, HEADER_BYTES - 1, HEADER_BYTES, 4096])
def test_trailing_zeros_are_cut_off_in_the_last_segment(zeros: int) -> None:
    buf, starts = build()
    scan = scan_bytes(SEG, buf + b"\x00" * zeros, last=True)
    assert scan.valid_bytes == len(buf)
    assert scan.torn_bytes == zeros
    assert len(scan.entries) == len(starts) - 1


def test_a_torn_record_followed_by_zeros_is_cut_off() -> None:
    buf, starts = build()
    cut = starts[-2] + HEADER_BYTES + 3
    scan = scan_bytes(SEG, buf[:cut] + b"\x00" * 1000, last=True)
    assert scan.valid_bytes == starts[-2]


def test_a_torn_tail_in_a_segment_that_is_not_the_last_is_corruption() -> None:
    buf, starts = build()
    for cut in _cut_points(starts):
        with pytest.raises(CorruptLog) as info:
            scan_bytes(SEG, buf[:cut], last=False)
        assert info.value.position == starts[-2]
        assert info.value.segment == SEG
        assert str(SEG) in str(info.value)
    with pytest.raises(CorruptLog):
        scan_bytes(SEG, buf + b"\x00" * 8, last=False)


@pytest.mark.parametrize("last", [True, False])
@pytest.mark.parametrize("victim", [0, 1, 2, 3])
def test_a_flipped_byte_before_valid_records_is_corruption(last: bool, victim: int) -> None:
    buf, starts = build()
    assert victim < len(starts) - 2  # a valid record follows the victim
    rec_start, rec_end = starts[victim], starts[victim + 1]
    # Every interesting place: magic, length, crc, kind, lsn, and the body.
    for where in (0, 5, 9, 12, 20, HEADER_BYTES, rec_end - rec_start - 1):
        damaged = bytearray(buf)
        damaged[rec_start + where] ^= 0x40
        with pytest.raises(CorruptLog) as info:
            scan_bytes(SEG, bytes(damaged), last=last)
        err = info.value
        assert err.position == rec_start, where
        assert err.segment == SEG
        assert str(SEG) in str(err)
        assert f"byte {rec_start}" in str(err)


def test_flipped_byte_in_the_last_record_of_the_last_segment_is_a_torn_tail() -> None:
    # Nothing valid follows it, so it cannot be told from a write cut short.
    buf, starts = build()
    damaged = bytearray(buf)
    damaged[-1] ^= 0x01
    scan = scan_bytes(SEG, bytes(damaged), last=True)
    assert scan.valid_bytes == starts[-2]


@pytest.mark.parametrize("lsns", [[1, 2, 2], [5, 3], [1, 4, 2, 8], [0]])
def test_lsns_that_do_not_increase_raise(lsns: list[int]) -> None:
    buf = b""
    starts = []
    for lsn in lsns:
        starts.append(len(buf))
        buf += encode(lsn, Kind.TOPIC_DELETE, [1, "x"])
    prev = 0
    bad = None
    for i, lsn in enumerate(lsns):
        if lsn <= prev:
            bad = i
            break
        prev = lsn
    assert bad is not None
    with pytest.raises(CorruptLog) as info:
        scan_bytes(SEG, buf, last=True)
    assert info.value.position == starts[bad]
    assert f"LSN {lsns[bad]}" in str(info.value)


def test_lsns_may_skip_numbers() -> None:
    buf = encode(3, Kind.TOPIC_DELETE, [1, "x"]) + encode(9, Kind.TOPIC_DELETE, [2, "y"])
    assert [e.lsn for e in scan_bytes(SEG, buf, last=True).entries] == [3, 9]


# ---- segments of a directory ------------------------------------------------------------


def test_list_segments_orders_by_first_lsn(tmp_path: Path) -> None:
    firsts = [1000, 1, 99, 10**15, 100]
    for lsn in firsts:
        (tmp_path / segment_name(lsn)).write_bytes(b"")
    # Not segments: other suffixes, names that are not numbers, a checkpoint file.
    (tmp_path / "00000000000000000005.tmp").write_bytes(b"")
    (tmp_path / "notes.log").write_bytes(b"")
    (tmp_path / "checkpoint").write_bytes(b"")
    found = list_segments(tmp_path)
    assert [lsn for lsn, _ in found] == sorted(firsts)
    assert [p for _, p in found] == [tmp_path / segment_name(lsn) for lsn in sorted(firsts)]


def test_segment_names_sort_as_text_in_lsn_order() -> None:
    firsts = [1, 9, 10, 11, 100, 2**40]
    names = [segment_name(n) for n in firsts]
    assert sorted(names) == names
    assert all(n.endswith(logrecord.SEGMENT_SUFFIX) for n in names)


def test_list_segments_of_an_empty_directory(tmp_path: Path) -> None:
    assert list_segments(tmp_path) == []


def test_a_torn_record_whose_value_holds_old_log_bytes_is_still_a_torn_tail(tmp_path: Path) -> None:
    """A client may store log bytes as a value; cut short, that is a torn tail, not damage."""
    old = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])  # a valid record with an old LSN
    first = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])
    second = encode(2, Kind.PRODUCE, [7, 0, 0, [[1, 0, 0, 1, b"x" * 50 + old + b"y" * 50]]])
    cut = first + second[: len(second) - 20]  # the write of `second` was cut short
    scan = scan_bytes(tmp_path / "seg", cut, last=True)
    assert [e.lsn for e in scan.entries] == [1]
    assert scan.valid_bytes == len(first)


def test_damage_followed_by_a_record_continuing_the_lsns_is_corruption(tmp_path: Path) -> None:
    recs = [encode(i, Kind.TOPIC_DELETE, [i, "t"]) for i in (1, 2, 3)]
    buf = bytearray(b"".join(recs))
    buf[len(recs[0]) + HEADER_BYTES] ^= 0xFF  # damage record 2's body; record 3 follows
    with pytest.raises(CorruptLog):
        scan_bytes(tmp_path / "seg", bytes(buf), last=True)


# ---- snapshot slots ------------------------------------------------------------------------


def snap(last_lsn: int, producers: int = 0) -> dict[str, Any]:
    return {"format": 2, "last_lsn": last_lsn, "catalog_lsn": 1, "next_topic_id": 2,
            "topics": [[1, "t", 1]], "next_offset": [[1, 0, last_lsn]],
            "producers": [[p, 9, {8: msgpack.packb([last_lsn, [[0, 1, 1]]])}]
                          for p in range(producers)]}


def test_snapshot_encoding_round_trips_a_big_producer_list() -> None:
    state = snap(70, producers=200)  # packed a producer at a time
    assert logrecord.decode_snapshot(Path("x"), logrecord.encode_snapshot(state)) == state


def test_snapshot_slots_are_overwritten_in_place_and_the_newest_valid_one_wins(
        tmp_path: Path) -> None:
    from actors.log_manager import SNAPSHOT_GROW_BYTES, write_snapshot

    assert logrecord.load_snapshot(tmp_path) == (None, -1)
    write_snapshot(tmp_path, 0, logrecord.encode_snapshot(snap(10, producers=100)))
    write_snapshot(tmp_path, 1, logrecord.encode_snapshot(snap(20)))
    slot0 = tmp_path / logrecord.SNAPSHOT_SLOTS[0]
    size = slot0.stat().st_size
    assert size % SNAPSHOT_GROW_BYTES == 0
    write_snapshot(tmp_path, 0, logrecord.encode_snapshot(snap(30)))  # smaller: same file size
    assert slot0.stat().st_size == size
    assert logrecord.load_snapshot(tmp_path) == (snap(30), 0)
    # A write cut short spoils its slot only: the other one is used.
    data = bytearray(slot0.read_bytes())
    data[40] ^= 0xFF
    slot0.write_bytes(bytes(data))
    assert logrecord.load_snapshot(tmp_path) == (snap(20), 1)
    # Both spoiled: the log cannot be trusted.
    slot1 = tmp_path / logrecord.SNAPSHOT_SLOTS[1]
    slot1.write_bytes(b"\0" * 100)
    with pytest.raises(logrecord.CorruptLog, match="snapshot"):
        logrecord.load_snapshot(tmp_path)


def test_a_snapshot_from_before_slots_is_read_and_removed_by_the_first_slot_write(
        tmp_path: Path) -> None:
    from actors.log_manager import write_snapshot

    legacy = tmp_path / logrecord.SNAPSHOT_NAME_BEFORE_SLOTS
    legacy.write_bytes(logrecord.encode_snapshot(snap(5)))
    assert logrecord.load_snapshot(tmp_path) == (snap(5), -1)
    write_snapshot(tmp_path, 0, logrecord.encode_snapshot(snap(6)))
    assert not legacy.exists()
    assert logrecord.load_snapshot(tmp_path) == (snap(6), 0)


# ---- reading a segment a chunk at a time (the writers' catch-up) --------------------------


def chunked(path: Path, last: bool, chunk_bytes: int) -> list[Any]:
    return [e for batch in logrecord.read_entries(path, last, chunk_bytes) for e in batch]


@pytest.mark.parametrize("chunk_bytes", [1, 7, HEADER_BYTES, 100, 1 << 20])
def test_reading_in_chunks_finds_what_a_whole_scan_finds(tmp_path: Path, chunk_bytes: int) -> None:
    buf, _starts = build()
    path = tmp_path / segment_name(1)
    path.write_bytes(buf)
    assert chunked(path, True, chunk_bytes) == scan_bytes(path, buf, last=True).entries


@pytest.mark.parametrize("chunk_bytes", [5, 64, 1 << 20])
def test_reading_in_chunks_stops_before_a_tail_not_yet_whole(tmp_path: Path,
                                                             chunk_bytes: int) -> None:
    buf, starts = build()
    path = tmp_path / segment_name(1)
    for cut in _cut_points(starts):
        path.write_bytes(buf[:cut])
        got = chunked(path, True, chunk_bytes)
        assert [e.lsn for e in got] == list(range(1, len(starts) - 1)), cut
        with pytest.raises(CorruptLog) as info:
            chunked(path, False, chunk_bytes)  # only the last segment may end that way
        assert info.value.position == starts[-2]


def test_reading_in_chunks_keeps_memory_near_the_chunk_size(tmp_path: Path) -> None:
    body = [7, 0, 1, [[1, 0, 0, 1, b"v" * 60_000]]]
    buf, _starts = build(bodies=[(Kind.PRODUCE, body)] * 100)  # ~6 MB
    path = tmp_path / segment_name(1)
    path.write_bytes(buf)
    batches = list(logrecord.read_entries(path, True, chunk_bytes=256 * 1024))
    assert len(batches) > 10
    assert max(sum(len(e.payload) for e in b) for b in batches) <= 256 * 1024 + 60_100
    assert [e.lsn for b in batches for e in b] == list(range(1, 101))
