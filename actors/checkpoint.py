"""The checkpoint handshake, as the log manager drives it (SwiftMQ's, across processes).

    requested   log manager → transaction manager: CheckpointRequest
                (fuzzy: the log rolls to a new segment now, and writes go on)
    ready       transaction manager → log manager: CheckpointReady(oldest LSN still needed)
                (blocking: once every active transaction has ended; new ones wait)
                the log rolls here in blocking mode; L = the last durable LSN
    flush       log manager → cache manager → every shard writer: FlushTo(L);
                each applies to at least L, flushes RocksDB, answers Flushed(its LSN)
    truncate    when all have flushed ≥ L: write the log manager's state snapshot, then
                delete the segments wholly below min(L, oldest needed) + 1 (no directory
                fsync: actors/wal.py says why); the shell does this off its commit path and reports back (``truncated``)
    finished    log manager → transaction manager: CheckpointFinished; the gate opens

``Coordinator`` is the logic, with no I/O; it returns what the shell must do. A step that
takes longer than ``timeout_s`` abandons the checkpoint (nothing is deleted) and the next
trigger tries again. The truncate step is the exception: it is the shell's own file work,
already under way, and a new checkpoint must not start beside it, so it is waited for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from actors.instructions import AskFlush, AskTxn, Finish, Roll, Truncate


class Phase(enum.Enum):
    IDLE = "idle"
    WAIT_READY = "wait_ready"
    WAIT_FLUSHED = "wait_flushed"
    TRUNCATING = "truncating"


# The instructions (actors/instructions.py) a checkpoint gives the log manager.
Step = Roll | AskTxn | AskFlush | Truncate | Finish


@dataclass
class Coordinator:
    mode: str
    timeout_s: float
    phase: Phase = Phase.IDLE
    ckpt_id: int = 0
    lsn: int = 0  # L: what the shards must flush to
    oldest_lsn: int = 0
    step_started: float = 0.0
    waiters: list[tuple[str, int]] = field(default_factory=list)
    done: int = 0
    abandoned: int = 0

    def start(self, now: float, waiter: tuple[str, int] | None = None) -> list[Step]:
        if waiter is not None:
            self.waiters.append(waiter)
        if self.phase is not Phase.IDLE:
            return []  # one at a time; the waiter is answered when this one ends
        self.ckpt_id += 1
        self.phase = Phase.WAIT_READY
        self.step_started = now
        steps: list[Step] = [Roll()] if self.mode == "fuzzy" else []
        return [*steps, AskTxn(self.ckpt_id)]

    def ready(self, ckpt_id: int, oldest_lsn: int, now: float) -> list[Step]:
        if ckpt_id != self.ckpt_id or self.phase is not Phase.WAIT_READY:
            return []
        self.oldest_lsn = oldest_lsn
        self.phase = Phase.WAIT_FLUSHED
        self.step_started = now
        steps: list[Step] = [Roll()] if self.mode == "blocking" else []
        return [*steps, AskFlush(ckpt_id)]

    def asked_flush(self, lsn: int) -> None:
        """The shell committed the queue and asked for a flush to ``lsn``."""
        self.lsn = lsn

    def flushed(self, ckpt_id: int, lsn: int) -> list[Step]:
        if ckpt_id != self.ckpt_id or self.phase is not Phase.WAIT_FLUSHED:
            return []
        if lsn < self.lsn:
            return self._end(f"shards flushed only to LSN {lsn}, not {self.lsn}")
        upto = self.lsn if not self.oldest_lsn else min(self.lsn, self.oldest_lsn - 1)
        self.phase = Phase.TRUNCATING
        return [Truncate(ckpt_id, upto)]

    def truncated(self, ckpt_id: int, error: str = "") -> list[Step]:
        """The shell wrote the snapshot and deleted the segments (or failed to: ``error``)."""
        if ckpt_id != self.ckpt_id or self.phase is not Phase.TRUNCATING:
            return []
        return self._end(error)

    def tick(self, now: float) -> list[Step]:
        if self.phase in (Phase.IDLE, Phase.TRUNCATING):
            return []
        if now - self.step_started > self.timeout_s:
            return self._end(f"step {self.phase.value} took over {self.timeout_s:.0f} s")
        return []

    def _end(self, error: str) -> list[Step]:
        waiters, self.waiters = self.waiters, []
        self.phase = Phase.IDLE
        if error:
            self.abandoned += 1
        else:
            self.done += 1
        return [Finish(self.ckpt_id, self.lsn, waiters, error)]
