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

This is the shell: the log's files are ``actors/wal.py``, when to commit, hand off and tell
is ``actors/group_commit.py``, the checkpoint's file work ``actors/truncator.py``.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from pathlib import Path
from typing import Any, assert_never

import zmq

from actors import faults
from actors.base import POLL_MS_MAX, Actor, ActorContext, RefuseToStart
from actors.checkpoint import Coordinator, Phase, Step
from actors.flow import BUNDLE_BYTES_MAX, GroupsInFlight, chunks
from actors.group_commit import GroupCommit
from actors.instructions import (
    AskFlush,
    AskShards,
    AskTxn,
    CopyLog,
    Finish,
    Log,
    Roll,
    Send,
    Truncate,
)
from actors.log_state import LogState
from actors.process import EXIT_FSYNC_FAILED
from actors.roles import (
    CACHE_MANAGER,
    FRONT_DOOR,
    TRANSACTION_MANAGER,
    writer_role,
    writes_role,
)
from actors.snapshot import ExportStep, SnapshotCoordinator
from actors.snapshot_files import CopyResult, ExportCopier, export_dir_problem, export_segments
from actors.truncator import TruncateResult, Truncator
from actors.wal import CorruptLog, SegmentWriter, SnapshotRefused, recover, segments_bytes
from wire import codec
from wire.codec import Message
from wire.errors import ErrorCode
from wire.formats import FormatRefused
from wire.messages import (
    Ack,
    AckRow,
    Acks,
    AlterTopic,
    Append,
    Catalog,
    CatchUp,
    Checkpoint,
    CheckpointFinished,
    CheckpointReady,
    CheckpointRequest,
    CheckpointShards,
    CommitOffset,
    CreateTopic,
    DeleteRecord,
    DeleteTopic,
    Done,
    Ended,
    EndOffsets,
    ErrorReply,
    Flushed,
    FlushTo,
    Hello,
    ListTopics,
    LogRequest,
    Progress,
    ShardsCheckpointed,
    SnapshotExport,
    TxnAppend,
    TxnOnce,
    TxnResolve,
    TxnStart,
    TxnSync,
    TxnTable,
    Writes,
    encode_log_group,
)

log = logging.getLogger("shardnode")

# What one row of an Acks message takes encoded, at most: a row, and each of its parts.
ACK_ROW_BYTES = 32
ACK_PART_BYTES = 32

FSYNC_SAMPLES = 4096  # recent write+fdatasync durations kept for status


class LogManager(Actor):
    # Requests whose records are encoded into log records at once, the views with them:
    # read without copying their batches first (a burst of many small requests is read by
    # msgpack, ``wire.views.TooManyItems``).
    VIEW_TAGS = frozenset({Writes.TAG, TxnAppend.TAG, TxnOnce.TAG})

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        lcfg = self.cfg.log
        self.state = LogState(self.cfg)
        self.log_dir = self.cfg.data_path / "log"
        self.writer = SegmentWriter(self.log_dir, lcfg.segment_bytes_max)
        self.ckpt = Coordinator(lcfg.checkpoint_mode, lcfg.checkpoint_timeout_ms / 1000)
        # The group-commit policy: when to commit, hand off, and tell the transaction
        # manager (only when it began the requests) which ended.
        self.policy = GroupCommit(lcfg.group_bytes_max, lcfg.group_requests_max,
                                  lcfg.group_wait_us_max,
                                  track_ended=writes_role(self.cfg) == TRANSACTION_MANAGER)
        self.cache_stalled = False
        self.to_cache = GroupsInFlight(self.cfg.limits.group_bytes_queued_max)
        self.bytes_since_checkpoint = 0
        self.durable_lsn = 0  # the last LSN written and fsynced
        self.early: list[bytes] = []  # answers to send before the fsync (Log.early)
        # figures
        self.fsyncs = 0
        self.window_fsyncs = 0
        self.window_records = 0
        self.window_start = time.monotonic()
        self.fsyncs_per_s = 0.0
        self.records_per_fsync = 0.0
        self.recovery_ms = 0.0
        self.once_split = faults.armed("log.once_split")
        self.replayed_bytes = 0
        self.log_bytes = 0
        self.checkpoint_started = 0.0
        self.fsync_ms: collections.deque[float] = collections.deque(maxlen=FSYNC_SAMPLES)
        self.last_checkpoint_ms = 0.0
        self.truncator = Truncator(self.zctx, self.log_dir, self.cfg.data_path)
        self.poller.register(self.truncator.wake, zmq.POLLIN)
        # Snapshot exports (actors/snapshot.py): the logic, and its file work on a thread.
        self.export = SnapshotCoordinator(
            tuple(writer_role(i) for i in range(self.cfg.node.writers)),
            lcfg.snapshot_timeout_ms / 1000)
        self.copier = ExportCopier(self.zctx)
        self.poller.register(self.copier.wake, zmq.POLLIN)

    # ---- start and stop ---------------------------------------------------------------

    def on_start(self) -> None:
        t0 = time.monotonic()
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            rec = recover(self.log_dir, self.state)
        except (CorruptLog, SnapshotRefused, FormatRefused) as exc:
            raise RefuseToStart(str(exc)) from None
        except OSError as exc:
            # An unreadable file, a full or read-only disk: the same at every restart, so
            # the node stops and says what failed rather than restart into it again.
            raise RefuseToStart(f"recovering the log in {self.log_dir} failed: {exc}") from None
        self.recovery_ms = (time.monotonic() - t0) * 1000
        self.replayed_bytes = rec.replayed_bytes
        self.log_bytes = segments_bytes(self.log_dir)
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
        self.send_early()
        if self.policy.queue:
            self.flush_queue()
        self.hand_off_groups()
        self.tell_ended()
        # A job's failure (``ThreadJob.collect`` raises it) must not cut the rest short:
        # the export's wait, and the writer's close, which cuts the log's zero tail.
        try:
            if self.truncator.busy:
                self.truncated(self.truncator.collect(self.cfg.log.checkpoint_timeout_ms / 1000))
        except RuntimeError:
            log.exception("the checkpoint's file job failed as the log manager stopped")
        self.truncator.close()
        try:
            if self.copier.busy:
                self.copier.collect(self.cfg.log.snapshot_timeout_ms / 1000)
        except RuntimeError:
            log.exception("the export's copy failed as the log manager stopped")
        self.copier.close()
        self.writer.close()

    def on_socket(self, sock: zmq.Socket[bytes]) -> None:
        if sock is self.truncator.wake:
            self.truncated(self.truncator.collect(timeout_s=1.0))
        elif sock is self.copier.wake:
            self.exported(self.copier.collect(timeout_s=1.0))

    def truncated(self, result: TruncateResult | None) -> None:
        if result is None:
            log.warning("the checkpoint's snapshot and deletions are still running")
            return
        self.log_bytes = segments_bytes(self.log_dir) - self.writer.ahead_bytes
        if not result.error:
            log.info("checkpoint %d: shards durable to LSN %d; deleted %d segments, log now "
                     "%d bytes", result.ckpt_id, self.ckpt.lsn, result.deleted, self.log_bytes)
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
            case (Append() | CreateTopic() | DeleteTopic() | AlterTopic() | CommitOffset()
                  | DeleteRecord()
                  | ListTopics()
                  | EndOffsets() | TxnStart() | TxnAppend() | TxnResolve()):
                self.admit(msg)
            case TxnOnce():
                logged = self.state.once(msg, int(time.time() * 1000))
                steps: list[Log | Send] = [*logged] if isinstance(logged, list) else [logged]
                for i, out in enumerate(steps):
                    if i == 2 and self.once_split:
                        # Tests: its start and write durable in a group of their own, then a
                        # crash before its commit (``LogState.once``).
                        self.flush_queue()
                        faults.crash_point("log.once_split", self.cfg.data_path)
                    self.admitted(out)
            case TxnSync(role):
                logs, aborted = self.state.abort_open()
                for out in logs:
                    self.admitted(out)
                opened, outcomes = self.state.txns.table()
                self.send(role, TxnTable(opened, outcomes, self.state.txns.next_txn, aborted),
                          wait_ms=1000)
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
            case SnapshotExport(corr, directory):
                self.export_steps(self.export.start(corr, directory, time.monotonic()))
            case ShardsCheckpointed(export_id, role, lsn, shards, size, error):
                self.export_steps(self.export.checkpointed(export_id, role, lsn, len(shards),
                                                           size, error))
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

    def admitted(self, out: Log | Send | None) -> None:
        """Queue a request's record for the next group commit, or answer it at once."""
        match out:
            case None:
                pass
            case Log():
                if out.early:
                    # Staged in a transaction: answered before the fsync (at the end of the
                    # burst, with the others); its commit record, durable after it in the
                    # log, is what is acknowledged as durable.
                    if out.reply is not None:
                        self.early.append(codec.encode(out.reply))
                    out.reply = None
                if self.policy.add(out):
                    self.flush_queue()
            case Send(role, msg, wait_ms):
                self.send(role, msg, wait_ms)
                corr = getattr(msg, "corr", None)
                if corr is not None:
                    self.policy.ended_one(corr)
            case _:
                assert_never(out)

    def send_early(self) -> None:
        if self.early:
            early, self.early = self.early, []
            self.send_many(FRONT_DOOR, early, wait_ms=1000)

    def on_idle(self) -> None:
        self.send_early()
        policy = self.policy
        if policy.queue:
            deadline = policy.straggler_deadline(time.monotonic())
            if deadline is not None:
                # A crowd is writing: give its stragglers a moment to join this group.
                while self.running:
                    wait_ms = policy.straggler_wait_ms(time.monotonic(), deadline)
                    if not wait_ms or not self.mailbox.poll(wait_ms, zmq.POLLIN):
                        break
                    self.drain_mailbox()
            if policy.queue:
                self.flush_queue()
        now = time.monotonic()
        if policy.hand_off_due(now):
            self.hand_off_groups()
        if policy.tell_due(now, checkpoint_waits=self.ckpt.phase is Phase.WAIT_READY):
            self.tell_ended()
        if self.bytes_since_checkpoint >= self.cfg.log.checkpoint_bytes:
            steps = self.ckpt.start(time.monotonic())
            if steps:  # not while one is running: that one resets the count when it ends
                self.bytes_since_checkpoint = 0
                self.run_steps(steps)

    def tell_ended(self) -> None:
        """Tell the transaction manager which requests have been answered since it was last
        told."""
        ended = self.policy.take_ended(time.monotonic())
        if ended:
            self.send(TRANSACTION_MANAGER, Ended(ended), wait_ms=100)

    def flush_queue(self) -> None:
        self.commit(self.policy.take())

    def commit(self, group: list[Log]) -> None:
        self.send_early()
        records = [p.record for p in group if p.record]
        size = sum(map(len, records))
        if records:
            first_lsn = min(p.lsn for p in group if p.record)
            last_lsn = max(p.lsn for p in group if p.record)
            # A crash here loses the group, as a power cut before its write would.
            faults.crash_point("log.before_write", self.cfg.data_path)
            t0 = time.monotonic()
            try:
                self.writer.append(records, first_lsn)
            except OSError as exc:
                # Never retry an fsync: the page cache may have dropped the data already.
                log.critical("log write/fsync failed: %s; exiting so recovery reads the disk", exc)
                os._exit(EXIT_FSYNC_FAILED)
            self.fsync_ms.append((time.monotonic() - t0) * 1000)
            self.durable_lsn = last_lsn
            self.fsyncs += 1
            self.window_fsyncs += 1
            self.log_bytes += size
            self.bytes_since_checkpoint += size
        if any(p.catalog_changed for p in group):
            # Before the acks, on the same pipe: a client told "created" can use the topic.
            self.broadcast_catalog()
        replies = []  # encoded, for any other answer
        acks: list[AckRow] = []  # produce requests: one Acks message for them all
        for p in group:
            if type(p.reply) is Ack:
                acks.append((p.reply.corr, p.reply.lsn, p.reply.parts))
                if p.record:
                    self.window_records += sum(part[2] for part in p.reply.parts)
            elif p.reply is not None:  # else answered when it was admitted, or by no one
                replies.append(codec.encode(p.reply))
        self.policy.ended_group(group)
        # If the front door is gone, its clients time out and retry (produce is idempotent).
        for start, end in chunks([ACK_ROW_BYTES + ACK_PART_BYTES * len(row[2]) for row in acks],
                                 BUNDLE_BYTES_MAX):
            self.send(FRONT_DOOR, Acks(acks[start:end]), wait_ms=1000)
        if replies:
            self.send_many(FRONT_DOOR, replies, wait_ms=1000)
        # After the acknowledgements, so the cache manager and the writers it wakes do
        # not take the CPU the front door needs for them; a read that follows an
        # acknowledgement carries its LSN and waits for the group wherever it goes.
        if records and self.policy.durable(first_lsn, last_lsn, records, size, time.monotonic()):
            self.hand_off_groups()

    def hand_off_groups(self) -> None:
        """Send the durable groups not yet handed off to the cache manager, as one group."""
        merged = self.policy.take_hand_off()
        if merged is None:
            return
        first_lsn, last_lsn, records, size = merged
        # The cache manager hands the group to the shard writers; if it is gone they
        # catch up from the log files, so a stalled peer never stalls the log for long.
        sent = False
        if self.to_cache.admits(size):
            frame = encode_log_group(first_lsn, last_lsn, records)
            sent = self.send_bytes(CACHE_MANAGER, frame,
                                   wait_ms=0 if self.cache_stalled else 1000)
            self.cache_stalled = not sent
        if sent:
            self.to_cache.sent(last_lsn, size)
        else:
            self.to_cache.skip(last_lsn)

    def poll_timeout_ms(self) -> int:
        due_ms = self.policy.hand_off_in_ms(time.monotonic())
        return POLL_MS_MAX if due_ms is None else due_ms

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
                    if self.export.pins_log:
                        upto = 0  # an export copies segments: delete none (actors/snapshot.py)
                        log.info("checkpoint %d deletes no segment: a snapshot export runs",
                                 ckpt_id)
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

    # ---- snapshot exports (actors/snapshot.py) ----------------------------------------

    def export_steps(self, steps: list[ExportStep]) -> None:
        for step in steps:
            match step:
                case AskShards(export_id, directory):
                    problem = export_dir_problem(directory, self.cfg.data_path)
                    if problem:
                        self.export_steps(self.export.failed_to_start(
                            export_id, ErrorCode.BAD_REQUEST, problem))
                        continue
                    log.info("export %d into %s: asking the writers for checkpoints",
                             export_id, directory)
                    for role in self.export.writers:
                        if not self.send(role, CheckpointShards(export_id, directory),
                                         wait_ms=1000):
                            self.export_steps(self.export.checkpointed(
                                export_id, role, 0, 0, 0, "its mailbox is full"))
                case CopyLog(export_id, directory, floor, deadline):
                    # L: the last durable LSN, and the state exactly as of it.
                    self.flush_queue()
                    lsn = self.state.last_lsn
                    self.writer.roll(lsn + 1)  # segments up to here hold nothing past L
                    segments = export_segments(self.log_dir, floor, lsn, self.writer.path)
                    log.info("export %d: LSN %d; copying %d segments (shards from LSN %d)",
                             export_id, lsn, len(segments), floor + 1)
                    self.copier.start(export_id, Path(directory), lsn, self.state.snapshot(),
                                      segments, self.cfg.cluster.node_id, deadline)
                case Send(role, msg, wait_ms):
                    self.send(role, msg, wait_ms)
                case _:
                    assert_never(step)

    def exported(self, result: CopyResult | None) -> None:
        if result is None:
            log.warning("the export's copy is still running")
            return
        if result.error:
            log.warning("export %d failed: %s", result.export_id, result.error)
        else:
            log.info("export %d done: LSN %d", result.export_id, result.lsn)
        self.export_steps(self.export.copied(result.export_id, result.lsn, result.bytes,
                                             time.monotonic(), result.error))

    # ---- figures ----------------------------------------------------------------------

    def on_tick(self, now: float) -> None:
        self.run_steps(self.ckpt.tick(now))
        self.export_steps(self.export.tick(now))
        span = now - self.window_start
        if span > 0:
            self.fsyncs_per_s = self.window_fsyncs / span
            self.records_per_fsync = (self.window_records / self.window_fsyncs
                                      if self.window_fsyncs else 0.0)
        self.window_start, self.window_fsyncs, self.window_records = now, 0, 0

    def figures(self) -> dict[str, Any]:
        return {
            "mailbox": len(self.policy.queue) or self.last_drain,
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
            "exports": self.export.done,
            "exports_failed": self.export.failed,
            "export_phase": self.export.phase.value,
            "cache_queued_bytes": self.to_cache.bytes,
            "groups_not_sent": self.to_cache.skipped,
            "txns_once": self.state.txns_once,
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
