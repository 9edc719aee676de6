"""The log manager actor: the write-ahead log, its LSNs, and asynchronous group commit.

Requests queue in its mailbox. After each burst it writes every queued record with one
``write`` and one ``fdatasync``, then acknowledges them all (SwiftMQ's group commit). A lone
producer is written at once; while an fsync runs, the next crowd queues up and shares the
next one. When the previous group held more than one request, it waits up to
``group_wait_us_max`` for stragglers before committing, so a busy log batches more.

Once a group is durable its requests are acknowledged, and the group flows on, as the very
bytes written, to the cache manager (which hands it to the shard writers). When writes come
through the transaction manager (``blocking`` checkpoints) it is told which requests ended;
otherwise they come straight from the front door and it is told nothing (``writes_role``).
An fsync error is fatal: the process exits at once and recovery
rebuilds the truth from the disk. The log manager also drives the checkpoint handshake
(``actors/checkpoint.py``) that lets it delete old segments.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import itertools
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, assert_never

import zmq

from actors import faults
from actors.base import POLL_MS_MAX, Actor, ActorContext, RefuseToStart
from actors.checkpoint import Coordinator, Phase, Step
from actors.durable import fsync_dir
from actors.flow import BUNDLE_BYTES_MAX, GroupsInFlight, chunks
from actors.instructions import AskFlush, AskTxn, Finish, Log, Roll, Send, Truncate
from actors.log_state import LogState
from actors.process import EXIT_FSYNC_FAILED
from actors.roles import CACHE_MANAGER, FRONT_DOOR, TRANSACTION_MANAGER, writes_role
from wire import codec, logrecord
from wire.codec import Message
from wire.errors import ErrorCode
from wire.logrecord import HEADER_BYTES, CorruptLog
from wire.messages import (
    Ack,
    AckRow,
    Acks,
    Append,
    Catalog,
    CatchUp,
    Checkpoint,
    CheckpointFinished,
    CheckpointReady,
    CheckpointRequest,
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    Done,
    Ended,
    ErrorReply,
    Flushed,
    FlushTo,
    Hello,
    ListTopics,
    LogGroup,
    LogRequest,
    Progress,
    Writes,
)

log = logging.getLogger("shardnode")

# What one row of an Acks message takes encoded, at most: a row, and each of its parts.
ACK_ROW_BYTES = 32
ACK_PART_BYTES = 32

# The transaction manager hears which requests were answered at least this often (s), or
# once this many are waiting to be told, and at once while a checkpoint waits for it.
ENDED_INTERVAL_S = 0.05
ENDED_ROWS_MAX = 8192

HAND_OFF_S = 0.002  # durable groups wait at most this long to go to the cache manager ...
HAND_OFF_BYTES = 1 << 20  # ... or until this many bytes of them wait

FSYNC_SAMPLES = 4096  # recent write+fdatasync durations kept for status


class SegmentWriter:
    """Appends to the newest segment of a log directory, rolling at a size limit."""

    def __init__(self, log_dir: Path, segment_bytes_max: int) -> None:
        self.log_dir = log_dir
        self.segment_bytes_max = segment_bytes_max
        self.fd = -1
        self.size = 0
        self.path: Path | None = None

    def open_existing(self, path: Path, size: int) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.path = path
        self.size = size

    def roll(self, first_lsn: int) -> None:
        """Start the segment whose first record will have ``first_lsn``."""
        if self.fd >= 0 and self.size == 0:
            return  # the current segment is still empty: keep it
        if self.fd >= 0:
            os.close(self.fd)
        self.path = self.log_dir / logrecord.segment_name(first_lsn)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644)
        self.size = 0
        fsync_dir(self.log_dir)

    def append(self, data: bytes, first_lsn: int) -> None:
        """Write ``data`` and fdatasync it. Raises OSError, which the caller treats as fatal."""
        if self.fd < 0 or (self.size > 0 and self.size + len(data) > self.segment_bytes_max):
            self.roll(first_lsn)
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        if faults.fails("log.fsync", self.log_dir.parent):
            raise OSError(errno.EIO, "injected fsync failure")
        os.fdatasync(self.fd)
        self.size += len(data)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


SNAPSHOT_GROW_BYTES = 64 * 1024


def write_snapshot(log_dir: Path, slot: int, data: bytes) -> None:
    """Overwrite snapshot slot ``slot`` in place with ``data`` and make it durable.

    A slot's file only grows, in steps of ``SNAPSHOT_GROW_BYTES`` filled with zeros, so most
    writes change no metadata and the fdatasync costs no journal commit; no rename and no
    directory fsync either, which on ext4 would contend with the log's own fdatasyncs. The
    other slot keeps the previous snapshot until this one is durable."""
    path = log_dir / logrecord.SNAPSHOT_SLOTS[slot]
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        need = -(-len(data) // SNAPSHOT_GROW_BYTES) * SNAPSHOT_GROW_BYTES
        if size < need:
            _write_all(fd, bytes(need - size), size)
        _write_all(fd, data, 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(log_dir)
    legacy = log_dir / logrecord.SNAPSHOT_NAME_BEFORE_SLOTS
    if legacy.exists():
        legacy.unlink()  # older than this slot; recovery would pass it over anyway


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def delete_segments_upto(log_dir: Path, upto: int) -> int:
    """Delete the segments whose every record has LSN ≤ ``upto`` (never the newest one).

    No directory fsync: a deletion that a crash undoes brings back a segment whose records
    are all in the durable snapshot and every shard, which recovery and the writers skip,
    and the next checkpoint deletes it again."""
    segments = logrecord.list_segments(log_dir)
    deleted = 0
    for (_first, path), (next_first, _next) in itertools.pairwise(segments):
        if next_first - 1 <= upto:
            path.unlink()
            deleted += 1
    return deleted


@dataclasses.dataclass(frozen=True, slots=True)
class TruncateResult:
    ckpt_id: int
    upto: int
    deleted: int
    error: str


class Truncator:
    """A checkpoint's file work, off the log manager's commit path.

    Done inline, building the snapshot and the file system calls stalled every
    acknowledgement for 10-26 ms per checkpoint. Now the commit thread only copies the
    state (the producers' windows hold packed entries, so a copy is one dict copy per
    producer), and a thread encodes it (about 1 ms for ten thousand window entries), writes
    it to a snapshot slot, deletes the segments, and wakes the actor's loop through an
    inproc socket; the loop then calls ``collect``. One job at a time (the coordinator
    starts no checkpoint while one is truncating)."""

    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], log_dir: Path, data_dir: Path) -> None:
        self.log_dir = log_dir
        self.data_dir = data_dir
        address = f"inproc://truncator-{id(self)}"
        self.wake = zctx.socket(zmq.PAIR)
        self.wake.setsockopt(zmq.LINGER, 0)
        self.wake.bind(address)
        self._ping = zctx.socket(zmq.PAIR)  # used by the job's thread only
        self._ping.setsockopt(zmq.LINGER, 0)
        self._ping.connect(address)
        self.thread: threading.Thread | None = None
        self.result: TruncateResult | None = None
        self.next_slot = 0  # the snapshot slot not holding the newest snapshot

    def after_recovery(self, newest_slot: int) -> None:
        self.next_slot = 1 - newest_slot if newest_slot >= 0 else 0

    @property
    def busy(self) -> bool:
        return self.thread is not None

    def start(self, ckpt_id: int, upto: int, snapshot: dict[str, Any]) -> None:
        """Write ``snapshot`` (taken when the state was exactly what is durable), then
        delete the segments holding only LSNs ≤ ``upto``."""
        if self.thread is not None:
            raise RuntimeError("a truncate job is already running")
        slot, self.next_slot = self.next_slot, 1 - self.next_slot
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(ckpt_id, upto, snapshot, slot),
                                       name="truncate", daemon=True)
        self.thread.start()

    def _run(self, ckpt_id: int, upto: int, snapshot: dict[str, Any], slot: int) -> None:
        deleted, error = 0, ""
        try:
            write_snapshot(self.log_dir, slot, logrecord.encode_snapshot(snapshot))
        except OSError as exc:
            # Nothing is lost: no segment is deleted, and the other slot still holds the
            # newest valid snapshot. The next checkpoint writes this slot again, so that a
            # crash during that write cannot spoil the only good one.
            self.next_slot = slot
            error = f"writing snapshot slot {slot} failed: {exc}"
        if not error:
            faults.crash_point("checkpoint.after_snapshot", self.data_dir)
            try:
                deleted = delete_segments_upto(self.log_dir, upto)
            except OSError as exc:
                error = f"deleting segments failed: {exc}"  # the next checkpoint retries
            faults.crash_point("checkpoint.after_truncate", self.data_dir)
        self.result = TruncateResult(ckpt_id, upto, deleted, error)
        self._ping.send(b"")

    def collect(self, timeout_s: float = 0.0) -> TruncateResult | None:
        """The finished job's result, waiting up to ``timeout_s`` for it; None if none."""
        if self.thread is None:
            return None
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            return None
        self.thread = None
        while self.wake.poll(0, zmq.POLLIN):
            self.wake.recv()
        return self.result

    def close(self) -> None:
        self.wake.close(0)
        self._ping.close(0)


@dataclasses.dataclass(frozen=True, slots=True)
class Recovered:
    replayed_bytes: int
    torn_bytes: int
    last_segment: Path | None
    last_segment_bytes: int  # its valid length, where appends continue
    snapshot_slot: int  # where the snapshot loaded came from (-1: none, or from before slots)


def recover(log_dir: Path, state: LogState) -> Recovered:
    """Load the newest snapshot, replay every later record into ``state``, cut a torn tail.

    Raises ``CorruptLog`` when damage is followed by valid records or LSNs skip.
    """
    snap, slot = logrecord.load_snapshot(log_dir)
    if snap is not None:
        state.restore(snap)
    segments = logrecord.list_segments(log_dir)
    if segments and segments[0][0] > state.last_lsn + 1:
        raise CorruptLog(segments[0][1], 0, f"the log starts at LSN {segments[0][0]} but the "
                         f"snapshot ends at {state.last_lsn}: records are missing")
    replayed = 0
    torn = 0
    last_path: Path | None = None
    last_size = 0
    for i, (_first_lsn, path) in enumerate(segments):
        is_last = i == len(segments) - 1
        scan = logrecord.scan_bytes(path, path.read_bytes(), last=is_last)
        for entry in scan.entries:
            if entry.lsn <= state.last_lsn:
                continue  # in the snapshot already
            if entry.lsn != state.last_lsn + 1:
                raise CorruptLog(path, entry.position,
                                 f"LSN {entry.lsn} follows {state.last_lsn}: records are missing")
            state.replay(entry)
            replayed += HEADER_BYTES + len(entry.payload)
        if is_last:
            last_path, last_size = path, scan.valid_bytes
            if scan.torn_bytes:
                torn = scan.torn_bytes
                log.warning("cutting a torn tail of %d bytes off %s at byte %d",
                            torn, path.name, scan.valid_bytes)
                with open(path, "r+b") as f:
                    f.truncate(scan.valid_bytes)
                    os.fsync(f.fileno())
    return Recovered(replayed, torn, last_path, last_size, slot)




class HandOff:
    """Durable groups waiting to go to the cache manager, merged into one: at most
    ``HAND_OFF_S`` after the first is durable, or once ``HAND_OFF_BYTES`` are waiting.
    Handing each group on at once woke the cache manager and every writer once per group
    commit, hundreds of times a second under single-record load."""

    def __init__(self) -> None:
        self.datas: list[bytes] = []
        self.first_lsn = 0
        self.last_lsn = 0
        self.size = 0
        self.due = 0.0

    def add(self, first_lsn: int, last_lsn: int, data: bytes, now: float) -> None:
        if not self.datas:
            self.first_lsn, self.size, self.due = first_lsn, 0, now + HAND_OFF_S
        self.datas.append(data)
        self.last_lsn = last_lsn
        self.size += len(data)

    def full(self) -> bool:
        return self.size >= HAND_OFF_BYTES

    def take(self) -> tuple[int, int, bytes]:
        """The merged group: first LSN, last LSN, its records. Only when ``datas``."""
        datas, self.datas, self.size = self.datas, [], 0
        return self.first_lsn, self.last_lsn, datas[0] if len(datas) == 1 else b"".join(datas)


class LogManager(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        lcfg = self.cfg.log
        self.state = LogState(lcfg.producers_max, lcfg.producer_window_max,
                              self.cfg.limits.shards_max, lcfg.producer_entries_max)
        self.log_dir = self.cfg.data_path / "log"
        self.writer = SegmentWriter(self.log_dir, lcfg.segment_bytes_max)
        self.ckpt = Coordinator(lcfg.checkpoint_mode, lcfg.checkpoint_timeout_ms / 1000)
        self.queue: list[Log] = []
        self.queued_bytes = 0
        # Requests answered since the transaction manager was told: only when it began them.
        self.track_ended = writes_role(self.cfg) == TRANSACTION_MANAGER
        self.ended: list[int] = []
        self.ended_told = 0.0  # when it was last told
        self.last_group_size = 0
        self.cache_stalled = False
        self.to_cache = GroupsInFlight(self.cfg.limits.group_bytes_queued_max)
        self.hand_off = HandOff()
        self.bytes_since_checkpoint = 0
        self.durable_lsn = 0  # the last LSN written and fsynced
        # figures
        self.fsyncs = 0
        self.window_fsyncs = 0
        self.window_records = 0
        self.window_start = time.monotonic()
        self.fsyncs_per_s = 0.0
        self.records_per_fsync = 0.0
        self.recovery_ms = 0.0
        self.replayed_bytes = 0
        self.log_bytes = 0
        self.checkpoint_started = 0.0
        self.fsync_ms: collections.deque[float] = collections.deque(maxlen=FSYNC_SAMPLES)
        self.last_checkpoint_ms = 0.0
        self.truncator = Truncator(self.zctx, self.log_dir, self.cfg.data_path)
        self.poller.register(self.truncator.wake, zmq.POLLIN)

    # ---- start and stop ---------------------------------------------------------------

    def on_start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            rec = recover(self.log_dir, self.state)
        except CorruptLog as exc:
            raise RefuseToStart(str(exc)) from None
        self.recovery_ms = (time.monotonic() - t0) * 1000
        self.replayed_bytes = rec.replayed_bytes
        self.log_bytes = logrecord.segments_bytes(self.log_dir)
        self.bytes_since_checkpoint = rec.replayed_bytes
        self.durable_lsn = self.state.last_lsn
        self.truncator.after_recovery(rec.snapshot_slot)
        if rec.last_segment is not None:
            self.writer.open_existing(rec.last_segment, rec.last_segment_bytes)
        log.info("log recovered: replayed %d bytes to LSN %d in %.0f ms (%d torn bytes cut), "
                 "%d topics", rec.replayed_bytes, self.state.last_lsn, self.recovery_ms,
                 rec.torn_bytes, len(self.state.topics))
        self.broadcast_catalog()

    def on_stop(self) -> None:
        if self.queue:
            self.flush_queue()
        self.hand_off_groups()
        self.tell_ended()
        if self.truncator.busy:
            self.truncated(self.truncator.collect(self.cfg.log.checkpoint_timeout_ms / 1000))
        self.truncator.close()
        self.writer.close()

    def on_socket(self, sock: zmq.Socket[bytes]) -> None:
        if sock is self.truncator.wake:
            self.truncated(self.truncator.collect(timeout_s=1.0))

    def truncated(self, result: TruncateResult | None) -> None:
        if result is None:
            log.warning("the checkpoint's snapshot and deletions are still running")
            return
        self.log_bytes = logrecord.segments_bytes(self.log_dir)
        if not result.error:
            log.info("checkpoint %d: shards durable to LSN %d; deleted %d segments, log now "
                     "%d bytes", result.ckpt_id, result.upto, result.deleted, self.log_bytes)
        self.run_steps(self.ckpt.truncated(result.ckpt_id, result.error))

    def catalog(self) -> Catalog:
        cat = self.state.catalog()
        return Catalog(cat.version, cat.topics, self.durable_lsn)

    def broadcast_catalog(self) -> None:
        cat = self.catalog()
        self.send(FRONT_DOOR, cat, wait_ms=1000)  # as patient as the acks that follow it
        self.send(CACHE_MANAGER, cat, wait_ms=1000)

    # ---- requests ---------------------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        match msg:
            case Writes():  # a burst of write requests: most messages
                self.admit_writes(msg)
            case Append() | CreateTopic() | DeleteTopic() | CommitOffset() | ListTopics():
                self.admit(msg)
            case Hello(role):
                if role == CACHE_MANAGER:
                    self.to_cache.reset()  # a new cache manager: nothing of ours is in its queue
                self.send(role, self.catalog(), wait_ms=1000)
            case Checkpoint(corr, reply_to):
                self.run_steps(self.ckpt.start(time.monotonic(), (reply_to, corr)))
            case CheckpointReady(ckpt_id, oldest_lsn):
                faults.crash_point("checkpoint.after_ready", self.cfg.data_path)
                self.run_steps(self.ckpt.ready(ckpt_id, oldest_lsn, time.monotonic()))
            case Progress(lsn=lsn):
                missed = self.to_cache.applied(lsn)
                if missed:
                    self.send(CACHE_MANAGER, CatchUp(missed), wait_ms=100)
            case Flushed(ckpt_id, _role, lsn):
                faults.crash_point("checkpoint.after_flushed", self.cfg.data_path)
                self.run_steps(self.ckpt.flushed(ckpt_id, lsn))
            case _:
                self.unexpected(msg)

    def admit_writes(self, msg: Writes) -> None:
        """A burst of write requests, admitted in the order they came."""
        now_ms = int(time.time() * 1000)
        append = self.state.append
        if not msg.others:  # produce requests only: the common case
            for corr, (producer_id, seq, parts) in zip(msg.corrs, msg.produces, strict=True):
                self.admitted(append(corr, producer_id, seq, parts, now_ms))
            return
        others = dict(msg.others)  # place → encoded message
        produces = iter(msg.produces)
        for place, corr in enumerate(msg.corrs):
            frame = others.get(place)
            if frame is None:
                producer_id, seq, parts = next(produces)
                self.admitted(append(corr, producer_id, seq, parts, now_ms))
            else:
                self.handle_frame(frame)

    def admit(self, msg: LogRequest) -> None:
        self.admitted(self.state.admit(msg, int(time.time() * 1000)))

    def admitted(self, out: Log | Send) -> None:
        """Queue a request's record for the next group commit, or answer it at once."""
        match out:
            case Log():
                self.queue.append(out)
                self.queued_bytes += len(out.record)
                if self.queued_bytes >= self.cfg.log.group_bytes_max or \
                        len(self.queue) >= self.cfg.log.group_requests_max:
                    self.flush_queue()
            case Send(role, msg, wait_ms):
                self.send(role, msg, wait_ms)
                corr = getattr(msg, "corr", None)
                if corr is not None and self.track_ended:
                    self.ended.append(corr)
            case _:
                assert_never(out)

    def on_idle(self) -> None:
        if self.queue:
            wait_us = self.cfg.log.group_wait_us_max
            if self.last_group_size > 1 and wait_us > 0:
                # A crowd is writing: give its stragglers a moment to join this group.
                deadline = time.monotonic() + wait_us / 1e6
                while self.running and len(self.queue) < self.cfg.log.group_requests_max:
                    left_ms = (deadline - time.monotonic()) * 1000
                    if left_ms <= 0 or not self.mailbox.poll(int(left_ms) + 1, zmq.POLLIN):
                        break
                    self.drain_mailbox()
            if self.queue:
                self.flush_queue()
        if self.hand_off.datas and time.monotonic() >= self.hand_off.due:
            self.hand_off_groups()
        self.maybe_tell_ended()
        if self.bytes_since_checkpoint >= self.cfg.log.checkpoint_bytes:
            steps = self.ckpt.start(time.monotonic())
            if steps:  # not while one is running: that one resets the count when it ends
                self.bytes_since_checkpoint = 0
                self.run_steps(steps)

    def tell_ended(self) -> None:
        """Tell the transaction manager which requests have been answered since it was last
        told."""
        if self.ended:
            ended, self.ended = self.ended, []
            self.send(TRANSACTION_MANAGER, Ended(ended), wait_ms=100)
        self.ended_told = time.monotonic()

    def maybe_tell_ended(self) -> None:
        """``tell_ended`` when it matters: a checkpoint waits for the transaction manager to
        be ready, or ``ENDED_INTERVAL_S`` or ``ENDED_ROWS_MAX`` have passed. Telling it after
        every group commit woke it once more per group, for nothing outside a checkpoint."""
        if not self.ended:
            return
        if self.ckpt.phase is Phase.WAIT_READY or len(self.ended) >= ENDED_ROWS_MAX or \
                time.monotonic() - self.ended_told >= ENDED_INTERVAL_S:
            self.tell_ended()

    def flush_queue(self) -> None:
        group, self.queue, self.queued_bytes = self.queue, [], 0
        self.commit(group)

    def commit(self, group: list[Log]) -> None:
        records = [p.record for p in group if p.record]
        if records:
            data = b"".join(records)
            first_lsn = min(p.lsn for p in group if p.record)
            last_lsn = max(p.lsn for p in group if p.record)
            t0 = time.monotonic()
            try:
                self.writer.append(data, first_lsn)
            except OSError as exc:
                # Never retry an fsync: the page cache may have dropped the data already.
                log.critical("log write/fsync failed: %s; exiting so recovery reads the disk", exc)
                os._exit(EXIT_FSYNC_FAILED)
            self.fsync_ms.append((time.monotonic() - t0) * 1000)
            self.durable_lsn = last_lsn
            self.fsyncs += 1
            self.window_fsyncs += 1
            self.log_bytes += len(data)
            self.bytes_since_checkpoint += len(data)
        self.last_group_size = len(group)
        if any(p.catalog_changed for p in group):
            # Before the acks, on the same pipe: a client told "created" can use the topic.
            self.broadcast_catalog()
        replies = []  # encoded, for any other answer
        acks: list[AckRow] = []  # produce requests: one Acks message for them all
        for p in group:
            if type(p.reply) is Ack:
                acks.append((p.reply.corr, p.reply.lsn, p.reply.parts))
            else:
                replies.append(codec.encode(p.reply))
            parts = getattr(p.reply, "parts", None)
            if parts and p.record:
                self.window_records += sum(part[2] for part in parts)
        if self.track_ended:
            self.ended.extend(p.reply.corr for p in group)
        # If the front door is gone, its clients time out and retry (produce is idempotent).
        for start, end in chunks([ACK_ROW_BYTES + ACK_PART_BYTES * len(row[2]) for row in acks],
                                 BUNDLE_BYTES_MAX):
            self.send(FRONT_DOOR, Acks(acks[start:end]), wait_ms=1000)
        if replies:
            self.send_many(FRONT_DOOR, replies, wait_ms=1000)
        if records:
            # After the acknowledgements, so the cache manager and the writers it wakes do
            # not take the CPU the front door needs for them; a read that follows an
            # acknowledgement carries its LSN and waits for the group wherever it goes.
            self.hand_off.add(first_lsn, last_lsn, data, time.monotonic())
            if self.hand_off.full():
                self.hand_off_groups()

    def hand_off_groups(self) -> None:
        """Send the durable groups not yet handed off to the cache manager, as one group."""
        if not self.hand_off.datas:
            return
        first_lsn, last_lsn, data = self.hand_off.take()
        # The cache manager hands the group to the shard writers; if it is gone they
        # catch up from the log files, so a stalled peer never stalls the log for long.
        sent = False
        if self.to_cache.admits(len(data)):
            group_msg = LogGroup(first_lsn, last_lsn, data)
            sent = self.send(CACHE_MANAGER, group_msg, wait_ms=0 if self.cache_stalled else 1000)
            self.cache_stalled = not sent
        if sent:
            self.to_cache.sent(last_lsn, len(data))
        else:
            self.to_cache.skip(last_lsn)

    def poll_timeout_ms(self) -> int:
        if self.hand_off.datas:
            return max(0, math.ceil((self.hand_off.due - time.monotonic()) * 1000))
        return POLL_MS_MAX

    # ---- the checkpoint handshake -----------------------------------------------------

    def run_steps(self, steps: list[Step]) -> None:
        data = self.cfg.data_path
        for step in steps:
            match step:
                case Roll():
                    self.flush_queue()
                    self.writer.roll(self.state.last_lsn + 1)
                case AskTxn(ckpt_id):
                    self.checkpoint_started = time.monotonic()
                    log.info("checkpoint %d requested (%s)", ckpt_id, self.cfg.log.checkpoint_mode)
                    self.tell_ended()  # first: the transaction manager waits only for the rest
                    self.send(TRANSACTION_MANAGER, CheckpointRequest(ckpt_id), wait_ms=1000)
                    faults.crash_point("checkpoint.after_request", data)
                case AskFlush(ckpt_id):
                    self.flush_queue()
                    self.hand_off_groups()  # the flush must find every group up to its LSN
                    self.tell_ended()
                    self.ckpt.asked_flush(self.state.last_lsn)
                    self.send(CACHE_MANAGER, FlushTo(ckpt_id, self.state.last_lsn), wait_ms=1000)
                case Truncate(ckpt_id, upto):
                    self.flush_queue()  # the snapshot must be exactly what is durable
                    self.truncator.start(ckpt_id, upto, self.state.snapshot())
                case Finish():
                    self.finish_checkpoint(step)
                case _:
                    assert_never(step)

    def finish_checkpoint(self, step: Finish) -> None:
        self.send(TRANSACTION_MANAGER, CheckpointFinished(step.ckpt_id), wait_ms=1000)
        self.last_checkpoint_ms = (time.monotonic() - self.checkpoint_started) * 1000
        if step.error:
            log.warning("checkpoint %d abandoned: %s", step.ckpt_id, step.error)
            # Try again after half the usual amount of log, not a whole one.
            self.bytes_since_checkpoint = max(self.bytes_since_checkpoint,
                                              self.cfg.log.checkpoint_bytes // 2)
        for role, corr in step.waiters:
            reply: Message = (ErrorReply(corr, ErrorCode.TIMEOUT, f"checkpoint abandoned: "
                                         f"{step.error}") if step.error else Done(corr, step.lsn))
            self.send(role, reply, wait_ms=1000)

    # ---- figures ----------------------------------------------------------------------

    def on_tick(self, now: float) -> None:
        self.run_steps(self.ckpt.tick(now))
        span = now - self.window_start
        if span > 0:
            self.fsyncs_per_s = self.window_fsyncs / span
            self.records_per_fsync = (self.window_records / self.window_fsyncs
                                      if self.window_fsyncs else 0.0)
        self.window_start, self.window_fsyncs, self.window_records = now, 0, 0

    def figures(self) -> dict[str, Any]:
        return {
            "mailbox": len(self.queue) or self.last_drain,
            "log_bytes": self.log_bytes,
            "fsyncs_per_s": round(self.fsyncs_per_s, 1),
            "records_per_fsync": round(self.records_per_fsync, 1),
            "last_lsn": self.state.last_lsn,
            "topics": len(self.state.topics),
            "recovery_ms": round(self.recovery_ms, 1),
            "replayed_bytes": self.replayed_bytes,
            "checkpoints": self.ckpt.done,
            "checkpoints_abandoned": self.ckpt.abandoned,
            "checkpoint_phase": self.ckpt.phase.value,
            "last_checkpoint_ms": round(self.last_checkpoint_ms, 1),
            "cache_queued_bytes": self.to_cache.bytes,
            "groups_not_sent": self.to_cache.skipped,
            **self.fsync_figures(),
        }

    def fsync_figures(self) -> dict[str, float]:
        """Write+fdatasync time of the recent group commits (ms)."""
        if not self.fsync_ms:
            return {}
        ms = sorted(self.fsync_ms)
        return {"fsync_p50_ms": round(ms[len(ms) // 2], 2),
                "fsync_p99_ms": round(ms[min(len(ms) - 1, len(ms) * 99 // 100)], 2),
                "fsync_max_ms": round(ms[-1], 2)}
