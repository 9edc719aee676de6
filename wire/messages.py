"""The vocabulary between actors. Each message is a frozen dataclass with a tag.

Requests carry ``corr``, a correlation id the front door allocates; every reply carries it
back. Batches of records travel as opaque bytes (``blob``): the packed records array the
client sent, untouched until the shard writer decodes it once to build its indexes.

Tags are grouped by the actor that receives the message:
1x log manager, 2x front door, 3x cache manager, 4x shard writer, 5x supervisor, 6x any actor,
7x transaction manager and the checkpoint handshake.
"""

from __future__ import annotations

from typing import Any

from wire.codec import Message, message

# A part of a produce: one shard's slice of the batch.
#   to the log manager:   [topic_id, partition, count, blob]
#   in acks:              [partition, first_offset, count]
Part = list[Any]

# ---- to the log manager --------------------------------------------------------------


@message(10)
class Append(Message):
    """Append a producer's batch (already split by shard) to the log; ack when durable."""

    corr: int
    producer_id: int
    seq: int
    parts: list[Part]  # [[topic_id, partition, count, blob], ...]


@message(11)
class CreateTopic(Message):
    """Create a topic; ack when the creation is durable."""

    corr: int
    name: str
    partitions: int


@message(12)
class DeleteTopic(Message):
    """Delete a topic and all its partitions; ack when the deletion is durable."""

    corr: int
    name: str


@message(13)
class CommitOffset(Message):
    """Record a consumer group's committed offset for one partition."""

    corr: int
    group: str
    topic_id: int
    partition: int
    offset: int


@message(14)
class ListTopics(Message):
    """Ask for the topic table; answered with ``TopicsReply``."""

    corr: int


@message(16)
class Checkpoint(Message):
    """Run a checkpoint now; answer ``Done(corr, lsn)`` to ``reply_to`` when it is finished."""

    corr: int
    reply_to: str


@message(15)
class Hello(Message):
    """An actor (re)started and wants the current catalog (answered with ``Catalog``)."""

    role: str


# ---- to the front door ---------------------------------------------------------------


@message(20)
class Ack(Message):
    """A produce is durable: where each part landed."""

    corr: int
    lsn: int
    parts: list[Part]  # [[partition, first_offset, count], ...] in request order


@message(28)
class Acks(Message):
    """Log manager → front door: the produce requests of one group commit that are durable,
    as rows ``[corr, lsn, parts]``: an ``Ack`` each, in one message instead of one each."""

    rows: list[list[Any]]


@message(21)
class Done(Message):
    """A request that needs no data back succeeded (create/delete topic, commit offset)."""

    corr: int
    lsn: int


@message(22)
class TopicsReply(Message):
    corr: int
    topics: list[list[Any]]  # [[name, partitions, topic_id], ...] sorted by name


@message(23)
class ErrorReply(Message):
    corr: int
    code: int
    text: str


@message(24)
class RecordsReply(Message):
    """Records found by a read: a packed array of ``[offset, ts_ms, key, tags, value]``."""

    corr: int
    records: bytes
    lsn: int  # the applied LSN the answer reflects


@message(25)
class ValueReply(Message):
    """An integer answer (an offset), or None when there is none."""

    corr: int
    value: int | None


@message(26)
class StatusReply(Message):
    corr: int
    status: dict[str, Any]


@message(27)
class Catalog(Message):
    """The topic table, sent by the log manager whenever it changes and on ``Hello``."""

    version: int
    topics: list[list[Any]]  # [[topic_id, name, partitions], ...]
    durable_lsn: int  # everything up to here is on disk: reads may wait for it


# ---- to the cache manager (reads) and on to shard writers ---------------------------


@message(30)
class LogGroup(Message):
    """The bytes of one durable group commit, exactly as written to the log."""

    first_lsn: int
    last_lsn: int
    data: bytes


@message(36)
class Progress(Message):
    """``role`` has applied every log group up to ``lsn``: its sender may count those bytes
    as delivered (cache manager → log manager, shard writer → cache manager)."""

    role: str
    lsn: int


@message(37)
class CatchUp(Message):
    """Log groups up to ``lsn`` are durable but were not sent to you (your queue was full):
    read them from the log files."""

    lsn: int


@message(31)
class Read(Message):
    """Read up to ``max_records`` of a partition from ``offset`` in offset order."""

    corr: int
    topic_id: int
    partition: int
    offset: int
    max_records: int
    lsn_min: int  # serve only once everything up to this LSN is applied


@message(32)
class ReadByKey(Message):
    corr: int
    topic_id: int
    partition: int
    key: bytes
    lsn_min: int


@message(33)
class ReadByTag(Message):
    corr: int
    topic_id: int
    partition: int
    tag: str
    offset: int
    max_records: int
    lsn_min: int


@message(34)
class OffsetForTimestamp(Message):
    corr: int
    topic_id: int
    partition: int
    timestamp: int
    lsn_min: int


@message(35)
class CommittedOffset(Message):
    corr: int
    group: str
    topic_id: int
    partition: int
    lsn_min: int


# ---- to the supervisor -----------------------------------------------------------------


@message(50)
class Stats(Message):
    """An actor's figures, sent about once a second; also its heartbeat."""

    role: str
    pid: int
    figures: dict[str, Any]


@message(51)
class StatusRequest(Message):
    corr: int


# ---- to any actor ----------------------------------------------------------------------


@message(61)
class Bundle(Message):
    """Several encoded messages in one frame: what one burst of work sends to one peer.

    Per-message costs (a ZeroMQ send, a wakeup, a decode) are paid once per bundle, not
    once per request. The receiver handles the frames in order, as if sent one by one.
    """

    frames: list[bytes]



@message(60)
class Stop(Message):
    """Finish what is in hand, make it durable, and exit."""

    reason: str


READ_MESSAGES = (Read, ReadByKey, ReadByTag, OffsetForTimestamp, CommittedOffset)


# ---- the transaction manager and the checkpoint handshake -----------------------------


@message(70)
class Ended(Message):
    """Log manager → transaction manager: these requests are answered (durable or refused)."""

    corrs: list[int]


# An item of ``Writes.requests``: a produce request's ``Append`` fields after ``corr``
# (``[producer_id, seq, parts]``), or any other write request as its encoded message.
WriteRequest = list[Any] | bytes


@message(76)
class Writes(Message):
    """Front door → transaction manager → log manager: a burst of write requests with their
    correlation ids, so they begin as transactions together and pass on without being
    decoded. A produce request travels as the fields of its ``Append`` after ``corr``
    (``[producer_id, seq, parts]``); any other write as its encoded message."""

    corrs: list[int]
    requests: list[WriteRequest]


# What a request of a ``Writes`` takes encoded beyond its records, at most (a generous bound
# on the ids and headers: the sizes only split bursts under the bundle limit).
WRITE_OVERHEAD_BYTES = 64


def write_bytes(request: WriteRequest) -> int:
    """About how many bytes ``request`` (an item of ``Writes.requests``) takes encoded."""
    if isinstance(request, bytes):
        return len(request) + WRITE_OVERHEAD_BYTES
    return WRITE_OVERHEAD_BYTES + sum(len(part[3]) + WRITE_OVERHEAD_BYTES for part in request[2])


@message(71)
class CheckpointRequest(Message):
    """Log manager → transaction manager: a checkpoint wants to start."""

    ckpt_id: int


@message(72)
class CheckpointReady(Message):
    """Transaction manager → log manager: go ahead (in blocking mode: nothing is active now).

    ``oldest_lsn`` is the oldest LSN an active transaction still needs, or 0 for none.
    """

    ckpt_id: int
    oldest_lsn: int


@message(73)
class CheckpointFinished(Message):
    """Log manager → transaction manager: the checkpoint is over (or abandoned); resume."""

    ckpt_id: int


@message(74)
class FlushTo(Message):
    """Apply everything up to ``lsn`` and make it durable in RocksDB, then answer ``Flushed``."""

    ckpt_id: int
    lsn: int


@message(75)
class Flushed(Message):
    """Everything up to ``lsn`` is durable in the shards of ``role`` (or of all, from the cache)."""

    ckpt_id: int
    role: str
    lsn: int
