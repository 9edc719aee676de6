"""Spark's rows as the node's records and back, a whole Arrow batch at a time.

The sink takes Arrow record batches (``DataSourceStreamArrowWriter``) and turns each column
into a Python list in one call; the only work per row is building the record's array when
it has more than a value (``wire/records.py``). The source builds Arrow batches from the
rows of a read reply the same way, one column at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from node.spark.options import OptionError

# The sink's input columns: the types each may have. Only ``value`` is required.
INPUT_COLUMNS: dict[str, tuple[type[DataType], ...]] = {
    "value": (BinaryType, StringType),
    "key": (BinaryType, StringType),
    "partition": (IntegerType, LongType, ShortType),
    "timestamp": (TimestampType, TimestampNTZType, LongType),
    "tags": (ArrayType,),
    "topic": (StringType,),
}

SOURCE_SCHEMA = ("topic string, partition int, offset long, timestamp timestamp, key binary, "
                 "value binary, tags array<string>")
SOURCE_ARROW = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.binary()), ("value", pa.binary()),
    ("tags", pa.list_(pa.string())),
])


def check_input(schema: StructType, topic_option: str | None) -> None:
    """Refuse a DataFrame the sink cannot write, naming the column (at the query's start)."""
    by_name = {f.name: f for f in schema.fields}
    if "value" not in by_name:
        raise OptionError(f"the shardnode sink needs a 'value' column (binary or string); the "
                          f"input has {sorted(by_name)}")
    for name, field in by_name.items():
        types = INPUT_COLUMNS.get(name)
        if types is None:
            raise OptionError(f"column {name!r} is not one the shardnode sink writes: it takes "
                              f"{sorted(INPUT_COLUMNS)} (select or drop the others)")
        ok = isinstance(field.dataType, types)
        if name == "tags":
            ok = ok and isinstance(field.dataType.elementType, StringType)  # type: ignore[attr-defined]
        if not ok:
            raise OptionError(f"column {name!r} has type {field.dataType.simpleString()}; the "
                              f"shardnode sink takes {' or '.join(t.typeName() for t in types)}"
                              + (" of string" if name == "tags" else ""))
    if topic_option is None and "topic" not in by_name:
        raise OptionError("the shardnode sink needs a 'topic' option or a 'topic' column")


def _binary(column: pa.Array) -> pa.Array:
    return column.cast(pa.binary()) if pa.types.is_string(column.type) or \
        pa.types.is_large_string(column.type) else column


def _millis(column: pa.Array) -> list[Any]:
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ms", tz=column.type.tz), safe=False)
        column = column.cast(pa.int64())
    return list(column.to_pylist())


Group = tuple[str | None, int | None, list[Any]]  # topic (None: the option's), partition, records


def records_of(batch: pa.RecordBatch) -> Iterator[Group]:
    """The batch's rows as wire records (``wire/records.py``), grouped by topic and partition
    when the batch has those columns (None where it has not: the node picks)."""
    names = batch.schema.names
    values = _binary(batch.column(names.index("value")))
    if values.null_count:
        raise ValueError(f"{values.null_count} rows have a null 'value'; every record needs one")
    vals: list[Any] = values.to_pylist()
    extra = [n for n in ("key", "tags", "timestamp") if n in names]
    if extra:
        keys = (_binary(batch.column(names.index("key"))).to_pylist() if "key" in names
                else [None] * len(vals))
        tags = (batch.column(names.index("tags")).to_pylist() if "tags" in names
                else [None] * len(vals))
        stamps = (_millis(batch.column(names.index("timestamp"))) if "timestamp" in names
                  else [None] * len(vals))
        vals = [v if k is None and not t and s is None else [v, k, t or [], s]
                for v, k, t, s in zip(vals, keys, tags, stamps, strict=True)]
    if "topic" not in names and "partition" not in names:
        yield None, None, vals
        return
    topics = (batch.column(names.index("topic")).to_pylist() if "topic" in names
              else [None] * len(vals))
    parts = (batch.column(names.index("partition")).to_pylist() if "partition" in names
             else [None] * len(vals))
    groups: dict[tuple[str | None, int | None], list[Any]] = {}
    for t, p, rec in zip(topics, parts, vals, strict=True):
        groups.setdefault((t, p), []).append(rec)
    for (t, p), recs in groups.items():
        yield t, p, recs


def chunks(records: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(records), size):
        yield records[i:i + size]


def batch_of(topic: str, partition: int, rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """An Arrow batch of the source's schema from a read reply's rows
    (``[offset, timestamp_ms, key, tags, value]``)."""
    offsets, stamps, keys, tags, values = (list(c) for c in zip(*rows, strict=True))
    n = len(offsets)
    return pa.RecordBatch.from_arrays([
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array([None if s is None else s * 1000 for s in stamps], pa.timestamp("us", tz="UTC")),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(tags, pa.list_(pa.string())),
    ], schema=SOURCE_ARROW)
