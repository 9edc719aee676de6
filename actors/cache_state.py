"""The cache manager's logic, with no I/O: recent durable batches per shard, and reads of them.

Batches are kept as the packed bytes the client sent, one entry per shard slice of a log
record, and decoded only when a read asks for them. Eviction follows SwiftMQ's cache:
entries are ordered by last access, and an entry with hits gets a second chance (its hit
count halves and it moves to the back) before it is dropped, so hot data stays.
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass
from typing import Any

import msgpack

from wire import logrecord
from wire.logrecord import Kind

Shard = tuple[int, int]  # (topic_id, partition)

# What an entry costs beyond its blob: the Entry, its key, its place in the ordered dict and
# in ``starts``. Measured: 497 bytes of RSS per single-record entry (a 103-byte blob) with
# 120 000 entries; at the 200 counted before, a cache of single records took twice its
# ``bytes_max`` (the cache manager reached 130 MB in the benchmark).
ENTRY_OVERHEAD_BYTES = 400
STARTS_COMPACT_MIN = 1024  # evicted offsets kept at the front of a shard's list before compacting


@dataclass(slots=True)
class Entry:
    first: int
    count: int
    timestamp: int
    blob: bytes
    hits: int = 0


class Starts:
    """The sorted first offsets of one shard's cached entries. Eviction takes them mostly
    from the front, where a list pop moves every other offset, so those are dropped
    lazily: the first ``head`` are gone, and the list is compacted once they are half."""

    __slots__ = ("head", "offsets")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.offsets) - self.head

    def add(self, first: int) -> None:
        bisect.insort(self.offsets, first, lo=self.head)

    def remove(self, first: int) -> None:
        offsets = self.offsets
        i = bisect.bisect_left(offsets, first, lo=self.head)
        if i == len(offsets) or offsets[i] != first:
            return
        if i > self.head:
            offsets.pop(i)
            return
        self.head += 1
        if self.head >= STARTS_COMPACT_MIN and 2 * self.head >= len(offsets):
            del offsets[:self.head]
            self.head = 0

    def last_at_or_before(self, offset: int) -> int:
        """The index in ``offsets`` of the last start at or before ``offset``, or -1."""
        i = bisect.bisect_right(self.offsets, offset, lo=self.head) - 1
        return i if i >= self.head else -1


class CacheState:
    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self.entries: collections.OrderedDict[tuple[Shard, int], Entry] = collections.OrderedDict()
        self.starts: dict[Shard, Starts] = {}  # first offsets of cached entries, per shard
        self.end: dict[Shard, int] = {}  # next offset of each shard, as far as seen
        self.seen_lsn = 0  # last LSN of the groups seen since this cache started
        self.commit_lsn = 0  # the last transaction commit seen
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    # ---- filling ------------------------------------------------------------------------

    def add_group(self, last_lsn: int, data: bytes | memoryview) -> None:
        """The records of a durable group; the batches kept are copies (``data`` may be a
        view into a received frame, which must not be kept alive by the cache)."""
        for entry in logrecord.iter_buffer(data):
            if entry.kind == Kind.PRODUCE:
                _pid, _seq, ts, parts = msgpack.unpackb(entry.payload, raw=False)
                for topic_id, partition, first, count, blob in parts:
                    self._add((topic_id, partition), Entry(first, count, ts, blob))
            elif entry.kind == Kind.COMMIT:
                # A transaction's records are not cached (they were staged in the shards):
                # its offsets are a gap here, which reads go past to the shard writer.
                _txn, placed, _offsets = entry.body()
                for topic_id, partition, first, count in placed:
                    shard = (topic_id, partition)
                    self.end[shard] = max(self.end.get(shard, 0), first + count)
                self.commit_lsn = entry.lsn
            elif entry.kind == Kind.TOPIC_DELETE:
                topic_id, _name = entry.body()
                self.drop_topic(topic_id)
            elif entry.kind == Kind.DELETE:
                # A record deleted: what is cached of its partition goes (reads go to the
                # shard, which no longer has it).
                topic_id, partition, _offset, _key = entry.body()
                self.drop_shard((topic_id, partition))
        self.seen_lsn = max(self.seen_lsn, last_lsn)

    def _add(self, shard: Shard, e: Entry) -> None:
        self.entries[(shard, e.first)] = e
        starts = self.starts.get(shard)
        if starts is None:
            starts = self.starts[shard] = Starts()
        starts.add(e.first)
        self.end[shard] = max(self.end.get(shard, 0), e.first + e.count)
        self.bytes += len(e.blob) + ENTRY_OVERHEAD_BYTES
        self._evict()

    def _evict(self) -> None:
        while self.bytes > self.bytes_max and self.entries:
            key, e = self.entries.popitem(last=False)
            if e.hits > 0:
                e.hits //= 2  # second chance for data that is read
                self.entries[key] = e
                continue
            self._remove(key, e)
            self.evictions += 1

    def _remove(self, key: tuple[Shard, int], e: Entry) -> None:
        shard, first = key
        self.starts[shard].remove(first)
        self.bytes -= len(e.blob) + ENTRY_OVERHEAD_BYTES

    def clear(self) -> None:
        """Forget everything (after missing groups, what is cached may have holes)."""
        self.entries.clear()
        self.starts.clear()
        self.end.clear()
        self.bytes = 0

    def drop_topic(self, topic_id: int) -> None:
        for key in [k for k in self.entries if k[0][0] == topic_id]:
            self._remove(key, self.entries.pop(key))
        for shard in [s for s in self.starts if s[0] == topic_id]:
            del self.starts[shard]
            self.end.pop(shard, None)

    def drop_shard(self, shard: Shard) -> None:
        starts = self.starts.pop(shard, None)
        if starts is None:
            return
        for first in starts.offsets[starts.head:]:
            e = self.entries.pop((shard, first), None)
            if e is not None:
                self.bytes -= len(e.blob) + ENTRY_OVERHEAD_BYTES

    def keep_topics(self, topic_ids: set[int]) -> None:
        for topic_id in {s[0] for s in self.starts} - topic_ids:
            self.drop_topic(topic_id)

    # ---- reading ------------------------------------------------------------------------

    def read(self, shard: Shard, offset: int, max_records: int,
             bytes_max: int = 1 << 62) -> list[Any] | None:
        """Rows ``[offset, ts, key, tags, value]`` from ``offset``, or None if not cached.

        An offset at or past the shard's end, as seen since this cache started, reads as
        empty. Rows stop at the first gap in what is cached.
        """
        end = self.end.get(shard)
        if end is not None and offset >= end:
            self.hits += 1
            return []
        starts = self.starts.get(shard)
        if not starts:
            self.misses += 1
            return None
        i = starts.last_at_or_before(offset)
        if i < 0:
            self.misses += 1
            return None
        offsets = starts.offsets
        rows: list[Any] = []
        size = 0
        want = offset
        while i < len(offsets) and len(rows) < max_records and size < bytes_max:
            key = (shard, offsets[i])
            e = self.entries[key]
            if not e.first <= want < e.first + e.count:
                break
            e.hits += 1
            self.entries.move_to_end(key)
            items = msgpack.unpackb(e.blob, raw=False, use_list=False)
            for j in range(want - e.first, min(e.count, want - e.first + max_records - len(rows))):
                item = items[j]
                n = len(item) if type(item) is bytes else len(item[0])
                if rows and size + n > bytes_max:
                    break  # the record that would take the read over stays for the next one
                size += n
                if type(item) is bytes:
                    rows.append([e.first + j, e.timestamp, None, (), item])
                else:
                    value, key_, tags, ts = item
                    rows.append([e.first + j, e.timestamp if ts is None else ts, key_, tags, value])
            want = rows[-1][0] + 1 if rows else want
            if want < e.first + e.count:
                break  # stopped inside this entry by the byte limit
            i += 1
        if not rows:
            self.misses += 1
            return None
        self.hits += 1
        return rows
