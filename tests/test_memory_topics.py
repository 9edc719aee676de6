"""Memory topics' records at the front door, without processes (actors/memory_topics.py)."""

from __future__ import annotations

import random
import sys
import tracemalloc
from typing import TYPE_CHECKING, Any

import msgpack
import pytest

from actors.memory_topics import (
    PLACEMENT_BYTES,
    RECORD_OVERHEAD_BYTES,
    RETRIES_BUDGET_SHARE,
    RETRY_OVERHEAD_BYTES,
    MemoryTopics,
    OutOfRange,
    Partition,
)
from node.client import Record
from wire.errors import NodeError, OffsetOutOfRange

if TYPE_CHECKING:
    from tests.conftest import MakeNode


def test_records_get_offsets_and_read_back_by_offset_key_tag_and_time() -> None:
    m = MemoryTopics(1 << 20)
    placed = m.append(7, 1, [(3, 0, [b"a", [b"b", b"k", ["red"], 50], [b"c", b"k", [], None]])],
                      now_ms=100)
    assert placed == [[0, 0, 3]]
    assert m.append(7, 2, [(3, 0, [b"d"])], now_ms=200) == [[0, 3, 1]]
    assert [r[4] for r in m.read(3, 0, 1, 10, 1 << 20)] == [b"b", b"c", b"d"]
    assert m.read(3, 0, 1, 10, 1 << 20)[0] == [1, 50, b"k", ["red"], b"b"]
    assert m.read_by_key(3, 0, b"k")[0][4] == b"c"  # the latest with the key
    assert m.read_by_key(3, 0, b"none") == []
    assert [r[0] for r in m.read_by_tag(3, 0, "red", 0, 10, 1 << 20)] == [1]
    assert m.offset_for_timestamp(3, 0, 100) == 0  # running max: 100 at offset 0
    assert m.offset_for_timestamp(3, 0, 150) == 3
    assert m.offset_for_timestamp(3, 0, 201) is None
    assert m.end_offset(3, 0) == 4 and m.end_offset(3, 1) == 0
    assert m.read(3, 5, 0, 10, 1 << 20) == []  # a partition never written


def test_a_retry_is_answered_with_the_first_placement() -> None:
    m = MemoryTopics(1 << 20)
    first = m.append(9, 0, [(3, 0, [b"a", b"b"])], now_ms=1)
    assert m.seen(9, 0) == first
    assert m.seen(9, 1) is None and m.seen(0, 0) is None  # producer 0: never remembered


def test_over_the_budget_the_oldest_of_the_largest_partition_go_and_reads_below_say_so() -> None:
    each = RECORD_OVERHEAD_BYTES + 10
    m = MemoryTopics(10 * each)
    # Producer id 0: no retry is remembered, and only records count.
    m.append(0, 0, [(3, 0, [b"x" * 10] * 8), (3, 1, [b"y" * 10] * 2)], now_ms=1)
    m.append(0, 1, [(3, 1, [b"y" * 10] * 2)], now_ms=2)
    assert m.bytes <= m.bytes_max
    assert m.end_offset(3, 0) == 8 and m.evicted == 2
    with pytest.raises(OutOfRange) as info:
        m.read(3, 0, 0, 10, 1 << 20)
    assert info.value.earliest == 2
    assert [r[0] for r in m.read(3, 0, 2, 10, 1 << 20)] == list(range(2, 8))
    assert len(m.read(3, 1, 0, 10, 1 << 20)) == 4  # the smaller partition kept whole


def test_reads_stop_at_their_byte_bound_but_return_one_row() -> None:
    m = MemoryTopics(1 << 20)
    m.append(1, 0, [(3, 0, [b"x" * 1000] * 5)], now_ms=1)
    assert len(m.read(3, 0, 0, 10, 1)) == 1
    assert len(m.read(3, 0, 0, 10, 2500)) == 3


def test_a_deleted_topic_frees_its_bytes() -> None:
    m = MemoryTopics(1 << 20)
    m.append(1, 0, [(3, 0, [b"x"]), (4, 0, [b"y"])], now_ms=1)
    m.drop(3)
    assert m.end_offset(3, 0) == 0 and m.end_offset(4, 0) == 1
    assert m.bytes == RECORD_OVERHEAD_BYTES + 1 + m.retries_bytes  # producer 1's retry


def held_by_retries(m: MemoryTopics) -> int:
    """What the retry table holds, object by object (``sys.getsizeof``)."""
    def size(x: object) -> int:
        return sys.getsizeof(x) + (sum(size(i) for i in x) if isinstance(x, (list, tuple))
                                   else 0)
    return sys.getsizeof(m.retries) + sum(size(k) + size(v) for k, v in m.retries.items())


def keyed_produce(m: MemoryTopics, i: int, partitions: int) -> list[list[int]]:
    """A keyed produce split over every partition, a record each, as the audit sent."""
    return m.append((1 << 61) + i, i, [(3, p, [[b"v%d" % i, b"k%d" % p, [], None]])
                                       for p in range(partitions)], now_ms=1)


def test_retries_are_counted_in_the_budget_and_held_to_a_share_of_it() -> None:
    """6000 keyed produces over 512 partitions left 644 MB at the front door for a 64 MiB
    budget: each remembered retry took 88 KB outside it (65 536 of them: 5.8 GB)."""
    m = MemoryTopics(4 << 20)
    placed = [keyed_produce(m, i, 512) for i in range(300)]
    share = m.bytes_max // RETRIES_BUDGET_SHARE
    assert m.bytes <= m.bytes_max
    assert held_by_retries(m) <= 1.15 * share, (held_by_retries(m), share)
    assert m.retries_bytes <= share and len(m.retries) >= share // (RETRY_OVERHEAD_BYTES
                                                                    + 512 * PLACEMENT_BYTES)
    assert m.seen((1 << 61) + 299, 299) == placed[299]  # the latest are answered again
    assert m.seen(1 << 61, 0) is None  # the oldest are forgotten
    assert m.bytes == m.retries_bytes + sum(x.bytes for x in m.parts.values())


@pytest.mark.parametrize("partitions", [1, 8, 512])
def test_the_bytes_a_retry_counts_are_what_it_takes(partitions: int) -> None:
    """The share bounds memory only if a retry's count is its real cost (tracemalloc)."""
    m = MemoryTopics(1 << 40)
    n = 4000 // partitions + 50
    placements = [[[p, 10**6 + i, 1] for p in range(partitions)] for i in range(n)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, placed in enumerate(placements):
            m._remember((random.getrandbits(62), 10**6 + i), placed)
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.85 <= taken / m.retries_bytes <= 1.15, (taken / n, m.retries_bytes / n)


@pytest.mark.parametrize("shape", ["bare", "keyed", "tagged"])
def test_the_bytes_a_record_counts_are_what_it_takes(shape: str) -> None:
    """``memory_bytes_max`` bounds memory only if a record's count is its real cost: its
    batch decoded as the front door decodes it, kept, and the batch dropped."""
    m = MemoryTopics(1 << 40)
    shapes: dict[str, list[Any]] = {
        "bare": [bytes([i % 256]) * 10 for i in range(100)],
        "keyed": [[b"v" * 10, b"k%07d" % i, [], None] for i in range(100)],
        "tagged": [[b"v" * 10, b"k%07d" % i, ["red", "blue"], 5] for i in range(100)],
    }
    records = shapes[shape]
    blob = msgpack.packb(records)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(100):
            m.append(0, 0, [(1, i % 4, msgpack.unpackb(blob, raw=False))], now_ms=10**12 + i)
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.85 <= taken / m.bytes <= 1.15, (taken / 10_000, m.bytes / 10_000)


class Scanned(dict[tuple[int, int], Partition]):
    """Partitions that count how many of them are visited by scans of the whole table."""

    visits = 0

    def values(self) -> Any:
        self.visits += len(self)
        return super().values()

    def items(self) -> Any:
        self.visits += len(self)
        return super().items()


def test_eviction_does_not_visit_every_partition_for_each_record() -> None:
    """It did: 6000 keyed produces over 512 partitions took 161 s."""
    m = MemoryTopics(256 << 10)
    m.parts = Scanned()
    records = 0
    for i in range(200):
        keyed_produce(m, i, 512)
        records += 512
    assert m.evicted > records // 2 and m.bytes <= m.bytes_max
    assert m.parts.visits <= 4 * records, (m.parts.visits, records)


def test_the_largest_partition_loses_its_oldest_first_as_a_scan_would_choose() -> None:
    """The heap of partitions by bytes evicts what a scan of them all for the largest (the
    lowest partition of those tied) does, record by record."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    m = MemoryTopics(20_000)
    sizes: dict[tuple[int, int], list[int]] = {}  # the scan's model: each partition's rows
    for i in range(3000):
        p = rng.randrange(16)
        value = b"x" * rng.randrange(1, 300)
        m.append(0, 0, [(3, p, [value])], now_ms=i)
        sizes.setdefault((3, p), []).append(RECORD_OVERHEAD_BYTES + len(value))
        while sum(map(sum, sizes.values())) > m.bytes_max:
            k = min(sizes, key=lambda k: (-sum(sizes[k]), k))
            del sizes[k][0]
        assert {k: x.next - x.first for k, x in m.parts.items()} == {
            k: len(v) for k, v in sizes.items()}, f"seed {seed}, step {i}"
        assert m.bytes <= m.bytes_max


# ---- on a real node --------------------------------------------------------------------


def test_a_memory_topic_on_a_node_is_served_from_memory_and_empty_after_a_restart(
        make_node: MakeNode) -> None:
    n = make_node("[storage]\nmemory_bytes_max = 200000\n")
    with n.client() as c:
        c.create_topic("fast", partitions=2, storage="memory")
        c.create_topic("slow", partitions=1)
        assert {(t.name, t.storage) for t in c.list_topics()} == {("fast", "memory"),
                                                                 ("slow", "rocksdb")}
        placed = c.produce_batch("fast", [Record(b"v%d" % i, key=b"k%d" % (i % 3),
                                                 tags=("t",) if i % 2 else ())
                                          for i in range(10)])
        assert len(placed) == 10
        before = c.status()["log"]["last_lsn"]
        _p, off = c.produce("fast", b"one more", partition=1)
        assert c.status()["log"]["last_lsn"] == before  # nothing was logged
        assert [r.value for r in c.read("fast", 1, off)] == [b"one more"]
        assert c.read_by_key("fast", b"k1") is not None
        assert c.end_offsets("fast") == [sum(1 for q, _o in placed if q == 0),
                                         sum(1 for q, _o in placed if q == 1) + 1]
        c.commit_offset("g", "fast", 1, off + 1)  # consumer offsets are durable, as any topic's
        # Past the budget the oldest go, and a read below says where the partition starts.
        for _ in range(30):
            c.produce_batch("fast", [b"x" * 1000] * 10, partition=0)
        with pytest.raises(OffsetOutOfRange) as info:
            c.read("fast", 0, 0)
        assert info.value.earliest > 0
        assert c.read("fast", 0, info.value.earliest)[0].offset == info.value.earliest
        with pytest.raises(NodeError, match="memory topic"), c.transaction() as tx:
            tx.produce("fast", b"no")
    n.stop()
    n.start()
    with n.client() as c:
        assert [(t.name, t.storage) for t in c.list_topics() if t.name == "fast"] == [
            ("fast", "memory")]  # the topic stays
        assert c.end_offsets("fast") == [0, 0]  # its records do not
        assert c.read("fast", 1, 0) == []
        assert c.committed_offset("g", "fast", 1) == off + 1
        c.produce("fast", b"again", partition=1)
        assert [r.value for r in c.read("fast", 1, 0)] == [b"again"]
