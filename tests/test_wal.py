"""Unit tests of the write-ahead log on disk (``actors.wal``): the segment scanner, segments
of a directory, snapshot slots and recovery. Real files on tmp_path, no processes.

The scanner's tests run with several chunk sizes, down to a header, so that every record
boundary, damage and torn tail also falls across the edge of a chunk."""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from actors import wal
from actors.log_state import LogState
from actors.wal import (
    SCAN_CHUNK_BYTES,
    CorruptLog,
    CorruptSnapshot,
    SegmentScan,
    list_segments,
    recover,
    segment_name,
)
from config import load_config
from tests.logsamples import build, sample_bodies
from wire import formats, logrecord
from wire.formats import FormatRefused
from wire.logrecord import HEADER_BYTES, Entry, Kind, encode

CHUNKS = [1, 50, 100, SCAN_CHUNK_BYTES]  # 1 is a header: a chunk holds at least one


def produces(first_lsn: int, count: int, value_bytes: int) -> bytes:
    """``count`` PRODUCE records of one producer, each with a value of ``value_bytes``."""
    return b"".join(
        encode(lsn, Kind.PRODUCE, [7, lsn, 0, [[1, 0, lsn, 1, b"v" * value_bytes]]])
        for lsn in range(first_lsn, first_lsn + count))


@pytest.fixture
def seg(tmp_path: Path) -> Path:
    return tmp_path / segment_name(1)


def scan(path: Path, data: bytes, last: bool,
         chunk_bytes: int = SCAN_CHUNK_BYTES) -> tuple[list[Entry], SegmentScan]:
    """Write ``data`` as the segment ``path`` and scan it."""
    path.write_bytes(data)
    s = SegmentScan(path, last, chunk_bytes)
    return [e for batch in s for e in batch], s


def scan_file(path: Path, last: bool) -> tuple[list[Entry], SegmentScan]:
    """Scan the segment ``path`` as it is."""
    s = SegmentScan(path, last)
    return [e for batch in s for e in batch], s


def peak_bytes(work: Callable[[], object]) -> int:
    """The most memory Python held at once while ``work`` ran, above what it held before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


# ---- scanning a segment -----------------------------------------------------------------


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
@pytest.mark.parametrize("last", [True, False])
def test_scan_of_a_clean_segment_finds_every_record(seg: Path, last: bool,
                                                    chunk_bytes: int) -> None:
    bodies = sample_bodies()
    buf, starts = build(first_lsn=10, bodies=bodies)
    entries, s = scan(seg, buf, last, chunk_bytes)
    assert [e.lsn for e in entries] == list(range(10, 10 + len(bodies)))
    assert [e.body() for e in entries] == [b for _, b in bodies]
    assert [e.position for e in entries] == starts[:-1]
    assert s.valid_bytes == s.file_bytes == len(buf)
    assert s.torn_bytes == 0


def test_records_come_a_chunk_at_a_time(seg: Path) -> None:
    buf = produces(1, 100, 1000)
    seg.write_bytes(buf)
    batches = list(SegmentScan(seg, True, chunk_bytes=10_000))
    assert len(batches) >= 10
    assert max(sum(HEADER_BYTES + len(e.payload) for e in b) for b in batches) <= 10_000
    assert [e.lsn for b in batches for e in b] == list(range(1, 101))


def test_scan_of_an_empty_segment(seg: Path) -> None:
    entries, s = scan(seg, b"", last=True)
    assert entries == [] and s.valid_bytes == 0 and s.file_bytes == 0


def _cut_points(starts: list[int]) -> list[int]:
    """Lengths that cut the last record: in its header, at the header's end, in its body."""
    last_start, end = starts[-2], starts[-1]
    cuts = {last_start + 1, last_start + 4, last_start + 11, last_start + HEADER_BYTES - 1,
            last_start + HEADER_BYTES, last_start + HEADER_BYTES + 1,
            (last_start + HEADER_BYTES + end) // 2, end - 1}
    return sorted(c for c in cuts if last_start < c < end)


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
def test_a_torn_tail_is_cut_off_in_the_last_segment(seg: Path, chunk_bytes: int) -> None:
    buf, starts = build()
    cuts = _cut_points(starts)
    assert len(cuts) >= 6
    for cut in cuts:
        entries, s = scan(seg, buf[:cut], True, chunk_bytes)
        assert s.valid_bytes == starts[-2], cut  # the end of the last whole record
        assert s.file_bytes == cut
        # Up to the last byte that is not zero: zeros after it may have been written ahead.
        assert s.torn_bytes == len(buf[starts[-2]:cut].rstrip(b"\0"))
        assert len(entries) == len(starts) - 2
        # Zeros written ahead after the torn record change nothing of that.
        ahead, z = scan(seg, buf[:cut] + bytes(3 * chunk_bytes + 5), True, chunk_bytes)
        assert (len(ahead), z.valid_bytes, z.torn_bytes) == (len(entries), s.valid_bytes,
                                                             s.torn_bytes)


def test_a_torn_first_record_leaves_nothing(seg: Path) -> None:
    buf, starts = build()
    entries, s = scan(seg, buf[: starts[1] - 3], last=True)
    assert entries == [] and s.valid_bytes == 0


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
@pytest.mark.parametrize("zeros", [1, HEADER_BYTES - 1, HEADER_BYTES, 4096])
def test_trailing_zeros_end_the_last_segment_and_are_not_torn(seg: Path, zeros: int,
                                                              chunk_bytes: int) -> None:
    """Zeros after the records are what the writer wrote ahead of them, not a write cut
    short (recovery cuts them off all the same, without a warning)."""
    buf, starts = build()
    entries, s = scan(seg, buf + b"\x00" * zeros, True, chunk_bytes)
    assert s.valid_bytes == len(buf)
    assert s.file_bytes == len(buf) + zeros
    assert s.torn_bytes == 0
    assert len(entries) == len(starts) - 1


def test_a_torn_record_followed_by_zeros_is_cut_off(seg: Path) -> None:
    buf, starts = build()
    cut = starts[-2] + HEADER_BYTES + 3
    _entries, s = scan(seg, buf[:cut] + b"\x00" * 1000, last=True)
    assert s.valid_bytes == starts[-2]


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
def test_a_torn_tail_in_a_segment_that_is_not_the_last_is_corruption(seg: Path,
                                                                     chunk_bytes: int) -> None:
    buf, starts = build()
    for cut in _cut_points(starts):
        with pytest.raises(CorruptLog) as info:
            scan(seg, buf[:cut], False, chunk_bytes)
        assert info.value.position == starts[-2]
        assert info.value.segment == seg
        assert str(seg) in str(info.value)
    with pytest.raises(CorruptLog):
        scan(seg, buf + b"\x00" * 8, False, chunk_bytes)


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
@pytest.mark.parametrize("last", [True, False])
@pytest.mark.parametrize("victim", [0, 1, 2, 3])
def test_a_flipped_byte_before_valid_records_is_corruption(seg: Path, last: bool, victim: int,
                                                           chunk_bytes: int) -> None:
    buf, starts = build()
    assert victim < len(starts) - 2  # a valid record follows the victim
    rec_start, rec_end = starts[victim], starts[victim + 1]
    # Every interesting place: magic, length, crc, kind, lsn, and the body.
    for where in (0, 5, 9, 12, 20, HEADER_BYTES, rec_end - rec_start - 1):
        damaged = bytearray(buf)
        damaged[rec_start + where] ^= 0x40
        with pytest.raises(CorruptLog) as info:
            scan(seg, bytes(damaged), last, chunk_bytes)
        err = info.value
        assert err.position == rec_start, where
        assert err.segment == seg
        assert f"{seg} is corrupt at byte {rec_start}" in str(err)


def test_flipped_byte_in_the_last_record_of_the_last_segment_is_a_torn_tail(seg: Path) -> None:
    # Nothing valid follows it, so it cannot be told from a write cut short.
    buf, starts = build()
    damaged = bytearray(buf)
    damaged[-1] ^= 0x01
    _entries, s = scan(seg, bytes(damaged), last=True)
    assert s.valid_bytes == starts[-2]


@pytest.mark.parametrize("lsns", [[1, 2, 2], [5, 3], [1, 4, 2, 8], [0]])
def test_lsns_that_do_not_increase_raise(seg: Path, lsns: list[int]) -> None:
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
        scan(seg, buf, last=True)
    assert info.value.position == starts[bad]
    assert f"LSN {lsns[bad]}" in str(info.value)


def test_lsns_may_skip_numbers(seg: Path) -> None:
    buf = encode(3, Kind.TOPIC_DELETE, [1, "x"]) + encode(9, Kind.TOPIC_DELETE, [2, "y"])
    assert [e.lsn for e in scan(seg, buf, last=True)[0]] == [3, 9]


@pytest.mark.parametrize("chunk_bytes", CHUNKS)
def test_a_torn_record_whose_value_holds_old_log_bytes_is_still_a_torn_tail(
        seg: Path, chunk_bytes: int) -> None:
    """A client may store log bytes as a value; cut short, that is a torn tail, not damage."""
    old = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])  # a valid record with an old LSN
    first = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])
    second = encode(2, Kind.PRODUCE, [7, 0, 0, [[1, 0, 0, 1, b"x" * 50 + old + b"y" * 50]]])
    cut = first + second[: len(second) - 20]  # the write of `second` was cut short
    entries, s = scan(seg, cut, True, chunk_bytes)
    assert [e.lsn for e in entries] == [1]
    assert s.valid_bytes == len(first)


def test_damage_followed_by_a_record_continuing_the_lsns_is_corruption(seg: Path) -> None:
    recs = [encode(i, Kind.TOPIC_DELETE, [i, "t"]) for i in (1, 2, 3)]
    buf = bytearray(b"".join(recs))
    buf[len(recs[0]) + HEADER_BYTES] ^= 0xFF  # damage record 2's body; record 3 follows
    with pytest.raises(CorruptLog):
        scan(seg, bytes(buf), last=True)


# ---- a chunk at a time: what lies across the edge of a chunk ----------------------------


def test_damage_is_corruption_when_the_valid_record_after_it_is_chunks_later(seg: Path) -> None:
    big = produces(2, 1, 200_000)  # one record of many chunks
    buf = bytearray(produces(1, 1, 10) + big + produces(3, 2, 10))
    victim = len(produces(1, 1, 10))
    buf[victim + HEADER_BYTES + 100] ^= 0xFF  # in the big record's body, near its start
    with pytest.raises(CorruptLog) as info:
        scan(seg, bytes(buf), True, chunk_bytes=4096)
    assert info.value.position == victim
    assert f"follows at byte {victim + len(big)}" in str(info.value)


def test_damage_then_garbage_then_a_valid_record_chunks_later_is_corruption(seg: Path) -> None:
    head = produces(1, 2, 10)
    tail = produces(3, 1, 10)
    buf = head + b"\x00" * 100_000 + tail
    with pytest.raises(CorruptLog) as info:
        scan(seg, buf, True, chunk_bytes=4096)
    assert info.value.position == len(head)
    assert f"follows at byte {len(head) + 100_000}" in str(info.value)


def test_a_length_that_claims_most_of_the_segment_is_checked_without_reading_it_whole(
        seg: Path) -> None:
    """A damaged length field must neither pass nor make the scan hold what it claims."""
    buf = bytearray(produces(1, 400, 20_000))  # 8 MB
    struct.pack_into("<I", buf, 4, 6_000_000)  # record 1 claims 6 MB, within the file
    seg.write_bytes(bytes(buf))
    found: list[CorruptLog] = []

    def work() -> None:
        try:
            list(SegmentScan(seg, True, chunk_bytes=64 * 1024))
        except CorruptLog as exc:
            found.append(exc)
    assert peak_bytes(work) < 1_000_000
    assert len(found) == 1 and found[0].position == 0


def test_a_record_longer_than_a_chunk_is_read_whole(seg: Path) -> None:
    buf = produces(1, 3, 10) + produces(4, 1, 300_000) + produces(5, 3, 10)
    entries, _s = scan(seg, buf, True, chunk_bytes=4096)
    assert [e.lsn for e in entries] == list(range(1, 8))
    assert len(entries[3].payload) > 300_000
    assert entries[3].body()[3][0][4] == b"v" * 300_000


def test_a_torn_tail_chunks_long_is_cut_where_it_starts(seg: Path) -> None:
    whole = produces(1, 5, 10)
    torn = produces(6, 1, 100_000)[:60_000] + b"\x00" * 50_000  # cut short, then zeros
    entries, s = scan(seg, whole + torn, True, chunk_bytes=4096)
    assert [e.lsn for e in entries] == [1, 2, 3, 4, 5]
    assert s.valid_bytes == len(whole) and s.torn_bytes == len(torn.rstrip(b"\0"))


def test_an_old_record_inside_a_value_across_a_chunk_edge_is_not_damage(seg: Path) -> None:
    old = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])
    first = produces(1, 1, 10)
    second = encode(2, Kind.PRODUCE, [7, 0, 0, [[1, 0, 0, 1, b"x" * 5000 + old * 50]]])
    for chunk_bytes in (4096, 4096 + 13, 5000):  # ``old`` lies across some chunk's edge
        entries, s = scan(seg, first + second[:-20], True, chunk_bytes)
        assert [e.lsn for e in entries] == [1]
        assert s.valid_bytes == len(first)


def test_scanning_holds_about_a_chunk_whatever_the_segment_size(seg: Path) -> None:
    seg.write_bytes(produces(1, 400, 20_000))  # 8 MB

    def read_all(chunk_bytes: int) -> Callable[[], object]:
        def work() -> None:
            for _batch in SegmentScan(seg, True, chunk_bytes):
                pass
        return work
    assert peak_bytes(read_all(64 * 1024)) < 400_000
    # The measure sees what a scan holds: with a chunk as big as the segment, it is all.
    assert peak_bytes(read_all(16 * 1024 * 1024)) > 8_000_000


def test_a_scan_of_the_live_tail_stops_where_the_writer_is(seg: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard writer reads the last segment while the log manager appends to it: a record
    it found incomplete may be whole, with more after it, by the time it looks further.
    That is the tail being written, not damage."""
    whole = produces(1, 3, 10)
    rest = produces(4, 3, 10)
    seg.write_bytes(whole + rest[:30])
    real_pread = os.pread
    grown: list[int] = []  # the offset the segment grew at

    def pread(fd: int, n: int, offset: int) -> bytes:
        if offset == len(whole) + 1 and not grown:  # looking past the incomplete record
            with open(seg, "ab") as f:
                f.write(rest[30:])
            grown.append(offset)
        return real_pread(fd, n, offset)
    monkeypatch.setattr(os, "pread", pread)
    s = SegmentScan(seg, True)
    assert [e.lsn for b in s for e in b] == [1, 2, 3]
    assert grown and s.valid_bytes == len(whole)
    monkeypatch.undo()
    assert [e.lsn for b in SegmentScan(seg, True) for e in b] == list(range(1, 7))


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
    assert all(n.endswith(wal.SEGMENT_SUFFIX) for n in names)


def test_list_segments_of_an_empty_directory(tmp_path: Path) -> None:
    assert list_segments(tmp_path) == []


def test_segments_below_an_lsn_are_deleted_but_never_the_newest(tmp_path: Path) -> None:
    for first in (1, 11, 21):
        (tmp_path / segment_name(first)).write_bytes(b"x" * 10)
    assert wal.segments_bytes(tmp_path) == 30
    assert wal.delete_segments_upto(tmp_path, 15) == 1  # 11.. holds 11-20: not all ≤ 15
    assert [f for f, _p in list_segments(tmp_path)] == [11, 21]
    assert wal.delete_segments_upto(tmp_path, 10**6) == 1
    assert [f for f, _p in list_segments(tmp_path)] == [21]


def test_the_segment_writer_rolls_at_its_limit(tmp_path: Path) -> None:
    w = wal.SegmentWriter(tmp_path, segment_bytes_max=100)
    try:
        w.append(produces(1, 1, 10), first_lsn=1)
        w.append(produces(2, 1, 10), first_lsn=2)
        w.append(produces(3, 1, 60), first_lsn=3)  # would pass 100 bytes: a new segment
    finally:
        w.close()
    assert [f for f, _p in list_segments(tmp_path)] == [1, 3]
    header = logrecord.encode_segment_header(formats.LOG_SEGMENT.current)
    assert (tmp_path / segment_name(1)).read_bytes() == header + produces(1, 2, 10)
    assert (tmp_path / segment_name(3)).read_bytes() == header + produces(3, 1, 60)


def test_small_groups_are_written_in_place_over_zeros_written_ahead(tmp_path: Path) -> None:
    """The file grows by ``ZERO_AHEAD_BYTES`` of zeros at a time, not at every group: the
    groups between are written over zeros and change neither its size nor its blocks."""
    w = wal.SegmentWriter(tmp_path, segment_bytes_max=64 << 20)
    header = logrecord.encode_segment_header(formats.LOG_SEGMENT.current)
    path = tmp_path / segment_name(1)
    try:
        sizes = []
        for lsn in range(1, 51):
            w.append(produces(lsn, 1, 200_000), first_lsn=lsn)  # 50 groups, 10 MB
            sizes.append(path.stat().st_size)
        assert sizes[0] == wal.ZERO_AHEAD_BYTES
        assert sorted(set(sizes)) == [wal.ZERO_AHEAD_BYTES * k for k in (1, 2, 3)]
        assert w.ahead_bytes == sizes[-1] - len(header) - len(produces(1, 50, 200_000))
        entries, s = scan_file(path, last=True)  # as a crash would leave it
        assert [e.lsn for e in entries] == list(range(1, 51))
        assert (s.valid_bytes, s.torn_bytes) == (w.size, 0)
    finally:
        w.close()
    assert path.read_bytes() == header + produces(1, 50, 200_000)  # cut back at the close


def test_a_group_of_a_megabyte_or_more_grows_the_file_itself(tmp_path: Path) -> None:
    w = wal.SegmentWriter(tmp_path, segment_bytes_max=64 << 20)
    path = tmp_path / segment_name(1)
    try:
        big = produces(1, 1, wal.ZERO_AHEAD_WRITE_BYTES_MAX)
        w.append(big, first_lsn=1)
        assert path.stat().st_size == w.size  # no zeros written ahead of it
        w.append(produces(2, 1, 10), first_lsn=2)  # a small one: zeros ahead of it
        assert path.stat().st_size == wal.ZERO_AHEAD_BYTES > w.size
    finally:
        w.close()


def test_a_rolled_segment_is_cut_back_to_its_records_before_the_next_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the last segment may end in zeros: a scan takes a bad record in any other for
    damage. The cut is durable before the next segment exists."""
    events: list[str] = []
    real_fsync, real_open = os.fsync, os.open

    def fsync(fd: int) -> None:
        events.append(f"fsync {os.fstat(fd).st_size}")
        real_fsync(fd)

    def opened(path: Any, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_CREAT:
            events.append(f"create {Path(path).name}")
        return real_open(path, flags, mode)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "open", opened)
    w = wal.SegmentWriter(tmp_path, segment_bytes_max=3000)
    header = logrecord.encode_segment_header(formats.LOG_SEGMENT.current)
    try:
        w.append(produces(1, 1, 1000), first_lsn=1)
        assert (tmp_path / segment_name(1)).stat().st_size == 3000  # zeros to the limit
        events.clear()
        w.append(produces(2, 1, 2500), first_lsn=2)  # past the limit: a new segment
    finally:
        w.close()
    first = header + produces(1, 1, 1000)
    assert events[:2] == [f"fsync {len(first)}", f"create {segment_name(2)}"]
    assert (tmp_path / segment_name(1)).read_bytes() == first
    state = fresh_state()
    recover(tmp_path, state)  # the first segment, not the last, reads clean
    assert state.last_lsn == 2


def test_a_disk_too_full_for_zeros_ahead_still_takes_the_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if not any(bytes(data[:4096])) and len(data) >= 4096:  # zeros ahead: no room
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)
    monkeypatch.setattr(os, "pwrite", pwrite)
    w = wal.SegmentWriter(tmp_path, segment_bytes_max=64 << 20)
    path = tmp_path / segment_name(1)
    try:
        w.append(produces(1, 2, 100), first_lsn=1)
        assert path.stat().st_size == w.size  # written as it is, no zeros ahead
    finally:
        w.close()
    entries, s = scan_file(path, last=True)
    assert [e.lsn for e in entries] == [1, 2] and s.torn_bytes == 0


def test_zeros_at_end_counts_only_the_zeros_that_end_a_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"ab\0c" + bytes(10_000))
    assert [wal.zeros_at_end(path, chunk_bytes=c) for c in (1, 7, 4096, 1 << 20)] == [10_000] * 4
    assert wal.zeros_at_end(path, floor=5_000) == 5_004  # none below the floor counted
    assert wal.zeros_at_end(path, size=4) == 0  # the file's first 4 bytes end in "c"
    path.write_bytes(bytes(10))
    assert wal.zeros_at_end(path) == 10


def test_recovery_cuts_zeros_written_ahead_without_calling_them_torn(
        log_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    create = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])
    w = wal.SegmentWriter(log_dir, segment_bytes_max=64 << 20)
    w.append(create, first_lsn=1)
    w.append(produces(2, 3, 100), first_lsn=2)
    records = w.size
    os.close(w.fd)  # a crash: the zeros ahead stay on disk
    path = log_dir / segment_name(1)
    assert path.stat().st_size == wal.ZERO_AHEAD_BYTES
    state = fresh_state()
    with caplog.at_level(logging.WARNING, logger="shardnode"):
        rec = recover(log_dir, state)
    assert (rec.torn_bytes, rec.last_segment_bytes, state.last_lsn) == (0, records, 4)
    assert path.stat().st_size == records
    assert "torn" not in caplog.text
    again = wal.SegmentWriter(log_dir, segment_bytes_max=64 << 20)
    try:
        again.open_existing(path, rec.last_segment_bytes)
        again.append(produces(5, 1, 100), first_lsn=5)
    finally:
        again.close()
    entries, _s = scan_file(path, last=True)
    assert [e.lsn for e in entries] == [1, 2, 3, 4, 5]


# ---- format versions (wire/formats.py) --------------------------------------------------


def test_a_segment_with_a_header_is_read_from_after_it(seg: Path) -> None:
    data = logrecord.encode_segment_header(formats.LOG_SEGMENT.current) + produces(1, 5, 10)
    entries, s = scan(seg, data, True)
    assert [e.lsn for e in entries] == [1, 2, 3, 4, 5]
    assert entries[0].position == logrecord.SEGMENT_HEADER_BYTES
    assert s.valid_bytes == s.file_bytes == seg.stat().st_size


def test_a_segment_without_a_header_is_format_1_and_still_read(seg: Path) -> None:
    assert 1 in formats.LOG_SEGMENT.reads
    assert [e.lsn for e in scan(seg, produces(1, 3, 10), True)[0]] == [1, 2, 3]


@pytest.mark.parametrize("version, says", [
    (formats.LOG_SEGMENT.current + 1, "newer than format"),
    (0, "no upgrade from format 0 exists yet"),
])
def test_a_segment_of_a_format_not_read_is_refused_naming_it_and_both_versions(
        seg: Path, version: int, says: str) -> None:
    with pytest.raises(FormatRefused) as info:
        scan(seg, logrecord.encode_segment_header(version) + produces(1, 3, 10), True)
    text = str(info.value)
    assert text.startswith(f"log segment {seg} has format {version}")
    assert f"format {formats.LOG_SEGMENT.current} of this shardnode" in text or \
        f"writes format {formats.LOG_SEGMENT.current}" in text
    assert says in text


@pytest.mark.parametrize("cut", [1, 3, logrecord.SEGMENT_HEADER_BYTES - 1])
def test_a_header_cut_short_is_a_torn_tail_of_the_last_segment_only(seg: Path, cut: int) -> None:
    torn = logrecord.encode_segment_header(formats.LOG_SEGMENT.current)[:cut]
    entries, s = scan(seg, torn, True)
    assert entries == [] and s.valid_bytes == 0 and s.torn_bytes == len(torn.rstrip(b"\0"))
    with pytest.raises(CorruptLog, match="header cut short"):
        scan(seg, torn, False)


def test_the_writer_appends_only_to_a_segment_of_its_own_format(tmp_path: Path) -> None:
    """An empty segment, or an older one with a header and no record, gets this node's
    header; after an older segment with records (format 1: no header; format 2: rollbacks
    without their reason) the next record starts a segment of its own, and the older one
    is left as it was."""
    current = formats.LOG_SEGMENT.current
    header = logrecord.encode_segment_header(current)
    header_2 = logrecord.encode_segment_header(2)
    empty, bare = tmp_path / segment_name(1), tmp_path / segment_name(3)
    old_1, old_2 = tmp_path / segment_name(5), tmp_path / segment_name(20)
    empty.write_bytes(b"")
    bare.write_bytes(header_2)
    old_1.write_bytes(produces(5, 1, 10))
    old_2.write_bytes(header_2 + produces(20, 1, 10))
    for path, first in ((empty, 1), (bare, 3), (old_1, 6), (old_2, 21)):
        w = wal.SegmentWriter(tmp_path, segment_bytes_max=1 << 20)
        try:
            w.open_existing(path, path.stat().st_size)
            w.append(produces(first, 1, 10), first_lsn=first)
        finally:
            w.close()
    assert empty.read_bytes() == header + produces(1, 1, 10)
    assert bare.read_bytes() == header + produces(3, 1, 10)
    assert old_1.read_bytes() == produces(5, 1, 10)
    assert (tmp_path / segment_name(6)).read_bytes() == header + produces(6, 1, 10)
    assert old_2.read_bytes() == header_2 + produces(20, 1, 10)
    assert (tmp_path / segment_name(21)).read_bytes() == header + produces(21, 1, 10)


def test_recovery_of_a_torn_header_leaves_an_empty_segment_that_gets_its_header(
        log_dir: Path) -> None:
    seg = log_dir / segment_name(1)
    seg.write_bytes(logrecord.encode_segment_header(formats.LOG_SEGMENT.current)[:5])
    rec = recover(log_dir, fresh_state())
    assert rec.torn_bytes == 5 and rec.last_segment == seg and rec.last_segment_bytes == 0
    assert seg.read_bytes() == b""


@pytest.mark.parametrize("version", [formats.SNAPSHOT.current + 1, 1])
def test_recovery_refuses_a_snapshot_of_a_format_not_read_naming_it(log_dir: Path,
                                                                     version: int) -> None:
    wal.write_snapshot(log_dir, 0, logrecord.encode_snapshot(snap(5)))  # format 2: read
    newer = {**fresh_state().snapshot(), "last_lsn": 3, "format": version}
    wal.write_snapshot(log_dir, 1, logrecord.encode_snapshot(newer))
    if version > formats.SNAPSHOT.current:  # never passed over, whatever its LSN
        with pytest.raises(FormatRefused, match=rf"snapshot {log_dir / 'checkpoint-1.snap'} "
                           rf"has format {version}, newer than format {formats.SNAPSHOT.current}"):
            recover(log_dir, fresh_state())
    else:  # an older one is only looked at when it is the newest snapshot
        assert recover(log_dir, fresh_state()).snapshot_slot == 0
        wal.write_snapshot(log_dir, 1, logrecord.encode_snapshot({**newer, "last_lsn": 9}))
        with pytest.raises(FormatRefused, match=re.escape(
                "has format 1, older than any this shardnode reads (2, 3, 4; it writes "
                "format 4): no upgrade from format 1 exists yet")):
            recover(log_dir, fresh_state())


# ---- snapshot slots ---------------------------------------------------------------------


def snap(last_lsn: int, producers: int = 0) -> dict[str, Any]:
    return {"format": 2, "last_lsn": last_lsn, "catalog_lsn": 1, "next_topic_id": 2,
            "topics": [[1, "t", 1]], "next_offset": [[1, 0, last_lsn]],
            "producers": [[p, 9, {8: msgpack.packb([last_lsn, [[0, 1, 1]]])}]
                          for p in range(producers)]}


def test_snapshot_slots_are_overwritten_in_place_and_the_newest_valid_one_wins(
        tmp_path: Path) -> None:
    assert wal.load_snapshot(tmp_path) == (None, None)
    wal.write_snapshot(tmp_path, 0, logrecord.encode_snapshot(snap(10, producers=100)))
    wal.write_snapshot(tmp_path, 1, logrecord.encode_snapshot(snap(20)))
    slot0 = tmp_path / wal.SNAPSHOT_SLOTS[0]
    size = slot0.stat().st_size
    assert size % wal.SNAPSHOT_GROW_BYTES == 0
    wal.write_snapshot(tmp_path, 0, logrecord.encode_snapshot(snap(30)))  # smaller: same size
    assert slot0.stat().st_size == size
    assert wal.load_snapshot(tmp_path) == (snap(30), 0)
    # A write cut short spoils its slot only: the other one is used.
    data = bytearray(slot0.read_bytes())
    data[40] ^= 0xFF
    slot0.write_bytes(bytes(data))
    assert wal.load_snapshot(tmp_path) == (snap(20), 1)
    # Both spoiled: the log cannot be trusted.
    slot1 = tmp_path / wal.SNAPSHOT_SLOTS[1]
    slot1.write_bytes(b"\0" * 100)
    with pytest.raises(CorruptLog, match="snapshot") as info:
        wal.load_snapshot(tmp_path)
    assert info.value.segment in (slot0, slot1)


# ---- recovery ---------------------------------------------------------------------------


@pytest.fixture
def log_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "log"
    d.mkdir()
    yield d


def fresh_state() -> LogState:
    return LogState(load_config(overrides={"log": {"producers_max": 10, "producer_window_max": 4}}))


def write_log(log_dir: Path, segments: list[tuple[int, bytes]]) -> None:
    for first, data in segments:
        (log_dir / segment_name(first)).write_bytes(data)


@pytest.mark.parametrize("chunk_bytes", [100, 4096, SCAN_CHUNK_BYTES])
def test_recovery_replays_every_segment_and_cuts_a_torn_tail(log_dir: Path,
                                                             chunk_bytes: int) -> None:
    create = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])
    last = produces(12, 5, 3000)
    torn = produces(17, 1, 3000)[:2000]
    write_log(log_dir, [(1, create + produces(2, 10, 3000)), (12, last + torn)])
    state = fresh_state()
    rec = recover(log_dir, state, chunk_bytes)
    assert state.last_lsn == 16
    assert state.next_offset == {(1, 0): 17}
    assert rec.torn_bytes == len(torn)
    assert rec.last_segment == log_dir / segment_name(12)
    assert rec.last_segment_bytes == len(last)
    assert rec.last_segment.stat().st_size == len(last)  # cut off on disk
    assert rec.replayed_bytes == len(create) + len(produces(2, 10, 3000)) + len(last)
    assert rec.snapshot_slot is None


def test_recovery_starts_after_the_snapshot(log_dir: Path) -> None:
    state = fresh_state()
    state.replay(Entry(0, 1, Kind.TOPIC_CREATE, msgpack.packb([1, "t", 1])))
    for lsn in range(2, 6):
        state.replay(Entry(0, lsn, Kind.PRODUCE, msgpack.packb([7, lsn, 0, [[1, 0, lsn, 1, b""]]])))
    wal.write_snapshot(log_dir, 1, logrecord.encode_snapshot(state.snapshot()))
    create = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])
    write_log(log_dir, [(1, create + produces(2, 8, 10))])  # 2-5 are in the snapshot
    again = fresh_state()
    rec = recover(log_dir, again)
    assert rec.snapshot_slot == 1 and again.last_lsn == 9
    assert rec.replayed_bytes == len(produces(6, 4, 10))


def test_recovery_refuses_a_snapshot_of_another_format(log_dir: Path) -> None:
    snap = {**fresh_state().snapshot(), "format": 99}
    wal.write_snapshot(log_dir, 0, logrecord.encode_snapshot(snap))
    with pytest.raises(FormatRefused, match=r"checkpoint-0.snap has format 99, newer than "
                                            r"format 4 of this shardnode \(which reads 2, 3, 4\)"):
        recover(log_dir, fresh_state())


def test_recovery_refuses_a_log_with_records_missing(log_dir: Path) -> None:
    write_log(log_dir, [(1, produces(1, 3, 10)), (5, produces(5, 3, 10))])
    with pytest.raises(CorruptLog, match="LSN 5 follows 3"):
        recover(log_dir, fresh_state())


@pytest.mark.parametrize("cut", [b"", bytes(wal.SNAPSHOT_GROW_BYTES)])
def test_a_first_snapshot_cut_short_is_rebuilt_from_a_log_that_starts_at_lsn_1(
        log_dir: Path, cut: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """A kill between the snapshot file's creation and its fdatasync leaves it empty or
    zeros; nothing was truncated yet, so the segments hold everything."""
    create = encode(1, Kind.TOPIC_CREATE, [1, "t", 1])
    write_log(log_dir, [(1, create + produces(2, 8, 10))])
    whole = fresh_state()
    recover(log_dir, whole)
    (log_dir / wal.SNAPSHOT_SLOTS[0]).write_bytes(cut)
    state = fresh_state()
    rec = recover(log_dir, state)
    assert state.last_lsn == 9 and state.snapshot() == whole.snapshot()
    assert rec.snapshot_slot is None  # the next checkpoint writes slot 0 again
    assert "rebuilt from them" in caplog.text


def snapshot_at(log_dir: Path, slot: int, lsns: int) -> None:
    """A snapshot in ``slot`` of topic t and produces up to LSN ``lsns``."""
    state = fresh_state()
    state.replay(Entry(0, 1, Kind.TOPIC_CREATE, msgpack.packb([1, "t", 1])))
    for lsn in range(2, lsns + 1):
        state.replay(Entry(0, lsn, Kind.PRODUCE, msgpack.packb([7, lsn, 0, [[1, 0, lsn, 1, b""]]])))
    wal.write_snapshot(log_dir, slot, logrecord.encode_snapshot(state.snapshot()))


def spoil(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupt_snapshot_the_log_needs_is_refused_as_a_snapshot(log_dir: Path) -> None:
    snapshot_at(log_dir, 0, 5)
    write_log(log_dir, [(6, produces(6, 3, 10))])  # 1-5 were truncated: only in the snapshot
    spoil(log_dir / wal.SNAPSHOT_SLOTS[0])
    with pytest.raises(CorruptSnapshot) as info:
        recover(log_dir, fresh_state())
    text = str(info.value)
    assert text.startswith(f"snapshot {log_dir / wal.SNAPSHOT_SLOTS[0]} is corrupt (")
    assert "segments start at LSN 6" in text and "restore the data directory" in text
    assert "log segment" not in text and "aside" not in text


def test_a_corrupt_newer_snapshot_is_named_when_the_older_one_ends_before_the_log(
        log_dir: Path) -> None:
    snapshot_at(log_dir, 0, 3)
    snapshot_at(log_dir, 1, 5)  # durable, then segments up to 5 deleted
    write_log(log_dir, [(6, produces(6, 3, 10))])
    spoil(log_dir / wal.SNAPSHOT_SLOTS[1])
    with pytest.raises(CorruptSnapshot, match=r"checkpoint-1\.snap is corrupt"):
        recover(log_dir, fresh_state())
    # While the segments still reach back to the older one, the newer one's write was cut
    # short, and the older one is used.
    write_log(log_dir, [(4, produces(4, 2, 10))])
    state = fresh_state()
    assert recover(log_dir, state).snapshot_slot == 0 and state.last_lsn == 8


def test_a_corrupt_snapshot_with_no_segment_left_is_refused(log_dir: Path) -> None:
    snapshot_at(log_dir, 0, 5)
    spoil(log_dir / wal.SNAPSHOT_SLOTS[0])
    with pytest.raises(CorruptSnapshot, match="no log segment is left"):
        recover(log_dir, fresh_state())


def test_recovery_refuses_damage_in_a_segment_that_is_not_the_last(log_dir: Path) -> None:
    write_log(log_dir, [(1, produces(1, 3, 10)[:-5]), (4, produces(4, 3, 10))])
    with pytest.raises(CorruptLog, match="not the last"):
        recover(log_dir, fresh_state())
    assert (log_dir / segment_name(1)).stat().st_size == len(produces(1, 3, 10)) - 5


def test_recovery_holds_about_a_chunk_whatever_the_segment_size(log_dir: Path) -> None:
    write_log(log_dir, [(1, produces(1, 400, 20_000)), (401, produces(401, 400, 20_000))])
    state = fresh_state()
    assert peak_bytes(lambda: recover(log_dir, state, chunk_bytes=64 * 1024)) < 500_000
    assert state.last_lsn == 800


@pytest.mark.parametrize("sizes", [
    [10], [10] * 50,  # small: joined and written at once
    [300_000], [200_000, 5, 100_000], [300] * 3000,  # writev, over IOV_PIECES_MAX pieces
])
@pytest.mark.parametrize("limit", [None, 7_777])
def test_pieces_are_written_whole_and_in_order(tmp_path: Path, sizes: list[int],
                                               limit: int | None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``write_pieces``, at an offset, also when pwritev writes less than it was given
    (``limit`` bytes a call at most, as a real one may): what was not written is written
    next, where it belongs."""
    if limit is not None:
        real = os.pwritev
        calls = []

        def short_pwritev(fd: int, buffers: Any, offset: int) -> int:
            calls.append(len(buffers))
            return real(fd, [b"".join(bytes(b) for b in buffers)[:limit]], offset)
        monkeypatch.setattr(os, "pwritev", short_pwritev)
    pieces = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    path = tmp_path / "out"
    head = b"H" * 100  # the pieces go after it, and over the zeros after them
    path.write_bytes(head + bytes(sum(sizes) + 50))
    fd = os.open(path, os.O_WRONLY)
    try:
        wal.write_pieces(fd, pieces, sum(sizes), len(head))
    finally:
        os.close(fd)
    assert path.read_bytes() == head + b"".join(pieces) + bytes(50)
    if limit is not None and sum(sizes) >= wal.WRITEV_BYTES_MIN and len(pieces) > 1:
        assert len(calls) > 1 and max(calls) <= wal.IOV_PIECES_MAX
