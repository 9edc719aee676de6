"""The front door's part in a cluster, with no I/O: forward a request to the member that
owns what it names, gather one answer from several members, copy the catalog.

``actors/cluster_state.py`` says who owns what and how answers join; ``ClusterDoor``
routes with it through the front door's waits (``FrontDoorState``,
``actors/front_state.py``, which owns this part on a member of a cluster and asks it first
how each request goes, ``route``). A member other than the catalog's copies the catalog
when it starts, every ``catalog_sync_ms``, and at once when a request names a topic it
does not know; such a request is parked until the copy is done, then routed again
(``release``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgpack

from actors.cluster_state import (
    PARKED_MAX,
    PEER_PREFIX,
    ClusterView,
    Gather,
    catalog_alters,
    catalog_changes,
)
from actors.front_kv import KV_OPS, Parked
from actors.instructions import Produce, Reply, Request, ToPeer
from actors.roles import LOG_MANAGER
from config import NodeConfig
from wire import protocol
from wire.errors import CrossNode, ErrorCode, NodeError, NotOwner
from wire.messages import AlterTopic, CreateTopic, DeleteTopic, EndOffsets, PartRow
from wire.packer import pack
from wire.protocol import Topic

if TYPE_CHECKING:
    from actors.front_state import Failure, Fields, FrontDoorState, Out, Then, Waiting

log = logging.getLogger("shardnode")

# Ops that name one partition: in a cluster, its owner answers them.
PARTITION_OPS = frozenset({"read", "read_by_key", "read_by_tag", "offset_for_timestamp",
                           "committed_offset", "commit_offset", "delete_by_key",
                           "delete_by_offset"})
# Changes of the catalog: in a cluster, the catalog member makes them.
CATALOG_OPS = frozenset({"create_topic", "delete_topic", "alter_topic", "kv_create", "kv_drop"})


class ClusterDoor:
    """The front door's part on a member of a cluster: ``door`` is the front door whose
    waits it uses, ``view`` who the members are."""

    def __init__(self, door: FrontDoorState, view: ClusterView, cfg: NodeConfig) -> None:
        self.door = door
        self.view = view
        self.forwards_max = cfg.cluster.forwards_max
        self.catalog_sync_s = cfg.cluster.catalog_sync_ms / 1000
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

    # ---- routing ----------------------------------------------------------------------

    def route(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
              now: float) -> list[Out] | None:
        """How a request goes on this member, or None when it is served here as on a
        single node."""
        d, c = self.door, self.view
        from_peer = identity.startswith(PEER_PREFIX)  # forwarded once: never again
        if op == "cluster_map":
            return [Reply(identity, protocol.ok(rid, members=c.map_rows(), node_id=c.me))]
        if op == "cluster_sync":
            # Answered once copied (after a copy under way, which may predate the change).
            if len(self.after_pull) >= PARKED_MAX:
                raise NodeError(f"{len(self.after_pull)} requests wait for a copy of the "
                                f"catalog; retry later", ErrorCode.BUSY)
            self.after_pull.append((identity, rid, {"node_id": c.me}, self.pulling))
            return self.pull() or ([] if self.pulling else self.release())
        if op in CATALOG_OPS:
            if c.is_catalog:
                role, make = d.routes[op](req)
                corr = d.wait(identity, rid, now)
                d.pending[corr].then = self.catalog_changed
                return [Request(role, corr, make(corr))]
            if from_peer:
                raise NotOwner(f"topics and namespaces are created, changed and deleted on "
                               f"{c.name(c.catalog_id)}")
            return self.forward(identity, rid, req, now, c.catalog_id, then=self.catalog_written)
        if op in KV_OPS:
            # Checked as the owner checks, first: refused here whether the namespace is
            # known here yet or not (an oversized value to a new one was answered "not
            # swapped", or created it).
            owner = d.kv.checked(op, req).owner(0)
            return self.to_owner(identity, rid, req, now, owner, from_peer,
                                 f"KV namespace {req['namespace']!r}")
        if op == "txn_kv":
            owner = d.kv.checked(op, req).owner(0)
            if owner not in (0, c.me):
                raise CrossNode(
                    f"a transaction stays on one node: KV namespace {req['namespace']!r} lives "
                    f"on {c.name(owner)}, not on {c.name(c.me)}; coordinate several nodes "
                    f"with XA (a branch on each)")
            return None
        if op in PARTITION_OPS or (op == "produce" and req.get("partition") is not None):
            t = d.topic(req["topic"])
            p = d.partition(t.name, req["partition"])[1]
            return self.to_owner(identity, rid, req, now, t.owner(p), from_peer,
                                 f"partition {p} of {t.name!r}")
        if op == "produce":
            return self.produce_spread(identity, rid, req, now, from_peer)
        if op == "end_offsets":
            t = d.topic(req["topic"])
            others = sorted(set(t.owners) - {c.me})
            if not others or from_peer:
                return None
            return self.gather_offsets(identity, rid, req, now, t, others)
        if op == "txn_commit_offset" or (op == "txn_produce"
                                         and req.get("partition") is not None):
            self.stays_here(req["topic"], [d.partition(req["topic"], req["partition"])[1]])
        elif op == "txn_produce":
            # Where its records land, by key: split (and checked) as txn_produce splits them.
            parts = d.split(req, req["txn"] + req["seq"])[0]
            self.stays_here(req["topic"], sorted({p for _t, p, _n, _b in parts}))
        return None

    def to_owner(self, identity: bytes, rid: int, req: dict[str, Any], now: float, owner: int,
                 from_peer: bool, what: str) -> list[Out] | None:
        """A request for ``what``, which ``owner`` holds: served here (None) if this member
        owns it, else forwarded, unless it was forwarded once already (``NotOwner``)."""
        if owner in (0, self.view.me):
            return None
        if from_peer:
            raise NotOwner(f"{what} is owned by {self.view.name(owner)}")
        return self.forward(identity, rid, req, now, owner)

    def stays_here(self, topic: str, partitions: list[int]) -> None:
        """Refuse a transaction's write to partitions another member owns."""
        c = self.view
        t = self.door.topic(topic)
        away = sorted({t.owner(p) for p in partitions} - {0, c.me})
        if away:
            raise CrossNode(
                f"a transaction stays on one node: {t.name!r} partition(s) "
                f"{sorted({p for p in partitions if t.owner(p) in away})} live on "
                f"{', '.join(c.name(m) for m in away)}, not on {c.name(c.me)}; coordinate "
                f"several nodes with XA (a branch on each)")

    def forward(self, identity: bytes, rid: int, req: dict[str, Any], now: float, member: int,
                then: Then | None = None, parent: int = 0, bounded: bool = True) -> list[Out]:
        """Send the request on to ``member``; its answer is relayed (or given to ``then``,
        or to the gathered request ``parent``). At most ``forwards_max`` open, BUSY beyond;
        not ``bounded``: the catalog's own traffic, a step of something already under way
        (one copy at a time, one ``cluster_sync`` a member for each change of the catalog
        answered), which must not fail for want of room; they count among the forwards open
        all the same."""
        d = self.door
        if bounded and self.forwards_open >= self.forwards_max:
            raise NodeError(f"{self.forwards_max} requests forwarded to other members wait for "
                            f"answers (cluster.forwards_max); retry later", ErrorCode.BUSY)
        corr = d.wait(identity, rid, now, bounded=bounded)
        w = d.pending[corr]
        w.peer = w.member = member
        w.then, w.parent = then, parent
        if identity or parent:  # a client's request, not the front door's catalog traffic
            self.forwarded += 1
        self.forwards_open += 1
        fields = {k: v for k, v in req.items() if k != "id"}
        fields["id"] = corr
        return [ToPeer(member, corr, pack(fields))]

    def forward_ended(self) -> None:
        """A forwarded request was answered, failed or forgotten: its place is free."""
        self.forwards_open -= 1

    def produce_spread(self, identity: bytes, rid: int, req: dict[str, Any], now: float,
                       from_peer: bool) -> list[Out] | None:
        """A produce with no partition named, split by key over partitions of several
        members: each member is sent its records (with the same producer id and sequence
        number, so a retry is recognised on each), and the answers joined."""
        d, c = self.door, self.view
        t = d.topic(req["topic"])
        if not t.owners or set(t.owners) == {c.me}:
            return None
        rr = req["producer_id"] + req["seq"]
        parts, assign = d.split(req, rr)
        by_owner: dict[int, list[PartRow]] = {}
        for part in parts:
            by_owner.setdefault(t.owner(part[1]), []).append(part)
        if t.topic_id in d.memory_tids:
            if list(by_owner) == [c.me]:
                return [d.memory_produce(identity, rid, req, parts, assign, now)]
            if len(by_owner) > 1:
                raise NodeError(f"the records of this batch belong to partitions of memory topic "
                                f"{t.name!r} on several members: send each its own (a client "
                                f"of the cluster, NodeClient([...]), does)", ErrorCode.BAD_REQUEST)
        if list(by_owner) == [c.me]:  # all here: on to be logged, split once
            corr = d.wait(identity, rid, now, assign)
            d.pending[corr].topic_id = t.topic_id
            return [Produce(corr, (req["producer_id"], req["seq"], parts))]
        if from_peer:
            away = sorted(set(by_owner) - {c.me})
            raise NotOwner(f"records of this batch belong to {', '.join(c.name(m) for m in away)}")
        if len(by_owner) == 1:
            return self.forward(identity, rid, req, now, next(iter(by_owner)))
        parent = d.wait(identity, rid, now)
        d.pending[parent].gather = Gather("produce", len(by_owner), assign=assign)
        out: list[Out] = []
        items = msgpack.unpackb(req["records"], raw=False)  # checked by split
        assert assign is not None  # more than one partition: split by key
        for member, mine in by_owner.items():
            if member == c.me:
                corr = d.wait(b"", 0, now)
                w = d.pending[corr]
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
        d, c = self.door, self.view
        parent = d.wait(identity, rid, now)
        g = d.pending[parent].gather = Gather("end_offsets", len(others) + 1, topic=t)
        out: list[Out] = []
        if t.topic_id in d.memory_tids:  # this member's part from its memory
            g.replies[c.me] = {"offsets": [d.memory.end_offset(t.topic_id, p)
                                           for p in range(t.partitions)]}
            g.left -= 1
        else:
            corr = d.wait(b"", 0, now)
            w = d.pending[corr]
            w.parent, w.member = parent, c.me
            out.append(Request(LOG_MANAGER, corr, EndOffsets(corr, t.topic_id)))
        for member in others:
            out += self.forward(b"", 0, req, now, member, parent=parent)
        return out

    def peer_reply(self, reply: dict[str, Any]) -> list[Out]:
        """Another member's answer to a request forwarded to it."""
        d = self.door
        corr = reply.get("id", -1)
        w = d.pending.get(corr)
        if w is None or not w.peer:
            return []  # answered already (timed out), or not a forwarded request's id
        del d.pending[corr]
        self.forward_ended()
        if not reply.get("ok"):
            return d.settle(w, None, (int(reply.get("code", ErrorCode.INTERNAL)),
                                      str(reply.get("error", ""))))
        if w.parent or w.then is not None or not w.identity:
            return d.settle(w, {k: v for k, v in reply.items() if k not in ("id", "ok")}, None)
        reply["id"] = w.rid  # relayed as it came, under the client's id
        return [Reply(w.identity, pack(reply))]

    # ---- the catalog: changed on its member, copied by the others ---------------------

    def may_park(self) -> bool:
        """Whether a request naming a topic unknown here waits for a copy of the catalog:
        not on the catalog member (there it does not exist), nor past ``PARKED_MAX``."""
        return not self.view.is_catalog and len(self.parked) < PARKED_MAX

    def park(self, identity: bytes, rid: int, op: str, req: dict[str, Any]) -> list[Out]:
        """A request naming a topic this member does not know: routed again once the
        catalog is copied."""
        self.parked.append((identity, rid, op, req, self.pulling))
        return self.pull()

    def park_all(self, requests: list[Parked]) -> list[Out]:
        """Requests that waited for a namespace's creation by the catalog member: routed
        again once the catalog is copied (BUSY past ``PARKED_MAX``)."""
        out: list[Out] = []
        for identity, rid, op, req in requests:
            if len(self.parked) < PARKED_MAX:
                self.parked.append((identity, rid, op, req, self.pulling))
            else:
                self.door.errors += 1
                out.append(Reply(identity, protocol.error(
                    rid, ErrorCode.BUSY, f"{len(self.parked)} requests wait for a copy of the "
                    f"catalog; retry later")))
        return out + self.pull()

    def create_namespace(self, ns: str, now: float, then: Then) -> list[Out] | None:
        """A namespace a write named, to be created: asked of the catalog member (None:
        this is it, and creates it)."""
        if self.view.is_catalog:
            return None
        return self.forward(b"", 0, {"namespace": ns, "op": "kv_create"}, now,
                            self.view.catalog_id, then=then)

    def stop(self, text: str) -> list[Out]:
        """The front door stops: the requests parked here, or waiting for a copy of the
        catalog, are answered UNAVAILABLE (the copy's failure would route them again)."""
        waiting = [(p[0], p[1]) for p in self.parked] + [(a[0], a[1]) for a in self.after_pull]
        self.parked, self.after_pull = [], []
        return [Reply(identity, protocol.error(rid, ErrorCode.UNAVAILABLE, text))
                for identity, rid in waiting]

    def tick(self, now: float) -> list[Out]:
        """Copy the catalog every ``catalog_sync_ms`` (a member other than the catalog's)."""
        if self.view.is_catalog or now < self.next_pull:
            return []
        return self.pull()

    def pull(self) -> list[Out]:
        """Ask the catalog member for every topic (unless a copy is under way)."""
        c = self.view
        if c.is_catalog or self.pulling:
            return []
        self.pulling = True
        clock = self.door.clock
        self.next_pull = clock + self.catalog_sync_s
        return self.forward(b"", 0, {"op": "list_topics"}, clock, c.catalog_id,
                            then=self.pulled, bounded=False)

    def pulled(self, _w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
        """The catalog member's topics: copy what changed (deletions first), durably."""
        d = self.door
        if err is not None or ok is None:
            self.pull_error = err[1] if err else "no answer"
            self.pulling = False
            return self.release()
        self.pull_error = ""
        there = [Topic.from_row(r) for r in ok["topics"]]
        deletes, creates = catalog_changes(d.topics, there)
        alters = catalog_alters(d.topics, there)
        if not deletes and not creates and not alters:
            self.pulling = False
            return self.release()
        self.pull_left = len(deletes) + len(creates) + len(alters)
        out: list[Out] = []
        # Steps of the copy, which is one at a time: never refused BUSY (a copy left half
        # done would strand the requests parked for it).
        for t in alters:
            corr = d.wait(b"", 0, d.clock, bounded=False)
            d.pending[corr].then = self.copied(t, deleted=False)
            out.append(Request(d.writes_to, corr, AlterTopic(corr, t.name, dict(t.settings),
                                                             t.topic_id)))
        for t in deletes:
            corr = d.wait(b"", 0, d.clock, bounded=False)
            d.pending[corr].then = self.copied(t, deleted=True)
            out.append(Request(d.writes_to, corr, DeleteTopic(corr, t.name, t.topic_id)))
        for t in creates:
            corr = d.wait(b"", 0, d.clock, bounded=False)
            d.pending[corr].then = self.copied(t, deleted=False)
            out.append(Request(d.writes_to, corr, CreateTopic(
                corr, t.name, t.partitions, list(t.owners), t.topic_id, dict(t.settings))))
        return out

    def copied(self, topic: Topic, deleted: bool) -> Then:
        def done(_w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
            d = self.door
            if ok is not None:
                # Durable here: route by it now (the log manager's catalog follows).
                if deleted:
                    d.topics.pop(topic.name, None)
                else:
                    d.topics[topic.name] = topic
                d.catalog_version = max(d.catalog_version, ok["lsn"])
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
        d = self.door
        parked, self.parked = self.parked, []
        out: list[Out] = []
        again = False
        for identity, rid, op, req, fresh in parked:
            if fresh:
                self.parked.append((identity, rid, op, req, False))
                again = True
            else:
                out += d.one(identity, rid, op, req, d.clock, may_park=False)
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
        d = self.door
        if ok is None:
            assert err is not None
            d.errors += 1
            return [Reply(w.identity, protocol.error(w.rid, *err))]
        others = self.view.others()
        if not others:
            return [Reply(w.identity, protocol.ok(w.rid, **ok))]
        # In place of the client's wait, just answered: the change is made, and neither
        # its answer nor the members' copies may be refused for want of room.
        parent = d.wait(w.identity, w.rid, d.clock, bounded=False)
        d.pending[parent].gather = Gather("sync", len(others), done=ok)
        out: list[Out] = []
        for member in others:
            out += self.forward(b"", 0, {"op": "cluster_sync"}, d.clock, member, parent=parent,
                                bounded=False)
        return out

    def catalog_written(self, w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
        """The catalog member created or deleted a topic: answered once it is copied here,
        so the client's next request here finds it."""
        if ok is None:
            assert err is not None
            self.door.errors += 1
            return [Reply(w.identity, protocol.error(w.rid, *err))]
        if len(self.after_pull) >= PARKED_MAX:
            # The change is made: answered now, before this member's copy has it (a
            # request naming a topic not copied yet waits for the copy, or is refused BUSY).
            return [Reply(w.identity, protocol.ok(w.rid, **ok))]
        # A copy under way may predate the change: then the answer waits for one more.
        self.after_pull.append((w.identity, w.rid, ok, self.pulling))
        return self.pull()
