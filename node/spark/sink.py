"""The ``shardnode`` sink: Spark's batches written into the node, exactly once.

**exactly_once** (the default) is two-phase commit, with the node as the resource manager
(XA, ``actors/transactions.py``) and the sink's driver as the coordinator, whose log is a
topic of the node. For micro-batch ``B`` of sink ``S`` (``sinkId``, by default the
streaming query's id, which its checkpoint keeps):

1. **Tasks stage.** Each task writes its rows into XA branches of global id ``S/B``
   (branch ``<Spark partition>/<attempt>/<nonce>``; a new branch every
   ``maxRecordsPerTransaction`` rows): logged as they are sent, invisible, without offsets.
   It ends and prepares them (durable, in doubt: they survive any crash of the node and
   never time out) and returns their xids to the driver. A task that fails rolls its branches
   back; one that dies leaves them to the driver (step 3) or to their timeout
   (``transactionTimeoutMs``, while not prepared).
2. **The driver reads S's decision**: the latest record keyed ``S`` in the topic
   ``shardnode.spark-sinks`` (``{"batch": B, "xids": [...]}``). If it is for ``B`` or later,
   ``B`` was committed before and Spark is replaying it: the decision's branches still
   prepared are committed (a crash between steps 4 and 5), this attempt's are rolled back,
   and nothing is written twice.
3. **It rolls back S's other live branches**: failed or zombie task attempts, batches
   never decided. None of them can become visible.
4. **It writes the decision** ``{"batch": B, "xids": [...]}`` keyed ``S``: one record,
   durable when acknowledged. This is the commit point: from here the batch will commit,
   through step 2 if the driver dies before step 5.
5. **It commits each branch** (XA's second phase): the rows become visible, with offsets.

``abort`` rolls the batch's branches back. A batch write (``df.write``) follows the same
steps under a sink id of its own, batch 0.

**at_least_once** sends plain produce requests, several in flight, and commits nothing: a
task retried or a batch replayed writes its rows again. Within one task attempt a request
resent after a lost answer is not written twice (produce is idempotent per client).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import uuid
from collections.abc import Iterator
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
from node.spark.rows import chunks, records_of
from node.transaction import Transaction
from wire.errors import ErrorCode, NodeError, TopicExists, XAERNota, XAERProto, error_for
from wire.xid import Xid
from wire.xid import parse as parse_xid

log = logging.getLogger("shardnode.spark")

SINKS_TOPIC = "shardnode.spark-sinks"  # the sinks' decisions, one record per batch, keyed by sink
XID_FORMAT = 0x53504B  # "SPK": the format id of the sink's XA branches
BATCH_ID_KEY = "streaming.sql.batchId"  # local properties Spark gives a streaming query's tasks
QUERY_ID_KEY = "sql.streaming.queryId"
_RETRYABLE = (ErrorCode.BUSY, ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE)
ROLLBACK_TIMEOUT_MS = 5000  # how long a failed task waits to roll back each of its branches


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


# ---- tasks ------------------------------------------------------------------------------


class _Staging:
    """One task's XA branches: a new one every ``records_per_txn_max`` records."""

    def __init__(self, client: NodeClient, opts: SinkOptions, gtrid: bytes, partition: int,
                 attempt: int) -> None:
        self.client, self.opts, self.gtrid = client, opts, gtrid
        self.branch_prefix = f"{partition}/{attempt}/{secrets.token_hex(4)}/"
        self.done: list[Xid] = []  # ended and prepared
        self.tx: Transaction | None = None
        self.xid: Xid | None = None
        self.records = 0  # in the open branch

    def send(self, topic: str, partition: int | None, records: list[Any]) -> None:
        room = self.opts.records_per_txn_max - self.records
        if self.tx is not None and len(records) > room:
            self.send(topic, partition, records[:room])
            self.send(topic, partition, records[room:])
            return
        if self.tx is None:
            self.xid = Xid(XID_FORMAT, self.gtrid,
                           f"{self.branch_prefix}{len(self.done)}".encode())
            self.tx = self.client.xa_start(self.xid, timeout_ms=self.opts.txn_timeout_ms)
            self.tx.in_flight_max = self.opts.requests_in_flight_max
        self.tx.produce_packed(topic, _pack(records), partition)
        self.records += len(records)
        if self.records >= self.opts.records_per_txn_max:
            self.prepare()

    def prepare(self) -> None:
        if self.xid is None:
            return
        self.client.xa_end(self.xid)  # its writes are all answered first
        self.client.xa_prepare(self.xid)
        self.done.append(self.xid)
        self.tx, self.xid, self.records = None, None, 0

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


def _pack(records: list[Any]) -> bytes:
    return bytes(msgpack.packb(records, use_bin_type=True))


def _write_staged(opts: SinkOptions, batches: Iterator[pa.RecordBatch], sink_id: str,
                  batch_id: int, partition: int, attempt: int) -> SinkCommit:
    client = NodeClient(opts.endpoint, timeout_ms=opts.request_timeout_ms)
    staging = _Staging(client, opts, global_id(sink_id, batch_id), partition, attempt)
    rows = 0
    try:
        for batch in batches:
            for topic, part, records in records_of(batch):
                for chunk in chunks(records, opts.records_per_request_max):
                    staging.send(topic or opts.topic or "", part, chunk)
            rows += batch.num_rows
        staging.prepare()
    except BaseException:
        staging.roll_back()
        client.close()
        raise
    client.close()
    return SinkCommit(sink_id, batch_id, [tuple(x) for x in staging.done], rows)  # type: ignore[misc]


def _write_plain(opts: SinkOptions, batches: Iterator[pa.RecordBatch], sink_id: str,
                 batch_id: int) -> SinkCommit:
    """at_least_once: produce requests, up to ``requestsInFlight`` at a time; one the node
    could not take is sent again under its sequence number (not written twice)."""
    with NodeClient(opts.endpoint, timeout_ms=opts.request_timeout_ms) as client:
        pipe = Pipeline(client, opts.requests_in_flight_max)
        sent: dict[int, tuple[str, int | None, bytes, int, int]] = {}
        rows = 0

        def answered(limit: int) -> None:
            while len(sent) > limit:
                got = pipe.poll(opts.request_timeout_ms, offsets=False)
                if not got:
                    raise error_for(ErrorCode.TIMEOUT, f"no answer from {opts.endpoint} within "
                                    f"{opts.request_timeout_ms} ms")
                for rid, result in got:
                    topic, part, blob, count, seq = sent.pop(rid)
                    if isinstance(result, NodeError):
                        if result.code not in _RETRYABLE:
                            raise result
                        again = pipe.submit(topic, [b""] * count, part, blob=blob, seq=seq)
                        sent[again] = (topic, part, blob, count, seq)

        for batch in batches:
            for topic, part, records in records_of(batch):
                for chunk in chunks(records, opts.records_per_request_max):
                    answered(opts.requests_in_flight_max - 1)
                    name, blob, seq = topic or opts.topic or "", _pack(chunk), client.next_seq()
                    rid = pipe.submit(name, [b""] * len(chunk), part, blob=blob, seq=seq)
                    sent[rid] = (name, part, blob, len(chunk), seq)
            rows += batch.num_rows
        answered(0)
    return SinkCommit(sink_id, batch_id, [], rows)


# ---- the driver -------------------------------------------------------------------------


def _decision(client: NodeClient, sink_id: str) -> tuple[int, list[Xid]] | None:
    try:
        rec = client.read_by_key(SINKS_TOPIC, sink_id, partition=0)
    except NodeError as exc:
        if exc.code != ErrorCode.UNKNOWN_TOPIC:
            raise
        return None
    if rec is None:
        return None
    body = msgpack.unpackb(rec.value, raw=False)
    return int(body["batch"]), [Xid(*x) for x in body["xids"]]


def _live_branches(client: NodeClient, sink_id: str) -> list[Xid]:
    """The sink's open and prepared branches on the node, of any batch."""
    prefix = f"{sink_id}/".encode()
    out = []
    for info in client.txn_list():
        if not info.xid:
            continue
        xid = parse_xid(info.xid)
        if xid.format_id == XID_FORMAT and xid.global_id.startswith(prefix):
            out.append(xid)
    return out


def _roll_back(client: NodeClient, xids: list[Xid]) -> None:
    for xid in xids:
        # Gone already (rolled back, timed out): nothing to do.
        with contextlib.suppress(XAERNota, XAERProto):
            client.xa_rollback(xid)


def commit_batch(opts: SinkOptions, messages: list[SinkCommit | None], batch_id: int) -> None:
    """The driver's side of exactly_once: steps 2-5 of this module's protocol."""
    done = [m for m in messages if m is not None]
    if opts.guarantee == AT_LEAST_ONCE or not done:
        return
    sink_id = done[0].sink_id
    ours = [Xid(*x) for m in done for x in m.xids]
    with NodeClient(opts.endpoint, timeout_ms=opts.request_timeout_ms) as client:
        decided = _decision(client, sink_id)
        live = _live_branches(client, sink_id)
        if decided is not None and decided[0] >= batch_id:
            # A replay of a batch already committed: finish the decision, drop the rest.
            last, chosen = decided
            keep = set(chosen) if last == batch_id else set()
            for xid in live:
                if xid in keep:
                    client.xa_commit(xid)
            _roll_back(client, [x for x in live if x not in keep])
            log.warning("sink %s: batch %d was committed before (decision for batch %d); "
                        "its replay wrote nothing", sink_id, batch_id, last)
            return
        mine = set(ours)
        _roll_back(client, [x for x in live if x not in mine])
        if not ours:
            return
        with contextlib.suppress(TopicExists):
            client.create_topic(SINKS_TOPIC, partitions=1)
        body = {"batch": batch_id, "xids": [list(x) for x in ours]}
        client.produce(SINKS_TOPIC, _pack_map(body), key=sink_id, partition=0)
        for xid in ours:
            client.xa_commit(xid)


def abort_batch(opts: SinkOptions, messages: list[SinkCommit | None]) -> None:
    xids = [Xid(*x) for m in messages if m is not None for x in m.xids]
    if xids:
        with NodeClient(opts.endpoint, timeout_ms=opts.request_timeout_ms) as client:
            _roll_back(client, xids)


def _pack_map(body: dict[str, Any]) -> bytes:
    return bytes(msgpack.packb(body, use_bin_type=True))


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
        abort_batch(self.opts, messages)  # type: ignore[arg-type]


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
        commit_batch(self.opts, messages, 0)  # type: ignore[arg-type]

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batch(self.opts, messages)  # type: ignore[arg-type]
