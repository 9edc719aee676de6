"""Spark's rows as the node's records and back, a whole Arrow batch at a time.

The sink takes Arrow record batches (``DataSourceStreamArrowWriter``) and turns each column
into a Python list in one call; the only work per row is building the record's array when
it has more than a value (``wire/records.py``), and in a cluster the crc32 of a key that
names no partition (``zlib.crc32`` mapped over the column: no Python code per row). Rows
are grouped by topic and partition with Arrow compute, a column at a time. The
source builds Arrow batches from the rows of a read reply the same way.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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

from node.spark.nodes import SINGLE
from node.spark.options import REQUEST_BYTES_MAX, OptionError
from wire.errors import ErrorCode, error_for
from wire.records import TIMESTAMP_MAX

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
# A read reply's row, ``[offset, timestamp_ms, key, tags, value]``, as Arrow reads it.
READ_ROW = pa.struct([("offset", pa.int64()), ("timestamp_ms", pa.int64()),
                      ("key", pa.binary()), ("tags", pa.list_(pa.string())),
                      ("value", pa.binary())])


# The source's schema as Spark writes a StructType's fields (``simpleString``).
SOURCE_FIELDS = [("topic", "string"), ("partition", "int"), ("offset", "bigint"),
                 ("timestamp", "timestamp"), ("key", "binary"), ("value", "binary"),
                 ("tags", "array<string>")]


def check_schema(schema: StructType) -> None:
    """Refuse a schema given to the source (``spark.read.schema(...)``) other than its own:
    each task would fail on it, as a mismatch of the rows it returns."""
    given = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    if given != SOURCE_FIELDS:
        shown = ", ".join(f"{name} {kind}" for name, kind in given)
        raise OptionError(f"the shardnode source has the schema {SOURCE_SCHEMA!r}; do not "
                          f"give it one (it was given {shown!r}): select or cast the "
                          f"columns after load()")


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
    if len(column) and (pc.max(column).as_py() or 0) > TIMESTAMP_MAX:
        raise ValueError(f"a 'timestamp' is after 9999-12-31: the node keeps milliseconds "
                         f"since the epoch up to {TIMESTAMP_MAX}")
    return list(column.to_pylist())


def _lengths(column: pa.Array) -> pa.Array:
    return pc.fill_null(pc.binary_length(column), 0)


RECORD_OVERHEAD_BYTES = 16  # a record's msgpack headers, its tags and timestamp (an estimate)

# A request: the member it goes to (``SINGLE`` for a single node), topic, partition (None:
# the member places the records, by key, else round-robin), the records.
Request = tuple[int, str, int | None, list[Any]]


@dataclass(slots=True)
class Routing:
    """Where a cluster's rows go: ``owners(topic)`` is the member owning each partition of
    the topic. Keyless rows that name no partition take the partitions in turn, a request
    at a time, from ``turn`` on (a task starts at a random one, so tasks spread)."""

    owners: Callable[[str], Sequence[int]]
    turn: int = 0

    def next_partition(self, partitions: int) -> int:
        p = self.turn % partitions
        self.turn += 1
        return p


def requests_of(batch: pa.RecordBatch, topic_option: str | None, records_max: int,
                bytes_max: int, routing: Routing | None = None) -> Iterator[Request]:
    """The batch's rows as wire records (``wire/records.py``), in requests of at most
    ``records_max`` records and about ``bytes_max`` bytes, per topic and partition when the
    batch has those columns. The ``topic`` option, when given, wins over the column.

    With ``routing`` (a cluster) each request names a partition and goes to its owner: a
    row's named partition, else its key's (``crc32(key) % partitions``, as
    ``actors.roles.key_partition``), else, for a keyless row, the partition of its
    request's turn. The rows are grouped a column at a time (Arrow compute), in their order
    within each group."""
    if batch.num_rows == 0:
        return
    names = batch.schema.names
    if "topic" in names and topic_option is None:
        topic_col = batch.column(names.index("topic"))
        if topic_col.null_count:
            raise ValueError(f"{topic_col.null_count} rows have a null 'topic', and there is no "
                             f"'topic' option")
        topics: list[tuple[Any, pa.RecordBatch]] = _groups(batch, topic_col)
    else:
        topics = [(topic_option or "", batch)]
    for topic, rows in topics:
        owners = None if routing is None else tuple(routing.owners(topic))
        for member, partition, group in _placed(topic, rows, owners):
            records, sizes = _records(group, records_max, bytes_max)
            for chunk in _cut(records, sizes, records_max, bytes_max):
                if member is not None:
                    yield member, topic, partition, chunk
                    continue
                assert owners is not None and routing is not None  # keyless, spread
                p = routing.next_partition(len(owners))
                yield owners[p], topic, p, chunk


def _groups(batch: pa.RecordBatch, key: pa.Array) -> list[tuple[Any, pa.RecordBatch]]:
    """The batch's rows grouped by ``key`` (a column of it, or one computed), each group's
    rows in their order: a stable sort, then a slice per value (null last)."""
    if key.null_count == len(key) or pc.count_distinct(key, mode="all").as_py() == 1:
        return [(key[0].as_py(), batch)]
    order = pc.sort_indices(key)
    rows, keys = batch.take(order), key.take(order)
    out, first = [], 0
    counts = pc.value_counts(keys)  # in order of appearance: sorted
    for value, count in zip(counts.field("values").to_pylist(),
                            counts.field("counts").to_pylist(), strict=True):
        out.append((value, rows.slice(first, count)))
        first += count
    return out


def _placed(topic: str, rows: pa.RecordBatch, owners: tuple[int, ...] | None
            ) -> Iterator[tuple[int | None, int | None, pa.RecordBatch]]:
    """One topic's rows in groups of one request's kind: (member, partition, rows); member
    None for keyless rows, spread over the partitions a request at a time."""
    names = rows.schema.names
    parts = (pc.cast(rows.column(names.index("partition")), pa.int64())
             if "partition" in names else None)
    if parts is not None and parts.null_count < len(parts):
        low = pc.min(parts).as_py()
        if low < 0:  # (one past the last is the node's to refuse: it knows how many)
            raise error_for(ErrorCode.UNKNOWN_PARTITION, f"topic {topic!r} has no partition "
                            f"{low}: partitions count from 0")
    if owners is None or len(set(owners)) == 1:  # one node has every partition
        member = SINGLE if owners is None else owners[0]
        if parts is None:
            yield member, None, rows
            return
        for p, group in _groups(rows, parts):
            yield member, p, group
        return
    n = len(owners)
    if parts is not None and parts.null_count < len(parts):
        low, high = pc.min_max(parts).values()
        if low.as_py() < 0 or high.as_py() >= n:
            bad = low.as_py() if low.as_py() < 0 else high.as_py()
            raise error_for(ErrorCode.UNKNOWN_PARTITION, f"topic {topic!r} has partitions "
                            f"0..{n - 1}, not {bad}")
    # The partition of each row: the one it names, its key's for a keyed row, null for a
    # keyless one (spread). A keyed row's partition is named in its request too: a member
    # given keyed records without one checks only partition 0 for a transaction
    # (``actors/front_cluster.py``, ``ClusterDoor.route``) and refuses a request of keys all
    # in one partition of its own as CROSS_NODE when another member owns partition 0.
    slots = parts if parts is not None else pa.nulls(rows.num_rows, pa.int64())
    if "key" in names:
        keys = _binary(rows.column(names.index("key")))
        keyed = pc.and_(keys.is_valid(), slots.is_null())
        if pc.any(keyed).as_py():
            # crc32 per key in C (map of zlib.crc32), the rest a column at a time
            crcs = pa.array(map(zlib.crc32, pc.fill_null(keys, b"").to_pylist()), pa.int64())
            slots = pc.if_else(keyed, pc.modulo(crcs, n), slots)
    for slot, group in _groups(rows, slots):
        if slot is None:
            yield None, None, group
        else:
            yield owners[slot], slot, group


def _records(batch: pa.RecordBatch, records_max: int, bytes_max: int
             ) -> tuple[list[Any], list[int] | None]:
    """The rows as wire records, and their sizes when they are needed to cut requests by
    bytes (only when a request of ``records_max`` of the largest rows could pass
    ``bytes_max``)."""
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
    largest = (pc.max(sizes).as_py() or 0) if n else 0
    if largest > REQUEST_BYTES_MAX:
        # Sent alone it would pass the node's frame limit, which drops the connection: the
        # task's requests would time out, blaming the node.
        at = pc.index(sizes, largest).as_py()
        raise ValueError(f"row {at} of this batch takes {largest} bytes, more than a request "
                         f"to the node carries ({REQUEST_BYTES_MAX}, under its frame limit); "
                         f"the node takes values up to its limits.value_bytes_max")
    big = largest * records_max > bytes_max
    return vals, (sizes.to_pylist() if big else None)


def _cut(records: list[Any], sizes: list[int] | None, records_max: int, bytes_max: int
         ) -> Iterator[list[Any]]:
    if sizes is None:
        for i in range(0, len(records), records_max):
            yield records[i:i + records_max]
        return
    first, total = 0, 0
    for i, size in enumerate(sizes):
        if i > first and (i - first == records_max or total + size > bytes_max):
            yield records[first:i]
            first, total = i, 0
        total += size
    if first < len(records):
        yield records[first:]


def batch_of(topic: str, partition: int, rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """An Arrow batch of the source's schema from a read reply's rows
    (``[offset, timestamp_ms, key, tags, value]``): Arrow reads the rows as structs and
    splits them into columns (250-340 ns a row of 100 bytes, measured, where transposing
    them in Python first took 660-780)."""
    offsets, stamps, keys, tags, values = pa.array(rows, READ_ROW).flatten()
    n = len(offsets)
    try:
        micros = pc.multiply_checked(stamps, 1000)  # ms → µs in Arrow, not per row in Python
    except pa.ArrowInvalid:  # a record written before the node bounded timestamps
        raise ValueError(f"{topic}/{partition}: a record's timestamp is past 9999-12-31 (ms "
                         f"over {TIMESTAMP_MAX}), which Spark cannot hold") from None
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets,
        micros.cast(pa.timestamp("us", tz="UTC")),
        keys,
        values,
        tags,
    ], schema=SOURCE_ARROW)
