"""The front door's part of key/value state, with no I/O: the value cache and the order of
writes per key, which make ``kv_get`` one hop and ``kv_cas`` linearizable.

A KV namespace is a one-partition topic (``wire.protocol.kv_topic``) whose records are key
writes, applied by its shard writer to the shard's ``kv`` column family
(``actors/shard_store.py``). Every write to a namespace passes through the front door of
the node that owns it (clients' writes, and in a cluster the writes other members forward),
and is answered there once durable. So the front door can know a key's value without
asking the writer:

- **The cache** holds values (or "absent") of keys, each with the LSN it reflects, bounded
  by ``cache_bytes_max`` (least recently used out). An acknowledged write sets its key's
  entry; a value read from the writer fills it. An entry is only ever replaced by one of an
  equal or higher LSN, and a read from the writer fills only when it reflects every write
  acknowledged in its namespace (``acked_lsn``), so an entry never goes back in time.
  ``kv_get`` answers from it when it can: no hop to the writer.
- **Per key, writes are sent in the order they came, and a compare-and-set is decided here**,
  on the cached value, when no write of the key is in flight (sent to the log, not yet
  answered) and nothing else could change it (a transaction committing in its namespace).
  Until then it waits in the key's ``Line``; when the value is not cached, it is read from
  the writer first. A CAS that matches becomes an ordinary write of the new value, logged
  after every write decided before it and before every write that came after it, and is
  answered when that write is durable; one that does not match is answered at once, with
  the value it saw (a durable one). The log's order is the order of the decisions, so
  every history is linearizable at the decision points.
- **Transactions** stage key writes that become visible at their commit. While a commit
  that may touch a namespace is in flight, gets in it go to the writer, CAS in it waits,
  and no fill is taken; its answer drops the namespace's entries (a new generation).

The front door (``actors/front_kv.py``) turns the steps returned here into messages.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field

# What an entry costs beyond its key's and value's lengths: the ordered dict's slot and
# link, the (topic id, key) and (value, LSN, generation) tuples, the LSN, the two bytes
# objects' headers. Measured with tracemalloc (tests/test_kv_state.py keeps it within 15 %
# of what 20 000 entries allocate); 160 had been guessed, and a 32 MiB cache took
# 58 MB (generation tuples not shared then: 64 bytes more a key).
ENTRY_OVERHEAD_BYTES = 290
GENERATIONS_SHARED_MAX = 4096  # generation tuples kept for entries to share (then cleared)

Key = tuple[int, bytes]  # (topic id of the namespace, key)
# A namespace's generation: (the front door's, the namespace's or topic's own, the
# partition's own: read_by_key only); entries and reads of an older one are ignored.
Generation = tuple[int, int, int]
PARTITION = struct.Struct(">I")  # a read_by_key entry's key: (topic id, partition + key)


@dataclass(slots=True)
class KeyOp:
    """A write of a key waiting its turn or in flight: a put (``new`` bytes), a delete
    (``new`` None), or a compare-and-set (``cas``, with ``expected``)."""

    corr: int  # the request waiting for it (the front door's correlation id)
    tid: int
    key: bytes
    new: bytes | None
    cas: bool = False
    expected: bytes | None = None
    producer: tuple[int, int] = (0, 0)  # the client's (producer id, seq); 0: none
    sent: bool = False  # sent to the log (in flight), not waiting its turn
    # Its namespace's generation when it was sent: a commit that ended since may be logged
    # before or after it (a retry answered as a duplicate gets the first attempt's LSN).
    sent_in: Generation | None = None
    # The highest LSN known durable when it was sent (the front door's ``lsn_seen``): a
    # write logged now takes a higher one; an answer at or below it is a retry's, answered
    # with the first attempt's LSN, and what came after that attempt is not known here.
    lsn_floor: int = 0


@dataclass(slots=True)
class Line:
    """The writes of one key: waiting (in order), in flight, and whether its value is being
    read from the writer."""

    queue: collections.deque[KeyOp] = field(default_factory=collections.deque)
    in_flight: int = 0
    loading: bool = False
    acked: int = 0  # writes of the key acknowledged (a load's answer is stale if any came)
    acked_at_load: int = 0
    # Those in flight that a blocking checkpoint's gate holds (their correlation ids): they
    # reach the log only after every open transaction ends, so a transaction's commit may
    # be decided ahead of them (``settled``), on the value without them.
    gated: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Send:
    """Send this write to the log now (its answer: ``written``)."""

    op: KeyOp


@dataclass(frozen=True, slots=True)
class Refused:
    """A compare-and-set that did not match: answer it now, with the value it found."""

    corr: int
    found: bytes | None


@dataclass(frozen=True, slots=True)
class Load:
    """Read the key's value from its shard writer (the answer: ``loaded``)."""

    tid: int
    key: bytes
    generation: Generation


Step = Send | Refused | Load


class KvCache:
    """Values of keys (None: known absent), each with the LSN it reflects and the generation
    of its namespace it belongs to, bounded by bytes; least recently used out."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self.entries: collections.OrderedDict[Key, tuple[bytes | None, int, Generation]] = (
            collections.OrderedDict())
        self.hits = 0
        self.misses = 0

    @staticmethod
    def cost(key: bytes, value: bytes | None) -> int:
        return ENTRY_OVERHEAD_BYTES + len(key) + (len(value) if value is not None else 0)

    def get(self, k: Key, generation: Generation) -> tuple[bytes | None, int] | None:
        """``(value, lsn)`` of a current entry, or None."""
        e = self.entries.get(k)
        if e is None or e[2] != generation:
            return None
        self.entries.move_to_end(k)
        return e[0], e[1]

    def put(self, k: Key, value: bytes | None, lsn: int, generation: Generation) -> None:
        """Set ``k``'s entry, unless it holds a later LSN of the same generation."""
        old = self.entries.get(k)
        if old is not None:
            if old[2] == generation and old[1] > lsn:
                return
            self.bytes -= self.cost(k[1], old[0])
        size = self.cost(k[1], value)
        if size > self.bytes_max:
            self.entries.pop(k, None)
            return
        self.entries[k] = (value, lsn, generation)
        self.entries.move_to_end(k)
        self.bytes += size
        while self.bytes > self.bytes_max:
            old_k, (old_v, _lsn, _gen) = self.entries.popitem(last=False)
            self.bytes -= self.cost(old_k[1], old_v)

    def drop(self, k: Key) -> None:
        old = self.entries.pop(k, None)
        if old is not None:
            self.bytes -= self.cost(k[1], old[0])


class KvState:
    def __init__(self, cache_bytes_max: int) -> None:
        self.cache = KvCache(cache_bytes_max)
        self.lines: dict[Key, Line] = {}
        # Per namespace: the highest LSN of a write acknowledged in it, its generation
        # (raised when a commit may have changed it), and the commits in flight in it.
        self.acked_lsn: dict[int, int] = {}
        self.generation: dict[int, int] = {}
        self.partition_generation: dict[tuple[int, int], int] = {}  # topics' (read_by_key)
        self.epoch = 0  # raised by a commit whose namespaces are not known: every one
        self.generations: dict[Generation, Generation] = {}  # ``gen``'s, to share them
        self.committing: dict[int, int] = {}
        self.commits_anywhere = 0  # commits in flight whose namespaces are not known
        self.cas_decided = 0
        self.cas_refused = 0
        # Keys whose writes wait for a transaction's commit, decided on their values (its
        # compare-and-sets): nothing of them is sent until the commit is answered.
        self.barred: set[Key] = set()
        self.topics: set[int] = set()  # the topic ids of the catalog (``catalog``)

    # ---- reads --------------------------------------------------------------------

    def gen(self, tid: int, partition: int = -1) -> Generation:
        g = (self.epoch, self.generation.get(tid, 0),
             self.partition_generation.get((tid, partition), 0) if partition >= 0 else 0)
        # One tuple for every entry of a generation rather than one each (64 bytes a key).
        shared = self.generations.setdefault(g, g)
        if len(self.generations) > GENERATIONS_SHARED_MAX:
            self.generations.clear()
        return shared

    def blocked(self, tid: int) -> bool:
        """A commit in flight may change this namespace: neither the cache nor a decision."""
        return self.commits_anywhere > 0 or self.committing.get(tid, 0) > 0

    def cached(self, tid: int, key: bytes) -> tuple[bool, bytes | None]:
        """``(True, value)`` when the cache can answer a get of ``key``."""
        if self.blocked(tid):
            return False, None
        e = self.cache.get((tid, key), self.gen(tid))
        if e is None:
            self.cache.misses += 1
            return False, None
        self.cache.hits += 1
        return True, e[0]

    def read_generation(self, tid: int, partition: int = -1) -> Generation:
        """What a read sent to the writer now carries, to tell whether its answer may fill."""
        return self.gen(tid, partition)

    # ---- a topic's read_by_key: the same cache, entries dropped by any write ----------

    def read_cached(self, tid: int, partition: int, key: bytes) -> tuple[bool, bytes | None]:
        """``(True, records)`` when the cache holds ``read_by_key``'s answer."""
        if self.blocked(tid):
            return False, None
        e = self.cache.get((tid, PARTITION.pack(partition) + key), self.gen(tid, partition))
        if e is None:
            self.cache.misses += 1
            return False, None
        self.cache.hits += 1
        return True, e[0]

    def read_filled(self, tid: int, partition: int, key: bytes, records: bytes, lsn: int,
                    generation: Generation) -> None:
        """The writer's answer to ``read_by_key``: kept unless the partition was written,
        or a commit touched the topic, since the read was sent."""
        if generation == self.gen(tid, partition) and not self.blocked(tid):
            self.cache.put((tid, PARTITION.pack(partition) + key), records, lsn, generation)

    def partitions_written(self, tid: int, placed: Iterable[Sequence[int]]) -> None:
        """A produce is durable in these partitions (rows ``(partition, first, count)``):
        their cached reads by key are stale."""
        gens = self.partition_generation
        for row in placed:
            k = (tid, row[0])
            gens[k] = gens.get(k, 0) + 1

    def read_answered(self, tid: int, key: bytes, value: bytes | None, lsn: int,
                      generation: Generation) -> None:
        """A get answered by the writer (``lsn``: what it had applied): fill the cache if
        the answer reflects every write acknowledged in the namespace and nothing could
        have changed it since."""
        line = self.lines.get((tid, key))
        if (generation != self.gen(tid) or self.blocked(tid)
                or lsn < self.acked_lsn.get(tid, 0) or (line is not None and line.in_flight)):
            return
        self.cache.put((tid, key), value, lsn, generation)

    # ---- writes -------------------------------------------------------------------

    def write(self, op: KeyOp) -> list[Step]:
        """A put, delete or compare-and-set arrives: what to do now."""
        k = (op.tid, op.key)
        line = self.lines.get(k)
        if line is None:
            line = self.lines[k] = Line()
        line.queue.append(op)
        return self.pump(k, line)

    def pump(self, k: Key, line: Line) -> list[Step]:
        """Send the key's waiting writes in order, up to a compare-and-set that cannot be
        decided yet."""
        out: list[Step] = []
        tid, key = k
        while line.queue and k not in self.barred:
            op = line.queue[0]
            if op.cas:
                if line.in_flight or self.blocked(tid):
                    break
                e = self.cache.get(k, self.gen(tid))
                if e is None:
                    if not line.loading:
                        out.append(self._load(line, tid, key))
                    break
                line.queue.popleft()
                if e[0] != op.expected:
                    self.cas_refused += 1
                    out.append(Refused(op.corr, e[0]))
                    continue
                self.cas_decided += 1
            else:
                line.queue.popleft()
            line.in_flight += 1
            op.sent_in = self.gen(tid)
            out.append(Send(op))
        if not line.queue and not line.in_flight and not line.loading:
            del self.lines[k]
        return out

    def _load(self, line: Line, tid: int, key: bytes) -> Load:
        line.loading = True
        line.acked_at_load = line.acked
        return Load(tid, key, self.gen(tid))

    # ---- a transaction's compare-and-sets, decided at its commit ----------------------

    def settled(self, keys: Iterable[Key]) -> tuple[dict[Key, bytes | None] | None, list[Step]]:
        """The values of ``keys`` if every one can be decided on now (cached, and nothing
        of it waiting, in flight or committing); else None, and the loads to ask for."""
        values: dict[Key, bytes | None] = {}
        loads: list[Step] = []
        ready = True
        for k in keys:
            tid, key = k
            line = self.lines.get(k)
            if self.blocked(tid) or (line is not None and (
                    line.queue or line.in_flight > len(line.gated) or line.loading)):
                ready = False
                continue
            e = self.cache.get(k, self.gen(tid))
            if e is None:
                ready = False
                if line is None:
                    line = self.lines[k] = Line()
                loads.append(self._load(line, tid, key))
                continue
            values[k] = e[0]
        return (values if ready else None), loads

    def held_at_gate(self, op: KeyOp, held: bool) -> None:
        """The transaction manager holds this write in flight at a blocking checkpoint's
        gate (``held``), or let it through as the gate opened. Puts and deletes only: a
        compare-and-set's write was decided on the value before it and must land right
        after it, not after a commit (a commit waits for it, and the gate for the commit,
        until the checkpoint gives up)."""
        line = self.lines.get((op.tid, op.key))
        if line is None or op.cas:
            return
        if held:
            line.gated.add(op.corr)
        else:
            line.gated.discard(op.corr)

    def gated_on(self, keys: Iterable[Key]) -> list[int]:
        """The writes of ``keys`` held at the gate that a commit decided now goes ahead of."""
        return sorted(c for k in keys if (line := self.lines.get(k)) for c in line.gated)

    def bar(self, keys: Iterable[Key]) -> None:
        """A commit decided on these keys' values is sent: their writes wait for it."""
        self.barred.update(keys)

    def unbar(self, keys: Iterable[Key]) -> list[Step]:
        """The commit was answered: what waited goes on."""
        out: list[Step] = []
        for k in keys:
            self.barred.discard(k)
            line = self.lines.get(k)
            if line is not None:
                out += self.pump(k, line)
        return out

    def loaded(self, tid: int, key: bytes, value: bytes | None, lsn: int,
               generation: Generation) -> list[Step]:
        """The writer's answer to a ``Load`` (None after a failure: try again later)."""
        k = (tid, key)
        line = self.lines.get(k)
        if line is None:
            return []
        line.loading = False
        # Nothing of the key was written since the load was sent: its answer is the value
        # (without the writes held at the gate, which are not in the log).
        if (line.acked == line.acked_at_load and line.in_flight == len(line.gated)
                and generation == self.gen(tid) and not self.blocked(tid)):
            self.cache.put(k, value, lsn, generation)
        return self.pump(k, line)

    def load_failed(self, tid: int, key: bytes) -> list[int]:
        """A ``Load`` failed: the compare-and-sets waiting on it fail with it (their
        correlation ids); writes behind them are sent."""
        k = (tid, key)
        line = self.lines.get(k)
        if line is None:
            return []
        line.loading = False
        failed = []
        while line.queue and line.queue[0].cas:
            failed.append(line.queue.popleft().corr)
        return failed

    def written(self, op: KeyOp, lsn: int | None) -> list[Step]:
        """A write sent to the log was answered: durable at ``lsn``, or refused (None)."""
        k = (op.tid, op.key)
        if lsn is not None:
            acked = self.acked_lsn.get(op.tid, 0)
            if lsn > acked:
                self.acked_lsn[op.tid] = lsn
            # Answers come in LSN order, but a retry's (a duplicate's: the first attempt's
            # LSN) may come after a later write of the key was answered, whose entry the
            # cache may have let go meanwhile: not known to be the key's latest.
            if op.sent_in == self.gen(op.tid) and lsn > op.lsn_floor and lsn >= acked:
                self.cache.put(k, op.new, lsn, self.gen(op.tid))
            else:  # a commit ended meanwhile, or a duplicate: which came last is not known
                self.cache.drop(k)
        line = self.lines.get(k)
        if line is None:
            return []
        line.in_flight -= 1
        line.gated.discard(op.corr)
        line.acked += 1
        return self.pump(k, line)

    def lost(self, op: KeyOp) -> None:
        """A write whose answer may never come (it timed out): its key leaves the cache, and
        stays in flight until an answer comes (``written``), so no compare-and-set decides
        on a value the write may still change."""
        self.cache.drop((op.tid, op.key))

    def cancel(self, corrs: set[int]) -> None:
        """Waiting writes whose requests were answered otherwise (timed out): dropped."""
        for line in self.lines.values():
            if any(op.corr in corrs for op in line.queue):
                line.queue = collections.deque(op for op in line.queue if op.corr not in corrs)

    # ---- transactions ---------------------------------------------------------------

    def commit_started(self, tids: Iterable[int] | None) -> None:
        """A commit is sent that may change these namespaces (None: any)."""
        if tids is None:
            self.commits_anywhere += 1
            return
        for tid in tids:
            self.committing[tid] = self.committing.get(tid, 0) + 1

    def commit_ended(self, tids: Iterable[int] | None) -> list[Step]:
        """Its answer came (or it failed): its namespaces' entries are dropped, and what
        waited on them goes on."""
        if tids is None:
            self.commits_anywhere -= 1
            self.epoch += 1
            touched: set[int] = set()
        else:
            touched = set(tids)
            for tid in touched:
                n = self.committing.get(tid, 0) - 1
                if n > 0:
                    self.committing[tid] = n
                else:
                    self.committing.pop(tid, None)
                self.generation[tid] = self.generation.get(tid, 0) + 1
        out: list[Step] = []
        for k in [k for k in self.lines if tids is None or k[0] in touched]:
            line = self.lines.get(k)
            if line is not None:
                out += self.pump(k, line)
        return out

    def catalog(self, tids: Set[int]) -> None:
        """The catalog now holds these topics (and namespaces): what is kept of the others,
        deleted (their entries, generations, last acknowledged LSN), goes. A topic id is
        never used again, so nothing read or written before can match a new topic's; what
        is still waiting or in flight keeps its line until answered."""
        gone = self.topics - tids
        self.topics = set(tids)
        for per_topic in (self.acked_lsn, self.generation):
            for tid in [t for t in per_topic if t not in tids]:
                del per_topic[tid]
        for part in [k for k in self.partition_generation if k[0] not in tids]:
            del self.partition_generation[part]
        if gone:  # (and a value a read filled after an earlier deletion)
            for k in [k for k in self.cache.entries if k[0] not in tids]:
                self.cache.drop(k)

    def forget(self) -> None:
        """Something may have changed any namespace (a commit this front door did not see):
        every entry and every read under way is of an older generation now."""
        self.epoch += 1

    def figures(self) -> dict[str, int]:
        return {"kv_cache_bytes": self.cache.bytes, "kv_cache_entries": len(self.cache.entries),
                "kv_cache_hits": self.cache.hits, "kv_cache_misses": self.cache.misses,
                "kv_cas_swapped": self.cas_decided, "kv_cas_refused": self.cas_refused,
                "kv_keys_waiting": len(self.lines)}
