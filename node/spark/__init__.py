"""Spark reads and writes the node through the PySpark data source ``shardnode``.

    from node.spark import register
    register(spark)
    (df.writeStream.format("shardnode")
       .option("endpoint", "tcp://127.0.0.1:7400").option("topic", "events")
       .option("checkpointLocation", "/tmp/ckpt").start())
    events = (spark.readStream.format("shardnode")
       .option("endpoint", "tcp://127.0.0.1:7400").option("topic", "events").load())

The option ``endpoint`` names one node, or a cluster: some or all of its members,
comma-separated (``nodes.py``); each request then goes to the member owning its partition.
The sink (``node/spark/sink.py``) writes exactly once by default, staging each task's rows
in XA branches of the node, one on each member it writes to, that the driver commits with
the batch; the source (``node/spark/source.py``) reads committed records by offset. The topic must
exist (``shardnode create-topic``): as a query starts, on the driver, the data source checks
that it does and that the node answers (``nodes.check_start``), and refuses an option it
does not take. Options:
``options.py``; rows to records and back, and to their partitions' owners: ``rows.py``. Needs the
``spark`` extra (pyspark, pyarrow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from node.spark.nodes import check_start
from node.spark.options import EXACTLY_ONCE, OptionError, SinkOptions, SourceOptions
from node.spark.rows import SOURCE_SCHEMA, check_input, check_schema
from node.spark.sink import BatchWriter, StreamWriter
from node.spark.source import BatchReader, StreamReader

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ShardnodeDataSource", "register"]


class ShardnodeDataSource(DataSource):
    """The data source ``shardnode``: a sink and a source, streaming and batch."""

    @classmethod
    def name(cls) -> str:
        return "shardnode"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    # PySpark makes the writer or reader on the driver as the query starts (and a stream's
    # writer again for each batch's commit or abort): its options, input columns, node and
    # topic are checked there, so that none of them fails every task instead.

    def _sink(self, schema: StructType) -> SinkOptions:
        opts = SinkOptions.parse(self.options)
        check_input(schema, opts.topic)
        check_start(opts.endpoints, opts.request_timeout_ms, opts.topic,  # None: a column's
                    staged=opts.guarantee == EXACTLY_ONCE)
        return opts

    def _source(self, streaming: bool) -> SourceOptions:
        opts = SourceOptions.parse(self.options, streaming)
        check_start(opts.endpoints, opts.request_timeout_ms, opts.topic)
        return opts

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            # A topic is a log: taken as an append, an overwrite left every record before it.
            raise OptionError("the shardnode sink appends to a topic; mode('overwrite') is "
                              "not supported (use mode('append'), or delete and create the "
                              "topic first)")
        opts = self._sink(schema)
        if opts.sink_id:
            # Taken and ignored, a df.write in foreachBatch looked idempotent: it is not (a
            # batch write has a sink id of its own, and is never replayed).
            raise OptionError("option 'sinkId' is for streaming queries (writeStream); a "
                              "batch write (df.write) stages under a sink id of its own")
        return BatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StreamWriter(self._sink(schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        check_schema(schema)
        return BatchReader(self._source(streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        check_schema(schema)
        return StreamReader(self._source(streaming=True))


def register(spark: SparkSession) -> None:
    """Make ``format("shardnode")`` known to this session."""
    spark.dataSource.register(ShardnodeDataSource)
