"""The ``shardnode`` source: a topic read as a stream (or a batch) of Spark rows.

Spark's offsets are the node's: ``{"<partition>": <next offset>}``, kept in the query's
checkpoint. Each micro-batch reads, per partition, the offsets from where the last one
ended up to the end the node answered (``end_offsets``: every record below it is durable
and readable), bounded by ``maxRecordsPerTrigger``. Only committed records have offsets, so
only they are read; a restart from the checkpoint reads on from its offsets, nothing
skipped and nothing twice. With ``groupId`` the source also commits each finished batch's
offsets as the node's consumer-group offsets (``shardnode`` shows them). From a cluster,
each split reads its partition from the partition's owner, and each group offset is
committed there; the end offsets are the cluster's, gathered by a member.

Offsets a read finds gone: records deleted one by one (``delete_by_key``,
``delete_by_offset``) are gaps the read passes over, as a reader of the node does; records
retention deleted before the query read them (a read below the earliest offset kept) are
data lost, which fails the query (``DataLost``) unless ``failOnDataLoss`` is false, as
Spark's Kafka source does. ``startingOffsets`` ``earliest`` is the earliest offset each
partition keeps.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from node.spark.nodes import Nodes
from node.spark.options import OptionError, SourceOptions
from node.spark.rows import batch_of
from wire.errors import OffsetOutOfRange

log = logging.getLogger("shardnode")

Offsets = dict[str, int]  # Spark's offset: partition (as a string: JSON) → next offset


class DataLost(RuntimeError):
    """Records a query was to read were deleted by retention before it read them."""


@dataclass
class Split(InputPartition):
    """One Spark input partition: offsets ``[start, end)`` of one node partition."""

    topic: str
    partition: int
    start: int
    end: int


def _nodes(opts: SourceOptions) -> Nodes:
    """The node, or the cluster (a client routed by its map: each partition's reads and
    group offsets go to its owner)."""
    return Nodes(opts.endpoints, opts.request_timeout_ms)


def _ends(opts: SourceOptions) -> Offsets:
    with _nodes(opts) as nodes:  # a cluster's member gathers them from every owner
        return {str(p): end for p, end in enumerate(nodes.client.end_offsets(opts.topic))}


def _earliest(opts: SourceOptions, ends: Offsets) -> Offsets:
    """The earliest offset each partition keeps: 0, or where retention (or a memory topic's
    bound) left it, which a read below it names."""
    out = dict.fromkeys(ends, 0)
    with _nodes(opts) as nodes:
        for p, end in ends.items():
            if end:
                try:
                    nodes.client.read(opts.topic, int(p), 0, 1)
                except OffsetOutOfRange as exc:
                    out[p] = min(exc.earliest, end)
    return out


def _start(opts: SourceOptions, ends: Offsets) -> Offsets:
    """Where a query starts: ``startingOffsets`` against the topic's ends, and the earliest
    offsets it keeps."""
    earliest = None if opts.starting == "latest" else _earliest(opts, ends)
    return _resolve(opts.starting, ends, "startingOffsets", earliest)


def _resolve(spec: dict[int, int] | str, ends: Offsets, name: str,
             earliest: Offsets | None = None) -> Offsets:
    """``earliest`` / ``latest`` / JSON offsets against the topic's current ends, and (for
    ``earliest``, and partitions a JSON start leaves out) the earliest offsets it keeps."""
    firsts = earliest if earliest is not None else dict.fromkeys(ends, 0)
    if spec == "earliest":
        return dict(firsts)
    if spec == "latest":
        return dict(ends)
    assert isinstance(spec, dict)
    unknown = sorted(p for p in spec if str(p) not in ends)
    if unknown:
        raise OptionError(f"option {name!r} names partitions {unknown}; the topic has "
                          f"0..{len(ends) - 1}")
    # Partitions a JSON spec leaves out start at the earliest and end at the latest.
    out = dict(firsts) if name == "startingOffsets" else dict(ends)
    for p, off in spec.items():
        if off > ends[str(p)]:
            raise OptionError(f"option {name!r}: offset {off} of partition {p} is past its "
                              f"end, {ends[str(p)]}")
        out[str(p)] = off
    return out


def bounded(start: Offsets, ends: Offsets, records_max: int) -> Offsets:
    """Ends at most ``records_max`` records past ``start`` in all, shared out evenly among
    the partitions that have records (what one leaves unused goes to the others; a share
    smaller than one record each goes to the partitions furthest behind)."""
    want = {p: max(0, ends[p] - start.get(p, 0)) for p in ends}
    give = dict.fromkeys(ends, 0)
    left = records_max
    hungry = [p for p in ends if want[p] > 0]
    while left > 0 and hungry:
        if left < len(hungry):
            hungry.sort(key=lambda p: (give[p] - want[p], int(p)))
            for p in hungry[:left]:
                give[p] += 1
            break
        share = left // len(hungry)
        for p in list(hungry):
            take = min(share, want[p] - give[p])
            give[p] += take
            left -= take
            if give[p] == want[p]:
                hungry.remove(p)
    return {p: start.get(p, 0) + give[p] for p in ends}


def splits(opts: SourceOptions, start: Offsets, end: Offsets) -> list[Split]:
    """One split per partition with records, cut where a range is over
    ``maxRecordsPerPartition``."""
    out = []
    for p, stop in sorted(end.items(), key=lambda kv: int(kv[0])):
        first = start.get(p, 0)
        while first < stop:
            last = min(stop, first + opts.records_per_split_max)
            out.append(Split(opts.topic, int(p), first, last))
            first = last
    return out


def read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A reader's ``read``: a split's records; none for the partition PySpark reads when a
    reader has none (an empty topic, or ``latest``), which holds no record."""
    if type(partition) is InputPartition and partition.value is None:
        return iter(())
    assert isinstance(partition, Split), partition
    return read_split(opts, partition)


def read_split(opts: SourceOptions, split: Split) -> Iterator[pa.RecordBatch]:
    """The split's records as Arrow batches, in offset order: every record of the range
    still kept (the node's end offsets are durable, so each one is there to read, unless
    deleted: see the module's docstring)."""
    offset = split.start
    where = f"{split.topic}/{split.partition}"
    with _nodes(opts) as nodes:
        c = nodes.client  # routed: the read goes to the partition's owner
        while offset < split.end:
            n = min(opts.records_per_read_max, split.end - offset)
            try:
                reply = c.call("read", topic=split.topic, partition=split.partition,
                               offset=offset, max_records=n)
            except OffsetOutOfRange as exc:
                offset = _lost(opts, where, offset, min(exc.earliest, split.end))
                continue
            rows = msgpack.unpackb(reply["records"], raw=False, use_list=False)
            if rows and rows[0][0] < offset:
                raise RuntimeError(f"{where}: a read from offset {offset} answered {rows[0][0]}")
            # Offsets rise (deleted records are gaps); the range ends before split.end.
            rows = rows[:bisect.bisect_left(rows, split.end, key=lambda row: row[0])]
            if not rows:
                # Nothing left below the range's end: the rest of it was deleted, or (the
                # partition now ends before it) the topic was deleted and made again.
                end = c.end_offsets(split.topic)[split.partition]
                if end < split.end:
                    raise RuntimeError(f"{where}: offsets {offset}..{split.end - 1} were "
                                       f"answered as durable, and the partition now ends at "
                                       f"{end} (was the topic deleted and made again?)")
                return
            yield batch_of(split.topic, split.partition, rows)
            offset = rows[-1][0] + 1


def _lost(opts: SourceOptions, where: str, offset: int, kept: int) -> int:
    """Offsets ``offset`` to ``kept`` were deleted by retention before the query read
    them: fail it, or (``failOnDataLoss`` false) go on from ``kept``."""
    text = (f"{where}: offsets {offset}..{kept - 1} were deleted by retention before this "
            f"query read them")
    if opts.fail_on_data_loss:
        raise DataLost(f"{text}; set the option failOnDataLoss to false to read on past them")
    log.warning("%s; skipped (failOnDataLoss is false)", text)
    return kept


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("shardnode")``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.target: Offsets | None = None  # Trigger.AvailableNow: read no further than this
        self.committed: Offsets = {}  # the group's offsets as this reader last committed them

    def initialOffset(self) -> Offsets:
        return _start(self.opts, _ends(self.opts))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.records_per_trigger_max:
            return ReadMaxRows(self.opts.records_per_trigger_max)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = _ends(self.opts)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        # Spark asks after the batch before has finished: everything below ``start`` is
        # read. (Its ``commit`` of a batch comes only when the next batch is planned, and
        # never for the last one before the query stops.)
        self._commit_group(start)
        ends = self.target if self.target is not None else _ends(self.opts)
        ends = {p: max(ends.get(p, 0), start.get(p, 0)) for p in ends.keys() | start.keys()}
        if isinstance(limit, ReadMaxRows):
            return bounded(start, ends, limit.max_rows)
        return ends

    def partitions(self, start: Offsets, end: Offsets) -> list[Split]:
        return splits(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)

    def commit(self, end: Offsets) -> None:
        self._commit_group(end)

    def _commit_group(self, end: Offsets) -> None:
        """Record how far the query has read as the node's consumer-group offsets."""
        if self.opts.group_id is None or end == self.committed:
            return
        with _nodes(self.opts) as nodes:  # each to its partition's owner
            for p, offset in sorted(end.items(), key=lambda kv: int(kv[0])):
                if self.committed.get(p) != offset:
                    nodes.client.commit_offset(self.opts.group_id, self.opts.topic, int(p), offset)
        self.committed = dict(end)


class BatchReader(DataSourceReader):
    """``spark.read.format("shardnode")``: ``startingOffsets`` to ``endingOffsets``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[Split]:
        ends = _ends(self.opts)
        start = _start(self.opts, ends)
        end = _resolve(self.opts.ending, ends, "endingOffsets")
        low = [p for p in end if end[p] < start[p]]
        if low:
            raise OptionError(f"endingOffsets is before startingOffsets in partitions {low}")
        return splits(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)
