"""spark (issue 12): Spark writing and reading the same rows through the ``shardnode``
data source (``node/spark/``) and through Spark's own peers, side by side, in one
SparkSession (local[SPARK_PARTITIONS]; starting it is not counted).

The rows: ``spark.range(--spark-rows)`` in SPARK_PARTITIONS partitions, each with a
``value`` of --size pseudo-random bytes that Spark SQL makes (SHA-512 digests of the row's
number; no Python UDF), cached in memory before anything is timed: every system reads the
same rows from the same cache.

- sink (``df.write``): shardnode ``exactly_once`` and ``at_least_once``, each run into a
  fresh topic of SPARK_PARTITIONS partitions, whose records are counted afterwards;
  ``parquet`` (``df.write.parquet`` into a fresh directory: Spark's own exactly-once file
  commit; the files are not fsync'ed); ``zmq-pull``, a bare ZeroMQ socket
  (``workloads/spark.py``: the rows packed as the sink packs them and PUSHed, nothing
  durable, nothing answered; timed until the last row has arrived).
- source: ``spark.read.format("shardnode")`` of a topic that holds the rows (written once,
  untimed) against ``spark.read.parquet`` of files that hold them; the same query,
  ``count(*)`` and ``sum(length(value))``, checked against the rows.

Each system first writes (and reads) SPARK_WARMUP_ROWS rows untimed, so that Spark's Python
workers are started and have their modules loaded (not in a --quick run: its first runs do
that). Each kind is its own ``Runs``: the kinds take turns, run by run. Before each run the
node checkpoints, untimed, so that its shard writers have applied what the last run wrote
(the node acknowledges a write once it is in the log) and no run pays for another; after a
run of the node's sink that checkpoint's time and CPU are reported as the writers' backlog.
rows/s = rows / the time of the call (``save()``, ``parquet()``, ``collect()``, with the
query's planning); meanwhile the bench takes the node's RSS and the CPU time of the node's
processes, of Spark's JVM, of Spark's Python workers and of its own (the driver, the drain
thread).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from node.client import NodeClient

from ..bench import Bench, Runs
from ..measure import Measurement, Row, RssSampler
from ..peers.base import Server
from ..settings import (
    AT_LEAST_ONCE,
    BARE_ZMQ,
    CKPT_TIMEOUT_MS,
    DRAIN_TIMEOUT_S,
    EXACTLY_ONCE,
    PARQUET,
    SHARDNODE,
    SINK,
    SOURCE,
    SPARK,
    SPARK_CPU,
    SPARK_PARTITIONS,
    SPARK_RUN_TIMEOUT_S,
    SPARK_WARMUP_ROWS,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..workloads.spark import Drain

log = logging.getLogger(__name__)

SPARK_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",  # loopback only
    "spark.driver.host": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "ERROR",
    "spark.sql.shuffle.partitions": str(SPARK_PARTITIONS),
}
DIGEST_BYTES = 64  # sha2(..., 512)
BACKLOG = "node_after"  # cpu_s: the node's CPU in the checkpoint after a write of its sink


def start_session() -> SparkSession:
    """local[SPARK_PARTITIONS], the UI off, Spark's log at ERROR; both data sources known."""
    from pyspark.sql import SparkSession

    from node.spark import register

    from ..workloads.spark import BareZmqDataSource

    # scripts/bench sets them; a bench started another way gives Spark's workers this Python
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        os.environ.setdefault(name, sys.executable)
    builder = SparkSession.builder.master(f"local[{SPARK_PARTITIONS}]")
    for key, value in {"spark.app.name": "shardnode-bench", **SPARK_CONF}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # not a line per connection closed
    register(session)
    session.dataSource.register(BareZmqDataSource)
    return session


def cached_rows(session: SparkSession, rows: int, size: int) -> DataFrame:
    """``rows`` rows of one binary ``value`` of ``size`` bytes, made by Spark SQL and
    cached (materialised here, before anything is timed)."""
    from pyspark.sql import functions as F

    n = F.col("id").cast("string")
    digests = [F.unhex(F.sha2(F.concat(n, F.lit(f"/{i}")), 512))
               for i in range(math.ceil(size / DIGEST_BYTES))]
    value = F.substring(F.concat(*digests), 1, size).alias("value")
    df = session.range(rows, numPartitions=SPARK_PARTITIONS).select(value).cache()
    counted = df.count()
    assert counted == rows, f"{counted} rows cached, {rows} made"
    return df


@contextlib.contextmanager
def bounded(session: SparkSession, what: str) -> Iterator[None]:
    """Cancel Spark's jobs when ``what`` is still running after SPARK_RUN_TIMEOUT_S (it then
    raises TimeoutError)."""
    fired = threading.Event()

    def cancel() -> None:
        fired.set()
        session.sparkContext.cancelAllJobs()

    timer = threading.Timer(SPARK_RUN_TIMEOUT_S, cancel)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception as exc:
        if fired.is_set():
            raise TimeoutError(f"{what}: still running after {SPARK_RUN_TIMEOUT_S:g} s, "
                               f"Spark's jobs cancelled") from exc
        raise
    finally:
        timer.cancel()


class CpuMeter:
    """CPU seconds (user + system) of groups of processes between ``start`` and ``stop``:
    the node's, Spark's JVM, Spark's Python workers (the bench's descendants running
    pyspark) and the bench's own; other descendants (a peer's server) are not counted. A
    process that ends in between loses what it used since ``start`` (Spark reuses its
    Python workers: they live through a run)."""

    def __init__(self, node: Callable[[], list[psutil.Process]]) -> None:
        self.node = node
        self.before: dict[int, float] = {}

    def _sample(self) -> dict[int, tuple[str, float]]:
        me = psutil.Process()
        node_pids = {p.pid for p in self.node()}
        out: dict[int, tuple[str, float]] = {}
        for p in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                group = ("bench" if p.pid == me.pid else "node" if p.pid in node_pids
                         else "jvm" if p.name() == "java"
                         else "py" if any("pyspark" in arg for arg in p.cmdline()) else None)
                if group is not None:
                    t = p.cpu_times()
                    out[p.pid] = (group, t.user + t.system)
        return out

    def start(self) -> None:
        self.before = {pid: cpu for pid, (_group, cpu) in self._sample().items()}

    def stop(self) -> dict[str, float]:
        used = dict.fromkeys(SPARK_CPU, 0.0)
        for pid, (group, cpu) in self._sample().items():
            used[group] += max(0.0, cpu - self.before.get(pid, 0.0))
        return used


@dataclass(frozen=True, slots=True)
class Timed:
    """One timed call: its wall time, the node's largest RSS (when watched) and the CPU."""

    seconds: float
    rss_mb: float | None
    cpu_s: dict[str, float]


class SparkScenario:
    """The scenario's state, set up once: the session, the rows, the drain, the topic and
    files to read. Each ``Runs`` measures one kind (system, direction, guarantee)."""

    def __init__(self, b: Bench, server: Server) -> None:
        from ..workloads.spark import Drain

        assert server.system == SHARDNODE, "the spark scenario is the node's"
        self.b, self.server = b, server
        self.rows, self.size = b.s.spark_rows, b.s.size
        self.dir = b.work / b.name(SPARK)
        self.dir.mkdir(parents=True)
        b.after_scenario("removing the spark scenario's files",
                         lambda: shutil.rmtree(self.dir, ignore_errors=True))
        log.info("spark: starting a SparkSession (not timed)")
        t0 = time.monotonic()
        self.session = start_session()
        b.after_scenario("stopping the SparkSession", self.session.stop)
        log.info("spark: session up in %.1f s", time.monotonic() - t0)
        self.drain: Drain = Drain()
        b.after_scenario("closing the zmq drain", self.drain.close)
        self.df = cached_rows(self.session, self.rows, self.size)
        if not b.s.quick:  # a smoke run: its first runs start Spark's workers instead
            self.warm_up()
        log.info("spark: writing the rows to read back (not timed)")
        self.read_topic = self.topic()
        self.read_path = self.dir / "read.parquet"
        with bounded(self.session, "the spark source's topic"):
            self.save_node(self.df, self.read_topic, EXACTLY_ONCE)
        with bounded(self.session, "the Parquet files to read"):
            self.df.write.parquet(str(self.read_path))
        written = self.records(self.read_topic)
        assert written == self.rows, f"{written} records in the topic to read, not {self.rows}"

    # ---- the calls each run times -------------------------------------------------------

    def settle(self) -> tuple[float, float]:
        """A checkpoint of the node, untimed: its shard writers apply what they have not
        yet (the node acknowledges a write once it is in the log), so the next run does not
        pay for the last one. Returns its seconds and the node's CPU seconds."""
        meter = CpuMeter(self.server.processes)
        meter.start()
        t0 = time.monotonic()
        with NodeClient(self.server.target, timeout_ms=CKPT_TIMEOUT_MS, retries=0) as c:
            c.checkpoint()
        return time.monotonic() - t0, meter.stop()["node"]

    def topic(self) -> str:
        name = self.b.name(SPARK)
        self.server.create_topic(name, SPARK_PARTITIONS)
        return name

    def records(self, topic: str) -> int:
        with NodeClient(self.server.target, timeout_ms=30_000) as c:
            return sum(c.end_offsets(topic))

    def save_node(self, df: DataFrame, topic: str, guarantee: str) -> None:
        (df.write.format("shardnode").mode("append")
           .option("endpoint", self.server.target).option("topic", topic)
           .option("deliveryGuarantee", guarantee).save())

    def save_bare(self, df: DataFrame, rows: int) -> None:
        """Through the bare socket; returns once the drain has counted all ``rows``."""
        from ..workloads.spark import BARE_FORMAT

        target = self.drain.records + rows
        df.write.format(BARE_FORMAT).mode("append").option("endpoint", self.drain.endpoint).save()
        if not self.drain.wait_for(target, DRAIN_TIMEOUT_S):
            raise TimeoutError(f"the zmq drain counted {self.drain.records - target + rows} of "
                               f"{rows} rows within {DRAIN_TIMEOUT_S:g} s of the write's end")

    def count(self, frame: DataFrame) -> tuple[int, int]:
        """(rows, value bytes) of ``frame``: the source's query."""
        from pyspark.sql import functions as F

        got = frame.agg(F.count("*").alias("rows"),
                        F.sum(F.length("value")).alias("bytes")).collect()[0]
        return int(got["rows"]), int(got["bytes"] or 0)

    def node_frame(self, topic: str) -> DataFrame:
        return (self.session.read.format("shardnode")
                .option("endpoint", self.server.target).option("topic", topic).load())

    def parquet_frame(self, path: Path) -> DataFrame:
        return self.session.read.parquet(str(path))

    def warm_up(self) -> None:
        """Each write and read once on SPARK_WARMUP_ROWS rows, untimed."""
        rows = min(SPARK_WARMUP_ROWS, self.rows)
        log.info("spark: warming up, %d rows each (not timed)", rows)
        df = cached_rows(self.session, rows, self.size)
        topic, path = self.topic(), self.dir / "warm.parquet"
        with bounded(self.session, "the warm-up"):
            self.save_node(df, topic, EXACTLY_ONCE)
            self.save_node(df, self.topic(), AT_LEAST_ONCE)
            df.write.parquet(str(path))
            self.save_bare(df, rows)
            assert self.count(self.node_frame(topic)) == (rows, rows * self.size)
            assert self.count(self.parquet_frame(path)) == (rows, rows * self.size)
        df.unpersist()
        shutil.rmtree(path)

    # ---- the runs -----------------------------------------------------------------------

    def timed(self, what: str, call: Callable[[], None], node_rss: bool) -> Timed:
        """``call``, timed, after the node has settled."""
        self.settle()
        meter = CpuMeter(self.server.processes)
        rss = RssSampler(self.server.processes) if node_rss else None
        with bounded(self.session, what), contextlib.ExitStack() as stack:
            if rss is not None:
                stack.enter_context(rss)
            meter.start()
            t0 = time.monotonic()
            call()
            seconds = time.monotonic() - t0
            cpu = meter.stop()
        return Timed(seconds, None if rss is None else rss.max_mb, cpu)

    def row(self, system: str, direction: str, guarantee: str | None, t: Timed,
            errors: int, note: str) -> Row:
        m = Measurement(self.rows, self.rows * self.size, t.seconds, None, None, errors,
                        t.rss_mb)
        row = Row.of(SPARK, system, m, note)
        row.direction, row.guarantee, row.cpu_s = direction, guarantee, t.cpu_s
        log.info("spark: %s %s%s: %.0f rows/s (%.2f s)", direction, system,
                 f" {guarantee}" if guarantee else "", row.msgs_per_s, t.seconds)
        return row

    def sink_node(self, guarantee: str) -> Runs:
        def run() -> Row:
            topic = self.topic()
            t = self.timed(f"the shardnode sink ({guarantee})",
                           lambda: self.save_node(self.df, topic, guarantee), node_rss=True)
            after_s, after_cpu = self.settle()
            written = self.records(topic)
            row = self.row(SHARDNODE, SINK, guarantee, t, abs(written - self.rows),
                           f"df.write.format('shardnode'), {guarantee}, into a topic of "
                           f"{SPARK_PARTITIONS} partitions: {written:,} records")
            row.cpu_s = {**t.cpu_s, BACKLOG: after_cpu}
            row.backlog_s = after_s
            return row

        def done(row: Row) -> None:
            row.note += (f"; then a checkpoint (untimed) applied the writers' backlog in "
                         f"{row.backlog_s or 0.0:.2f} s, {(row.cpu_s or {}).get(BACKLOG, 0.0):.2f} "
                         f"CPU s of the node")

        return Runs(run, done, label=f"sink {guarantee}")

    def sink_parquet(self) -> Runs:
        def run() -> Row:
            path = self.dir / self.b.name(PARQUET)
            t = self.timed("the Parquet sink", lambda: self.df.write.parquet(str(path)),
                           node_rss=False)
            files = sum(f.stat().st_size for f in path.glob("*.parquet"))
            shutil.rmtree(path)
            return self.row(PARQUET, SINK, None, t, 0,
                            f"df.write.parquet into a fresh directory: {files / 1e6:.1f} MB "
                            f"of files (Spark's file commit; not fsync'ed)")

        return Runs(run, label="sink parquet")

    def sink_bare(self) -> Runs:
        def run() -> Row:
            before = self.drain.records
            t = self.timed("the bare zmq sink", lambda: self.save_bare(self.df, self.rows),
                           node_rss=False)
            extra = self.drain.records - before - self.rows
            return self.row(BARE_ZMQ, SINK, None, t, extra,
                            "a Python data source PUSHing the rows, packed as the sink packs "
                            "them, to a PULL socket drained by a thread: nothing durable")

        return Runs(run, label="sink zmq-pull")

    def source(self, system: str) -> Runs:
        def frame() -> DataFrame:
            if system == SHARDNODE:
                return self.node_frame(self.read_topic)
            return self.parquet_frame(self.read_path)

        def run() -> Row:
            got: list[tuple[int, int]] = []
            t = self.timed(f"the {system} source", lambda: got.append(self.count(frame())),
                           node_rss=system == SHARDNODE)
            rows, value_bytes = got[0]
            errors = abs(rows - self.rows) or int(value_bytes != self.rows * self.size)
            how = ("spark.read.format('shardnode') of a topic of the rows"
                   if system == SHARDNODE else "spark.read.parquet of files of the rows")
            return self.row(system, SOURCE, None, t, errors,
                            f"{how}: count(*), sum(length(value))")

        return Runs(run, label=f"source {system}")


def spark(b: Bench, server: Server) -> list[Runs]:
    """The node's sink (both guarantees), Parquet's and the bare socket's; the node's
    source and Parquet's reader."""
    s = SparkScenario(b, server)
    return [s.sink_node(EXACTLY_ONCE), s.sink_node(AT_LEAST_ONCE), s.sink_parquet(),
            s.sink_bare(), s.source(SHARDNODE), s.source(PARQUET)]
