"""The log manager actor: the write-ahead log, its LSNs, and asynchronous group commit.

Requests queue in its mailbox. After each burst it writes every queued record with one
``write`` and one ``fdatasync``, then acknowledges them all (SwiftMQ's group commit). A lone
producer is written at once; while an fsync runs, the next crowd queues up and shares the
next one. When the previous group held more than one request, it waits up to
``group_wait_us_max`` for stragglers before committing, so a busy log batches more.

Durable groups flow on, as the very bytes written, to the cache manager (which hands them
to the shard writers) before any acknowledgement is sent, and the transaction manager is
told which requests ended. An fsync error is fatal: the process exits at once and recovery
rebuilds the truth from the disk. The log manager also drives the checkpoint handshake
(``actors/checkpoint.py``) that lets it delete old segments.
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import os
import time
from pathlib import Path
from typing import Any

import zmq

from actors import faults
from actors.base import (
    CACHE_MANAGER,
    FRONT_DOOR,
    TRANSACTION_MANAGER,
    Actor,
    ActorContext,
    RefuseToStart,
)
from actors.checkpoint import AskFlush, AskTxn, Coordinator, Finish, Roll, Step, Truncate
from actors.log_state import LogState, Pending
from wire import codec, logrecord
from wire.codec import Message
from wire.errors import ErrorCode
from wire.logrecord import HEADER_BYTES, CorruptLog
from wire.messages import (
    Catalog,
    Checkpoint,
    CheckpointFinished,
    CheckpointReady,
    CheckpointRequest,
    Done,
    Ended,
    ErrorReply,
    Flushed,
    FlushTo,
    Hello,
    LogGroup,
)

log = logging.getLogger("shardnode")

EXIT_FSYNC_FAILED = 70
FSYNC_SAMPLES = 4096  # recent write+fdatasync durations kept for status


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def write_snapshot(log_dir: Path, state: dict[str, Any]) -> None:
    """Replace ``checkpoint.snap`` atomically and durably."""
    path = log_dir / logrecord.SNAPSHOT_NAME
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(logrecord.encode_snapshot(state))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(log_dir)


def delete_segments_upto(log_dir: Path, upto: int) -> int:
    """Delete the segments whose every record has LSN ≤ ``upto`` (never the newest one)."""
    segments = logrecord.list_segments(log_dir)
    deleted = 0
    for (_first, path), (next_first, _next) in itertools.pairwise(segments):
        if next_first - 1 <= upto:
            path.unlink()
            deleted += 1
    if deleted:
        fsync_dir(log_dir)
    return deleted


def recover(log_dir: Path, state: LogState) -> tuple[int, int, Path | None, int]:
    """Load the snapshot, replay every later record into ``state``, cut a torn tail.

    Returns (bytes replayed, torn bytes cut, last segment, its valid size).
    Raises ``CorruptLog`` when damage is followed by valid records or LSNs skip.
    """
    snap_path = log_dir / logrecord.SNAPSHOT_NAME
    if snap_path.exists():
        state.restore(logrecord.decode_snapshot(snap_path, snap_path.read_bytes()))
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
    return replayed, torn, last_path, last_size




class LogManager(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        lcfg = self.cfg.log
        self.state = LogState(lcfg.producers_max, lcfg.producer_window_max,
                              self.cfg.limits.shards_max)
        self.log_dir = self.cfg.data_path / "log"
        self.writer = SegmentWriter(self.log_dir, lcfg.segment_bytes_max)
        self.ckpt = Coordinator(lcfg.checkpoint_mode, lcfg.checkpoint_timeout_ms / 1000)
        self.queue: list[Pending] = []
        self.queued_bytes = 0
        self.ended: list[int] = []  # requests answered since the transaction manager was told
        self.last_group_size = 0
        self.cache_stalled = False
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

    # ---- start and stop ---------------------------------------------------------------

    def on_start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            replayed, torn, last_path, last_size = recover(self.log_dir, self.state)
        except CorruptLog as exc:
            raise RefuseToStart(str(exc)) from None
        self.recovery_ms = (time.monotonic() - t0) * 1000
        self.replayed_bytes = replayed
        self.log_bytes = logrecord.segments_bytes(self.log_dir)
        self.bytes_since_checkpoint = replayed
        self.durable_lsn = self.state.last_lsn
        if last_path is not None:
            self.writer.open_existing(last_path, last_size)
        log.info("log recovered: replayed %d bytes to LSN %d in %.0f ms (%d torn bytes cut), "
                 "%d topics", replayed, self.state.last_lsn, self.recovery_ms, torn,
                 len(self.state.topics))
        self.broadcast_catalog()

    def on_stop(self) -> None:
        if self.queue:
            self.flush_queue()
        self.tell_ended()
        self.writer.close()

    def catalog(self) -> Catalog:
        cat = self.state.catalog()
        return Catalog(cat.version, cat.topics, self.durable_lsn)

    def broadcast_catalog(self) -> None:
        cat = self.catalog()
        self.send(FRONT_DOOR, cat, wait_ms=1000)  # as patient as the acks that follow it
        self.send(CACHE_MANAGER, cat, wait_ms=1000)

    # ---- requests ---------------------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, Hello):
            self.send(msg.role, self.catalog(), wait_ms=1000)
        elif isinstance(msg, Checkpoint):
            self.run_steps(self.ckpt.start(time.monotonic(), (msg.reply_to, msg.corr)))
        elif isinstance(msg, CheckpointReady):
            faults.crash_point("checkpoint.after_ready", self.cfg.data_path)
            self.run_steps(self.ckpt.ready(msg.ckpt_id, msg.oldest_lsn, time.monotonic()))
        elif isinstance(msg, Flushed):
            faults.crash_point("checkpoint.after_flushed", self.cfg.data_path)
            self.run_steps(self.ckpt.flushed(msg.ckpt_id, msg.lsn))
        else:
            self.admit(msg)

    def admit(self, msg: Message) -> None:
        out = self.state.admit(msg, int(time.time() * 1000))
        if isinstance(out, Pending):
            self.queue.append(out)
            self.queued_bytes += len(out.record)
            if self.queued_bytes >= self.cfg.log.group_bytes_max or \
                    len(self.queue) >= self.cfg.log.group_requests_max:
                self.flush_queue()
        else:
            self.send(FRONT_DOOR, out, wait_ms=1000)
            corr = getattr(out, "corr", None)
            if corr is not None:
                self.ended.append(corr)

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
        self.tell_ended()
        if self.bytes_since_checkpoint >= self.cfg.log.checkpoint_bytes:
            steps = self.ckpt.start(time.monotonic())
            if steps:  # not while one is running: that one resets the count when it ends
                self.bytes_since_checkpoint = 0
                self.run_steps(steps)

    def tell_ended(self) -> None:
        if self.ended:
            ended, self.ended = self.ended, []
            self.send(TRANSACTION_MANAGER, Ended(ended), wait_ms=100)

    def flush_queue(self) -> None:
        group, self.queue, self.queued_bytes = self.queue, [], 0
        self.commit(group)

    def commit(self, group: list[Pending]) -> None:
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
            # The cache manager hands the group to the shard writers; if it is gone they
            # catch up from the log files, so a stalled peer never stalls the log for long.
            group_msg = LogGroup(first_lsn, last_lsn, data)
            self.cache_stalled = not self.send(CACHE_MANAGER, group_msg,
                                               wait_ms=0 if self.cache_stalled else 1000)
        self.last_group_size = len(group)
        if any(p.catalog_changed for p in group):
            # Before the acks, on the same pipe: a client told "created" can use the topic.
            self.broadcast_catalog()
        replies = []
        for p in group:
            replies.append(codec.encode(p.reply))
            self.ended.append(p.reply.corr)
            parts = getattr(p.reply, "parts", None)
            if parts and p.record:
                self.window_records += sum(part[2] for part in parts)
        # If the front door is gone, its clients time out and retry (produce is idempotent).
        self.send_many(FRONT_DOOR, replies, wait_ms=1000)

    # ---- the checkpoint handshake -----------------------------------------------------

    def run_steps(self, steps: list[Step]) -> None:
        data = self.cfg.data_path
        for step in steps:
            if isinstance(step, Roll):
                self.flush_queue()
                self.writer.roll(self.state.last_lsn + 1)
            elif isinstance(step, AskTxn):
                self.checkpoint_started = time.monotonic()
                log.info("checkpoint %d requested (%s)", step.ckpt_id, self.cfg.log.checkpoint_mode)
                self.send(TRANSACTION_MANAGER, CheckpointRequest(step.ckpt_id), wait_ms=1000)
                faults.crash_point("checkpoint.after_request", data)
            elif isinstance(step, AskFlush):
                self.flush_queue()
                self.tell_ended()
                self.ckpt.asked_flush(self.state.last_lsn)
                self.send(CACHE_MANAGER, FlushTo(step.ckpt_id, self.state.last_lsn), wait_ms=1000)
            elif isinstance(step, Truncate):
                self.flush_queue()  # the snapshot must be exactly what is durable
                write_snapshot(self.log_dir, self.state.snapshot())
                faults.crash_point("checkpoint.after_snapshot", data)
                deleted = delete_segments_upto(self.log_dir, step.upto)
                self.log_bytes = logrecord.segments_bytes(self.log_dir)
                log.info("checkpoint %d: shards durable to LSN %d; deleted %d segments, log now "
                         "%d bytes", step.ckpt_id, step.upto, deleted, self.log_bytes)
                faults.crash_point("checkpoint.after_truncate", data)
            elif isinstance(step, Finish):
                self.finish_checkpoint(step)

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
