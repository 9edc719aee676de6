"""Who runs what, and where each shard and key goes.

Every actor process has a role: a name that is also its mailbox's file name under the
node's run directory. The supervisor maps roles to the classes that run them; everything
else addresses actors by role only. Placement is here too, in one place for the node and
the client alike: which shard writer owns a shard, and which partition a key goes to.
"""

from __future__ import annotations

import zlib

from config import NodeConfig

SUPERVISOR = "supervisor"
FRONT_DOOR = "front"
LOG_MANAGER = "log"
TRANSACTION_MANAGER = "txn"
CACHE_MANAGER = "cache"
WRITER_PREFIX = "writer-"


def writer_role(index: int) -> str:
    return f"{WRITER_PREFIX}{index}"


def is_writer(role: str) -> bool:
    return role.startswith(WRITER_PREFIX)


def writer_index(role: str) -> int:
    assert is_writer(role), role
    return int(role[len(WRITER_PREFIX):])


def writes_role(cfg: NodeConfig) -> str:
    """Where the front door sends write requests (produce, topic changes, offset commits).

    A ``blocking`` checkpoint holds new writes at the transaction manager's gate, so they
    pass through it. A ``fuzzy`` checkpoint never holds them, and a single write begins and
    ends inside one group commit, needing nothing of the log that a checkpoint could
    truncate: there they go straight to the log manager, one process hop fewer on every
    acknowledgement's way (docs/ARCHITECTURE.md)."""
    return TRANSACTION_MANAGER if cfg.log.checkpoint_mode == "blocking" else LOG_MANAGER


def shard_owner(topic_id: int, partition: int, writers: int) -> int:
    """The index of the shard writer that owns a shard (stable for a given writer count)."""
    return (topic_id * 7919 + partition) % writers


def key_partition(key: bytes, partitions: int) -> int:
    """The partition a record with ``key`` goes to when the producer names none; the
    client computes the same to read by key."""
    return zlib.crc32(key) % partitions
