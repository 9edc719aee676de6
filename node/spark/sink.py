"""The ``shardnode`` sink: Spark's batches written into the node, exactly once.

**exactly_once** (the default) is two-phase commit, with the node as the resource manager
(XA, ``actors/transactions.py``) and the sink's driver as the coordinator, whose log is a
topic of the node. For micro-batch ``B`` of sink ``S`` (``sinkId``, by default the
streaming query's id, which its checkpoint keeps):

1. **Tasks stage.** Each task writes its rows into XA branches of global id ``S/B``
   (branch ``<Spark partition>/<attempt>/<nonce>/<n>``; a new branch every
   ``maxRecordsPerTransaction`` rows, ``maxBytesPerTransaction`` bytes or half the
   transaction timeout): logged as they are sent, invisible, without offsets. It ends and
   prepares them (durable, in doubt: they survive any crash of the node and never time out)
   and returns their xids to the driver. A task that fails rolls its branches back; one
   that dies leaves them to the driver (step 3) or to their timeout (while not prepared).
2. **The driver reads S's decision**: the latest record keyed ``S`` in the topic
   ``shardnode.spark-sinks`` (``{"batch": B, "xids": [...]}``). If it is for ``B``, Spark
   is replaying a batch that was decided: the decision's branches still prepared are
   committed (the driver died, or a commit failed, between steps 4 and 5), every other
   branch of ``S`` is rolled back, and nothing is written twice. A decision for a later
   batch means the sink id belongs to another checkpoint: refused.
3. **It rolls back S's other live branches**: failed or zombie task attempts, batches
   never decided. None of them can become visible.
4. **It writes the decision** ``{"batch": B, "xids": [...]}`` keyed ``S``: one record,
   durable when acknowledged. This is the commit point: from here the batch will commit,
   through step 2 if this commit does not finish.
5. **It commits each branch** (XA's second phase): the rows become visible, with offsets.
   Then it rolls back any branch of ``S/B`` a zombie task prepared meanwhile.

``abort`` (after a task failed, or this commit raised) rolls the batch's branches back,
unless the batch was decided: then they are left for the replay's step 2. A batch write
(``df.write``) follows the same steps under a sink id of its own, batch 0; it is never
replayed, so a commit that fails after its decision leaves its branches prepared, named
in the error, for ``shardnode txn commit``.

The decisions (``plan_commit``, ``plan_abort``) are made without I/O and tested arrow by
arrow; ``commit_batch`` and ``abort_batch`` carry them out.

**at_least_once** sends plain produce requests, several in flight, and commits nothing: a
task retried or a batch replayed writes its rows again. Within one task attempt a request
resent after a lost answer is not written twice (produce is idempotent per client).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from node.client import NodeClient, Pipeline
from node.spark.options import AT_LEAST_ONCE, SinkOptions
from node.spark.rows import requests_of
from node.transaction import Transaction
from wire.errors import ErrorCode, NodeError, TopicExists, XAERNota, error_for
from wire.xid import Xid
from wire.xid import parse as parse_xid

log = logging.getLogger("shardnode.spark")

SINKS_TOPIC = "shardnode.spark-sinks"  # the sinks' decisions, one record per batch, keyed by sink
XID_FORMAT = 0x53504B  # "SPK": the format id of the sink's XA branches
BATCH_ID_KEY = "streaming.sql.batchId"  # local properties Spark gives a streaming query's tasks
QUERY_ID_KEY = "sql.streaming.queryId"
_RETRYABLE = (ErrorCode.BUSY, ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE)
ROLLBACK_TIMEOUT_MS = 5000  # how long a failed task waits to roll back each of its branches
RESENDS_MAX = 8  # at_least_once: times one request is sent again after BUSY or a timeout
RESEND_BACKOFF_S_MAX = 1.0


class SinkIdInUse(RuntimeError):
    """The sink id has a decision for a later batch than this one: it belongs to another
    query (another checkpoint), and this query's batches would be skipped as replays."""


@dataclass
class SinkCommit(WriterCommitMessage):
    """What a task tells the driver: the branches it prepared (exactly_once), and its rows."""

    sink_id: str
    batch_id: int
    xids: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    rows: int = 0


def global_id(sink_id: str, batch_id: int) -> bytes:
    return f"{sink_id}/{batch_id}".encode()


def _task_ids(default_sink: str | None) -> tuple[str, int, int, int]:
    """(sink id, batch id, Spark partition, attempt) of the running task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the shardnode sink writes from Spark tasks only")
    batch = ctx.getLocalProperty(BATCH_ID_KEY)
    sink = default_sink or ctx.getLocalProperty(QUERY_ID_KEY)
    if sink is None:
        raise RuntimeError("no sink id: give the option 'sinkId', or write from a streaming query")
    return sink, 0 if batch is None else int(batch), ctx.partitionId(), ctx.attemptNumber()


def _pack(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def _requests(opts: SinkOptions, batch: pa.RecordBatch) -> Iterator[tuple[str, int | None,
                                                                           list[Any]]]:
    """The batch's rows as requests of the sink's size: (topic, partition, records)."""
    return requests_of(batch, opts.topic, opts.records_per_request_max, opts.request_bytes_max)


# ---- tasks ------------------------------------------------------------------------------


class _Staging:
    """One task's XA branches: a new one past ``records_per_txn_max`` records,
    ``txn_bytes_max`` bytes, or half the branch's timeout."""

    def __init__(self, client: NodeClient, opts: SinkOptions, gtrid: bytes, partition: int,
                 attempt: int) -> None:
        self.client, self.opts, self.gtrid = client, opts, gtrid
        self.branch_prefix = f"{partition}/{attempt}/{secrets.token_hex(4)}/"
        self.done: list[Xid] = []  # ended and prepared
        self.tx: Transaction | None = None
        self.xid: Xid | None = None
        self.records = 0  # in the open branch
        self.bytes = 0
        self.began = 0.0

    def send(self, topic: str, partition: int | None, records: list[Any]) -> None:
        blob = _pack(records)
        if self.tx is not None and (
                self.records + len(records) > self.opts.records_per_txn_max
                or self.bytes + len(blob) > self.opts.txn_bytes_max
                or time.monotonic() - self.began > self.opts.txn_timeout_ms / 2000):
            self.prepare()
        if self.tx is None:
            self.xid = Xid(XID_FORMAT, self.gtrid,
                           f"{self.branch_prefix}{len(self.done)}".encode())
            self.tx = self.client.xa_start(self.xid, timeout_ms=self.opts.txn_timeout_ms)
            self.tx.in_flight_max = self.opts.requests_in_flight_max
            self.began = time.monotonic()
        self.tx.produce_packed(topic, blob, partition)
        self.records += len(records)
        self.bytes += len(blob)

    def prepare(self) -> None:
        if self.xid is None:
            return
        self.client.xa_end(self.xid)  # its writes are all answered first
        self.client.xa_prepare(self.xid)
        self.done.append(self.xid)
        self.tx, self.xid, self.records, self.bytes = None, None, 0, 0

    def roll_back(self) -> None:
        """After a failure: nothing of this task may stay (best effort; the driver and the
        branches' timeout see to what this cannot reach). One try each, briefly: the
        failure may be the node's, and the task's error should not wait on it."""
        self.client.retries = 0
        self.client.timeout_ms = min(self.client.timeout_ms, ROLLBACK_TIMEOUT_MS)
        for xid in [*self.done, *([self.xid] if self.xid is not None else [])]:
            try:
                self.client.xa_rollback(xid)
            except NodeError as exc:
                log.warning("could not roll back %s: %s", xid, exc)


def _write_staged(opts: SinkOptions, batches: Iterator[pa.RecordBatch], sink_id: str,
                  batch_id: int, partition: int, attempt: int) -> SinkCommit:
    rows = 0
    with NodeClient(opts.endpoint, timeout_ms=opts.request_timeout_ms) as client:
        staging = _Staging(client, opts, global_id(sink_id, batch_id), partition, attempt)
        try:
            for batch in batches:
                for topic, part, records in _requests(opts, batch):
                    staging.send(topic, part, records)
                rows += batch.num_rows
            staging.prepare()
        except BaseException:
            staging.roll_back()
            raise
    return SinkCommit(sink_id, batch_id, [(x.format_id, x.global_id, x.branch_id)
                                          for x in staging.done], rows)


def _write_plain(opts: SinkOptions, batches: Iterator[pa.RecordBatch], sink_id: str,
                 batch_id: int) -> SinkCommit:
    """at_least_once: produce requests, up to ``requestsInFlight`` at a time; one the node
    could not take is sent again under its sequence number (not written twice), at most
    ``RESENDS_MAX`` times, backing off."""
    with NodeClient(opts.endpoint, timeout_ms=opts.request_timeout_ms) as client:
        pipe = Pipeline(client, opts.requests_in_flight_max)
        # request id → (topic, partition, blob, records, seq, times sent)
        sent: dict[int, tuple[str, int | None, bytes, int, int, int]] = {}
        rows = 0

        def answered(limit: int) -> None:
            while len(sent) > limit:
                got = pipe.poll(opts.request_timeout_ms, offsets=False)
                if not got:
                    raise error_for(ErrorCode.TIMEOUT, f"no answer from {opts.endpoint} within "
                                    f"{opts.request_timeout_ms} ms")
                for rid, result in got:
                    topic, part, blob, count, seq, times = sent.pop(rid)
                    if not isinstance(result, NodeError):
                        continue
                    if result.code not in _RETRYABLE or times > RESENDS_MAX:
                        raise result
                    time.sleep(min(RESEND_BACKOFF_S_MAX, 0.01 * 2 ** times))  # back off
                    again = pipe.submit(topic, [b""] * count, part, blob=blob, seq=seq)
                    sent[again] = (topic, part, blob, count, seq, times + 1)

        for batch in batches:
            for topic, part, records in _requests(opts, batch):
                answered(opts.requests_in_flight_max - 1)
                blob, seq = _pack(records), client.next_seq()
                rid = pipe.submit(topic, [b""] * len(records), part, blob=blob, seq=seq)
                sent[rid] = (topic, part, blob, len(records), seq, 1)
            rows += batch.num_rows
        answered(0)
    return SinkCommit(sink_id, batch_id, [], rows)


# ---- the driver: decisions without I/O --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """What the driver's commit does, in order: roll ``roll_back`` back, write the decision
    (if ``decide``), commit ``commit``; then roll back what zombies prepared meanwhile."""

    roll_back: list[Xid]
    decide: bool
    commit: list[Xid]


Decision = tuple[int, list[Xid]]  # the batch decided, and its branches


def plan_commit(sink_id: str, batch_id: int, decided: Decision | None, live: Sequence[Xid],
                ours: Sequence[Xid]) -> Plan:
    """Steps 2-5 for batch ``batch_id``, given the sink's decision, its live branches (open
    or prepared, any batch) and the branches the tasks of this attempt prepared."""
    if decided is not None and decided[0] > batch_id:
        raise SinkIdInUse(
            f"sink id {sink_id!r} has committed batch {decided[0]}, after this batch "
            f"{batch_id}: it belongs to another query's checkpoint. Give this query a "
            f"sinkId of its own (its batches would otherwise be skipped as replays)")
    if decided is not None and decided[0] == batch_id:  # a replay of a decided batch
        keep = set(decided[1])
        return Plan([x for x in live if x not in keep], False,
                    [x for x in live if x in keep])
    mine = set(ours)
    return Plan([x for x in live if x not in mine], bool(ours), list(ours))


def plan_abort(batch_id: int, decided: Decision | None, ours: Sequence[Xid]) -> list[Xid]:
    """The branches ``abort`` rolls back: none once the batch is decided (the replay
    commits them), else this attempt's."""
    if decided is not None and decided[0] >= batch_id:
        return []
    return list(ours)


# ---- the driver: carrying them out ------------------------------------------------------


def _decision(client: NodeClient, sink_id: str) -> tuple[Decision | None, bool]:
    """The sink's latest decision, and whether the decisions' topic exists."""
    try:
        rec = client.read_by_key(SINKS_TOPIC, sink_id, partition=0)
    except NodeError as exc:
        if exc.code != ErrorCode.UNKNOWN_TOPIC:
            raise
        return None, False
    if rec is None:
        return None, True
    body = msgpack.unpackb(rec.value, raw=False)
    return (int(body["batch"]), [Xid(*x) for x in body["xids"]]), True


def _live_branches(client: NodeClient, sink_id: str, batch_id: int | None = None) -> list[Xid]:
    """The sink's open and prepared branches on the node (of one batch, or of any)."""
    prefix = global_id(sink_id, batch_id) if batch_id is not None else f"{sink_id}/".encode()
    out = []
    for info in client.txn_list():
        if not info.xid:
            continue
        xid = parse_xid(info.xid)
        if xid.format_id == XID_FORMAT and (xid.global_id == prefix if batch_id is not None
                                            else xid.global_id.startswith(prefix)):
            out.append(xid)
    return out


def _roll_back(client: NodeClient, xids: Sequence[Xid]) -> None:
    for xid in xids:
        with contextlib.suppress(XAERNota):  # gone already: rolled back, or timed out
            client.xa_rollback(xid)


def commit_batch(opts: SinkOptions, messages: Sequence[SinkCommit | None], batch_id: int) -> None:
    """The driver's side of exactly_once: steps 2-5 of this module's protocol."""
    done = [m for m in messages if m is not None]
    if opts.guarantee == AT_LEAST_ONCE or not done:
        return
    sink_id = done[0].sink_id
    ours = [Xid(*x) for m in done for x in m.xids]
    with NodeClient(opts.endpoint, timeout_ms=opts.request_timeout_ms) as client:
        decided, topic_exists = _decision(client, sink_id)
        plan = plan_commit(sink_id, batch_id, decided, _live_branches(client, sink_id), ours)
        _roll_back(client, plan.roll_back)
        if plan.decide:
            if not topic_exists:
                with contextlib.suppress(TopicExists):
                    client.create_topic(SINKS_TOPIC, partitions=1)
            body = {"batch": batch_id, "xids": [list(x) for x in plan.commit]}
            client.produce(SINKS_TOPIC, _pack(body), key=sink_id, partition=0)
        elif decided is not None:
            log.warning("sink %s: batch %d was committed before; its replay wrote nothing",
                        sink_id, batch_id)
        for xid in plan.commit:
            client.xa_commit(xid)
        committed = set(plan.commit)
        _roll_back(client, [x for x in _live_branches(client, sink_id, batch_id)
                            if x not in committed])


def abort_batch(opts: SinkOptions, messages: Sequence[SinkCommit | None], batch_id: int) -> None:
    """Spark's abort: after a task failed, or after ``commit_batch`` raised (perhaps past
    its decision: then the replay's step 2 commits the branches, and this leaves them)."""
    done = [m for m in messages if m is not None]
    ours = [Xid(*x) for m in done for x in m.xids]
    if not ours:
        return
    with NodeClient(opts.endpoint, timeout_ms=opts.request_timeout_ms) as client:
        decided, _exists = _decision(client, done[0].sink_id)
        _roll_back(client, plan_abort(batch_id, decided, ours))


# ---- Spark's writer classes -------------------------------------------------------------


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("shardnode")``: created on the driver, run by each task."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        sink_id, batch_id, partition, attempt = _task_ids(self.opts.sink_id)
        if self.opts.guarantee == AT_LEAST_ONCE:
            return _write_plain(self.opts, iterator, sink_id, batch_id)
        return _write_staged(self.opts, iterator, sink_id, batch_id, partition, attempt)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(self.opts, messages, batchId)  # type: ignore[arg-type]

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_batch(self.opts, messages, batchId)  # type: ignore[arg-type]


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("shardnode")``: one batch under a sink id of its own."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.sink_id = f"write-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        _sink, _batch, partition, attempt = _task_ids(self.sink_id)
        if self.opts.guarantee == AT_LEAST_ONCE:
            return _write_plain(self.opts, iterator, self.sink_id, 0)
        return _write_staged(self.opts, iterator, self.sink_id, 0, partition, attempt)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            commit_batch(self.opts, messages, 0)  # type: ignore[arg-type]
        except NodeError as exc:
            xids = [str(Xid(*x)) for m in messages if isinstance(m, SinkCommit) for x in m.xids]
            raise RuntimeError(f"the write's commit failed ({exc}); if it was decided, its "
                               f"branches stay prepared until `shardnode txn commit`: "
                               f"{', '.join(xids)}") from exc

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batch(self.opts, messages, 0)  # type: ignore[arg-type]
