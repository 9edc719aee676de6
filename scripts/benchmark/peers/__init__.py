"""The systems the bench measures the node against. A new peer is a module here (and its
client workloads under ``workloads/`` when it is a server), registered below."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..measure import Row
from ..settings import DISK, FLOOR
from . import disk, floor, rabbitmq, redis
from .base import ServerPeer

if TYPE_CHECKING:
    from ..bench import Bench

# Servers, in the order their rows follow the node's.
SERVER_PEERS: dict[str, ServerPeer] = {p.system: p for p in (redis.PEER, rabbitmq.PEER)}
# References: measured once per bench run, shown in every ingest scenario.
REFERENCES: dict[str, Callable[[Bench], Row]] = {FLOOR: floor.measure, DISK: disk.measure}
NAMES = (*SERVER_PEERS, *REFERENCES)
