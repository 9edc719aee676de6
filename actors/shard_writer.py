"""A shard writer actor: applies durable log records to the RocksDB shards it owns.

Groups arrive from the cache manager as the bytes the log manager wrote. A writer keeps
``processed_lsn``, the last LSN it has gone through; a group that starts beyond it means
groups were missed (this writer restarted, or its mailbox was full), and the writer reads
the missing records from the log segments itself before going on. At start it does the
same from the lowest LSN any of its shards still needs: that is the redo recovery of
RocketMQ's design, and it is idempotent because each shard skips LSNs it already has.

Reads carry ``lsn_min``: a read waits (bounded, in a parked list) until the writer has
applied at least that LSN, so a client always reads what it was told is durable.
"""

from __future__ import annotations

import collections
import logging
import shutil
import time
from typing import Any

import msgpack

from actors import faults, wal
from actors.base import Actor, ActorContext, RefuseToStart, waiting_messages
from actors.durable import fsync_dir, write_atomic
from actors.flow import PROGRESS_BYTES_DIVISOR, ProgressReport
from actors.roles import CACHE_MANAGER, FRONT_DOOR, shard_owner, writer_index
from actors.shard_store import (
    TOMBSTONE_SUFFIX,
    ShardStore,
    StoreFormatError,
    StoreMemory,
    parse_shard_dir,
    shard_dir,
)
from wire import logrecord
from wire.codec import Message
from wire.errors import ErrorCode
from wire.logrecord import Entry, Kind
from wire.messages import (
    CatchUp,
    CommittedOffset,
    ErrorReply,
    Flushed,
    FlushTo,
    LogGroup,
    OffsetForTimestamp,
    Progress,
    Read,
    ReadByKey,
    ReadByTag,
    RecordsReply,
    ValueReply,
)
from wire.records import pack_read

log = logging.getLogger("shardnode")

Shard = tuple[int, int]
PARKED_READS_MAX = 10000
SLOW_APPLY_S = 0.25  # with the seam writer.slow_apply armed: the wait before each log record


class ShardWriter(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self.index = writer_index(self.role)
        self.writers = self.cfg.node.writers
        data = self.cfg.data_path
        self.log_dir = data / "log"
        self.shards_dir = data / "shards"
        self.state_file = data / "writers" / f"{self.role}.lsn"
        self.stores: dict[Shard, ShardStore] = {}
        sc = self.cfg.shards
        self.memory = StoreMemory(sc.memtable_bytes_max, sc.block_cache_bytes, sc.write_buffer_bytes)
        self.processed_lsn = 0
        self.catalog_lsn = 0  # every catalog change at or below this LSN is applied
        self.parked: collections.deque[tuple[float, Any]] = collections.deque()
        self.applied_records = 0
        self.caught_up_bytes = 0
        self.recovery_ms = 0.0
        self.last_flush_ms = 0.0
        self.progress = ProgressReport(  # to the cache manager
            self.cfg.limits.group_bytes_queued_max // PROGRESS_BYTES_DIVISOR)
        self.slow_apply_s = SLOW_APPLY_S if faults.armed("writer.slow_apply") else 0.0

    def owns(self, topic_id: int, partition: int) -> bool:
        return shard_owner(topic_id, partition, self.writers) == self.index

    # ---- start and stop ---------------------------------------------------------------

    def on_start(self) -> None:
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        if self.state_file.exists():
            self.catalog_lsn = int(self.state_file.read_text().strip() or 0)
        for d in sorted(self.shards_dir.iterdir()):
            if d.name.endswith(TOMBSTONE_SUFFIX):
                shutil.rmtree(d, ignore_errors=True)  # a deletion cut short by a crash
                continue
            shard = parse_shard_dir(d.name)
            if shard is None:
                continue
            topic_id, partition = shard
            if self.owns(topic_id, partition):
                try:
                    self.stores[(topic_id, partition)] = ShardStore(d, topic_id, partition, self.memory)
                except StoreFormatError as exc:
                    raise RefuseToStart(str(exc)) from None
        floor = min([self.catalog_lsn] + [s.applied_lsn for s in self.stores.values()])
        self.processed_lsn = floor
        t0 = time.monotonic()
        self.catch_up(until_lsn=None)
        self.recovery_ms = (time.monotonic() - t0) * 1000
        log.info("%d shards open; replayed the log from LSN %d to %d (%d bytes) in %.0f ms",
                 len(self.stores), floor + 1, self.processed_lsn, self.caught_up_bytes,
                 self.recovery_ms)

    def on_stop(self) -> None:
        if self.crashed:
            # Something failed part-way through applying: what the stores hold in their
            # batches may be half a group. Write nothing; replay from the log redoes it.
            for store in self.stores.values():
                store.close()
            self.stores.clear()
            return
        self.drain_groups()
        for store in self.stores.values():
            try:
                store.finish(max(store.applied_lsn, self.processed_lsn))
                store.flush()
                store.close()
            except Exception:
                log.exception("closing shard %s", store.shard)
        self.stores.clear()
        if self.processed_lsn > self.catalog_lsn:
            # Every catalog change up to here is applied: the next start replays nothing.
            self._save_catalog_lsn(self.processed_lsn)

    def drain_groups(self) -> None:
        """Apply groups still queued behind the Stop (the cache manager stopped first)."""
        for msg in waiting_messages(self.mailbox, 100_000):
            if isinstance(msg, LogGroup):
                self.on_group(msg)

    def _save_catalog_lsn(self, lsn: int) -> None:
        self.catalog_lsn = lsn
        write_atomic(self.state_file, str(lsn).encode())

    # ---- applying ---------------------------------------------------------------------

    def catch_up(self, until_lsn: int | None) -> None:
        """Apply records after ``processed_lsn`` read from the log files (to ``until_lsn``)."""
        segments = wal.list_segments(self.log_dir)
        if segments and self.processed_lsn < segments[0][0] - 1:
            # Records below the log's first LSN were deleted by a checkpoint, which happens
            # only once every shard is durable past them: nothing there is left to apply.
            self.processed_lsn = segments[0][0] - 1
        start = 0
        for i, (first_lsn, _path) in enumerate(segments):
            if first_lsn <= self.processed_lsn + 1:
                start = i
        for i in range(start, len(segments)):
            _first, path = segments[i]
            # A chunk at a time: memory stays a few MiB however far behind this writer is.
            for batch in wal.SegmentScan(path, last=i == len(segments) - 1):
                todo = [e for e in batch if e.lsn > self.processed_lsn
                        and (until_lsn is None or e.lsn <= until_lsn)]
                if todo:
                    self.caught_up_bytes += sum(len(e.payload) for e in todo)
                    self.apply(todo)
                if until_lsn is not None and self.processed_lsn >= until_lsn:
                    return

    def on_group(self, msg: LogGroup) -> None:
        if msg.last_lsn <= self.processed_lsn:
            return
        if msg.first_lsn > self.processed_lsn + 1:
            log.debug("gap %d..%d: reading the log", self.processed_lsn + 1, msg.first_lsn - 1)
            self.catch_up(until_lsn=msg.first_lsn - 1)
            if self.processed_lsn < msg.first_lsn - 1:
                raise RuntimeError(f"the log has no records {self.processed_lsn + 1}.."
                                   f"{msg.first_lsn - 1} that a group after them needs")
        entries = [e for e in logrecord.iter_buffer(msg.data) if e.lsn > self.processed_lsn]
        self.apply(entries)
        self.progress.applied(len(msg.data))

    def apply(self, entries: list[Entry]) -> None:
        touched: set[ShardStore] = set()
        last = self.processed_lsn
        for e in entries:
            last = e.lsn
            # Far behind on a busy machine, at low CPU priority, this can take a while.
            self.keep_alive()
            if self.slow_apply_s:
                time.sleep(self.slow_apply_s)  # the test seam writer.slow_apply
            if e.kind == Kind.PRODUCE:
                _pid, _seq, ts, parts = msgpack.unpackb(e.payload, raw=False)
                for topic_id, partition, first, count, blob in parts:
                    store = self.stores.get((topic_id, partition))
                    if store is None:
                        if self.owns(topic_id, partition):
                            log.warning("LSN %d: no shard t%d-p%d here; skipped", e.lsn,
                                        topic_id, partition)
                        continue
                    self.applied_records += store.apply_produce(e.lsn, first, count, ts, blob)
                    touched.add(store)
            elif e.kind == Kind.OFFSET_COMMIT:
                group, topic_id, partition, offset = e.body()
                store = self.stores.get((topic_id, partition))
                if store is not None:
                    store.apply_offset_commit(e.lsn, group, offset)
                    touched.add(store)
            elif e.kind in (Kind.TOPIC_CREATE, Kind.TOPIC_DELETE):
                for store in touched:  # catalog changes apply in LSN order
                    store.finish(store.batch_lsn)
                touched.clear()
                self.apply_catalog(e)
        for store in touched:
            store.finish(store.batch_lsn)
        self.processed_lsn = last
        if self.parked:
            self.serve_parked()

    def on_idle(self) -> None:
        # The cache manager counts the bytes it sent us until we say they are applied.
        lsn, now = self.processed_lsn, time.monotonic()
        if self.progress.due(lsn, now) and self.send(CACHE_MANAGER, Progress(self.role, lsn), 100):
            self.progress.sent(lsn, now)

    def on_flush_to(self, msg: FlushTo) -> None:
        """Make every shard durable to at least ``msg.lsn`` (a checkpoint's flush step)."""
        if self.processed_lsn < msg.lsn:
            self.catch_up(until_lsn=msg.lsn)  # durable on disk, so the log has it
        t0 = time.monotonic()
        for store in self.stores.values():
            store.finish(max(store.applied_lsn, self.processed_lsn))
            store.flush()
            self.keep_alive()  # hundreds of shards take a while
        if self.processed_lsn > self.catalog_lsn:
            self._save_catalog_lsn(self.processed_lsn)
        faults.crash_point("writer.after_flush", self.cfg.data_path)
        self.last_flush_ms = (time.monotonic() - t0) * 1000
        self.send(CACHE_MANAGER, Flushed(msg.ckpt_id, self.role, self.processed_lsn), wait_ms=1000)

    def apply_catalog(self, e: Entry) -> None:
        if e.lsn <= self.catalog_lsn:
            return
        if e.kind == Kind.TOPIC_CREATE:
            topic_id, _name, partitions = e.body()
            for p in range(partitions):
                if self.owns(topic_id, p) and (topic_id, p) not in self.stores:
                    store = ShardStore(shard_dir(self.shards_dir, topic_id, p), topic_id, p,
                                       self.memory)
                    store.finish(e.lsn)
                    store.flush()
                    self.stores[(topic_id, p)] = store
                    self.keep_alive()  # a wide topic takes a while
        else:
            topic_id, _name = e.body()
            for shard in [s for s in self.stores if s[0] == topic_id]:
                self.stores.pop(shard).destroy()
        fsync_dir(self.shards_dir)
        self._save_catalog_lsn(e.lsn)

    # ---- reading ----------------------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, LogGroup):
            self.on_group(msg)
        elif isinstance(msg, FlushTo):
            self.on_flush_to(msg)
        elif isinstance(msg, CatchUp):
            if msg.lsn > self.processed_lsn:
                log.debug("groups to %d were not sent: reading the log", msg.lsn)
                self.catch_up(until_lsn=msg.lsn)
        elif hasattr(msg, "lsn_min"):
            if msg.lsn_min <= self.processed_lsn:
                self.serve(msg)
            elif len(self.parked) >= PARKED_READS_MAX:
                self.reply_error(msg, ErrorCode.BUSY, "too many reads waiting for this writer")
            else:
                deadline = time.monotonic() + self.cfg.limits.request_timeout_ms / 1000
                self.parked.append((deadline, msg))
        else:
            log.error("shard writer got an unexpected %s", type(msg).__name__)

    def serve_parked(self) -> None:
        keep: collections.deque[tuple[float, Any]] = collections.deque()
        for deadline, msg in self.parked:
            if msg.lsn_min <= self.processed_lsn:
                self.serve(msg)
            else:
                keep.append((deadline, msg))
        self.parked = keep

    def on_tick(self, now: float) -> None:
        if self.parked:
            # Reads wait for an LSN that was acknowledged, so it is in the log files: if
            # its group never reached this writer (a full mailbox), read it from there.
            need = max(msg.lsn_min for _deadline, msg in self.parked)
            if need > self.processed_lsn:
                self.catch_up(until_lsn=need)
                self.serve_parked()
        while self.parked and self.parked[0][0] <= now:
            _deadline, msg = self.parked.popleft()
            self.reply_error(msg, ErrorCode.TIMEOUT,
                             f"writer has applied LSN {self.processed_lsn}, the read needs "
                             f"{msg.lsn_min}")

    def reply_error(self, msg: Any, code: ErrorCode, text: str) -> None:
        self.send(FRONT_DOOR, ErrorReply(msg.corr, code, text), wait_ms=100)

    def serve(self, msg: Any) -> None:
        store = self.stores.get((msg.topic_id, msg.partition))
        if store is None:
            self.reply_error(msg, ErrorCode.UNKNOWN_TOPIC,
                             f"no shard t{msg.topic_id}-p{msg.partition} (topic deleted?)")
            return
        if isinstance(msg, Read):
            rows = store.read(msg.offset, msg.max_records, self.cfg.limits.read_bytes_max)
            out: Any = RecordsReply(msg.corr, pack_read(rows), self.processed_lsn)
        elif isinstance(msg, ReadByKey):
            out = RecordsReply(msg.corr, pack_read(store.read_by_key(msg.key)), self.processed_lsn)
        elif isinstance(msg, ReadByTag):
            rows = store.read_by_tag(msg.tag, msg.offset, msg.max_records,
                                     self.cfg.limits.read_bytes_max)
            out = RecordsReply(msg.corr, pack_read(rows), self.processed_lsn)
        elif isinstance(msg, OffsetForTimestamp):
            out = ValueReply(msg.corr, store.offset_for_timestamp(msg.timestamp))
        elif isinstance(msg, CommittedOffset):
            out = ValueReply(msg.corr, store.committed_offset(msg.group))
        else:
            raise TypeError(type(msg).__name__)
        self.send(FRONT_DOOR, out, wait_ms=100)

    def figures(self) -> dict[str, Any]:
        return {
            "shards": len(self.stores),
            "processed_lsn": self.processed_lsn,
            "applied_records": self.applied_records,
            "parked_reads": len(self.parked),
            "recovery_ms": round(self.recovery_ms, 1),
            "replayed_bytes": self.caught_up_bytes,
            "last_flush_ms": round(self.last_flush_ms, 1),
        }
