"""The vocabulary between actors. Each message is a frozen dataclass with a tag.

Requests carry ``corr``, a correlation id the front door allocates; every reply carries it
back. Batches of records travel as opaque bytes (``blob``): the packed records array the
client sent, untouched until the shard writer decodes it once to build its indexes.

Tags are grouped by the actor that receives the message:
1x log manager, 2x front door, 3x cache manager, 4x shard writer, 5x supervisor, 6x any actor,
7x transaction manager and the checkpoint handshake, 8x transactions on their way to the log
manager, 9x transactions' answers to the front door.

Rows inside messages are typed. A topic is a ``Topic`` (``wire.protocol``, the layout
``list_topics`` answers with) wherever it travels. The produce path's rows, several per
request, are typed tuples (below) in messages that decode their arrays as tuples
(``@message(..., arrays=tuple)``, ``wire/codec.py``): a ``NamedTuple`` per row costs
about 0.25 µs more than a tuple to build or decode, and there are three or four rows per
request on its way through the node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from wire.codec import Message, encode, message
from wire.packer import JOIN_BYTES_MIN, pack_with_bin
from wire.protocol import Topic

# ---- the produce path's rows ------------------------------------------------------------

PartRow = tuple[int, int, int, bytes | memoryview]
"""One shard's slice of a produce on its way to the log: (topic_id, partition, count, blob),
``blob`` the packed records (``wire/records.py``); a view into the frame it came in when
its receiver reads it so (``wire.views``)."""

ProduceRow = tuple[int, int, Sequence[PartRow]]
"""A produce request in a ``Writes`` burst: (producer_id, seq, parts), its ``Append`` after
``corr``."""

PlacedRow = tuple[int, int, int]
"""Where a produce's records landed in one partition: (partition, first_offset, count), the
layout of ``wire.protocol.Placed``, which the client's reply carries as it is."""

AckRow = tuple[int, int, Sequence[PlacedRow]]
"""A durable produce request in ``Acks``: (corr, lsn, parts), an ``Ack``'s fields."""

OffsetRow = tuple[str, int, int, int]
"""A consumer offset committed in a transaction: (group, topic_id, partition, offset)."""

TxnPartRow = tuple[str, int, int, int]
"""Where a committed transaction's records landed in one partition: (topic, partition,
first_offset, count), as the client's ``txn_commit`` reply carries it."""

OtherWrite = tuple[int, bytes]
"""A request of a ``Writes`` burst that is not a produce: (its place in the burst, the
request as its encoded message)."""


class CarriesParts(Message):
    """Base of the transaction messages that carry records as ``parts`` rows: their bulk
    (``wire.codec``: joined without a copy when large) is the rows' packed batches."""

    __slots__ = ()
    parts: Sequence[PartRow]  # declared by each subclass, in its place among its fields

    def bulk_bytes(self) -> int:
        return sum(len(blob) for *_tpn, blob in self.parts)


# ---- to the log manager --------------------------------------------------------------


@message(10, arrays=tuple)
class Append(Message):
    """Append a producer's batch (already split by shard) to the log; ack when durable.
    (A produce request travels as the same fields in a ``Writes`` burst: ``ProduceRow``.)"""

    corr: int
    producer_id: int
    seq: int
    parts: Sequence[PartRow]


@message(11)
class CreateTopic(Message):
    """Create a topic; ack when the creation is durable."""

    corr: int
    name: str
    partitions: int
    # In a cluster: the owning member of each partition (the catalog member places them), and
    # the topic's id when a member copies the catalog member's topic (0: the next free id).
    owners: list[int] = dataclasses.field(default_factory=list)
    topic_id: int = 0
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # wire.protocol.Topic's


@message(12)
class DeleteTopic(Message):
    """Delete a topic and all its partitions; ack when the deletion is durable."""

    corr: int
    name: str
    topic_id: int = 0  # a member following the catalog member: only the topic of this id


@message(13)
class CommitOffset(Message):
    """Record a consumer group's committed offset for one partition."""

    corr: int
    group: str
    topic_id: int
    partition: int
    offset: int


@message(103)
class AlterTopic(Message):
    """Change a topic's settings (those of ``wire.protocol.ALTERABLE_SETTINGS``): ``settings``
    are the ones asked for, merged into the topic's; ack when durable."""

    corr: int
    name: str
    settings: dict[str, Any]
    topic_id: int = 0  # a member copying the catalog member's topic: its settings whole


@message(102)
class DeleteRecord(Message):
    """Delete one record of a partition: the one at ``offset``, or (``offset`` -1) the latest
    with ``key``; ack when the deletion is durable."""

    corr: int
    topic_id: int
    partition: int
    offset: int
    key: bytes | None


@message(14)
class ListTopics(Message):
    """Ask for the topic table; answered with ``TopicsReply``."""

    corr: int


@message(17)
class EndOffsets(Message):
    """Ask for the next offset of each partition of a topic; answered with ``OffsetsReply``
    once every record below those offsets is durable."""

    corr: int
    topic_id: int


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


@message(20, arrays=tuple)
class Ack(Message):
    """A produce is durable: where each part landed, in request order."""

    corr: int
    lsn: int
    parts: Sequence[PlacedRow]


@message(28, arrays=tuple)
class Acks(Message):
    """Log manager → front door: the produce requests of one group commit that are durable,
    an ``Ack``'s fields each (``AckRow``), in one message instead of one each."""

    rows: Sequence[AckRow]


@message(21)
class Done(Message):
    """A request that needs no data back succeeded (create/delete topic, commit offset)."""

    corr: int
    lsn: int


@message(22)
class TopicsReply(Message):
    """Every topic, sorted by name (the client's ``list_topics`` reply carries them as they are)."""

    corr: int
    topics: list[Topic]


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
    # The LSN of the last transaction commit the answer reflects: the front door makes every
    # read after it wait for that commit, so no reader sees part of a transaction.
    commit_lsn: int = 0

    def bulk_bytes(self) -> int:
        return len(self.records)


@message(25)
class ValueReply(Message):
    """An integer answer (an offset), or None when there is none."""

    corr: int
    value: int | None
    commit_lsn: int = 0  # the last transaction commit the answer reflects (see RecordsReply)


@message(26)
class StatusReply(Message):
    corr: int
    status: dict[str, Any]


@message(27)
class Catalog(Message):
    """The topic table, sent by the log manager whenever it changes and on ``Hello``."""

    version: int
    topics: list[Topic]
    durable_lsn: int  # everything up to here is on disk: reads may wait for it


@message(29)
class OffsetsReply(Message):
    """The next offset of each partition of a topic, in partition order; every record below
    them is durable by ``lsn`` (the front door makes later reads wait for it)."""

    corr: int
    lsn: int
    offsets: list[int]


# ---- to the cache manager (reads) and on to shard writers ---------------------------


@message(30)
class LogGroup(Message):
    """The bytes of one durable group commit, exactly as written to the log (a shard writer
    reads them as a view into the frame they came in: ``ShardWriter.VIEW_TAGS``)."""

    first_lsn: int
    last_lsn: int
    data: bytes

    def bulk_bytes(self) -> int:
        return len(self.data)


def encode_log_group(first_lsn: int, last_lsn: int, records: Sequence[bytes]) -> bytes:
    """The frame of ``LogGroup(first_lsn, last_lsn, b"".join(records))``, with the records
    joined once, into the frame itself, not first into a group and then again into it."""
    if sum(map(len, records)) < JOIN_BYTES_MIN:
        return encode(LogGroup(first_lsn, last_lsn, b"".join(records)))
    return pack_with_bin([LogGroup.TAG, first_lsn, last_lsn], records)


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


@message(100)
class KvGet(Message):
    """Front door → the writer of a KV namespace's shard: a key's value (``RecordsReply``
    whose records are a packed array of ``[key, value]``, empty when the key is absent)."""

    corr: int
    topic_id: int
    partition: int  # always 0: a namespace is one shard
    key: bytes
    lsn_min: int


@message(101)
class KvScan(Message):
    """Front door → the writer of a KV namespace's shard: up to ``limit`` pairs in key order
    (``RecordsReply`` whose records are a packed array of ``[key, value]``; the front door
    asks for one more than its client, to tell whether the scan stopped at the limit)."""

    corr: int
    topic_id: int
    partition: int
    prefix: bytes
    start_after: bytes | None
    limit: int
    lsn_min: int


@message(38)
class ShardStats(Message):
    """Front door → a shard writer: RocksDB's figures of its shards (``ShardsReply``)."""

    corr: int


@message(39)
class Compact(Message):
    """Front door → a shard writer: compact its shards of a topic, then answer
    ``ShardsReply`` (rows ``[topic_id, partition, bytes_before, bytes_after]``)."""

    corr: int
    topic_id: int


@message(40)
class ShardsReply(Message):
    """A shard writer's rows about its shards (the topic as its id), and for ``ShardStats``
    its own row (``wire.protocol.WRITER_STATS_ROW``; empty for ``Compact``)."""

    corr: int
    shards: list[list[Any]]
    writer: list[Any]


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

    def bulk_bytes(self) -> int:
        return sum(map(len, self.frames))



@message(60)
class Stop(Message):
    """Finish what is in hand, make it durable, and exit."""

    reason: str


# Reads (front door → cache manager or shard writer). The requests the log manager's logic
# admits (``LogRequest``) and the answers the front door matches to a waiting client
# (``Answer``) are at the end, after the transactions' messages they name.
ReadRequest = Read | ReadByKey | ReadByTag | OffsetForTimestamp | CommittedOffset | KvGet | KvScan


# ---- the transaction manager and the checkpoint handshake -----------------------------


@message(70)
class Ended(Message):
    """Log manager → transaction manager: these requests are answered (durable or refused)."""

    corrs: list[int]


@message(76, arrays=tuple)
class Writes(Message):
    """Front door → transaction manager → log manager: a burst of write requests with their
    correlation ids, so they begin as transactions together and pass on without being
    decoded.

    ``corrs`` holds every request's, in the order they came (the transaction manager reads
    only these: ``writes_corrs``). Produce requests are ``produces`` (``ProduceRow``: never
    encoded as a message of their own); any other request is in ``others`` as its encoded
    message, with its place among ``corrs``. The log manager admits them in that order."""

    corrs: Sequence[int]
    produces: Sequence[ProduceRow]
    others: Sequence[OtherWrite]  # in the order of their places

    def bulk_bytes(self) -> int:
        return (sum(len(blob) for _pid, _seq, parts in self.produces for *_tpn, blob in parts)
                + sum(len(frame) for _at, frame in self.others))

    def sizes(self) -> list[int]:
        """About how many bytes each request takes encoded, in burst order (the sizes only
        split bursts under the bundle limit)."""
        sizes = [WRITE_OVERHEAD_BYTES + sum(len(blob) + WRITE_OVERHEAD_BYTES
                                            for _t, _p, _n, blob in parts)
                 for _pid, _seq, parts in self.produces]
        for at, frame in self.others:  # in place order, so each lands at its place
            sizes.insert(at, len(frame) + WRITE_OVERHEAD_BYTES)
        return sizes

    def slice(self, start: int, end: int) -> Writes:
        """The requests at places ``start`` to ``end`` (excluded), as a burst of their own."""
        before = sum(1 for at, _f in self.others if at < start)
        others = [(at - start, frame) for at, frame in self.others if start <= at < end]
        first = start - before
        return Writes(self.corrs[start:end],
                      self.produces[first:first + end - start - len(others)], others)

    @staticmethod
    def join(bursts: Sequence[Writes]) -> Writes:
        """One burst of these, in order."""
        if len(bursts) == 1:
            return bursts[0]
        corrs: list[int] = []
        produces: list[ProduceRow] = []
        others: list[OtherWrite] = []
        for b in bursts:
            others.extend((len(corrs) + at, frame) for at, frame in b.others)
            corrs.extend(b.corrs)
            produces.extend(b.produces)
        return Writes(corrs, produces, others)


# What a request of a ``Writes`` takes encoded beyond its records, at most (a generous bound
# on the ids and headers).
WRITE_OVERHEAD_BYTES = 64


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


@message(87)
class FrontClosed(Message):
    """Supervisor → transaction manager, at a clean stop: the front door is closed, so no
    client can end a transaction open now. The checkpoint at stop does not wait for them
    (the next start rolls them back)."""


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


# ---- transactions: front door → transaction manager ----------------------------------


@message(77)
class TxnBegin(Message):
    """Begin a transaction (``xid``: an XA branch, ``[format_id, global_id, branch_id]``)."""

    corr: int
    timeout_ms: int
    xid: list[Any] | None
    txn: int = 0  # the id the client picked (0: the node picks one)
    owner: int = 0  # the client's id: only it ends or commits the transaction while active


@message(78, arrays=tuple)
class TxnWrite(CarriesParts):
    """Records (``parts``, as a produce's) and consumer offsets to stage in a transaction.
    ``seq`` numbers the transaction's writes from 0: a retry is recognised."""

    corr: int
    txn: int
    seq: int
    parts: Sequence[PartRow]
    offsets: Sequence[OffsetRow]
    # A key write with a compare-and-set: the transaction commits only with ``checked``.
    conditional: bool = False


@message(79)
class TxnStep(Message):
    """End, prepare, commit, commit in one phase, or roll back a transaction, named by its
    id (``txn``) or by its xid (``txn`` 0)."""

    corr: int
    txn: int
    xid: list[Any] | None
    step: str  # one of TXN_STEPS
    # With "commit" or "end": how many writes the client sent (-1: not said). If the node
    # staged another number (a write refused, or lost on its way), the step is refused.
    writes: int = -1
    # With "commit": the front door found the transaction's compare-and-sets matching (a
    # transaction with some is refused without it: a front door that restarted lost them).
    # With "rollback": one did not hold (a commit of it sent again is told so again).
    checked: bool = False
    # With a checked "commit": writes of its keys in flight that the front door decided it
    # ahead of, as the transaction manager said it held them at a blocking checkpoint's
    # gate (``GateHeld``). Refused BUSY unless every one is held there still: then they
    # reach the log after it, as the decision assumed.
    ahead_of: list[int] = dataclasses.field(default_factory=list)
    # With "end" or "commit": the client's id, as given at the begin (0: not said).
    owner: int = 0


TXN_STEPS = ("end", "prepare", "commit", "commit_one_phase", "rollback")


@message(88)
class TxnAsk(Message):
    """How did transaction ``txn`` end? Front door → transaction manager, about a checked
    commit whose wait expired; it changes nothing. Taken in order with the front door's
    other messages, so its answer reflects every step the front door sent before it.
    Answered ``TxnCommitted`` (from the log manager's ledger, once durable) if the
    transaction committed, else ``TxnOutcome``."""

    corr: int
    txn: int


@message(86, arrays=tuple)
class TxnOnce(CarriesParts):
    """A whole local transaction, id ``txn`` (the client's pick): begin, records (``parts``,
    as a produce's) and consumer offsets, commit. Front door → log manager, the way writes
    go (through the transaction manager's gate when checkpoints are blocking); answered
    ``TxnCommitted`` once the commit is durable, as a ``txn_commit`` is."""

    corr: int
    txn: int
    parts: Sequence[PartRow]
    offsets: Sequence[OffsetRow]


@message(80)
class TxnList(Message):
    """The open and prepared transactions (``prepared_only``: the xids in doubt)."""

    corr: int
    prepared_only: bool


# ---- transactions: transaction manager → log manager ---------------------------------


@message(81)
class TxnStart(Message):
    """Log the start of transaction ``txn`` (Tx-Start, or Dtx-Start with its xid); answer
    ``TxnId`` at once (corr 0: no answer)."""

    corr: int
    txn: int
    xid: list[Any] | None


@message(82, arrays=tuple)
class TxnAppend(CarriesParts):
    """Log records and offsets staged in ``txn``; answer ``TxnWritten`` once queued."""

    corr: int
    txn: int
    parts: Sequence[PartRow]
    offsets: Sequence[OffsetRow]


@message(83)
class TxnResolve(Message):
    """Log ``step`` ("prepare", "commit" or "rollback") of ``txn``; answer once durable
    (corr 0: no answer). A commit already logged is answered with its first outcome. A
    rollback says why (one of ``ROLLBACK_REASONS``), and the log keeps it, so that a commit
    sent again after a restart is told the same as before it."""

    corr: int
    txn: int
    step: str
    reason: str = ""


# Why a transaction was rolled back: its client (or an operator) asked; a compare-and-set
# of it did not hold; it was open past its timeout; the node restarted before it was
# prepared. "" in a log written before the reason was kept.
ROLLBACK_REASONS = ("client", "conflict", "timeout", "restart")


@message(84)
class TxnSync(Message):
    """Transaction manager → log manager, at its start: which transactions does the log
    hold? Answered with ``TxnTable``."""

    role: str


@message(85)
class TxnTable(Message):
    """The transactions the log holds: ``open`` rows (all prepared) ``[txn, xid or nil,
    prepared, records, bytes, [[topic_id, partition], ...], first_lsn]`` and recent
    ``outcomes`` rows ``[txn, xid or nil, committed, writes, reason]`` (a rollback's reason,
    ``ROLLBACK_REASONS``); ``next_txn`` is above every id the log has seen; ``aborted``: the
    open ones it rolled back on this ``TxnSync``."""

    open: list[list[Any]]
    outcomes: list[list[Any]]
    next_txn: int
    aborted: list[int]


# ---- transactions: answers to the front door -----------------------------------------


@message(90)
class TxnId(Message):
    corr: int
    txn: int


@message(91)
class TxnWritten(Message):
    """Staged (in the log's queue: durable with the commit that follows it)."""

    corr: int
    lsn: int
    records: int  # the transaction's records so far


@message(92, arrays=tuple)
class TxnCommitted(Message):
    corr: int
    lsn: int
    parts: Sequence[TxnPartRow]


@message(94)
class TxnOutcome(Message):
    """The answer to ``TxnAsk`` when the transaction has not committed (yet): one of
    TXN_OUTCOMES."""

    corr: int
    outcome: str


@message(95)
class GateHeld(Message):
    """Transaction manager → front door: write requests (their ``corrs``) it holds at a
    blocking checkpoint's closed gate (``held``), or let through as it opened. A checked
    commit waiting for a write of its keys to be answered may be decided ahead of a held
    one (``TxnStep.ahead_of``): the gate waits for the commit, so it would wait for good."""

    corrs: list[int]
    held: bool


# What a transaction not committed is, as ``TxnOutcome`` says: still open (its commit never
# came, was refused leaving it open, or was reopened), ended without commit (rolled back,
# timed out, or rolled back at a restart), committing (sent to the log, not durable yet:
# ask again), or not known (forgotten long ago, or never begun).
TXN_OUTCOMES = ("open", "ended", "committing", "unknown")


@message(93)
class TxnsReply(Message):
    """Rows ``[txn, xid, state, age_ms, records, bytes, partitions]`` (xid printed, or ""),
    or the prepared branches' xids ``[format_id, global_id, branch_id]``."""

    corr: int
    field: str  # the reply field that carries the rows: "txns", or "xids" (xa_recover)
    rows: list[list[Any]]


# ---- snapshot export (actors/snapshot.py, actors/snapshot_files.py) -------------------


@message(120)
class SnapshotExport(Message):
    """Front door → log manager: export a point-in-time copy of the node into ``dir``
    (absolute; absent or empty); answered ``Exported`` or an error."""

    corr: int
    dir: str


@message(121)
class CheckpointShards(Message):
    """Log manager → a shard writer: a RocksDB checkpoint of each shard it owns, into
    ``dir``/shards; answered ``ShardsCheckpointed``."""

    export_id: int
    dir: str


@message(122)
class ShardsCheckpointed(Message):
    """A shard writer's checkpoints: everything up to ``lsn`` (its processed LSN) is in
    them; ``shards`` rows ``[topic_id, partition, applied_lsn]``; ``error`` "" if all went."""

    export_id: int
    role: str
    lsn: int
    shards: list[list[int]]
    bytes: int
    error: str


@message(123)
class Exported(Message):
    """The export is whole: its LSN, how many shards and bytes, how long it took."""

    corr: int
    lsn: int
    shards: int
    bytes: int
    elapsed_ms: int


# ---- unions --------------------------------------------------------------------------

# The requests the log manager's logic admits (``LogState.admit``), and the answers the
# front door matches to a waiting client (``FrontDoorState.answer``).
Answer = (Ack | Done | TopicsReply | ErrorReply | RecordsReply | ValueReply | StatusReply
          | OffsetsReply | TxnId | TxnWritten | TxnCommitted | TxnOutcome | TxnsReply
          | ShardsReply | Exported)
LogRequest = (Append | CreateTopic | DeleteTopic | AlterTopic | CommitOffset | DeleteRecord
              | ListTopics
              | EndOffsets
              | TxnStart | TxnAppend | TxnResolve)
