"""A shard writer actor: applies durable log records to the RocksDB shards it owns.

Groups arrive from the cache manager as the bytes the log manager wrote. A writer keeps
``processed_lsn``, the last LSN it has gone through; a group that starts beyond it means
groups were missed (this writer restarted, or its mailbox was full), and the writer reads
the missing records from the log segments itself before going on. At start it does the
same from the lowest LSN any of its shards still needs: that is the redo recovery of
RocketMQ's design, and it is idempotent because each shard skips LSNs it already has.

Reads carry ``lsn_min``: a read waits (bounded, in a parked list) until the writer has
applied at least that LSN, so a client always reads what it was told is durable.

A writer lists the shards it made in ``writers/<role>.shards`` (written with every catalog
change it applies, before the change's LSN is saved). After the start's replay every listed
shard it owns must be open: one whose directory is gone (deleted by hand, a lost disk) would
otherwise take writes that the log acknowledged and drop them, so the node refuses to start.

This is the shell: RocksDB, the log files and the sockets. What to apply when, which reads
wait, and what the writer reports are ``actors/writer_state.py``, a state machine with no
I/O whose instructions ``perform`` carries out.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, assert_never

import msgpack

from actors import faults, wal
from actors.base import Actor, ActorContext, RefuseToStart, waiting_messages
from actors.durable import fsync_dir, write_atomic
from actors.flow import PROGRESS_BYTES_DIVISOR
from actors.held_writes import HeldWrite, HeldWrites
from actors.instructions import Apply, Flush, ReadLog, Send, Serve
from actors.roles import FRONT_DOOR, LOG_MANAGER, shard_owner, writer_index
from actors.shard_options import StoreMemory
from actors.shard_store import (
    TOMBSTONE_SUFFIX,
    OutOfRange,
    ShardStore,
    StoreFormatError,
    parse_shard_dir,
    shard_dir,
)
from actors.snapshot_files import HOLD_SHARDS_S, RELEASE_SHARDS_SUFFIX, hold
from actors.writer_state import REPLY_WAIT_MS, WriterInstruction, WriterState, error_reply
from wire import logrecord, views
from wire.codec import Message, encode
from wire.errors import ErrorCode
from wire.logrecord import Entry, Kind
from wire.messages import (
    CatchUp,
    CheckpointShards,
    CommittedOffset,
    Compact,
    FlushTo,
    KvGet,
    KvScan,
    LogGroup,
    OffsetForTimestamp,
    Read,
    ReadByKey,
    ReadByTag,
    ReadRequest,
    RecordsReply,
    ShardsCheckpointed,
    ShardsReply,
    ShardStats,
    ValueReply,
)
from wire.packer import pack
from wire.protocol import KV_PREFIX
from wire.records import pack_read

log = logging.getLogger("shardnode")

Shard = tuple[int, int]
PARKED_READS_MAX = 10000
RETAIN_RECORDS_PER_TICK = 20000  # records retention deletes from one shard a tick (~1 s)
TXN_KINDS = (Kind.TX_START, Kind.DTX_START, Kind.TXN_WRITE, Kind.PREPARE, Kind.COMMIT,
             Kind.ROLLBACK)
SLOW_APPLY_S = 0.25  # with the seam writer.slow_apply armed: the wait before each log record


def body_of(e: Entry) -> Any:
    """A produce's or a transaction write's body. One from a group just received (a view)
    that is large is read with its values as views into the group (``wire.views``): most of
    it may be other writers' shards'."""
    if type(e.payload) is memoryview:
        return views.unpackb(e.payload)
    return msgpack.unpackb(e.payload, raw=False)


def read_shards_file(path: Path) -> set[Shard] | None:
    """The shards a writer's shards file lists (one directory name a line); None when
    there is none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    listed = set()
    for name in text.split():
        shard = parse_shard_dir(name)
        if shard is None:
            raise RefuseToStart(f"{path} lists {name!r}, which names no shard: the file is "
                                f"damaged; remove it to start without the check it allows")
        listed.add(shard)
    return listed


def write_shards_file(path: Path, listed: set[Shard]) -> None:
    write_atomic(path, "".join(f"t{t}-p{p}\n" for t, p in sorted(listed)).encode())


class ShardWriter(Actor):
    # Every writer is handed every group and applies only its own shards' records: their
    # values are read where they lie in the frame (views, ``wire.views``), and the records
    # of other writers' shards are never copied.
    VIEW_TAGS = frozenset({LogGroup.TAG})

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self.index = writer_index(self.role)
        self.writers = self.cfg.node.writers
        self.node_id = self.cfg.cluster.node_id  # 0: a single node
        data = self.cfg.data_path
        self.log_dir = data / "log"
        self.shards_dir = data / "shards"
        self.state_file = data / "writers" / f"{self.role}.lsn"
        self.shards_file = data / "writers" / f"{self.role}.shards"
        self.stores: dict[Shard, ShardStore] = {}
        # The shards this writer made whose topic it has not seen deleted: what the shards
        # file says, kept by the catalog changes applied (``apply_catalog``).
        self.listed: set[Shard] = set()
        sc = self.cfg.shards
        self.memory = StoreMemory.of(sc, self.cfg.storage)
        self.state = WriterState(
            self.role, PARKED_READS_MAX,
            read_wait_s=self.cfg.limits.request_timeout_ms / 1000,
            progress_bytes_min=self.cfg.limits.group_bytes_queued_max // PROGRESS_BYTES_DIVISOR)
        # The last LSN gone through. The code that applies records keeps it (the log reading
        # compares every record with it, so it is a plain attribute); the state hears of
        # every change through ``WriterState.applied``.
        self.processed_lsn = 0
        # Transactions' writes, held until their commit (actors/held_writes.py).
        self.held = HeldWrites(sc.held_bytes_max)
        # The last transaction commit gone through: a read's answer says it reflects it.
        self.commit_lsn = 0
        self.catalog_lsn = 0  # every catalog change at or below this LSN is applied
        self.applied_records = 0
        self.retained = 0  # records retention deleted
        self.caught_up_bytes = 0
        self.log_seen_lsn = 0  # the highest LSN read from the log files (``catch_up``)
        self.recovery_ms = 0.0
        self.last_flush_ms = 0.0
        self.slow_apply_s = SLOW_APPLY_S if faults.armed("writer.slow_apply") else 0.0
        # Answers to the front door, held until the end of the burst that made them and
        # sent as one Bundle: a send per answer cost a third of a writer's time under
        # 64 reads in flight (sampled with py-spy).
        self.answers: list[tuple[bytes, Message]] = []

    def owns(self, topic_id: int, partition: int) -> bool:
        """This writer keeps the shard if it lives on this node (shards of partitions placed
        on other members of a cluster are never created here)."""
        return shard_owner(topic_id, partition, self.writers) == self.index

    # ---- start and stop ---------------------------------------------------------------

    def on_start(self) -> None:
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        if self.state_file.exists():
            self.catalog_lsn = int(self.state_file.read_text().strip() or 0)
        listed = read_shards_file(self.shards_file)
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
                except Exception as exc:
                    if "Corruption" not in str(exc):
                        raise  # another failure (I/O, say): the actor fails, to be restarted
                    # No restart mends it: the node stops, naming the shard.
                    raise RefuseToStart(f"shard {d} is damaged ({exc}): restore the data dir "
                                        f"from a snapshot export (shardnode start "
                                        f"--from-snapshot)") from None
        # A shard needs the log from its applied LSN on, or from the transaction writes the
        # writer held in memory when it stopped, to hold them again.
        floor = min([self.catalog_lsn] + [s.held_lsn - 1 if s.held_lsn else s.applied_lsn
                                          for s in self.stores.values()])
        self.processed_lsn = floor
        # A data dir from before the shards file (or from a snapshot export): what is here.
        self.listed = set(self.stores) if listed is None else listed
        t0 = time.monotonic()
        self.perform(self.state.recover(floor))
        self.check_log_reaches(max([self.catalog_lsn] + [s.applied_lsn
                                                         for s in self.stores.values()]))
        missing = sorted(s for s in self.listed if self.owns(*s) and s not in self.stores)
        if missing:
            dirs = ", ".join(str(shard_dir(self.shards_dir, *s)) for s in missing)
            raise RefuseToStart(
                f"{len(missing)} shard(s) missing: {dirs}. This writer made them and their "
                f"topics were not deleted ({self.shards_file} lists them), so their records "
                f"are gone with them, and the writes the log takes for them would be lost: "
                f"restore the data dir from a backup or a snapshot export (shardnode start "
                f"--from-snapshot)")
        if listed is None:
            write_shards_file(self.shards_file, self.listed)
        # Commits below here were applied before this start: a read may reflect any of them.
        self.commit_lsn = self.processed_lsn
        self.recovery_ms = (time.monotonic() - t0) * 1000
        log.info("%d shards open; replayed the log from LSN %d to %d (%d bytes) in %.0f ms",
                 len(self.stores), floor + 1, self.processed_lsn, self.caught_up_bytes,
                 self.recovery_ms)

    def check_log_reaches(self, applied: int) -> None:
        """Refuse to start when what is here has applied the log further than the log goes:
        its files were deleted, or another data dir's put in. Started anyway, the node
        wrote new records under LSNs these shards count as applied (a topic made again
        reused an old shard, and acknowledged records were never applied)."""
        if applied == 0:
            return
        segments = wal.list_segments(self.log_dir)
        # A segment is named by its first LSN: every LSN before it was written.
        end = max([first - 1 for first, _path in segments] + [self.log_seen_lsn])
        if end >= applied:
            return
        try:  # rarely needed: the newest records may have been cut by a checkpoint
            snapshot, _slot = wal.load_snapshot(self.log_dir)
        except (wal.CorruptSnapshot, OSError):  # the log manager judged them before: none
            snapshot = None
        if snapshot is not None and snapshot["last_lsn"] >= applied:
            return
        end = max(end, snapshot["last_lsn"] if snapshot is not None else 0)
        raise RefuseToStart(
            f"the log in {self.log_dir} ends at LSN {end}, but this writer's shards have "
            f"applied it to LSN {applied}: log files are missing (deleted, moved aside, or "
            f"from another data dir). Starting would write new records under LSNs counted "
            f"as applied, and lose them. Put the log files back, or restore the data dir "
            f"from a backup or a snapshot export (shardnode start --from-snapshot)")

    def on_stop(self) -> None:
        self.send_answers()
        if self.crashed:
            # Something failed part-way through applying: what the stores hold in their
            # batches may be half a group. Write nothing; replay from the log redoes it.
            for store in self.stores.values():
                store.close()
            self.stores.clear()
            return
        self.drain_groups()
        self.stage_held()
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
                if batch and batch[-1].lsn > self.log_seen_lsn:
                    self.log_seen_lsn = batch[-1].lsn
                todo = [e for e in batch if e.lsn > self.processed_lsn
                        and (until_lsn is None or e.lsn <= until_lsn)]
                if todo:
                    self.caught_up_bytes += sum(len(e.payload) for e in todo)
                    self.apply(todo)
                if until_lsn is not None and self.processed_lsn >= until_lsn:
                    return

    def on_group(self, msg: LogGroup) -> None:
        self.perform(self.state.group(msg.first_lsn, msg.last_lsn, msg.data))

    def apply_group(self, first_lsn: int, data: bytes) -> None:
        if first_lsn > self.processed_lsn + 1:  # the ReadLog before it fell short
            raise RuntimeError(f"the log has no records {self.processed_lsn + 1}.."
                               f"{first_lsn - 1} that a group after them needs")
        entries = [e for e in logrecord.iter_buffer(data) if e.lsn > self.processed_lsn]
        self.apply(entries)

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
                _pid, _seq, ts, parts = body_of(e)
                for topic_id, partition, first, count, blob in parts:
                    store = self.stores.get((topic_id, partition))
                    if store is None:
                        if self.owns(topic_id, partition):
                            log.warning("LSN %d: no shard t%d-p%d here; skipped", e.lsn,
                                        topic_id, partition)
                        continue
                    self.applied_records += store.apply_produce(e.lsn, first, count, ts, blob)
                    touched.add(store)
            elif e.kind == Kind.DELETE:
                topic_id, partition, offset, key = e.body()
                store = self.stores.get((topic_id, partition))
                if store is not None:
                    store.apply_delete(e.lsn, offset, key)
                    touched.add(store)
            elif e.kind == Kind.OFFSET_COMMIT:
                group, topic_id, partition, offset = e.body()
                store = self.stores.get((topic_id, partition))
                if store is not None:
                    store.apply_offset_commit(e.lsn, group, offset)
                    touched.add(store)
            elif e.kind in TXN_KINDS:
                self.apply_txn(e, touched)
            elif e.kind in (Kind.TOPIC_CREATE, Kind.TOPIC_DELETE, Kind.TOPIC_ALTER):
                for store in touched:  # catalog changes apply in LSN order
                    store.finish(store.batch_lsn)
                touched.clear()
                self.apply_catalog(e)
        for store in touched:
            store.finish(store.batch_lsn)
        self.processed_lsn = last
        if self.held.over():
            self.stage_held()
        self.perform(self.state.applied(last))

    def apply_txn(self, e: Entry, touched: set[ShardStore]) -> None:
        """A transaction's record: hold its writes (``actors/held_writes.py``), commit them
        (offsets, visible), or drop them, in the shards here (``actors/shard_store.py``)."""
        kind = e.kind
        if kind == Kind.TXN_WRITE:
            txn, ts, parts, offsets = body_of(e)
            for i, (topic_id, partition, count, blob) in enumerate(parts):
                store = self.stores.get((topic_id, partition))
                if store is None:
                    continue
                # Past the shard's applied LSN; or held before this writer restarted, in
                # memory only: held again (a copy: a view would keep its whole group).
                if store.hold(e.lsn) or e.lsn >= store.held_from_lsn > 0:
                    self.held.hold(txn, store.shard, HeldWrite(e.lsn, i, ts, count, bytes(blob)))
                    touched.add(store)
        elif kind == Kind.COMMIT:
            txn, placed, offsets = e.body()
            for topic_id, partition, first, count in placed:
                store = self.stores.get((topic_id, partition))
                if store is not None:
                    held = [(w.lsn, w.part, w.ts, w.count, w.blob)
                            for w in self.held.take(txn, store.shard)]
                    store.held_lsn = self.held.oldest(store.shard)
                    self.applied_records += store.apply_commit(e.lsn, txn, first, count, held)
                    touched.add(store)
            for group, topic_id, partition, offset in offsets:
                store = self.stores.get((topic_id, partition))
                if store is not None:
                    store.apply_offset_commit(e.lsn, group, offset)
                    touched.add(store)
            self.commit_lsn = e.lsn
        elif kind == Kind.ROLLBACK:
            txn, shards = e.body()[:2]  # and from log format 3 on, the reason
            for topic_id, partition in shards:
                store = self.stores.get((topic_id, partition))
                if store is not None:
                    self.held.take(txn, store.shard)
                    store.held_lsn = self.held.oldest(store.shard)
                    store.apply_rollback(e.lsn, txn)
                    touched.add(store)
        # TX_START, DTX_START, PREPARE: nothing in the shards

    def on_idle(self) -> None:
        self.send_answers()
        self.perform(self.state.idle(time.monotonic()))

    def send_answers(self) -> None:
        """Send the answers held for the front door, in order; those its mailbox had no
        room for within ``REPLY_WAIT_MS`` go to the state as refused."""
        if not self.answers:
            return
        answers, self.answers = self.answers, []
        sent = self.send_many(FRONT_DOOR, [frame for frame, _m in answers], REPLY_WAIT_MS)
        for _frame, msg in answers[sent:]:
            self.perform(self.state.refused(msg))

    def stage_held(self) -> None:
        """Write the transaction writes held in memory into their shards' ``staged``
        (past the budget, and before a checkpoint may delete the log that has them)."""
        for shard, writes in self.held.take_all().items():
            store = self.stores.get(shard)
            if store is not None:
                store.stage([(txn, w.lsn, w.part, w.ts, w.count, w.blob) for txn, w in writes])
                self.keep_alive()

    def flush(self) -> None:
        """Make every shard durable to the applied LSN (a checkpoint's flush step), the
        transaction writes held in memory staged first: the log before this may go."""
        t0 = time.monotonic()
        self.stage_held()
        for store in self.stores.values():
            store.finish(max(store.applied_lsn, self.processed_lsn))
            store.flush()
            self.keep_alive()  # hundreds of shards take a while
        if self.processed_lsn > self.catalog_lsn:
            self._save_catalog_lsn(self.processed_lsn)
        faults.crash_point("writer.after_flush", self.cfg.data_path)
        self.last_flush_ms = (time.monotonic() - t0) * 1000

    def apply_catalog(self, e: Entry) -> None:
        if e.lsn <= self.catalog_lsn:
            return
        relist = False  # the shards file changes: a shard made here, or a topic's gone
        if e.kind == Kind.TOPIC_ALTER:
            topic_id, _name, settings = e.body()
            for shard, store in self.stores.items():
                if shard[0] == topic_id:
                    store.set_settings(e.lsn, settings)
                    store.finish(e.lsn)
        elif e.kind == Kind.TOPIC_CREATE:
            topic_id, name, partitions, *owners = e.body()
            settings = owners[1] if len(owners) > 1 else {}
            here = [p for p in range(partitions)  # in a cluster, the partitions placed here
                    if not owners or not owners[0] or owners[0][p] == self.node_id]
            kv = name.startswith(KV_PREFIX)
            for p in here:
                found = self.stores.get((topic_id, p))
                if found is not None and found.kv != kv and found.applied_lsn < e.lsn:
                    # Its creation was cut short before its first flush: RocksDB's files
                    # without every column family, from which the open told its kind
                    # wrong (a namespace's records then failed its writer at every start).
                    log.warning("shard t%d-p%d was made before its creation was durable: "
                                "opened again as %s", topic_id, p,
                                "a namespace's" if kv else "a topic's")
                    found.close()
                    del self.stores[(topic_id, p)]
                if self.owns(topic_id, p) and (topic_id, p) not in self.stores:
                    store = ShardStore(shard_dir(self.shards_dir, topic_id, p), topic_id, p,
                                       self.memory, kv=kv)
                    if settings:
                        store.set_settings(e.lsn, settings)
                    store.finish(e.lsn)
                    store.flush()
                    self.stores[(topic_id, p)] = store
                    self.keep_alive()  # a wide topic takes a while
                if (topic_id, p) in self.stores and (topic_id, p) not in self.listed:
                    self.listed.add((topic_id, p))
                    relist = True
        else:
            topic_id, _name = e.body()
            for shard in [s for s in self.stores if s[0] == topic_id]:
                self.held.drop_shard(shard)
                self.stores.pop(shard).destroy()
            gone = {s for s in self.listed if s[0] == topic_id}
            self.listed -= gone
            relist = bool(gone)
        fsync_dir(self.shards_dir)
        if relist:
            # Before the LSN: a crash between the two replays the change, which is idempotent.
            write_shards_file(self.shards_file, self.listed)
        self._save_catalog_lsn(e.lsn)

    # ---- messages, and carrying out the state's instructions -------------------------

    def on_message(self, msg: Message) -> None:
        match msg:
            case LogGroup():
                self.on_group(msg)
            case FlushTo(ckpt_id, lsn):
                self.perform(self.state.flush_to(ckpt_id, lsn))
            case CatchUp(lsn):
                self.perform(self.state.catch_up(lsn))
            case (Read() | ReadByKey() | ReadByTag() | OffsetForTimestamp() | CommittedOffset()
                  | KvGet() | KvScan()):
                self.perform(self.state.read(msg, time.monotonic()))
            case ShardStats() | Compact():
                self.send_answers()  # a compaction takes a while
                self.perform([self.shards_reply(msg)])
            case CheckpointShards(export_id, directory):
                self.send_answers()
                self.perform([self.checkpoint_shards(export_id, directory)])
            case _:
                self.unexpected(msg)

    def on_tick(self, now: float) -> None:
        self.perform(self.state.tick(now))  # reads behind: read the log for them first
        self.perform(self.state.expire(now))
        self.retain()

    def retain(self) -> None:
        """Retention, in the background (a tick at most ``RETAIN_RECORDS_PER_TICK`` records
        a shard): the oldest records of shards past their topic's ``retention_ms`` or
        ``retention_bytes`` are deleted, and reads below the new earliest offset answer
        OFFSET_OUT_OF_RANGE."""
        now_ms = int(time.time() * 1000)
        for store in self.stores.values():
            if store.settings:
                self.retained += store.retain(now_ms, RETAIN_RECORDS_PER_TICK)
                self.keep_alive()

    def perform(self, instructions: list[WriterInstruction]) -> None:
        for ins in instructions:
            match ins:
                case Apply(first_lsn, data):
                    self.send_answers()  # before work that may take a while
                    self.apply_group(first_lsn, data)
                case ReadLog(until_lsn):
                    self.send_answers()
                    self.catch_up(until_lsn)
                    # Where it got to, records applied or not (the log may start past it).
                    self.perform(self.state.applied(self.processed_lsn))
                case Serve(request):
                    self.serve(request)
                case Flush(ckpt_id):
                    self.send_answers()
                    self.flush()
                    self.perform(self.state.flushed(ckpt_id))
                case Send(role, msg, wait_ms) if role == FRONT_DOOR:
                    self.answers.append((encode(msg), msg))
                case Send(role, msg, wait_ms):
                    if not self.send(role, msg, wait_ms):
                        self.perform(self.state.refused(msg))
                case _:
                    assert_never(ins)

    def serve(self, msg: ReadRequest) -> None:
        """Answer a read from the shard it names; a read that fails is answered INTERNAL."""
        try:
            out = self.read(msg)
        except OutOfRange as exc:
            out = error_reply(msg.corr, ErrorCode.OFFSET_OUT_OF_RANGE,
                              f"partition {msg.partition} keeps offsets from {exc.earliest} on "
                              f"(retention deleted the older) (earliest: {exc.earliest})")
        except Exception as exc:
            log.exception("%s failed", type(msg).__name__)
            out = error_reply(msg.corr, ErrorCode.INTERNAL, f"the shard writer failed to read: {exc}")
        self.perform([out])

    def read(self, msg: ReadRequest) -> Send:
        store = self.stores.get((msg.topic_id, msg.partition))
        if store is None:
            return error_reply(msg.corr, ErrorCode.UNKNOWN_TOPIC,
                               f"no shard t{msg.topic_id}-p{msg.partition} (topic deleted?)")
        lsn, bytes_max, clsn = self.processed_lsn, self.cfg.limits.read_bytes_max, self.commit_lsn
        reply: Message
        match msg:
            case Read():
                rows = store.read(msg.offset, msg.max_records, bytes_max)
                reply = RecordsReply(msg.corr, pack_read(rows), lsn, clsn)
            case ReadByKey():
                reply = RecordsReply(msg.corr, pack_read(store.read_by_key(msg.key)), lsn, clsn)
            case ReadByTag():
                rows = store.read_by_tag(msg.tag, msg.offset, msg.max_records, bytes_max)
                reply = RecordsReply(msg.corr, pack_read(rows), lsn, clsn)
            case OffsetForTimestamp():
                reply = ValueReply(msg.corr, store.offset_for_timestamp(msg.timestamp), clsn)
            case CommittedOffset():
                reply = ValueReply(msg.corr, store.committed_offset(msg.group), clsn)
            case KvGet():
                value = store.kv_get(msg.key)
                pairs = [] if value is None else [[msg.key, value]]
                reply = RecordsReply(msg.corr, pack(pairs), lsn, clsn)
            case KvScan():
                pairs = store.kv_scan(msg.prefix, msg.start_after, msg.limit, bytes_max)
                reply = RecordsReply(msg.corr, pack(pairs), lsn, clsn)
            case _:
                assert_never(msg)
        return Send(FRONT_DOOR, reply, wait_ms=REPLY_WAIT_MS)

    def shards_reply(self, msg: ShardStats | Compact) -> Send:
        """RocksDB's figures of every shard here (``stats``), or a topic's shards compacted
        (``compact``); rows as ``wire.protocol`` lists them, the topic as its id."""
        try:
            rows: list[list[Any]] = []
            writer: list[Any] = []
            if isinstance(msg, ShardStats):
                for (topic_id, partition), store in sorted(self.stores.items()):
                    rows.append([topic_id, partition, self.index, *store.stats()])
                usage = next((s.cf["meta"].property_int_value("rocksdb.block-cache-usage")
                              for s in self.stores.values()), None)
                writer = [self.index, len(self.stores), usage or 0,
                          self.memory.block_cache_bytes, *self.memory.cache_figures()]
            else:
                for (topic_id, partition), store in sorted(self.stores.items()):
                    if topic_id != msg.topic_id:
                        continue
                    store.finish(max(store.applied_lsn, self.processed_lsn))
                    before, after = store.compact(self.keep_alive)
                    log.info("compacted shard t%d-p%d: %d → %d SST bytes", topic_id, partition,
                             before, after)
                    rows.append([topic_id, partition, before, after])
        except Exception as exc:
            log.exception("%s failed", type(msg).__name__)
            return error_reply(msg.corr, ErrorCode.INTERNAL, f"{self.role}: {exc}")
        return Send(FRONT_DOOR, ShardsReply(msg.corr, rows, writer), wait_ms=REPLY_WAIT_MS)

    def checkpoint_shards(self, export_id: int, directory: str) -> Send:
        """A snapshot export: a RocksDB checkpoint of every shard here into
        ``directory``/shards, each holding every record up to ``processed_lsn``."""
        rows: list[list[int]] = []
        size, error = 0, ""
        t0 = time.monotonic()
        try:
            self.stage_held()  # the export has the log from its LSN on only
            for (topic_id, partition), store in sorted(self.stores.items()):
                store.finish(max(store.applied_lsn, self.processed_lsn))
                target = shard_dir(Path(directory) / "shards", topic_id, partition)
                size += store.checkpoint(target, self.keep_alive)
                rows.append([topic_id, partition, store.applied_lsn])
                self.keep_alive()
            if faults.armed("export.hold_shards"):  # a test holds the answer
                hold(Path(directory), RELEASE_SHARDS_SUFFIX, time.monotonic() + HOLD_SHARDS_S,
                     self.keep_alive)
        except Exception as exc:
            log.exception("checkpointing the shards for an export failed")
            error = f"{type(exc).__name__}: {exc}"
        log.info("export %d: %d shards checkpointed to LSN %d (%d bytes) in %.0f ms", export_id,
                 len(rows), self.processed_lsn, size, (time.monotonic() - t0) * 1000)
        return Send(LOG_MANAGER, ShardsCheckpointed(export_id, self.role, self.processed_lsn,
                                                    rows, size, error), wait_ms=1000)

    def figures(self) -> dict[str, Any]:
        return {
            "shards": len(self.stores),
            "processed_lsn": self.processed_lsn,
            "applied_records": self.applied_records,
            "retention_deleted": self.retained,
            "parked_reads": len(self.state.parked),
            "recovery_ms": round(self.recovery_ms, 1),
            "replayed_bytes": self.caught_up_bytes,
            "last_flush_ms": round(self.last_flush_ms, 1),
        }
