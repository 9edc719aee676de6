"""Unit tests of the cache manager's logic (``actors.cache_state.CacheState``): no I/O."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from actors import instructions
from actors.cache_state import ENTRY_OVERHEAD_BYTES, CacheState
from actors.log_state import LogState
from config import load_config
from wire import logrecord
from wire.logrecord import Kind
from wire.messages import Ack, Append, CreateTopic, DeleteTopic, LogRequest
from wire.records import Record, pack_batch

NOW = 1_700_000_000_000


def norm(rows: list[Any] | None) -> list[Any] | None:
    """Rows with tags as lists, so tuples and lists compare equal."""
    if rows is None:
        return None
    return [[o, ts, k, list(tags), v] for o, ts, k, tags, v in rows]


class Log:
    """A LogState that hands out the bytes of each group it logged, like the log manager."""

    def __init__(self) -> None:
        self.state = LogState(load_config(overrides={"log": {"producers_max": 100, "producer_window_max": 100}}))
        self.group = bytearray()
        self.seq = 0
        self.model: dict[tuple[int, int], list[list[Any]]] = {}  # expected rows per shard

    def admit(self, msg: LogRequest, now_ms: int = NOW) -> instructions.Log:
        out = self.state.admit(msg, now_ms)
        assert isinstance(out, instructions.Log), out
        self.group += out.record
        return out

    def create(self, name: str, partitions: int) -> int:
        self.admit(CreateTopic(0, name, partitions))
        tid = self.state.topics[name].topic_id
        for p in range(partitions):
            self.model[(tid, p)] = []
        return tid

    def produce(self, tid: int, partition: int, records: list[Record | bytes],
                now_ms: int = NOW) -> int:
        """Log one batch; returns its first offset and extends the expected rows."""
        self.seq += 1
        out = self.admit(Append(self.seq, 1, self.seq,
                                [(tid, partition, len(records), pack_batch(records))]), now_ms)
        assert isinstance(out.reply, Ack), out.reply
        first = out.reply.parts[0][1]
        rows = self.model[(tid, partition)]
        assert len(rows) == first
        for i, r in enumerate(records):
            if isinstance(r, bytes):
                rows.append([first + i, now_ms, None, [], r])
            else:
                ts = now_ms if r.timestamp is None else r.timestamp
                rows.append([first + i, ts, r.key, list(r.tags), r.value])
        return first

    def flush_to(self, cache: CacheState) -> None:
        """Hand the group written so far to the cache, as one LogGroup would."""
        cache.add_group(self.state.last_lsn, bytes(self.group))
        self.group = bytearray()


def hit(cache: CacheState, shard: tuple[int, int], offset: int, max_records: int) -> list[Any]:
    """The rows of a read the cache must answer (a miss fails the test)."""
    rows = cache.read(shard, offset, max_records)
    assert rows is not None, f"a miss at {shard} offset {offset}"
    return rows


def blob_group(lsn: int, tid: int, partition: int, first: int, values: list[bytes],
               ts: int = NOW) -> bytes:
    """A PRODUCE record made directly with the log format (any first offset)."""
    body = [1, lsn, ts, [[tid, partition, first, len(values), pack_batch(values)]]]
    return logrecord.encode(lsn, Kind.PRODUCE, body)


# ---- reads that hit ---------------------------------------------------------------------------


def test_a_read_returns_rows_with_per_record_timestamps_or_the_batch_timestamp() -> None:
    log = Log()
    tid = log.create("t", 2)
    log.produce(tid, 1, [
        b"plain",
        Record(b"with-key", key=b"k1"),
        Record(b"tagged", tags=("red", "blue"), timestamp=NOW - 5000),
        Record(b"ts-only", timestamp=42),
        Record(b"", key=b"", tags=("e",)),
    ], now_ms=NOW + 7)
    cache = CacheState(bytes_max=1 << 20)
    log.flush_to(cache)
    rows = hit(cache, (tid, 1), 0, 100)
    assert norm(rows) == log.model[(tid, 1)]
    # Spelled out for the timestamps: the batch's for records without one, else their own.
    assert [r[1] for r in rows] == [NOW + 7, NOW + 7, NOW - 5000, 42, NOW + 7]
    assert cache.hits == 1 and cache.misses == 0


def test_reads_start_anywhere_and_stop_at_max_records() -> None:
    log = Log()
    tid = log.create("t", 1)
    log.produce(tid, 0, [f"v{i}".encode() for i in range(10)])
    cache = CacheState(bytes_max=1 << 20)
    log.flush_to(cache)
    expected = log.model[(tid, 0)]
    for offset in range(10):
        for max_records in (1, 3, 10, 50):
            assert norm(cache.read((tid, 0), offset, max_records)) == \
                expected[offset:offset + max_records]


def test_reads_span_several_batches_and_groups() -> None:
    log = Log()
    tid = log.create("t", 2)
    cache = CacheState(bytes_max=1 << 20)
    sizes = [3, 1, 4, 1, 5]
    for i, n in enumerate(sizes):
        log.produce(tid, 0, [Record(f"b{i}r{j}".encode(), key=f"k{j}".encode(),
                                    timestamp=None if j % 2 else NOW + j)
                             for j in range(n)], now_ms=NOW + 1000 * i)
        log.produce(tid, 1, [b"other"])  # interleaved: another shard's batches
        if i % 2:
            log.flush_to(cache)  # some groups hold two batches of the shard, some one
    log.flush_to(cache)
    expected = log.model[(tid, 0)]
    assert len(expected) == sum(sizes)
    assert norm(cache.read((tid, 0), 0, 1000)) == expected
    assert norm(cache.read((tid, 0), 2, 6)) == expected[2:8]
    assert norm(cache.read((tid, 0), 5, 1000)) == expected[5:]
    assert norm(cache.read((tid, 1), 0, 1000)) == log.model[(tid, 1)]


def test_an_offset_at_or_after_the_end_reads_empty() -> None:
    log = Log()
    tid = log.create("t", 1)
    log.produce(tid, 0, [b"a", b"b", b"c"])
    cache = CacheState(bytes_max=1 << 20)
    log.flush_to(cache)
    for offset in (3, 4, 10**12):
        assert cache.read((tid, 0), offset, 10) == []
    assert cache.misses == 0


# ---- misses ------------------------------------------------------------------------------------


def test_a_shard_never_seen_is_a_miss() -> None:
    log = Log()
    tid = log.create("t", 2)
    log.produce(tid, 0, [b"a"])
    cache = CacheState(bytes_max=1 << 20)
    log.flush_to(cache)
    assert cache.read((tid, 1), 0, 10) is None
    assert cache.read((tid + 5, 0), 0, 10) is None
    assert cache.misses == 2


def test_offsets_before_what_the_cache_saw_are_misses() -> None:
    # The cache started mid-stream: it saw offsets 10..14 only.
    cache = CacheState(bytes_max=1 << 20)
    cache.add_group(7, blob_group(7, 1, 0, 10, [b"a", b"b", b"c", b"d", b"e"]))
    for offset in (0, 9):
        assert cache.read((1, 0), offset, 10) is None
    assert [r[0] for r in hit(cache, (1, 0), 10, 10)] == [10, 11, 12, 13, 14]


def test_a_read_stops_at_a_hole_and_a_hole_is_a_miss() -> None:
    cache = CacheState(bytes_max=1 << 20)
    cache.add_group(1, blob_group(1, 1, 0, 0, [b"0", b"1", b"2"]))
    cache.add_group(3, blob_group(3, 1, 0, 6, [b"6", b"7"]))  # offsets 3..5 never seen
    assert [r[0] for r in hit(cache, (1, 0), 1, 100)] == [1, 2]
    for offset in (3, 4, 5):
        assert cache.read((1, 0), offset, 100) is None
    assert [r[4] for r in hit(cache, (1, 0), 6, 100)] == [b"6", b"7"]
    assert cache.read((1, 0), 8, 100) == []


# ---- eviction ----------------------------------------------------------------------------------


def _cost(values: list[bytes]) -> int:
    return len(pack_batch(values)) + ENTRY_OVERHEAD_BYTES


def test_eviction_keeps_bytes_within_the_limit_and_drops_the_oldest() -> None:
    values = [b"x" * 100] * 4
    cost = _cost(values)
    cache = CacheState(bytes_max=3 * cost)
    for i in range(6):
        cache.add_group(i + 1, blob_group(i + 1, 1, 0, 4 * i, values))
        assert cache.bytes <= cache.bytes_max
    assert cache.bytes == 3 * cost
    assert cache.evictions == 3
    for i in range(3):
        assert cache.read((1, 0), 4 * i, 4) is None, i
    for i in range(3, 6):
        assert [r[0] for r in hit(cache, (1, 0), 4 * i, 4)] == list(range(4 * i, 4 * i + 4))


def test_an_entry_that_was_read_gets_a_second_chance() -> None:
    values = [b"y" * 64] * 2
    cost = _cost(values)
    cache = CacheState(bytes_max=2 * cost)
    cache.add_group(1, blob_group(1, 1, 0, 0, values))  # A
    assert cache.read((1, 0), 0, 10) is not None  # A is read once ...
    cache.add_group(2, blob_group(2, 1, 0, 2, values))  # B: ... and then B arrives
    cache.add_group(3, blob_group(3, 1, 0, 4, values))  # C: one of A, B must go
    assert cache.bytes <= cache.bytes_max
    # A was accessed before B arrived, so pure LRU would drop A; A has a hit, B has none.
    assert cache.read((1, 0), 2, 10) is None
    assert [r[0] for r in hit(cache, (1, 0), 0, 2)] == [0, 1]
    assert [r[0] for r in hit(cache, (1, 0), 4, 10)] == [4, 5]


def test_an_entry_larger_than_the_cache_is_not_kept() -> None:
    cache = CacheState(bytes_max=1000)
    cache.add_group(1, blob_group(1, 1, 0, 0, [b"z" * 2000]))
    assert cache.bytes <= cache.bytes_max
    assert cache.read((1, 0), 0, 10) is None


def test_bytes_always_within_the_limit_under_mixed_reads() -> None:
    values = [b"w" * 50] * 3
    cache = CacheState(bytes_max=5 * _cost(values) + 17)
    for i in range(40):
        cache.add_group(i + 1, blob_group(i + 1, 1 + i % 2, 0, 3 * (i // 2), values))
        cache.read((1 + (i * 7) % 2, 0), 3 * ((i * 5) % (i // 2 + 1)), 5)
        assert cache.bytes <= cache.bytes_max, i
        assert cache.bytes == sum(len(e.blob) + ENTRY_OVERHEAD_BYTES
                                  for e in cache.entries.values())


# ---- forgetting ---------------------------------------------------------------------------------


def _two_topics() -> tuple[Log, CacheState, int, int]:
    log = Log()
    a = log.create("a", 2)
    b = log.create("b", 1)
    for p in (0, 1):
        log.produce(a, p, [b"a1", b"a2"])
    log.produce(b, 0, [b"b1"])
    cache = CacheState(bytes_max=1 << 20)
    log.flush_to(cache)
    return log, cache, a, b


def test_drop_topic_forgets_only_that_topic() -> None:
    log, cache, a, b = _two_topics()
    b_bytes = _cost([b"b1"])
    cache.drop_topic(a)
    assert cache.bytes == b_bytes
    assert cache.read((a, 0), 0, 10) is None and cache.read((a, 1), 0, 10) is None
    assert norm(cache.read((b, 0), 0, 10)) == log.model[(b, 0)]


def test_keep_topics_drops_the_others() -> None:
    log, cache, a, b = _two_topics()
    cache.keep_topics({b, 999})
    assert cache.read((a, 0), 0, 10) is None
    assert norm(cache.read((b, 0), 0, 10)) == log.model[(b, 0)]
    cache.keep_topics(set())
    assert cache.read((b, 0), 0, 10) is None
    assert cache.bytes == 0 and not cache.entries


def test_clear_forgets_everything() -> None:
    _log, cache, a, b = _two_topics()
    cache.clear()
    assert cache.bytes == 0 and not cache.entries
    for shard in ((a, 0), (a, 1), (b, 0)):
        assert cache.read(shard, 0, 10) is None
        assert cache.read(shard, 5, 10) is None  # the end is forgotten too


def test_a_logged_topic_delete_drops_the_topic() -> None:
    log, cache, a, b = _two_topics()
    log.admit(DeleteTopic(0, "a"))
    log.flush_to(cache)
    assert cache.read((a, 0), 0, 10) is None
    assert cache.bytes == _cost([b"b1"])
    assert norm(cache.read((b, 0), 0, 10)) == log.model[(b, 0)]


def test_seen_lsn_follows_the_groups() -> None:
    log = Log()
    tid = log.create("t", 1)
    cache = CacheState(bytes_max=1 << 20)
    assert cache.seen_lsn == 0
    log.flush_to(cache)
    assert cache.seen_lsn == log.state.last_lsn
    log.produce(tid, 0, [b"a"])
    log.produce(tid, 0, [b"b"])
    log.flush_to(cache)
    assert cache.seen_lsn == log.state.last_lsn == 3


@pytest.mark.parametrize("max_records", [1, 2])
def test_rows_are_plain_values(max_records: int) -> None:
    log = Log()
    tid = log.create("t", 1)
    log.produce(tid, 0, [Record(b"v", key=b"k", tags=("t",), timestamp=9), b"w"])
    cache = CacheState(bytes_max=1 << 20)
    log.flush_to(cache)
    rows = cache.read((tid, 0), 0, max_records)
    # Rows go straight into a read reply: they must pack and unpack to the same values.
    back = msgpack.unpackb(msgpack.packb(rows, use_bin_type=True), raw=False)
    assert back == log.model[(tid, 0)][:max_records]


# ---- the byte bound on the data path (actors.flow.GroupsInFlight) ---------------------------


def test_groups_in_flight_bound_bytes_until_the_receiver_reports_them_applied() -> None:
    from actors.flow import GroupsInFlight

    flow = GroupsInFlight(bytes_max=100)
    assert flow.admits(60)
    flow.sent(last_lsn=5, size=60)
    assert flow.admits(40)
    flow.sent(last_lsn=9, size=40)
    assert not flow.admits(1)
    assert flow.applied(4) == 0  # nothing whole yet
    assert flow.bytes == 100
    assert flow.applied(7) == 0
    assert flow.bytes == 40 and flow.admits(60) and not flow.admits(61)
    assert flow.applied(1000) == 0  # caught up from the log: beyond what was sent
    assert flow.bytes == 0 and not flow.groups


def test_one_group_always_goes_when_nothing_is_in_flight() -> None:
    from actors.flow import GroupsInFlight

    flow = GroupsInFlight(bytes_max=10)
    assert flow.admits(500)
    flow.sent(1, 500)
    assert not flow.admits(1)


def test_skipped_groups_are_announced_once_nothing_after_them_is_in_flight() -> None:
    from actors.flow import GroupsInFlight

    flow = GroupsInFlight(bytes_max=100)
    flow.sent(5, 100)
    flow.skip(6)
    flow.skip(8)
    assert flow.skipped == 2
    assert flow.applied(5) == 8  # the receiver has 5, and nothing more is coming: tell it
    assert flow.applied(5) == 0  # told once
    # A group sent after the skipped ones shows the receiver the gap by itself.
    flow.skip(9)
    flow.sent(12, 10)
    assert flow.applied(4) == 0
    assert flow.applied(12) == 0 and flow.skipped_upto == 0
    # The receiver caught up past the skipped ones on its own: nothing to say.
    flow.skip(20)
    assert flow.applied(25) == 0


def test_a_restarted_receiver_starts_with_nothing_in_flight() -> None:
    from actors.flow import GroupsInFlight

    flow = GroupsInFlight(bytes_max=100)
    flow.sent(5, 100)
    flow.skip(6)
    flow.reset()
    assert flow.bytes == 0 and flow.admits(100) and flow.applied(0) == 0


def test_progress_is_reported_by_bytes_or_by_time_not_per_group() -> None:
    from actors.flow import ProgressReport

    p = ProgressReport(bytes_min=1000, interval_s=0.025)
    assert p.due(5, now=10.0)  # the first group after a quiet spell is reported at once
    p.sent(5, now=10.0)
    p.applied(400)
    assert not p.due(9, now=10.01)  # a small group soon after waits
    p.applied(600)
    assert p.due(9, now=10.01)  # ... until the bytes add up
    p.sent(9, now=10.01)
    p.applied(10)
    assert not p.due(10, now=10.03)
    assert p.due(10, now=10.036)  # ... or the interval passes
    p.sent(10, now=10.036)
    p.applied(5000)
    assert not p.due(10, now=99.0)  # nothing new applied: nothing to say


def test_starts_drop_the_front_lazily_and_still_find_every_offset() -> None:
    from actors.cache_state import STARTS_COMPACT_MIN, Starts

    s = Starts()
    n = 4 * STARTS_COMPACT_MIN
    for first in range(0, 2 * n, 2):  # entries of two records each: 0, 2, 4, ...
        s.add(first)
    s.remove(7)  # not a start: nothing happens
    assert len(s) == n
    s.remove(20)  # from the middle
    assert len(s) == n - 1 and 20 not in s.offsets
    for first in range(0, 2 * STARTS_COMPACT_MIN - 2, 2):  # from the front, one by one
        s.remove(first)
    assert s.head == STARTS_COMPACT_MIN - 1 - 1  # the removed 20 was among them
    assert s.last_at_or_before(0) == -1  # gone from the front
    i = s.last_at_or_before(2 * STARTS_COMPACT_MIN + 1)
    assert s.offsets[i] == 2 * STARTS_COMPACT_MIN
    for first in range(2 * STARTS_COMPACT_MIN - 2, n, 2):  # up to half of the list ...
        s.remove(first)
    assert s.head == len(s.offsets) // 2  # ... still kept
    s.remove(n)  # past half: compacted
    assert s.head == 0 and len(s.offsets) == len(s) == n - 1 - n // 2
    assert s.offsets[0] == n + 2 and s.last_at_or_before(n + 3) == 0
    assert s.last_at_or_before(n + 1) == -1 and s.offsets[-1] == 2 * n - 2


def test_a_full_cache_keeps_reading_what_it_holds_while_evicting() -> None:
    blob = pack_batch([b"v"])
    cache = CacheState(bytes_max=3000 * (len(blob) + ENTRY_OVERHEAD_BYTES))
    from actors.cache_state import Entry

    for first in range(10_000):
        cache._add((1, 0), Entry(first, 1, 0, blob))
    assert len(cache.entries) == 3000
    assert cache.read((1, 0), 6999, 10) is None  # evicted
    rows = cache.read((1, 0), 7000, 10)
    assert rows is not None and [r[0] for r in rows] == list(range(7000, 7010))
