"""The front door's logic without sockets: checking, routing, splitting, waiting, answering."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import msgpack
import pytest

from actors.front_kv import KV_OPS
from actors.front_state import WRITER_OPS, FrontDoorState, Out
from actors.instructions import Produce, Reply, Request
from actors.roles import LOG_MANAGER, TRANSACTION_MANAGER
from config import load_config
from wire.errors import ErrorCode, NodeError
from wire.messages import (
    Ack,
    Catalog,
    CommitOffset,
    CommittedOffset,
    Compact,
    CreateTopic,
    Done,
    EndOffsets,
    ErrorReply,
    Exported,
    KvGet,
    OffsetsReply,
    PartRow,
    Read,
    ReadByKey,
    RecordsReply,
    ShardsReply,
    ShardStats,
    StatusReply,
    TopicsReply,
    TxnCommitted,
    TxnId,
    TxnOnce,
    TxnsReply,
    TxnStep,
    TxnWrite,
    TxnWritten,
    ValueReply,
)
from wire.protocol import COMPACT_TIMEOUT_MS, OPS, Topic
from wire.records import Record, pack_batch

ID = b"client-1"


def state(mode: str = "fuzzy", writers: int = 2, **limits: int) -> FrontDoorState:
    cfg = load_config(overrides={"limits": limits, "log": {"checkpoint_mode": mode},
                                 "node": {"writers": writers}})
    s = FrontDoorState(cfg)
    s.catalog(Catalog(7, [Topic("t", 4, 1), Topic("one", 1, 2), Topic("kv:cfg", 1, 3)], 7))
    return s


def req(op: str, rid: int = 1, **fields: Any) -> list[bytes]:
    return [msgpack.packb({"op": op, "id": rid, **fields}, use_bin_type=True)]


def produce(records: list[Any], partition: int | None = None, seq: int = 0) -> list[bytes]:
    fields: dict[str, Any] = {"topic": "t", "producer_id": 9, "seq": seq,
                              "records": msgpack.packb(records, use_bin_type=True)}
    if partition is not None:
        fields["partition"] = partition
    return req("produce", **fields)


def parts_of(out: Any) -> Sequence[PartRow]:
    """The parts of a produce request on its way to be logged."""
    assert isinstance(out, Produce)
    producer_id, _seq, parts = out.request
    assert producer_id == 9
    return parts


def reply_of(out: Any) -> dict[str, Any]:
    assert isinstance(out, Reply) and out.identity == ID
    decoded: dict[str, Any] = msgpack.unpackb(out.frame, raw=False)
    return decoded


def test_produce_to_a_named_partition_goes_on_whole() -> None:
    s = state()
    (out,) = s.request(ID, produce([b"a", b"b"], partition=2), now=0.0)
    assert parts_of(out) == [(1, 2, 2, msgpack.packb([b"a", b"b"]))]
    assert isinstance(out, Produce) and out.corr in s.pending


def test_a_retried_split_batch_is_placed_as_the_first_attempt() -> None:
    s = state()
    recs: list[bytes | list[object]] = [[b"a", b"k1", [], None], b"no-key",
                                        [b"c", b"k2", [], None]]
    (first,) = s.request(ID, produce(recs, seq=5), now=0.0)
    (again,) = s.request(ID, produce(recs, seq=5), now=0.0)
    assert parts_of(first) == parts_of(again)
    assert isinstance(first, Produce) and isinstance(again, Produce)
    assert s.pending[first.corr].assign == s.pending[again.corr].assign


def test_keyless_batches_go_round_robin() -> None:
    s = state()
    parts = [parts_of(s.request(ID, produce([b"x"], seq=i), now=0.0)[0])[0][1] for i in range(8)]
    assert parts == [(9 + i) % 4 for i in range(8)]  # producer 9, sequence numbers 0..7


def test_keyed_batch_is_split_by_key_hash_in_record_order() -> None:
    s = state()
    keys = [f"k{i}".encode() for i in range(12)]
    recs: list[list[object]] = [[f"v{i}".encode(), k, [], None] for i, k in enumerate(keys)]
    (out,) = s.request(ID, produce(recs), now=0.0)
    assert isinstance(out, Produce)
    want = [zlib.crc32(k) % 4 for k in keys]
    assert s.pending[out.corr].assign == want
    for _tid, p, count, blob in parts_of(out):
        inner = msgpack.unpackb(blob)
        assert [r[1] for r in inner] == [k for k, w in zip(keys, want, strict=True) if w == p]
        assert count == len(inner)


def test_ack_becomes_the_clients_reply_and_raises_lsn_seen() -> None:
    s = state()
    (out,) = s.request(ID, produce([b"a"], partition=1), now=0.0)
    assert isinstance(out, Produce)
    (rep,) = s.answer(Ack(out.corr, 42, [(1, 10, 1)]))
    assert reply_of(rep) == {"id": 1, "ok": True, "lsn": 42, "parts": [[1, 10, 1]]}
    assert s.lsn_seen == 42 and not s.pending
    assert s.answer(Ack(out.corr, 42, [(1, 10, 1)])) == [], "answered once only"
    (read,) = s.request(ID, req("read", topic="t", partition=1, offset=0, max_records=5), 0.0)
    assert isinstance(read, Request) and read.role == "cache"
    assert read.msg == Read(read.corr, 1, 1, 0, 5, 42)


def test_end_offsets_go_to_the_log_manager_and_make_later_reads_wait_for_them() -> None:
    s = state()
    (out,) = s.request(ID, req("end_offsets", topic="t"), now=0.0)
    assert isinstance(out, Request) and out.role == "log"
    assert out.msg == EndOffsets(out.corr, 1)
    (rep,) = s.answer(OffsetsReply(out.corr, 90, [3, 0, 7, 1]))
    assert reply_of(rep) == {"id": 1, "ok": True, "offsets": [3, 0, 7, 1]}
    (read,) = s.request(ID, req("read", topic="t", partition=2, offset=6, max_records=5), 0.0)
    assert isinstance(read, Request) and read.msg == Read(read.corr, 1, 2, 6, 5, 90)
    (bad,) = s.request(ID, req("end_offsets", topic="nope"), now=0.0)
    assert reply_of(bad)["code"] == ErrorCode.UNKNOWN_TOPIC


def test_a_group_commits_acks_in_rows_answer_each_request_once() -> None:
    s = state()
    outs = s.request(ID, [b"".join(produce([b"x"], partition=p, seq=p)[0] for p in range(3))],
                     now=0.0)
    corrs = [o.corr for o in outs if isinstance(o, Produce)]
    assert len(corrs) == 3
    rows = [(corr, 50 + i, [(i, 7, 1)]) for i, corr in enumerate(corrs)]
    replies = [reply_of(r) for corr, lsn, parts in rows for r in s.ack(corr, lsn, parts)]
    assert [(r["lsn"], r["parts"]) for r in replies] == [(50, [[0, 7, 1]]), (51, [[1, 7, 1]]),
                                                         (52, [[2, 7, 1]])]
    assert s.lsn_seen == 52 and not s.pending
    assert s.ack(corrs[0], 50, [(0, 7, 1)]) == [], "answered once only"
    assert s.ack(999, 60, [(0, 8, 1)]) == [] and s.lsn_seen == 52  # not ours: ignored


@pytest.mark.parametrize("mode, role", [("fuzzy", "log"), ("blocking", "txn")])
def test_writes_pass_the_transaction_managers_gate_only_when_checkpoints_block(
        mode: str, role: str) -> None:
    s = state(mode)
    assert s.writes_to == role  # where the shell sends produce requests (Produce)
    (out,) = s.request(ID, req("create_topic", name="new", partitions=2), now=0.0)
    assert isinstance(out, Request) and isinstance(out.msg, CreateTopic) and out.role == role
    (out,) = s.request(ID, req("commit_offset", group="g", topic="t", partition=1, offset=5),
                       now=0.0)
    assert isinstance(out, Request) and isinstance(out.msg, CommitOffset) and out.role == role


def test_reads_other_than_by_offset_go_to_the_owning_writer() -> None:
    s = state()
    (out,) = s.request(ID, req("read_by_key", topic="t", partition=3, key=b"k"), now=0.0)
    assert isinstance(out, Request) and isinstance(out.msg, ReadByKey)
    assert out.role == f"writer-{(1 * 7919 + 3) % 2}"
    (out,) = s.request(ID, req("committed_offset", group="g", topic="t", partition=0), now=0.0)
    assert isinstance(out, Request) and isinstance(out.msg, CommittedOffset)


@pytest.mark.parametrize("frames, code", [
    (req("read", topic="nope", partition=0, offset=0, max_records=1), ErrorCode.UNKNOWN_TOPIC),
    (req("read", topic="t", partition=4, offset=0, max_records=1), ErrorCode.UNKNOWN_PARTITION),
    (produce([]), ErrorCode.EMPTY_BATCH),
    (req("create_topic", name="no spaces", partitions=1), ErrorCode.INVALID_NAME),
    ([b"a", b"b"], ErrorCode.BAD_REQUEST),
])
def test_bad_requests_are_answered_at_once_and_nothing_waits(frames: list[bytes],
                                                             code: ErrorCode) -> None:
    s = state()
    (out,) = s.request(ID, frames, now=0.0)
    assert reply_of(out)["code"] == code
    assert not s.pending


def test_before_the_catalog_arrives_requests_are_unavailable() -> None:
    s = FrontDoorState(load_config())
    (out,) = s.request(ID, produce([b"a"], partition=0), now=0.0)
    assert reply_of(out)["code"] == ErrorCode.UNAVAILABLE


def test_pending_limit_answers_busy() -> None:
    s = state(pending_requests_max=2)
    outs = [s.request(ID, produce([b"a"], partition=0, seq=i), now=0.0)[0] for i in range(3)]
    assert [type(o) for o in outs] == [Produce, Produce, Reply]
    assert reply_of(outs[2])["code"] == ErrorCode.BUSY


def test_requests_nobody_answered_time_out() -> None:
    s = state(request_timeout_ms=1000)
    (out,) = s.request(ID, req("create_topic", name="x", partitions=1), now=10.0)
    assert isinstance(out, Request) and isinstance(out.msg, CreateTopic)
    assert s.expire(10.5) == []
    (late,) = s.expire(11.0)
    assert reply_of(late)["code"] == ErrorCode.TIMEOUT
    assert s.answer(ErrorReply(out.corr, 1, "too late")) == []


def test_fail_and_stop_answer_every_waiting_request() -> None:
    s = state()
    a = s.request(ID, produce([b"a"], partition=0, seq=1), now=0.0)[0]
    s.request(ID, produce([b"b"], partition=0, seq=2), now=0.0)
    assert isinstance(a, Produce)
    (busy,) = s.fail([a.corr], ErrorCode.BUSY, "full")
    assert reply_of(busy)["code"] == ErrorCode.BUSY
    (stopped,) = s.stop()
    assert reply_of(stopped)["code"] == ErrorCode.UNAVAILABLE
    assert not s.pending


def test_records_reply_passes_bytes_through() -> None:
    s = state()
    (out,) = s.request(ID, req("read", topic="t", partition=0, offset=0, max_records=1), 0.0)
    assert isinstance(out, Request)
    (rep,) = s.answer(RecordsReply(out.corr, b"\x90", 3))
    assert reply_of(rep) == {"id": 1, "ok": True, "records": b"\x90"}


def test_an_older_catalog_is_ignored() -> None:
    s = state()
    s.catalog(Catalog(3, [], 3))
    assert "t" in s.topics and s.lsn_seen == 7


def test_a_restarted_front_door_makes_reads_wait_for_the_durable_lsn() -> None:
    s = FrontDoorState(load_config())
    s.catalog(Catalog(3, [Topic("t", 1, 1)], 90))  # the log is durable to 90; topics changed at 3
    (read,) = s.request(ID, req("read", topic="t", partition=0, offset=0, max_records=1), 0.0)
    assert isinstance(read, Request) and isinstance(read.msg, Read) and read.msg.lsn_min == 90


# One request of every op, and an answer of the kind its actor gives.
EXAMPLES: dict[str, tuple[dict[str, Any], Any]] = {
    "produce": ({"topic": "t", "partition": 1, "producer_id": 9, "seq": 0,
                 "records": msgpack.packb([b"a"])}, lambda c: Ack(c, 5, [(1, 0, 1)])),
    "create_topic": ({"name": "new", "partitions": 2}, lambda c: Done(c, 5)),
    "delete_topic": ({"name": "t"}, lambda c: Done(c, 5)),
    "alter_topic": ({"name": "t", "retention_ms": 1000}, lambda c: Done(c, 5)),
    "list_topics": ({}, lambda c: TopicsReply(c, [Topic("t", 4, 1)])),
    "cluster_map": ({}, None),  # answered by the front door itself
    "cluster_sync": ({}, None),
    "end_offsets": ({"topic": "t"}, lambda c: OffsetsReply(c, 5, [1, 0, 0, 2])),
    "read": ({"topic": "t", "partition": 0, "offset": 0, "max_records": 5},
             lambda c: RecordsReply(c, b"\x90", 5)),
    "read_by_key": ({"topic": "t", "partition": 0, "key": b"k"},
                    lambda c: RecordsReply(c, b"\x90", 5)),
    "read_by_tag": ({"topic": "t", "partition": 0, "tag": "x", "offset": 0, "max_records": 5},
                    lambda c: RecordsReply(c, b"\x90", 5)),
    "offset_for_timestamp": ({"topic": "t", "partition": 0, "timestamp": 5},
                             lambda c: ValueReply(c, None)),
    "commit_offset": ({"group": "g", "topic": "t", "partition": 0, "offset": 0},
                      lambda c: Done(c, 5)),
    "committed_offset": ({"group": "g", "topic": "t", "partition": 0},
                         lambda c: ValueReply(c, 3)),
    "delete_by_key": ({"topic": "t", "partition": 0, "key": b"k"}, lambda c: Done(c, 5)),
    "delete_by_offset": ({"topic": "t", "partition": 0, "offset": 3}, lambda c: Done(c, 5)),
    "status": ({}, lambda c: StatusReply(c, {"pid": 1})),
    "checkpoint": ({}, lambda c: Done(c, 5)),
    "txn_begin": ({"timeout_ms": 1000}, lambda c: TxnId(c, 77)),
    "txn_produce": ({"txn": 77, "seq": 0, "topic": "t", "records": msgpack.packb([b"a"]),
                     "partition": 1}, lambda c: TxnWritten(c, 5, 1)),
    "txn_commit_offset": ({"txn": 77, "seq": 1, "group": "g", "topic": "t", "partition": 0,
                           "offset": 0}, lambda c: TxnWritten(c, 5, 1)),
    "txn_commit": ({"txn": 77}, lambda c: TxnCommitted(c, 6, [("t", 1, 0, 1)])),
    "txn_once": ({"txn": 79, "writes": [{"op": "txn_produce", "topic": "t", "partition": 1,
                                         "records": msgpack.packb([b"a"])}]},
                 lambda c: TxnCommitted(c, 6, [("t", 1, 0, 1)])),
    "txn_abort": ({"txn": 77}, lambda c: Done(c, 6)),
    "xa_start": ({"xid": [1, b"g", b"b"]}, lambda c: TxnId(c, 78)),
    "xa_end": ({"xid": [1, b"g", b"b"]}, lambda c: TxnId(c, 78)),
    "xa_prepare": ({"xid": [1, b"g", b"b"]}, lambda c: Done(c, 7)),
    "xa_commit": ({"xid": [1, b"g", b"b"], "one_phase": False},
                  lambda c: TxnCommitted(c, 8, [])),
    "xa_rollback": ({"xid": [1, b"g", b"b"]}, lambda c: Done(c, 7)),
    "xa_recover": ({}, lambda c: TxnsReply(c, "xids", [[1, b"g", b"b"]])),
    "txn_list": ({}, lambda c: TxnsReply(c, "txns", [[77, "", "active", 5, 1, 10, 1]])),
    "stats": ({}, lambda c: ShardsReply(c, [[1, 0, 0, 4096, [1, 0, 0, 0, 0, 0, 0], 0, 64, 9]],
                                        [0, 1, 1024, 16777216, 30, 10])),
    "compact": ({"topic": "t"}, lambda c: ShardsReply(c, [[1, 0, 4096, 2048]], [])),
    # ---- key/value (a write is answered by its ack; a CAS reads the value first) ----
    "kv_create": ({"namespace": "new"}, lambda c: Done(c, 5)),
    "kv_drop": ({"namespace": "cfg"}, lambda c: Done(c, 5)),
    "kv_put": ({"namespace": "cfg", "key": b"k", "value": b"v"},
               lambda c: Ack(c, 5, [(0, 0, 1)])),
    "kv_get": ({"namespace": "cfg", "key": b"k"},
               lambda c: RecordsReply(c, msgpack.packb([[b"k", b"v"]]), 5)),
    "kv_delete": ({"namespace": "cfg", "key": b"k"}, lambda c: Ack(c, 5, [(0, 0, 1)])),
    "kv_scan": ({"namespace": "cfg", "prefix": b"a"}, lambda c: RecordsReply(c, b"\x90", 5)),
    "kv_cas": ({"namespace": "cfg", "key": b"k", "expected": None, "new": b"w"},
               lambda c: RecordsReply(c, b"\x90", 5)),
    "txn_kv": ({"txn": 77, "seq": 2, "namespace": "cfg", "key": b"k", "value": b"v"},
               lambda c: TxnWritten(c, 5, 1)),
    "snapshot_export": ({"dir": "/snap"}, lambda c: Exported(c, 9, 4, 8192, 120)),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_of_the_table_is_routed_and_answered_with_its_reply_fields(op: str) -> None:
    s = state()
    fields, make_answer = EXAMPLES[op]
    outs = s.request(ID, req(op, rid=3, **fields), now=0.0)
    if make_answer is None:
        (rep,) = outs
    else:  # one actor answers, or (stats, compact) every shard writer answers its part
        reps: list[Out] = []
        todo = list(outs)
        while todo:  # a compare-and-set reads the value, then writes: both are answered
            out = todo.pop(0)
            assert isinstance(out, Produce | Request), reply_of(out)
            written = isinstance(out, Produce) and op == "kv_cas"
            for r in s.answer(Ack(out.corr, 6, [(0, 0, 1)]) if written
                              else make_answer(out.corr)):
                (reps if isinstance(r, Reply) else todo).append(r)
        (rep,) = reps
    reply = reply_of(rep)
    assert reply.pop("id") == 3 and reply.pop("ok") is True
    spec = OPS[op]
    assert {f.name for f in spec.reply if f.required} <= set(reply) <= {f.name for f in spec.reply}
    assert list(reply) == [f.name for f in spec.reply if f.name in reply]  # in table order


def test_the_routes_cover_the_table() -> None:
    assert set(state().routes) | WRITER_OPS | KV_OPS | {
        "produce", "txn_produce", "txn_once", "txn_kv", "cluster_map", "cluster_sync"} == set(OPS)


def test_stats_asks_every_writer_and_joins_their_shards_by_topic_name() -> None:
    s = state(writers=3)
    outs = s.request(ID, req("stats", rid=4), now=0.0)
    assert [o.role for o in outs] == ["writer-0", "writer-1", "writer-2"]  # type: ignore[union-attr]
    assert all(isinstance(o, Request) and isinstance(o.msg, ShardStats) for o in outs)
    rows = {0: [[2, 0, 0, 10, [0] * 7, 0, 1, 1]], 1: [[1, 3, 1, 20, [0] * 7, 0, 2, 2],
                                                  [1, 0, 1, 30, [0] * 7, 0, 3, 3]], 2: []}
    replies = []
    for i, o in enumerate(outs):
        assert isinstance(o, Request)
        replies += s.answer(ShardsReply(o.corr, rows[i], [i, len(rows[i]), 0, 100, i, 1]))
    (rep,) = replies
    reply = reply_of(rep)
    assert [r[:2] for r in reply["shards"]] == [["one", 0], ["t", 0], ["t", 3]]
    assert [w[0] for w in reply["writers"]] == [0, 1, 2]
    assert not s.pending


def test_compact_goes_to_every_writer_with_the_topic_and_fails_if_one_fails() -> None:
    s = state(writers=2)
    outs = s.request(ID, req("compact", rid=5, topic="t"), now=0.0)
    assert all(isinstance(o, Request) and o.msg == Compact(o.corr, 1) for o in outs)
    # Bounded by its own timeout, longer than a request's.
    assert all(w.deadline == COMPACT_TIMEOUT_MS / 1000 for w in s.pending.values())
    first, second = outs
    assert isinstance(first, Request) and isinstance(second, Request)
    assert s.answer(ShardsReply(first.corr, [[1, 0, 10, 5]], [])) == []
    (rep,) = s.answer(ErrorReply(second.corr, ErrorCode.INTERNAL, "writer-1: disk full"))
    reply = reply_of(rep)
    assert reply["ok"] is False and reply["error"] == "writer-1: disk full"
    assert not s.pending
    (unknown,) = s.request(ID, req("compact", rid=6, topic="nope"), now=0.0)
    assert reply_of(unknown)["code"] == ErrorCode.UNKNOWN_TOPIC


def test_reads_after_a_read_wait_for_the_commits_it_saw() -> None:
    """A read's answer names the last transaction commit it reflects; every read routed after
    it waits for that commit, wherever it goes, so no reader sees a transaction in one
    partition and then misses it in another."""
    s = state()
    (first,) = s.request(ID, req("read", topic="t", partition=0, offset=0, max_records=5), 0.0)
    assert isinstance(first, Request) and isinstance(first.msg, Read) and first.msg.lsn_min == 7
    s.answer(RecordsReply(first.corr, msgpack.packb([]), 90, commit_lsn=55))
    (by_offset,) = s.request(ID, req("read", topic="t", partition=1, offset=0, max_records=5), 0.0)
    (by_key,) = s.request(ID, req("read_by_key", topic="t", partition=2, key=b"k"), 0.0)
    assert isinstance(by_offset, Request) and isinstance(by_key, Request)
    assert by_offset.msg.lsn_min == 55 and by_key.msg.lsn_min == 55  # type: ignore[attr-defined]
    s.answer(RecordsReply(by_key.corr, msgpack.packb([]), 90, commit_lsn=60))
    (committed,) = s.request(ID, req("committed_offset", group="g", topic="t", partition=0), 0.0)
    assert isinstance(committed, Request) and committed.msg.lsn_min == 60  # type: ignore[attr-defined]
    s.answer(ValueReply(committed.corr, None, commit_lsn=65))  # committed offsets too
    (after,) = s.request(ID, req("read", topic="t", partition=3, offset=0, max_records=5), 0.0)
    assert isinstance(after, Request) and after.msg.lsn_min == 65  # type: ignore[attr-defined]


def test_txn_once_sends_its_writes_as_one_message_split_as_txn_produce_splits_them() -> None:
    s = state()
    keyed = pack_batch([Record(b"a", b"k1"), Record(b"b", b"k2"), Record(b"c", b"k3"),
                        Record(b"d")])
    writes = [{"op": "txn_produce", "topic": "t", "records": keyed},
              {"op": "txn_commit_offset", "group": "g", "topic": "t", "partition": 2, "offset": 0},
              {"op": "txn_produce", "topic": "one", "records": msgpack.packb([b"x", b"y"])}]
    (out,) = s.request(ID, req("txn_once", rid=4, txn=50, writes=writes), now=0.0)
    assert isinstance(out, Request) and isinstance(out.msg, TxnOnce)
    once = out.msg
    assert once.txn == 50 and out.role == LOG_MANAGER  # the way writes go (fuzzy checkpoints)
    assert once.offsets == [("g", 1, 2, 0)]
    # As the same writes staged one by one would be: txn_produce with the seq of its place.
    alone = state()
    (staged,) = alone.request(ID, req("txn_produce", txn=50, seq=0, topic="t", records=keyed),
                              now=0.0)
    assert isinstance(staged, Request) and isinstance(staged.msg, TxnWrite)
    (written,) = alone.answer(TxnWritten(staged.corr, 5, 4))
    first = reply_of(written)
    split = [row for row in once.parts if row[0] == 1]
    assert split == list(staged.msg.parts)
    assert sum(row[2] for row in split) == 4 and len(split) > 1  # split by key
    assert [row for row in once.parts if row[0] == 2] == [(2, 0, 2, msgpack.packb([b"x", b"y"]))]
    (rep,) = s.answer(TxnCommitted(out.corr, 9, [("t", 0, 0, 1), ("one", 0, 0, 2)]))
    reply = reply_of(rep)
    assert reply["id"] == 4 and reply["lsn"] == 9
    assert reply["produced"] == [[first["parts"], first["assign"]], [[[0, 2]], None]]
    # With blocking checkpoints writes pass the transaction manager's gate: so does it.
    (out,) = state(mode="blocking").request(ID, req("txn_once", txn=51, writes=writes), now=0.0)
    assert isinstance(out, Request) and out.role == TRANSACTION_MANAGER


@pytest.mark.parametrize(("write", "code", "says"), [
    ({"op": "txn_produce", "topic": "nope", "records": msgpack.packb([b"a"])},
     ErrorCode.UNKNOWN_TOPIC, "'nope' does not exist"),
    ({"op": "txn_produce", "topic": "t", "records": msgpack.packb([b"a"]), "partition": 9},
     ErrorCode.UNKNOWN_PARTITION, "partitions 0..3"),
    ({"op": "txn_produce", "topic": "t", "records": b"\x90"}, ErrorCode.EMPTY_BATCH, ""),
    ({"op": "txn_commit_offset", "group": "", "topic": "t", "partition": 0, "offset": 0},
     ErrorCode.INVALID_NAME, "group name"),
    ({"op": "txn_kv", "namespace": "cfg", "key": b"k", "value": b"v"},
     ErrorCode.BAD_REQUEST, "write 1 must be a map with 'op' one of"),
])
def test_a_bad_write_refuses_the_whole_txn_once_and_sends_nothing(write: dict[str, Any],
                                                                  code: ErrorCode,
                                                                  says: str) -> None:
    s = state()
    good = {"op": "txn_produce", "topic": "t", "records": msgpack.packb([b"a"]), "partition": 0}
    (rep,) = s.request(ID, req("txn_once", rid=6, txn=51, writes=[good, write]), now=0.0)
    reply = reply_of(rep)
    assert reply["ok"] is False and reply["code"] == code, reply
    assert says in reply["error"]
    assert not s.pending  # nothing waits: nothing was sent


def test_the_front_door_says_it_is_starting_until_it_knows_the_catalog() -> None:
    """Every actor running is what ``wait_ready`` waits for; before the catalog comes, a
    request naming a topic is answered UNAVAILABLE, so the front door is not yet running."""
    s = FrontDoorState(load_config())
    status = {"pid": 1, "actors": [{"role": "log", "state": "running"},
                                   {"role": "front", "state": "running"}]}
    (ask,) = s.request(ID, req("status"), now=0.0)
    assert isinstance(ask, Request)
    (rep,) = s.answer(StatusReply(ask.corr, status))
    assert [a["state"] for a in reply_of(rep)["status"]["actors"]] == ["running", "starting"]
    s.catalog(Catalog(7, [Topic("t", 4, 1)], 7))
    (ask,) = s.request(ID, req("status", rid=2), now=0.0)
    assert isinstance(ask, Request)
    (rep,) = s.answer(StatusReply(ask.corr, status))
    assert [a["state"] for a in reply_of(rep)["status"]["actors"]] == ["running", "running"]


@pytest.mark.parametrize("op, fields", [
    ("xa_start", {"txn": 41}),
    ("xa_commit", {"one_phase": True}),
    ("xa_rollback", {}),
    ("xa_end", {}),
])
@pytest.mark.parametrize("xid", [[1, [1], b""], [1, {"a": 1}, b""], [[1], b"g", b""]])
def test_an_xid_holding_an_array_or_a_map_is_refused_at_once_and_nothing_waits(
        op: str, fields: dict[str, Any], xid: list[Any]) -> None:
    """The front door keys the transactions it tracks by xid: one holding an array or a
    map is no key (TypeError, answered INTERNAL, and its request left waiting, answered
    again, TIMEOUT, ten seconds later). It is refused as the transaction manager would."""
    s = state()
    (rep,) = s.request(ID, req(op, rid=7, xid=xid, **fields), now=0.0)
    reply = reply_of(rep)
    assert (reply["id"], reply["code"]) == (7, ErrorCode.XAER_INVAL), reply
    assert not s.pending
    assert s.expire(60.0) == []


@pytest.mark.parametrize("op, fields", [
    ("kv_cas", {"expected": b"old", "new": b"x" * 1001}),
    ("kv_put", {"value": b"x" * 1001}),
])
def test_a_value_over_the_limit_is_refused_in_a_namespace_that_does_not_exist(
        op: str, fields: dict[str, Any]) -> None:
    """Refused before the namespace is looked up: a compare-and-set in a new namespace was
    answered "not swapped", and a put created the namespace before it was refused."""
    s = state(value_bytes_max=1000)
    (rep,) = s.request(ID, req(op, rid=8, namespace="new", key=b"k", **fields), now=0.0)
    reply = reply_of(rep)
    assert (reply["ok"], reply["code"]) == (False, ErrorCode.BAD_REQUEST), reply
    assert "1001 bytes" in reply["error"]
    assert not s.pending and not s.kv.creating


def test_a_commit_whose_compare_and_set_cannot_load_its_key_fails_and_stays_open() -> None:
    """A transaction's compare-and-set is decided at its commit, on the key's value loaded
    from the writer. A load that fails (the namespace was dropped meanwhile) fails the
    commit with its error, once: the commit loaded again at once, thousands of times a
    second, until it timed out. Its compare-and-set stays: a retry loads and decides again."""
    s = state()
    (begin,) = s.request(ID, req("txn_begin", rid=1, txn=5), now=0.0)
    assert isinstance(begin, Request)
    s.answer(TxnId(begin.corr, 5))
    (write,) = s.request(ID, req("txn_kv", rid=2, txn=5, seq=0, namespace="cfg", key=b"k",
                                 value=b"new", expected=b"old"), now=0.0)
    assert isinstance(write, Request)
    s.answer(TxnWritten(write.corr, 4, 1))
    for rid in (3, 4):  # the commit, then its retry
        (load,) = s.request(ID, req("txn_commit", rid=rid, txn=5), now=0.0)
        assert isinstance(load, Request) and isinstance(load.msg, KvGet)
        (rep,) = s.answer(ErrorReply(load.corr, ErrorCode.UNKNOWN_TOPIC,
                                     "no shard t3-p0 (topic deleted?)"))
        reply = reply_of(rep)
        assert (reply["id"], reply["code"]) == (rid, ErrorCode.UNKNOWN_TOPIC), reply
        assert not s.pending and not s.kv.commits


def test_a_compare_and_set_sent_before_its_transaction_began_still_blocks_its_namespace() -> None:
    """The namespaces a commit may change come from its transaction's writes the front door
    saw after the begin; a compare-and-set sent before it (answered UNAVAILABLE: it may
    have been staged, so its condition stays) left the set empty, and the commit's end
    took back a commit of unknown namespaces that never started: the count went below
    zero, and the next such commit no longer kept gets and compare-and-sets from the cache
    while it was in flight."""
    s = state()
    (early,) = s.request(ID, req("txn_kv", rid=1, txn=5, seq=0, namespace="cfg", key=b"k",
                                 value=b"new", expected=b"old"), now=0.0)
    assert isinstance(early, Request)
    s.answer(ErrorReply(early.corr, ErrorCode.UNAVAILABLE, "the transaction manager is starting"))
    (begin,) = s.request(ID, req("txn_begin", rid=2, txn=5), now=0.0)
    assert isinstance(begin, Request)
    s.answer(TxnId(begin.corr, 5))
    (load,) = s.request(ID, req("txn_commit", rid=3, txn=5), now=0.0)
    assert isinstance(load, Request) and isinstance(load.msg, KvGet)
    (commit,) = s.answer(RecordsReply(load.corr, msgpack.packb([[b"k", b"old"]]), 4))
    assert isinstance(commit, Request)
    assert s.kv.state.blocked(3)  # the namespace "cfg" waits for the commit's answer
    (rep,) = s.answer(TxnCommitted(commit.corr, 6, []))
    assert reply_of(rep)["ok"] is True
    assert (s.kv.state.commits_anywhere, s.kv.state.committing) == (0, {})


def test_a_refused_compare_and_set_is_forgotten_and_does_not_fill_the_table() -> None:
    """A transaction's compare-and-set is remembered as it is sent (a commit sent behind it
    is checked against it). One the transaction manager refuses is forgotten: remembered,
    those sent to transactions that never existed filled the table, and every
    compare-and-set after them went unremembered, its commit refused TXN_CONFLICT."""
    s = state()
    for txn in range(1, 4):
        (write,) = s.request(ID, req("txn_kv", rid=txn, txn=txn, seq=0, namespace="cfg",
                                     key=b"k", value=b"new", expected=b"old"), now=0.0)
        assert isinstance(write, Request) and s.kv.conds[txn] == [(3, b"k", b"old")]
        code = ErrorCode.TXN_UNKNOWN if txn < 3 else ErrorCode.TIMEOUT
        (rep,) = s.answer(ErrorReply(write.corr, code, "no such transaction"))
        assert reply_of(rep)["code"] == code
    assert list(s.kv.conds) == [3]  # a timeout does not say it was not staged: it stays
    (begin,) = s.request(ID, req("txn_begin", rid=9, txn=1), now=0.0)
    assert isinstance(begin, Request)
    s.answer(TxnId(begin.corr, 1))
    (commit,) = s.request(ID, req("txn_commit", rid=10, txn=1), now=0.0)
    assert isinstance(commit, Request) and isinstance(commit.msg, TxnStep)  # unchecked: no load


@pytest.mark.parametrize("failure", [RuntimeError("a bug"), NodeError("refused", ErrorCode.BUSY)])
def test_a_request_that_fails_after_it_registered_a_wait_is_answered_once(
        failure: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a failed request registered as waiting is forgotten: its answer is its error.
    Left, it was answered a second time (TIMEOUT) when the wait expired."""
    s = state()
    real = FrontDoorState.produce

    def produce_then_fail(self: FrontDoorState, *args: Any) -> Any:
        real(self, *args)  # registers the request's wait
        raise failure

    monkeypatch.setattr(FrontDoorState, "produce", produce_then_fail)
    (rep,) = s.request(ID, produce([b"a"], partition=0), now=0.0)
    assert reply_of(rep)["code"] == (ErrorCode.INTERNAL if isinstance(failure, RuntimeError)
                                     else ErrorCode.BUSY)
    assert not s.pending
    assert s.expire(1e9) == []


def test_a_write_to_a_new_namespace_at_the_pending_bound_is_answered_busy() -> None:
    """A put to a namespace not yet known creates it first (``KvDoor.unknown``), which
    waits for the creation: at the bound of requests waiting, that wait's BUSY is the
    answer. It escaped the front door's request handling (and would have ended the actor).
    And nothing of it stays: the next put, with room, creates the namespace (the first was
    remembered as creating it, and every put after it waited for a creation never sent)."""
    s = state(pending_requests_max=1)
    (held,) = s.request(ID, produce([b"a"], partition=0), now=0.0)
    assert isinstance(held, Produce)
    put = {"namespace": "new", "key": b"k", "value": b"v", "producer_id": 1, "seq": 0}
    (rep,) = s.request(ID, req("kv_put", rid=2, **put), now=0.0)
    assert reply_of(rep)["code"] == ErrorCode.BUSY
    assert list(s.pending) == [held.corr]
    s.ack(held.corr, 8, [(0, 0, 1)])
    (create,) = s.request(ID, req("kv_put", rid=3, **put), now=0.0)
    assert isinstance(create, Request) and isinstance(create.msg, CreateTopic)
    assert create.msg.name == "kv:new"


def test_compare_and_sets_past_the_bounds_are_refused_never_committed_unchecked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every compare-and-set staged is checked at its commit: one that could not be
    remembered (past a transaction's limits.batch_records_max, or with the table of
    transactions full) is refused before it is staged. They went unremembered, and the
    commit was sent checked against the others, or against none."""
    from actors import front_kv

    s = state(batch_records_max=2, read_records_max=200)
    for seq, key in enumerate((b"a", b"b")):
        (write,) = s.request(ID, req("txn_kv", rid=seq + 1, txn=5, seq=seq, namespace="cfg",
                                     key=key, value=b"new", expected=b"old"), now=0.0)
        assert isinstance(write, Request)
    (third,) = s.request(ID, req("txn_kv", rid=3, txn=5, seq=2, namespace="cfg", key=b"c",
                                 value=b"new", expected=b"old"), now=0.0)
    assert reply_of(third)["code"] == ErrorCode.TXN_LIMIT
    assert s.kv.conds[5] == [(3, b"a", b"old"), (3, b"b", b"old")]

    monkeypatch.setattr(front_kv, "TXNS_REMEMBERED_MAX", 1)
    (other,) = s.request(ID, req("txn_kv", rid=4, txn=6, seq=0, namespace="cfg", key=b"a",
                                 value=b"new", expected=b"old"), now=1.0)
    assert reply_of(other)["code"] == ErrorCode.TXN_LIMIT
    assert list(s.kv.conds) == [5]  # no empty entry left for the refused one
    # Past twice the longest transaction timeout, transaction 5 was rolled back by the
    # transaction manager: its conditions make room, and its commit goes unchecked (the
    # transaction manager refuses it).
    later = s.kv.cond_horizon_s + 1
    (taken,) = s.request(ID, req("txn_kv", rid=5, txn=6, seq=0, namespace="cfg", key=b"a",
                                 value=b"new", expected=b"old"), now=later)
    assert isinstance(taken, Request) and list(s.kv.conds) == [6]
    (commit,) = s.request(ID, req("txn_commit", rid=6, txn=5), now=later)
    assert isinstance(commit, Request) and isinstance(commit.msg, TxnStep)
    assert commit.msg.checked is False


def test_a_commit_with_compare_and_sets_that_timed_out_undecided_is_decided_at_its_retry() -> None:
    """A commit with compare-and-sets is decided once nothing of its keys is in flight. One
    that times out before it is decided was never sent (a put of its key held at a blocking
    checkpoint's gate, which waits for this transaction, keeps it waiting past its time):
    its conditions stay for its retry. They were dropped with it, so the client's retry
    went to the transaction manager unchecked and was refused TXN_CONFLICT, as after a
    restart of the front door, and the transaction could only be rolled back."""
    s = state(request_timeout_ms=1000)
    (begin,) = s.request(ID, req("txn_begin", rid=1, txn=5), now=0.0)
    assert isinstance(begin, Request)
    s.answer(TxnId(begin.corr, 5))
    (write,) = s.request(ID, req("txn_kv", rid=2, txn=5, seq=0, namespace="cfg", key=b"k",
                                 value=b"new", expected=b"old"), now=0.0)
    assert isinstance(write, Request)
    s.answer(TxnWritten(write.corr, 4, 1))
    (put,) = s.request(ID, req("kv_put", rid=3, namespace="cfg", key=b"k", value=b"old",
                               producer_id=1, seq=0), now=0.0)
    assert isinstance(put, Produce)  # in flight: the commit waits for it
    assert s.request(ID, req("txn_commit", rid=4, txn=5, writes=1), now=0.0) == []
    late = [reply_of(r) for r in s.expire(1.0)]  # both: the put may still be logged
    assert [(r["id"], r["code"]) for r in late] == [(3, ErrorCode.TIMEOUT), (4, ErrorCode.TIMEOUT)]
    assert s.request(ID, req("txn_commit", rid=5, txn=5, writes=1), now=1.1) == []  # waits again
    # The put's late answer (logged after all the front door knew durable when it was
    # sent: not a retry's): its value is known.
    (commit,) = s.ack(put.corr, s.lsn_seen + 1, [(0, 0, 1)])
    assert isinstance(commit, Request) and isinstance(commit.msg, TxnStep)
    assert (commit.msg.step, commit.msg.checked) == ("commit", True)  # decided on b"old"
    (rep,) = s.answer(TxnCommitted(commit.corr, s.lsn_seen + 1, []))
    assert (reply_of(rep)["id"], reply_of(rep)["ok"]) == (5, True)
    assert not s.pending and not s.kv.commits and not s.kv.conds


def test_a_deleted_topic_leaves_nothing_in_the_kv_state() -> None:
    s = state()
    s.kv.partitions_written(1, [(p, 0, 1) for p in range(4)])
    s.kv.partitions_written(3, [(0, 0, 1)])
    s.catalog(Catalog(8, [Topic("one", 1, 2), Topic("kv:cfg", 1, 3)], 8))  # "t" deleted
    assert set(s.kv.state.partition_generation) == {(3, 0)}
