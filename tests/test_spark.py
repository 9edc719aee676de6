"""The Spark data source ``shardnode`` end to end: a real SparkSession (local, one for the
module), real node processes on ``tmp_path``, and drivers in processes of their own where a
test SIGKILLs them (tests/spark_driver.py).

The exactly-once tests count every row in the node: each would fail on a duplicate or a
loss (``assert_exactly``), and on a branch left staged (``assert_no_branches``).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.streaming.query import StreamingQuery

from node.client import NodeClient
from node.crashcheck import read_partition
from node.local import LocalNode
from node.spark import ShardnodeDataSource, register
from node.spark.options import OptionError, SinkOptions, SourceOptions
from node.spark.sink import (
    SINKS_TOPIC,
    XID_FORMAT,
    Plan,
    SinkCommit,
    SinkIdInUse,
    StreamWriter,
    plan_abort,
    plan_commit,
)
from node.spark.source import Split, bounded, read_split, splits
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


def sink_stream(df: DataFrame, node: LocalNode, topic: str, ckpt: Path, fmt: str = "shardnode",
                **options: str) -> StreamingQuery:
    w = (df.writeStream.format(fmt).option("endpoint", node.endpoint).option("topic", topic)
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


def wait_child(proc: subprocess.Popen[bytes]) -> None:
    try:
        out, _ = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise
    assert proc.returncode == 0, out.decode(errors="replace")[-4000:]


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
        assert body["batch"] == 2 and body["xids"], body


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
            assert message.xids, "the doomed attempt prepared its branch"
            raise RuntimeError("injected: task fails after preparing")
        return message


class FailingSink(ShardnodeDataSource):
    @classmethod
    def name(cls) -> str:
        return "shardnode_failing"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        return FailingWriter(super().streamWriter(schema, overwrite),  # type: ignore[arg-type]
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


@pytest.mark.timeout(600)  # two Spark drivers of their own start
def test_sigkill_of_the_driver_mid_stream_then_restart_writes_every_row_once(
        spark: SparkSession, node: LocalNode, tmp_path: Path) -> None:
    rows = write_inputs(spark, tmp_path / "in", files=4, rows_per_file=1500)
    args = ("sink", node.endpoint, "events", str(tmp_path / "in"), str(tmp_path / "ck"))
    with node.client() as c:
        c.create_topic("events", partitions=2)
        proc = child(*args)
        try:
            poll(lambda: total(c, "events") > 0, "the first rows in the node")
        finally:
            kill_group(proc)
        written = total(c, "events")
        assert 0 < written < rows, f"killed mid-stream: {written} of {rows} rows written"
        wait_child(child(*args))
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
        assert [x[0] for m in messages for x in m.xids] == [XID_FORMAT, XID_FORMAT]
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
    """The tasks' side of a batch, run by Spark tasks (the driver's side is the test's)."""
    df = spark.range(0, rows, numPartitions=2).selectExpr("concat('v', id) as value")
    return df.rdd.mapPartitions(lambda it: [writer.write(_arrow_batches(it))]).collect()


def test_a_commit_that_fails_after_its_decision_is_finished_by_the_replay(
        spark: SparkSession, node: LocalNode) -> None:
    """The decision is written and one branch committed, then the commit fails: Spark's
    abort leaves the rest prepared, and the replay of the batch commits them."""
    with node.client() as c:
        writer = _direct_writer(c, node, "halfway")
        first = _stage(spark, writer, 300)
        xids = [Xid(*x) for m in first for x in m.xids]
        assert len(xids) == 2
        c.create_topic(SINKS_TOPIC, partitions=1)
        c.produce(SINKS_TOPIC, msgpack.packb({"batch": 4, "xids": [list(x) for x in xids]}),
                  key="halfway", partition=0)  # step 4, as commit_batch writes it
        c.xa_commit(xids[0])  # step 5, cut short
        writer.abort(list[WriterCommitMessage | None](first), 4)
        assert sorted(c.xa_recover()) == [xids[1]], "abort left the decided branch prepared"
        replay = _stage(spark, writer, 300)
        writer.commit(list[WriterCommitMessage | None](replay), 4)
        assert_exactly(c, "events", 300)
        assert_no_branches(c)
        with pytest.raises(SinkIdInUse, match="belongs to another query"):
            writer.commit(list[WriterCommitMessage | None](_stage(spark, writer, 10)), 3)


X1, X2, X3, X4 = (Xid(XID_FORMAT, b"s/1", str(i).encode()) for i in range(4))
OLD = Xid(XID_FORMAT, b"s/0", b"z")


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
])
def test_plan_commit_for_each_arrow_of_the_protocol(decided: Any, live: list[Xid],
                                                    ours: list[Xid], plan: Plan) -> None:
    assert plan_commit("s", 1, decided, live, ours) == plan


def test_plan_commit_refuses_a_sink_id_with_a_later_decision() -> None:
    with pytest.raises(SinkIdInUse, match="committed batch 7, after this batch 1"):
        plan_commit("s", 1, (7, []), [X1], [X1])


def test_plan_abort_leaves_a_decided_batch_to_its_replay() -> None:
    assert plan_abort(1, None, [X1, X2]) == [X1, X2]
    assert plan_abort(1, (0, [OLD]), [X1]) == [X1]
    assert plan_abort(1, (1, [X1]), [X1, X2]) == []


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


def _arrow_batches(rows: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa

    values = [r.value for r in rows]
    yield pa.RecordBatch.from_pydict({"value": pa.array(values, pa.string())})


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


def test_a_row_over_a_node_limit_fails_its_task_with_the_nodes_error(
        spark: SparkSession, node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t")
        big = spark.range(2, numPartitions=1).selectExpr("repeat('x', 2000000) as value")
        text = _start_error(big, node, topic="t")
        assert "value of 2000000 bytes is over" in text
        assert c.end_offsets("t") == [0]
        assert_no_branches(c)
        missing = spark.range(2).selectExpr("cast(id as string) as value")
        assert "does not exist" in _start_error(missing, node, topic="nope")


def test_options_are_checked_before_any_task() -> None:
    with pytest.raises(OptionError, match="endpoint"):
        SinkOptions.parse({"topic": "t"})
    with pytest.raises(OptionError, match="names 2 nodes"):
        SinkOptions.parse({"endpoint": "tcp://a:1,tcp://b:2", "topic": "t"})
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


@pytest.mark.timeout(600)  # two Spark drivers of their own start
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
        wait_child(child("source", node.endpoint, "t", str(out), ckpt, "finish"))
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
