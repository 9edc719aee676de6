"""Memory topics, with no I/O: the records of topics created with ``storage = "memory"``,
kept by the front door within ``[storage] memory_bytes_max`` and never written to the log.

A memory topic trades durability for speed, as RobustMQ's memory storage adapter (seed
001) does: a produce is answered as soon as its records are here, without a log write or an
fsync, and the records are gone when the front door restarts (with the node, or with an
actor before it: rest-for-one). The topic itself is in the catalog like any other, durable,
so it is still there, empty, after a restart, and its offsets start again from 0. Consumer
groups' offsets of a memory topic are committed as any topic's are, durably, to its
partitions' shards (which hold nothing else).

Each partition is a run of records from its earliest kept offset; past the budget the
oldest records of the largest partition go first, and a read below a partition's earliest
offset is answered ``OFFSET_OUT_OF_RANGE`` with that offset. A retry of a produce (the
same producer id and sequence number) is answered as the first attempt was, while it is
among the last ``RETRIES_REMEMBERED`` and their placements take at most a
``RETRIES_BUDGET_SHARE``-th of the budget, in which they are counted (a produce split over
512 partitions is remembered in about 12 KiB).
"""

from __future__ import annotations

import bisect
import collections
import heapq
from array import array
from dataclasses import dataclass, field
from typing import Any

# What a record costs beyond the bytes of its value, key and tags: its row's list, ints and
# tags' list, its slots in the partition's deques, its value's bytes object; a key's and a
# tag's object more. Measured with tracemalloc (tests/test_memory_topics.py keeps the count
# within 15 %: at 120 for all, records took 1.7 times what they counted).
RECORD_OVERHEAD_BYTES = 232
KEY_OVERHEAD_BYTES = 33  # a bytes object's header
TAG_OVERHEAD_BYTES = 49  # a str's header
RETRIES_REMEMBERED = 65536  # (producer id, seq) of the latest memory produces, answered again
RETRIES_BUDGET_SHARE = 8  # their placements take at most bytes_max / 8, counted in bytes_max
# A remembered retry beyond its placement's 24 bytes a part (three 8-byte ints in an array):
# the ordered dict's slot and link, the (producer id, seq) tuple and its ints, the array's
# header. Measured with tracemalloc (tests/test_memory_topics.py keeps it within 15 %).
RETRY_OVERHEAD_BYTES = 270
PLACEMENT_BYTES = 24  # a part's [partition, first offset, count] in a retry's array

Row = list[Any]  # [offset, timestamp_ms, key, tags, value], as reads answer them


@dataclass(slots=True)
class Partition:
    rows: collections.deque[Row] = field(default_factory=collections.deque)
    sizes: collections.deque[int] = field(default_factory=collections.deque)
    first: int = 0  # the earliest offset kept
    next: int = 0
    bytes: int = 0
    max_ts: int = -1
    # The running maximum timestamp at each offset where it grew: "first offset at or after
    # T" is a bisection, as the shards' time index answers it.
    ts_marks: list[int] = field(default_factory=list)
    ts_offsets: list[int] = field(default_factory=list)


class OutOfRange(Exception):
    def __init__(self, earliest: int) -> None:
        super().__init__(earliest)
        self.earliest = earliest


class MemoryTopics:
    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self.parts: dict[tuple[int, int], Partition] = {}
        # Placements of the latest produces, flat (``[partition, first, count] * parts``).
        self.retries: collections.OrderedDict[tuple[int, int], array[int]] = (
            collections.OrderedDict())
        self.retries_bytes = 0  # counted in ``bytes`` too
        # (-bytes, partition) as each partition's bytes last changed: its head is the
        # largest, once stale heads (bytes since changed, partition dropped) are popped.
        self.largest: list[tuple[int, tuple[int, int]]] = []
        self.evicted = 0

    @staticmethod
    def cost(row: Row) -> int:
        _off, _ts, key, tags, value = row
        return (RECORD_OVERHEAD_BYTES + len(value)
                + (KEY_OVERHEAD_BYTES + len(key) if key is not None else 0)
                + sum(TAG_OVERHEAD_BYTES + len(t) for t in tags))

    def part(self, tid: int, p: int) -> Partition:
        found = self.parts.get((tid, p))
        if found is None:
            found = self.parts[(tid, p)] = Partition()
        return found

    # ---- writing --------------------------------------------------------------------

    def seen(self, producer_id: int, seq: int) -> list[list[int]] | None:
        """The placement a produce with this producer id and sequence number got, if it is
        a retry of one remembered."""
        flat = self.retries.get((producer_id, seq)) if producer_id else None
        if flat is None:
            return None
        return [flat[i:i + 3].tolist() for i in range(0, len(flat), 3)]

    def append(self, producer_id: int, seq: int, parts: list[tuple[int, int, list[Any]]],
               now_ms: int) -> list[list[int]]:
        """Keep the records of a produce (``(topic id, partition, checked batch items)``
        each); returns ``[partition, first offset, count]`` of each part."""
        placed = []
        for tid, p, items in parts:
            part = self.part(tid, p)
            first = part.next
            for item in items:
                if type(item) is bytes:
                    row: Row = [part.next, now_ms, None, [], item]
                else:
                    value, key, tags, ts = item
                    row = [part.next, now_ms if ts is None else ts, key, list(tags), value]
                size = self.cost(row)
                part.rows.append(row)
                part.sizes.append(size)
                part.bytes += size
                self.bytes += size
                if row[1] > part.max_ts:
                    part.max_ts = row[1]
                    part.ts_marks.append(row[1])
                    part.ts_offsets.append(part.next)
                part.next += 1
            placed.append([p, first, part.next - first])
            self._grew(tid, p, part)
        if producer_id:
            self._remember((producer_id, seq), placed)
        self._bound()
        return placed

    @staticmethod
    def retry_cost(flat: array[int]) -> int:
        return RETRY_OVERHEAD_BYTES + PLACEMENT_BYTES * (len(flat) // 3)

    def _remember(self, k: tuple[int, int], placed: list[list[int]]) -> None:
        """Keep a produce's placement for its retries, within their count and bytes."""
        old = self.retries.pop(k, None)
        if old is not None:
            self.retries_bytes -= self.retry_cost(old)
            self.bytes -= self.retry_cost(old)
        flat = array("q", [n for row in placed for n in row])
        self.retries[k] = flat
        self.retries_bytes += self.retry_cost(flat)
        self.bytes += self.retry_cost(flat)
        while self.retries and (len(self.retries) > RETRIES_REMEMBERED or self.retries_bytes
                                > self.bytes_max // RETRIES_BUDGET_SHARE):
            _k, flat = self.retries.popitem(last=False)
            self.retries_bytes -= self.retry_cost(flat)
            self.bytes -= self.retry_cost(flat)

    def _grew(self, tid: int, p: int, part: Partition) -> None:
        heapq.heappush(self.largest, (-part.bytes, (tid, p)))
        if len(self.largest) > 2 * len(self.parts) + 64:  # mostly stale: built again
            self.largest = [(-x.bytes, k) for k, x in self.parts.items() if x.rows]
            heapq.heapify(self.largest)

    def _bound(self) -> None:
        """Over the budget: the oldest records of the largest partition go first."""
        while self.bytes > self.bytes_max and self.largest:
            neg, k = self.largest[0]
            part = self.parts.get(k)
            if part is None or -neg != part.bytes or not part.rows:
                heapq.heappop(self.largest)  # stale
                continue
            part.rows.popleft()
            size = part.sizes.popleft()
            part.bytes -= size
            self.bytes -= size
            part.first += 1
            self.evicted += 1
            while len(part.ts_offsets) > 1 and part.ts_offsets[1] <= part.first:
                del part.ts_offsets[0], part.ts_marks[0]
            heapq.heapreplace(self.largest, (-part.bytes, k))

    def drop(self, tid: int) -> None:
        """A memory topic was deleted."""
        for k in [k for k in self.parts if k[0] == tid]:
            self.bytes -= self.parts.pop(k).bytes

    # ---- reading --------------------------------------------------------------------

    def end_offset(self, tid: int, p: int) -> int:
        part = self.parts.get((tid, p))
        return 0 if part is None else part.next

    def read(self, tid: int, p: int, offset: int, max_records: int, bytes_max: int) -> list[Row]:
        """Rows from ``offset`` on: at most ``max_records``, stopping once ``bytes_max`` is
        reached (the first row is always returned)."""
        part = self.parts.get((tid, p))
        if part is None:
            return []
        if offset < part.first:
            raise OutOfRange(part.first)
        start = offset - part.first
        rows: list[Row] = []
        size = 0
        for i in range(start, min(len(part.rows), start + max_records)):
            if rows and size >= bytes_max:
                break
            rows.append(part.rows[i])
            size += part.sizes[i]
        return rows

    def read_by_key(self, tid: int, p: int, key: bytes) -> list[Row]:
        part = self.parts.get((tid, p))
        if part is None:
            return []
        for row in reversed(part.rows):
            if row[2] == key:
                return [row]
        return []

    def read_by_tag(self, tid: int, p: int, tag: str, offset: int, max_records: int,
                    bytes_max: int) -> list[Row]:
        part = self.parts.get((tid, p))
        if part is None:
            return []
        if offset < part.first:
            raise OutOfRange(part.first)
        rows: list[Row] = []
        size = 0
        for i in range(offset - part.first, len(part.rows)):
            if len(rows) >= max_records or (rows and size >= bytes_max):
                break
            row = part.rows[i]
            if tag in row[3]:
                rows.append(row)
                size += part.sizes[i]
        return rows

    def offset_for_timestamp(self, tid: int, p: int, ts: int) -> int | None:
        part = self.parts.get((tid, p))
        if part is None or not part.ts_marks:
            return None
        i = bisect.bisect_left(part.ts_marks, ts)
        if i == len(part.ts_marks):
            return None
        return max(part.ts_offsets[i], part.first)

    def figures(self) -> dict[str, int]:
        return {"memory_topic_bytes": self.bytes,
                "memory_topic_records": sum(len(x.rows) for x in self.parts.values()),
                "memory_topic_evicted": self.evicted}
