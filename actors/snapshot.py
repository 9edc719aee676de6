"""A snapshot export, as the log manager drives it: the logic, with no I/O.

    start        front door → log manager: ``SnapshotExport(dir)``; one at a time (BUSY
                 while one runs); the shell prepares ``dir`` (absent or empty) and asks
                 every shard writer for ``CheckpointShards`` (``AskShards``)
    checkpointed each writer flushes its shards (RocksDB's WAL is off: a checkpoint must
                 flush first), takes a RocksDB checkpoint of each into ``dir``/shards and
                 answers with its processed LSN A_w: every record ≤ A_w is in its checkpoints
    copy         once all have answered: F = min A_w. The shell commits its queue, takes
                 L = the last durable LSN (≥ every A_w: writers apply durable records only),
                 rolls the log to a segment starting at L + 1, and on a thread writes the log
                 manager's state as of L (its snapshot: catalog, next offsets, producers'
                 windows, transactions) and copies the segments holding F + 1 .. L, then the
                 manifest, last (``CopyLog``)
    copied       the thread is done: answer ``Exported`` (or the error)

Started from that directory, a node is an ordinary recovery: the log manager loads the
snapshot at L and finds nothing after it; each shard replays the copied log from its
applied LSN (≥ F) to L. So the copy holds exactly the records durable at or below L.

While an export runs (``pins_log``), checkpoints delete no segment: the export needs those
from F + 1 on, and F is known only once the writers answer. (A checkpoint already deleting
when the export starts deletes only segments at or below its own L, which every shard has
flushed past, so at or below F.) A step that takes longer than the timeout fails the export
with TIMEOUT; its directory is then partial, without a manifest, and refused by
``--from-snapshot``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from actors.instructions import AskShards, CopyLog, Send
from actors.roles import FRONT_DOOR
from wire.codec import Message
from wire.errors import ErrorCode
from wire.messages import ErrorReply, Exported

ANSWER_WAIT_MS = 1000


class ExportPhase(enum.Enum):
    IDLE = "idle"
    SHARDS = "shards"  # waiting for the writers' checkpoints
    COPYING = "copying"  # the log manager's thread writes the rest


ExportStep = AskShards | CopyLog | Send


@dataclass
class SnapshotCoordinator:
    writers: tuple[str, ...]  # the shard writers' roles
    timeout_s: float
    phase: ExportPhase = ExportPhase.IDLE
    export_id: int = 0
    corr: int = 0
    dir: str = ""
    started: float = 0.0
    deadline: float = 0.0
    answered: dict[str, int] = field(default_factory=dict)  # writer → its processed LSN
    shards: int = 0
    bytes: int = 0
    done: int = 0
    failed: int = 0

    @property
    def pins_log(self) -> bool:
        """Checkpoints must delete no segment now."""
        return self.phase is not ExportPhase.IDLE

    def start(self, corr: int, directory: str, now: float) -> list[ExportStep]:
        if self.phase is not ExportPhase.IDLE:
            return [_error(corr, ErrorCode.BUSY, f"a snapshot export into {self.dir} is "
                           f"running; one runs at a time, retry when it is done")]
        self.export_id += 1
        self.phase = ExportPhase.SHARDS
        self.corr, self.dir = corr, directory
        self.started, self.deadline = now, now + self.timeout_s
        self.answered = {}
        self.shards = self.bytes = 0
        return [AskShards(self.export_id, directory)]

    def checkpointed(self, export_id: int, role: str, lsn: int, shards: int, size: int,
                     error: str) -> list[ExportStep]:
        """A writer's answer: its shards are checkpointed up to ``lsn`` (or ``error``)."""
        if export_id != self.export_id or self.phase is not ExportPhase.SHARDS:
            return []  # an export that ended already (timed out)
        if error:
            return self._end(ErrorCode.INTERNAL, f"{role} could not checkpoint its shards: "
                             f"{error}")
        self.answered[role] = lsn
        self.shards += shards
        self.bytes += size
        if set(self.answered) != set(self.writers):
            return []
        self.phase = ExportPhase.COPYING
        return [CopyLog(self.export_id, self.dir, min(self.answered.values()), self.deadline)]

    def copied(self, export_id: int, lsn: int, size: int, now: float,
               error: str = "") -> list[ExportStep]:
        """The log and the manifest are written (or ``error``)."""
        if export_id != self.export_id or self.phase is not ExportPhase.COPYING:
            return []
        if error:
            return self._end(ErrorCode.INTERNAL, error)
        self.bytes += size
        self.phase = ExportPhase.IDLE
        self.done += 1
        elapsed_ms = int((now - self.started) * 1000)
        return [Send(FRONT_DOOR, Exported(self.corr, lsn, self.shards, self.bytes, elapsed_ms),
                     ANSWER_WAIT_MS)]

    def failed_to_start(self, export_id: int, code: ErrorCode, text: str) -> list[ExportStep]:
        """The shell could not prepare the directory (``text`` says why)."""
        if export_id != self.export_id or self.phase is not ExportPhase.SHARDS:
            return []
        return self._end(code, text, partial=False)

    def tick(self, now: float) -> list[ExportStep]:
        """Writers that have not answered in time fail the export. The copy is the shell's
        thread, which gives up at the deadline by itself and then reports."""
        if self.phase is ExportPhase.SHARDS and now > self.deadline:
            missing = sorted(set(self.writers) - set(self.answered))
            return self._end(ErrorCode.TIMEOUT, f"{', '.join(missing)} did not checkpoint "
                             f"their shards within {self.timeout_s:.0f} s "
                             f"(log.snapshot_timeout_ms)")
        return []

    def _end(self, code: ErrorCode, text: str, partial: bool = True) -> list[ExportStep]:
        self.phase = ExportPhase.IDLE
        self.failed += 1
        if partial:
            text += (f"; {self.dir} holds a partial export (no manifest), which "
                     f"--from-snapshot refuses: delete it")
        return [_error(self.corr, code, f"snapshot export failed: {text}")]


def _error(corr: int, code: ErrorCode, text: str) -> Send:
    msg: Message = ErrorReply(corr, code, text)
    return Send(FRONT_DOOR, msg, ANSWER_WAIT_MS)
