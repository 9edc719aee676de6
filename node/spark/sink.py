"""The ``shardnode`` sink: Spark's batches written into the node, exactly once.

**exactly_once** (the default) is two-phase commit, with the node, or each member of a
cluster, as a resource manager (XA, ``actors/transactions.py``) and the sink's driver as
the coordinator, whose log is a topic of the node. For micro-batch ``B`` of sink ``S``
(``sinkId``, by default the streaming query's id, which its checkpoint keeps):

1. **Tasks stage.** Each task writes its rows into XA branches of global id ``S/B``, one on
   each member owning partitions it writes (a transaction stays on one node), branch
   ``<Spark partition>/<attempt>/<nonce>/<member>/<n>`` (member 0: a single node); a new
   branch on a member every ``maxRecordsPerTransaction`` rows, ``maxBytesPerTransaction``
   bytes or half the transaction timeout: logged as they are sent, invisible, without
   offsets. It ends and prepares them (durable, in doubt: they survive any crash of their
   node and never time out), then reads S's decision (step 2): if batch ``B`` or a later
   one is decided, this attempt is a zombie, or a replay's, and no commit will take its
   branches, so it rolls them back itself. Otherwise it returns them, ``(member, xid)``, to
   the driver. A task that fails rolls its branches back; one that dies leaves them to the
   driver (step 3) or to their timeout (while not prepared).
2. **The driver reads S's decision**: the latest record keyed ``S`` in the topic
   ``shardnode.spark-sinks`` (one partition, read from and written to its owner):
   ``{"batch": B, "branches": [[member, format_id, global_id, branch_id], ...], "query":
   Q}`` (Q: the streaming query's id). If it is for ``B``, Spark is replaying a batch that
   was decided: the decision's branches still prepared are committed on their members (the
   driver died, or a commit failed, between steps 4 and 5), every other branch of ``S`` is
   rolled back, and nothing is written twice. A decision of another query (its checkpoint
   deleted, or two queries given one sinkId), or for a later batch, means the sink id is
   not this query's: refused (``SinkIdInUse``), as its batches would be skipped as replays.
3. **It rolls back S's other live branches** (``txn_list`` on every member: open or
   prepared): failed or zombie task attempts, batches never decided. None of them can
   become visible.
4. **It writes the decision** keyed ``S``: one record, durable when acknowledged. This is
   the commit point: from here the batch will commit, through step 2 if this commit does
   not finish (a member down, say).
5. **It commits each branch on its member** (XA's second phase): the rows become visible,
   with offsets. Then it rolls back any branch of ``S/B`` a zombie task prepared meanwhile,
   on every member. A zombie that prepares after this sweep reads the decision after its
   prepare (step 1), so it finds it and rolls back: either the sweep lists its branch or
   the zombie sees the decision, as the decision is acknowledged before the sweep lists.

``abort`` after a task failed rolls the batch's branches back, unless the batch was
decided: then they are left for the replay's step 2. After this commit raised it leaves
them whatever it reads: the decision may have been sent and not answered, and be logged
after the abort's rollbacks; the replay's step 2 commits them if it is there, its step 3
rolls them back if not. A batch write
(``df.write``) follows the same steps under a sink id of its own, batch 0; it is never
replayed, so a commit that fails after its decision leaves its branches prepared, named
in the error, for ``shardnode txn commit``.

The decisions (``plan_commit``, ``plan_abort``) are made without I/O and tested arrow by
arrow; ``commit_batch`` and ``abort_batch`` carry them out.

**at_least_once** sends plain produce requests, several in flight to each member, and
commits nothing: a task retried or a batch replayed writes its rows again. Within one task
attempt a request resent after a lost answer is not written twice (produce is idempotent
per client).

In a cluster each request names its partition and goes to the member owning it
(``rows.requests_of``), so nothing is forwarded between members; the node, or the
cluster's members, are reached through ``nodes.Nodes``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from node.client import Pipeline
from node.handshake import HandshakeFailed
from node.spark.nodes import SINGLE, Nodes
from node.spark.options import AT_LEAST_ONCE, SinkOptions
from node.spark.rows import Request, Routing, requests_of
from node.transaction import Transaction
from wire.errors import (
    ErrorCode,
    NodeError,
    RequestTimeout,
    TopicExists,
    Unavailable,
    XAERNota,
    error_for,
)
from wire.packer import pack
from wire.xid import Xid
from wire.xid import parse as parse_xid

log = logging.getLogger("shardnode.spark")

SINKS_TOPIC = "shardnode.spark-sinks"  # the sinks' decisions, one record per batch, keyed by sink
XID_FORMAT = 0x53504B  # "SPK": the format id of the sink's XA branches
BATCH_ID_KEY = "streaming.sql.batchId"  # local properties Spark gives a streaming query's tasks
QUERY_ID_KEY = "sql.streaming.queryId"
_RETRYABLE = (ErrorCode.BUSY, ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE)
ROLLBACK_TIMEOUT_MS = 5000  # how long a failed task waits to roll back each of its branches
RESENDS_MAX = 8  # at_least_once: times one request is sent again after BUSY or UNAVAILABLE
# ... and, counted apart, after a timeout (unanswered within ``requestTimeoutMs``, or
# answered TIMEOUT), which takes that long each: once (a front door that restarted lost
# it), then the task fails (a member that is down fails it in two timeouts, not in nine).
TIMEOUT_RESENDS_MAX = 1
RESEND_BACKOFF_S_MAX = 1.0
TURN_START_MAX = 1 << 30  # a task's first turn among a topic's partitions (keyless rows)


class SinkIdInUse(RuntimeError):
    """The sink id's last decision was another streaming query's (another checkpoint), or
    is for a later batch than this one: this query's batches would be skipped as replays."""


class Branch(NamedTuple):
    """An XA branch of the sink, and the member that has it (``SINGLE``: a single node)."""

    member: int
    xid: Xid

    def __str__(self) -> str:
        return str(self.xid) if self.member == SINGLE else f"{self.xid} on node {self.member}"


@dataclass
class SinkCommit(WriterCommitMessage):
    """What a task tells the driver: the branches it prepared (exactly_once), and its rows."""

    sink_id: str
    batch_id: int
    branches: list[Branch] = field(default_factory=list)
    rows: int = 0
    query: str = ""  # the streaming query's id (its checkpoint keeps it); "": df.write


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


def _query_id() -> str:
    """The running task's streaming query id ("" outside a streaming query)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return "" if ctx is None else ctx.getLocalProperty(QUERY_ID_KEY) or ""


def _pack(value: Any) -> bytes:
    return pack(value)


def _nodes(opts: SinkOptions) -> Nodes:
    return Nodes(opts.endpoints, opts.request_timeout_ms)


# ---- tasks ------------------------------------------------------------------------------


class _Requests:
    """The batches of one task as requests of the sink's size, each to one member."""

    def __init__(self, opts: SinkOptions, nodes: Nodes) -> None:
        self.opts = opts
        self.routing = (Routing(nodes.owners, random.randrange(TURN_START_MAX))
                        if nodes.cluster else None)

    def of(self, batch: pa.RecordBatch) -> Iterator[Request]:
        return requests_of(batch, self.opts.topic, self.opts.records_per_request_max,
                           self.opts.request_bytes_max, self.routing)


@dataclass(slots=True)
class _Open:
    """A task's open branch on one member."""

    tx: Transaction
    xid: Xid
    began: float  # time.monotonic()
    records: int = 0
    bytes: int = 0


class _Staging:
    """One task's XA branches, one open at a time on each member it writes to: a new one
    past ``records_per_txn_max`` records, ``txn_bytes_max`` bytes, or half the branch's
    timeout. Branch ``<Spark partition>/<attempt>/<nonce>/<member>/<n>``."""

    def __init__(self, nodes: Nodes, opts: SinkOptions, gtrid: bytes, partition: int,
                 attempt: int) -> None:
        self.nodes, self.opts, self.gtrid = nodes, opts, gtrid
        self.branch_prefix = f"{partition}/{attempt}/{secrets.token_hex(4)}/"
        self.done: list[Branch] = []  # ended and prepared
        self.open: dict[int, _Open] = {}  # by member
        self.begun: dict[int, int] = {}  # branches begun on each member

    def send(self, member: int, topic: str, partition: int | None, records: list[Any]) -> None:
        blob = _pack(records)
        b = self.open.get(member)
        if b is not None and (
                b.records + len(records) > self.opts.records_per_txn_max
                or b.bytes + len(blob) > self.opts.txn_bytes_max
                or time.monotonic() - b.began > self.opts.txn_timeout_ms / 2000):
            self._prepare(member)
            b = None
        if b is None:
            n = self.begun.get(member, 0)
            self.begun[member] = n + 1
            xid = Xid(XID_FORMAT, self.gtrid, f"{self.branch_prefix}{member}/{n}".encode())
            tx = self.nodes.member(member).xa_start(xid, timeout_ms=self.opts.txn_timeout_ms)
            tx.in_flight_max = self.opts.requests_in_flight_max
            b = self.open[member] = _Open(tx, xid, time.monotonic())
        b.tx.produce_packed(topic, blob, partition)
        b.records += len(records)
        b.bytes += len(blob)

    def prepare(self) -> None:
        """End and prepare every open branch: first all their writes answered, then each
        prepared."""
        for member, b in self.open.items():
            self.nodes.member(member).xa_end(b.xid)
        for member in list(self.open):
            self._prepare(member, ended=True)

    def _prepare(self, member: int, ended: bool = False) -> None:
        b = self.open[member]
        client = self.nodes.member(member)
        if not ended:
            client.xa_end(b.xid)  # its writes are all answered first
        client.xa_prepare(b.xid)
        self.done.append(Branch(member, b.xid))
        del self.open[member]

    def roll_back(self) -> None:
        """After a failure: nothing of this task may stay (best effort; the driver and the
        branches' timeout see to what this cannot reach). One try each, briefly: the
        failure may be a member's, and the task's error should not wait on it."""
        down: set[int] = set()
        for member, xid in [*self.done, *((m, b.xid) for m, b in self.open.items())]:
            if member in down:
                continue
            client = self.nodes.member(member)
            client.retries = 0
            client.timeout_ms = min(client.timeout_ms, ROLLBACK_TIMEOUT_MS)
            try:
                client.xa_rollback(xid)
            except NodeError as exc:
                log.warning("could not roll back %s on %s: %s", xid, self.nodes.name(member),
                            exc)
                if isinstance(exc, (RequestTimeout, Unavailable)):
                    down.add(member)


def _write_staged(opts: SinkOptions, batches: Iterator[pa.RecordBatch], sink_id: str,
                  batch_id: int, partition: int, attempt: int, query: str = "") -> SinkCommit:
    rows = 0
    with _nodes(opts) as nodes:
        requests = _Requests(opts, nodes)
        staging = _Staging(nodes, opts, global_id(sink_id, batch_id), partition, attempt)
        try:
            for batch in batches:
                for member, topic, part, records in requests.of(batch):
                    staging.send(member, topic, part, records)
                rows += batch.num_rows
            staging.prepare()
            decided, _exists, _by = _decision(nodes, sink_id)
            if decided is not None and decided[0] >= batch_id:
                # A zombie attempt, or a replay of a decided batch: no commit will take these
                # branches (the replay commits the decision's own). Rolled back here, as the
                # driver's last sweep may have run before they were prepared.
                log.info("sink %s: batch %d is decided (%d); task %d/%d rolls its branches "
                         "back", sink_id, batch_id, decided[0], partition, attempt)
                staging.roll_back()
                staging.done = []
        except BaseException:
            staging.roll_back()
            raise
    return SinkCommit(sink_id, batch_id, staging.done, rows, query)


class _Sent(NamedTuple):
    """An at-least-once request in flight, as it is sent again."""

    topic: str
    partition: int | None
    blob: bytes
    records: int
    seq: int
    resends: int = 0  # after BUSY or UNAVAILABLE
    timeouts: int = 0  # after a timeout (unanswered, or answered TIMEOUT)


class _Plain:
    """at_least_once: produce requests, up to ``requestsInFlight`` at a time to each
    member; one the member could not take is sent again under its sequence number (not
    written twice), at most ``RESENDS_MAX`` times, backing off, and one that timed out
    ``TIMEOUT_RESENDS_MAX`` times."""

    def __init__(self, nodes: Nodes, opts: SinkOptions) -> None:
        self.nodes, self.opts = nodes, opts
        self.pipes: dict[int, Pipeline] = {}
        self.sent: dict[int, dict[int, _Sent]] = {}  # by member, by request id

    def send(self, member: int, topic: str, partition: int | None, records: list[Any]) -> None:
        pipe = self.pipes.get(member)
        if pipe is None:
            pipe = self.pipes[member] = Pipeline(self.nodes.member(member),
                                                 self.opts.requests_in_flight_max)
            self.sent[member] = {}
        self._answered(member, self.opts.requests_in_flight_max - 1)
        blob, seq = _pack(records), pipe.client.next_seq()
        rid = pipe.submit(topic, [b""] * len(records), partition, blob=blob, seq=seq)
        self.sent[member][rid] = _Sent(topic, partition, blob, len(records), seq)

    def finish(self) -> None:
        for member in self.pipes:
            self._answered(member, 0)

    def _answered(self, member: int, limit: int) -> None:
        pipe, sent = self.pipes[member], self.sent[member]
        if len(sent) <= limit:
            return
        for other in self.pipes.values():  # what is queued for the others goes out first
            other.flush()
        while len(sent) > limit:
            # A request unanswered within the client's timeout (``request_timeout_ms`` too) is
            # answered RequestTimeout by the poll; a refused handshake raises HandshakeFailed.
            got = pipe.poll(self.opts.request_timeout_ms, offsets=False)
            if not got:
                raise error_for(ErrorCode.TIMEOUT, f"no answer from {self.nodes.name(member)} "
                                f"within {self.opts.request_timeout_ms} ms")
            for rid, result in got:
                s = sent.pop(rid)
                if not isinstance(result, NodeError):
                    continue
                if result.code not in _RETRYABLE or isinstance(result, HandshakeFailed):
                    raise result  # a refused handshake (a send that found no connection), too
                if result.code == ErrorCode.TIMEOUT:
                    if s.timeouts >= TIMEOUT_RESENDS_MAX:
                        raise result
                    s = s._replace(timeouts=s.timeouts + 1)
                else:
                    if s.resends >= RESENDS_MAX:
                        raise result
                    s = s._replace(resends=s.resends + 1)
                    # back off
                    time.sleep(min(RESEND_BACKOFF_S_MAX, 0.01 * 2 ** s.resends))
                again = pipe.submit(s.topic, [b""] * s.records, s.partition, blob=s.blob,
                                    seq=s.seq)
                sent[again] = s


def _write_plain(opts: SinkOptions, batches: Iterator[pa.RecordBatch], sink_id: str,
                 batch_id: int) -> SinkCommit:
    rows = 0
    with _nodes(opts) as nodes:
        requests = _Requests(opts, nodes)
        plain = _Plain(nodes, opts)
        for batch in batches:
            for member, topic, part, records in requests.of(batch):
                plain.send(member, topic, part, records)
            rows += batch.num_rows
        plain.finish()
    return SinkCommit(sink_id, batch_id, [], rows)


# ---- the driver: decisions without I/O --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """What the driver's commit does, in order: roll ``roll_back`` back, write the decision
    (if ``decide``), commit ``commit``, each branch on its member; then roll back what
    zombies prepared meanwhile."""

    roll_back: list[Branch]
    decide: bool
    commit: list[Branch]


Decision = tuple[int, list[Branch]]  # the batch decided, and its branches


def another_query(query: str, decided_by: str) -> bool:
    """The sink's decision was made by another streaming query than ``query`` (a decision
    that names none, written before they did, or a batch write's, is taken as any's)."""
    return bool(query and decided_by and decided_by != query)


def plan_commit(sink_id: str, batch_id: int, decided: Decision | None,
                live: Sequence[Branch], ours: Sequence[Branch], query: str = "",
                decided_by: str = "") -> Plan:
    """Steps 2-5 for batch ``batch_id``, given the sink's decision (and the streaming query
    that made it, ``decided_by``), its live branches on every member (open or prepared, any
    batch) and the branches the tasks of this attempt (of query ``query``) prepared."""
    if decided is not None and another_query(query, decided_by):
        # A replay is of the same query (its checkpoint keeps the id): another query's
        # batch 0 would be skipped as a replay of this one's.
        raise SinkIdInUse(
            f"sink id {sink_id!r} was last committed (batch {decided[0]}) by another "
            f"streaming query ({decided_by}; this one is {query}): a checkpoint deleted, or "
            f"two queries with one sinkId. Give this query a sinkId of its own (its batches "
            f"would otherwise be skipped as replays), or restart that query from its "
            f"checkpoint")
    if decided is not None and decided[0] > batch_id:
        raise SinkIdInUse(
            f"sink id {sink_id!r} has committed batch {decided[0]}, after this batch "
            f"{batch_id}: it belongs to another query's checkpoint. Give this query a "
            f"sinkId of its own (its batches would otherwise be skipped as replays)")
    if decided is not None and decided[0] == batch_id:  # a replay of a decided batch
        keep = set(decided[1])
        return Plan([b for b in live if b not in keep], False,
                    [b for b in live if b in keep])
    mine = set(ours)
    return Plan([b for b in live if b not in mine], bool(ours), list(ours))


def plan_abort(batch_id: int, decided: Decision | None, ours: Sequence[Branch],
               after_commit: bool = False, foreign: bool = False) -> list[Branch]:
    """The branches ``abort`` rolls back: this attempt's, but none once the batch is decided
    (the replay commits them), and none after a commit that raised (``after_commit``: every
    task succeeded), unless the sink's decision is another query's (``foreign``) or for a
    later batch (that commit raised ``SinkIdInUse`` before deciding). A commit that raised
    may have sent its decision, unanswered: it may still be logged, after an abort that
    rolled its branches back, and the replay would find a decision whose branches are
    gone. The replay settles them instead: step 2 commits them if it finds the decision,
    step 3 rolls them back if not."""
    if foreign or (decided is not None and decided[0] > batch_id):
        return list(ours)
    if (decided is not None and decided[0] == batch_id) or after_commit:
        return []
    return list(ours)


def decision_body(batch_id: int, branches: Sequence[Branch], query: str = "") -> dict[str, Any]:
    """The decision record's value (msgpack): the batch, and its branches with their
    members, ``[[member, format_id, global_id, branch_id], ...]``; and the streaming query
    that made it, when one did."""
    body: dict[str, Any] = {"batch": batch_id,
                            "branches": [[b.member, *b.xid] for b in branches]}
    if query:
        body["query"] = query
    return body


def decision_of(body: dict[str, Any]) -> Decision:
    """A decision record's value read back. One written before clusters has ``xids``
    (``[[format_id, global_id, branch_id], ...]``), the single node's."""
    if "branches" in body:
        branches = [Branch(int(m), Xid(f, g, q)) for m, f, g, q in body["branches"]]
    else:
        branches = [Branch(SINGLE, Xid(*x)) for x in body["xids"]]
    return int(body["batch"]), branches


# ---- the driver: carrying them out ------------------------------------------------------


def _decision(nodes: Nodes, sink_id: str) -> tuple[Decision | None, bool, str]:
    """The sink's latest decision (from the owner of the decisions' one partition), whether
    the decisions' topic exists, and the streaming query that made the decision ("" if
    none is said)."""
    try:
        rec = nodes.client.read_by_key(SINKS_TOPIC, sink_id, partition=0)
    except NodeError as exc:
        if exc.code != ErrorCode.UNKNOWN_TOPIC:
            raise
        return None, False, ""
    if rec is None:
        return None, True, ""
    body = msgpack.unpackb(rec.value, raw=False)
    return decision_of(body), True, str(body.get("query", ""))


def _live_branches(nodes: Nodes, sink_id: str, batch_id: int | None = None) -> list[Branch]:
    """The sink's open and prepared branches on every member (of one batch, or of any)."""
    prefix = global_id(sink_id, batch_id) if batch_id is not None else f"{sink_id}/".encode()
    out = []
    for member in sorted(nodes.members):
        for info in nodes.member(member).txn_list():
            if not info.xid:
                continue
            xid = parse_xid(info.xid)
            if xid.format_id == XID_FORMAT and (xid.global_id == prefix if batch_id is not None
                                                else xid.global_id.startswith(prefix)):
                out.append(Branch(member, xid))
    return out


def _roll_back(nodes: Nodes, branches: Sequence[Branch]) -> None:
    for b in branches:
        with contextlib.suppress(XAERNota):  # gone already: rolled back, or timed out
            nodes.member(b.member).xa_rollback(b.xid)


def _decide(nodes: Nodes, sink_id: str, batch_id: int, plan: Plan, topic_exists: bool,
            query: str) -> None:
    """Step 4, the commit point: the decision, one record on the owner of the decisions'
    partition, durable when answered."""
    if not topic_exists:
        with contextlib.suppress(TopicExists):
            nodes.client.create_topic(SINKS_TOPIC, partitions=1)
    nodes.client.produce(SINKS_TOPIC, _pack(decision_body(batch_id, plan.commit, query)),
                         key=sink_id, partition=0)


def commit_batch(opts: SinkOptions, messages: Sequence[SinkCommit | None], batch_id: int) -> None:
    """The driver's side of exactly_once: steps 2-5 of this module's protocol."""
    done = [m for m in messages if m is not None]
    if opts.guarantee == AT_LEAST_ONCE or not done:
        return
    sink_id, query = done[0].sink_id, done[0].query
    ours = [b for m in done for b in m.branches]
    with _nodes(opts) as nodes:
        decided, topic_exists, decided_by = _decision(nodes, sink_id)
        plan = plan_commit(sink_id, batch_id, decided, _live_branches(nodes, sink_id), ours,
                           query, decided_by)
        _roll_back(nodes, plan.roll_back)
        if plan.decide:
            _decide(nodes, sink_id, batch_id, plan, topic_exists, query)
        elif decided is not None:
            log.warning("sink %s: batch %d was committed before; its replay wrote nothing",
                        sink_id, batch_id)
        for b in plan.commit:
            nodes.member(b.member).xa_commit(b.xid)
        committed = set(plan.commit)
        _roll_back(nodes, [b for b in _live_branches(nodes, sink_id, batch_id)
                           if b not in committed])


def abort_batch(opts: SinkOptions, messages: Sequence[SinkCommit | None], batch_id: int) -> None:
    """Spark's abort: after a task failed, or after ``commit_batch`` raised (perhaps past
    its decision: then the replay's step 2 commits the branches, and this leaves them).
    Without the decision (its owner down) it leaves everything; a member it cannot reach
    keeps the branches, for the next batch's step 3."""
    done = [m for m in messages if m is not None]
    ours = [b for m in done for b in m.branches]
    if not ours:
        return
    # Every task succeeded: Spark aborts because the commit raised (its decision perhaps
    # sent, unanswered); a task that failed has no message.
    after_commit = len(done) == len(messages)
    query = done[0].query
    with _nodes(opts) as nodes:
        decided, _exists, decided_by = _decision(nodes, done[0].sink_id)
        foreign = decided is not None and another_query(query, decided_by)
        down: set[int] = set()
        plan = plan_abort(batch_id, decided, ours, after_commit, foreign)
        if after_commit and not plan:
            log.warning("batch %d aborted after its commit raised: its %d branches stay "
                        "prepared for the replay (which commits them if the decision was "
                        "written, else rolls them back)", batch_id, len(ours))
        for b in plan:
            if b.member in down:
                continue
            try:
                with contextlib.suppress(XAERNota):
                    nodes.member(b.member).xa_rollback(b.xid)
            except (RequestTimeout, Unavailable) as exc:
                log.warning("could not roll back %s: %s", b, exc)
                down.add(b.member)


# ---- Spark's writer classes -------------------------------------------------------------


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("shardnode")``: created on the driver, run by each task."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        sink_id, batch_id, partition, attempt = _task_ids(self.opts.sink_id)
        if self.opts.guarantee == AT_LEAST_ONCE:
            return _write_plain(self.opts, iterator, sink_id, batch_id)
        return _write_staged(self.opts, iterator, sink_id, batch_id, partition, attempt,
                             _query_id())

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
            branches = [str(b) for m in messages if isinstance(m, SinkCommit)
                        for b in m.branches]
            raise RuntimeError(f"the write's commit failed ({exc}); if it was decided, its "
                               f"branches stay prepared until `shardnode txn commit` (on each "
                               f"one's node): {', '.join(branches)}") from exc

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batch(self.opts, messages, 0)  # type: ignore[arg-type]
