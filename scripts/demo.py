"""shardnode's demo is the pipeline a user of it runs: a local cluster of three nodes, a
Spark streaming query from a generated source through the shardnode sink (exactly once: each
task stages its rows on the members owning their partitions), a Spark streaming query that
reads the topic back through the shardnode source, and a check in Spark SQL that every row
arrived exactly once, with its key, value and timestamp.

    scripts/demo [--rows 200000] [--nodes 3] [--port 7400] [--partitions 4]
                 [--batch-rows 50000] [--data-dir var/demo]

Everything is in the data dir (``var/demo`` in the repository unless ``--data-dir`` says
otherwise; a relative one is taken from the directory the demo is run in): the members'
data and logs in ``cluster/``, the input, Spark's checkpoints and the rows read back in
``spark/``. The demo wipes it first only if it made it (``.shardnode-demo`` in it); a new or
empty directory it takes and marks, any other it refuses (exit 2), its files untouched.

The input is the numbers 0..rows-1 in Parquet files of ``--batch-rows`` each, one file to a
micro-batch. Row ``n`` is written with key ``user-<n % 1000>``, value
``row <n in 12 digits> <sha-256 of n>`` and timestamp ``start + n`` ms: each derived from
``n``, so the check recomputes them from the number read back in the value. Both queries run
with Trigger.AvailableNow: each stops by itself once it has processed what was there when
it started. Exits non-zero if a row is missing, duplicated or differs, or a query fails or
stalls.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.errors import StreamingQueryException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from node.client import NodeClient
from node.local import LocalCluster, port_in_use
from node.spark import register

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "demo"
KEYS = 1000  # distinct keys: row n has key user-<n % KEYS>
# In a data dir the demo made: it wipes only a directory with this file in it.
MARKER = ".shardnode-demo"
POLL_S = 0.2  # how often the progress bars look at the node and the queries
# A query that adds no row for this long has stalled: the demo fails rather than wait. A
# query's first batch, which starts Spark's Python workers, took 40 s on a busy 2-core machine.
STALL_S_MAX = 180.0
# The summary counts each query's batches from its progress reports, of which Spark keeps
# the last BATCHES_MAX (SPARK_CONF): --rows / --batch-rows may be no more.
BATCHES_MAX = 10_000
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # the demo draws its own bars
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.numRecentProgressUpdates": str(BATCHES_MAX),  # the default is 100
}
# Spark logs errors only, from its start on (``spark.log.level`` applies only once it runs).
# The gateway's logger needs its level too: Spark prints a line about it otherwise.
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""

# The JIT's quick tier only: a run of a minute or two gains nothing from the optimising
# compiler, whose threads take CPU from the queries. On this 2-core machine the demo at
# 20 000 rows took 44-61 s with it, 52-89 s without, run for run in turn (the machine busy).
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"

console = Console()


class DemoFailed(RuntimeError):
    """A query failed or stalled, or the cluster does not hold the rows written."""


@dataclass(slots=True)
class Step:
    """One step of the pipeline, a line of the summary. A query's step has its batches,
    and its rate after the first batch (None with one batch)."""

    name: str
    seconds: float
    rows: int | None = None
    batches: int | None = None
    warm_per_s: float | None = None

    @property
    def per_s(self) -> str:
        if self.rows is None or self.batches is None or not self.seconds:
            return ""
        return f"{self.rows / self.seconds:,.0f}"


@dataclass(frozen=True, slots=True)
class Check:
    """What Spark SQL found in the rows read back."""

    count: int
    distinct: int
    low: int | None
    high: int | None
    bad: int  # rows whose key, value or timestamp is not the one derived from their number

    def failures(self, rows: int) -> list[str]:
        """Nothing if each number 0..rows-1 is there exactly once and every row is as
        written: count = distinct = rows, and min..max = 0..rows-1, leave no room for
        another number or a second copy."""
        out = []
        if self.count != rows:
            out.append(f"{self.count:,} rows read back, {rows:,} written")
        if self.distinct != self.count:
            out.append(f"{self.count:,} rows read back carry {self.distinct:,} distinct "
                       f"numbers: some came more than once (or have no number)")
        if (self.low, self.high) != (0, rows - 1):
            out.append(f"row numbers {self.low}..{self.high}, expected 0..{rows - 1}")
        if self.bad:
            out.append(f"{self.bad:,} rows with a key, value or timestamp other than written")
        return out


class DataDirRefused(RuntimeError):
    """The data dir is not one the demo may wipe: it holds files the demo did not write."""


def check_data_dir(data_dir: Path) -> None:
    """Raise ``DataDirRefused`` unless ``data_dir`` is the demo's to wipe: absent, an
    empty directory, or one the demo made (``MARKER`` in it). Reads only."""
    if not (data_dir.exists() or data_dir.is_symlink()):
        return
    if not data_dir.is_dir():
        raise DataDirRefused(f"--data-dir {data_dir} is not a directory")
    if not (data_dir / MARKER).is_file() and any(data_dir.iterdir()):
        raise DataDirRefused(
            f"--data-dir {data_dir} is not empty and the demo did not make it (there is no "
            f"{MARKER} in it): not wiping it. Give a new or empty directory")


def prepare_data_dir(data_dir: Path) -> None:
    """Make ``data_dir`` an empty directory of the demo's, marked as such (``MARKER``): a
    new one is made, an empty one taken, one the demo made emptied. Any other is refused
    (``check_data_dir``), untouched: the demo removes nothing it did not write."""
    check_data_dir(data_dir)
    if data_dir.is_dir():
        for entry in data_dir.iterdir():  # the demo's own: its last run's files
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / MARKER).write_text("made by scripts/demo, which empties this directory when "
                                   "it runs here\n")


def data_dir_refused(exc: Exception) -> int:
    """Say why the data dir cannot be used; the exit code (2, as for a usage error)."""
    console.print(f"[red]cannot use the data dir[/red]: {escape(str(exc))}", highlight=False)
    return 2


def progress_bar() -> Progress:
    """A bar with rows done, rows/s and seconds: those of the step, from its start (before
    the query starts) to its end (the query ended), as the summary counts them; not rich's
    elapsed time, which starts with the bar and stops once the rows are all there."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[seconds]}"),
                    console=console)


# ---- the pipeline -----------------------------------------------------------------------


def generate(where: Path, rows: int, batch_rows: int) -> Step:
    """The numbers 0..rows-1 in Parquet files of ``batch_rows`` each: the stream's input,
    written by pyarrow (no Spark job), before Spark starts."""
    t0 = time.monotonic()
    where.mkdir(parents=True)
    files = 0
    for first in range(0, rows, batch_rows):
        numbers = pa.array(range(first, min(rows, first + batch_rows)), pa.int64())
        pq.write_table(pa.table({"n": numbers}), where / f"part-{files:05d}.parquet")
        files += 1
    return Step(f"input: {files} Parquet files", time.monotonic() - t0, rows)


def start_spark(work_dir: Path) -> SparkSession:
    log4j = work_dir / "log4j2.properties"
    log4j.write_text(LOG4J2)
    # The node and Spark talk over loopback; and Spark warns when the hostname resolves to it.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master("local[2]").appName("shardnode-demo")
               .config("spark.driver.extraJavaOptions",
                       f"-Dlog4j.configurationFile={log4j} {JVM_OPTIONS}"))
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def key_of(n: Column) -> Column:
    return F.format_string("user-%d", n % KEYS)


def value_of(n: Column) -> Column:
    return F.format_string("row %012d %s", n, F.sha2(n.cast("string"), 256))


def timestamp_of(n: Column, start_ms: int) -> Column:
    return F.timestamp_millis(F.lit(start_ms) + n)


def generated(spark: SparkSession, where: Path, start_ms: int) -> DataFrame:
    """The input as a stream, a file to a micro-batch: row ``n``'s key, value, timestamp."""
    n = F.col("n")
    return (spark.readStream.schema("n long").option("maxFilesPerTrigger", 1)
            .parquet(str(where))
            .select(key_of(n).alias("key"), value_of(n).alias("value"),
                    timestamp_of(n, start_ms).alias("timestamp")))


def read_checked(spark: SparkSession, endpoint: str, batch_rows: int, start_ms: int) -> DataFrame:
    """The topic as a stream through the source: each row's number (from its value) and
    whether its key, value and timestamp are the ones derived from that number."""
    value = F.col("value").cast("string")
    n = F.substring(value, 5, 12).cast("long")
    good = ((F.col("key").cast("string") == key_of(n)) & (value == value_of(n))
            & (F.col("timestamp") == timestamp_of(n, start_ms)))
    return (spark.readStream.format("shardnode")
            .option("endpoint", endpoint).option("topic", TOPIC)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", batch_rows).load()
            .select(n.alias("n"), F.coalesce(good, F.lit(False)).alias("good")))


def rows_in(c: NodeClient) -> int:
    """The records of the topic: the members' end offsets, all committed and durable."""
    return sum(c.end_offsets(TOPIC))


def input_rows(query: StreamingQuery) -> int:
    return sum(p.numInputRows for p in query.recentProgress)


def query_step(name: str, query: StreamingQuery, seconds: float) -> Step:
    """A query's line of the summary, from its progress reports (one per micro-batch)."""
    done = [p for p in query.recentProgress if p.numInputRows > 0]
    warm_ms = sum(p.durationMs.get("triggerExecution", 0) for p in done[1:])
    warm = sum(p.numInputRows for p in done[1:]) / warm_ms * 1000 if warm_ms else None
    return Step(name, seconds, sum(p.numInputRows for p in done), len(done), warm)


def write(spark: SparkSession, cluster: LocalCluster, spark_dir: Path, rows: int,
          start_ms: int) -> Step:
    """Query 1: the input into the topic through the sink, exactly once; the bar counts
    the rows the cluster has. Once it ends the topic must hold the rows, no more, and no
    member a transaction (the sink's XA branches) still open or prepared."""
    t0 = time.monotonic()
    query = (generated(spark, spark_dir / "input", start_ms).writeStream
             .format("shardnode").queryName("write")
             .option("endpoint", ",".join(cluster.endpoints)).option("topic", TOPIC)
             .option("deliveryGuarantee", "exactly_once")
             .option("checkpointLocation", str(spark_dir / "write-checkpoint"))
             .trigger(availableNow=True).start())
    try:
        with cluster.client() as c:
            seconds = follow(query, "write", lambda: rows_in(c), rows, t0)
            have = rows_in(c)
        left = []  # the sink's XA branches, on every member: every one committed, none in doubt
        for node in cluster.nodes.values():
            with node.client() as c:
                left += c.txn_list()
    finally:
        query.stop()
    if have != rows:
        raise DemoFailed(f"the topic has {have:,} rows after the write, not {rows:,}")
    if left:
        raise DemoFailed(f"{len(left)} transactions still open or prepared after the write: "
                         f"{left[:3]}")
    return query_step("write → shardnode", query, seconds)


def read_back(spark: SparkSession, cluster: LocalCluster, spark_dir: Path, rows: int,
              batch_rows: int, start_ms: int) -> Step:
    """Query 2: the topic through the source, checked row by row, into Parquet files
    (``spark_dir/readback``) for the check; the bar counts the rows read."""
    t0 = time.monotonic()
    query = (read_checked(spark, ",".join(cluster.endpoints), batch_rows, start_ms).writeStream
             .format("parquet").queryName("read")
             .option("path", str(spark_dir / "readback"))
             .option("checkpointLocation", str(spark_dir / "read-checkpoint"))
             .trigger(availableNow=True).start())
    try:
        seconds = follow(query, "read ", lambda: input_rows(query), rows, t0)
    finally:
        query.stop()
    return query_step("read ← shardnode", query, seconds)


def ended_within(query: StreamingQuery, seconds: float) -> bool:
    """Wait for the query to end, at most ``seconds``. PySpark types the timeout as int,
    but takes a float (it waits ``int(timeout * 1000)`` ms)."""
    return bool(query.awaitTermination(seconds))  # type: ignore[arg-type]


def follow(query: StreamingQuery, label: str, count: Callable[[], int], rows: int,
           t0: float) -> float:
    """Show ``count()`` (rows so far) of ``rows`` in a bar until the query ends; return the
    seconds from ``t0`` to its end. Raise if the query fails, or adds no row for
    ``STALL_S_MAX``."""
    have, last_change = 0, time.monotonic()
    with progress_bar() as bar:
        task: TaskID = bar.add_task(label, total=rows, rate="", seconds="")
        while True:
            try:
                ended = ended_within(query, POLL_S)
            except StreamingQueryException as exc:
                raise DemoFailed(f"query {query.name!r} failed: {exc}") from exc
            now = count()
            if now != have:
                have, last_change = now, time.monotonic()
            elapsed = time.monotonic() - t0
            bar.update(task, completed=min(have, rows), rate=f"{have / elapsed:,.0f} rows/s",
                       seconds=f"{elapsed:.1f} s")
            if ended:
                return elapsed
            if time.monotonic() - last_change > STALL_S_MAX:
                raise DemoFailed(f"query {query.name!r}: no new row in {STALL_S_MAX:.0f} s, "
                                 f"{have:,} of {rows:,}")


def check(spark: SparkSession, readback: Path) -> Check:
    """Exactly once, in Spark SQL, over the rows read back."""
    spark.read.parquet(str(readback)).createOrReplaceTempView("readback")
    r = spark.sql("SELECT count(*) AS count, count(DISTINCT n) AS distinct, min(n) AS low, "
                  "max(n) AS high, count_if(NOT good) AS bad FROM readback").first()
    assert r is not None  # an aggregate without GROUP BY has one row
    return Check(int(r["count"]), int(r["distinct"]), r["low"], r["high"], int(r["bad"]))


def summary(steps: list[Step], total_s: float, rows: int, partitions: int) -> Table:
    t = Table(title=f"shardnode demo: {rows:,} rows through Spark into {partitions} "
                    f"partitions and back", title_justify="left")
    t.caption = "warm: after the first batch, which pays for starting Spark's Python workers"
    t.caption_justify = "left"
    for col in ("", "rows", "rows/s", "batches", "warm rows/s", "seconds"):
        t.add_column(col, justify="left" if not col else "right")
    for s in steps:
        t.add_row(s.name, "" if s.rows is None else f"{s.rows:,}", s.per_s,
                  "" if s.batches is None else f"{s.batches}",
                  "" if s.warm_per_s is None else f"{s.warm_per_s:,.0f}", f"{s.seconds:.1f}")
    t.add_row("total", "", "", "", "", f"{total_s:.1f}", style="bold")
    return t


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    p = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="rows to write (default 200 000)")
    p.add_argument("--nodes", type=int, default=3, help="members of the cluster (default 3)")
    p.add_argument("--port", type=int, default=7400,
                   help="member 1's client port; the others' follow it (default 7400)")
    p.add_argument("--partitions", type=int, default=4, help="the topic's (default 4)")
    p.add_argument("--batch-rows", type=int, default=50_000,
                   help="rows per micro-batch of each query (default 50 000)")
    p.add_argument("--data-dir", type=Path, default=ROOT / "var" / "demo",
                   help="the members' data, the input and Spark's checkpoints; wiped first "
                        "if the demo made it, refused if it holds other files (default "
                        "var/demo in the repository)")
    a = p.parse_args(argv)
    a.data_dir = a.data_dir.absolute()  # relative: to the directory the demo is run in
    if a.rows < 1 or a.partitions < 1 or a.batch_rows < 1 or not 1 <= a.nodes <= 16:
        p.error("need --rows, --partitions and --batch-rows >= 1, and --nodes 1-16")
    if -(-a.rows // a.batch_rows) > BATCHES_MAX:
        p.error(f"--rows / --batch-rows must be at most {BATCHES_MAX:,} micro-batches")
    try:
        check_data_dir(a.data_dir)  # before anything else: a refusal is told at once
    except DataDirRefused as exc:
        return data_dir_refused(exc)
    busy = [port for port in range(a.port, a.port + a.nodes) if port_in_use("127.0.0.1", port)]
    if busy:
        console.print(f"[red]port {busy[0]} is in use[/red] (another node?): pass --port N")
        return 2
    t_start = time.monotonic()
    try:
        prepare_data_dir(a.data_dir)
    except (DataDirRefused, OSError) as exc:  # changed since the check, or not writable
        return data_dir_refused(exc)
    spark_dir = a.data_dir / "spark"
    cluster = LocalCluster(a.data_dir / "cluster", a.nodes, base_port=a.port)
    steps: list[Step] = []
    spark: SparkSession | None = None
    console.print(f"starting a cluster of {a.nodes} on {', '.join(cluster.endpoints)}, data in "
                  f"{a.data_dir}")
    t0 = time.monotonic()
    cluster.start()
    try:
        with cluster.client() as c:
            c.create_topic(TOPIC, partitions=a.partitions)
            owners = c.owners(TOPIC) if a.nodes > 1 else ()
        steps.append(Step(f"cluster start ({a.nodes})", time.monotonic() - t0))
        steps.append(generate(spark_dir / "input", a.rows, a.batch_rows))
        with console.status("starting Spark (local[2])"):
            t0 = time.monotonic()
            spark = start_spark(a.data_dir)
            steps.append(Step("Spark start", time.monotonic() - t0))
        start_ms = int(time.time() * 1000)
        steps.append(write(spark, cluster, spark_dir, a.rows, start_ms))
        steps.append(read_back(spark, cluster, spark_dir, a.rows, a.batch_rows, start_ms))
        with console.status("checking in Spark SQL"):
            t0 = time.monotonic()
            result = check(spark, spark_dir / "readback")
            steps.append(Step("check (Spark SQL)", time.monotonic() - t0))
    except DemoFailed as exc:
        console.print(f"[red]FAILED[/red]: {exc}", highlight=False)
        return 1
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
    console.print(summary(steps, time.monotonic() - t_start, a.rows, a.partitions))
    failures = result.failures(a.rows)
    if failures:
        console.print("[red]FAILED[/red]: " + "; ".join(failures), highlight=False)
        return 1
    placed = (f"; partitions on members {list(owners)}" if owners else "")
    console.print(f"[green]OK[/green]: each of the {a.rows:,} rows read back exactly once, "
                  f"with the key, value and timestamp written{placed}; cluster stopped, its "
                  f"logs in {cluster.root}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
