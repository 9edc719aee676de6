"""Unit tests of the log manager's logic (``actors.log_state.LogState``): no I/O, no processes.

Randomised tests take a seed from ``random.randrange`` and print it; a failing seed replays
with ``SHARDNODE_SEED=<seed>``.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import pytest

from actors.instructions import Log, Request, Send
from actors.log_state import LogState
from actors.transactions import Transactions
from config import load_config
from wire import logrecord
from wire.errors import ErrorCode
from wire.logrecord import Kind, iter_buffer
from wire.messages import (
    Ack,
    Append,
    Catalog,
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    Done,
    EndOffsets,
    ErrorReply,
    ListTopics,
    LogRequest,
    OffsetsReply,
    PartRow,
    TopicsReply,
    TxnBegin,
    TxnId,
    TxnStart,
    TxnTable,
)
from wire.protocol import Topic

NOW = 1_700_000_000_000


def blob(n: int, tag: str = "v") -> bytes:
    return bytes(msgpack.packb([f"{tag}{i}".encode() for i in range(n)], use_bin_type=True))


def only_entry(p: Log) -> Any:
    entries = list(iter_buffer(p.record, verify=True))
    assert len(entries) == 1
    assert entries[0].lsn == p.lsn
    return entries[0]


PARTITIONS_MAX = load_config().limits.partitions_max


def log_state(producers_max: int = 1000, producer_window_max: int = 8,
              producer_entries_max: int | None = None, shards_max: int = 4096) -> LogState:
    """A LogState on the defaults, with these bounds."""
    log = {"producers_max": producers_max, "producer_window_max": producer_window_max}
    if producer_entries_max is not None:
        log["producer_entries_max"] = producer_entries_max
    return LogState(load_config(overrides={"log": log, "limits": {"shards_max": shards_max}}))


def answer(out: Log | Send | None) -> Any:
    """A ``Log`` as it is; an answer sent at once (always to the front door) as its message."""
    assert out is not None, "every request here is answered"
    if isinstance(out, Send):
        assert out.role == "front"
        return out.msg
    return out


class Driver:
    """A LogState plus the records it asked to log, in order."""

    def __init__(self, producers_max: int = 1000, window: int = 8,
                 entries_max: int | None = None) -> None:
        self.state = log_state(producers_max, window, entries_max)
        self.log = bytearray()
        self.corr = 0

    def admit(self, msg: LogRequest, now_ms: int = NOW) -> Any:
        """What the state logs (a ``Log``), or the message it answers with at once."""
        out = answer(self.state.admit(msg, now_ms))
        if isinstance(out, Log) and out.record:
            self.log += out.record
        return out

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def create(self, name: str, partitions: int) -> int:
        out = self.admit(CreateTopic(self.next_corr(), name, partitions))
        assert isinstance(out, Log), out
        return self.state.topics[name].topic_id

    def append(self, pid: int, seq: int, parts: Sequence[PartRow], now_ms: int = NOW) -> Any:
        return self.admit(Append(self.next_corr(), pid, seq, parts), now_ms)


def snapshot(st: LogState) -> Any:
    return (st.last_lsn, dict(st.next_offset), dict(st.topics), dict(st.by_id),
            st.next_topic_id, st.catalog_lsn,
            {pid: (w.max_seq, copy.deepcopy(w.results)) for pid, w in st.producers.items()},
            list(st.producers))


# ---- topics ---------------------------------------------------------------------------------


def test_create_topic_logs_a_record_and_answers_done() -> None:
    d = Driver()
    out = d.admit(CreateTopic(5, "orders", 3))
    assert isinstance(out, Log)
    assert out.lsn == 1 and out.catalog_changed
    assert out.reply == Done(5, 1)
    e = only_entry(out)
    assert e.kind == Kind.TOPIC_CREATE
    tid, name, parts, owners = e.body()
    assert owners == []  # a single node: every partition is its own
    assert (name, parts) == ("orders", 3)
    assert d.state.topics["orders"].topic_id == tid
    assert {k: v for k, v in d.state.next_offset.items() if k[0] == tid} == {
        (tid, p): 0 for p in range(3)}
    assert d.state.catalog() == Catalog(1, [Topic("orders", 3, tid)], 1)


def test_topic_ids_are_distinct_and_never_reused() -> None:
    d = Driver()
    a = d.create("a", 1)
    b = d.create("b", 1)
    assert isinstance(d.admit(DeleteTopic(1, "b")), Log)
    b2 = d.create("b", 1)
    assert len({a, b, b2}) == 3


@pytest.mark.parametrize(
    ("msg", "code"),
    [
        (CreateTopic(1, "", 1), ErrorCode.INVALID_NAME),
        (CreateTopic(1, "-dash-first", 1), ErrorCode.INVALID_NAME),
        (CreateTopic(1, "has space", 1), ErrorCode.INVALID_NAME),
        (CreateTopic(1, "x" * 201, 1), ErrorCode.INVALID_NAME),
        (CreateTopic(1, "ok", 0), ErrorCode.BAD_REQUEST),
        (CreateTopic(1, "ok", -1), ErrorCode.BAD_REQUEST),
        (CreateTopic(1, "ok", PARTITIONS_MAX + 1), ErrorCode.BAD_REQUEST),
        (CreateTopic(1, "taken", 2), ErrorCode.TOPIC_EXISTS),
        (DeleteTopic(1, "missing"), ErrorCode.UNKNOWN_TOPIC),
    ],
)
def test_bad_topic_requests_are_answered_and_change_nothing(msg: LogRequest,
                                                            code: ErrorCode) -> None:
    d = Driver()
    d.create("taken", 1)
    before = snapshot(d.state)
    logged = bytes(d.log)
    out = d.admit(msg)
    assert isinstance(out, ErrorReply)
    assert (out.corr, out.code) == (1, code)
    assert snapshot(d.state) == before
    assert bytes(d.log) == logged


def test_partition_count_limits_are_inclusive() -> None:
    d = Driver()
    d.create("one", 1)
    d.create("most", PARTITIONS_MAX)
    assert d.state.topics["most"].partitions == PARTITIONS_MAX


def test_delete_topic_forgets_it_and_its_offsets() -> None:
    d = Driver()
    keep = d.create("keep", 2)
    gone = d.create("gone", 2)
    d.append(1, 0, [(gone, 0, 3, blob(3))])
    out = d.admit(DeleteTopic(9, "gone"))
    assert isinstance(out, Log) and out.catalog_changed
    assert out.reply == Done(9, out.lsn)
    e = only_entry(out)
    assert e.kind == Kind.TOPIC_DELETE and e.body() == [gone, "gone"]
    assert "gone" not in d.state.topics and gone not in d.state.by_id
    assert all(k[0] != gone for k in d.state.next_offset)
    assert d.state.catalog() == Catalog(out.lsn, [Topic("keep", 2, keep)], out.lsn)
    err = d.append(1, 1, [(gone, 0, 1, blob(1))])
    assert isinstance(err, ErrorReply) and err.code == ErrorCode.UNKNOWN_TOPIC
    again = d.create("gone", 2)
    assert again != gone
    ack = d.append(1, 2, [(again, 0, 2, blob(2))]).reply
    assert ack.parts == [(0, 0, 2)]  # a new topic of the same name starts at offset 0


def test_list_topics_is_sorted_by_name_and_logs_nothing() -> None:
    d = Driver()
    ids = {name: d.create(name, n) for name, n in [("zeta", 1), ("alpha", 3), ("mid", 2)]}
    before = snapshot(d.state)
    out = d.admit(ListTopics(77))
    assert out == TopicsReply(77, [Topic("alpha", 3, ids["alpha"]), Topic("mid", 2, ids["mid"]),
                                   Topic("zeta", 1, ids["zeta"])])
    assert snapshot(d.state) == before


def test_end_offsets_are_answered_with_the_next_group_commit_and_log_nothing() -> None:
    d = Driver()
    tid = d.create("t", 3)
    d.append(1, 0, [(tid, 0, 2, blob(2)), (tid, 2, 5, blob(5))])
    out = d.admit(EndOffsets(9, tid))
    # An empty record: nothing is written, and the answer waits for the group commit that
    # makes the appends before it durable (actors/log_manager.py sends it after the fsync).
    assert isinstance(out, Log) and out.record == b"" and not out.early
    assert out.reply == OffsetsReply(9, d.state.last_lsn, [2, 0, 5])
    assert out.lsn == d.state.last_lsn
    assert d.admit(EndOffsets(10, 99)) == ErrorReply(10, ErrorCode.UNKNOWN_TOPIC,
                                                     "topic id 99 does not exist")


def test_other_messages_are_not_its_to_admit() -> None:
    # Only its requests (LogRequest) reach it: the log manager's shell answers anything else
    # (tests/test_node.py), and mypy refuses this call. If one came anyway, it is a bug.
    with pytest.raises(AssertionError):
        log_state(10, 10).admit(Done(1, 1), NOW)  # type: ignore[arg-type]


# ---- appends --------------------------------------------------------------------------------


def test_lsns_increase_by_one_across_every_kind_of_record() -> None:
    d = Driver()
    lsns = []
    tid = d.create("t", 2)
    lsns.append(d.state.last_lsn)
    msgs: list[LogRequest] = [Append(1, 1, 0, [(tid, 0, 1, blob(1))]),
                              CommitOffset(2, "g", tid, 0, 1),
                              CreateTopic(3, "u", 1),
                              Append(4, 1, 1, [(tid, 1, 2, blob(2))]),
                              DeleteTopic(5, "u")]
    for msg in msgs:
        out = d.admit(msg)
        assert isinstance(out, Log)
        assert only_entry(out).lsn == out.lsn == out.reply.lsn
        lsns.append(out.lsn)
    assert lsns == list(range(1, 7))
    assert [e.lsn for e in iter_buffer(bytes(d.log), verify=True)] == lsns


def test_offsets_are_contiguous_per_partition() -> None:
    seed = int(os.environ.get("SHARDNODE_SEED", random.randrange(2**32)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    d = Driver()
    topics = {d.create(f"t{i}", rng.randint(1, 4)): None for i in range(3)}
    expected: dict[tuple[int, int], int] = {}
    for tid in topics:
        for p in range(d.state.by_id[tid].partitions):
            expected[(tid, p)] = 0
    for seq in range(200):
        shards = rng.sample(sorted(expected), rng.randint(1, min(3, len(expected))))
        parts = [(tid, p, rng.randint(1, 5), b"\x90") for tid, p in shards]
        ts = NOW + seq
        out = d.append(pid=seq % 3, seq=seq // 3, parts=parts, now_ms=ts)
        assert isinstance(out, Log), out
        want_acks = []
        want_logged = []
        for tid, p, count, b in parts:
            want_acks.append((p, expected[(tid, p)], count))
            want_logged.append([tid, p, expected[(tid, p)], count, b])
            expected[(tid, p)] += count
        assert out.reply == Ack(d.corr, out.lsn, want_acks)
        e = only_entry(out)
        assert e.kind == Kind.PRODUCE
        assert e.body() == [seq % 3, seq // 3, ts, want_logged]
    assert d.state.next_offset == expected


def test_parts_of_one_append_land_on_their_own_partitions() -> None:
    d = Driver()
    tid = d.create("t", 3)
    d.append(1, 0, [(tid, 2, 4, blob(4))])
    out = d.append(1, 1, [(tid, 0, 2, blob(2)), (tid, 2, 3, blob(3))])
    assert out.reply.parts == [(0, 0, 2), (2, 4, 3)]
    assert (d.state.next_offset[(tid, 0)], d.state.next_offset[(tid, 1)],
            d.state.next_offset[(tid, 2)]) == (2, 0, 7)


@pytest.mark.parametrize(
    ("bad_part", "code"),
    [
        (lambda tid: (tid + 100, 0, 1, b"\x90"), ErrorCode.UNKNOWN_TOPIC),
        (lambda tid: (tid, 2, 1, b"\x90"), ErrorCode.UNKNOWN_PARTITION),
        (lambda tid: (tid, -1, 1, b"\x90"), ErrorCode.UNKNOWN_PARTITION),
    ],
    ids=["unknown-topic", "partition-past-end", "negative-partition"],
)
@pytest.mark.parametrize("new_producer", [False, True], ids=["known-producer", "new-producer"])
def test_an_append_to_an_unknown_shard_is_refused_and_changes_nothing(
        bad_part: Callable[[int], PartRow], code: ErrorCode, new_producer: bool) -> None:
    d = Driver()
    tid = d.create("t", 2)
    d.append(1, 0, [(tid, 0, 3, blob(3))])
    d.append(2, 0, [(tid, 1, 1, blob(1))])
    before = snapshot(d.state)
    logged = bytes(d.log)
    pid = 3 if new_producer else 1
    # The bad part comes after a good one: the good one must not take offsets either.
    out = d.append(pid, 1, [(tid, 0, 2, blob(2)), bad_part(tid)])
    assert isinstance(out, ErrorReply)
    assert (out.corr, out.code) == (d.corr, code)
    # Everything but the producers' LRU order (a known producer being touched is fine):
    # no LSN, no offsets, and no window for a producer whose request was refused.
    assert snapshot(d.state)[:7] == before[:7]
    assert bytes(d.log) == logged
    # The same sequence number, corrected, is a new request, not a duplicate.
    ok = d.append(pid, 1, [(tid, 0, 2, blob(2))])
    assert isinstance(ok, Log) and ok.record
    assert ok.reply.parts == [(0, 3, 2)]


def test_a_refused_append_does_not_evict_another_producers_window() -> None:
    d = Driver(producers_max=1)
    tid = d.create("t", 1)
    first = d.append(1, 0, [(tid, 0, 1, blob(1))])
    assert isinstance(d.append(2, 0, [(tid + 1, 0, 1, blob(1))]), ErrorReply)
    retry = d.append(1, 0, [(tid, 0, 1, blob(1))])
    assert retry.record == b"", "producer 1's retry was logged twice"
    assert retry.reply.lsn == first.lsn


def test_a_duplicate_gets_the_original_ack_and_logs_nothing() -> None:
    d = Driver()
    tid = d.create("t", 2)
    orig = d.append(7, 0, [(tid, 0, 2, blob(2)), (tid, 1, 1, blob(1))])
    d.append(7, 1, [(tid, 0, 5, blob(5))])
    d.append(8, 0, [(tid, 0, 1, blob(1))])
    before = snapshot(d.state)
    logged = bytes(d.log)
    dup = d.append(7, 0, [(tid, 0, 2, blob(2)), (tid, 1, 1, blob(1))])
    assert isinstance(dup, Log)
    assert dup.record == b""
    assert dup.lsn == orig.lsn
    assert dup.reply == Ack(d.corr, orig.lsn, [(0, 0, 2), (1, 0, 1)])  # the new corr
    assert dup.reply.corr != orig.reply.corr
    assert bytes(d.log) == logged
    before_lsn, before_offsets = before[0], before[1]
    assert (d.state.last_lsn, d.state.next_offset) == (before_lsn, before_offsets)


def test_the_same_seq_from_another_producer_is_not_a_duplicate() -> None:
    d = Driver()
    tid = d.create("t", 1)
    a = d.append(1, 0, [(tid, 0, 1, blob(1))])
    b = d.append(2, 0, [(tid, 0, 1, blob(1))])
    assert b.record and b.lsn == a.lsn + 1
    assert b.reply.parts == [(0, 1, 1)]


@pytest.mark.parametrize("window", [1, 4, 16])
def test_a_seq_older_than_the_window_is_stale(window: int) -> None:
    d = Driver(window=window)
    tid = d.create("t", 1)
    acks = {}
    last = 3 * window + 2
    for seq in range(last + 1):
        acks[seq] = d.append(5, seq, [(tid, 0, 1, blob(1))])
    before = snapshot(d.state)
    # The `window` most recent sequence numbers are remembered; older ones are stale.
    for seq in range(last - window + 1, last + 1):
        dup = d.append(5, seq, [(tid, 0, 1, blob(1))])
        assert isinstance(dup, Log) and dup.record == b"", seq
        assert dup.lsn == acks[seq].lsn
    for seq in (0, last - window):
        out = d.append(5, seq, [(tid, 0, 1, blob(1))])
        assert isinstance(out, ErrorReply), seq
        assert out.code == ErrorCode.STALE_SEQUENCE
    assert snapshot(d.state)[:7] == before[:7]


def test_a_never_seen_seq_older_than_the_window_is_stale() -> None:
    d = Driver(window=4)
    tid = d.create("t", 1)
    d.append(5, 100, [(tid, 0, 1, blob(1))])
    out = d.append(5, 96, [(tid, 0, 1, blob(1))])
    assert isinstance(out, ErrorReply) and out.code == ErrorCode.STALE_SEQUENCE
    assert isinstance(d.append(5, 97, [(tid, 0, 1, blob(1))]), Log)


def test_a_window_holds_at_most_window_entries_through_jumps_and_gaps() -> None:
    d = Driver(window=8)
    tid = d.create("t", 1)
    seqs = [*range(0, 20), 25, 23, 1_000_000, 999_995, *range(1_000_001, 1_000_030, 3)]
    for seq in seqs:
        assert isinstance(d.append(6, seq, [(tid, 0, 1, blob(1))]), Log), seq
        win = d.state.producers[6]
        assert sorted(win.results) == sorted(s for s in set(seqs[:seqs.index(seq) + 1])
                                             if s > win.max_seq - 8), seq
    again = d.append(6, 999_995, [(tid, 0, 1, blob(1))])
    assert isinstance(again, ErrorReply) and again.code == ErrorCode.STALE_SEQUENCE


def test_out_of_order_seqs_inside_the_window_are_accepted_once() -> None:
    d = Driver(window=8)
    tid = d.create("t", 1)
    d.append(3, 0, [(tid, 0, 1, blob(1))])
    d.append(3, 4, [(tid, 0, 1, blob(1))])
    late = d.append(3, 2, [(tid, 0, 3, blob(3))])
    assert isinstance(late, Log) and late.record
    assert late.reply.parts == [(0, 2, 3)]
    again = d.append(3, 2, [(tid, 0, 3, blob(3))])
    assert again.record == b"" and again.reply.lsn == late.lsn
    assert again.reply.parts == late.reply.parts
    other = d.append(3, 1, [(tid, 0, 1, blob(1))])
    assert other.record and other.reply.parts == [(0, 5, 1)]
    assert d.state.next_offset[(tid, 0)] == 6


def test_producers_max_evicts_the_least_recently_used_producer() -> None:
    d = Driver(producers_max=2)
    tid = d.create("t", 1)
    a0 = d.append(1, 0, [(tid, 0, 1, blob(1))])
    d.append(2, 0, [(tid, 0, 1, blob(1))])
    # A duplicate counts as use: producer 1 is now the most recent, producer 2 the least.
    assert d.append(1, 0, [(tid, 0, 1, blob(1))]).record == b""
    d.append(3, 0, [(tid, 0, 1, blob(1))])
    assert set(d.state.producers) == {1, 3}
    a_retry = d.append(1, 0, [(tid, 0, 1, blob(1))])
    assert a_retry.record == b"" and a_retry.lsn == a0.lsn  # still remembered
    b_retry = d.append(2, 0, [(tid, 0, 1, blob(1))])
    assert b_retry.record != b""  # forgotten: logged again
    assert len(d.state.producers) == 2


def entries_in_windows(st: LogState) -> int:
    return sum(len(w.results) for w in st.producers.values())


def test_producer_entries_max_forgets_the_least_recently_used_producers() -> None:
    d = Driver(window=4, entries_max=10)
    tid = d.create("t", 1)
    first = {}
    for pid in (1, 2, 3):
        for seq in range(4):
            out = d.append(pid, seq, [(tid, 0, 1, blob(1))])
            first[(pid, seq)] = out.lsn
            assert d.state.entries == entries_in_windows(d.state) <= 10
    # 12 entries would not fit: producer 1, the least recently used, was forgotten whole.
    assert list(d.state.producers) == [2, 3] and d.state.entries == 8
    assert d.append(1, 3, [(tid, 0, 1, blob(1))]).record != b""  # logged again
    retry = d.append(3, 3, [(tid, 0, 1, blob(1))])
    assert retry.record == b"" and retry.lsn == first[(3, 3)]  # remembered: answered as before
    assert d.state.entries == entries_in_windows(d.state) <= 10


def test_producer_entries_are_counted_through_gaps_jumps_and_evictions() -> None:
    seed = int(os.environ.get("SHARDNODE_SEED", random.randrange(2**32)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    d = Driver(producers_max=6, window=5, entries_max=17)
    tid = d.create("t", 2)
    for _ in range(2000):
        pid = rng.randrange(10)
        seq = rng.choice([rng.randrange(40), rng.randrange(1000)])  # gaps, retries, jumps
        d.append(pid, seq, [(tid, rng.randrange(2), 1, blob(1))])
        assert d.state.entries == entries_in_windows(d.state) <= 17
        assert len(d.state.producers) <= 6
    restored = log_state(producers_max=3, producer_window_max=5, producer_entries_max=8)
    restored.restore(d.state.snapshot())
    assert restored.entries == entries_in_windows(restored) <= 8
    assert len(restored.producers) <= 3
    assert list(restored.producers) == list(d.state.producers)[-len(restored.producers):]


# ---- offset commits -------------------------------------------------------------------------


def test_commit_offset_logs_and_checks_its_shard() -> None:
    d = Driver()
    tid = d.create("t", 2)
    d.append(1, 0, [(tid, 0, 4, blob(4))])
    out = d.admit(CommitOffset(40, "grp", tid, 0, 4))  # == end: allowed
    assert isinstance(out, Log) and out.reply == Done(40, out.lsn)
    e = only_entry(out)
    assert e.kind == Kind.OFFSET_COMMIT and e.body() == ["grp", tid, 0, 4]
    before = snapshot(d.state)
    for msg, code in [(CommitOffset(41, "grp", tid + 9, 0, 0), ErrorCode.UNKNOWN_TOPIC),
                      (CommitOffset(42, "grp", tid, 2, 0), ErrorCode.UNKNOWN_PARTITION),
                      (CommitOffset(43, "grp", tid, 0, 5), ErrorCode.BAD_REQUEST),
                      (CommitOffset(44, "grp", tid, 1, 1), ErrorCode.BAD_REQUEST),
                      (CommitOffset(45, "grp", tid, 0, -1), ErrorCode.BAD_REQUEST)]:
        err = d.admit(msg)
        assert isinstance(err, ErrorReply), msg
        assert (err.corr, err.code) == (msg.corr, code)
    assert snapshot(d.state) == before


# ---- replay ---------------------------------------------------------------------------------


def _history(d: Driver, rng: random.Random) -> dict[tuple[int, int], Any]:
    """A mixed history; returns (producer, seq) → the Ack each accepted append got."""
    acks: dict[tuple[int, int], Any] = {}
    keep = d.create("keep", 3)
    gone = d.create("gone", 2)
    seqs = {pid: 0 for pid in range(1, 6)}
    for step in range(150):
        pid = rng.randint(1, 5)
        topic = keep if step < 60 or rng.random() < 0.7 else gone
        if topic not in d.state.by_id:
            topic = keep
        parts = [(topic, p, rng.randint(1, 4), blob(1, f"s{step}"))
                 for p in rng.sample(range(d.state.by_id[topic].partitions), 1)]
        roll = rng.random()
        if roll < 0.1 and seqs[pid] > 2:
            seq = seqs[pid] - rng.randint(1, 2)  # a retry (duplicate) or a late one
        elif roll < 0.2:
            seq = seqs[pid] + 1  # skip one: it may arrive later, out of order
            seqs[pid] += 2
        else:
            seq = seqs[pid]
            seqs[pid] += 1
        out = d.append(pid, seq, parts, now_ms=NOW + step)
        if isinstance(out, Log) and out.record:
            acks[(pid, seq)] = out.reply
        if step == 30:
            assert isinstance(d.admit(CommitOffset(d.next_corr(), "g", keep, 0, 1)), Log)
        if step == 100:
            assert isinstance(d.admit(DeleteTopic(d.next_corr(), "gone")), Log)
        if step == 110:
            d.create("gone", 1)
    return acks


def _replayed(d: Driver) -> LogState:
    fresh = log_state(producers_max=d.state.producers_max,
                      producer_window_max=d.state.window)
    for entry in iter_buffer(bytes(d.log), verify=True):
        fresh.replay(entry)
    return fresh


def test_replay_rebuilds_the_same_state() -> None:
    seed = int(os.environ.get("SHARDNODE_SEED", random.randrange(2**32)))
    print(f"seed {seed}")
    d = Driver(window=6)
    acks = _history(d, random.Random(seed))
    assert len(acks) > 50
    fresh = _replayed(d)
    st = d.state
    assert fresh.last_lsn == st.last_lsn
    assert fresh.next_offset == st.next_offset
    assert fresh.topics == st.topics and fresh.by_id == st.by_id
    assert fresh.next_topic_id == st.next_topic_id
    assert fresh.catalog() == st.catalog()
    assert ({pid: (w.max_seq, w.results) for pid, w in fresh.producers.items()}
            == {pid: (w.max_seq, w.results) for pid, w in st.producers.items()})


def test_after_replay_retries_are_still_recognised_and_new_work_continues() -> None:
    seed = int(os.environ.get("SHARDNODE_SEED", random.randrange(2**32)))
    print(f"seed {seed}")
    d = Driver(window=6)
    acks = _history(d, random.Random(seed))
    fresh = _replayed(d)
    remembered = 0
    for (pid, seq), ack in acks.items():
        win = d.state.producers[pid]
        if seq not in win.results:
            continue  # fell out of the window before the "restart"
        remembered += 1
        out = answer(fresh.admit(Append(999, pid, seq, [(1, 0, 1, blob(1))]), NOW))
        assert isinstance(out, Log) and out.record == b"", (pid, seq)
        assert out.reply == Ack(999, ack.lsn, ack.parts)
    assert remembered >= 5
    # The next request gets the same LSN and offsets from both states.
    keep = d.state.topics["keep"].topic_id
    msg = Append(1000, 77, 0, [(keep, 0, 2, blob(2)), (keep, 2, 1, blob(1))])
    a, b = d.state.admit(msg, NOW), fresh.admit(msg, NOW)
    assert isinstance(a, Log) and isinstance(b, Log)
    assert (a.record, a.reply, a.lsn) == (b.record, b.reply, b.lsn)


def test_replay_refuses_lsns_out_of_order() -> None:
    d = Driver()
    d.create("a", 1)
    d.create("b", 1)
    e1, e2 = list(iter_buffer(bytes(d.log)))
    fresh = log_state(10, 10)
    fresh.replay(e1)
    fresh.replay(e2)
    with pytest.raises(ValueError):
        fresh.replay(e1)
    with pytest.raises(ValueError):
        fresh.replay(e2)


def test_partitions_of_all_topics_are_bounded() -> None:
    state = log_state(producers_max=10, producer_window_max=8, shards_max=5)
    assert isinstance(state.admit(CreateTopic(1, "a", 3), 0), Log)
    refused = answer(state.admit(CreateTopic(2, "b", 3), 0))
    assert isinstance(refused, ErrorReply) and "shards_max" in refused.text
    assert "b" not in state.topics
    assert isinstance(state.admit(CreateTopic(3, "b", 2), 0), Log)


def test_a_snapshot_restores_the_same_state_through_its_file_encoding() -> None:
    from wire import logrecord

    d = Driver(window=4)
    tid = d.create("orders", 3)
    for pid in (11, 12):
        for seq in range(7):  # more than the window: the oldest are evicted
            d.append(pid, seq, [(tid, seq % 3, 1, blob(1))])
    d.admit(CommitOffset(d.next_corr(), "g", tid, 1, 5))
    snap = d.state.snapshot()
    offsets_then = dict(d.state.next_offset)
    data = logrecord.encode_snapshot(snap)
    d.append(11, 7, [(tid, 0, 1, blob(1))])  # changes after the snapshot stay out of it
    assert logrecord.encode_snapshot(snap) == data

    restored = log_state(producers_max=1000, producer_window_max=4)
    restored.restore(logrecord.decode_snapshot(data))
    assert restored.last_lsn == snap["last_lsn"]
    fresh = Driver(window=4)
    fresh.state = restored
    # Same answers as the original had at the snapshot: duplicates are known, in order.
    assert list(restored.producers[12].results) == [3, 4, 5, 6]
    again = fresh.append(12, 6, [(tid, 0, 1, blob(1))])
    assert isinstance(again, Log) and not again.record  # a duplicate: nothing to log
    assert isinstance(again.reply, Ack)
    assert again.reply.parts == [tuple(p) for p in msgpack.unpackb(
        d.state.producers[12].results[6])[1]]
    assert restored.next_offset == offsets_then != d.state.next_offset
    assert restored.topics["orders"].topic_id == tid


def test_a_snapshot_of_another_format_is_refused() -> None:
    st = log_state(producers_max=10, producer_window_max=4)
    snap = st.snapshot()
    with pytest.raises(ValueError, match="snapshot format 1 is not"):
        st.restore({**snap, "format": 1})


# ---- transactions: a start is answered once durable --------------------------------------


def test_a_transaction_id_a_client_was_told_is_not_told_to_another_after_a_crash() -> None:
    """Found by ``scripts/crashtest --txn``'s reasoning, shown by ``tests/test_txn_crash.py``:
    a Tx-Start answered before its group was durable could be lost in a crash while its
    client held the id; the next transaction manager hands out ids from above the log's
    (``Transactions.sync``), so it gave that id to another client, and the first client's
    commit then committed the other's transaction."""
    cfg = load_config()
    tm = Transactions(cfg.txn, first_id=(900 << 32) | 1)  # this incarnation's ids start high
    tm.sync(TxnTable([], [], 1, []), 0.0)
    log = LogState(cfg)
    told: list[int] = []  # ids the shell sent to clients before the crash
    durable: list[logrecord.Entry] = []
    for corr in (1, 2):
        (begin,) = tm.begin(TxnBegin(corr, 0, None), 0.0)
        assert isinstance(begin, Request) and isinstance(begin.msg, TxnStart)
        out = log.admit(begin.msg, NOW)
        assert isinstance(out, Log) and out.reply == TxnId(corr, begin.msg.txn)
        if out.early:
            told.append(begin.msg.txn)  # the shell answers an early reply before the write
        if corr == 1:  # the first group is written and answered; the crash takes the second
            durable.append(only_entry(out))
            told.append(begin.msg.txn)
    # A new log manager recovers the durable records; a new transaction manager, whose ids
    # start lower, learns what the log holds.
    log2 = LogState(cfg)
    for entry in durable:
        log2.replay(entry)
    tm2 = Transactions(cfg.txn, first_id=(5 << 32) | 1)
    opened, outcomes = log2.txns.table()
    tm2.sync(TxnTable(opened, outcomes, log2.txns.next_txn, []), 0.0)
    (begin,) = [i for i in tm2.begin(TxnBegin(3, 0, None), 0.0) if isinstance(i, Request)]
    assert isinstance(begin.msg, TxnStart)
    assert begin.msg.txn not in told
