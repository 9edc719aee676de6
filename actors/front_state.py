"""The front door's logic, with no I/O: check a client request, route it, match the answer.

``FrontDoorState.request`` turns one client frame into instructions: answer the client at
once (an error), or send a message to an actor and wait for its answer under a fresh
correlation id. ``answer`` turns an actor's reply into the client's reply frame, ``expire``
answers TIMEOUT for requests nobody answered in time, and ``catalog`` keeps the topic table
the log manager sends. The shell in ``actors/front_door.py`` owns the sockets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgpack

from actors.instructions import Produce, Reply, Request
from actors.roles import (
    CACHE_MANAGER,
    LOG_MANAGER,
    SUPERVISOR,
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
    Catalog,
    Checkpoint,
    CommitOffset,
    CommittedOffset,
    CreateTopic,
    DeleteTopic,
    Done,
    ErrorReply,
    ListTopics,
    OffsetForTimestamp,
    Read,
    ReadByKey,
    ReadByTag,
    RecordsReply,
    StatusReply,
    StatusRequest,
    TopicsReply,
    ValueReply,
)
from wire.records import check_batch, key_of

log = logging.getLogger("shardnode")

STOPPING_TEXT = "the front door is stopping (node stop or restart); retry"


# The instructions (actors/instructions.py) the front door's logic gives its shell.
Out = Reply | Request | Produce


@dataclass(slots=True)
class Waiting:
    identity: bytes
    rid: int
    deadline: float
    assign: list[int] | None = None  # produce split by key: the partition of each record


class FrontDoorState:
    def __init__(self, cfg: NodeConfig) -> None:
        self.lim = cfg.limits
        self.writers = cfg.node.writers
        self.checkpoint_timeout_ms = cfg.log.checkpoint_timeout_ms
        self.writes_to = writes_role(cfg)  # the actor write requests go to
        self.topics: dict[str, tuple[int, int]] = {}  # name → (topic_id, partitions)
        self.catalog_version = -1
        self.pending: dict[int, Waiting] = {}
        self.next_corr = 1
        self.lsn_seen = 0  # highest LSN answered as durable: reads wait for it
        self.requests = 0
        self.errors = 0
        self.timeouts = 0

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

    def topic(self, name: str) -> tuple[int, int]:
        if self.catalog_version < 0:
            raise NodeError("the node is starting; retry shortly", ErrorCode.UNAVAILABLE)
        t = self.topics.get(name)
        if t is None:
            raise NodeError(f"topic {name!r} does not exist", ErrorCode.UNKNOWN_TOPIC)
        return t

    def partition(self, name: str, partition: int) -> tuple[int, int]:
        topic_id, partitions = self.topic(name)
        if not 0 <= partition < partitions:
            raise NodeError(f"topic {name!r} has partitions 0..{partitions - 1}, not {partition}",
                            ErrorCode.UNKNOWN_PARTITION)
        return topic_id, partition

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
        if op == "produce":  # the hot path: no closure below is needed for it
            try:
                return self.produce(identity, rid, req, now)
            except NodeError as exc:
                exc.request_id = rid  # type: ignore[attr-defined]
                raise

        def to(role: str, make: Any, **kw: Any) -> Request:
            corr = self.wait(identity, rid, now, **kw)
            return Request(role, corr, make(corr))

        lsn = self.lsn_seen
        try:
            if op in ("read", "read_by_key", "read_by_tag", "offset_for_timestamp",
                      "committed_offset"):
                tid, p = self.partition(req["topic"], req["partition"])
                n = min(req.get("max_records", 0), self.lim.read_records_max)
                if op == "read":  # only reads by offset can be served from the cache
                    return to(CACHE_MANAGER, lambda c: Read(c, tid, p, req["offset"], n, lsn))
                writer = self.writer_of(tid, p)
                if op == "read_by_key":
                    return to(writer, lambda c: ReadByKey(c, tid, p, req["key"], lsn))
                if op == "read_by_tag":
                    return to(writer, lambda c: ReadByTag(c, tid, p, req["tag"], req["offset"],
                                                          n, lsn))
                if op == "offset_for_timestamp":
                    return to(writer, lambda c: OffsetForTimestamp(c, tid, p, req["timestamp"],
                                                                   lsn))
                return to(writer, lambda c: CommittedOffset(c, req["group"], tid, p, lsn))
            if op == "create_topic":
                protocol.check_name("topic name", req["name"])
                return to(self.writes_to,
                          lambda c: CreateTopic(c, req["name"], req["partitions"]))
            if op == "delete_topic":
                self.topic(req["name"])
                return to(self.writes_to, lambda c: DeleteTopic(c, req["name"]))
            if op == "commit_offset":
                protocol.check_name("group name", req["group"])
                tid, p = self.partition(req["topic"], req["partition"])
                return to(self.writes_to,
                          lambda c: CommitOffset(c, req["group"], tid, p, req["offset"]))
            if op == "list_topics":
                return to(LOG_MANAGER, ListTopics)
            if op == "checkpoint":
                return to(LOG_MANAGER, lambda c: Checkpoint(c, "front"),
                          timeout_ms=3 * self.checkpoint_timeout_ms)
            if op == "status":
                return to(SUPERVISOR, StatusRequest)
        except NodeError as exc:
            exc.request_id = rid  # type: ignore[attr-defined]
            raise
        raise NodeError(f"op {op!r} has no route", ErrorCode.UNKNOWN_OP)  # parse_request stops it

    def produce(self, identity: bytes, rid: int, req: dict[str, Any], now: float) -> Produce:
        name = req["topic"]
        topic_id, partitions = self.topic(name)
        blob = req["records"]
        items = check_batch(blob, self.lim.batch_records_max, self.lim.value_bytes_max)
        assign = None
        partition = req.get("partition")
        if partition is not None:
            self.partition(name, partition)
            parts = [[topic_id, partition, len(items), blob]]
        else:
            keys = [key_of(it) for it in items]
            # Round-robin by the producer's sequence number: a retry of the same request
            # places its records exactly as the first attempt did.
            rr = req["producer_id"] + req["seq"]
            if partitions == 1 or all(k is None for k in keys):
                parts = [[topic_id, rr % partitions, len(items), blob]]
            else:
                # By key hash; records without a key go to this batch's round-robin pick.
                assign = [rr % partitions if k is None else key_partition(k, partitions)
                          for k in keys]
                split: dict[int, list[Any]] = {}
                for p, item in zip(assign, items, strict=True):
                    split.setdefault(p, []).append(item)
                if len(split) == 1:
                    parts = [[topic_id, assign[0], len(items), blob]]
                    assign = None
                else:
                    parts = [[topic_id, p, len(recs), msgpack.packb(recs, use_bin_type=True)]
                             for p, recs in sorted(split.items())]
        corr = self.wait(identity, rid, now, assign)
        return Produce(corr, [req["producer_id"], req["seq"], parts])

    # ---- answers ----------------------------------------------------------------------

    def catalog(self, msg: Catalog) -> None:
        if msg.version >= self.catalog_version:
            self.catalog_version = msg.version
            self.topics = {name: (tid, parts) for tid, name, parts in msg.topics}
            # A restarted front door has acknowledged nothing yet, but its clients may have
            # been told of writes up to the durable LSN: reads wait for those too.
            self.lsn_seen = max(self.lsn_seen, msg.version, msg.durable_lsn)

    def ack(self, corr: int, lsn: int, parts: list[Any]) -> list[Out]:
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

    def answer(self, msg: Message) -> list[Out]:
        """An actor's answer: the client's reply, if the request is still waiting."""
        if isinstance(msg, Ack):
            return self.ack(msg.corr, msg.lsn, msg.parts)
        corr = getattr(msg, "corr", None)
        w = self.pending.pop(corr, None) if corr is not None else None
        if w is None:
            return []  # answered already (timed out) or never ours
        if isinstance(msg, Done):
            self.lsn_seen = max(self.lsn_seen, msg.lsn)
            frame = protocol.ok(w.rid, lsn=msg.lsn)
        elif isinstance(msg, RecordsReply):
            frame = protocol.ok(w.rid, records=msg.records)
        elif isinstance(msg, ValueReply):
            frame = protocol.ok(w.rid, value=msg.value)
        elif isinstance(msg, TopicsReply):
            frame = protocol.ok(w.rid, topics=msg.topics)
        elif isinstance(msg, StatusReply):
            frame = protocol.ok(w.rid, status=msg.status)
        elif isinstance(msg, ErrorReply):
            self.errors += 1
            frame = protocol.error(w.rid, msg.code, msg.text)
        else:
            frame = protocol.error(w.rid, ErrorCode.INTERNAL, f"unexpected {type(msg).__name__}")
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
