"""The front door's key/value logic without processes: the value cache, each key's order of
writes, and compare-and-set decided on the cached value (actors/kv_state.py)."""

from __future__ import annotations

import tracemalloc

import pytest

from actors.kv_state import ENTRY_OVERHEAD_BYTES, KeyOp, KvCache, KvState, Load, Refused, Send

NS = 7  # a namespace's topic id


def cas(corr: int, key: bytes, expected: bytes | None, new: bytes | None) -> KeyOp:
    return KeyOp(corr, NS, key, new, cas=True, expected=expected)


def put(corr: int, key: bytes, value: bytes | None) -> KeyOp:
    return KeyOp(corr, NS, key, value)


def test_the_cache_is_bounded_by_bytes_least_recently_used_out() -> None:
    c = KvCache(3 * (ENTRY_OVERHEAD_BYTES + 2))
    for k in (b"a", b"b", b"c"):
        c.put((NS, k), b"v", 1, (0, 0, 0))
    assert c.get((NS, b"a"), (0, 0, 0)) == (b"v", 1)  # a is now the most recently used
    c.put((NS, b"d"), b"v", 1, (0, 0, 0))
    assert c.get((NS, b"b"), (0, 0, 0)) is None  # b was the least recently used
    assert all(c.get((NS, k), (0, 0, 0)) is not None for k in (b"a", b"c", b"d"))
    assert c.bytes == 3 * (ENTRY_OVERHEAD_BYTES + 2) <= c.bytes_max
    c.put((NS, b"big"), b"x" * 10_000, 2, (0, 0, 0))  # larger than the whole cache: not kept
    assert c.get((NS, b"big"), (0, 0, 0)) is None and c.bytes <= c.bytes_max


@pytest.mark.parametrize("value_bytes", [10, 100, 1000])
def test_the_bytes_the_cache_counts_are_what_its_entries_take(value_bytes: int) -> None:
    """``kv_cache_bytes_max`` bounds memory only if an entry's count is its real cost:
    20 000 entries filled as the front door fills them, measured with tracemalloc."""
    kv = KvState(1 << 40)
    n = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            key = b"key-%012d" % i  # new bytes objects, as decoded from requests
            kv.cache.put((NS, key), (b"%016d" % i).ljust(value_bytes, b"v"), 10**9 + i,
                         kv.gen(NS))
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.85 <= taken / kv.cache.bytes <= 1.15, (taken / n, kv.cache.bytes / n)


def test_an_entry_never_goes_back_to_an_older_lsn() -> None:
    c = KvCache(1 << 20)
    c.put((NS, b"k"), b"new", 9, (0, 0, 0))
    c.put((NS, b"k"), b"old", 5, (0, 0, 0))
    assert c.get((NS, b"k"), (0, 0, 0)) == (b"new", 9)
    c.put((NS, b"k"), b"newer", 9, (0, 0, 0))  # the same LSN: the same state, taken
    assert c.get((NS, b"k"), (0, 0, 0)) == (b"newer", 9)
    c.put((NS, b"k"), b"after commit", 3, (0, 1, 0))  # a new generation replaces any LSN
    assert c.get((NS, b"k"), (0, 0, 0)) is None
    assert c.get((NS, b"k"), (0, 1, 0)) == (b"after commit", 3)


def test_a_put_is_sent_at_once_and_its_ack_sets_the_cache() -> None:
    s = KvState(1 << 20)
    op = put(1, b"k", b"v")
    assert s.write(op) == [Send(op)]
    assert s.cached(NS, b"k") == (False, None)  # not durable yet: not known
    assert s.written(op, 10) == []
    assert s.cached(NS, b"k") == (True, b"v")
    assert not s.lines  # nothing left waiting


def test_an_answer_older_than_one_already_taken_does_not_set_the_cache() -> None:
    """A put sent again while its first attempt was in flight is answered as a duplicate,
    with the first attempt's LSN, after a later put of the key was answered and its entry
    let go by the cache: the older value was cached. An answer below the namespace's latest
    is not known to be the key's latest. (The floor, the LSN known durable at the send, is
    the front door's to set: 0 here, as nothing was.)"""
    s = KvState(1 << 20)
    first, retry, later = put(1, b"k", b"A"), put(2, b"k", b"A"), put(3, b"k", b"B")
    for op in (first, retry, later):
        s.write(op)
    s.written(first, 5)
    s.written(later, 7)
    assert s.cached(NS, b"k") == (True, b"B")
    s.cache.drop((NS, b"k"))  # let go (least recently used)
    s.written(retry, 5)  # the duplicate's answer: the first attempt's LSN
    assert s.cached(NS, b"k") == (False, None)


def test_a_cas_on_an_unknown_value_loads_it_then_decides() -> None:
    s = KvState(1 << 20)
    op = cas(1, b"k", None, b"w")
    (load,) = s.write(op)
    assert isinstance(load, Load) and load.key == b"k"
    assert s.write(cas(2, b"k", None, b"x")) == []  # one load for the key, the second waits
    steps = s.loaded(NS, b"k", None, 4, load.generation)  # absent at LSN 4
    first = steps[0]
    assert first == Send(op)  # the first matched: it becomes a write of b"w"
    assert len(steps) == 1  # the second waits for that write: the value may change
    steps = s.written(op, 5)
    assert steps == [Refused(2, b"w")]  # it expected absence, found b"w"
    assert s.cached(NS, b"k") == (True, b"w")
    assert (s.cas_decided, s.cas_refused) == (1, 1)


def test_a_cas_waits_for_the_writes_of_its_key_in_flight() -> None:
    s = KvState(1 << 20)
    w1 = put(1, b"k", b"1")
    s.write(w1)
    assert s.write(cas(2, b"k", b"1", b"2")) == []  # w1 not answered: cannot decide
    w3 = put(3, b"k", b"3")
    assert s.write(w3) == []  # behind the CAS, in order
    steps = s.written(w1, 10)
    # Decided on b"1": matches; its write goes out, then the put that came after it.
    assert [type(x) for x in steps] == [Send, Send]
    assert steps[0].op.corr == 2 and steps[0].op.new == b"2"  # type: ignore[union-attr]
    assert steps[1] == Send(w3)


def test_writes_of_other_keys_do_not_wait() -> None:
    s = KvState(1 << 20)
    s.write(put(1, b"a", b"1"))
    assert s.write(cas(2, b"a", b"1", b"2")) == []
    b = put(3, b"b", b"x")
    assert s.write(b) == [Send(b)]


def test_a_read_fills_the_cache_only_if_it_reflects_every_acknowledged_write() -> None:
    s = KvState(1 << 20)
    op = put(1, b"a", b"new")
    s.write(op)
    s.written(op, 20)
    s.cache.drop((NS, b"a"))  # evicted
    gen = s.read_generation(NS)
    s.read_answered(NS, b"a", b"old", 15, gen)  # the writer had applied only up to 15
    assert s.cached(NS, b"a") == (False, None)
    s.read_answered(NS, b"a", b"new", 20, gen)
    assert s.cached(NS, b"a") == (True, b"new")


def test_a_read_does_not_fill_while_a_write_of_its_key_is_in_flight() -> None:
    s = KvState(1 << 20)
    s.write(put(1, b"a", b"v"))
    s.read_answered(NS, b"a", None, 99, s.read_generation(NS))
    assert s.cached(NS, b"a") == (False, None)


def test_a_commit_in_flight_blocks_its_namespace_and_drops_its_entries() -> None:
    s = KvState(1 << 20)
    op = put(1, b"k", b"v")
    s.write(op)
    s.written(op, 5)
    other = KeyOp(2, NS + 1, b"k", b"o")
    s.write(other)
    s.written(other, 6)
    gen = s.read_generation(NS)
    s.commit_started([NS])
    assert s.cached(NS, b"k") == (False, None)  # to the writer while it commits
    assert s.cached(NS + 1, b"k") == (True, b"o")  # another namespace is not touched
    assert s.write(cas(3, b"k", b"v", b"w")) == []  # waits for the commit
    s.read_answered(NS, b"k", b"v", 6, gen)  # no fill during it
    steps = s.commit_ended([NS])
    assert s.read_generation(NS) != gen
    # The commit may have changed the key: the CAS reads it again.
    (load,) = steps
    assert isinstance(load, Load) and load.generation == s.read_generation(NS)
    s.read_answered(NS, b"k", b"stale", 6, gen)  # an answer from before the commit: ignored
    assert s.cached(NS, b"k") == (False, None)


def test_a_commit_of_an_unknown_transaction_blocks_every_namespace() -> None:
    s = KvState(1 << 20)
    op = put(1, b"k", b"v")
    s.write(op)
    s.written(op, 5)
    s.commit_started(None)
    assert s.cached(NS, b"k") == (False, None)
    s.commit_ended(None)
    assert s.cached(NS, b"k") == (False, None)  # every entry is of an older generation


def test_a_write_that_timed_out_keeps_its_key_undecided_until_its_answer() -> None:
    s = KvState(1 << 20)
    op = put(1, b"k", b"v")
    s.write(op)
    s.lost(op)
    assert s.write(cas(2, b"k", None, b"w")) == []  # the lost write may still be logged
    # It was logged after all: its value is the key's, and the CAS decides on it.
    assert s.written(op, 8) == [Refused(2, b"v")]


def test_cancelled_and_failed_waiters_leave_the_line() -> None:
    s = KvState(1 << 20)
    s.write(put(1, b"k", b"v"))
    s.write(cas(2, b"k", b"v", b"w"))
    s.write(cas(3, b"k", b"v", b"x"))
    s.cancel({2})
    assert [op.corr for op in s.lines[(NS, b"k")].queue] == [3]
    s2 = KvState(1 << 20)
    (_load,) = s2.write(cas(4, b"j", None, b"w"))
    assert s2.load_failed(NS, b"j") == [4]


def test_a_read_by_key_answer_is_kept_until_its_partition_is_written() -> None:
    s = KvState(1 << 20)
    gen = s.read_generation(NS, 2)
    s.read_filled(NS, 2, b"k", b"rows", 10, gen)
    assert s.read_cached(NS, 2, b"k") == (True, b"rows")
    s.partitions_written(NS, [(1, 0, 5)])  # another partition
    assert s.read_cached(NS, 2, b"k") == (True, b"rows")
    s.partitions_written(NS, [(2, 7, 1)])
    assert s.read_cached(NS, 2, b"k") == (False, None)
    # An answer to a read sent before the write is not kept: it may predate it.
    s.read_filled(NS, 2, b"k", b"old rows", 11, gen)
    assert s.read_cached(NS, 2, b"k") == (False, None)


def test_a_read_by_key_is_not_answered_from_the_cache_while_its_topic_commits() -> None:
    s = KvState(1 << 20)
    s.read_filled(NS, 0, b"k", b"rows", 10, s.read_generation(NS, 0))
    s.commit_started([NS])
    assert s.read_cached(NS, 0, b"k") == (False, None)
    s.commit_ended([NS])
    assert s.read_cached(NS, 0, b"k") == (False, None)  # the commit may have changed it


def test_a_transactions_keys_are_settled_then_held_until_its_commit_is_answered() -> None:
    s = KvState(1 << 20)
    a, b = (NS, b"a"), (NS, b"b")
    w = put(1, b"a", b"1")
    s.write(w)
    values, loads = s.settled([a, b])
    assert values is None  # a is in flight, b is not known
    (load,) = loads
    assert isinstance(load, Load) and load.key == b"b"
    s.written(w, 5)
    assert s.loaded(NS, b"b", None, 5, load.generation) == []
    values, loads = s.settled([a, b])
    assert values == {a: b"1", b: None} and loads == []
    s.bar([a, b])
    later = put(2, b"a", b"2")
    assert s.write(later) == []  # held: it would land between the check and the commit
    assert s.unbar([a, b]) == [Send(later)]



def test_a_commit_is_decided_ahead_of_writes_of_its_keys_held_at_the_gate() -> None:
    """A blocking checkpoint's gate holds a put of a key whose compare-and-set a transaction
    checks, and waits for the transaction: the commit, decided on the value without the
    put (which reaches the log after it), goes ahead, naming the put."""
    s = KvState(1 << 20)
    a = (NS, b"a")
    first = put(1, b"a", b"1")
    s.write(first)
    s.written(first, 5)
    held = put(2, b"a", b"2")
    assert s.write(held) == [Send(held)]
    assert s.settled([a]) == (None, [])  # in flight: its place in the log is not known
    s.held_at_gate(held, True)
    assert s.settled([a]) == ({a: b"1"}, [])
    assert s.gated_on([a]) == [2]
    s.held_at_gate(held, False)  # let through: the commit waits for its answer again
    assert s.settled([a]) == (None, [])
    s.held_at_gate(held, True)
    s.lost(held)  # its request timed out: the value is loaded, without it
    values, (load,) = s.settled([a])
    assert values is None and isinstance(load, Load)
    assert s.loaded(NS, b"a", b"1", 5, load.generation) == []
    assert s.settled([a]) == ({a: b"1"}, [])
    s.written(held, 9)  # its answer: no longer held, and the key's value
    assert s.gated_on([a]) == []
    assert s.settled([a]) == ({a: b"2"}, [])


def test_what_is_kept_of_deleted_topics_goes_with_them() -> None:
    """50 create/delete cycles of 1 024-partition topics left 51 200 entries, and no topic."""
    s = KvState(1 << 20)
    s.catalog({NS})
    for cycle in range(50):
        tid = 100 + cycle  # a new topic each time: ids are never used again
        s.catalog({NS, tid})
        s.partitions_written(tid, [(p, 0, 1) for p in range(1024)])
        s.read_filled(tid, 0, b"k", b"rows", 10, s.read_generation(tid, 0))
        op = KeyOp(cycle, tid, b"k", b"v")
        s.write(op)
        s.written(op, 10 + cycle)
        s.commit_started([tid])
        s.commit_ended([tid])
        s.catalog({NS})  # deleted
    assert s.partition_generation == {} and s.acked_lsn == {} and s.generation == {}
    assert not s.cache.entries and s.cache.bytes == 0 and not s.lines


def test_a_catalog_change_keeps_what_its_topics_have() -> None:
    s = KvState(1 << 20)
    s.catalog({NS, 8})
    op = put(1, b"k", b"v")
    s.write(op)
    s.written(op, 10)
    s.partitions_written(NS, [(2, 0, 1)])
    s.commit_started([NS])
    s.commit_ended([NS])
    kept = (dict(s.acked_lsn), dict(s.generation), dict(s.partition_generation))
    s.catalog({NS})  # topic 8 deleted, the namespace kept
    assert (s.acked_lsn, s.generation, s.partition_generation) == kept
    w = put(2, b"k", b"w")
    s.write(w)  # sent in the namespace's generation: its acknowledgement fills
    s.written(w, 11)
    assert s.cached(NS, b"k") == (True, b"w")


def test_a_commit_waits_for_a_compare_and_set_held_at_the_gate() -> None:
    """A plain compare-and-set, decided and sent, is held at the gate: its write assumes it
    lands right after the value it was checked on, so no commit is decided ahead of it (a
    transaction's compare-and-set and it both swapped from one value)."""
    s = KvState(1 << 20)
    a = (NS, b"a")
    first = put(1, b"a", b"1")
    s.write(first)
    s.written(first, 5)
    c = cas(2, b"a", b"1", b"X")
    assert s.write(c) == [Send(c)]  # decided: b"1" matches
    s.held_at_gate(c, True)
    assert s.settled([a]) == (None, []) and s.gated_on([a]) == []


def test_an_acknowledgement_from_before_a_commit_ended_does_not_fill_the_cache() -> None:
    """A put's retry, held at the gate while a commit goes ahead of it, is answered as a
    duplicate of its first attempt, with that attempt's LSN, from before the commit: the
    cache took its value, which the commit had overwritten."""
    s = KvState(1 << 20)
    a = (NS, b"a")
    first = put(1, b"a", b"1")
    s.write(first)
    s.written(first, 5)
    p1 = KeyOp(2, NS, b"a", b"p", producer=(9, 1))  # logged at LSN 10, answered late
    assert s.write(p1) == [Send(p1)]
    s.lost(p1)
    p2 = KeyOp(3, NS, b"a", b"p", producer=(9, 1))  # the client's retry: same producer/seq
    assert s.write(p2) == [Send(p2)]
    s.held_at_gate(p2, True)
    s.written(p1, 10)
    assert s.settled([a]) == ({a: b"p"}, [])  # a commit decided ahead of the retry
    s.commit_started([NS])
    s.bar([a])
    s.commit_ended([NS])  # committed at LSN 20
    s.unbar([a])
    s.written(p2, 10)  # the retry, answered as the duplicate it is
    assert s.cached(NS, b"a") == (False, None)
