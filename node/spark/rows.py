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
    """Milliseconds since the epoch (a timestamp without a time zone is taken as UTC)."""
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ms", tz=column.type.tz), safe=False)
        column = column.cast(pa.int64())
    if len(column) and (pc.min(column).as_py() or 0) < 0:
        raise ValueError("a 'timestamp' is before 1970: the node keeps milliseconds since the "
                         "epoch, from 0")
    return list(column.to_pylist())


def _lengths(column: pa.Array) -> pa.Array:
    return pc.fill_null(pc.binary_length(column), 0)


RECORD_OVERHEAD_BYTES = 16  # a record's msgpack headers, its tags and timestamp (an estimate)

Request = tuple[str, int | None, list[Any]]  # topic, partition (None: the node picks), records


def requests_of(batch: pa.RecordBatch, topic_option: str | None, records_max: int,
                bytes_max: int) -> Iterator[Request]:
    """The batch's rows as wire records (``wire/records.py``), in requests of at most
    ``records_max`` records and about ``bytes_max`` bytes, per topic and partition when the
    batch has those columns. The ``topic`` option, when given, wins over the column."""
    names = batch.schema.names
    values = _binary(batch.column(names.index("value")))
    if values.null_count:
        raise ValueError(f"{values.null_count} rows have a null 'value'; every record needs one")
    vals: list[Any] = values.to_pylist()
    n = len(vals)
    sizes = pc.add(_lengths(values), RECORD_OVERHEAD_BYTES)
    keys: list[Any] = [None] * n
    if "key" in names:
        key_col = _binary(batch.column(names.index("key")))
        keys = key_col.to_pylist()
        sizes = pc.add(sizes, _lengths(key_col))
    if "tags" in names or "timestamp" in names:
        tags: list[Any] = [None] * n
        if "tags" in names:
            tag_col = batch.column(names.index("tags"))
            if pc.list_flatten(tag_col).null_count:
                raise ValueError("a 'tags' array holds a null; tags are strings")
            tags = tag_col.to_pylist()
        stamps = (_millis(batch.column(names.index("timestamp"))) if "timestamp" in names
                  else [None] * n)
        vals = [v if k is None and not t and s is None else [v, k, t or [], s]
                for v, k, t, s in zip(vals, keys, tags, stamps, strict=True)]
    elif "key" in names:
        vals = [v if k is None else [v, k, [], None] for v, k in zip(vals, keys, strict=True)]
    # Only when a request of records_max of the largest rows could pass bytes_max are the
    # rows' sizes needed one by one.
    big = n and (pc.max(sizes).as_py() or 0) * records_max > bytes_max
    row_sizes: list[int] | None = sizes.to_pylist() if big else None
    by_topic = "topic" in names and topic_option is None
    if not by_topic and "partition" not in names:
        yield from _cut(topic_option or "", None, vals, row_sizes, records_max, bytes_max)
        return
    if by_topic:
        topic_col = batch.column(names.index("topic"))
        if topic_col.null_count:
            raise ValueError(f"{topic_col.null_count} rows have a null 'topic', and there is no "
                             f"'topic' option")
        topics: list[Any] = topic_col.to_pylist()
    else:
        topics = [topic_option] * n
    parts = (batch.column(names.index("partition")).to_pylist() if "partition" in names
             else [None] * n)
    groups: dict[tuple[str, int | None], tuple[list[Any], list[int]]] = {}
    for i, (t, p, rec) in enumerate(zip(topics, parts, vals, strict=True)):
        recs, idx = groups.setdefault((t, p), ([], []))
        recs.append(rec)
        idx.append(i)
    for (t, p), (recs, idx) in groups.items():
        yield from _cut(t, p, recs, None if row_sizes is None else [row_sizes[i] for i in idx],
                        records_max, bytes_max)


def _cut(topic: str, partition: int | None, records: list[Any], sizes: list[int] | None,
         records_max: int, bytes_max: int) -> Iterator[Request]:
    if sizes is None:
        for i in range(0, len(records), records_max):
            yield topic, partition, records[i:i + records_max]
        return
    first, total = 0, 0
    for i, size in enumerate(sizes):
        if i > first and (i - first == records_max or total + size > bytes_max):
            yield topic, partition, records[first:i]
            first, total = i, 0
        total += size
    if first < len(records):
        yield topic, partition, records[first:]


def batch_of(topic: str, partition: int, rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """An Arrow batch of the source's schema from a read reply's rows
    (``[offset, timestamp_ms, key, tags, value]``)."""
    offsets, stamps, keys, tags, values = zip(*rows, strict=True)
    n = len(offsets)
    return pa.RecordBatch.from_arrays([
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array(offsets, pa.int64()),
        # ms → µs in Arrow, not per row in Python (a third of the function's time)
        pc.multiply(pa.array(stamps, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(tags, pa.list_(pa.string())),
    ], schema=SOURCE_ARROW)
