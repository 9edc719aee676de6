"""The log manager's ledger of transactions, with no I/O: what the log holds for each one.

The transaction manager decides what a transaction may do (``actors/transactions.py``);
the log manager writes each step as a log record and keeps, here, what it must know to
write the next ones and to answer for them after a restart:

- for each open or prepared transaction, its xid, the records it staged per shard (counts
  only: the records themselves wait in the shards, ``actors/shard_store.py``), the
  consumer offsets it will commit, and whether it is prepared;
- for recently finished ones, the outcome (committed with these offsets, or rolled back
  and why), so that a commit retried after a lost answer is answered as the first one was.

It is rebuilt by ``replay`` from the records (Qpid CLFS: Tx-Start, Dtx-Start, the staged
writes, Prepare, Commit, Rollback) and carried in the log manager's snapshot, so a
checkpoint may delete every segment below it: a prepared transaction does not pin the log.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wire.messages import OffsetRow, TxnPartRow
from wire.xid import Xid

Shard = tuple[int, int]  # (topic_id, partition)


@dataclass(slots=True)
class Staged:
    """An open or prepared transaction, as far as the log knows it."""

    xid: Xid | None
    first_lsn: int
    prepared: bool = False
    counts: dict[Shard, int] = field(default_factory=dict)  # records staged per shard
    offsets: dict[tuple[str, int, int], int] = field(default_factory=dict)  # the last wins
    records: int = 0
    bytes: int = 0
    writes: int = 0  # write requests staged (a client's writes are numbered from 0)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a transaction ended: committed (at ``lsn``, its records at ``parts``) or not."""

    committed: bool
    lsn: int
    parts: list[TxnPartRow]
    xid: Xid | None
    writes: int = 0  # its write requests: one of them sent again is answered, not refused
    reason: str = ""  # why it was rolled back (``wire.messages.ROLLBACK_REASONS``)


class TxnLedger:
    def __init__(self, outcomes_max: int) -> None:
        self.open: dict[int, Staged] = {}
        self.outcomes: collections.OrderedDict[int, Outcome] = collections.OrderedDict()
        self.outcomes_max = outcomes_max
        self.next_txn = 1  # above every transaction id the log has seen (may be 2**63)

    # ---- the steps (called at admit and at replay alike) --------------------------------

    def start(self, txn: int, xid: Xid | None, lsn: int) -> None:
        self.open[txn] = Staged(xid, lsn)
        self.next_txn = max(self.next_txn, txn + 1)

    def write(self, txn: int, parts: Sequence[Sequence[Any]],
              offsets: Sequence[OffsetRow]) -> None:
        """Records staged (``parts`` rows begin ``topic_id, partition, count``) and offsets."""
        st = self.open[txn]
        st.writes += 1
        for row in parts:
            shard = (row[0], row[1])
            st.counts[shard] = st.counts.get(shard, 0) + row[2]
            st.records += row[2]
            if len(row) > 3:
                st.bytes += len(row[3])
        for group, topic_id, partition, offset in offsets:
            st.offsets[(group, topic_id, partition)] = offset

    def prepare(self, txn: int) -> None:
        self.open[txn].prepared = True

    def finish(self, txn: int, outcome: Outcome) -> None:
        st = self.open.pop(txn, None)
        if st is not None:
            outcome = dataclasses.replace(outcome, writes=st.writes)
        self.outcomes[txn] = outcome
        self.outcomes.move_to_end(txn)
        while len(self.outcomes) > self.outcomes_max:
            self.outcomes.popitem(last=False)

    def xid_of(self, txn: int) -> Xid | None:
        st = self.open.get(txn)
        if st is not None:
            return st.xid
        out = self.outcomes.get(txn)
        return None if out is None else out.xid

    # ---- what the transaction manager is told at its start ------------------------------

    def table(self) -> tuple[list[list[Any]], list[list[Any]]]:
        """Rows of ``TxnTable``: the open ones, and the outcomes."""
        opened = [[txn, None if st.xid is None else list(st.xid), st.prepared, st.records,
                   st.bytes, [list(shard) for shard in st.counts], st.first_lsn]
                  for txn, st in self.open.items()]
        outcomes = [[txn, None if o.xid is None else list(o.xid), o.committed, o.writes,
                     o.reason] for txn, o in self.outcomes.items()]
        return opened, outcomes

    # ---- the snapshot ---------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "next_txn": self.next_txn,
            "txns": [[txn, None if st.xid is None else list(st.xid), st.prepared, st.first_lsn,
                      st.records, st.bytes, [[t, p, n] for (t, p), n in st.counts.items()],
                      [[g, t, p, o] for (g, t, p), o in st.offsets.items()], st.writes]
                     for txn, st in self.open.items()],
            "txn_outcomes": [[txn, o.committed, o.lsn, o.parts,
                              None if o.xid is None else list(o.xid), o.writes, o.reason]
                             for txn, o in self.outcomes.items()],
        }

    def restore(self, snap: dict[str, Any]) -> None:
        self.open.clear()
        self.outcomes.clear()
        self.next_txn = snap.get("next_txn", 1)
        for txn, xid, prepared, first_lsn, records, nbytes, counts, offsets, writes in snap.get(
                "txns", []):
            self.open[txn] = Staged(None if xid is None else Xid(*xid), first_lsn, prepared,
                                    {(t, p): n for t, p, n in counts},
                                    {(g, t, p): o for g, t, p, o in offsets}, records, nbytes,
                                    writes)
        for txn, committed, lsn, parts, xid, writes, *reason in snap.get("txn_outcomes", []):
            # (format 3 snapshots have no reason: "")
            self.finish(txn, Outcome(committed, lsn, [tuple(r) for r in parts],
                                     None if xid is None else Xid(*xid), writes,
                                     reason[0] if reason else ""))
