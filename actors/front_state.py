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

import collections
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

import msgpack

from actors.cluster_state import (
    PARKED_MAX,
    PEER_PREFIX,
    ClusterView,
    Gather,
    catalog_alters,
    catalog_changes,
    join_offsets,
    join_produce,
)
from actors.instructions import Produce, Reply, Request, ToPeer
from actors.kv_state import Generation, KeyOp, KvState, Load, Refused, Send, Step
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
from wire.errors import CrossNode, ErrorCode, NodeError, NotOwner
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
    KvGet,
    KvScan,
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
    TxnsReply,
    TxnStep,
    TxnWrite,
    TxnWritten,
    ValueReply,
)
from wire.packer import pack
from wire.placement import place
from wire.protocol import KV_PREFIX, Topic, kv_topic
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
KvCond = tuple[int, int, bytes, bytes | None]  # a compare-and-set's txn, topic id, key, expected
# Answers that do not say a transaction's write was refused: it may be staged all the same.
NOT_REFUSED = (ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL)
# What to do with a request's answer instead of replying (the request is one of the front
# door's own steps): given the waiting entry, the fields or the failure, the instructions.
Then = Callable[["Waiting", Fields | None, Failure | None], list[Out]]

# Ops that name one partition: in a cluster, its owner answers them.
PARTITION_OPS = frozenset({"read", "read_by_key", "read_by_tag", "offset_for_timestamp",
                           "committed_offset", "commit_offset", "delete_by_key",
                           "delete_by_offset"})
# Key/value ops (a namespace is the one-partition topic ``kv_topic(namespace)``): in a
# cluster, the namespace's owner answers them; ``KV_CREATING_OPS`` create it when it is new.
KV_OPS = frozenset({"kv_put", "kv_get", "kv_delete", "kv_scan", "kv_cas"})
KV_CREATING_OPS = frozenset({"kv_put", "kv_cas", "txn_kv"})
# Commits: a namespace they may change is not answered from the cache meanwhile.
COMMIT_OPS = frozenset({"txn_commit", "xa_commit"})
TOPIC_SETTING_FIELDS = ("storage", "retention_ms", "retention_bytes")
# Changes of the catalog: in a cluster, the catalog member makes them.
CATALOG_OPS = frozenset({"create_topic", "delete_topic", "alter_topic", "kv_create", "kv_drop"})
DELETE_OPS = frozenset({"delete_by_key", "delete_by_offset"})
# Reads a memory topic answers from the front door's memory.
MEMORY_READ_OPS = frozenset({"read", "read_by_key", "read_by_tag", "offset_for_timestamp",
                             "end_offsets"})  # create_topic's fields that are topic settings
TXN_TRACKED_OPS = COMMIT_OPS | {"txn_begin", "xa_start", "txn_abort", "xa_rollback"}
TXNS_REMEMBERED_MAX = 65536  # transactions begun here whose KV namespaces the front door knows


def checked_xid(req: dict[str, Any]) -> list[Any] | None:
    """A request's xid, if it has one, checked before the front door keys anything by it
    (``track_txn``): an element that is an array or a map cannot be a key. Raises
    ``XAERInval`` as the transaction manager would."""
    xid = req.get("xid")
    if xid is not None:
        xids.check(xid)
    return xid


@dataclass(frozen=True, slots=True)
class KvRead:
    """A KV read sent to a shard writer: a client's get or scan, or the front door's own
    load of a value a compare-and-set needs."""

    kind: str  # "get", "scan" or "load"; "rbk": a topic's read_by_key
    tid: int
    key: bytes
    generation: Generation
    limit: int = 0  # a scan's, as the client asked (the writer is asked for one more)
    partition: int = 0  # read_by_key's


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
        # A cluster (None: a single node): forwarding, gathering, copying the catalog.
        self.cluster = ClusterView.of(cfg)
        self.forwards_max = cfg.cluster.forwards_max
        self.catalog_sync_s = cfg.cluster.catalog_sync_ms / 1000
        self.clock = 0.0  # the latest time seen, for the front door's own requests
        self.forwarded = 0  # clients' requests (or their parts) forwarded to other members
        self.forwards_open = 0  # ... not answered yet (at most cluster.forwards_max)
        self.pulling = False  # a copy of the catalog is under way
        self.pull_error = ""  # why the last copy failed
        self.pull_left = 0  # its topics not yet copied
        self.next_pull = 0.0
        # Requests naming a topic this member does not know, until the catalog was copied
        # (fresh: parked while a copy was under way, which may predate the topic).
        self.parked: list[tuple[bytes, int, str, dict[str, Any], bool]] = []
        # Topic creations and deletions the catalog member answered: replied once copied.
        self.after_pull: list[tuple[bytes, int, Fields, bool]] = []
        # Memory topics' records (actors/memory_topics.py), and which topics are such.
        self.memory = MemoryTopics(cfg.storage.memory_bytes_max)
        self.memory_tids: set[int] = set()
        # Key/value: the cache and each key's writes (actors/kv_state.py).
        self.kv = KvState(cfg.limits.kv_cache_bytes_max)
        self.kv_late: dict[int, KeyOp] = {}  # KV writes sent that timed out: their answers
        self.kv_creating: dict[str, list[tuple[bytes, int, str, dict[str, Any]]]] = {}
        # Transactions begun here (their KV namespaces, maybe none), and XA branches by xid:
        # a commit of one not known may change any namespace.
        self.kv_txns: dict[int, set[int]] = {}
        self.kv_xids: dict[tuple[Any, ...], int] = {}
        self.kv_gets_cached = 0
        # Transactions' compare-and-sets (txn_kv with `expected`), checked at their commit:
        # the conditions by transaction, and the commits waiting to be decided, one at a time.
        self.kv_conds: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
        # When each transaction's first condition was remembered, oldest first. A
        # transaction is rolled back by its timeout, at most txn.timeout_ms_max after its
        # begin: its conditions are forgotten twice that long after the first (a commit
        # then goes unchecked, which the transaction manager refuses), so transactions
        # their clients gave up on do not fill the table for good.
        self.kv_cond_since: dict[int, float] = {}
        self.kv_cond_horizon_s = 2 * cfg.txn.timeout_ms_max / 1000
        self.kv_xa: set[int] = set()  # XA branches' transaction ids: no compare-and-set
        self.kv_commits: collections.deque[tuple[int, int, int, list[tuple[int, bytes, bytes | None]]]] = collections.deque()
        self.kv_deciding = False  # the first of kv_commits is being decided or committed
        self.kv_late_bars: dict[int, tuple[tuple[int, bytes], ...]] = {}
        # The last commit answered here: a read reflecting a later one saw a commit this
        # front door did not send (it restarted meanwhile), so the cache forgets everything.
        self.kv_commit_lsn = 0
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
            "kv_create": self.kv_create,
            "kv_drop": self.kv_drop,
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

    def request(self, identity: bytes, frames: Sequence[bytes | memoryview], now: float
                ) -> list[Out]:
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
            if (exc.code == ErrorCode.UNKNOWN_TOPIC and may_park and self.cluster is not None
                    and not self.cluster.is_catalog and len(self.parked) < PARKED_MAX):
                self.parked.append((identity, rid, op, req, self.pulling))
                return undone + self.pull()
            if exc.code == ErrorCode.UNKNOWN_TOPIC and "namespace" in req and not self.pull_error:
                try:
                    return undone + self.kv_unknown(identity, rid, op, req, now)
                except NodeError as busy:  # its own wait (BUSY): answered, not raised
                    exc = busy
            self.errors += 1
            code, text = exc.code, exc.message
            if exc.code == ErrorCode.UNKNOWN_TOPIC and self.pull_error:
                # Not known here, and not known not to exist: the catalog member was not
                # reached (down, or a socket to it still connecting just after a start).
                # UNAVAILABLE, which clients retry, rather than an answer that may be false.
                code = ErrorCode.UNAVAILABLE
                text += f" here, and the catalog could not be asked: {self.pull_error}"
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
             timeout_ms: int | None = None) -> int:
        if len(self.pending) >= self.lim.pending_requests_max:
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
            if w is None:
                continue
            if w.peer:
                self.forwards_open -= 1
            if w.commit is not None:
                out += self.commit_done(w)
            if w.kv is not None:
                out += self.kv_failed(corr, w.kv, timed_out=False)
            if w.kv_read is not None and w.kv_read.kind == "load":
                out += self.kv_load_failed(w.kv_read, (ErrorCode.UNAVAILABLE,
                                                       "the request that loaded it failed"))
        return out

    def route(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
              now: float) -> list[Out]:
        if self.cluster is not None:
            routed = self.route_in_cluster(identity, rid, op, req, now)
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
            return self.kv_request(identity, rid, op, req, now)
        if op == "read_by_key":
            return self.read_by_key_cached(identity, rid, req, now)
        if op == "txn_commit" and req["txn"] in self.kv_conds:
            return self.kv_conditional_commit(identity, rid, req, now)
        if op == "txn_kv":
            return [self.txn_kv(identity, rid, req, now)]
        if op == "cluster_map":  # a single node
            return [Reply(identity, protocol.ok(rid, members=[], node_id=0))]
        if op == "cluster_sync":  # a single node: nothing to copy
            return [Reply(identity, protocol.ok(rid, node_id=0))]
        if op in WRITER_OPS:
            return self.gather_writers(identity, rid, op, req, now)
        role, make = self.routes[op](req)
        corr = self.wait(identity, rid, now, timeout_ms=self.timeouts_ms.get(op))
        if op in TXN_TRACKED_OPS:
            self.track_txn(op, req, corr)
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

    # ---- a cluster: forward to owners, gather from several, copy the catalog ----------

    def route_in_cluster(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
                         now: float) -> list[Out] | None:
        """How a request goes when this node is a member of a cluster, or None when it is
        served here as on a single node."""
        c = self.cluster
        assert c is not None
        from_peer = identity.startswith(PEER_PREFIX)  # forwarded once: never again
        if op == "cluster_map":
            return [Reply(identity, protocol.ok(rid, members=c.map_rows(), node_id=c.me))]
        if op == "cluster_sync":
            # Answered once copied (after a copy under way, which may predate the change).
            self.after_pull.append((identity, rid, {"node_id": c.me}, self.pulling))
            return self.pull() or ([] if self.pulling else self.release())
        if op in CATALOG_OPS:
            if c.is_catalog:
                role, make = self.routes[op](req)
                corr = self.wait(identity, rid, now)
                self.pending[corr].then = self.catalog_changed
                return [Request(role, corr, make(corr))]
            if from_peer:
                raise NotOwner(f"topics and namespaces are created, changed and deleted on "
                               f"{c.name(c.catalog_id)}")
            return self.forward(identity, rid, req, now, c.catalog_id, then=self.catalog_written)
        if op in KV_OPS:
            t = self.topic(kv_topic(req["namespace"]), kv=True)
            owner = t.owner(0)
            if owner in (0, c.me):
                return None
            if from_peer:
                raise NotOwner(f"KV namespace {req['namespace']!r} is owned by {c.name(owner)}")
            return self.forward(identity, rid, req, now, owner)
        if op == "txn_kv":
            owner = self.topic(kv_topic(req["namespace"]), kv=True).owner(0)
            if owner not in (0, c.me):
                raise CrossNode(
                    f"a transaction stays on one node: KV namespace {req['namespace']!r} lives "
                    f"on {c.name(owner)}, not on {c.name(c.me)}; coordinate several nodes "
                    f"with XA (a branch on each)")
            return None
        if op in PARTITION_OPS or (op == "produce" and "partition" in req):
            t = self.topic(req["topic"])
            p = self.partition(t.name, req["partition"])[1]
            owner = t.owner(p)
            if owner in (0, c.me):
                return None
            if from_peer:
                raise NotOwner(f"partition {p} of {t.name!r} is owned by {c.name(owner)}")
            return self.forward(identity, rid, req, now, owner)
        if op == "produce":
            return self.produce_spread(identity, rid, req, now, from_peer)
        if op == "end_offsets":
            t = self.topic(req["topic"])
            others = sorted(set(t.owners) - {c.me})
            if not others or from_peer:
                return None
            return self.gather_offsets(identity, rid, req, now, t, others)
        if op in ("txn_produce", "txn_commit_offset"):
            t = self.topic(req["topic"])
            # Where its records land: split as txn_produce splits them (txn_commit_offset
            # always names its partition).
            ps = ([req["partition"]] if "partition" in req
                  else sorted({p for _t, p, _n, _b in self.split(req, req["txn"] + req["seq"])[0]}))
            self.stays_here(t.name, ps)
        return None

    def forward(self, identity: bytes, rid: int, req: dict[str, Any], now: float, member: int,
                then: Then | None = None, parent: int = 0) -> list[Out]:
        """Send the request on to ``member``; its answer is relayed (or given to ``then``,
        or to the gathered request ``parent``)."""
        if self.forwards_open >= self.forwards_max:
            raise NodeError(f"{self.forwards_max} requests forwarded to other members wait for "
                            f"answers (cluster.forwards_max); retry later", ErrorCode.BUSY)
        corr = self.wait(identity, rid, now)
        w = self.pending[corr]
        w.peer = w.member = member
        w.then, w.parent = then, parent
        if identity or parent:  # a client's request, not the front door's catalog traffic
            self.forwarded += 1
        self.forwards_open += 1
        fields = {k: v for k, v in req.items() if k != "id"}
        fields["id"] = corr
        return [ToPeer(member, corr, pack(fields))]

    def produce_spread(self, identity: bytes, rid: int, req: dict[str, Any], now: float,
                       from_peer: bool) -> list[Out] | None:
        """A produce with no partition named, split by key over partitions of several
        members: each member is sent its records (with the same producer id and sequence
        number, so a retry is recognised on each), and the answers joined."""
        c = self.cluster
        assert c is not None
        t = self.topic(req["topic"])
        if not t.owners or set(t.owners) == {c.me}:
            return None
        rr = req["producer_id"] + req["seq"]
        parts, assign = self.split(req, rr)
        by_owner: dict[int, list[PartRow]] = {}
        for part in parts:
            by_owner.setdefault(t.owner(part[1]), []).append(part)
        if t.topic_id in self.memory_tids:
            if list(by_owner) == [c.me]:
                return [self.memory_produce(identity, rid, req, parts, assign, now)]
            if len(by_owner) > 1:
                raise NodeError(f"the records of this batch belong to partitions of memory topic "
                                f"{t.name!r} on several members: send each its own (a client "
                                f"of the cluster, NodeClient([...]), does)", ErrorCode.BAD_REQUEST)
        if list(by_owner) == [c.me]:  # all here: on to be logged, split once
            corr = self.wait(identity, rid, now, assign)
            self.pending[corr].topic_id = t.topic_id
            return [Produce(corr, (req["producer_id"], req["seq"], parts))]
        if from_peer:
            away = sorted(set(by_owner) - {c.me})
            raise NotOwner(f"records of this batch belong to {', '.join(c.name(m) for m in away)}")
        if len(by_owner) == 1:
            return self.forward(identity, rid, req, now, next(iter(by_owner)))
        parent = self.wait(identity, rid, now)
        self.pending[parent].gather = Gather("produce", len(by_owner), assign=assign)
        out: list[Out] = []
        items = msgpack.unpackb(req["records"], raw=False)  # checked by split
        assert assign is not None  # more than one partition: split by key
        for member, mine in by_owner.items():
            if member == c.me:
                corr = self.wait(b"", 0, now)
                w = self.pending[corr]
                w.parent, w.member, w.topic_id = parent, member, t.topic_id
                out.append(Produce(corr, (req["producer_id"], req["seq"], mine)))
                continue
            # In batch order: the member splits them as this one did.
            records = [r for r, p in zip(items, assign, strict=True) if t.owner(p) == member]
            sub = {"topic": t.name, "producer_id": req["producer_id"], "seq": req["seq"],
                   "records": pack(records), "op": "produce"}
            out += self.forward(b"", 0, sub, now, member, parent=parent)
        return out

    def gather_offsets(self, identity: bytes, rid: int, req: dict[str, Any], now: float,
                       t: Topic, others: list[int]) -> list[Out]:
        c = self.cluster
        assert c is not None
        parent = self.wait(identity, rid, now)
        self.pending[parent].gather = Gather("end_offsets", len(others) + 1, topic=t)
        out: list[Out] = []
        if t.topic_id in self.memory_tids:  # this member's part from its memory
            g = self.pending[parent].gather
            assert g is not None
            g.replies[c.me] = {"offsets": [self.memory.end_offset(t.topic_id, p)
                                           for p in range(t.partitions)]}
            g.left -= 1
        else:
            corr = self.wait(b"", 0, now)
            w = self.pending[corr]
            w.parent, w.member = parent, c.me
            out.append(Request(LOG_MANAGER, corr, EndOffsets(corr, t.topic_id)))
        for member in others:
            out += self.forward(b"", 0, req, now, member, parent=parent)
        return out

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
        """Copy the catalog every ``catalog_sync_ms`` (a member other than the catalog's)."""
        self.clock = now
        if self.cluster is None or self.cluster.is_catalog or now < self.next_pull:
            return []
        return self.pull()

    def pull(self) -> list[Out]:
        """Ask the catalog member for every topic (unless a copy is under way)."""
        c = self.cluster
        if c is None or c.is_catalog or self.pulling:
            return []
        self.pulling = True
        self.next_pull = self.clock + self.catalog_sync_s
        return self.forward(b"", 0, {"op": "list_topics"}, self.clock, c.catalog_id,
                            then=self.pulled)

    def pulled(self, _w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
        """The catalog member's topics: copy what changed (deletions first), durably."""
        if err is not None or ok is None:
            self.pull_error = err[1] if err else "no answer"
            self.pulling = False
            return self.release()
        self.pull_error = ""
        there = [Topic.from_row(r) for r in ok["topics"]]
        deletes, creates = catalog_changes(self.topics, there)
        alters = catalog_alters(self.topics, there)
        if not deletes and not creates and not alters:
            self.pulling = False
            return self.release()
        self.pull_left = len(deletes) + len(creates) + len(alters)
        out: list[Out] = []
        for t in alters:
            corr = self.wait(b"", 0, self.clock)
            self.pending[corr].then = self.copied(t, deleted=False)
            out.append(Request(self.writes_to, corr, AlterTopic(corr, t.name, dict(t.settings),
                                                                t.topic_id)))
        for t in deletes:
            corr = self.wait(b"", 0, self.clock)
            self.pending[corr].then = self.copied(t, deleted=True)
            out.append(Request(self.writes_to, corr, DeleteTopic(corr, t.name, t.topic_id)))
        for t in creates:
            corr = self.wait(b"", 0, self.clock)
            self.pending[corr].then = self.copied(t, deleted=False)
            out.append(Request(self.writes_to, corr, CreateTopic(
                corr, t.name, t.partitions, list(t.owners), t.topic_id, dict(t.settings))))
        return out

    def copied(self, topic: Topic, deleted: bool) -> Then:
        def done(_w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
            if ok is not None:
                # Durable here: route by it now (the log manager's catalog follows).
                if deleted:
                    self.topics.pop(topic.name, None)
                else:
                    self.topics[topic.name] = topic
                self.catalog_version = max(self.catalog_version, ok["lsn"])
            else:
                log.warning("copying topic %r from the catalog failed: %s", topic.name, err)
            self.pull_left -= 1
            if self.pull_left:
                return []
            self.pulling = False
            return self.release()
        return done

    def release(self) -> list[Out]:
        """After a copy of the catalog: route the parked requests again (those parked while
        it was under way wait for one more), and answer the creations and deletions."""
        parked, self.parked = self.parked, []
        out: list[Out] = []
        again = False
        for identity, rid, op, req, fresh in parked:
            if fresh:
                self.parked.append((identity, rid, op, req, False))
                again = True
            else:
                out += self.one(identity, rid, op, req, self.clock, may_park=False)
        done, self.after_pull = self.after_pull, []
        for identity, rid, fields, fresh in done:
            if fresh:
                self.after_pull.append((identity, rid, fields, False))
                again = True
            else:
                out.append(Reply(identity, protocol.ok(rid, **fields)))
        if again:
            out += self.pull()
        return out

    def catalog_changed(self, w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
        """The catalog member created or deleted a topic: every member is asked to copy it
        before the client is answered, so that no member goes on without it (one that is
        down copies it when it starts)."""
        c = self.cluster
        assert c is not None
        if ok is None:
            assert err is not None
            self.errors += 1
            return [Reply(w.identity, protocol.error(w.rid, *err))]
        others = c.others()
        if not others:
            return [Reply(w.identity, protocol.ok(w.rid, **ok))]
        parent = self.wait(w.identity, w.rid, self.clock)
        self.pending[parent].gather = Gather("sync", len(others), done=ok)
        out: list[Out] = []
        for member in others:
            out += self.forward(b"", 0, {"op": "cluster_sync"}, self.clock, member,
                                parent=parent)
        return out

    def catalog_written(self, w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
        """The catalog member created or deleted a topic: answered once it is copied here,
        so the client's next request here finds it."""
        if ok is None:
            assert err is not None
            self.errors += 1
            return [Reply(w.identity, protocol.error(w.rid, *err))]
        # A copy under way may predate the change: then the answer waits for one more.
        self.after_pull.append((w.identity, w.rid, ok, self.pulling))
        return self.pull()

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
            owners = list(place(name, partitions, self.cluster.members))
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
        if txn in self.kv_txns:  # its commit makes cached reads of the topic stale
            self.kv_txns[txn].add(parts[0][0])
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
        if tids:  # its commit makes cached reads of these topics stale (``track_txn``)
            w.commit = tuple(sorted(tids))
            self.kv.commit_started(w.commit)
        return Request(self.writes_to, corr, TxnOnce(corr, txn, parts, offsets))

    def stays_here(self, topic: str, partitions: list[int]) -> None:
        """In a cluster, refuse a transaction's write to partitions another member owns."""
        c = self.cluster
        if c is None:
            return
        t = self.topic(topic)
        away = sorted({t.owner(p) for p in partitions} - {0, c.me})
        if away:
            raise CrossNode(
                f"a transaction stays on one node: {t.name!r} partition(s) "
                f"{sorted({p for p in partitions if t.owner(p) in away})} live on "
                f"{', '.join(c.name(m) for m in away)}, not on {c.name(c.me)}; coordinate "
                f"several nodes with XA (a branch on each)")

    def txn_commit_offset(self, req: dict[str, Any]) -> Target:
        group, offset, txn, seq = req["group"], req["offset"], req["txn"], req["seq"]
        protocol.check_name("group name", group)
        tid, p = self.partition(req["topic"], req["partition"])
        return TRANSACTION_MANAGER, lambda c: TxnWrite(c, txn, seq, (), ((group, tid, p, offset),))

    def txn_begin(self, req: dict[str, Any]) -> Target:
        timeout_ms, xid, txn = req.get("timeout_ms", 0), checked_xid(req), req.get("txn", 0)
        return TRANSACTION_MANAGER, lambda c: TxnBegin(c, timeout_ms, xid, txn)

    def txn_step(self, req: dict[str, Any], step: str) -> Target:
        txn, xid, writes = req.get("txn", 0), checked_xid(req), req.get("writes", -1)
        return TRANSACTION_MANAGER, lambda c: TxnStep(c, txn, xid, step, writes)

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

    # ---- key/value: the cache and each key's writes are actors/kv_state.py -------------

    def kv_create(self, req: dict[str, Any]) -> Target:
        ns = req["namespace"]
        protocol.check_name("namespace", ns)
        owners: list[int] = []
        if self.cluster is not None:
            owners = list(place(kv_topic(ns), 1, self.cluster.members))
        return self.writes_to, lambda c: CreateTopic(c, kv_topic(ns), 1, owners)

    def kv_drop(self, req: dict[str, Any]) -> Target:
        name = kv_topic(req["namespace"])
        self.topic(name, kv=True)
        return self.writes_to, lambda c: DeleteTopic(c, name)

    def kv_request(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
                   now: float) -> list[Out]:
        ns, key = req["namespace"], req.get("key", b"")
        new = req.get("new") if op == "kv_cas" else req.get("value")
        if new is not None and len(new) > self.lim.value_bytes_max:
            # Before the namespace is looked up: refused whether it exists or not (a
            # compare-and-set in a new one was answered "not swapped", a put created it).
            raise NodeError(f"value of {len(new)} bytes; at most {self.lim.value_bytes_max} "
                            f"(limits.value_bytes_max)", ErrorCode.BAD_REQUEST)
        t = self.topics.get(kv_topic(ns))
        if t is None:  # (an existing namespace's name was checked when it was created)
            protocol.check_name("namespace", ns)
            t = self.topic(kv_topic(ns), kv=True)
        tid = t.topic_id
        writer = self.writer_of(tid, 0)
        if op == "kv_get":
            hit, value = self.kv.cached(tid, key)
            if hit:
                self.kv_gets_cached += 1
                return [Reply(identity, protocol.ok(rid, value=value))]
            corr = self.wait(identity, rid, now)
            self.pending[corr].kv_read = KvRead("get", tid, key, self.kv.read_generation(tid))
            return [Request(writer, corr, KvGet(corr, tid, 0, key, self.lsn_seen))]
        if op == "kv_scan":
            limit = min(req.get("limit", self.lim.read_records_max), self.lim.read_records_max)
            corr = self.wait(identity, rid, now)
            self.pending[corr].kv_read = KvRead("scan", tid, b"", (0, 0, 0), limit)
            return [Request(writer, corr, KvScan(corr, tid, 0, req.get("prefix", b""),
                                                 req.get("start_after"), limit + 1,
                                                 self.lsn_seen))]
        corr = self.wait(identity, rid, now)
        kop = KeyOp(corr, tid, key, new, cas=op == "kv_cas", expected=req.get("expected"),
                    producer=(req.get("producer_id", 0), req.get("seq", 0)))
        self.pending[corr].kv = kop
        return self.kv_steps(self.kv.write(kop))

    def read_by_key_cached(self, identity: bytes, rid: int, req: dict[str, Any],
                           now: float) -> list[Out]:
        """``read_by_key`` from the front door's cache when it holds the answer (kept like
        a KV value, dropped when the partition is written: actors/kv_state.py), else from
        the shard writer, whose answer fills it."""
        tid, p = self.partition(req["topic"], req["partition"])
        key = req["key"]
        settings = self.topics[req["topic"]].settings
        if "retention_ms" in settings or "retention_bytes" in settings:
            # Retention deletes in the background, unseen here: never from the cache.
            corr = self.wait(identity, rid, now)
            return [Request(self.writer_of(tid, p), corr, ReadByKey(corr, tid, p, key,
                                                                     self.lsn_seen))]
        hit, records = self.kv.read_cached(tid, p, key)
        if hit:
            self.kv_gets_cached += 1
            return [Reply(identity, protocol.ok(rid, records=records))]
        corr = self.wait(identity, rid, now)
        self.pending[corr].kv_read = KvRead("rbk", tid, key, self.kv.read_generation(tid, p),
                                            partition=p)
        return [Request(self.writer_of(tid, p), corr, ReadByKey(corr, tid, p, key,
                                                                 self.lsn_seen))]

    def kv_steps(self, steps: list[Step]) -> list[Out]:
        """Carry out what the KV state decided."""
        out: list[Out] = []
        for step in steps:
            match step:
                case Send(op):
                    op.sent = True
                    blob = pack(((op.key, op.new),))
                    pid, seq = op.producer
                    out.append(Produce(op.corr, (pid, seq, [(op.tid, 0, 1, blob)])))
                case Refused(corr, found):
                    w = self.pending.pop(corr, None)
                    if w is not None:
                        out.append(Reply(w.identity, protocol.ok(
                            w.rid, swapped=False, lsn=0, value=found)))
                case Load(tid, key, generation):
                    # Not bounded by pending_requests_max: one per key with a CAS waiting,
                    # which is a request already counted.
                    corr = self.next_corr
                    self.next_corr += 1
                    self.pending[corr] = Waiting(b"", 0, self.clock + self.lim.request_timeout_ms
                                                 / 1000, kv_read=KvRead("load", tid, key,
                                                                        generation))
                    out.append(Request(self.writer_of(tid, 0), corr,
                                       KvGet(corr, tid, 0, key, self.lsn_seen)))
                case _:
                    assert_never(step)
        if self.kv_commits and not self.kv_deciding:  # a commit waiting for these keys
            out += self.kv_commit_next()
        return out

    def kv_written(self, w: Waiting, op: KeyOp, lsn: int) -> list[Out]:
        """A KV write is durable: its reply, and what waited behind it."""
        out = self.kv_steps(self.kv.written(op, lsn))
        fields: Fields = {"swapped": True, "lsn": lsn} if op.cas else {"lsn": lsn}
        return [*out, *self.settle(w, fields, None)]

    def kv_answer(self, w: Waiting, msg: Answer) -> list[Out]:
        """An answer to a KV write (one that failed: durable ones are acks) or read."""
        failure: Failure | None = None
        if isinstance(msg, ErrorReply):
            failure = (msg.code, msg.text)
        elif not isinstance(msg, RecordsReply):
            failure = (ErrorCode.INTERNAL, f"unexpected answer {type(msg).__name__}")
        if w.kv is not None:
            out = self.kv_steps(self.kv.written(w.kv, None))
            return out + self.settle(w, None, failure or (ErrorCode.INTERNAL, "no answer"))
        r = w.kv_read
        assert r is not None
        if failure is not None or not isinstance(msg, RecordsReply):
            assert failure is not None
            if r.kind != "load":
                return self.settle(w, None, failure)
            return self.kv_load_failed(r, failure)
        self.saw_commit(msg.commit_lsn)
        if r.kind == "rbk":
            self.kv.read_filled(r.tid, r.partition, r.key, msg.records, msg.lsn, r.generation)
            return self.settle(w, {"records": msg.records}, None)
        pairs = msgpack.unpackb(msg.records, raw=False)
        if r.kind == "scan":
            more = len(pairs) > r.limit
            records = (pack(pairs[:r.limit]) if more
                       else msg.records)
            return self.settle(w, {"pairs": records, "more": more}, None)
        value = pairs[0][1] if pairs else None
        if r.kind == "get":
            self.kv.read_answered(r.tid, r.key, value, msg.lsn, r.generation)
            return self.settle(w, {"value": value}, None)
        return self.kv_steps(self.kv.loaded(r.tid, r.key, value, msg.lsn, r.generation))

    def kv_load_failed(self, r: KvRead, failure: Failure) -> list[Out]:
        """A key's value could not be loaded: the compare-and-sets waiting on it fail with
        that, and so does the commit to be decided on it (``kv_commit_next``), whose
        transaction stays open with its compare-and-sets, for a retry to decide again. (The
        commit loaded the key again at once, until it timed out: under a namespace dropped
        meanwhile, thousands of failed loads a second.)"""
        out: list[Out] = []
        for corr in self.kv.load_failed(r.tid, r.key):
            w = self.pending.pop(corr, None)
            if w is not None:
                out += self.settle(w, None, failure)
        k = (r.tid, r.key)
        if self.kv_commits and any((tid, key) == k for tid, key, _e in self.kv_commits[0][3]):
            corr, txn, _writes, conds = self.kv_commits.popleft()
            self.kv_conds[txn] = conds + self.kv_conds.get(txn, [])
            self.kv_cond_since.setdefault(txn, self.clock)
            w = self.pending.pop(corr, None)
            if w is not None:
                out += self.settle(w, None, failure)
        line = self.kv.lines.get(k)
        if line is not None:
            out += self.kv_steps(self.kv.pump(k, line))
        elif self.kv_commits and not self.kv_deciding:
            out += self.kv_commit_next()
        return out

    def kv_unknown(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
                   now: float) -> list[Out]:
        """A KV request naming a namespace that does not exist: a read finds nothing, a
        delete has nothing to do, a write creates the namespace first."""
        if op == "kv_get":
            return [Reply(identity, protocol.ok(rid, value=None))]
        if op == "kv_scan":
            return [Reply(identity, protocol.ok(rid, pairs=msgpack.packb([]), more=False))]
        if op == "kv_delete":
            return [Reply(identity, protocol.ok(rid, lsn=self.lsn_seen))]
        if op == "kv_cas" and req["expected"] is not None:
            return [Reply(identity, protocol.ok(rid, swapped=False, lsn=0, value=None))]
        if op not in KV_CREATING_OPS:
            return [Reply(identity, protocol.error(
                rid, ErrorCode.UNKNOWN_TOPIC,
                f"KV namespace {req['namespace']!r} does not exist"))]
        ns = req["namespace"]
        waiting = self.kv_creating.get(ns)
        if waiting is not None:  # being created: go on once it is
            if len(waiting) >= PARKED_MAX:
                raise NodeError(f"{len(waiting)} requests wait for namespace {ns!r} to be "
                                f"created; retry later", ErrorCode.BUSY)
            waiting.append((identity, rid, op, req))
            return []
        self.kv_creating[ns] = [(identity, rid, op, req)]
        create = {"namespace": ns, "op": "kv_create"}
        then = self.kv_created(ns)
        if self.cluster is not None and not self.cluster.is_catalog:
            return self.forward(b"", 0, create, now, self.cluster.catalog_id, then=then)
        role, make = self.kv_create(create)
        corr = self.wait(b"", 0, now)
        self.pending[corr].then = then
        return [Request(role, corr, make(corr))]

    def kv_created(self, ns: str) -> Then:
        def done(_w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
            waiting = self.kv_creating.pop(ns, [])
            if err is not None and err[0] != ErrorCode.TOPIC_EXISTS:
                self.errors += len(waiting)
                return [Reply(identity, protocol.error(rid, *err))
                        for identity, rid, _op, _req in waiting]
            if self.cluster is not None and not self.cluster.is_catalog:
                # Known here once the catalog is copied: then they are routed again.
                self.parked += [(i, r, o, q, self.pulling) for i, r, o, q in waiting]
                return self.pull()
            out: list[Out] = []
            for identity, rid, op, req in waiting:
                out += self.one(identity, rid, op, req, self.clock, may_park=False)
            return out
        return done

    def txn_kv(self, identity: bytes, rid: int, req: dict[str, Any], now: float) -> Request:
        ns, key, value, txn, seq = (req["namespace"], req["key"], req["value"], req["txn"],
                                    req["seq"])
        protocol.check_name("namespace", ns)
        if value is not None and len(value) > self.lim.value_bytes_max:
            raise NodeError(f"value of {len(value)} bytes; at most {self.lim.value_bytes_max} "
                            f"(limits.value_bytes_max)", ErrorCode.BAD_REQUEST)
        tid = self.topic(kv_topic(ns), kv=True).topic_id
        if txn in self.kv_txns:
            self.kv_txns[txn].add(tid)
        conditional = "expected" in req
        conds = self.kv_conds.get(txn) if conditional else None
        if conditional:
            self.kv_cond_room(txn, conds, now)
        blob = pack(((key, value),))
        corr = self.wait(identity, rid, now)
        if conditional:
            # Remembered as it is sent, so that a commit sent behind it (in the same frame)
            # is checked against it; forgotten if the transaction manager refuses the write.
            if conds is None:
                conds = self.kv_conds[txn] = []
                self.kv_cond_since[txn] = now
            conds.append((tid, key, req["expected"]))
            self.pending[corr].cond = (txn, tid, key, req["expected"])
        return Request(TRANSACTION_MANAGER, corr,
                       TxnWrite(corr, txn, seq, [(tid, 0, 1, blob)], (), conditional))

    def kv_cond_room(self, txn: int, conds: list[tuple[int, bytes, bytes | None]] | None,
                     now: float) -> None:
        """Refuse a compare-and-set whose condition could not be remembered, before it is
        staged: every staged one is checked at the commit. (Past these bounds they went
        unremembered, and a commit was sent checked against the others, or none.)"""
        if txn in self.kv_xa:
            raise NodeError("a compare-and-set in a transaction needs a local transaction "
                            "(an XA branch's commit is its coordinator's)",
                            ErrorCode.BAD_REQUEST)
        if conds is not None:
            if len(conds) >= self.lim.batch_records_max:
                raise NodeError(f"a transaction holds at most {self.lim.batch_records_max} "
                                f"compare-and-sets (limits.batch_records_max)",
                                ErrorCode.TXN_LIMIT)
            return
        horizon = now - self.kv_cond_horizon_s
        while self.kv_cond_since:
            oldest, since = next(iter(self.kv_cond_since.items()))
            if since > horizon:
                break
            self.kv_conds_forget(oldest)
        if len(self.kv_conds) >= TXNS_REMEMBERED_MAX:
            raise NodeError(f"{len(self.kv_conds)} transactions with compare-and-sets are "
                            f"open here, the most there may be; retry when some have "
                            f"ended", ErrorCode.TXN_LIMIT)

    def kv_conds_forget(self, txn: int) -> list[tuple[int, bytes, bytes | None]]:
        """A transaction's conditions, taken out of the table (empty if it had none)."""
        self.kv_cond_since.pop(txn, None)
        return self.kv_conds.pop(txn, [])

    def kv_cond_refused(self, cond: KvCond) -> None:
        """A compare-and-set the transaction manager refused (an unknown transaction, a
        limit): its condition no longer gates the transaction's commit. Remembered, those
        of writes to transactions that never existed filled the table, and every
        compare-and-set after them went unremembered, its commit refused TXN_CONFLICT."""
        txn, tid, key, expected = cond
        conds = self.kv_conds.get(txn)
        if conds is not None and (tid, key, expected) in conds:
            conds.remove((tid, key, expected))
            if not conds:
                self.kv_conds_forget(txn)

    def kv_conditional_commit(self, identity: bytes, rid: int, req: dict[str, Any],
                              now: float) -> list[Out]:
        """The commit of a transaction with compare-and-sets: decided here, one such commit
        at a time, on its keys' values when nothing of them is in flight. Matching, it is
        sent with their keys held (no write of them goes out until its answer, so none is
        logged between the check and the commit); not matching, the transaction is rolled
        back and the commit answered TXN_CONFLICT."""
        txn = req["txn"]
        corr = self.wait(identity, rid, now)
        self.kv_commits.append((corr, txn, req.get("writes", -1), self.kv_conds_forget(txn)))
        return self.kv_commit_next()

    def kv_commit_next(self) -> list[Out]:
        out: list[Out] = []
        while self.kv_commits and not self.kv_deciding:
            corr, txn, writes, conds = self.kv_commits[0]
            w = self.pending.get(corr)
            if w is None:  # timed out waiting
                self.kv_commits.popleft()
                continue
            keys = tuple(dict.fromkeys((tid, key) for tid, key, _e in conds))
            values, loads = self.kv.settled(keys)
            if values is None:
                self.kv_deciding = True  # no other decision while this one loads
                out += self.kv_steps(loads)
                self.kv_deciding = False
                return out
            self.kv_commits.popleft()
            if all(values[(tid, key)] == expected for tid, key, expected in conds):
                tids = self.kv_txns.pop(txn, None)
                # With its compare-and-sets' namespaces: a write sent before its begin is not
                # in ``kv_txns``, and an empty set made the commit's end (``commit_done``,
                # where () is "unknown") take back a commit anywhere that never started.
                if tids is not None:
                    tids |= {tid for tid, _key, _expected in conds}
                commit = None if tids is None else tuple(sorted(tids))
                self.kv.commit_started(commit)
                self.kv.bar(keys)
                w.commit, w.barred = (commit if commit is not None else ()), keys
                self.kv_deciding = True
                out.append(Request(TRANSACTION_MANAGER, corr,
                                   TxnStep(corr, txn, None, "commit", writes, checked=True)))
                return out
            self.kv_txns.pop(txn, None)
            w.then = self.kv_conflict(txn)
            out.append(Request(TRANSACTION_MANAGER, corr, TxnStep(corr, txn, None, "rollback")))
        return out

    def kv_conflict(self, txn: int) -> Then:
        def done(w: Waiting, _ok: Fields | None, err: Failure | None) -> list[Out]:
            self.errors += 1
            text = (f"transaction {txn}: a key's value was not what its compare-and-set "
                    f"expected; rolled back")
            if err is not None:
                text += f" (the rollback failed: {err[1]})"
            return [Reply(w.identity, protocol.error(w.rid, ErrorCode.TXN_CONFLICT, text))]
        return done

    def track_txn(self, op: str, req: dict[str, Any], corr: int) -> None:
        """Remember the transactions begun here (their KV namespaces are learned from their
        writes), and mark a commit with the namespaces it may change: none of them is
        answered from the cache until the commit's answer (``commit_done``)."""
        txn = req.get("txn", 0)
        xid = tuple(req["xid"]) if "xid" in req else None
        if op in ("txn_begin", "xa_start"):
            if txn and len(self.kv_txns) < TXNS_REMEMBERED_MAX:
                self.kv_txns.setdefault(txn, set())
                if xid is not None:
                    self.kv_xids[xid] = txn
                    self.kv_xa.add(txn)
            return
        if xid is not None:
            txn = self.kv_xids.pop(xid, 0)
            self.kv_xa.discard(txn)
        self.kv_conds_forget(txn)  # rolled back, or (a retry) committed already
        tids = self.kv_txns.pop(txn, None) if txn else None
        if op not in COMMIT_OPS:
            return  # rolled back: nothing of it becomes visible
        if tids is not None and not tids:
            return  # known to write no KV namespace
        commit = None if tids is None else tuple(sorted(tids))
        self.kv.commit_started(commit)
        self.pending[corr].commit = commit if commit is not None else ()

    def saw_commit(self, commit_lsn: int) -> None:
        """A read's answer reflects the commits up to ``commit_lsn``: every read after it
        waits for them, and a commit not answered here leaves nothing cached."""
        if commit_lsn > self.lsn_seen:
            self.lsn_seen = commit_lsn
        if commit_lsn > self.kv_commit_lsn:
            # Seen before its answer (if it is one of this front door's): one forget a
            # commit at most, and only while transactions commit.
            self.kv_commit_lsn = commit_lsn
            self.kv.forget()

    def commit_done(self, w: Waiting, late_corr: int = 0) -> list[Out]:
        """A commit that may change KV namespaces was answered (or failed; ``late_corr``:
        it timed out, and may still be committed: the keys it holds stay held until its
        answer comes, ``kv_unbar``)."""
        commit, w.commit = w.commit, None
        out = self.kv_steps(self.kv.commit_ended(commit or None))
        if w.barred:
            if late_corr:
                self.kv_late_bars[late_corr] = w.barred
                return out
            out += self.kv_unbar(w.barred)
        return out

    def kv_unbar(self, keys: tuple[tuple[int, bytes], ...]) -> list[Out]:
        self.kv_deciding = False
        return self.kv_steps(self.kv.unbar(keys))

    # ---- answers ----------------------------------------------------------------------

    def catalog(self, msg: Catalog) -> None:
        if msg.version >= self.catalog_version:
            self.catalog_version = msg.version
            self.topics = {t.name: t for t in msg.topics}
            memory = {t.topic_id for t in msg.topics if t.storage == "memory"}
            for tid in self.memory_tids - memory:
                self.memory.drop(tid)  # deleted
            self.memory_tids = memory
            # A restarted front door has acknowledged nothing yet, but its clients may have
            # been told of writes up to the durable LSN: reads wait for those too.
            self.lsn_seen = max(self.lsn_seen, msg.version, msg.durable_lsn)

    def ack(self, corr: int, lsn: int, parts: Sequence[PlacedRow]) -> list[Out]:
        """A produce request is durable (an ``Ack``, or a row of ``Acks``): its reply."""
        w = self.pending.pop(corr, None)
        if w is None:
            late = self.kv_late.pop(corr, None)  # a KV write that timed out: durable now
            return [] if late is None else self.kv_steps(self.kv.written(late, lsn))
        if lsn > self.lsn_seen:
            self.lsn_seen = lsn
        if w.kv is not None:
            return self.kv_written(w, w.kv, lsn)
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
            bars = self.kv_late_bars.pop(msg.corr, None)  # a commit that timed out: ended
            if bars is not None:
                return self.kv_unbar(bars)
            late = self.kv_late.pop(msg.corr, None)  # a KV write that timed out: refused
            return [] if late is None else self.kv_steps(self.kv.written(late, None))
        if w.kv is not None or w.kv_read is not None:
            return self.kv_answer(w, msg)
        out = self.commit_done(w) if w.commit is not None else []
        fields: Fields
        match msg:
            case Done(lsn=lsn):
                self.lsn_seen = max(self.lsn_seen, lsn)
                fields = {"lsn": lsn}
            case RecordsReply(records=records, commit_lsn=commit_lsn):
                # Every read after this one waits for the transactions this one saw: no
                # reader sees a transaction in one partition and not in another.
                self.saw_commit(commit_lsn)
                fields = {"records": records}
            case ValueReply(value=value, commit_lsn=commit_lsn):
                self.saw_commit(commit_lsn)
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
                self.kv_commit_lsn = max(self.kv_commit_lsn, lsn)
                fields = {"lsn": lsn, "parts": parts}
                if w.produced is not None:
                    fields["produced"] = w.produced
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
                self.kv_cond_refused(w.cond)
        if not w.identity:
            return []  # the front door's own request: nobody to answer
        if ok is None:
            assert err is not None
            return [Reply(w.identity, protocol.error(w.rid, *err))]
        return [Reply(w.identity, protocol.ok(w.rid, **ok))]

    def peer_reply(self, reply: dict[str, Any]) -> list[Out]:
        """Another member's answer to a request forwarded to it."""
        corr = reply.get("id", -1)
        w = self.pending.get(corr)
        if w is None or not w.peer:
            return []  # answered already (timed out), or not a forwarded request's id
        del self.pending[corr]
        self.forwards_open -= 1
        if not reply.get("ok"):
            return self.settle(w, None, (int(reply.get("code", ErrorCode.INTERNAL)),
                                         str(reply.get("error", ""))))
        if w.parent or w.then is not None or not w.identity:
            return self.settle(w, {k: v for k, v in reply.items() if k not in ("id", "ok")},
                               None)
        reply["id"] = w.rid  # relayed as it came, under the client's id
        return [Reply(w.identity, pack(reply))]

    def fail(self, corrs: list[int], code: ErrorCode, text: str,
             timed_out: bool = False) -> list[Out]:
        """Answer these waiting requests with an error: their actor could not take them, or
        (``timed_out``) did not answer in time, and may still."""
        out: list[Out] = []
        for corr in corrs:
            w = self.pending.pop(corr, None)
            if w is not None:
                if w.peer:
                    self.forwards_open -= 1
                if w.commit is not None:
                    out += self.commit_done(w, late_corr=corr if timed_out else 0)
                if w.kv is not None:
                    out += self.kv_failed(corr, w.kv, timed_out)
                if w.kv_read is not None and w.kv_read.kind == "load":
                    out += self.kv_load_failed(w.kv_read, (code, text))
                    continue
                out += self.settle(w, None, (code, text))
        return out

    def kv_failed(self, corr: int, op: KeyOp, timed_out: bool) -> list[Out]:
        """A KV write answered with an error by the front door: one that timed out in flight
        may still be logged (its late answer is awaited); any other was not sent, or never
        will be."""
        if not op.sent:
            self.kv.cancel({corr})
            return []
        if timed_out and len(self.kv_late) < self.lim.pending_requests_max:
            self.kv.lost(op)
            self.kv_late[corr] = op
            return []
        return self.kv_steps(self.kv.written(op, None))

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
                                 f"{self.cluster.name(w.peer)} did not answer in time; it may "
                                 f"be down (retrying is safe: produce is idempotent)")
            else:
                out += self.fail([corr], ErrorCode.TIMEOUT, "no answer in time; retrying is "
                                 "safe (produce is idempotent)", timed_out=True)
        return out

    def stop(self) -> list[Out]:
        return self.fail(list(self.pending), ErrorCode.UNAVAILABLE, STOPPING_TEXT)
