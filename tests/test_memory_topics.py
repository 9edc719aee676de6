"""Memory topics' records at the front door, without processes (actors/memory_topics.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors.memory_topics import RECORD_OVERHEAD_BYTES, MemoryTopics, OutOfRange
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
    m.append(1, 0, [(3, 0, [b"x" * 10] * 8), (3, 1, [b"y" * 10] * 2)], now_ms=1)
    m.append(1, 1, [(3, 1, [b"y" * 10] * 2)], now_ms=2)
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
    assert m.bytes == RECORD_OVERHEAD_BYTES + 1


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
