"""The front door's logic, with no I/O: check a client request, route it, match the answer.

``FrontDoorState.request`` turns one client frame into instructions: answer the client at
once (an error), or send a message to an actor and wait for its answer under a fresh
correlation id. Requests are checked against the table of ops (``wire.protocol.OPS``) and
routed by op: ``produce`` on the hot path, every other op by its entry in ``routes``, which
must cover the table. ``answer`` turns an actor's reply into the client's reply frame,
``expire`` answers TIMEOUT for requests nobody answered in time, and ``catalog`` keeps the
topic table the log manager sends. The shell in ``actors/front_door.py`` owns the sockets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

import msgpack

from actors.instructions import Produce, Reply, Request
from actors.roles import (
    CACHE_MANAGER,
    LOG_MANAGER,
    SUPERVISOR,
    TRANSACTION_MANAGER,
    key_partition,
    shard_owner,
    writer_role,
    writes_role,
)
from config import NodeConfig
from wire import protocol
from wire.codec import Message
from wire.errors import ErrorCode, NodeError
from wire.messages import (
    Ack,
    Answer,
    Catalog,
    Checkpoint,
    CommitOffset,
    CommittedOffset,
    CreateTopic,
    DeleteTopic,
    Done,
    EndOffsets,
    ErrorReply,
    ListTopics,
    OffsetForTimestamp,
    OffsetsReply,
    PartRow,
    PlacedRow,
    Read,
    ReadByKey,
    ReadByTag,
    RecordsReply,
    StatusReply,
    StatusRequest,
    TopicsReply,
    TxnBegin,
    TxnCommitted,
    TxnId,
    TxnList,
    TxnsReply,
    TxnStep,
    TxnWrite,
    TxnWritten,
    ValueReply,
)
from wire.protocol import Topic
from wire.records import check_batch, key_of

log = logging.getLogger("shardnode")

STOPPING_TEXT = "the front door is stopping (node stop or restart); retry"


# The instructions (actors/instructions.py) the front door's logic gives its shell.
Out = Reply | Request | Produce

# How an op other than produce is routed: from its checked fields, the actor to send to and
# the message to send it (given the request's correlation id, allocated once routing passed).
Target = tuple[str, Callable[[int], Message]]
Route = Callable[[dict[str, Any]], Target]


@dataclass(slots=True)
class Waiting:
    identity: bytes
    rid: int
    deadline: float
    assign: list[int] | None = None  # produce split by key: the partition of each record
    parts: list[list[int]] | None = None  # txn_produce: [partition, count] of each part


class FrontDoorState:
    def __init__(self, cfg: NodeConfig) -> None:
        self.lim = cfg.limits
        self.writers = cfg.node.writers
        self.checkpoint_timeout_ms = cfg.log.checkpoint_timeout_ms
        self.writes_to = writes_role(cfg)  # the actor write requests go to
        self.topics: dict[str, Topic] = {}  # by name
        self.catalog_version = -1
        self.pending: dict[int, Waiting] = {}
        self.next_corr = 1
        self.lsn_seen = 0  # highest LSN answered as durable: reads wait for it
        self.requests = 0
        self.errors = 0
        self.timeouts = 0
        self.routes: dict[str, Route] = {
            "read": self.read,
            "read_by_key": self.read_by_key,
            "read_by_tag": self.read_by_tag,
            "offset_for_timestamp": self.offset_for_timestamp,
            "committed_offset": self.committed_offset,
            "create_topic": self.create_topic,
            "delete_topic": self.delete_topic,
            "commit_offset": self.commit_offset,
            "list_topics": self.list_topics,
            "end_offsets": self.end_offsets,
            "checkpoint": self.checkpoint,
            "status": self.status,
            "txn_begin": self.txn_begin,
            "txn_commit_offset": self.txn_commit_offset,
            "txn_commit": lambda req: self.txn_step(req, "commit"),
            "txn_abort": lambda req: self.txn_step(req, "rollback"),
            "xa_start": self.txn_begin,
            "xa_end": lambda req: self.txn_step(req, "end"),
            "xa_prepare": lambda req: self.txn_step(req, "prepare"),
            "xa_commit": lambda req: self.txn_step(
                req, "commit_one_phase" if req.get("one_phase") else "commit"),
            "xa_rollback": lambda req: self.txn_step(req, "rollback"),
            "xa_recover": lambda _req: (TRANSACTION_MANAGER, lambda c: TxnList(c, True)),
            "txn_list": lambda _req: (TRANSACTION_MANAGER, lambda c: TxnList(c, False)),
        }
        missing = protocol.OPS.keys() - self.routes.keys() - {"produce", "txn_produce"}
        assert not missing, f"ops of wire.protocol.OPS with no route: {sorted(missing)}"
        # Ops that take longer than a request: a checkpoint flushes every shard.
        self.timeouts_ms = {"checkpoint": 3 * self.checkpoint_timeout_ms}

    # ---- requests ---------------------------------------------------------------------

    def request(self, identity: bytes, frames: list[bytes], now: float) -> list[Out]:
        """One client message (its frames after the identity): one request or several."""
        if len(frames) != 1:
            self.requests += 1
            self.errors += 1
            return [Reply(identity, protocol.error(0, ErrorCode.BAD_REQUEST,
                                                      "a request is exactly one frame"))]
        out: list[Out] = []
        for parsed in protocol.parse_requests(frames[0], self.lim.frame_bytes_max):
            self.requests += 1
            if isinstance(parsed, NodeError):
                self.errors += 1
                out.append(Reply(identity, protocol.error(
                    getattr(parsed, "request_id", 0), parsed.code, parsed.message)))
                continue
            rid, op, req = parsed
            try:
                out.append(self.route(identity, rid, op, req, now))
            except NodeError as exc:
                self.errors += 1
                out.append(Reply(identity, protocol.error(rid, exc.code, exc.message)))
            except Exception as exc:  # a request must never take the front door down
                log.exception("request %d failed", rid)
                self.errors += 1
                out.append(Reply(identity, protocol.error(rid, ErrorCode.INTERNAL,
                                                             f"{type(exc).__name__}: {exc}")))
        return out

    def topic(self, name: str) -> Topic:
        if self.catalog_version < 0:
            raise NodeError("the node is starting; retry shortly", ErrorCode.UNAVAILABLE)
        t = self.topics.get(name)
        if t is None:
            raise NodeError(f"topic {name!r} does not exist", ErrorCode.UNKNOWN_TOPIC)
        return t

    def partition(self, name: str, partition: int) -> tuple[int, int]:
        """(topic_id, partition) of an existing partition."""
        t = self.topic(name)
        if not 0 <= partition < t.partitions:
            raise NodeError(f"topic {name!r} has partitions 0..{t.partitions - 1}, not "
                            f"{partition}", ErrorCode.UNKNOWN_PARTITION)
        return t.topic_id, partition

    def writer_of(self, topic_id: int, partition: int) -> str:
        return writer_role(shard_owner(topic_id, partition, self.writers))

    def wait(self, identity: bytes, rid: int, now: float, assign: list[int] | None = None,
             timeout_ms: int | None = None) -> int:
        if len(self.pending) >= self.lim.pending_requests_max:
            raise NodeError(f"{len(self.pending)} requests in flight; retry later", ErrorCode.BUSY)
        corr = self.next_corr
        self.next_corr += 1
        deadline = now + (timeout_ms or self.lim.request_timeout_ms) / 1000
        self.pending[corr] = Waiting(identity, rid, deadline, assign)
        return corr

    def route(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
              now: float) -> Request | Produce:
        try:
            if op == "produce":  # the hot path
                return self.produce(identity, rid, req, now)
            if op == "txn_produce":
                return self.txn_produce(identity, rid, req, now)
            role, make = self.routes[op](req)
            corr = self.wait(identity, rid, now, timeout_ms=self.timeouts_ms.get(op))
            return Request(role, corr, make(corr))
        except NodeError as exc:
            exc.request_id = rid  # type: ignore[attr-defined]
            raise

    # ---- routes: an op's checked fields → (the actor, the message given its corr) ------

    def read(self, req: dict[str, Any]) -> Target:
        # Only reads by offset can be served from the cache.
        tid, p = self.partition(req["topic"], req["partition"])
        offset, n, lsn = req["offset"], self.records_max(req), self.lsn_seen
        return CACHE_MANAGER, lambda c: Read(c, tid, p, offset, n, lsn)

    def read_by_key(self, req: dict[str, Any]) -> Target:
        tid, p = self.partition(req["topic"], req["partition"])
        key, lsn = req["key"], self.lsn_seen
        return self.writer_of(tid, p), lambda c: ReadByKey(c, tid, p, key, lsn)

    def read_by_tag(self, req: dict[str, Any]) -> Target:
        tid, p = self.partition(req["topic"], req["partition"])
        tag, offset, n, lsn = req["tag"], req["offset"], self.records_max(req), self.lsn_seen
        return self.writer_of(tid, p), lambda c: ReadByTag(c, tid, p, tag, offset, n, lsn)

    def offset_for_timestamp(self, req: dict[str, Any]) -> Target:
        tid, p = self.partition(req["topic"], req["partition"])
        ts, lsn = req["timestamp"], self.lsn_seen
        return self.writer_of(tid, p), lambda c: OffsetForTimestamp(c, tid, p, ts, lsn)

    def committed_offset(self, req: dict[str, Any]) -> Target:
        tid, p = self.partition(req["topic"], req["partition"])
        group, lsn = req["group"], self.lsn_seen
        return self.writer_of(tid, p), lambda c: CommittedOffset(c, group, tid, p, lsn)

    def create_topic(self, req: dict[str, Any]) -> Target:
        name, partitions = req["name"], req["partitions"]
        protocol.check_name("topic name", name)
        return self.writes_to, lambda c: CreateTopic(c, name, partitions)

    def delete_topic(self, req: dict[str, Any]) -> Target:
        name = req["name"]
        self.topic(name)
        return self.writes_to, lambda c: DeleteTopic(c, name)

    def commit_offset(self, req: dict[str, Any]) -> Target:
        group, offset = req["group"], req["offset"]
        protocol.check_name("group name", group)
        tid, p = self.partition(req["topic"], req["partition"])
        return self.writes_to, lambda c: CommitOffset(c, group, tid, p, offset)

    def list_topics(self, _req: dict[str, Any]) -> Target:
        return LOG_MANAGER, ListTopics

    def end_offsets(self, req: dict[str, Any]) -> Target:
        tid = self.topic(req["topic"]).topic_id
        return LOG_MANAGER, lambda c: EndOffsets(c, tid)

    def checkpoint(self, _req: dict[str, Any]) -> Target:
        return LOG_MANAGER, lambda c: Checkpoint(c, "front")

    def status(self, _req: dict[str, Any]) -> Target:
        return SUPERVISOR, StatusRequest

    def records_max(self, req: dict[str, Any]) -> int:
        n: int = req["max_records"]
        return min(n, self.lim.read_records_max)

    def produce(self, identity: bytes, rid: int, req: dict[str, Any], now: float) -> Produce:
        # Round-robin by the producer's sequence number: a retry of the same request
        # places its records exactly as the first attempt did.
        parts, assign = self.split(req, req["producer_id"] + req["seq"])
        corr = self.wait(identity, rid, now, assign)
        return Produce(corr, (req["producer_id"], req["seq"], parts))

    def split(self, req: dict[str, Any], rr: int) -> tuple[list[PartRow], list[int] | None]:
        """A produce's records checked and split by partition: the parts, and the partition
        of each record when the batch was split by key. ``rr`` picks the partition of
        keyless records."""
        name = req["topic"]
        t = self.topic(name)
        topic_id, partitions = t.topic_id, t.partitions
        blob = req["records"]
        items = check_batch(blob, self.lim.batch_records_max, self.lim.value_bytes_max)
        assign = None
        partition = req.get("partition")
        parts: list[PartRow]
        if partition is not None:
            self.partition(name, partition)
            return [(topic_id, partition, len(items), blob)], None
        keys = [key_of(it) for it in items]
        if partitions == 1 or all(k is None for k in keys):
            return [(topic_id, rr % partitions, len(items), blob)], None
        # By key hash; records without a key go to this batch's round-robin pick.
        assign = [rr % partitions if k is None else key_partition(k, partitions) for k in keys]
        split: dict[int, list[Any]] = {}
        for p, item in zip(assign, items, strict=True):
            split.setdefault(p, []).append(item)
        if len(split) == 1:
            return [(topic_id, assign[0], len(items), blob)], None
        parts = [(topic_id, p, len(recs), msgpack.packb(recs, use_bin_type=True))
                 for p, recs in sorted(split.items())]
        return parts, assign

    # ---- transactions: to the transaction manager -------------------------------------

    def txn_produce(self, identity: bytes, rid: int, req: dict[str, Any], now: float) -> Request:
        txn, seq = req["txn"], req["seq"]
        parts, assign = self.split(req, txn + seq)
        corr = self.wait(identity, rid, now, assign)
        self.pending[corr].parts = [[p, n] for _t, p, n, _b in parts]
        return Request(TRANSACTION_MANAGER, corr, TxnWrite(corr, txn, seq, parts, ()))

    def txn_commit_offset(self, req: dict[str, Any]) -> Target:
        group, offset, txn, seq = req["group"], req["offset"], req["txn"], req["seq"]
        protocol.check_name("group name", group)
        tid, p = self.partition(req["topic"], req["partition"])
        return TRANSACTION_MANAGER, lambda c: TxnWrite(c, txn, seq, (), ((group, tid, p, offset),))

    def txn_begin(self, req: dict[str, Any]) -> Target:
        timeout_ms, xid, txn = req.get("timeout_ms", 0), req.get("xid"), req.get("txn", 0)
        return TRANSACTION_MANAGER, lambda c: TxnBegin(c, timeout_ms, xid, txn)

    def txn_step(self, req: dict[str, Any], step: str) -> Target:
        txn, xid, writes = req.get("txn", 0), req.get("xid"), req.get("writes", -1)
        return TRANSACTION_MANAGER, lambda c: TxnStep(c, txn, xid, step, writes)

    # ---- answers ----------------------------------------------------------------------

    def catalog(self, msg: Catalog) -> None:
        if msg.version >= self.catalog_version:
            self.catalog_version = msg.version
            self.topics = {t.name: t for t in msg.topics}
            # A restarted front door has acknowledged nothing yet, but its clients may have
            # been told of writes up to the durable LSN: reads wait for those too.
            self.lsn_seen = max(self.lsn_seen, msg.version, msg.durable_lsn)

    def ack(self, corr: int, lsn: int, parts: Sequence[PlacedRow]) -> list[Out]:
        """A produce request is durable (an ``Ack``, or a row of ``Acks``): its reply."""
        w = self.pending.pop(corr, None)
        if w is None:
            return []  # answered already (timed out) or never ours
        if lsn > self.lsn_seen:
            self.lsn_seen = lsn
        fields: dict[str, Any] = {"lsn": lsn, "parts": parts}
        if w.assign is not None:
            fields["assign"] = w.assign
        return [Reply(w.identity, protocol.ok(w.rid, **fields))]

    def answer(self, msg: Answer) -> list[Out]:
        """An actor's answer: the client's reply, if the request is still waiting. The reply
        carries the fields ``wire.protocol.OPS`` lists for the request's op."""
        if isinstance(msg, Ack):
            return self.ack(msg.corr, msg.lsn, msg.parts)
        w = self.pending.pop(msg.corr, None)
        if w is None:
            return []  # answered already (timed out) or never ours
        match msg:
            case Done(lsn=lsn):
                self.lsn_seen = max(self.lsn_seen, lsn)
                frame = protocol.ok(w.rid, lsn=lsn)
            case RecordsReply(records=records, commit_lsn=commit_lsn):
                # Every read after this one waits for the transactions this one saw: no
                # reader sees a transaction in one partition and not in another.
                self.lsn_seen = max(self.lsn_seen, commit_lsn)
                frame = protocol.ok(w.rid, records=records)
            case ValueReply(value=value, commit_lsn=commit_lsn):
                self.lsn_seen = max(self.lsn_seen, commit_lsn)
                frame = protocol.ok(w.rid, value=value)
            case TxnId(txn=txn):
                frame = protocol.ok(w.rid, txn=txn)
            case TxnWritten(records=records):
                if w.parts is None:
                    frame = protocol.ok(w.rid, records=records)
                elif w.assign is None:
                    frame = protocol.ok(w.rid, records=records, parts=w.parts)
                else:
                    frame = protocol.ok(w.rid, records=records, parts=w.parts, assign=w.assign)
            case TxnCommitted(lsn=lsn, parts=parts):
                self.lsn_seen = max(self.lsn_seen, lsn)
                frame = protocol.ok(w.rid, lsn=lsn, parts=parts)
            case TxnsReply(field=name, rows=rows):
                frame = protocol.ok(w.rid, **{name: rows})
            case OffsetsReply(lsn=lsn, offsets=offsets):
                self.lsn_seen = max(self.lsn_seen, lsn)  # reads below the offsets see them
                frame = protocol.ok(w.rid, offsets=offsets)
            case TopicsReply(topics=topics):
                frame = protocol.ok(w.rid, topics=topics)
            case StatusReply(status=status):
                frame = protocol.ok(w.rid, status=status)
            case ErrorReply(code=code, text=text):
                self.errors += 1
                frame = protocol.error(w.rid, code, text)
            case _:
                assert_never(msg)
        return [Reply(w.identity, frame)]

    def fail(self, corrs: list[int], code: ErrorCode, text: str) -> list[Out]:
        """Answer these waiting requests with an error (their actor could not take them)."""
        out: list[Out] = []
        for corr in corrs:
            w = self.pending.pop(corr, None)
            if w is not None:
                self.errors += 1
                out.append(Reply(w.identity, protocol.error(w.rid, code, text)))
        return out

    def expire(self, now: float) -> list[Out]:
        late = [corr for corr, w in self.pending.items() if w.deadline <= now]
        self.timeouts += len(late)
        return self.fail(late, ErrorCode.TIMEOUT, "no answer in time; retrying is safe "
                         "(produce is idempotent)")

    def stop(self) -> list[Out]:
        return self.fail(list(self.pending), ErrorCode.UNAVAILABLE, STOPPING_TEXT)
