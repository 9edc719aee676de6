"""The cache manager actor: recent durable records in memory, and the road to the writers.

Every durable group from the log manager passes through here: it is cached (as bytes) and
handed on, the same frame, to every shard writer, each of which applies the shards it owns.
Reads by offset come here first: what the cache holds is answered here, the rest goes on
to the writer that owns the shard, carrying ``lsn_min`` so the writer answers only once it
has applied everything the client has been told is durable. (Reads by key, tag or time
go from the front door straight to the owning writer.)
"""

from __future__ import annotations

import logging
import time
from typing import Any

from actors.base import Actor, ActorContext
from actors.cache_state import CacheState
from actors.flow import PROGRESS_BYTES_DIVISOR, GroupsInFlight, ProgressReport
from actors.roles import FRONT_DOOR, LOG_MANAGER, shard_owner, writer_role
from wire import codec
from wire.codec import Message
from wire.messages import (
    Catalog,
    CatchUp,
    CommittedOffset,
    Flushed,
    FlushTo,
    Hello,
    LogGroup,
    OffsetForTimestamp,
    Progress,
    Read,
    ReadByKey,
    ReadByTag,
    ReadRequest,
    RecordsReply,
)
from wire.records import pack_read

log = logging.getLogger("shardnode")


class CacheManager(Actor):
    # A log group is read as a view into its frame, which goes on to the writers as it
    # came; the cache copies only the batches it keeps (``CacheState.add_group``).
    VIEW_TAGS = frozenset({LogGroup.TAG})

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self.state = CacheState(self.cfg.cache.bytes_max)
        self.writers = [writer_role(i) for i in range(self.cfg.node.writers)]
        queued_max = self.cfg.limits.group_bytes_queued_max
        self.to_writer = {w: GroupsInFlight(queued_max) for w in self.writers}
        self.progress = ProgressReport(queued_max // PROGRESS_BYTES_DIVISOR)  # to the log manager
        self.forwarded = 0
        # The flush in hand: checkpoint id → {writer role: flushed LSN, or None while waiting}
        self.flushing: dict[int, dict[str, int | None]] = {}

    def on_start(self) -> None:
        self.send(LOG_MANAGER, Hello(self.role), wait_ms=100)

    def on_message(self, msg: Message) -> None:
        match msg:
            case LogGroup():
                self.on_group(msg)
            case Read():
                self.on_read(msg)
            case ReadByKey() | ReadByTag() | OffsetForTimestamp() | CommittedOffset():
                self.forward(msg)
            case FlushTo():
                self.on_flush_to(msg)
            case Progress(role, lsn):
                flow = self.to_writer.get(role)
                missed = flow.applied(lsn) if flow is not None else 0
                if missed:
                    self.send(role, CatchUp(missed), wait_ms=100)
            case CatchUp():
                self.on_catch_up(msg)
            case Flushed():
                self.on_flushed(msg)
            case Catalog(topics=topics):
                self.state.keep_topics({t.topic_id for t in topics})
            case _:
                self.unexpected(msg)

    def on_group(self, msg: LogGroup) -> None:
        if self.state.seen_lsn and msg.first_lsn > self.state.seen_lsn + 1:
            log.warning("missed log groups %d..%d; clearing the cache",
                        self.state.seen_lsn + 1, msg.first_lsn - 1)
            self.state.clear()
            self.state.commit_lsn = msg.first_lsn - 1  # they may have held commits
        frame = self.current_frame
        for w in self.writers:
            # A writer that is behind (bytes queued, or a full mailbox) or restarting
            # catches up from the log by itself, so this never waits long.
            flow = self.to_writer[w]
            if flow.admits(len(frame)) and self.send_bytes(w, frame, wait_ms=200):
                flow.sent(msg.last_lsn, len(frame))
            else:
                flow.skip(msg.last_lsn)
        self.state.add_group(msg.last_lsn, msg.data)
        self.progress.applied(len(msg.data))

    def on_catch_up(self, msg: CatchUp) -> None:
        """The log manager did not send us groups up to ``msg.lsn``: neither did we send
        them on, so every writer reads them from the log."""
        if msg.lsn <= self.state.seen_lsn:
            return
        log.warning("missed log groups up to %d; clearing the cache", msg.lsn)
        self.state.clear()
        self.state.seen_lsn = msg.lsn
        self.state.commit_lsn = msg.lsn  # they may have held commits
        for w in self.writers:
            self.send(w, msg, wait_ms=200)

    def on_idle(self) -> None:
        lsn, now = self.state.seen_lsn, time.monotonic()
        if self.progress.due(lsn, now) and self.send(LOG_MANAGER, Progress(self.role, lsn), 100):
            self.progress.sent(lsn, now)

    def on_flush_to(self, msg: FlushTo) -> None:
        """The checkpoint's "flush everything": every writer flushes to the LSN and answers."""
        self.flushing = {msg.ckpt_id: dict.fromkeys(self.writers)}  # an older one is abandoned
        frame = self.current_frame
        for w in self.writers:
            self.send_bytes(w, frame, wait_ms=1000)

    def on_flushed(self, msg: Flushed) -> None:
        waiting = self.flushing.get(msg.ckpt_id)
        if waiting is None or msg.role not in waiting:
            return
        waiting[msg.role] = msg.lsn
        lsns = [lsn for lsn in waiting.values() if lsn is not None]
        if len(lsns) == len(waiting):
            del self.flushing[msg.ckpt_id]
            self.send(LOG_MANAGER, Flushed(msg.ckpt_id, self.role, min(lsns)), wait_ms=1000)

    def on_read(self, msg: Read) -> None:
        rows = None
        if msg.lsn_min <= self.state.seen_lsn:
            rows = self.state.read((msg.topic_id, msg.partition), msg.offset, msg.max_records,
                                   self.cfg.limits.read_bytes_max)
        if rows is None:
            self.forward(msg)
            return
        self.send(FRONT_DOOR, RecordsReply(msg.corr, pack_read(rows), self.state.seen_lsn,
                                           self.state.commit_lsn), wait_ms=100)

    def forward(self, msg: ReadRequest) -> None:
        self.forwarded += 1
        w = self.writers[shard_owner(msg.topic_id, msg.partition, len(self.writers))]
        self.send_bytes(w, codec.encode(msg), wait_ms=100)

    def figures(self) -> dict[str, Any]:
        s = self.state
        return {
            "cached_bytes": s.bytes,
            "cached_batches": len(s.entries),
            "hits": s.hits,
            "misses": s.misses,
            "evictions": s.evictions,
            "forwarded": self.forwarded,
            "seen_lsn": s.seen_lsn,
            "writer_queued_bytes": sum(f.bytes for f in self.to_writer.values()),
            "groups_not_sent": sum(f.skipped for f in self.to_writer.values()),
        }
