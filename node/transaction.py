"""The client's side of transactions: ``Transaction``, what ``NodeClient.transaction()`` and
``NodeClient.xa_start()`` return.

    with c.transaction(timeout_ms=60_000) as tx:    # commits on leaving the block,
        tx.produce("out", b"v", key=b"k")            # rolls back on an exception
        tx.produce_batch("out", values, partition=1)
        tx.commit_offset("billing", "in", partition, next_offset)
    tx.result.offsets                                # per produce call: [(partition, offset)]

Each write is sent as it is made (a large transaction does not sit in the client) and is
staged by the node: logged, invisible, without offsets until the commit, which gives every
record its offset (contiguous per partition) and returns them. Writes are numbered, so a
write retried after a lost answer is not staged twice; a commit retried answers the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from wire.errors import ErrorCode, TransactionError, error_for
from wire.records import Record, pack_batch
from wire.xid import Xid

if TYPE_CHECKING:
    from node.client import NodeClient


class TxnPart(NamedTuple):
    """Where a committed transaction's records landed in one partition."""

    topic: str
    partition: int
    first_offset: int
    record_count: int


@dataclass(frozen=True, slots=True)
class TxnResult:
    """A commit's outcome: its LSN, the partitions' offsets, and each produce call's records'
    ``(partition, offset)`` in the order they were given."""

    lsn: int
    parts: list[TxnPart]
    offsets: list[list[tuple[int, int]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TxnInfo:
    """A row of ``NodeClient.txn_list()`` (``shardnode txn list``)."""

    txn: int
    xid: str  # printed, as ``shardnode txn commit`` takes it; "" for a local transaction
    state: str
    age_ms: int
    records: int
    bytes: int
    partitions: int


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class Transaction:
    """A transaction on the node, local or an XA branch. Not thread-safe."""

    def __init__(self, client: NodeClient, txn: int, xid: Xid | None = None) -> None:
        self.client = client
        self.id = txn
        self.xid = xid
        self.seq = 0
        self.finished = False
        self.result: TxnResult | None = None
        # Each produce call: its topic, the partition of each record, in order.
        self._placed: list[tuple[str, list[int]]] = []

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.finished or self.xid is not None:
            return  # an XA branch is its coordinator's to finish
        if kind is None:
            self.commit()
        else:
            self.abort()

    def _check(self) -> None:
        if self.finished:
            raise TransactionError(f"transaction {self.id} is finished", ErrorCode.TXN_STATE)

    def produce(self, topic: str, value: bytes | str, key: bytes | str | None = None,
                tags: Sequence[str] = (), timestamp: int | None = None,
                partition: int | None = None) -> int:
        """Stage one record; returns the transaction's records so far."""
        rec = Record(_as_bytes(value), None if key is None else _as_bytes(key), tuple(tags),
                     timestamp)
        return self.produce_batch(topic, [rec], partition)

    def produce_batch(self, topic: str, records: Iterable[Record | bytes],
                      partition: int | None = None) -> int:
        """Stage a batch of records; returns the transaction's records so far."""
        self._check()
        recs = list(records)
        if not recs:
            raise error_for(ErrorCode.EMPTY_BATCH, "a batch needs at least one record")
        fields: dict[str, Any] = {"txn": self.id, "seq": self.seq, "topic": topic,
                                  "records": pack_batch(recs)}
        if partition is not None:
            fields["partition"] = partition
        reply = self.client.call("txn_produce", **fields)
        self.seq += 1
        assign = reply.get("assign")
        if assign is None:
            ((p, n),) = reply["parts"]
            assign = [p] * n
        self._placed.append((topic, list(assign)))
        return int(reply["records"])

    def commit_offset(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Stage a consumer group's offset: committed together with the records."""
        self._check()
        self.client.call("txn_commit_offset", txn=self.id, seq=self.seq, group=group,
                         topic=topic, partition=partition, offset=offset)
        self.seq += 1

    def commit(self) -> TxnResult:
        """Commit: every staged record becomes visible at once, at the offsets returned.
        Returns once the commit is durable. (For an XA branch: one phase, after ``end``.)"""
        if self.result is not None:
            return self.result
        self._check()
        if self.xid is None:
            reply = self.client.call("txn_commit", txn=self.id)
        else:
            reply = self.client.call("xa_commit", xid=list(self.xid), one_phase=True)
        self.finished = True
        self.result = self._result(reply)
        return self.result

    def abort(self) -> None:
        """Roll back: nothing staged is ever visible, and no offsets are taken."""
        if self.finished:
            return
        if self.xid is None:
            self.client.call("txn_abort", txn=self.id)
        else:
            self.client.call("xa_rollback", xid=list(self.xid))
        self.finished = True

    def _result(self, reply: dict[str, Any]) -> TxnResult:
        parts = [TxnPart(*row) for row in reply["parts"]]
        nxt = {(p.topic, p.partition): p.first_offset for p in parts}
        offsets: list[list[tuple[int, int]]] = []
        for topic, assign in self._placed:
            mine = []
            for p in assign:
                off = nxt.get((topic, p), -1)  # -1: the topic was deleted before the commit
                mine.append((p, off))
                if off >= 0:
                    nxt[(topic, p)] = off + 1
            offsets.append(mine)
        return TxnResult(int(reply["lsn"]), parts, offsets)


def result_of(reply: dict[str, Any]) -> TxnResult:
    """A commit's outcome from its reply, without per-call offsets (an XA commit by xid)."""
    return TxnResult(int(reply["lsn"]), [TxnPart(*row) for row in reply["parts"]])
