"""Where a topic's partitions live in a cluster: rendezvous placement.

Each member gets a score per topic, a hash of (topic name, member id); the members ranked by
score take the topic's partitions in turn: partition p goes to the member ranked p mod n.
So one topic's partitions are spread as evenly as they can be (counts differ by at most
one), topics start their turn at different members (a one-partition topic lands on a member
its name picks), and the answer depends only on the name, the partition count and the
member ids. It is computed once, when the catalog member creates the topic, and stored in
the topic's metadata (``Topic.owners``): a later change of membership moves nothing
without an explicit step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def score(topic: str, member_id: int) -> int:
    digest = hashlib.blake2b(f"{topic}\x00{member_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def place(topic: str, partitions: int, member_ids: Iterable[int]) -> tuple[int, ...]:
    """The owning member's id of each partition of ``topic``, in partition order."""
    ranked = sorted(member_ids, key=lambda m: (score(topic, m), m), reverse=True)
    if not ranked:
        raise ValueError("a topic needs at least one member to live on")
    return tuple(ranked[p % len(ranked)] for p in range(partitions))
