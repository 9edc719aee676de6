"""The log manager's logic, with no I/O: what to log for each request, and what to answer.

``LogState`` owns the LSN counter, the topic catalog, the next offset of every shard and
the producers' recent sequence numbers. ``admit`` turns one request into either an
immediate answer (an error, a duplicate's earlier result, the topic list) or a ``Log``
entry: the encoded log record plus the answer to send once the record is durable. The
shell writes a group of pending entries with one write and one fdatasync, then sends
their answers. ``replay`` rebuilds the same state from records read back at recovery.

State changes at admit time, before durability, so that the next request in the same
group sees them; if the write or fsync fails the process exits and recovery rebuilds the
state from what is actually on disk.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

import msgpack

from actors.instructions import Log, Send
from actors.roles import FRONT_DOOR
from config import NodeConfig
from wire import logrecord
from wire.codec import Message
from wire.errors import ErrorCode
from wire.logrecord import Kind
from wire.messages import (
    Ack,
    Append,
    Catalog,
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    Done,
    ErrorReply,
    ListTopics,
    LogRequest,
    PartRow,
    PlacedRow,
    TopicsReply,
)
from wire.protocol import NAME_RE, Topic

ANSWER_WAIT_MS = 1000  # an answer waits this long for room in the front door's mailbox


@dataclass(slots=True)
class ProducerWindow:
    """The recent sequence numbers of one producer and what each one produced."""

    max_seq: int = -1
    low: int = 0  # every sequence number below this has been forgotten
    # seq → msgpack [lsn, parts]: packed once when admitted (about 1 µs), so the window
    # costs little memory and a snapshot packs bytes, not ten thousand small lists.
    results: dict[int, bytes] = field(default_factory=dict)


class LogState:
    def __init__(self, cfg: NodeConfig) -> None:
        lcfg = cfg.log
        assert lcfg.producer_entries_max >= lcfg.producer_window_max, "one full window must fit"
        self.last_lsn = 0
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[int, Topic] = {}
        self.next_topic_id = 1
        self.next_offset: dict[tuple[int, int], int] = {}
        self.producers: collections.OrderedDict[int, ProducerWindow] = collections.OrderedDict()
        self.producers_max = lcfg.producers_max
        self.window = lcfg.producer_window_max
        # Sequence numbers remembered across all windows: the least recently used producers
        # are forgotten beyond this, so memory (and each checkpoint's copy) stays bounded
        # however many producers keep how full a window.
        self.entries_max = lcfg.producer_entries_max
        self.entries = 0
        self.catalog_lsn = 0
        self.shards_max = cfg.limits.shards_max
        self.partitions_max = cfg.limits.partitions_max

    # ---- requests -------------------------------------------------------------------

    def admit(self, msg: LogRequest, now_ms: int) -> Log | Send:
        """A record to log (and the answer once it is durable), or an answer to send now."""
        out = self._admit(msg, now_ms)
        return out if isinstance(out, Log) else Send(FRONT_DOOR, out, ANSWER_WAIT_MS)

    def append(self, corr: int, producer_id: int, seq: int, parts: Sequence[PartRow],
               now_ms: int) -> Log | Send:
        """A produce request (the fields of an ``Append``, which ``Writes`` carries bare)."""
        out = self._append(corr, producer_id, seq, parts, now_ms)
        return out if isinstance(out, Log) else Send(FRONT_DOOR, out, ANSWER_WAIT_MS)

    def _admit(self, msg: LogRequest, now_ms: int) -> Log | Message:
        match msg:
            case Append(corr, producer_id, seq, parts):
                return self._append(corr, producer_id, seq, parts, now_ms)
            case CreateTopic():
                return self._create(msg)
            case DeleteTopic():
                return self._delete(msg)
            case CommitOffset():
                return self._commit_offset(msg)
            case ListTopics(corr):
                return TopicsReply(corr, sorted(self.topics.values(), key=lambda t: t.name))
            case _:
                assert_never(msg)

    def _producer(self, producer_id: int) -> ProducerWindow:
        win = self.producers.get(producer_id)
        if win is None:
            win = ProducerWindow()
            self.producers[producer_id] = win
            if len(self.producers) > self.producers_max:
                self._forget_oldest()
        else:
            self.producers.move_to_end(producer_id)
        return win

    def _forget_oldest(self) -> None:
        """Forget the least recently used producer: a retry of its would be logged again."""
        _pid, old = self.producers.popitem(last=False)
        self.entries -= len(old.results)

    def _bound_entries(self) -> None:
        # The most recent producer, the one just used, stays: its window alone fits.
        while self.entries > self.entries_max and len(self.producers) > 1:
            self._forget_oldest()

    def _remember(self, win: ProducerWindow, seq: int, lsn: int,
                  parts: Sequence[PlacedRow]) -> None:
        if seq < win.low:
            return  # out of the window already (replayed with a smaller window than logged)
        results = win.results
        before = len(results)
        results[seq] = msgpack.packb([lsn, parts], use_bin_type=True)
        if seq > win.max_seq:
            win.max_seq = seq
            # Forget the sequence numbers that fell out of the window, (nearly always) the
            # one just below it. Asking the dict for its oldest key instead cost up to
            # O(window): iterating skips the slots its deletions left at the front.
            floor = seq - self.window
            if floor - win.low >= self.window:  # a jump: look at what is there
                for old in [s for s in results if s <= floor]:
                    del results[old]
            else:
                for old in range(win.low, floor + 1):
                    results.pop(old, None)
            win.low = max(win.low, floor + 1)
        # else a gap filled: nothing falls out of the window
        self.entries += len(results) - before
        if self.entries > self.entries_max:
            self._bound_entries()

    def _append(self, corr: int, producer_id: int, seq: int, parts: Sequence[PartRow],
                now_ms: int) -> Log | Message:
        known = self.producers.get(producer_id)
        if known is not None:
            self.producers.move_to_end(producer_id)  # a retry is use, too
            seen = known.results.get(seq)
            if seen is not None:
                lsn, placed = msgpack.unpackb(seen, use_list=False)
                return Log(b"", Ack(corr, lsn, list(placed)), lsn)  # answered with its group
            if seq <= known.max_seq - self.window:
                return ErrorReply(corr, ErrorCode.STALE_SEQUENCE,
                                  f"sequence {seq} of producer {producer_id} is older "
                                  f"than the last {self.window} remembered (latest {known.max_seq})")
        logged: list[tuple[int, int, int, int, bytes]] = []  # as the log record holds them
        acked: list[PlacedRow] = []
        for topic_id, partition, count, blob in parts:
            topic = self.by_id.get(topic_id)
            if topic is None:
                return ErrorReply(corr, ErrorCode.UNKNOWN_TOPIC,
                                  f"topic id {topic_id} does not exist (deleted?)")
            if not 0 <= partition < topic.partitions:
                return ErrorReply(corr, ErrorCode.UNKNOWN_PARTITION,
                                  f"topic {topic.name!r} has no partition {partition}")
            first = self.next_offset[(topic_id, partition)]
            logged.append((topic_id, partition, first, count, blob))
            acked.append((partition, first, count))
        # Only a request that is going to be logged touches producer state: a refused one
        # must not evict another producer's window.
        win = self._producer(producer_id)
        for (topic_id, partition, first, count, _blob) in logged:
            self.next_offset[(topic_id, partition)] = first + count
        self.last_lsn += 1
        lsn = self.last_lsn
        record = logrecord.encode(lsn, Kind.PRODUCE, [producer_id, seq, now_ms, logged])
        self._remember(win, seq, lsn, acked)
        return Log(record, Ack(corr, lsn, acked), lsn)

    def _create(self, msg: CreateTopic) -> Log | Message:
        if not NAME_RE.match(msg.name):
            return ErrorReply(msg.corr, ErrorCode.INVALID_NAME,
                              f"topic name {msg.name!r} must be 1-200 letters, digits, '.', '_' "
                              f"or '-', starting with a letter or digit")
        if not 1 <= msg.partitions <= self.partitions_max:
            return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST,
                              f"partitions must be 1-{self.partitions_max} "
                              f"(limits.partitions_max), got {msg.partitions}")
        if msg.name in self.topics:
            return ErrorReply(msg.corr, ErrorCode.TOPIC_EXISTS, f"topic {msg.name!r} exists")
        shards = sum(t.partitions for t in self.topics.values())
        if shards + msg.partitions > self.shards_max:
            return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST,
                              f"the node has {shards} partitions; {msg.partitions} more would "
                              f"pass limits.shards_max = {self.shards_max}")
        self.last_lsn += 1
        topic = Topic(msg.name, msg.partitions, self.next_topic_id)
        self._apply_create(topic, self.last_lsn)
        record = logrecord.encode(self.last_lsn, Kind.TOPIC_CREATE,
                                  [topic.topic_id, topic.name, topic.partitions])
        return Log(record, Done(msg.corr, self.last_lsn), self.last_lsn, catalog_changed=True)

    def _delete(self, msg: DeleteTopic) -> Log | Message:
        topic = self.topics.get(msg.name)
        if topic is None:
            return ErrorReply(msg.corr, ErrorCode.UNKNOWN_TOPIC, f"topic {msg.name!r} does not exist")
        self.last_lsn += 1
        self._apply_delete(topic.topic_id, self.last_lsn)
        record = logrecord.encode(self.last_lsn, Kind.TOPIC_DELETE, [topic.topic_id, topic.name])
        return Log(record, Done(msg.corr, self.last_lsn), self.last_lsn, catalog_changed=True)

    def _commit_offset(self, msg: CommitOffset) -> Log | Message:
        topic = self.by_id.get(msg.topic_id)
        if topic is None:
            return ErrorReply(msg.corr, ErrorCode.UNKNOWN_TOPIC, f"topic id {msg.topic_id} does not exist")
        if not 0 <= msg.partition < topic.partitions:
            return ErrorReply(msg.corr, ErrorCode.UNKNOWN_PARTITION,
                              f"topic {topic.name!r} has no partition {msg.partition}")
        if not 0 <= msg.offset <= self.next_offset[(msg.topic_id, msg.partition)]:
            return ErrorReply(msg.corr, ErrorCode.BAD_REQUEST,
                              f"offset {msg.offset} is past the end of {topic.name}/{msg.partition}")
        self.last_lsn += 1
        record = logrecord.encode(self.last_lsn, Kind.OFFSET_COMMIT,
                                  [msg.group, msg.topic_id, msg.partition, msg.offset])
        return Log(record, Done(msg.corr, self.last_lsn), self.last_lsn)

    # ---- catalog --------------------------------------------------------------------

    def _apply_create(self, topic: Topic, lsn: int) -> None:
        self.topics[topic.name] = topic
        self.by_id[topic.topic_id] = topic
        self.next_topic_id = max(self.next_topic_id, topic.topic_id + 1)
        for p in range(topic.partitions):
            self.next_offset[(topic.topic_id, p)] = 0
        self.catalog_lsn = lsn

    def _apply_delete(self, topic_id: int, lsn: int) -> None:
        topic = self.by_id.pop(topic_id, None)
        if topic is not None:
            del self.topics[topic.name]
            for p in range(topic.partitions):
                self.next_offset.pop((topic_id, p), None)
        self.catalog_lsn = lsn

    def catalog(self) -> Catalog:
        return Catalog(self.catalog_lsn, list(self.by_id.values()), self.catalog_lsn)

    # ---- snapshots ------------------------------------------------------------------

    # 2: each window a map seq → the packed [lsn, parts]. 1 (still read): each window a list
    # of [seq, lsn, parts].
    SNAPSHOT_FORMAT = 2

    def snapshot(self) -> dict[str, Any]:
        """Everything needed to go on from ``last_lsn`` without the records before it.

        Cheap to take (copies, no per-entry Python work), so the log manager can take it
        between two group commits and encode and write it on another thread: each window
        is a copy of its dict of packed entries, which msgpack writes as a map (in order,
        oldest first)."""
        return {
            "format": self.SNAPSHOT_FORMAT,
            "last_lsn": self.last_lsn,
            "catalog_lsn": self.catalog_lsn,
            "next_topic_id": self.next_topic_id,
            "topics": [[t.topic_id, t.name, t.partitions] for t in self.by_id.values()],
            "next_offset": [[tid, p, off] for (tid, p), off in self.next_offset.items()],
            "producers": [[pid, w.max_seq, w.results.copy()] for pid, w in self.producers.items()],
        }

    def restore(self, snap: dict[str, Any]) -> None:
        form = snap.get("format")
        if form != self.SNAPSHOT_FORMAT:
            raise ValueError(f"snapshot format {form} is not {self.SNAPSHOT_FORMAT}")
        self.last_lsn = snap["last_lsn"]
        self.catalog_lsn = snap["catalog_lsn"]
        self.next_topic_id = snap["next_topic_id"]
        self.topics.clear()
        self.by_id.clear()
        for tid, name, parts in snap["topics"]:
            topic = Topic(name, parts, tid)
            self.topics[name] = topic
            self.by_id[tid] = topic
        self.next_offset = {(tid, p): off for tid, p, off in snap["next_offset"]}
        self.producers.clear()
        for pid, max_seq, window in snap["producers"]:
            low = max(0, max_seq - self.window + 1)
            self.producers[pid] = ProducerWindow(max_seq, low,
                                                 {s: r for s, r in window.items() if s >= low})
        # Oldest first, as they were: a smaller bound than the snapshot's forgets the oldest.
        self.entries = sum(len(w.results) for w in self.producers.values())
        while len(self.producers) > self.producers_max:
            self._forget_oldest()
        self._bound_entries()

    # ---- recovery -------------------------------------------------------------------

    def replay(self, entry: logrecord.Entry) -> None:
        """Apply one record read back from the log (in LSN order)."""
        if entry.lsn <= self.last_lsn:
            raise ValueError(f"record LSN {entry.lsn} replayed after {self.last_lsn}")
        self.last_lsn = entry.lsn
        kind = entry.kind
        if kind == Kind.PRODUCE:
            producer_id, seq, _ts, parts = msgpack.unpackb(entry.payload, raw=False)
            acked: list[PlacedRow] = []
            for topic_id, partition, first, count, _blob in parts:
                key = (topic_id, partition)
                if key in self.next_offset:
                    self.next_offset[key] = first + count
                acked.append((partition, first, count))
            self._remember(self._producer(producer_id), seq, entry.lsn, acked)
        elif kind == Kind.TOPIC_CREATE:
            topic_id, name, partitions = entry.body()
            self._apply_create(Topic(name, partitions, topic_id), entry.lsn)
        elif kind == Kind.TOPIC_DELETE:
            topic_id, _name = entry.body()
            self._apply_delete(topic_id, entry.lsn)
        elif kind == Kind.OFFSET_COMMIT:
            pass  # applied by the shard writers; nothing for the log manager to remember
        else:
            raise ValueError(f"unknown record kind {kind} at LSN {entry.lsn}")
