"""A Spark driver in a process of its own, for the tests that SIGKILL it (tests/test_spark.py).

    python tests/spark_driver.py sink ENDPOINT TOPIC INPUT_DIR CHECKPOINT
        Parquet files of INPUT_DIR (one per micro-batch) through the shardnode sink into TOPIC,
        until every file is written (Trigger.AvailableNow).
    python tests/spark_driver.py source ENDPOINT TOPIC OUT_DIR CHECKPOINT follow|finish
        TOPIC through the shardnode source, 1000 records a batch; each batch's rows, in the
        order read, to OUT_DIR/<batch id>.json (a replayed batch writes its file again).
        ``follow`` runs until killed; ``finish`` reads what there is and exits.

Prints ``started`` once its query runs. The tests run the same queries (``sink_query``,
``source_query``) in their own session to finish what a killed driver began.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from node.spark import register

SCHEMA = "key string, value string"


def session() -> SparkSession:
    spark = (SparkSession.builder.master("local[2,4]").appName("shardnode-test-driver")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")  # as the tests
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def sink_query(spark: SparkSession, endpoint: str, topic: str, inputs: str,
               checkpoint: str) -> StreamingQuery:
    """Every Parquet file of ``inputs`` (one a micro-batch) through the sink into ``topic``."""
    return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(inputs)
            .repartition(2)
            .writeStream.format("shardnode").option("endpoint", endpoint).option("topic", topic)
            .option("requestTimeoutMs", "5000")
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def source_query(spark: SparkSession, endpoint: str, topic: str, out: str, checkpoint: str,
                 mode: str) -> StreamingQuery:
    """``topic`` through the source, each batch's rows to ``out/<batch id>.json``:
    ``follow`` runs until stopped, ``finish`` stops once it has read what there is."""

    def keep(df: DataFrame, batch_id: int) -> None:
        rows: list[Any] = [[r.partition, r.offset, r.value.decode()] for r in df.collect()]
        tmp = Path(out) / f".{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, Path(out) / f"{batch_id}.json")

    reader = (spark.readStream.format("shardnode").option("endpoint", endpoint)
              .option("topic", topic).option("maxRecordsPerTrigger", "1000").load())
    writer = reader.writeStream.foreachBatch(keep).option("checkpointLocation", checkpoint)
    if mode == "finish":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="100 milliseconds")
    return writer.start()


def main(what: str, *args: str) -> None:
    spark = session()
    q = sink_query(spark, *args) if what == "sink" else source_query(spark, *args)
    print("started", flush=True)
    q.awaitTermination(600)  # the test kills it sooner, or waits for it with a timeout


if __name__ == "__main__":
    main(*sys.argv[1:])
