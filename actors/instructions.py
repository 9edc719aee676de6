"""What a state machine asks its shell to do: the one instruction type of every actor.

The logic of each actor (``front_state``, ``log_state``, ``checkpoint``, ``txn_state``,
``writer_state``, the supervisor's restart policy) is a state machine with no I/O: it
takes an event and returns ``list[Instruction]``. The shell around it owns the sockets
and files and carries each instruction out in a ``match`` that ends in ``assert_never``,
so an instruction no shell performs is a type error, not a silent drop. Each shell meets
only some of them; the state machines are tested with plain asserts on what they return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wire.codec import Message
from wire.messages import ProduceRow, ReadRequest, Writes

# ---- between actors ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``msg`` to the actor ``role``, waiting up to ``wait_ms`` for room in its mailbox."""

    role: str
    msg: Message
    wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    """Send ``msg`` to the actor ``role`` on a client's behalf; ``corr`` waits for its answer
    (and is answered BUSY if the actor's mailbox is full)."""

    role: str
    corr: int
    msg: Message


@dataclass(frozen=True, slots=True)
class Forward:
    """Send this burst of write requests on to ``role`` (as ``Writes`` messages under the
    bundle limit); those that cannot be sent are answered BUSY."""

    role: str
    writes: Writes


@dataclass(frozen=True, slots=True)
class Produce:
    """Send a produce request on to be logged: ``corr`` waits for its answer, and
    ``request`` rides in a ``Writes`` burst as it is (``ProduceRow``), never encoded as a
    message of its own."""

    corr: int
    request: ProduceRow


@dataclass(frozen=True, slots=True)
class ToPeer:
    """Send a request ``frame`` to the cluster member ``member``'s client socket; ``corr``
    (the frame's ``id``) waits for its answer, and is answered UNAVAILABLE if the member
    cannot be reached."""

    member: int
    corr: int
    frame: bytes


# ---- to a client ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``frame`` to the client ``identity`` (joined with its other replies of a burst)."""

    identity: bytes
    frame: bytes


# ---- the log -------------------------------------------------------------------------


@dataclass(slots=True)
class Log:
    """Write ``record`` (LSN ``lsn``) in the next group commit; once it is durable, send
    ``reply`` (a message for the front door). An empty record needs no write: the reply
    goes with its group (a duplicate produce). Not frozen: one is made per request on the
    hot path, and a frozen dataclass costs more to build."""

    record: bytes
    reply: Any
    lsn: int
    catalog_changed: bool = False
    # Send ``reply`` at once rather than after the fsync: a record staged in a transaction,
    # which only the durable commit after it makes count (``actors/txn_ledger.py``).
    early: bool = False


# ---- the checkpoint handshake (actors/checkpoint.py) ---------------------------------


@dataclass(frozen=True, slots=True)
class Roll:
    """Start a new log segment (after committing what is queued)."""


@dataclass(frozen=True, slots=True)
class AskTxn:
    """Ask the transaction manager whether checkpoint ``ckpt_id`` may go on."""

    ckpt_id: int


@dataclass(frozen=True, slots=True)
class AskFlush:
    """Commit the queue, then ask the cache manager to flush to the last durable LSN."""

    ckpt_id: int


@dataclass(frozen=True, slots=True)
class Truncate:
    """Write the state snapshot, then delete segments holding only LSNs ≤ ``upto``; call
    ``Coordinator.truncated`` when done."""

    ckpt_id: int
    upto: int


@dataclass(frozen=True, slots=True)
class Finish:
    """Tell the transaction manager, and answer the waiters (ok, or the error)."""

    ckpt_id: int
    lsn: int
    waiters: list[tuple[str, int]]
    error: str = ""


# ---- a snapshot export (actors/snapshot.py) ------------------------------------------


@dataclass(frozen=True, slots=True)
class AskShards:
    """Prepare the export's directory ``dir``, then ask every shard writer for a checkpoint
    of its shards there (``SnapshotCoordinator.checkpointed`` hears each answer)."""

    export_id: int
    dir: str


@dataclass(frozen=True, slots=True)
class CopyLog:
    """Commit the queue; take L, the last durable LSN, and roll the log past it; then, off
    the commit path, write the log manager's state at L and copy the segments holding LSNs
    ``floor`` + 1 .. L into ``dir``, and the manifest last (``SnapshotCoordinator.copied``)."""

    export_id: int
    dir: str
    floor: int
    deadline: float  # a monotonic time: the copy gives up past it


# ---- a shard writer's shards (actors/writer_state.py) -------------------------------


@dataclass(frozen=True, slots=True)
class ReadLog:
    """Read the log files and apply the records after the applied LSN, up to ``until_lsn``
    (all there are: None); report each stretch applied (``WriterState.applied``)."""

    until_lsn: int | None


@dataclass(frozen=True, slots=True)
class Apply:
    """Apply the records of ``data`` (a durable group, the bytes as written to the log)
    after the applied LSN, and report them applied. Everything before ``first_lsn`` must be
    applied by then; if it is not (the log files lacked it), the actor fails, and its
    restart recovers from the log."""

    first_lsn: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Serve:
    """Answer a read (each carries ``corr`` and ``lsn_min``) from what the shards hold now."""

    request: ReadRequest


@dataclass(frozen=True, slots=True)
class Flush:
    """Make every shard durable to the applied LSN; report it done
    (``WriterState.flushed``)."""

    ckpt_id: int


# ---- the supervisor's actors (node/supervision.py) -----------------------------------


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start a process for the actor ``role``; report its pid (``Supervision.spawned``). The
    process imports what it runs and waits to be let start (``Release``)."""

    role: str


@dataclass(frozen=True, slots=True)
class Release:
    """Let the process spawned for ``role`` start its actor: its stage's turn has come."""

    role: str


@dataclass(frozen=True, slots=True)
class Terminate:
    """End the process of ``role``: ``STOP_SIGNAL``, and SIGKILL if it has not exited within the
    stop timeout; with ``kill``, SIGKILL at once (it does not answer)."""

    role: str
    kill: bool = False


@dataclass(frozen=True, slots=True)
class StopNode:
    """The node cannot go on: stop it, and say ``reason`` as it exits failed."""

    reason: str


Instruction = (Send | Request | Forward | Produce | Reply | Log
               | Roll | AskTxn | AskFlush | Truncate | Finish
               | AskShards | CopyLog
               | ReadLog | Apply | Serve | Flush
               | Spawn | Release | Terminate | StopNode)
