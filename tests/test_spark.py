"""The Spark data source ``shardnode`` end to end: a real SparkSession (local, one for the
module), real node processes on ``tmp_path``, and drivers in processes of their own where a
test SIGKILLs them (tests/spark_driver.py).

The exactly-once tests count every row in the node: each would fail on a duplicate or a
loss (``assert_exactly``), and on a branch left staged (``assert_no_branches``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import pytest
import zmq
from pyspark import TaskContext, cloudpickle
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict, WriterCommitMessage
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from actors.roles import key_partition
from node.client import NodeClient
from node.crashcheck import read_partition
from node.local import LocalCluster, LocalNode, free_port
from node.spark import ShardnodeDataSource, register, sink
from node.spark.nodes import SINGLE, START_RETRIES, START_TIMEOUT_MS_MAX
from node.spark.options import (
    SINK_OPTIONS,
    SOURCE_OPTIONS,
    OptionError,
    SinkOptions,
    SourceOptions,
)
from node.spark.rows import Routing, batch_of, check_schema, requests_of
from node.spark.sink import (
    SINKS_TOPIC,
    XID_FORMAT,
    BatchWriter,
    Branch,
    Plan,
    SinkCommit,
    SinkIdInUse,
    StreamWriter,
    _Plain,
    decision_body,
    decision_of,
    plan_abort,
    plan_commit,
)
from node.spark.source import DataLost, Split, StreamReader, bounded, read_split, splits
from tests.conftest import request_of, silent_router
from tests.spark_driver import sink_query, source_query
from wire.errors import (
    BadRequest,
    ErrorCode,
    NodeError,
    OffsetOutOfRange,
    RequestTimeout,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
)
from wire.records import TIMESTAMP_MAX, Record
from wire.xid import Xid

if TYPE_CHECKING:
    from tests.conftest import MakeNode

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 120  # the longest any test waits for Spark or a node
SCHEMA = "key string, value string"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # local[2,4]: two task threads, and a failed task is tried up to 4 times (plain local
    # mode never retries one).
    session = (SparkSession.builder.master("local[2,4]").appName("shardnode-tests")
               .config("spark.ui.enabled", "false")
               # The JIT's quick tier only: its optimising compiler's threads took the CPU
               # of short runs on two cores (scripts/demo.py measured it).
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
               .config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]  # FailingSink
    session.dataSource.register(FailingSink)
    yield session
    session.stop()


# ---- helpers --------------------------------------------------------------------------


def write_inputs(spark: SparkSession, folder: Path, files: int, rows_per_file: int) -> int:
    """``files`` Parquet files of ``rows_per_file`` rows each (key k<n>, value v<n>), one
    micro-batch each for a stream with ``maxFilesPerTrigger`` 1; returns the rows."""
    for f in range(files):
        first = f * rows_per_file
        (spark.range(first, first + rows_per_file, numPartitions=1)
         .selectExpr("concat('k', id) as key", "concat('v', id) as value")
         .write.mode("append").parquet(str(folder)))
    return files * rows_per_file


def stream_inputs(spark: SparkSession, folder: Path) -> DataFrame:
    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
            .parquet(str(folder)).repartition(2))


def values_in(client: NodeClient, topic: str) -> list[bytes]:
    """Every record's value in the topic, partition by partition, in offset order (offsets
    contiguous), up to each partition's end offset."""
    out: list[bytes] = []
    for p, end in enumerate(client.end_offsets(topic)):
        values = read_partition(client, topic, p)
        assert len(values) == end, f"{topic}/{p}: {len(values)} records read, end offset {end}"
        out += values
    return out


def assert_exactly(client: NodeClient, topic: str, rows: int) -> None:
    counts = collections.Counter(values_in(client, topic))
    twice = [v for v, n in counts.items() if n > 1]
    missing = [i for i in range(rows) if f"v{i}".encode() not in counts]
    assert not twice, f"{len(twice)} rows written more than once, e.g. {twice[:5]}"
    assert not missing, f"{len(missing)} rows missing, e.g. {missing[:5]}"
    assert sum(counts.values()) == rows


def assert_no_branches(client: NodeClient) -> None:
    """No transaction left open or prepared: nothing staged stays behind."""
    assert client.txn_list() == []


def poll(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)  # ok-sleep: polling interval


def total(client: NodeClient, topic: str) -> int:
    return sum(client.end_offsets(topic))


def endpoint(target: LocalNode | LocalCluster) -> str:
    """The option ``endpoint`` of a node, or of every member of a cluster."""
    return target.endpoint if isinstance(target, LocalNode) else ",".join(target.endpoints)


def sink_stream(df: DataFrame, target: LocalNode | LocalCluster, topic: str, ckpt: Path,
                fmt: str = "shardnode", **options: str) -> StreamingQuery:
    w = (df.writeStream.format(fmt).option("endpoint", endpoint(target)).option("topic", topic)
         .option("checkpointLocation", str(ckpt)))
    for k, v in options.items():
        w = w.option(k, v)
    return w.trigger(availableNow=True).start()


def finish(q: StreamingQuery) -> None:
    assert q.awaitTermination(WAIT_S), "the query did not finish in time"
    assert q.exception() is None, q.exception()


def child(*args: str) -> subprocess.Popen[bytes]:
    """A driver process of its own (tests/spark_driver.py), in a new session: SIGKILL of
    its group takes its JVM and Python workers too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "spark_driver.py"), *args],
                            cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


# ---- the sink -------------------------------------------------------------------------


def test_a_stream_is_written_once_and_the_decision_is_recorded(spark: SparkSession,
                                                                node: LocalNode,
                                                                tmp_path: Path) -> None:
    rows = write_inputs(spark, tmp_path / "in", files=3, rows_per_file=700)
    with node.client() as c:
        c.create_topic("events", partitions=3)
        q = sink_stream(stream_inputs(spark, tmp_path / "in"), node, "events", tmp_path / "ck")
        finish(q)
        assert_exactly(c, "events", rows)
        assert_no_branches(c)
        decision = c.read_by_key(SINKS_TOPIC, str(q.id), partition=0)
        assert decision is not None
        body = msgpack.unpackb(decision.value, raw=False)
        assert body["batch"] == 2 and body["branches"], body
        assert {b[0] for b in body["branches"]} == {SINGLE}, "a single node's branches"


def test_a_replayed_batch_writes_nothing_twice(spark: SparkSession, node: LocalNode,
                                              tmp_path: Path) -> None:
    """Stop after the batches, delete the newest file of the checkpoint's commits/, restart:
    Spark runs that batch again, and the sink skips it."""
    rows = write_inputs(spark, tmp_path / "in", files=3, rows_per_file=500)
    ckpt = tmp_path / "ck"
    with node.client() as c:
        c.create_topic("events", partitions=2)
        finish(sink_stream(stream_inputs(spark, tmp_path / "in"), node, "events", ckpt))
        assert_exactly(c, "events", rows)
        newest = max((ckpt / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
        assert newest.name == "2"
        newest.unlink()
        (newest.parent / f".{newest.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum
        q = sink_stream(stream_inputs(spark, tmp_path / "in"), node, "events", ckpt)
        finish(q)
        assert (ckpt / "commits" / "2").exists(), "the batch ran again"
        assert_exactly(c, "events", rows)
        assert_no_branches(c)


def test_a_sink_id_reused_after_its_checkpoint_was_deleted_is_refused(
        spark: SparkSession, node: LocalNode, tmp_path: Path) -> None:
    """A query with sinkId "etl" commits; its checkpoint is deleted and it starts again:
    a new query id, batch ids from 0. Its batch 0 was taken for a replay of the first
    run's batch 0, and its rows were dropped, silently. Now the query fails, naming the
    cause, and nothing of its batch is left staged."""
    rows = write_inputs(spark, tmp_path / "in", files=1, rows_per_file=100)
    ckpt = tmp_path / "ck"
    with node.client() as c:
        c.create_topic("reused", partitions=2)
        finish(sink_stream(stream_inputs(spark, tmp_path / "in"), node, "reused", ckpt,
                           sinkId="etl"))
        assert_exactly(c, "reused", rows)
        shutil.rmtree(ckpt)
        q = sink_stream(stream_inputs(spark, tmp_path / "in"), node, "reused", ckpt,
                        sinkId="etl")
        try:
            with pytest.raises(PySparkException, match="by another streaming query"):
                q.awaitTermination(WAIT_S)  # raises the query's failure (False: running)
        finally:
            q.stop()
        assert_exactly(c, "reused", rows)
        assert_no_branches(c)


class FailingWriter(StreamWriter):
    """The sink, but the first attempt of Spark partition 0 in batch 1 fails: ``mode``
    ``mid_write`` after its first rows are staged, ``after_prepare`` after it prepared."""

    def __init__(self, inner: StreamWriter, mode: str) -> None:
        super().__init__(inner.opts)
        self.mode = mode

    def write(self, iterator: Iterator[Any]) -> Any:
        ctx = TaskContext.get()
        assert ctx is not None
        doomed = (ctx.attemptNumber() == 0 and ctx.partitionId() == 0
                  and ctx.getLocalProperty("streaming.sql.batchId") == "1")
        if doomed and self.mode == "mid_write":
            def failing() -> Iterator[Any]:
                for i, batch in enumerate(iterator):
                    if i == 1:
                        raise RuntimeError("injected: task fails after staging rows")
                    yield batch
            return super().write(failing())
        message = super().write(iterator)
        if doomed:
            assert message.branches, "the doomed attempt prepared its branch"
            raise RuntimeError("injected: task fails after preparing")
        return message


class FailingSink(ShardnodeDataSource):
    """The sink with an option of the test's, ``failMode``, which the sink itself would
    refuse: it is taken out before the sink sees the options."""

    @classmethod
    def name(cls) -> str:
        return "shardnode_failing"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        sinks = {k: v for k, v in self.options.items() if k.lower() != "failmode"}
        return FailingWriter(ShardnodeDataSource(sinks).streamWriter(schema, overwrite),  # type: ignore[arg-type]
                             self.options["failMode"])


@pytest.mark.parametrize("mode", ["mid_write", "after_prepare"])
def test_a_task_that_fails_once_leaves_no_duplicate_and_nothing_staged(
        spark: SparkSession, node: LocalNode, tmp_path: Path, mode: str) -> None:
    rows = write_inputs(spark, tmp_path / "in", files=3, rows_per_file=2000)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "200")  # several per task
    try:
        with node.client() as c:
            c.create_topic("events", partitions=2)
            finish(sink_stream(stream_inputs(spark, tmp_path / "in"), node, "events",
                               tmp_path / "ck", fmt="shardnode_failing", failMode=mode,
                               maxRecordsPerRequest="100"))
            assert_exactly(c, "events", rows)
            assert_no_branches(c)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


@pytest.mark.timeout(600)  # a Spark driver of its own starts
def test_sigkill_of_the_driver_mid_stream_then_restart_writes_every_row_once(
        spark: SparkSession, node: LocalNode, tmp_path: Path) -> None:
    """The driver of its own is SIGKILLed mid-stream; the same query, restarted from its
    checkpoint in this module's session (one JVM fewer to start), finishes the stream."""
    rows = write_inputs(spark, tmp_path / "in", files=4, rows_per_file=1500)
    args = (node.endpoint, "events", str(tmp_path / "in"), str(tmp_path / "ck"))
    with node.client() as c:
        c.create_topic("events", partitions=2)
        proc = child("sink", *args)
        try:
            poll(lambda: total(c, "events") > 0, "the first rows in the node")
        finally:
            kill_group(proc)
        written = total(c, "events")
        assert 0 < written < rows, f"killed mid-stream: {written} of {rows} rows written"
        finish(sink_query(spark, *args))
        assert_exactly(c, "events", rows)
        assert_no_branches(c)


@pytest.mark.timeout(600)
def test_sigkill_of_the_node_mid_batch_then_restart_of_the_query_writes_every_row_once(
        spark: SparkSession, make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node()
    rows = write_inputs(spark, tmp_path / "in", files=10, rows_per_file=3000)
    ckpt = tmp_path / "ck"
    with node.client() as c:
        c.create_topic("events", partitions=2)
    q = sink_stream(stream_inputs(spark, tmp_path / "in"), node, "events", ckpt,
                    requestTimeoutMs="2000")
    with node.client(timeout_ms=2000) as c:
        poll(lambda: total(c, "events") > 0, "the first rows in the node")
    node.kill()
    node.start()
    # The batch in flight fails (its branches were rolled back at the restart, or its
    # requests timed out), or Spark's retry of the task carries it through: either way
    # the query is run again from its checkpoint until every file is written.
    assert q.awaitTermination(WAIT_S), "the query neither failed nor finished"
    for _attempt in range(3):
        q = sink_stream(stream_inputs(spark, tmp_path / "in"), node, "events", ckpt)
        assert q.awaitTermination(WAIT_S)
        if q.exception() is None:
            break
    assert q.exception() is None, q.exception()
    with node.client() as c:
        assert_exactly(c, "events", rows)
        assert_no_branches(c)


def test_rows_are_invisible_until_the_batch_commits(spark: SparkSession, node: LocalNode) -> None:
    """Tasks stage: their rows take no offsets until the driver's commit."""
    with node.client() as c:
        writer = _direct_writer(c, node, "direct")
        messages = _stage(spark, writer, 300)
        assert [b.xid.format_id for m in messages for b in m.branches] == [XID_FORMAT] * 2
        assert len(c.xa_recover()) == 2, "prepared, in doubt until the driver decides"
        assert total(c, "events") == 0
        writer.commit(list[WriterCommitMessage | None](messages), 0)
        assert total(c, "events") == 300
        assert_no_branches(c)


def _direct_writer(c: NodeClient, node: LocalNode, sink_id: str) -> StreamWriter:
    """The sink's writer of the topic ``events`` (made here), driven by the test."""
    c.create_topic("events", partitions=1)
    return StreamWriter(SinkOptions.parse({"endpoint": node.endpoint, "topic": "events",
                                           "sinkId": sink_id}))


def _stage(spark: SparkSession, writer: StreamWriter, rows: int) -> list[SinkCommit]:
    """The tasks' side of a batch, run by Spark tasks (the driver's side is the test's):
    rows ``v<n>`` keyed ``k<n>``."""
    df = spark.range(0, rows, numPartitions=2).selectExpr("concat('v', id) as value",
                                                          "concat('k', id) as key")
    return df.rdd.mapPartitions(lambda it: [writer.write(_arrow_batches(it))]).collect()


def test_a_commit_that_fails_after_its_decision_is_finished_by_the_replay(
        spark: SparkSession, node: LocalNode) -> None:
    """The decision is written and one branch committed, then the commit fails: Spark's
    abort leaves the rest prepared, and the replay of the batch commits them."""
    with node.client() as c:
        writer = _direct_writer(c, node, "halfway")
        first = _stage(spark, writer, 300)
        branches = [b for m in first for b in m.branches]
        assert len(branches) == 2
        c.create_topic(SINKS_TOPIC, partitions=1)
        c.produce(SINKS_TOPIC, msgpack.packb(decision_body(4, branches)), key="halfway",
                  partition=0)  # step 4, as commit_batch writes it
        c.xa_commit(branches[0].xid)  # step 5, cut short
        writer.abort(list[WriterCommitMessage | None](first), 4)
        assert c.xa_recover() == [branches[1].xid], "abort left the decided branch prepared"
        replay = _stage(spark, writer, 300)
        writer.commit(list[WriterCommitMessage | None](replay), 4)
        assert_exactly(c, "events", 300)
        assert_no_branches(c)
        with pytest.raises(SinkIdInUse, match="belongs to another query"):
            writer.commit(list[WriterCommitMessage | None](_stage(spark, writer, 10)), 3)


def test_a_task_attempt_that_prepares_after_its_batch_committed_rolls_itself_back(
        spark: SparkSession, node: LocalNode) -> None:
    """A zombie attempt: batch 0 is committed, swept and done, then another attempt of its
    tasks stages and prepares. No later commit of the sink may come (the query stopped), so
    the attempt must roll its branches back itself: none is left prepared."""
    with node.client() as c:
        writer = _direct_writer(c, node, "zombie")
        writer.commit(list[WriterCommitMessage | None](_stage(spark, writer, 200)), 0)
        assert_exactly(c, "events", 200)
        assert_no_branches(c)
        late = _stage(spark, writer, 200)
        assert [m.branches for m in late] == [[], []]
        assert_no_branches(c)
        assert_exactly(c, "events", 200)


X1, X2, X3, X4 = (Branch(SINGLE, Xid(XID_FORMAT, b"s/1", str(i).encode())) for i in range(4))
OLD = Branch(SINGLE, Xid(XID_FORMAT, b"s/0", b"z"))
# A cluster's: the same batch's branches on members 1 and 2.
A1, A2, B1, B2 = (Branch(m, Xid(XID_FORMAT, b"s/1", f"{t}/0/x/{m}/0".encode()))
                  for t, m in ((0, 1), (0, 2), (1, 1), (1, 2)))


@pytest.mark.parametrize("decided, live, ours, plan", [
    # A new batch: roll back what the tasks' messages do not name (a zombie, an old batch's
    # leftover), decide, commit the messages' branches.
    (None, [X1, X2, X3, OLD], [X1, X2], Plan([X3, OLD], True, [X1, X2])),
    ((0, [OLD]), [X1], [X1], Plan([], True, [X1])),
    # A replay of a decided batch: commit what is left of the decision, roll back the rest
    # (the replay's own branches among them), write nothing again.
    ((1, [X1, X2]), [X2, X3, X4], [X3, X4], Plan([X3, X4], False, [X2])),
    ((1, [X1, X2]), [X3], [X3], Plan([X3], False, [])),
    # Nothing staged (no rows): nothing to decide.
    (None, [X3], [], Plan([X3], False, [])),
    # A cluster: branches on each member, committed each on its member; a stray on either
    # rolled back there.
    (None, [A1, A2, B1, B2, OLD], [A1, A2, B2], Plan([B1, OLD], True, [A1, A2, B2])),
    # A replay after member 2 was down at the commit: member 1's branch was committed, member
    # 2's is still prepared, and the replay's own branches are rolled back on both.
    ((1, [A1, A2]), [A2, B1, B2], [B1, B2], Plan([B1, B2], False, [A2])),
    # A branch is its member's: the same xid on another member is not the decision's.
    ((1, [A1]), [Branch(2, A1.xid)], [], Plan([Branch(2, A1.xid)], False, [])),
])
def test_plan_commit_for_each_arrow_of_the_protocol(decided: Any, live: list[Branch],
                                                    ours: list[Branch], plan: Plan) -> None:
    assert plan_commit("s", 1, decided, live, ours) == plan


def test_plan_commit_refuses_a_sink_id_with_a_later_decision() -> None:
    with pytest.raises(SinkIdInUse, match="committed batch 7, after this batch 1"):
        plan_commit("s", 1, (7, []), [X1], [X1])


def test_plan_commit_refuses_a_sink_id_another_query_decided_whatever_its_batch() -> None:
    """A query started again with its checkpoint deleted (a new query id) under the same
    sinkId: its batch 0 was taken for a replay of the old batch 0, and silently skipped."""
    for batch in (0, 1, 5):
        with pytest.raises(SinkIdInUse, match="by another streaming query"):
            plan_commit("s", batch, (1, [X1]), [X2], [X2], query="q-new", decided_by="q-old")
    # The same query (a restart from its checkpoint) replays; a decision that names no
    # query (written before they did) is checked by its batch only.
    assert plan_commit("s", 1, (1, [X1]), [X1], [], "q", "q") == Plan([], False, [X1])
    assert plan_commit("s", 1, (1, [X1]), [X1], [], "q", "") == Plan([], False, [X1])


def test_plan_abort_leaves_a_decided_batch_to_its_replay() -> None:
    assert plan_abort(1, None, [X1, X2]) == [X1, X2]
    assert plan_abort(1, (0, [OLD]), [X1]) == [X1]
    assert plan_abort(1, (1, [X1]), [X1, X2]) == []
    assert plan_abort(1, None, [A1, A2, B2]) == [A1, A2, B2]  # each rolled back on its member
    assert plan_abort(1, (1, [A1, A2]), [A1, A2]) == []


def test_plan_abort_after_a_commit_that_raised_leaves_the_branches_to_the_replay() -> None:
    """The decision may have been sent and not answered: rolled back, its branches were
    gone when it was logged later, and the replay found a decision it could not commit."""
    assert plan_abort(1, None, [X1, X2], after_commit=True) == []
    assert plan_abort(1, (0, [OLD]), [X1], after_commit=True) == []
    # Refused SinkIdInUse, before any decision: this attempt's branches go.
    assert plan_abort(1, (7, []), [X1], after_commit=True) == [X1]
    assert plan_abort(1, (1, [X2]), [X1], after_commit=True, foreign=True) == [X1]
    # ... also after a task failed (a replay refused: they stayed prepared for good).
    assert plan_abort(1, (7, []), [X1]) == [X1]


def test_a_decision_names_each_branchs_member_and_an_older_one_its_single_node() -> None:
    body = msgpack.unpackb(msgpack.packb(decision_body(3, [A1, B2])), raw=False)
    assert body == {"batch": 3, "branches": [[1, *A1.xid], [2, *B2.xid]]}
    assert decision_of(body) == (3, [A1, B2])
    named = decision_body(3, [A1], query="q-1")  # a streaming query's names it
    assert named["query"] == "q-1" and decision_of(named) == (3, [A1])
    before = {"batch": 2, "xids": [list(X1.xid), list(X2.xid)]}  # written before clusters
    assert decision_of(before) == (2, [X1, X2])


def test_rows_too_large_for_one_request_are_cut_by_bytes(spark: SparkSession,
                                                        node: LocalNode) -> None:
    """600 rows of 40 KB: 24 MB, over the node's 16 MiB frame limit for one request."""
    with node.client() as c:
        c.create_topic("big")
        df = spark.range(0, 600, numPartitions=1).selectExpr(
            "concat(lpad(cast(id as string), 8, '0'), repeat('x', 40000)) as value")
        df.write.format("shardnode").mode("append").option("endpoint", node.endpoint) \
            .option("topic", "big").option("maxBytesPerTransaction", str(8 << 20)).save()
        assert c.end_offsets("big") == [600]
        got = sorted(v[:8] for v in values_in(c, "big"))
        assert got == [b"%08d" % i for i in range(600)]
        assert_no_branches(c)


def _row_of(record: Any) -> tuple[int, bytes | None]:
    """A wire record's row number (value ``v<n>``) and key."""
    value, key = (record, None) if isinstance(record, bytes) else (record[0], record[1])
    return int(value[1:]), key


def test_requests_of_a_cluster_go_to_the_owners_of_their_rows_partitions() -> None:
    """Routing, without I/O: every request names a partition and goes to its owner: a row's
    named partition, else its key's, else (keyless) the next partition in turn, a request
    at a time; every request within its limit, rows in their order."""
    import pyarrow as pa

    owners, n = (2, 1, 2, 1), 400
    named = {i: (i // 5) % 4 for i in range(0, n, 5)}  # a key too: the partition wins
    keyless = set(range(1, n, 5))
    batch = pa.RecordBatch.from_pydict({
        "value": pa.array([f"v{i}" for i in range(n)], pa.string()),
        "key": pa.array([None if i in keyless else f"k{i}" for i in range(n)], pa.string()),
        "partition": pa.array([named.get(i) for i in range(n)], pa.int32())})
    routing = Routing(lambda topic: owners, turn=3)
    seen: list[int] = []
    spread: list[int] = []
    for member, topic, partition, records in requests_of(batch, "t", 30, 1 << 20, routing):
        assert topic == "t" and 0 < len(records) <= 30
        assert partition is not None and member == owners[partition]
        rows = [_row_of(r) for r in records]
        assert [i for i, _k in rows] == sorted(i for i, _k in rows), "rows in their order"
        seen += [i for i, _k in rows]
        if rows[0][0] in keyless:
            assert all(i in keyless for i, _k in rows), "keyless rows have requests of their own"
            spread.append(partition)
            continue
        for i, key in rows:
            assert i not in keyless and key is not None
            assert partition == named.get(i, key_partition(key, 4)), f"row {i}"
    assert sorted(seen) == list(range(n))
    assert spread == [3, 0, 1], "80 keyless rows: 3 requests, to the partitions in turn"
    # A single node: every request to it, keyed and keyless rows placed by it.
    single = list(requests_of(batch, "t", 1000, 1 << 20))
    assert {(m, p) for m, _t, p, _r in single} == {(SINGLE, None), (SINGLE, 0), (SINGLE, 1),
                                                  (SINGLE, 2), (SINGLE, 3)}
    bad = pa.RecordBatch.from_pydict({"value": pa.array(["v0"]), "partition": pa.array([4])})
    with pytest.raises(UnknownPartition, match=r"has partitions 0\.\.3, not 4"):
        list(requests_of(bad, "t", 30, 1 << 20, routing))
    # A negative one, on a single node too (it was "field 'partition' is out of range").
    negative = pa.RecordBatch.from_pydict({"value": pa.array(["v0"]),
                                           "partition": pa.array([-1])})
    with pytest.raises(UnknownPartition, match="has no partition -1"):
        list(requests_of(negative, "t", 30, 1 << 20))


def _arrow_batches(rows: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa

    rows = list(rows)
    yield pa.RecordBatch.from_pydict({"value": pa.array([r.value for r in rows], pa.string()),
                                      "key": pa.array([r.key for r in rows], pa.string())})


def test_batch_write_with_every_column_and_batch_read_by_offsets(spark: SparkSession,
                                                                node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("a", partitions=2)
        c.create_topic("b", partitions=1)
        df = spark.range(0, 400, numPartitions=2).selectExpr(
            "cast(concat('v', id) as binary) as value", "concat('k', id) as key",
            "cast(id % 2 as int) as partition", "if(id < 300, 'a', 'b') as topic",
            "timestamp_millis(1700000000000 + id) as timestamp", "array('t', cast(id as string)) as tags")
        df.where("topic = 'b'").drop("partition").write.format("shardnode").mode("append") \
            .option("endpoint", node.endpoint).save()
        df.where("topic = 'a'").write.format("shardnode").mode("append") \
            .option("endpoint", node.endpoint).option("deliveryGuarantee", "at_least_once").save()
        assert c.end_offsets("a") == [150, 150]
        assert c.end_offsets("b") == [100]
        # Tasks write at once: which row of a partition comes first is theirs to decide.
        r = next(r for r in c.read("a", 1, 0, 200) if r.value == b"v1")
        assert (r.key, r.tags, r.timestamp) == (b"k1", ("t", "1"), 1700000000001)
        assert_no_branches(c)
        back = (spark.read.format("shardnode").option("endpoint", node.endpoint)
                .option("topic", "a").option("startingOffsets", '{"1": 100}')
                .option("endingOffsets", '{"0": 10, "1": 120}').load())
        got = back.collect()
        assert sorted((x.partition, x.offset) for x in got) == (
            [(0, o) for o in range(10)] + [(1, o) for o in range(100, 120)])
        for row in got:
            n = int(row.key[1:])
            assert (row.topic, row.partition, row.value, list(row.tags)) == (
                "a", n % 2, b"v%d" % n, ["t", str(n)])
            assert round(row.timestamp.timestamp() * 1000) == 1700000000000 + n


# ---- errors ---------------------------------------------------------------------------


def _start_error(df: DataFrame, node: LocalNode, **options: str) -> str:
    with pytest.raises(PySparkException) as info:
        w = df.write.format("shardnode").mode("append").option("endpoint", node.endpoint)
        for k, v in options.items():
            w = w.option(k, v)
        w.save()
    return str(info.value)


def test_a_bad_input_or_option_fails_the_query_naming_it(spark: SparkSession, node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t")
    no_value = spark.range(3).selectExpr("cast(id as string) as body")
    assert "needs a 'value' column" in _start_error(no_value, node, topic="t")
    wrong = spark.range(3).selectExpr("id as value")
    assert "column 'value' has type bigint" in _start_error(wrong, node, topic="t")
    ok = spark.range(3).selectExpr("cast(id as string) as value")
    assert "needs a 'topic' option or a 'topic' column" in _start_error(ok, node)
    assert "deliveryGuarantee" in _start_error(ok, node, topic="t",
                                               deliveryGuarantee="maybe")
    assert "maxRecordsPerRequest" in _start_error(ok, node, topic="t",
                                                  maxRecordsPerRequest="0")
    # It was ignored.
    assert "did you mean 'maxRecordsPerRequest'?" in _start_error(ok, node, topic="t",
                                                                  maxRecordPerRequest="10")
    # Taken and ignored: a df.write in foreachBatch looked idempotent, and was not.
    assert "option 'sinkId' is for streaming queries" in _start_error(ok, node, topic="t",
                                                                      sinkId="etl")
    # It failed every task attempt, with the node's UnknownTopic and no word of what to do.
    text = _start_error(ok, node, topic="nope")
    assert "topic 'nope' does not exist" in text and "create it first" in text


def test_what_the_data_source_cannot_do_is_refused_as_the_query_starts(
        spark: SparkSession, node: LocalNode) -> None:
    """Each of these was taken: an overwrite appended; a batch read's groupId committed
    nothing; exactly once into a memory topic failed every task; a schema of one's own
    failed every task as a mismatch; an offset given as a string was "not ≥ 0"."""
    with node.client() as c:
        c.create_topic("ok")
        c.create_topic("mem", storage="memory")
    ok = spark.range(3).selectExpr("cast(id as string) as value")
    with pytest.raises(PySparkException, match=r"mode\('overwrite'\) is not supported"):
        ok.write.format("shardnode").mode("overwrite").option("endpoint", node.endpoint) \
            .option("topic", "ok").save()
    assert "is a memory topic" in _start_error(ok, node, topic="mem")
    ok.write.format("shardnode").mode("append").option("endpoint", node.endpoint) \
        .option("topic", "mem").option("deliveryGuarantee", "at_least_once").save()
    with node.client() as c:
        assert c.end_offsets("mem") == [3] and c.end_offsets("ok") == [0]

    def read(**options: str) -> DataFrame:
        r = spark.read.format("shardnode").option("endpoint", node.endpoint)
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    for name in ("groupId", "maxRecordsPerTrigger"):
        with pytest.raises(PySparkException, match=f"option '{name}' is for streaming reads"):
            read(topic="ok", **{name: "5"}).count()
    with pytest.raises(PySparkException, match="partition 0's offset must be an integer"):
        read(topic="ok", startingOffsets='{"0": "5"}').count()
    with pytest.raises(PySparkException, match="the shardnode source has the schema"):
        spark.read.format("shardnode").schema("value string").option(
            "endpoint", node.endpoint).option("topic", "ok").load().count()


def test_a_batch_read_with_nothing_to_read_reads_no_row(spark: SparkSession,
                                                        node: LocalNode) -> None:
    """PySpark reads a partition of its own when the reader has none: an empty topic, or
    ``latest``, failed with an AssertionError."""
    with node.client() as c:
        c.create_topic("empty", partitions=2)
        c.create_topic("some")
        c.produce("some", b"v")
    read = spark.read.format("shardnode").option("endpoint", node.endpoint)
    assert read.option("topic", "empty").load().count() == 0
    assert read.option("topic", "some").option("startingOffsets", "latest").load().count() == 0
    assert read.option("topic", "some").option("startingOffsets", "earliest").load().count() == 1


def test_a_timestamp_past_the_year_9999_is_refused_not_read_back_wrong(
        spark: SparkSession, node: LocalNode) -> None:
    """1e16 ms was stored and read back as the year -265697 (an unchecked multiply)."""
    with node.client() as c:
        c.create_topic("far")
        with pytest.raises(BadRequest, match="9999-12-31"):
            c.produce("far", b"v", timestamp=TIMESTAMP_MAX + 1)
        c.produce("far", b"last", timestamp=TIMESTAMP_MAX)
    far = spark.range(1).selectExpr("'v' as value",
                                    "cast(10000000000000000 as bigint) as timestamp")
    assert "after 9999-12-31" in _start_error(far, node, topic="far")
    [row] = spark.read.format("shardnode").option("endpoint", node.endpoint) \
        .option("topic", "far").load().collect()
    assert (row.value, row.timestamp.year) == (b"last", 9999)


def test_a_timestamp_spark_cannot_hold_fails_the_read_naming_it() -> None:
    """One written before the node bounded timestamps (or by a node that did not): the
    read turned it into a wrong date (an unchecked multiply)."""
    assert batch_of("t", 0, [(0, TIMESTAMP_MAX, None, [], b"v")]).num_rows == 1
    with pytest.raises(ValueError, match="t/0: a record's timestamp is past 9999-12-31"):
        batch_of("t", 0, [(0, 10**16, None, [], b"v")])


def test_a_row_over_a_node_limit_fails_its_task_with_the_nodes_error(
        spark: SparkSession, node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t")
        # A key over the node's 4 KiB (values may be 12 MiB since large values: too big to
        # make here cheaply).
        big = spark.range(2, numPartitions=1).selectExpr("repeat('k', 5000) as key",
                                                         "'v' as value")
        text = _start_error(big, node, topic="t")
        assert "key must be bin of at most 4096 bytes" in text
        assert c.end_offsets("t") == [0]
        assert_no_branches(c)


def test_a_stream_into_a_missing_topic_fails_at_its_start_saying_to_create_it(
        spark: SparkSession, node: LocalNode, tmp_path: Path) -> None:
    """The writer is made on the driver as the query starts: the topic is checked there.
    Spark's own options (a query name, a path, the checkpoint) are not refused."""
    q = (spark.readStream.format("rate").load().selectExpr("cast(value as string) as value")
         .writeStream.format("shardnode").queryName("into_nosuch")
         .option("endpoint", node.endpoint).option("topic", "nosuch")
         .option("checkpointLocation", str(tmp_path / "ck")).start(str(tmp_path / "path")))
    try:
        with pytest.raises(PySparkException) as info:
            q.awaitTermination(WAIT_S)  # raises the query's failure (False: still running)
    finally:
        q.stop()
    text = str(info.value)
    assert f"topic 'nosuch' does not exist on {node.endpoint}: create it first" in text
    assert f"shardnode create-topic nosuch --host 127.0.0.1 --port {node.port}" in text


def test_a_missing_topic_fails_the_writer_and_the_reader_as_they_are_made(
        node: LocalNode) -> None:
    """Without Spark: what PySpark calls on the driver as a query starts. The writer was
    made without asking the node (every task failed later); the reader failed too, without
    saying what to do."""
    schema = StructType([StructField("value", StringType())])
    read_schema = StructType([
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("tags", ArrayType(StringType()))])
    check_schema(read_schema)  # the source's own: taken
    with pytest.raises(OptionError, match="'topic string, partition string"):
        check_schema(StructType([StructField(f.name, StringType()) for f in read_schema]))
    source = ShardnodeDataSource({"endpoint": node.endpoint, "topic": "nosuch"})
    makers: list[Callable[[], object]] = [
        lambda: source.writer(schema, False), lambda: source.streamWriter(schema, False),
        lambda: source.reader(read_schema), lambda: source.streamReader(read_schema)]
    for make in makers:
        with pytest.raises(UnknownTopic, match=r"'nosuch' does not exist on .*: create it first, "
                           rf"e\.g\. `shardnode create-topic nosuch --host 127\.0\.0\.1 "
                           rf"--port {node.port} --partitions N`"):
            make()
    with node.client() as c:
        c.create_topic("t")
    ok = ShardnodeDataSource({"endpoint": node.endpoint, "topic": "t"})
    assert isinstance(ok.writer(schema, False), BatchWriter)
    assert isinstance(ok.streamReader(read_schema), StreamReader)
    by_column = ShardnodeDataSource({"endpoint": node.endpoint})  # each row names its topic
    assert isinstance(by_column.writer(schema.add("topic", StringType()), False), BatchWriter)


def test_a_check_that_passed_is_not_made_again_for_each_micro_batch(
        node: LocalNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """PySpark makes a stream's writer again for each batch's commit: the check that passed
    is remembered for ``CHECKED_FOR_S`` in this process; one that failed is not."""
    from node.spark import nodes

    monkeypatch.setattr(nodes, "_checked", {})
    made: list[int] = []
    real = nodes.Nodes

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(nodes, "Nodes", counted)
    with node.client() as c:
        c.create_topic("checked")
    schema = StructType([StructField("value", StringType())])
    for _ in range(3):
        ShardnodeDataSource({"endpoint": node.endpoint, "topic": "checked"}).streamWriter(
            schema, False)
    assert len(made) == 1
    for _ in range(2):
        with pytest.raises(UnknownTopic):
            ShardnodeDataSource({"endpoint": node.endpoint, "topic": "nosuch"}).writer(
                schema, False)
    assert len(made) == 3


def test_a_node_that_does_not_answer_fails_the_start_within_seconds_naming_it() -> None:
    """Nothing listens at the endpoint: the writer's check gives up within its own bound,
    not the six timeouts of 30 s (the default ``requestTimeoutMs``) of a task's request."""
    schema = StructType([StructField("value", StringType())])
    down = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(NodeError, match=rf"could not reach {re.escape(down)} \(option "
                       rf"'endpoint'\) as the query started: no reply from {re.escape(down)}"):
        ShardnodeDataSource({"endpoint": down, "topic": "t"}).writer(schema, False)
    assert time.monotonic() - start < 2 * (START_RETRIES + 1) * START_TIMEOUT_MS_MAX / 1000


def test_an_unknown_option_is_refused_and_sparks_own_pass() -> None:
    """Spark hands the options over case-insensitively, in lower case. A misspelled one was
    silently ignored."""
    base = {"endpoint": "tcp://a:1", "topic": "t"}
    with pytest.raises(OptionError, match=r"sink does not take option 'maxrecordperrequest' "
                       r"\(did you mean 'maxRecordsPerRequest'\?\); it takes endpoint, topic, "):
        SinkOptions.parse(CaseInsensitiveDict({**base, "maxRecordPerRequest": "10"}))
    with pytest.raises(OptionError, match=r"source does not take options 'deliveryguarantee' "
                       r"\(a sink option\), 'zzz'; it takes endpoint, topic, startingOffsets"):
        SourceOptions.parse(CaseInsensitiveDict({**base, "deliveryGuarantee": "exactly_once",
                                                 "zzz": "1"}))
    # What Spark adds itself (a path, a query's checkpoint and name, internal "__" ones).
    sparks = {"path": "/p", "paths": '["/p"]', "checkpointLocation": "/ck", "queryName": "q",
              "__partition_columns": "[]"}
    sink = SinkOptions.parse(CaseInsensitiveDict({**base, **sparks, "MAXRECORDSPERREQUEST": "7"}))
    assert sink.records_per_request_max == 7
    assert SourceOptions.parse(CaseInsensitiveDict({**base, **sparks})).topic == "t"
    # A stream reads on: an end of it was ignored.
    assert SourceOptions.parse({**base, "endingOffsets": "latest"}).ending == "latest"
    with pytest.raises(OptionError, match="'endingOffsets' is for batch reads"):
        SourceOptions.parse({**base, "endingOffsets": "latest"}, streaming=True)


def _readme_options(table: str) -> list[str]:
    """The options README.md's Spark section lists in its table headed ``| <table> |``."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Spark\n"):]
    section = section[:section.index("\n## ", 1)]
    rows = section[section.index(f"| {table} |"):].split("\n\n")[0].splitlines()[2:]
    return [name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])]


def test_the_readme_lists_the_options_the_data_source_takes() -> None:
    assert _readme_options("sink option") == list(SINK_OPTIONS)
    assert _readme_options("source option") == list(SOURCE_OPTIONS)


def test_options_are_checked_before_any_task() -> None:
    with pytest.raises(OptionError, match="endpoint"):
        SinkOptions.parse({"topic": "t"})
    cluster = SinkOptions.parse({"endpoint": " tcp://a:1, tcp://b:2,,tcp://a:1", "topic": "t"})
    assert cluster.endpoints == ("tcp://a:1", "tcp://b:2")
    assert SourceOptions.parse({"endpoint": "tcp://a:1", "topic": "t"}).endpoints == ("tcp://a:1",)
    with pytest.raises(OptionError, match="not an endpoint such as"):
        SinkOptions.parse({"endpoint": "tcp://a:1,b:2", "topic": "t"})
    # ZeroMQ said "Invalid argument" and "Protocol not supported", with no word of the option.
    for bad, says in (("tcp://127.0.0.1:abc", "needs a host and a port"),
                      ("http://127.0.0.1:7400", "a node listens on tcp://")):
        with pytest.raises(OptionError, match=f"option 'endpoint': '{bad}': {says}"):
            SinkOptions.parse({"endpoint": bad, "topic": "t"})
    assert SourceOptions.parse({"endpoint": "tcp://a:1", "topic": "t",
                                "startingOffsets": " Latest"}).starting == "latest"
    with pytest.raises(OptionError, match="names no endpoint"):
        SinkOptions.parse({"endpoint": " , ", "topic": "t"})
    with pytest.raises(OptionError, match="sinkId"):
        SinkOptions.parse({"endpoint": "tcp://a:1", "sinkId": "x" * 41})
    with pytest.raises(OptionError, match="at least 'maxRecordsPerRequest'"):
        SinkOptions.parse({"endpoint": "tcp://a:1", "maxRecordsPerTransaction": "10"})
    with pytest.raises(OptionError, match="startingOffsets"):
        SourceOptions.parse({"endpoint": "tcp://a:1", "topic": "t", "startingOffsets": "[1]"})
    assert SourceOptions.parse({"endpoint": "tcp://a:1", "topic": "t",
                                "startingOffsets": '{"2": 5}'}).starting == {2: 5}


# ---- the source -----------------------------------------------------------------------


def test_bounded_shares_a_trigger_limit_among_partitions() -> None:
    start = {"0": 10, "1": 0, "2": 5}
    ends = {"0": 100, "1": 3, "2": 5}
    got = bounded(start, ends, 50)
    assert got == {"0": 57, "1": 3, "2": 5}
    assert sum(got[p] - start[p] for p in got) == 50
    assert bounded(start, ends, 1000) == ends
    # A limit below the partitions with records: each gets its turn, none is starved.
    at = dict.fromkeys("0123", 0)
    for _trigger in range(4):
        at = bounded(at, dict.fromkeys("0123", 10), 2)
    assert at == dict.fromkeys("0123", 2)


def test_splits_cut_large_ranges() -> None:
    opts = SourceOptions.parse({"endpoint": "tcp://a:1", "topic": "t",
                                "maxRecordsPerPartition": "40"})
    got = splits(opts, {"0": 0, "1": 90}, {"0": 100, "1": 90})
    assert [(s.partition, s.start, s.end) for s in got] == [(0, 0, 40), (0, 40, 80),
                                                            (0, 80, 100)]


def test_read_split_reads_every_offset_in_order_across_reads(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t", partitions=2)
        c.produce_batch("t", [f"v{i}".encode() for i in range(250)], partition=1)
        opts = SourceOptions.parse({"endpoint": node.endpoint, "topic": "t",
                                    "maxRecordsPerRead": "60"})
        batches = list(read_split(opts, Split("t", 1, 5, 245)))
        offsets = [o for b in batches for o in b.column("offset").to_pylist()]
        assert offsets == list(range(5, 245))
        assert len(batches) == 4
        assert batches[0].column("value")[0].as_py() == b"v5"


def test_read_split_passes_over_deleted_records(node: LocalNode) -> None:
    """Records deleted one by one are gaps a read passes over: at a range's start, inside
    it, across a read's end and at the range's end. It failed on the first ("expected
    offset"), or called the offsets not contiguous."""
    with node.client() as c:
        c.create_topic("gaps", partitions=1)
        c.produce_batch("gaps", [Record(f"v{i}".encode(), key=f"k{i}".encode())
                                 for i in range(100)], partition=0)
        deleted = {0, 1, 30, 59, 60, 61, 97, 98, 99}
        for off in sorted(deleted - {30}):
            c.delete_by_offset("gaps", 0, off)
        c.delete_by_key("gaps", "k30", partition=0)
        opts = SourceOptions.parse({"endpoint": node.endpoint, "topic": "gaps",
                                    "maxRecordsPerRead": "20"})
        for start, end in ((0, 100), (1, 62), (59, 62), (97, 100)):
            offsets = [o for b in read_split(opts, Split("gaps", 0, start, end))
                       for o in b.column("offset").to_pylist()]
            assert offsets == [o for o in range(start, end) if o not in deleted]


def test_records_retention_deleted_fail_the_read_unless_told_otherwise(
        spark: SparkSession, node: LocalNode) -> None:
    """Offsets below what retention keeps are data lost: a read of them fails, naming
    ``failOnDataLoss``; with it false the read goes on from the earliest kept. And
    ``startingOffsets`` ``earliest`` is the earliest kept (it was 0, and every query of a
    topic with retention failed)."""
    with node.client() as c:
        c.create_topic("kept", partitions=1, retention_bytes=10_000)
        c.produce_batch("kept", [b"x" * 100] * 300, partition=0)
        deadline = time.monotonic() + 20
        while True:  # the writer deletes the oldest in the background, down to 100 records
            try:
                c.read("kept", 0, 0, 1)
            except OffsetOutOfRange as exc:
                if exc.earliest == 200:
                    break
            assert time.monotonic() < deadline, "retention did not run within 20 s"
            time.sleep(0.05)  # ok-sleep: polling for the background pass, under a deadline
    opts = {"endpoint": node.endpoint, "topic": "kept"}
    with pytest.raises(DataLost, match=r"kept/0: offsets 0\.\.199 .*failOnDataLoss"):
        list(read_split(SourceOptions.parse(opts), Split("kept", 0, 0, 300)))
    skipped = read_split(SourceOptions.parse({**opts, "failOnDataLoss": "false"}),
                         Split("kept", 0, 150, 300))
    assert [o for b in skipped for o in b.column("offset").to_pylist()] == list(range(200, 300))
    back = spark.read.format("shardnode").options(**opts).load()
    assert sorted(r.offset for r in back.select("offset").collect()) == list(range(200, 300))
    with pytest.raises(PySparkException, match="failOnDataLoss"):
        spark.read.format("shardnode").options(**opts, startingOffsets='{"0": 100}').load() \
            .collect()


@pytest.mark.timeout(600)  # a Spark driver of its own starts
def test_a_stream_read_killed_and_restarted_sees_every_record_once_in_order(
        spark: SparkSession, node: LocalNode, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ckpt = str(tmp_path / "ck")
    written = 0
    with node.client() as c:
        c.create_topic("t", partitions=3)

        def write(n: int) -> None:
            nonlocal written
            for p in range(3):
                c.produce_batch("t", [f"v{written + i}".encode() for i in range(n)], partition=p)
            written += n

        write(300)
        proc = child("source", node.endpoint, "t", str(out), ckpt, "follow")
        try:
            # Writes go on while it reads (up to 1 000 records a partition), until it has
            # finished two batches.
            def reading() -> bool:
                if written < 1000:
                    write(20)
                return len(list(out.glob("*.json"))) >= 2

            poll(reading, "the reading query's first batches")
        finally:
            kill_group(proc)
        write(200)
        # The same query, restarted from its checkpoint in this module's session.
        finish(source_query(spark, node.endpoint, "t", str(out), ckpt, "finish"))
        ends = c.end_offsets("t")
    by_partition: dict[int, list[int]] = collections.defaultdict(list)
    for f in sorted(out.glob("*.json"), key=lambda f: int(f.stem)):
        for p, offset, _value in json.loads(f.read_text()):
            by_partition[p].append(offset)
    for p in range(3):
        assert by_partition[p] == list(range(ends[p])), f"partition {p}"


def test_group_id_commits_the_sources_progress(spark: SparkSession, node: LocalNode,
                                               tmp_path: Path) -> None:
    with node.client() as c:
        c.create_topic("t", partitions=2)
        c.produce_batch("t", [b"x"] * 30, partition=0)
        c.produce_batch("t", [b"y"] * 12, partition=1)
        q = (spark.readStream.format("shardnode").option("endpoint", node.endpoint)
             .option("topic", "t").option("groupId", "spark-readers")
             .load().writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
        finish(q)
        assert [c.committed_offset("spark-readers", "t", p) for p in (0, 1)] == [30, 12]


# ---- a cluster --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two members, for the tests of a cluster only: started when the first of them asks.
    A member copies the catalog only when it changes (not every 2 s)."""
    root = tmp_path_factory.mktemp("cluster")
    config = root / "member.toml"
    config.write_text("[cluster]\ncatalog_sync_ms = 600000\n")
    with LocalCluster(root, 2, config=config) as cl:
        yield cl


def member(cl: LocalCluster, m: int, timeout_ms: int = 10_000) -> NodeClient:
    """A client of one member only (what it does not own, it forwards)."""
    return NodeClient(cl.nodes[m].endpoint, timeout_ms=timeout_ms)


def cluster_topic(c: NodeClient, name: str, partitions: int = 4) -> tuple[int, ...]:
    """A topic with partitions on both members, and the decisions' topic: made before a
    test counts what is forwarded (the catalog member asks each member to copy a new
    topic, which counts)."""
    c.create_topic(name, partitions=partitions)
    with contextlib.suppress(TopicExists):
        c.create_topic(SINKS_TOPIC, partitions=1)
    owners = c.owners(name)
    assert set(owners) == {1, 2}, f"{name}: both members own partitions ({owners})"
    return owners


def records_on_owner(cl: LocalCluster, topic: str, partition: int, owner: int) -> list[Record]:
    """A partition's records read from its owner (nothing forwarded), in offset order."""
    out: list[Record] = []
    with member(cl, owner) as c:
        while batch := c.read(topic, partition, len(out), 1000):
            out += batch
    assert [r.offset for r in out] == list(range(len(out)))
    return out


def assert_no_branches_on(cl: LocalCluster) -> None:
    for m in cl.nodes:
        with member(cl, m) as c:
            assert_no_branches(c)


def test_exactly_once_into_a_cluster_stages_on_each_owner_and_forwards_nothing(
        spark: SparkSession, cluster: LocalCluster, tmp_path: Path) -> None:
    rows = write_inputs(spark, tmp_path / "in", files=3, rows_per_file=600)
    with cluster.client() as c:
        owners = cluster_topic(c, "c-once")
        before = cluster.forwarded()
        q = sink_stream(stream_inputs(spark, tmp_path / "in"), cluster, "c-once",
                        tmp_path / "ck")
        finish(q)
        assert cluster.forwarded() == before, "each request went to its partition's owner"
        assert_exactly(c, "c-once", rows)
        assert_no_branches_on(cluster)
        for p, owner in enumerate(owners):  # each row in its key's partition, on its owner
            recs = records_on_owner(cluster, "c-once", p, owner)
            assert recs and all(r.key is not None and key_partition(r.key, 4) == p
                                for r in recs)
        decision = c.read_by_key(SINKS_TOPIC, str(q.id), partition=0)
        assert decision is not None
        body = msgpack.unpackb(decision.value, raw=False)
        assert body["batch"] == 2
        assert {b[0] for b in body["branches"]} == {1, 2}, "a branch on each member"


def test_at_least_once_into_a_cluster_through_one_member(spark: SparkSession,
                                                         cluster: LocalCluster) -> None:
    """One member's endpoint: the sink learns the others from it. Keyless rows are spread
    over every partition; rows naming a partition land in it."""
    with cluster.client() as c:
        owners = cluster_topic(c, "c-plain")
        before = cluster.forwarded()
        df = spark.range(0, 3000, numPartitions=2).selectExpr(
            "concat('v', id) as value", "if(id % 3 = 0, cast(id % 4 as int), null) as partition")
        (df.write.format("shardnode").mode("append").option("endpoint", cluster.nodes[2].endpoint)
         .option("topic", "c-plain").option("deliveryGuarantee", "at_least_once")
         .option("maxRecordsPerRequest", "100").save())
        assert cluster.forwarded() == before, "each request went to its partition's owner"
        assert_exactly(c, "c-plain", 3000)  # nothing failed: nothing sent twice
        for p, owner in enumerate(owners):
            values = [r.value for r in records_on_owner(cluster, "c-plain", p, owner)]
            named = [v for v in values if int(v[1:]) % 3 == 0]
            assert all(int(v[1:]) % 4 == p for v in named)
            assert len(values) > len(named), f"keyless rows reach partition {p} too"


def test_exactly_once_rows_whose_keys_share_a_partition_are_staged_on_its_owner(
        spark: SparkSession, cluster: LocalCluster) -> None:
    """Every key in one partition, of the member that does not own partition 0: the
    requests name the partition, and its owner stages them in its branch."""
    with cluster.client() as c:
        owners = cluster_topic(c, "c-one-key")
        p = next(p for p, o in enumerate(owners) if o != owners[0])
        key = next(k for k in (f"k{i}" for i in range(100)) if key_partition(k.encode(), 4) == p)
        df = spark.range(0, 50, numPartitions=2).selectExpr("concat('v', id) as value",
                                                            f"'{key}' as key")
        (df.write.format("shardnode").mode("append").option("endpoint", endpoint(cluster))
         .option("topic", "c-one-key").save())
        assert c.end_offsets("c-one-key") == [50 if q == p else 0 for q in range(4)]
    assert_no_branches_on(cluster)


def test_the_source_reads_a_cluster_topic_every_record_once(spark: SparkSession,
                                                          cluster: LocalCluster,
                                                          tmp_path: Path) -> None:
    with cluster.client() as c:
        owners = cluster_topic(c, "c-read")
        c.produce_batch("c-read", [Record(f"v{i}".encode(), f"k{i}".encode())
                                   for i in range(2000)])  # split by key over both members
        ends = c.end_offsets("c-read")
        q = (spark.readStream.format("shardnode").option("endpoint", cluster.nodes[1].endpoint)
             .option("topic", "c-read").option("groupId", "c-readers")
             .option("maxRecordsPerPartition", "300").load()
             .writeStream.format("memory").queryName("c_read_rows")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
        finish(q)
        got = spark.sql("select partition, offset, value from c_read_rows").collect()
        assert sorted((r.partition, r.offset) for r in got) == [
            (p, o) for p, end in enumerate(ends) for o in range(end)]
        assert sorted(int(r.value[1:]) for r in got) == list(range(2000))
        for p, owner in enumerate(owners):  # each group offset committed on the owner
            with member(cluster, owner) as m:
                assert m.committed_offset("c-readers", "c-read", p) == ends[p]


def test_a_member_down_after_the_decision_fails_the_commit_and_the_replay_finishes_it(
        spark: SparkSession, cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Member 1 is killed once the decision is written (on member 2, the owner of the
    decisions' partition): committing its branches fails, Spark's abort leaves them
    prepared, and the replay of the batch, member 1 back, commits them."""
    with cluster.client() as c:
        cluster_topic(c, "c-down")
        assert c.owners(SINKS_TOPIC) == (2,)
    writer = StreamWriter(SinkOptions.parse({"endpoint": endpoint(cluster), "topic": "c-down",
                                             "sinkId": "c-down", "requestTimeoutMs": "1000"}))
    first = _stage(spark, writer, 400)
    branches = [b for m in first for b in m.branches]
    assert {b.member for b in branches} == {1, 2}, branches
    decide = sink._decide

    def decide_then_lose_member_1(*args: Any) -> None:
        decide(*args)
        cluster.nodes[1].kill()

    monkeypatch.setattr(sink, "_decide", decide_then_lose_member_1)
    with pytest.raises(NodeError, match=re.escape(cluster.nodes[1].endpoint)):
        writer.commit(list[WriterCommitMessage | None](first), 7)
    monkeypatch.undo()
    cluster.nodes[1].start()
    writer.abort(list[WriterCommitMessage | None](first), 7)  # decided: left for the replay
    with member(cluster, 1) as m1:
        mine = {b.xid for b in branches if b.member == 1}
        assert mine <= set(m1.xa_recover()), "member 1's branches are still prepared"
    replay = _stage(spark, writer, 400)
    writer.commit(list[WriterCommitMessage | None](replay), 7)
    with cluster.client() as c:
        assert_exactly(c, "c-down", 400)
    assert_no_branches_on(cluster)


@pytest.mark.timeout(300)
def test_a_member_down_during_a_batch_fails_the_query_and_the_restart_writes_every_row_once(
        spark: SparkSession, cluster: LocalCluster, tmp_path: Path) -> None:
    """Member 2 (which also holds the decisions) is killed once the first rows are in: the
    query fails (the batch under way cannot stage nor be decided, or the first batch's
    commit, past its decision, cannot finish); restarted from its checkpoint with member 2
    back, it writes every row once."""
    rows = write_inputs(spark, tmp_path / "in", files=4, rows_per_file=500)
    ckpt = tmp_path / "ck"
    with cluster.client(timeout_ms=5000) as c:
        cluster_topic(c, "c-lost")
        q = sink_stream(stream_inputs(spark, tmp_path / "in"), cluster, "c-lost", ckpt,
                        requestTimeoutMs="500")
        poll(lambda: total(c, "c-lost") > 0, "the first batch in the cluster")
    cluster.nodes[2].kill()
    try:
        with pytest.raises(PySparkException):
            q.awaitTermination(WAIT_S)  # raises the query's failure (False: still running)
    finally:
        cluster.nodes[2].start()
    finish(sink_stream(stream_inputs(spark, tmp_path / "in"), cluster, "c-lost", ckpt))
    with cluster.client() as c:
        assert_exactly(c, "c-lost", rows)
    assert_no_branches_on(cluster)


class _OneMember:
    """What ``_Plain`` asks of a task's clients (``node.spark.nodes.Nodes``): one member."""

    def __init__(self, client: NodeClient) -> None:
        self.client = client

    def member(self, _member: int) -> NodeClient:
        return self.client

    def name(self, _member: int) -> str:
        return self.client.endpoint


def test_at_least_once_sends_a_request_nobody_answers_once_more_then_fails_the_task() -> None:
    """A request the node never answers (a front door that restarted lost it, or a member
    that is down) is sent again once, under its sequence number; unanswered again, the task
    fails with the timeout, after two of them rather than nine (it was resent as BUSY is).
    Timeouts are counted apart from the BUSY answers before them."""
    router, endpoint = silent_router()
    opts = SinkOptions.parse({"endpoint": endpoint, "topic": "t",
                              "deliveryGuarantee": "at_least_once",
                              "requestTimeoutMs": "300"})
    client = NodeClient(endpoint, timeout_ms=opts.request_timeout_ms, retries=0)
    try:
        plain = _Plain(_OneMember(client), opts)  # type: ignore[arg-type]
        plain.send(0, "t", 0, [b"v"])
        plain.pipes[0].flush()
        peer, first = request_of(router)
        router.send_multipart([peer, msgpack.packb({"id": first["id"], "ok": False,
                                                    "code": ErrorCode.BUSY, "error": "full"})])
        with pytest.raises(RequestTimeout, match="no reply from"):
            plain.finish()
        sent = [first, request_of(router)[1], request_of(router)[1]]
        assert [r["seq"] for r in sent] == [first["seq"]] * 3
        assert not router.poll(500, zmq.POLLIN), "sent a fourth time"
    finally:
        client.close()
        router.close()


def test_a_row_no_request_can_carry_fails_its_task_naming_it() -> None:
    """A value over what one request carries (the node's frame limit) went out alone: the
    node dropped the connection, and the task timed out, blaming the node, for minutes."""
    import pyarrow as pa

    from node.spark import rows
    from node.spark.options import REQUEST_BYTES_MAX

    batch = pa.RecordBatch.from_pydict({"value": [b"small", b"x" * (REQUEST_BYTES_MAX + 1)]})
    with pytest.raises(ValueError, match=r"row 1 of this batch takes \d+ bytes, more than a "
                                         r"request to the node carries"):
        rows._records(batch, 5000, 4 << 20)
    vals, _sizes = rows._records(batch.slice(0, 1), 5000, 4 << 20)
    assert vals == [b"small"]
