"""The front door actor: the client socket.

It owns one ROUTER socket on ``host:port``. Each request is decoded and checked against
``wire.protocol``; produce batches are checked record by record once, here, and split by
key hash when the client named no partition. Requests go on to the log manager (writes)
or the cache manager (reads) tagged with a correlation id; answers come back to this
actor's mailbox and are matched to the waiting client. It never touches the disk and
never blocks: a full queue is answered BUSY, a request nobody answered in
``request_timeout_ms`` is answered TIMEOUT, and bad input gets an error code and message.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from actors.base import (
    CACHE_MANAGER,
    LOG_MANAGER,
    SUPERVISOR,
    TRANSACTION_MANAGER,
    Actor,
    ActorContext,
    owner,
    writer_role,
)
from wire import codec, protocol
from wire.codec import Message
from wire.errors import ErrorCode, NodeError
from wire.messages import (
    Ack,
    Append,
    Catalog,
    Checkpoint,
    CommitOffset,
    CommittedOffset,
    CreateTopic,
    DeleteTopic,
    Done,
    ErrorReply,
    Hello,
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

CLIENT_BURST_MAX = 1024  # client frames read per poll before looking at the mailbox


@dataclass(slots=True)
class Waiting:
    identity: bytes
    rid: int
    deadline: float
    assign: list[int] | None = None  # produce split by key: the partition of each record


class FrontDoor(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self.router = self.zctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVHWM, self.cfg.limits.mailbox_messages_max)
        self.router.setsockopt(zmq.SNDHWM, self.cfg.limits.mailbox_messages_max)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # Frames up to twice the limit are read and answered FRAME_TOO_LARGE; ZeroMQ drops
        # the connection of a client that sends more, so no frame can exhaust memory.
        self.router.setsockopt(zmq.MAXMSGSIZE, 2 * self.cfg.limits.frame_bytes_max)
        self.router.bind(self.cfg.endpoint)
        self.poller.register(self.router, zmq.POLLIN)
        self.topics: dict[str, tuple[int, int]] = {}  # name → (topic_id, partitions)
        self.catalog_version = -1
        self.pending: dict[int, Waiting] = {}
        self.outbox: dict[str, list[tuple[int, bytes]]] = {}  # role → [(corr, frame)]
        self.next_corr = 1
        self.round_robin: dict[str, int] = {}
        self.lsn_seen = 0  # highest LSN answered as durable: reads wait for it
        self.requests = 0
        self.errors = 0
        self.timeouts = 0
        self.lim = self.cfg.limits

    def on_start(self) -> None:
        self.send(LOG_MANAGER, Hello(self.role), wait_ms=100)
        log.info("listening on %s", self.cfg.endpoint)

    def on_stop(self) -> None:
        for w in self.pending.values():
            self.router.send_multipart([w.identity, protocol.error(
                w.rid, ErrorCode.UNAVAILABLE, "the front door is stopping (node stop or restart); retry")])
        self.pending.clear()
        self.router.close(0)

    # ---- client side ------------------------------------------------------------------

    def on_socket(self, sock: zmq.Socket[bytes]) -> None:
        try:
            self.read_clients()
        finally:
            self.flush_outbox()

    def read_clients(self) -> None:
        for _ in range(CLIENT_BURST_MAX):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.requests += 1
            identity = frames[0]
            if len(frames) != 2:
                self.answer(identity, protocol.error(0, ErrorCode.BAD_REQUEST,
                                                     "a request is exactly one frame"))
                continue
            try:
                self.on_request(identity, frames[1])
            except NodeError as exc:
                rid = getattr(exc, "request_id", 0)
                self.answer(identity, protocol.error(rid, exc.code, exc.message))

    def answer(self, identity: bytes, frame: bytes) -> None:
        try:
            self.router.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.Again:
            self.note("client send queue full; reply dropped")

    def on_request(self, identity: bytes, frame: bytes) -> None:
        rid, op, req = protocol.parse_request(frame, self.lim.frame_bytes_max)
        try:
            self.route(identity, rid, op, req)
        except NodeError as exc:
            exc.request_id = rid  # type: ignore[attr-defined]
            raise

    def writer_of(self, topic_id: int, partition: int) -> str:
        return writer_role(owner(topic_id, partition, self.cfg.node.writers))

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

    def wait_for(self, identity: bytes, rid: int, assign: list[int] | None = None,
                 timeout_ms: int | None = None) -> int:
        if len(self.pending) >= self.lim.pending_requests_max:
            raise NodeError(f"{len(self.pending)} requests in flight; retry later", ErrorCode.BUSY)
        corr = self.next_corr
        self.next_corr += 1
        deadline = time.monotonic() + (timeout_ms or self.lim.request_timeout_ms) / 1000
        self.pending[corr] = Waiting(identity, rid, deadline, assign)
        return corr

    def forward(self, role: str, corr: int, msg: Message) -> None:
        """Queue a request for an actor; the burst's requests go out together."""
        self.outbox.setdefault(role, []).append((corr, codec.encode(msg)))

    def flush_outbox(self) -> None:
        for role, items in self.outbox.items():
            if items and not self.send_many(role, [frame for _corr, frame in items]):
                for corr, _frame in items:
                    w = self.pending.pop(corr, None)
                    if w is not None:
                        self.answer(w.identity, protocol.error(
                            w.rid, ErrorCode.BUSY, f"the {role} queue is full; retry later"))
            items.clear()

    def route(self, identity: bytes, rid: int, op: str, req: dict[str, Any]) -> None:
        if op == "produce":
            self.produce(identity, rid, req)
        elif op in ("read", "read_by_key", "read_by_tag", "offset_for_timestamp"):
            topic_id, partition = self.partition(req["topic"], req["partition"])
            corr = self.wait_for(identity, rid)
            lsn = self.lsn_seen
            n = min(req.get("max_records", 0), self.lim.read_records_max)
            msg: Message
            if op == "read":
                msg = Read(corr, topic_id, partition, req["offset"], n, lsn)
            elif op == "read_by_key":
                msg = ReadByKey(corr, topic_id, partition, req["key"], lsn)
            elif op == "read_by_tag":
                msg = ReadByTag(corr, topic_id, partition, req["tag"], req["offset"], n, lsn)
            else:
                msg = OffsetForTimestamp(corr, topic_id, partition, req["timestamp"], lsn)
            # Only reads by offset can be served from the cache; the rest go to the writer.
            self.forward(CACHE_MANAGER if op == "read" else self.writer_of(topic_id, partition),
                         corr, msg)
        elif op == "create_topic":
            protocol.check_name("topic name", req["name"])
            corr = self.wait_for(identity, rid)
            self.forward(TRANSACTION_MANAGER, corr,
                         CreateTopic(corr, req["name"], req["partitions"]))
        elif op == "delete_topic":
            self.topic(req["name"])
            corr = self.wait_for(identity, rid)
            self.forward(TRANSACTION_MANAGER, corr, DeleteTopic(corr, req["name"]))
        elif op == "list_topics":
            corr = self.wait_for(identity, rid)
            self.forward(LOG_MANAGER, corr, ListTopics(corr))
        elif op == "commit_offset":
            protocol.check_name("group name", req["group"])
            topic_id, partition = self.partition(req["topic"], req["partition"])
            corr = self.wait_for(identity, rid)
            self.forward(TRANSACTION_MANAGER, corr,
                         CommitOffset(corr, req["group"], topic_id, partition, req["offset"]))
        elif op == "committed_offset":
            topic_id, partition = self.partition(req["topic"], req["partition"])
            corr = self.wait_for(identity, rid)
            self.forward(self.writer_of(topic_id, partition), corr,
                         CommittedOffset(corr, req["group"], topic_id, partition, self.lsn_seen))
        elif op == "checkpoint":
            corr = self.wait_for(identity, rid, timeout_ms=self.cfg.log.checkpoint_timeout_ms * 3)
            self.forward(LOG_MANAGER, corr, Checkpoint(corr, self.role))
        elif op == "status":
            corr = self.wait_for(identity, rid)
            self.forward(SUPERVISOR, corr, StatusRequest(corr))
        else:  # parse_request only lets known ops through
            raise NodeError(f"op {op!r} has no route", ErrorCode.UNKNOWN_OP)

    def produce(self, identity: bytes, rid: int, req: dict[str, Any]) -> None:
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
            rr = self.round_robin.get(name, 0)
            self.round_robin[name] = rr + 1
            if partitions == 1 or all(k is None for k in keys):
                parts = [[topic_id, rr % partitions, len(items), blob]]
            else:
                # By key hash; records without a key go to this batch's round-robin pick.
                assign = [rr % partitions if k is None else zlib.crc32(k) % partitions
                          for k in keys]
                split: dict[int, list[Any]] = {}
                for p, item in zip(assign, items, strict=False):
                    split.setdefault(p, []).append(item)
                if len(split) == 1:
                    (p, _), = split.items()
                    parts = [[topic_id, p, len(items), blob]]
                    assign = None
                else:
                    parts = [[topic_id, p, len(recs), msgpack.packb(recs, use_bin_type=True)]
                             for p, recs in sorted(split.items())]
        corr = self.wait_for(identity, rid, assign)
        self.forward(TRANSACTION_MANAGER, corr,
                     Append(corr, req["producer_id"], req["seq"], parts))

    # ---- actor side -------------------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, Catalog):
            if msg.version >= self.catalog_version:
                self.catalog_version = msg.version
                self.topics = {name: (tid, parts) for tid, name, parts in msg.topics}
                self.lsn_seen = max(self.lsn_seen, msg.version)
            return
        corr = getattr(msg, "corr", None)
        w = self.pending.pop(corr, None) if corr is not None else None
        if w is None:
            return  # answered already (timed out) or never ours
        if isinstance(msg, Ack):
            self.lsn_seen = max(self.lsn_seen, msg.lsn)
            fields: dict[str, Any] = {"lsn": msg.lsn, "parts": msg.parts}
            if w.assign is not None:
                fields["assign"] = w.assign
            frame = protocol.ok(w.rid, **fields)
        elif isinstance(msg, Done):
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
            log.error("front door got an unexpected %s", type(msg).__name__)
            frame = protocol.error(w.rid, ErrorCode.INTERNAL, f"unexpected {type(msg).__name__}")
        self.answer(w.identity, frame)

    def on_tick(self, now: float) -> None:
        late = [corr for corr, w in self.pending.items() if w.deadline <= now]
        for corr in late:
            w = self.pending.pop(corr)
            self.timeouts += 1
            self.answer(w.identity, protocol.error(
                w.rid, ErrorCode.TIMEOUT,
                f"no answer within {self.lim.request_timeout_ms} ms; retrying is safe"))
        if self.catalog_version < 0:
            self.send(LOG_MANAGER, Hello(self.role))

    def figures(self) -> dict[str, Any]:
        return {
            "mailbox": self.last_drain,
            "in_flight": len(self.pending),
            "requests": self.requests,
            "errors": self.errors,
            "timeouts": self.timeouts,
        }

