"""Transaction writes a shard writer holds in memory until their commit: no I/O.

A transaction's records reach the writers when they are logged (``TXN_WRITE``), invisible
and without offsets until its ``COMMIT`` gives them offsets (or ``ROLLBACK`` drops them).
Most commits follow within seconds (a Spark batch, a client's transaction), so a writer
keeps the writes in memory, by transaction and shard, and a commit applies them from there.
Written into the shard's ``staged`` column family instead, each write was put, flushed,
read back and deleted: 3.4 times the CPU of applying the same records plainly.

What is held is written to ``staged`` (spilled) when it passes ``bytes_max``, and before
every flush that a checkpoint may truncate the log after, or that an export copies: from
then on the shard has it, and the log need not. Until then the log has it, and the shard
says from which LSN on (``ShardStore.held_lsn``, written with every batch), so that a
writer that restarts reads the log again from there and holds those writes again.
"""

from __future__ import annotations

from dataclasses import dataclass

Shard = tuple[int, int]


@dataclass(frozen=True, slots=True)
class HeldWrite:
    """One part of a ``TXN_WRITE`` record: a batch of records for one shard."""

    lsn: int
    part: int  # its place among the record's parts (the staged key's last field)
    ts: int  # the batch's timestamp (ms)
    count: int
    blob: bytes  # the records, packed as the client sent them


class HeldWrites:
    """The writes held, by (transaction, shard), in the order they were logged."""

    def __init__(self, bytes_max: int) -> None:
        assert bytes_max >= 0
        self.bytes_max = bytes_max
        self.bytes = 0
        self.writes: dict[tuple[int, Shard], list[HeldWrite]] = {}

    def hold(self, txn: int, shard: Shard, write: HeldWrite) -> None:
        self.writes.setdefault((txn, shard), []).append(write)
        self.bytes += len(write.blob)

    def take(self, txn: int, shard: Shard) -> list[HeldWrite]:
        """The writes of ``txn`` held for ``shard`` (its commit or rollback), no longer held."""
        writes = self.writes.pop((txn, shard), [])
        self.bytes -= sum(len(w.blob) for w in writes)
        return writes

    def oldest(self, shard: Shard) -> int:
        """The LSN of the oldest write held for ``shard``, or 0: where its writer must read
        the log from after a restart to hold them again."""
        return min((ws[0].lsn for (_txn, s), ws in self.writes.items() if s == shard),
                   default=0)

    def over(self) -> bool:
        return self.bytes > self.bytes_max

    def take_all(self) -> dict[Shard, list[tuple[int, HeldWrite]]]:
        """Everything held, ``(txn, write)`` per shard in LSN order, no longer held (to be
        spilled into the shards)."""
        out: dict[Shard, list[tuple[int, HeldWrite]]] = {}
        for (txn, shard), writes in self.writes.items():
            out.setdefault(shard, []).extend((txn, w) for w in writes)
        for held in out.values():
            held.sort(key=lambda tw: (tw[1].lsn, tw[1].part))
        self.writes.clear()
        self.bytes = 0
        return out

    def drop_shard(self, shard: Shard) -> None:
        """Forget what is held for ``shard`` (its topic was deleted)."""
        for key in [k for k in self.writes if k[1] == shard]:
            self.take(*key)
