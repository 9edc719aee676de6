"""The front door's logic, with no I/O: check a client request, route it, match the answer.

``FrontDoorState.request`` turns one client frame into instructions: answer the client at
once (an error), or send a message to an actor and wait for its answer under a fresh
correlation id. Requests are checked against the table of ops (``wire.protocol.OPS``) and
routed by op: ``produce`` on the hot path, every other op by its entry in ``routes``, which
must cover the table. ``answer`` turns an actor's reply into the client's reply frame,
``expire`` answers TIMEOUT for requests nobody answered in time, and ``catalog`` keeps the
topic table the log manager sends. The shell in ``actors/front_door.py`` owns the sockets.

Two parts have modules of their own, given this one's waits: the key/value ops and what the
cache must know of transactions (``KvDoor``, ``actors/front_kv.py``), and on a member of a
cluster, forwarding, gathering and copying the catalog (``ClusterDoor``,
``actors/front_cluster.py``), which routes each request first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

import msgpack

from actors.cluster_state import ClusterView, Gather, join_offsets, join_produce
from actors.front_cluster import ClusterDoor
from actors.front_kv import (
    KV_OPS,
    LEAVES_OPEN,
    NOT_REFUSED,
    TXN_TRACKED_OPS,
    Decided,
    KvCond,
    KvDoor,
    KvRead,
)
from actors.instructions import Produce, Reply, Request, ToPeer
from actors.kv_state import KeyOp
from actors.memory_topics import MemoryTopics, OutOfRange
from actors.roles import (
    CACHE_MANAGER,
    FRONT_DOOR,
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
from wire import xid as xids
from wire.codec import Message
from wire.errors import ErrorCode, NodeError
from wire.messages import (
    Ack,
    AlterTopic,
    Answer,
    Catalog,
    Checkpoint,
    CommitOffset,
    CommittedOffset,
    Compact,
    CreateTopic,
    DeleteRecord,
    DeleteTopic,
    Done,
    EndOffsets,
    ErrorReply,
    Exported,
    ListTopics,
    OffsetForTimestamp,
    OffsetRow,
    OffsetsReply,
    PartRow,
    PlacedRow,
    Read,
    ReadByKey,
    ReadByTag,
    RecordsReply,
    ShardsReply,
    ShardStats,
    SnapshotExport,
    StatusReply,
    StatusRequest,
    TopicsReply,
    TxnBegin,
    TxnCommitted,
    TxnId,
    TxnList,
    TxnOnce,
    TxnOutcome,
    TxnsReply,
    TxnStep,
    TxnWrite,
    TxnWritten,
    ValueReply,
)
from wire.packer import pack
from wire.placement import place
from wire.protocol import KV_PREFIX, Topic
from wire.records import check_batch, key_of, pack_read

log = logging.getLogger("shardnode")

STOPPING_TEXT = "the front door is stopping (node stop or restart); retry"
# Ops every shard writer answers a part of (this node's shards; in a cluster, the member's).
WRITER_OPS = frozenset({"stats", "compact"})


# The instructions (actors/instructions.py) the front door's logic gives its shell.
Out = Reply | Request | Produce | ToPeer

# How an op other than produce is routed: from its checked fields, the actor to send to and
# the message to send it (given the request's correlation id, allocated once routing passed).
Target = tuple[str, Callable[[int], Message]]
Route = Callable[[dict[str, Any]], Target]


# An answer to a request the front door waits on, as the fields of a reply, or an error.
Fields = dict[str, Any]
Failure = tuple[int, str]
# What to do with a request's answer instead of replying (the request is one of the front
# door's own steps): given the waiting entry, the fields or the failure, the instructions.
Then = Callable[["Waiting", Fields | None, Failure | None], list[Out]]

# create_topic's fields that are topic settings
TOPIC_SETTING_FIELDS = ("storage", "retention_ms", "retention_bytes")
DELETE_OPS = frozenset({"delete_by_key", "delete_by_offset"})
BY_KEY_OPS = frozenset({"read_by_key", "delete_by_key"})  # their partition: the key's if unsaid
# Reads a memory topic answers from the front door's memory.
MEMORY_READ_OPS = frozenset({"read", "read_by_key", "read_by_tag", "offset_for_timestamp",
                             "end_offsets"})


def checked_xid(req: dict[str, Any]) -> list[Any] | None:
    """A request's xid, if it has one, checked before the front door keys anything by it
    (``KvDoor.track_txn``): an element that is an array or a map cannot be a key. Raises
    ``XAERInval`` as the transaction manager would."""
    xid = req.get("xid")
    if xid is not None:
        xids.check(xid)
    return xid


@dataclass(slots=True)
class Waiting:
    identity: bytes  # b"": a request of the front door's own (copying the catalog)
    rid: int
    deadline: float
    assign: list[int] | None = None  # produce split by key: the partition of each record
    parts: list[list[int]] | None = None  # txn_produce: [partition, count] of each part
    produced: list[Any] | None = None  # txn_once: [parts, assign] of each txn_produce write
    peer: int = 0  # forwarded to this member, whose answer is relayed
    parent: int = 0  # a part of the gathered request ``parent``; its answer goes there
    member: int = 0  # the member that answers this part
    gather: Gather | None = None  # this request is answered from parts
    then: Then | None = None
    topic_id: int = 0  # a produce's topic: its ack makes cached reads by key of it stale
    kv: KeyOp | None = None  # a KV write (answered by its ack), or one waiting its turn
    kv_read: KvRead | None = None
    commit: tuple[int, ...] | None = None  # a commit: the KV namespaces it may change
    barred: tuple[tuple[int, bytes], ...] = ()  # its compare-and-sets' keys, held meanwhile
    cond: KvCond | None = None  # a transaction's compare-and-set: its condition, remembered
    undecided: bool = False  # a commit with compare-and-sets waiting for its decision
    decided: Decided | None = None  # one decided and sent: its conditions, until its outcome


class FrontDoorState:
    def __init__(self, cfg: NodeConfig, first_corr: int = 1) -> None:
        self.lim = cfg.limits
        self.writers = cfg.node.writers
        self.checkpoint_timeout_ms = cfg.log.checkpoint_timeout_ms
        self.writes_to = writes_role(cfg)  # the actor write requests go to
        self.topics: dict[str, Topic] = {}  # by name
        self.catalog_version = -1
        self.pending: dict[int, Waiting] = {}
        # The shell starts it somewhere no earlier front door's ids could be (``first_corr``):
        # the actors and the other members may still answer requests of a front door that
        # restarted (ZeroMQ delivers what was queued for it to the new one), and such an
        # answer must not match a new request.
        self.next_corr = first_corr
        self.lsn_seen = 0  # highest LSN answered as durable: reads wait for it
        self.requests = 0
        self.errors = 0
        self.timeouts = 0
        self.clock = 0.0  # the latest time seen, for the front door's own requests
        # Memory topics' records (actors/memory_topics.py), and which topics are such.
        self.memory = MemoryTopics(cfg.storage.memory_bytes_max)
        self.memory_tids: set[int] = set()
        # Key/value requests, and what the cache must know of transactions (front_kv.py).
        self.kv = KvDoor(self, cfg)
        # A cluster's member (None: a single node): forwarding, gathering, copying the
        # catalog (actors/front_cluster.py).
        view = ClusterView.of(cfg)
        self.cluster = None if view is None else ClusterDoor(self, view, cfg)
        self.routes: dict[str, Route] = {
            "read": self.read,
            "read_by_key": self.read_by_key,
            "read_by_tag": self.read_by_tag,
            "offset_for_timestamp": self.offset_for_timestamp,
            "committed_offset": self.committed_offset,
            "create_topic": self.create_topic,
            "delete_topic": self.delete_topic,
            "alter_topic": self.alter_topic,
            "commit_offset": self.commit_offset,
            "delete_by_key": self.delete_record,
            "delete_by_offset": self.delete_record,
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
            "kv_create": self.kv.create,
            "kv_drop": self.kv.drop,
            "xa_recover": lambda _req: (TRANSACTION_MANAGER, lambda c: TxnList(c, True)),
            "txn_list": lambda _req: (TRANSACTION_MANAGER, lambda c: TxnList(c, False)),
            "snapshot_export": self.snapshot_export,
        }
        missing = protocol.OPS.keys() - self.routes.keys() - WRITER_OPS - KV_OPS - {
            "produce", "txn_produce", "txn_once", "txn_kv", "cluster_map", "cluster_sync"}
        assert not missing, f"ops of wire.protocol.OPS with no route: {sorted(missing)}"
        # Ops that take longer than a request: a checkpoint flushes every shard.
        self.timeouts_ms = {"checkpoint": 3 * self.checkpoint_timeout_ms,
                            "compact": protocol.COMPACT_TIMEOUT_MS,
                            # the log manager answers TIMEOUT at its own bound first
                            "snapshot_export": cfg.log.snapshot_timeout_ms + 10_000}

    # ---- requests ---------------------------------------------------------------------

    def request(self, identity: bytes, frames: Sequence[bytes | memoryview], now: float,
                refused: str = "") -> list[Out]:
        """One client message (its frames after the identity): one request or several; each
        answered BAD_REQUEST with ``refused`` when that is said."""
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
            if refused:
                self.errors += 1
                out.append(Reply(identity, protocol.error(rid, ErrorCode.BAD_REQUEST, refused)))
                continue
            out += self.one(identity, rid, op, req, now, may_park=True)
        return out

    def one(self, identity: bytes, rid: int, op: str, req: dict[str, Any], now: float,
            may_park: bool) -> list[Out]:
        """One checked request: routed, or answered with its error; in a cluster, parked
        until the catalog is copied when it names a topic this member does not know."""
        self.clock = now
        first = self.next_corr  # the waits this request registers: forgotten if it fails
        try:
            return self.route(identity, rid, op, req, now)
        except NodeError as exc:
            undone = self.forget_waits(first)
            c = self.cluster
            if (exc.code == ErrorCode.UNKNOWN_TOPIC and may_park and c is not None
                    and c.may_park()):
                return undone + c.park(identity, rid, op, req)
            pull_error = "" if c is None else c.pull_error
            if exc.code == ErrorCode.UNKNOWN_TOPIC and "namespace" in req and not pull_error:
                try:
                    return undone + self.kv.unknown(identity, rid, op, req, now)
                except NodeError as busy:  # its own wait (BUSY): answered, not raised
                    exc = busy
            self.errors += 1
            code, text = exc.code, exc.message
            if exc.code == ErrorCode.UNKNOWN_TOPIC and pull_error:
                # Not known here, and not known not to exist: the catalog member was not
                # reached (down, or a socket to it still connecting just after a start).
                # UNAVAILABLE, which clients retry, rather than an answer that may be false.
                code = ErrorCode.UNAVAILABLE
                text += f" here, and the catalog could not be asked: {pull_error}"
            return [Reply(identity, protocol.error(rid, code, text)), *undone]
        except Exception as exc:  # a request must never take the front door down
            log.exception("request %d failed", rid)
            undone = self.forget_waits(first)
            self.errors += 1
            return [Reply(identity, protocol.error(rid, ErrorCode.INTERNAL,
                                                   f"{type(exc).__name__}: {exc}")), *undone]

    def topic(self, name: str, kv: bool = False) -> Topic:
        if self.catalog_version < 0:
            raise NodeError("the node is starting; retry shortly", ErrorCode.UNAVAILABLE)
        if not kv and name.startswith(KV_PREFIX):
            raise NodeError(f"{name!r} is a KV namespace's topic: use the kv_* ops",
                            ErrorCode.BAD_REQUEST)
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
             timeout_ms: int | None = None, bounded: bool = True) -> int:
        """A fresh correlation id, and its wait; at most ``pending_requests_max`` of them,
        BUSY beyond, unless not ``bounded``: a step of something already under way that
        must not fail for want of room (a key's load for a compare-and-set already counted;
        the catalog's copy, one at a time, and a change's ``cluster_sync`` forwards)."""
        if bounded and len(self.pending) >= self.lim.pending_requests_max:
            raise NodeError(f"{len(self.pending)} requests in flight; retry later", ErrorCode.BUSY)
        corr = self.next_corr
        self.next_corr += 1
        deadline = now + (timeout_ms or self.lim.request_timeout_ms) / 1000
        self.pending[corr] = Waiting(identity, rid, deadline, assign)
        return corr

    def forget_waits(self, first: int) -> list[Out]:
        """Forget the waits a request registered (from correlation id ``first`` on) before
        it failed: its answer is its error, and nothing it would have sent went out. Left,
        each was answered a second time, TIMEOUT, when it expired. What each wait holds is
        given back as ``fail`` does (a forward's place, a commit's namespaces, a key's
        write or load), without answering it; returns what that lets go on."""
        out: list[Out] = []
        for corr in range(first, self.next_corr):
            w = self.pending.pop(corr, None)
            if w is not None:
                out += self.give_back(corr, w, (ErrorCode.UNAVAILABLE,
                                                "the request that loaded it failed"), False)
        return out

    def give_back(self, corr: int, w: Waiting, failure: Failure, timed_out: bool
                  ) -> list[Out]:
        """What a wait taken out of ``pending`` unanswered holds, given back: its forward's
        place, and its part of KV state (``KvDoor.give_back``)."""
        if w.peer and self.cluster is not None:
            self.cluster.forward_ended()
        if w.commit is None and w.kv is None and w.kv_read is None and not w.undecided:
            return []
        return self.kv.give_back(corr, w, failure, timed_out)

    def route(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
              now: float) -> list[Out]:
        if op in BY_KEY_OPS and "partition" not in req:
            # The key's own partition, by the topic's count now: a client's count may be of
            # a topic deleted and made again since, with another.
            req["partition"] = key_partition(req["key"], self.topic(req["topic"]).partitions)
        if self.cluster is not None:
            routed = self.cluster.route(identity, rid, op, req, now)
            if routed is not None:
                return routed
        if op == "produce":  # the hot path
            return [self.produce(identity, rid, req, now)]
        if op in MEMORY_READ_OPS and self.memory_tids:
            t = self.topic(req["topic"])
            if t.topic_id in self.memory_tids:
                return [self.memory_read(identity, rid, op, req, t)]
        if op == "txn_produce":
            return [self.txn_produce(identity, rid, req, now)]
        if op == "txn_once":
            return [self.txn_once(identity, rid, req, now)]
        if op in KV_OPS:
            return self.kv.request(identity, rid, op, req, now)
        if op == "read_by_key":
            return self.kv.read_by_key(identity, rid, req, now)
        if op == "txn_commit" and self.kv.checks(req["txn"]):
            return self.kv.conditional_commit(identity, rid, req, now)
        if op == "txn_kv":
            return [self.kv.txn_kv(identity, rid, req, now)]
        if op == "cluster_map":  # a single node
            return [Reply(identity, protocol.ok(rid, members=[], node_id=0))]
        if op == "cluster_sync":  # a single node: nothing to copy
            return [Reply(identity, protocol.ok(rid, node_id=0))]
        if op in WRITER_OPS:
            return self.gather_writers(identity, rid, op, req, now)
        role, make = self.routes[op](req)
        corr = self.wait(identity, rid, now, timeout_ms=self.timeouts_ms.get(op))
        if op in TXN_TRACKED_OPS:
            self.kv.track_txn(op, req, self.pending[corr])
        elif op in DELETE_OPS:
            self.pending[corr].then = self.deleted(*self.partition(req["topic"], req["partition"]))
        return [Request(role, corr, make(corr))]

    def snapshot_export(self, req: dict[str, Any]) -> Target:
        """The log manager runs it (``actors/snapshot.py``); in a cluster, of this member."""
        directory = req["dir"]
        if not directory.startswith("/"):
            raise NodeError(f"the export directory {directory!r} must be an absolute path",
                            ErrorCode.BAD_REQUEST)
        return LOG_MANAGER, lambda c: SnapshotExport(c, directory)

    # ---- the shard writers: each answers for its shards --------------------------------

    def gather_writers(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
                       now: float) -> list[Out]:
        """``stats`` and ``compact``: every shard writer answers for the shards it owns, and
        the answers are joined (``join_shards``); a writer that fails fails the request."""
        topic_id = self.topic(req["topic"]).topic_id if op == "compact" else 0
        timeout_ms = self.timeouts_ms.get(op)
        parent = self.wait(identity, rid, now, timeout_ms=timeout_ms)
        self.pending[parent].gather = Gather(op, self.writers)
        out: list[Out] = []
        for index in range(self.writers):
            corr = self.wait(b"", 0, now, timeout_ms=timeout_ms)
            w = self.pending[corr]
            w.parent, w.member = parent, index
            msg = Compact(corr, topic_id) if op == "compact" else ShardStats(corr)
            out.append(Request(writer_role(index), corr, msg))
        return out

    def join_shards(self, g: Gather) -> Fields:
        """One ``stats`` or ``compact`` reply from the writers': shards by topic name and
        partition (a topic deleted meanwhile by its id), and each writer's row."""
        names = {t.topic_id: t.name for t in self.topics.values()}
        rows = sorted(([names.get(row[0], str(row[0])), *row[1:]]
                       for r in g.replies.values() for row in r["shards"]),
                      key=lambda row: (row[0], row[1]))
        if g.op == "compact":
            return {"shards": rows}
        return {"shards": rows, "writers": [g.replies[i]["writer"] for i in sorted(g.replies)]}

    def tick(self, now: float) -> list[Out]:
        """Copy the catalog every ``catalog_sync_ms`` (a member other than the catalog's);
        what KV state waits for in time (``KvDoor.tick``)."""
        self.clock = now
        out = self.kv.tick(now)
        return out if self.cluster is None else out + self.cluster.tick(now)

    # ---- routes: an op's checked fields → (the actor, the message given its corr) ------

    def read(self, req: dict[str, Any]) -> Target:
        # Only reads by offset can be served from the cache; not those of a topic with
        # retention: only its writer knows which offsets it still keeps.
        tid, p = self.partition(req["topic"], req["partition"])
        offset, n, lsn = req["offset"], self.records_max(req), self.lsn_seen
        settings = self.topics[req["topic"]].settings
        role = (self.writer_of(tid, p) if "retention_ms" in settings
                or "retention_bytes" in settings else CACHE_MANAGER)
        return role, lambda c: Read(c, tid, p, offset, n, lsn)

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
        settings = protocol.topic_settings({k: req[k] for k in TOPIC_SETTING_FIELDS if k in req})
        if settings.get("storage") == "memory" and len(settings) > 1:
            raise NodeError("a memory topic has no retention: storage.memory_bytes_max bounds "
                            "it", ErrorCode.BAD_REQUEST)
        owners: list[int] = []
        if self.cluster is not None and 1 <= partitions <= self.lim.partitions_max:
            # The catalog member places the partitions, once: the placement is metadata.
            owners = list(place(name, partitions, self.cluster.view.members))
        return self.writes_to, lambda c: CreateTopic(c, name, partitions, owners,
                                                     settings=settings)

    def alter_topic(self, req: dict[str, Any]) -> Target:
        name = req["name"]
        t = self.topic(name)
        settings = {k: req[k] for k in protocol.ALTERABLE_SETTINGS if k in req}
        if t.storage == "memory" and settings:
            raise NodeError("a memory topic has no retention: storage.memory_bytes_max bounds "
                            "it", ErrorCode.BAD_REQUEST)
        return self.writes_to, lambda c: AlterTopic(c, name, settings)

    def delete_topic(self, req: dict[str, Any]) -> Target:
        name = req["name"]
        self.topic(name)
        return self.writes_to, lambda c: DeleteTopic(c, name)

    def delete_record(self, req: dict[str, Any]) -> Target:
        tid, p = self.partition(req["topic"], req["partition"])
        if tid in self.memory_tids:
            raise NodeError(f"{req['topic']!r} is a memory topic: its records are not deleted "
                            f"one by one", ErrorCode.BAD_REQUEST)
        offset, key = req.get("offset", -1), req.get("key")
        return self.writes_to, lambda c: DeleteRecord(c, tid, p, offset, key)

    def deleted(self, tid: int, p: int) -> Then:
        """A deletion is durable: reads by key of its partition cached here are stale."""
        def done(w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
            self.kv.partitions_written(tid, [(p, 0, 0)])
            w.then = None
            return self.settle(w, ok, err)
        return done

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

    def serving(self, status: dict[str, Any]) -> dict[str, Any]:
        """The supervisor's status, with the front door ``starting`` until it knows the
        catalog: up to then every request that names a topic is answered UNAVAILABLE, and
        a node whose actors all say ``running`` must serve (``LocalNode.wait_ready``)."""
        if self.catalog_version >= 0:
            return status
        actors = [{**a, "state": "starting"} if a.get("role") == FRONT_DOOR
                  and a.get("state") == "running" else a for a in status.get("actors", ())]
        return {**status, "actors": actors}

    def records_max(self, req: dict[str, Any]) -> int:
        n: int = req["max_records"]
        return min(n, self.lim.read_records_max)

    def produce(self, identity: bytes, rid: int, req: dict[str, Any], now: float
                ) -> Produce | Reply:
        # Round-robin by the producer's sequence number: a retry of the same request
        # places its records exactly as the first attempt did.
        parts, assign = self.split(req, req["producer_id"] + req["seq"])
        if parts[0][0] in self.memory_tids:
            return self.memory_produce(identity, rid, req, parts, assign, now)
        corr = self.wait(identity, rid, now, assign)
        self.pending[corr].topic_id = parts[0][0]  # its acknowledgement invalidates reads
        return Produce(corr, (req["producer_id"], req["seq"], parts))

    def split(self, req: dict[str, Any], rr: int) -> tuple[list[PartRow], list[int] | None]:
        """A produce's records checked and split by partition: the parts, and the partition
        of each record when the batch was split by key. ``rr`` picks the partition of
        keyless records."""
        name = req["topic"]
        t = self.topic(name)
        topic_id, partitions = t.topic_id, t.partitions
        blob = req["records"]
        items, bare = check_batch(blob, self.lim.batch_records_max, self.lim.value_bytes_max)
        assign = None
        partition = req.get("partition")
        parts: list[PartRow]
        if partition is not None:
            self.partition(name, partition)
            return [(topic_id, partition, len(items), blob)], None
        if partitions == 1 or bare:
            return [(topic_id, rr % partitions, len(items), blob)], None
        keys = [key_of(it) for it in items]
        if all(k is None for k in keys):
            return [(topic_id, rr % partitions, len(items), blob)], None
        # By key hash; records without a key go to this batch's round-robin pick.
        assign = [rr % partitions if k is None else key_partition(k, partitions) for k in keys]
        split: dict[int, list[Any]] = {}
        for p, item in zip(assign, items, strict=True):
            split.setdefault(p, []).append(item)
        if len(split) == 1:
            return [(topic_id, assign[0], len(items), blob)], None
        parts = [(topic_id, p, len(recs), pack(recs))
                 for p, recs in sorted(split.items())]
        return parts, assign

    # ---- transactions: to the transaction manager -------------------------------------

    def txn_produce(self, identity: bytes, rid: int, req: dict[str, Any], now: float) -> Request:
        txn, seq = req["txn"], req["seq"]
        parts, assign = self.split(req, txn + seq)
        if parts[0][0] in self.memory_tids:
            raise NodeError(f"{req['topic']!r} is a memory topic: its records are not logged, so "
                            f"they take no part in transactions", ErrorCode.BAD_REQUEST)
        self.kv.txn_wrote(txn, parts[0][0])
        corr = self.wait(identity, rid, now, assign)
        self.pending[corr].parts = [[p, n] for _t, p, n, _b in parts]
        return Request(TRANSACTION_MANAGER, corr, TxnWrite(corr, txn, seq, parts, ()))

    def txn_once(self, identity: bytes, rid: int, req: dict[str, Any], now: float) -> Request:
        """A whole transaction: its writes checked and split as ``txn_produce`` and
        ``txn_commit_offset`` do, and sent on as one message, the way writes go (it is never
        open between two messages: see ``LogState.once``)."""
        txn = req["txn"]
        parts: list[PartRow] = []
        offsets: list[OffsetRow] = []
        produced: list[Any] = []
        tids: set[int] = set()
        for seq, (op, fields) in enumerate(protocol.check_once_writes(rid, txn, req["writes"])):
            if op == "txn_produce":
                split, assign = self.split(fields, txn + seq)
                tid = split[0][0]
                if tid in self.memory_tids:
                    raise NodeError(f"{fields['topic']!r} is a memory topic: its records are not "
                                    f"logged, so they take no part in transactions",
                                    ErrorCode.BAD_REQUEST)
                self.stays_here(fields["topic"], [p for _t, p, _n, _b in split])
                tids.add(tid)
                parts += split
                produced.append([[[p, n] for _t, p, n, _b in split], assign])
            else:
                protocol.check_name("group name", fields["group"])
                tid, p = self.partition(fields["topic"], fields["partition"])
                self.stays_here(fields["topic"], [p])
                offsets.append((fields["group"], tid, p, fields["offset"]))
        corr = self.wait(identity, rid, now)
        w = self.pending[corr]
        w.produced = produced
        if tids:  # its commit makes cached reads of these topics stale
            self.kv.commit_started(w, tuple(sorted(tids)))
        return Request(self.writes_to, corr, TxnOnce(corr, txn, parts, offsets))

    def stays_here(self, topic: str, partitions: list[int]) -> None:
        """In a cluster, refuse a transaction's write to partitions another member owns."""
        if self.cluster is not None:
            self.cluster.stays_here(topic, partitions)

    def txn_commit_offset(self, req: dict[str, Any]) -> Target:
        group, offset, txn, seq = req["group"], req["offset"], req["txn"], req["seq"]
        protocol.check_name("group name", group)
        tid, p = self.partition(req["topic"], req["partition"])
        return TRANSACTION_MANAGER, lambda c: TxnWrite(c, txn, seq, (), ((group, tid, p, offset),))

    def txn_begin(self, req: dict[str, Any]) -> Target:
        timeout_ms, xid, txn = req.get("timeout_ms", 0), checked_xid(req), req.get("txn", 0)
        owner = req.get("owner", 0)
        return TRANSACTION_MANAGER, lambda c: TxnBegin(c, timeout_ms, xid, txn, owner)

    def txn_step(self, req: dict[str, Any], step: str) -> Target:
        txn, xid, writes = req.get("txn", 0), checked_xid(req), req.get("writes", -1)
        owner = req.get("owner", 0)
        return TRANSACTION_MANAGER, lambda c: TxnStep(c, txn, xid, step, writes, owner=owner)

    # ---- memory topics: their records are here (actors/memory_topics.py) ---------------

    def memory_produce(self, identity: bytes, rid: int, req: dict[str, Any],
                       parts: list[PartRow], assign: list[int] | None, now: float) -> Reply:
        """Keep the records, and answer at once: nothing is logged (``lsn`` 0)."""
        pid, seq = req["producer_id"], req["seq"]
        placed = self.memory.seen(pid, seq)
        if placed is None:
            rows = [(tid, p, msgpack.unpackb(blob, raw=False)) for tid, p, _n, blob in parts]
            placed = self.memory.append(pid, seq, rows, int(time.time() * 1000))
        fields: Fields = {"lsn": 0, "parts": placed}
        if assign is not None:
            fields["assign"] = assign
        return Reply(identity, protocol.ok(rid, **fields))

    def memory_read(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
                    t: Topic) -> Reply:
        m, tid = self.memory, t.topic_id
        if op == "end_offsets":
            offsets = [m.end_offset(tid, p) for p in range(t.partitions)]
            return Reply(identity, protocol.ok(rid, offsets=offsets))
        p = self.partition(t.name, req["partition"])[1]
        bytes_max = self.lim.read_bytes_max
        try:
            if op == "read":
                rows = m.read(tid, p, req["offset"], self.records_max(req), bytes_max)
            elif op == "read_by_key":
                rows = m.read_by_key(tid, p, req["key"])
            elif op == "read_by_tag":
                rows = m.read_by_tag(tid, p, req["tag"], req["offset"], self.records_max(req),
                                     bytes_max)
            else:
                value = m.offset_for_timestamp(tid, p, req["timestamp"])
                return Reply(identity, protocol.ok(rid, value=value))
        except OutOfRange as exc:
            self.errors += 1
            return Reply(identity, protocol.error(
                rid, ErrorCode.OFFSET_OUT_OF_RANGE,
                f"partition {p} of memory topic {t.name!r} keeps offsets from {exc.earliest} "
                f"(the oldest went over storage.memory_bytes_max) (earliest: {exc.earliest})"))
        return Reply(identity, protocol.ok(rid, records=pack_read(rows)))

    # ---- answers ----------------------------------------------------------------------

    def catalog(self, msg: Catalog) -> None:
        if msg.version >= self.catalog_version:
            self.catalog_version = msg.version
            self.topics = {t.name: t for t in msg.topics}
            memory = {t.topic_id for t in msg.topics if t.storage == "memory"}
            for tid in self.memory_tids - memory:
                self.memory.drop(tid)  # deleted
            self.memory_tids = memory
            self.kv.state.catalog({t.topic_id for t in msg.topics})  # deleted ones go
            # A restarted front door has acknowledged nothing yet, but its clients may have
            # been told of writes up to the durable LSN: reads wait for those too.
            self.lsn_seen = max(self.lsn_seen, msg.version, msg.durable_lsn)

    def ack(self, corr: int, lsn: int, parts: Sequence[PlacedRow]) -> list[Out]:
        """A produce request is durable (an ``Ack``, or a row of ``Acks``): its reply."""
        w = self.pending.pop(corr, None)
        if w is None:
            return self.kv.late_ack(corr, lsn)
        if lsn > self.lsn_seen:
            self.lsn_seen = lsn
        if w.kv is not None:
            return self.kv.written(w, w.kv, lsn)
        if w.topic_id:
            self.kv.partitions_written(w.topic_id, parts)
        fields: dict[str, Any] = {"lsn": lsn, "parts": parts}
        if w.assign is not None:
            fields["assign"] = w.assign
        if w.parent:
            return self.settle(w, fields, None)
        return [Reply(w.identity, protocol.ok(w.rid, **fields))]

    def answer(self, msg: Answer) -> list[Out]:
        """An actor's answer: the client's reply, if the request is still waiting. The reply
        carries the fields ``wire.protocol.OPS`` lists for the request's op."""
        if isinstance(msg, Ack):
            return self.ack(msg.corr, msg.lsn, msg.parts)
        w = self.pending.pop(msg.corr, None)
        if w is None:
            return self.kv.late_answer(msg)
        if w.kv is not None or w.kv_read is not None:
            return self.kv.answer(w, msg)
        out: list[Out] = []
        if w.commit is not None:
            # A checked commit refused in a way that leaves its transaction open gives its
            # conditions back, for the retry to be checked on them (``KvDoor.commit_done``).
            out = self.kv.commit_done(w, still_open=isinstance(msg, ErrorReply)
                                      and msg.code in LEAVES_OPEN)
        fields: Fields
        match msg:
            case Done(lsn=lsn):
                self.lsn_seen = max(self.lsn_seen, lsn)
                fields = {"lsn": lsn}
            case RecordsReply(records=records, commit_lsn=commit_lsn):
                # Every read after this one waits for the transactions this one saw: no
                # reader sees a transaction in one partition and not in another.
                self.kv.saw_commit(commit_lsn)
                fields = {"records": records}
            case ValueReply(value=value, commit_lsn=commit_lsn):
                self.kv.saw_commit(commit_lsn)
                fields = {"value": value}
            case TxnId(txn=txn):
                fields = {"txn": txn}
            case TxnWritten(records=records):
                fields = {"records": records}
                if w.parts is not None:
                    fields["parts"] = w.parts
                    if w.assign is not None:
                        fields["assign"] = w.assign
            case TxnCommitted(lsn=lsn, parts=parts):
                self.lsn_seen = max(self.lsn_seen, lsn)
                self.kv.committed(lsn)
                fields = {"lsn": lsn, "parts": parts}
                if w.produced is not None:
                    fields["produced"] = w.produced
            case TxnOutcome(outcome=outcome):
                fields = {"outcome": outcome}
            case TxnsReply(field=name, rows=rows):
                fields = {name: rows}
            case OffsetsReply(lsn=lsn, offsets=offsets):
                self.lsn_seen = max(self.lsn_seen, lsn)  # reads below the offsets see them
                fields = {"offsets": offsets}
            case TopicsReply(topics=topics):
                fields = {"topics": topics}
            case StatusReply(status=status):
                fields = {"status": self.serving(status)}
            case ShardsReply(shards=shards, writer=writer):
                fields = {"shards": shards, "writer": writer}
            case Exported(lsn=lsn, shards=shards_count, bytes=size, elapsed_ms=elapsed_ms):
                fields = {"lsn": lsn, "shards": shards_count, "bytes": size,
                          "elapsed_ms": elapsed_ms}
            case ErrorReply(code=code, text=text):
                return out + self.settle(w, None, (code, text))
            case _:
                assert_never(msg)
        return out + self.settle(w, fields, None)

    def settle(self, w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
        """A request's answer (its fields, or its failure) to where it goes: the client, the
        gathered request it is a part of, or the front door's own next step."""
        if w.parent:
            parent = self.pending.get(w.parent)
            g = parent.gather if parent is not None else None
            if parent is None or g is None:
                return []  # the whole request was answered already (timed out)
            if err is not None:
                g.error = g.error or err
            elif ok is not None:
                g.replies[w.member] = ok
            g.left -= 1
            if g.left:
                return []
            del self.pending[w.parent]
            if g.done is not None:  # the members were told; those down copy at start
                return self.settle(parent, g.done, None)
            if g.error is not None:
                return self.settle(parent, None, g.error)
            if g.op == "produce":
                joined = join_produce(g)
            elif g.op == "end_offsets":
                joined = join_offsets(g)
            else:
                joined = self.join_shards(g)
            return self.settle(parent, joined, None)
        if w.then is not None:
            return w.then(w, ok, err)
        if err is not None:
            self.errors += 1
            if w.cond is not None and err[0] not in NOT_REFUSED:
                self.kv.cond_refused(w.cond)
        if not w.identity:
            return []  # the front door's own request: nobody to answer
        if ok is None:
            assert err is not None
            return [Reply(w.identity, protocol.error(w.rid, *err))]
        return [Reply(w.identity, protocol.ok(w.rid, **ok))]

    def peer_reply(self, reply: dict[str, Any]) -> list[Out]:
        """Another member's answer to a request forwarded to it."""
        return [] if self.cluster is None else self.cluster.peer_reply(reply)

    def fail(self, corrs: list[int], code: ErrorCode, text: str,
             timed_out: bool = False) -> list[Out]:
        """Answer these waiting requests with an error: their actor could not take them, or
        (``timed_out``) did not answer in time, and may still."""
        out: list[Out] = []
        for corr in corrs:
            w = self.pending.pop(corr, None)
            if w is None:
                continue
            out += self.give_back(corr, w, (code, text), timed_out)
            if w.kv_read is None or w.kv_read.kind != "load":  # a load's waiters were failed
                out += self.settle(w, None, (code, text))
        return out

    def expire(self, now: float) -> list[Out]:
        self.clock = now
        # The parts of a gathered request first: it fails with what its parts failed with
        # (a member named), not a bare TIMEOUT.
        late = sorted((corr for corr, w in self.pending.items() if w.deadline <= now),
                      key=lambda corr: not self.pending[corr].parent)
        self.timeouts += len(late)
        out: list[Out] = []
        for corr in late:
            w = self.pending.get(corr)
            if w is None:
                continue  # answered with the request it was a part of
            if w.peer and self.cluster is not None:
                out += self.fail([corr], ErrorCode.UNAVAILABLE,
                                 f"{self.cluster.view.name(w.peer)} did not answer in time; it may "
                                 f"be down (retrying is safe: produce is idempotent)")
            else:
                out += self.fail([corr], ErrorCode.TIMEOUT, "no answer in time; retrying is "
                                 "safe (produce is idempotent)", timed_out=True)
        return out

    def stop(self) -> list[Out]:
        """Answer every request waiting here UNAVAILABLE: the front door stops."""
        out = [] if self.cluster is None else self.cluster.stop(STOPPING_TEXT)
        return out + self.fail(list(self.pending), ErrorCode.UNAVAILABLE, STOPPING_TEXT)
