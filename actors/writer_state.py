"""A shard writer's logic, with no I/O: the order it applies the log in, and its waiting reads.

The writer keeps ``processed_lsn``, the last LSN it has gone through. The shell
(``actors/shard_writer.py``) owns RocksDB, the log files and the sockets; it tells this
state what arrived and what it applied, and carries out what comes back.

    recover     at start, from the lowest LSN any shard still needs: read the whole log
                after it (``ReadLog(None)``), the redo recovery of RocketMQ's design
    group       a durable group from the cache manager: nothing if it is all applied
                already; if it starts past ``processed_lsn`` + 1, groups were missed (this
                writer restarted, or its mailbox was full): read the log up to it first,
                then ``Apply`` it
    catch up    ``CatchUp(lsn)``: groups up to ``lsn`` were not sent; read them from the log
    flush to    a checkpoint's ``FlushTo(L)``: read the log up to L if behind, ``Flush``,
                and once flushed answer ``Flushed`` with the applied LSN
    read        a read carries ``lsn_min``: served at once if applied that far; otherwise
                it waits in a bounded list (BUSY beyond ``parked_max``) until ``applied``
                reaches it, or until its deadline (TIMEOUT, ``expire``)
    tick        reads still waiting for an acknowledged LSN whose group never came: read
                the log up to the highest they need
    idle        tell the cache manager how far this writer applied (``Progress``), by the
                bytes applied or the time since the last report (``ProgressReport``)

Every step is per group or per stretch of the log, never per record: the shell applies the
records themselves.
"""

from __future__ import annotations

import collections
import logging

from actors.flow import ProgressReport
from actors.instructions import Apply, Flush, ReadLog, Send, Serve
from actors.roles import CACHE_MANAGER, FRONT_DOOR
from wire.codec import Message
from wire.errors import ErrorCode
from wire.messages import ErrorReply, Flushed, Progress, ReadRequest

log = logging.getLogger("shardnode")

# The instructions (actors/instructions.py) a shard writer carries out.
WriterInstruction = Send | ReadLog | Apply | Serve | Flush

REPLY_WAIT_MS = 100  # for room in the front door's mailbox, per reply
FLUSHED_WAIT_MS = 1000  # a checkpoint waits for the answer: be patient


def error_reply(corr: int, code: ErrorCode, text: str) -> Send:
    """Answer the request ``corr`` (through the front door) with an error."""
    return Send(FRONT_DOOR, ErrorReply(corr, code, text), wait_ms=REPLY_WAIT_MS)


class WriterState:
    def __init__(self, role: str, parked_max: int, read_wait_s: float,
                 progress_bytes_min: int) -> None:
        self.role = role
        self.parked_max = parked_max
        self.read_wait_s = read_wait_s  # how long a read may wait for its LSN
        self.processed_lsn = 0
        self.parked: collections.deque[tuple[float, ReadRequest]] = collections.deque()
        self.progress = ProgressReport(progress_bytes_min)  # to the cache manager

    # ---- the log ------------------------------------------------------------------

    def recover(self, floor: int) -> list[WriterInstruction]:
        """Every shard has applied at least to ``floor``: replay the log after it."""
        self.processed_lsn = floor
        return [ReadLog(None)]

    def group(self, first_lsn: int, last_lsn: int, data: bytes) -> list[WriterInstruction]:
        """A durable group of LSNs ``first_lsn``..``last_lsn``, ``data`` as written."""
        if last_lsn <= self.processed_lsn:
            return []
        self.progress.applied(len(data))
        if first_lsn > self.processed_lsn + 1:
            log.debug("gap %d..%d: reading the log", self.processed_lsn + 1, first_lsn - 1)
            return [ReadLog(first_lsn - 1), Apply(first_lsn, data)]
        return [Apply(first_lsn, data)]

    def catch_up(self, lsn: int) -> list[WriterInstruction]:
        """Groups up to ``lsn`` are durable but were not sent here."""
        if lsn <= self.processed_lsn:
            return []
        log.debug("groups to %d were not sent: reading the log", lsn)
        return [ReadLog(lsn)]

    def applied(self, lsn: int) -> list[WriterInstruction]:
        """The shell applied everything up to ``lsn`` (or found nothing there left to apply):
        serve the reads that waited for it."""
        self.processed_lsn = lsn
        if not self.parked:
            return []
        out: list[WriterInstruction] = []
        keep: collections.deque[tuple[float, ReadRequest]] = collections.deque()
        for deadline, msg in self.parked:
            if msg.lsn_min <= lsn:
                out.append(Serve(msg))
            else:
                keep.append((deadline, msg))
        self.parked = keep
        return out

    # ---- the checkpoint -----------------------------------------------------------

    def flush_to(self, ckpt_id: int, lsn: int) -> list[WriterInstruction]:
        """Make every shard durable to at least ``lsn`` (durable, so the log has it)."""
        if self.processed_lsn < lsn:
            return [ReadLog(lsn), Flush(ckpt_id)]
        return [Flush(ckpt_id)]

    def flushed(self, ckpt_id: int) -> list[WriterInstruction]:
        """The shell flushed every shard to ``processed_lsn``."""
        return [Send(CACHE_MANAGER, Flushed(ckpt_id, self.role, self.processed_lsn),
                     wait_ms=FLUSHED_WAIT_MS)]

    # ---- reads --------------------------------------------------------------------

    def read(self, msg: ReadRequest, now: float) -> list[WriterInstruction]:
        if msg.lsn_min <= self.processed_lsn:
            return [Serve(msg)]
        if len(self.parked) >= self.parked_max:
            return [error_reply(msg.corr, ErrorCode.BUSY, "too many reads waiting for this writer")]
        self.parked.append((now + self.read_wait_s, msg))
        return []

    def tick(self, now: float) -> list[WriterInstruction]:
        """Reads wait for an LSN that was acknowledged, so it is in the log files: if its
        group never reached this writer (a full mailbox), read it from there."""
        if not self.parked:
            return []
        need = max(msg.lsn_min for _deadline, msg in self.parked)
        return [ReadLog(need)] if need > self.processed_lsn else []

    def expire(self, now: float) -> list[WriterInstruction]:
        """Answer TIMEOUT to the reads still waiting at their deadline."""
        out: list[WriterInstruction] = []
        while self.parked and self.parked[0][0] <= now:
            _deadline, msg = self.parked.popleft()
            out.append(error_reply(msg.corr, ErrorCode.TIMEOUT,
                                   f"writer has applied LSN {self.processed_lsn}, the read "
                                   f"needs {msg.lsn_min}"))
        return out

    # ---- reports ------------------------------------------------------------------

    def idle(self, now: float) -> list[WriterInstruction]:
        """The cache manager counts the bytes it sent here until they are reported applied."""
        lsn = self.processed_lsn
        if not self.progress.due(lsn, now):
            return []
        self.progress.sent(lsn, now)
        return [Send(CACHE_MANAGER, Progress(self.role, lsn), wait_ms=REPLY_WAIT_MS)]

    def refused(self, msg: Message) -> list[WriterInstruction]:
        """A ``Send`` of ours was refused (the peer's mailbox stayed full). A lost reply is
        the front door's to time out; a lost ``Progress`` is sent again."""
        if isinstance(msg, Progress):
            self.progress.refused()
        return []
