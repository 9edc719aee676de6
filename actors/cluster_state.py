"""The front door's view of its cluster, with no I/O: who the members are, who owns what,
and how answers from several members make one.

A member of a cluster keeps every topic in its catalog (with each partition's owner,
``Topic.owners``) and the shards of the partitions it owns. The member with the lowest id
holds the catalog: topics are created and deleted there; the others copy its topics
(``catalog_changes``), when they start, every ``catalog_sync_ms``, and at once when a
request names a topic they do not know. A request for a partition another member owns is
forwarded to it and its answer relayed; a produce split by key over partitions of several
members is sent to each as its part, and the answers joined (``join_produce``); end offsets
are gathered from every owner (``join_offsets``). The front door's logic
(``actors/front_cluster.py``) uses these; its shell owns the sockets to the other members.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from config import NodeConfig
from config.cluster import Member
from wire.protocol import Topic

# A member's routing id on the other members' client sockets: requests that come with it
# were forwarded once already and are never forwarded again. After the prefix: the
# member's id and a token its front door draws at start (``peer_identity``).
PEER_PREFIX = b"shardnode-peer-"
PEER_TOKEN_BYTES = 8
PARKED_MAX = 1000  # requests waiting for a catalog copy (they named an unknown topic)


@dataclass(frozen=True, slots=True)
class ClusterView:
    me: int
    members: dict[int, Member]

    @staticmethod
    def of(cfg: NodeConfig) -> ClusterView | None:
        """This node's view, or None for a single node."""
        if not cfg.cluster.file:
            return None
        return ClusterView(cfg.cluster.node_id, {m.id: m for m in cfg.members})

    @property
    def catalog_id(self) -> int:
        """The member holding the catalog: the lowest id."""
        return min(self.members)

    @property
    def is_catalog(self) -> bool:
        return self.me == self.catalog_id

    def others(self) -> list[int]:
        return [m for m in self.members if m != self.me]

    def name(self, member: int) -> str:
        """A member as messages name it: its id and endpoint."""
        m = self.members.get(member)
        return f"node {member} ({m.endpoint})" if m else f"node {member}"

    def peer_identity(self, token: bytes) -> bytes:
        """This member's routing id at the others, with its front door's ``token``: no
        client can know it, so none can take its connection over (the front door's router
        hands a routing id over to the newest connection, for a member whose connection
        dropped to get its own back at once). A front door that restarts draws another."""
        return PEER_PREFIX + str(self.me).encode() + b"-" + token

    def map_rows(self) -> list[list[Any]]:
        """``cluster_map``'s ``members``."""
        return [[m.id, m.endpoint, m.public_key]
                for m in sorted(self.members.values(), key=lambda m: m.id)]


@dataclass(slots=True)
class Gather:
    """A client request answered from parts (its own node's, other members'): the answers
    by member, and the first error; the request is answered when none is left."""

    op: str
    left: int
    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    error: tuple[int, str] | None = None
    # produce: the partition of each record of the whole batch
    assign: list[int] | None = None
    topic: Topic | None = None  # end_offsets: the topic whose partitions are gathered
    done: dict[str, Any] | None = None  # sync: the answer, whatever the members said


def join_produce(g: Gather) -> dict[str, Any]:
    """One produce reply from its parts': every partition's placement, and where each record
    of the whole batch went."""
    parts = sorted((row for r in g.replies.values() for row in r["parts"]), key=lambda r: r[0])
    return {"lsn": max(r["lsn"] for r in g.replies.values()), "parts": parts,
            "assign": g.assign}


def join_offsets(g: Gather) -> dict[str, Any]:
    """One ``end_offsets`` reply: each partition's from its owner's answer."""
    topic = g.topic
    assert topic is not None
    return {"offsets": [g.replies[topic.owner(p)]["offsets"][p] for p in range(topic.partitions)]}


def catalog_alters(local: dict[str, Topic], catalog: Sequence[Topic]) -> list[Topic]:
    """The topics a member has whose settings the catalog member changed (``alter_topic``)."""
    mine = {t.topic_id: t for t in local.values()}
    return [t for t in catalog if t.topic_id in mine and mine[t.topic_id].settings != t.settings]


def catalog_changes(local: dict[str, Topic], catalog: Sequence[Topic]
                    ) -> tuple[list[Topic], list[Topic]]:
    """What a member does to copy the catalog member's topics: the topics to delete (gone
    there, or re-created under another id), then those to create."""
    there = {t.name: t for t in catalog}
    deletes = [t for t in local.values()
               if t.name not in there or there[t.name].topic_id != t.topic_id]
    creates = [t for t in catalog
               if t.name not in local or local[t.name].topic_id != t.topic_id]
    return deletes, creates
