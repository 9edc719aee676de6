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

from actors.cluster_state import (
    PARKED_MAX,
    PEER_PREFIX,
    ClusterView,
    Gather,
    catalog_changes,
    join_offsets,
    join_produce,
)
from actors.instructions import Produce, Reply, Request, ToPeer
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
from wire.errors import CrossNode, ErrorCode, NodeError, NotOwner
from wire.messages import (
    Ack,
    Answer,
    Catalog,
    Checkpoint,
    CommitOffset,
    CommittedOffset,
    Compact,
    CreateTopic,
    DeleteTopic,
    Done,
    EndOffsets,
    ErrorReply,
    Exported,
    ListTopics,
    OffsetForTimestamp,
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
    TxnsReply,
    TxnStep,
    TxnWrite,
    TxnWritten,
    ValueReply,
)
from wire.placement import place
from wire.protocol import Topic
from wire.records import check_batch, key_of

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

# Ops that name one partition: in a cluster, its owner answers them.
PARTITION_OPS = frozenset({"read", "read_by_key", "read_by_tag", "offset_for_timestamp",
                           "committed_offset", "commit_offset"})


@dataclass(slots=True)
class Waiting:
    identity: bytes  # b"": a request of the front door's own (copying the catalog)
    rid: int
    deadline: float
    assign: list[int] | None = None  # produce split by key: the partition of each record
    parts: list[list[int]] | None = None  # txn_produce: [partition, count] of each part
    peer: int = 0  # forwarded to this member, whose answer is relayed
    parent: int = 0  # a part of the gathered request ``parent``; its answer goes there
    member: int = 0  # the member that answers this part
    gather: Gather | None = None  # this request is answered from parts
    then: Then | None = None


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
            "snapshot_export": self.snapshot_export,
        }
        missing = protocol.OPS.keys() - self.routes.keys() - WRITER_OPS - {
            "produce", "txn_produce", "cluster_map", "cluster_sync"}
        assert not missing, f"ops of wire.protocol.OPS with no route: {sorted(missing)}"
        # Ops that take longer than a request: a checkpoint flushes every shard.
        self.timeouts_ms = {"checkpoint": 3 * self.checkpoint_timeout_ms,
                            "compact": protocol.COMPACT_TIMEOUT_MS,
                            # the log manager answers TIMEOUT at its own bound first
                            "snapshot_export": cfg.log.snapshot_timeout_ms + 10_000}

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
            out += self.one(identity, rid, op, req, now, may_park=True)
        return out

    def one(self, identity: bytes, rid: int, op: str, req: dict[str, Any], now: float,
            may_park: bool) -> list[Out]:
        """One checked request: routed, or answered with its error; in a cluster, parked
        until the catalog is copied when it names a topic this member does not know."""
        self.clock = now
        try:
            return self.route(identity, rid, op, req, now)
        except NodeError as exc:
            if (exc.code == ErrorCode.UNKNOWN_TOPIC and may_park and self.cluster is not None
                    and not self.cluster.is_catalog and len(self.parked) < PARKED_MAX):
                self.parked.append((identity, rid, op, req, self.pulling))
                return self.pull()
            self.errors += 1
            code, text = exc.code, exc.message
            if exc.code == ErrorCode.UNKNOWN_TOPIC and self.pull_error:
                # Not known here, and not known not to exist: the catalog member was not
                # reached (down, or a socket to it still connecting just after a start).
                # UNAVAILABLE, which clients retry, rather than an answer that may be false.
                code = ErrorCode.UNAVAILABLE
                text += f" here, and the catalog could not be asked: {self.pull_error}"
            return [Reply(identity, protocol.error(rid, code, text))]
        except Exception as exc:  # a request must never take the front door down
            log.exception("request %d failed", rid)
            self.errors += 1
            return [Reply(identity, protocol.error(rid, ErrorCode.INTERNAL,
                                                   f"{type(exc).__name__}: {exc}"))]

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
              now: float) -> list[Out]:
        if self.cluster is not None:
            routed = self.route_in_cluster(identity, rid, op, req, now)
            if routed is not None:
                return routed
        if op == "produce":  # the hot path
            return [self.produce(identity, rid, req, now)]
        if op == "txn_produce":
            return [self.txn_produce(identity, rid, req, now)]
        if op == "cluster_map":  # a single node
            return [Reply(identity, protocol.ok(rid, members=[], node_id=0))]
        if op == "cluster_sync":  # a single node: nothing to copy
            return [Reply(identity, protocol.ok(rid, node_id=0))]
        if op in WRITER_OPS:
            return self.gather_writers(identity, rid, op, req, now)
        role, make = self.routes[op](req)
        corr = self.wait(identity, rid, now, timeout_ms=self.timeouts_ms.get(op))
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
        if op in ("create_topic", "delete_topic"):
            if c.is_catalog:
                role, make = self.routes[op](req)
                corr = self.wait(identity, rid, now)
                self.pending[corr].then = self.catalog_changed
                return [Request(role, corr, make(corr))]
            if from_peer:
                raise NotOwner(f"topics are created and deleted on {c.name(c.catalog_id)}")
            return self.forward(identity, rid, req, now, c.catalog_id, then=self.catalog_written)
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
            away = sorted({t.owner(p) for p in ps} - {0, c.me})
            if away:
                raise CrossNode(
                    f"a transaction stays on one node: {t.name!r} partition(s) "
                    f"{[p for p in ps if t.owner(p) in away]} live on "
                    f"{', '.join(c.name(m) for m in away)}, not on {c.name(c.me)}; coordinate "
                    f"several nodes with XA (a branch on each)")
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
        return [ToPeer(member, corr, msgpack.packb(fields, use_bin_type=True))]

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
        if list(by_owner) == [c.me]:  # all here: on to be logged, split once
            corr = self.wait(identity, rid, now, assign)
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
                w.parent, w.member = parent, member
                out.append(Produce(corr, (req["producer_id"], req["seq"], mine)))
                continue
            # In batch order: the member splits them as this one did.
            records = [r for r, p in zip(items, assign, strict=True) if t.owner(p) == member]
            sub = {"topic": t.name, "producer_id": req["producer_id"], "seq": req["seq"],
                   "records": msgpack.packb(records, use_bin_type=True), "op": "produce"}
            out += self.forward(b"", 0, sub, now, member, parent=parent)
        return out

    def gather_offsets(self, identity: bytes, rid: int, req: dict[str, Any], now: float,
                       t: Topic, others: list[int]) -> list[Out]:
        c = self.cluster
        assert c is not None
        parent = self.wait(identity, rid, now)
        self.pending[parent].gather = Gather("end_offsets", len(others) + 1, topic=t)
        corr = self.wait(b"", 0, now)
        w = self.pending[corr]
        w.parent, w.member = parent, c.me
        out: list[Out] = [Request(LOG_MANAGER, corr, EndOffsets(corr, t.topic_id))]
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
        deletes, creates = catalog_changes(self.topics,
                                           [Topic.from_row(r) for r in ok["topics"]])
        if not deletes and not creates:
            self.pulling = False
            return self.release()
        self.pull_left = len(deletes) + len(creates)
        out: list[Out] = []
        for t in deletes:
            corr = self.wait(b"", 0, self.clock)
            self.pending[corr].then = self.copied(t, deleted=True)
            out.append(Request(self.writes_to, corr, DeleteTopic(corr, t.name, t.topic_id)))
        for t in creates:
            corr = self.wait(b"", 0, self.clock)
            self.pending[corr].then = self.copied(t, deleted=False)
            out.append(Request(self.writes_to, corr, CreateTopic(
                corr, t.name, t.partitions, list(t.owners), t.topic_id)))
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
        owners: list[int] = []
        if self.cluster is not None and 1 <= partitions <= self.lim.partitions_max:
            # The catalog member places the partitions, once: the placement is metadata.
            owners = list(place(name, partitions, self.cluster.members))
        return self.writes_to, lambda c: CreateTopic(c, name, partitions, owners)

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
            return []  # answered already (timed out) or never ours
        fields: Fields
        match msg:
            case Done(lsn=lsn):
                self.lsn_seen = max(self.lsn_seen, lsn)
                fields = {"lsn": lsn}
            case RecordsReply(records=records, commit_lsn=commit_lsn):
                # Every read after this one waits for the transactions this one saw: no
                # reader sees a transaction in one partition and not in another.
                self.lsn_seen = max(self.lsn_seen, commit_lsn)
                fields = {"records": records}
            case ValueReply(value=value, commit_lsn=commit_lsn):
                self.lsn_seen = max(self.lsn_seen, commit_lsn)
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
                fields = {"lsn": lsn, "parts": parts}
            case TxnsReply(field=name, rows=rows):
                fields = {name: rows}
            case OffsetsReply(lsn=lsn, offsets=offsets):
                self.lsn_seen = max(self.lsn_seen, lsn)  # reads below the offsets see them
                fields = {"offsets": offsets}
            case TopicsReply(topics=topics):
                fields = {"topics": topics}
            case StatusReply(status=status):
                fields = {"status": status}
            case ShardsReply(shards=shards, writer=writer):
                fields = {"shards": shards, "writer": writer}
            case Exported(lsn=lsn, shards=shards_count, bytes=size, elapsed_ms=elapsed_ms):
                fields = {"lsn": lsn, "shards": shards_count, "bytes": size,
                          "elapsed_ms": elapsed_ms}
            case ErrorReply(code=code, text=text):
                return self.settle(w, None, (code, text))
            case _:
                assert_never(msg)
        return self.settle(w, fields, None)

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
        return [Reply(w.identity, msgpack.packb(reply, use_bin_type=True))]

    def fail(self, corrs: list[int], code: ErrorCode, text: str) -> list[Out]:
        """Answer these waiting requests with an error (their actor could not take them)."""
        out: list[Out] = []
        for corr in corrs:
            w = self.pending.pop(corr, None)
            if w is not None:
                if w.peer:
                    self.forwards_open -= 1
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
                                 f"{self.cluster.name(w.peer)} did not answer in time; it may "
                                 f"be down (retrying is safe: produce is idempotent)")
            else:
                out += self.fail([corr], ErrorCode.TIMEOUT, "no answer in time; retrying is "
                                 "safe (produce is idempotent)")
        return out

    def stop(self) -> list[Out]:
        return self.fail(list(self.pending), ErrorCode.UNAVAILABLE, STOPPING_TEXT)
