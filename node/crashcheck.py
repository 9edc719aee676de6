"""Crash checking: idempotent producers that record what was acknowledged, and the check
that after any crash every acknowledged record is present exactly once, in order.

Used by ``tests/test_crash.py`` and ``scripts/crashtest``. Producers are threads, each with
its own ``NodeClient``; each batch is retried with the same sequence number until it is
acknowledged, as an idempotent producer must. A ``PipelinedProducer`` sends each record
of a batch as its own request, all in flight at once, sharing frames each way. A producer
can be paused between batches, so the check reads a state that no request is changing.

Given a list of endpoints (the members of a cluster), a producer's client is routed: it
sends each request to the owner of its partition, and splits a batch with no partition
named by key over the owners (``NodeClient``). A request for a member that is down fails
(``Unavailable``) and is retried under the same sequence number until the member is back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from node.client import NodeClient
from wire.errors import ErrorCode, NodeError
from wire.records import Record

BATCH_RETRY_S_MAX = 180.0  # a batch not acknowledged in this long fails the producer
RETRYABLE = (ErrorCode.BUSY, ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE)
PIPELINED_IN_FLIGHT = 8  # a PipelinedProducer's batch: single-record requests in flight at once


@dataclass
class Ledger:
    """What one producer sent and what the node acknowledged, value → (partition, offset)."""

    sent: set[bytes] = field(default_factory=set)
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)


class Producer(threading.Thread):
    """Writes numbered batches of unique values to ``topic`` until stopped or done.

    ``endpoint``: a node's, or a list of a cluster's members (a routed client). ``keyed``:
    each record carries its value as its key, so that a batch with no partition named is
    split by key over the partitions (and their owners); without keys the node puts a
    whole batch in one partition, its round-robin pick."""

    def __init__(self, endpoint: str | Sequence[str], topic: str, name: str, batch: int,
                 partition: int | None, batches_max: int | None = None,
                 keyed: bool = False) -> None:
        super().__init__(daemon=True, name=f"producer-{name}")
        self.endpoint, self.topic, self.tag, self.batch = endpoint, topic, name, batch
        self.partition = partition
        self.batches_max = batches_max
        self.keyed = keyed
        self.resent = 0  # requests refused (busy, down) or unanswered, and sent again
        self.ledger = Ledger()
        self.error: BaseException | None = None
        self.done_batches = 0
        self.quota = 0 if batches_max is None else batches_max  # batches allowed so far
        self.allowed = threading.Condition()
        self.stopping = False

    def allow(self, more: int) -> None:
        """Let the producer write ``more`` batches beyond what it has written."""
        with self.allowed:
            self.quota = self.done_batches + more
            self.allowed.notify_all()

    def idle(self) -> bool:
        return self.done_batches >= self.quota or self.error is not None or not self.is_alive()

    def stop(self) -> None:
        with self.allowed:
            self.stopping = True
            self.allowed.notify_all()

    def run(self) -> None:
        try:
            with NodeClient(self.endpoint, timeout_ms=3000, retries=0) as c:
                b = 0
                while True:
                    with self.allowed:
                        while not self.stopping and b >= self.quota:
                            self.allowed.wait(1.0)
                        if self.stopping:
                            return
                    self.write(c, b)
                    b += 1
                    self.done_batches = b
        except BaseException as exc:  # surfaced by the checker
            self.error = exc

    def write(self, c: NodeClient, b: int) -> None:
        values = [f"{self.tag}-{b}-{i}".encode() for i in range(self.batch)]
        self.ledger.sent.update(values)
        records: list[Record | bytes] = ([Record(v, key=v) for v in values] if self.keyed
                                         else list(values))
        deadline = time.monotonic() + BATCH_RETRY_S_MAX
        while True:
            try:
                # Batch b is always sequence number b: a retry after a lost answer is
                # recognised (by each member it went to) and answered with the same offsets.
                placed = c.produce_batch(self.topic, records, self.partition, seq=b)
                break
            except NodeError:
                if time.monotonic() > deadline:
                    raise
                self.resent += 1
        if len(placed) != len(values):
            raise AssertionError(f"acknowledged {len(placed)} records of a batch of "
                                 f"{len(values)}")
        for v, pos in zip(values, placed, strict=True):
            self.ledger.acked[v] = pos


class PipelinedProducer(Producer):
    """Writes each batch as single-record requests, all in flight at once through one
    ``Pipeline`` (so several share a frame each way), and resends every one not
    acknowledged within ``timeout_s`` (or refused as busy) under its own sequence number."""

    timeout_s = 3.0

    def write(self, c: NodeClient, b: int) -> None:
        values = [f"{self.tag}-{b}-{i}".encode() for i in range(self.batch)]
        self.ledger.sent.update(values)
        todo = {b * self.batch + i: v for i, v in enumerate(values)}  # seq → value
        deadline = time.monotonic() + BATCH_RETRY_S_MAX
        first = True
        while todo:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(todo)} records of batch {b} never acknowledged")
            if not first:
                self.resent += len(todo)
            first = False
            # A fresh pipeline per attempt: late answers to an earlier one are ignored.
            pipe = c.pipeline(in_flight_max=self.batch)
            sent = {pipe.submit(self.topic, [v], self.partition, seq=seq): seq
                    for seq, v in todo.items()}
            attempt_end = time.monotonic() + self.timeout_s
            while sent and time.monotonic() < attempt_end:
                for rid, out in pipe.poll(100):
                    seq = sent.pop(rid)
                    if isinstance(out, NodeError):
                        if out.code not in RETRYABLE:
                            raise out
                        continue  # resent in the next attempt
                    (pos,) = out
                    self.ledger.acked[todo.pop(seq)] = pos
            pipe.close()  # what it did not answer is sent again by the next attempt


T = TypeVar("T")


class KillPoint(Generic[T]):
    """Where a producer of ``scripts/crashtest`` is to be killed next: armed at a named
    point, its event is set, once, when the producer next reaches it; ``fired_in`` is what
    reached it (a transaction, a step)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.point: str | None = None
        self.fired = threading.Event()
        self.fired_in: T | None = None

    def arm(self, point: str) -> threading.Event:
        with self.lock:
            self.fired.clear()
            self.point = point
            self.fired_in = None
        return self.fired

    def disarm(self) -> None:
        with self.lock:
            self.point = None

    def armed_at(self) -> str | None:
        with self.lock:
            return self.point

    def reach(self, point: str, what: T) -> bool:
        """The producer is at ``point``: True (and the event set) if it was armed there."""
        with self.lock:
            if self.point != point:
                return False
            self.point = None
            self.fired_in = what
        self.fired.set()
        return True


class CheckFailed(AssertionError):
    """What the node holds disagrees with what it acknowledged."""


def read_partition(c: NodeClient, topic: str, partition: int) -> list[bytes]:
    values: list[bytes] = []
    while True:
        recs = c.read(topic, partition, len(values), 1000)
        if not recs:
            return values
        offsets = [r.offset for r in recs]
        if offsets != list(range(len(values), len(values) + len(recs))):
            raise CheckFailed(f"partition {partition}: offsets {offsets[0]}.. are not contiguous "
                              f"after {len(values)}")
        values += [r.value for r in recs]


def positions(c: NodeClient, topic: str, partitions: int) -> dict[bytes, tuple[int, int]]:
    """Where each value of ``topic`` is stored, (partition, offset); raise ``CheckFailed``
    if a value is stored twice."""
    where: dict[bytes, tuple[int, int]] = {}
    for p in range(partitions):
        for off, v in enumerate(read_partition(c, topic, p)):
            if v in where:
                raise CheckFailed(f"{v!r} is stored twice: at {where[v]} and at {(p, off)}")
            where[v] = (p, off)
    return where


def check(c: NodeClient, topic: str, partitions: int, ledgers: list[Ledger]) -> int:
    """Raise ``CheckFailed`` unless every acknowledged record is present exactly once at its
    acknowledged offset and nothing is present that was never sent; return the count."""
    where = positions(c, topic, partitions)
    sent = set().union(*(ledger.sent for ledger in ledgers))
    unknown = set(where) - sent
    if unknown:
        raise CheckFailed(f"{len(unknown)} records were never sent, e.g. {sorted(unknown)[:3]}")
    acked = 0
    for ledger in ledgers:
        for v, pos in ledger.acked.items():
            if where.get(v) != pos:
                raise CheckFailed(f"acknowledged {v!r} at {pos}, found at {where.get(v)}")
            acked += 1
    return acked
