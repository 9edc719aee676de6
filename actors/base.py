"""The Actor base: a process with one mailbox, a poll loop, and a clean stop.

An actor binds one PULL socket (its mailbox, ipc under the node's run directory) and
connects PUSH sockets to the mailboxes it sends to. The loop is setup / run / teardown
with hooks: ``on_start``, ``on_message``, ``on_idle`` (after each drained burst),
``on_tick`` (about every ``TICK_S``), ``on_stop``. Every receive has a timeout, every send
is bounded, and an actor whose parent died exits by itself.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from config import NodeConfig
from config.schema import from_dict
from wire import codec
from wire.messages import Bundle, Stats, Stop

log = logging.getLogger("shardnode")

TICK_S = 1.0
POLL_MS_MAX = 100
PROGRESS_BYTES_DIVISOR = 8  # ... and once it applied this fraction of the sender's byte bound
PROGRESS_INTERVAL_S = 0.025  # a receiver on the data path reports what it applied at least this often
BUNDLE_BYTES_MAX = 16 * 1024 * 1024  # well under the codec's internal frame limit
DRAIN_MESSAGES_MAX = 4096  # messages handled per burst before the actor looks up
EVENTS_KEPT = 200  # recent events each actor keeps for debugging

# Exit codes an actor uses to tell the supervisor why it stopped.
EXIT_FAILED = 1  # an unexpected error: restart it
EXIT_REFUSED = 65  # it must not run on what it found (a corrupt log, a newer format): stop the node

SUPERVISOR = "supervisor"
FRONT_DOOR = "front"
LOG_MANAGER = "log"
TRANSACTION_MANAGER = "txn"
CACHE_MANAGER = "cache"


def writes_role(cfg: NodeConfig) -> str:
    """Where the front door sends write requests (produce, topic changes, offset commits).

    A ``blocking`` checkpoint holds new writes at the transaction manager's gate, so they
    pass through it. A ``fuzzy`` checkpoint never holds them, and a single write begins and
    ends inside one group commit, needing nothing of the log that a checkpoint could
    truncate: there they go straight to the log manager, one process hop fewer on every
    acknowledgement's way (docs/ARCHITECTURE.md)."""
    return TRANSACTION_MANAGER if cfg.log.checkpoint_mode == "blocking" else LOG_MANAGER


def writer_role(index: int) -> str:
    return f"writer-{index}"


def owner(topic_id: int, partition: int, writers: int) -> int:
    """The index of the shard writer that owns a shard (stable for a given writer count)."""
    return (topic_id * 7919 + partition) % writers


def chunks(sizes: list[int], bytes_max: int) -> list[tuple[int, int]]:
    """Split items into consecutive [start, end) runs of at most ``bytes_max`` bytes each
    (an item larger than that gets a run of its own)."""
    runs = []
    start = total = 0
    for i, size in enumerate(sizes):
        if i > start and total + size > bytes_max:
            runs.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        runs.append((start, len(sizes)))
    return runs


def waiting_messages(sock: zmq.Socket[bytes], limit: int) -> Iterator[codec.Message]:
    """The messages already waiting on ``sock`` (at most ``limit``), decoded; a frame that
    is not a message is logged and skipped."""
    for _ in range(limit):
        try:
            frame = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            yield codec.decode(frame)
        except codec.CodecError as exc:
            log.error("dropped a frame that is not a message: %s", exc)


def mailbox_address(run_dir: Path, role: str) -> str:
    return f"ipc://{run_dir}/{role}.sock"


@dataclass(frozen=True)
class ActorContext:
    """What a child process is given at spawn: everything is plain data that pickles."""

    role: str
    config: dict[str, Any]
    run_dir: str
    parent_pid: int


def configure_logging(role: str) -> None:
    level = os.environ.get("SHARDNODE_LOG", "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format=f"%(asctime)s %(levelname)s [{role}] %(message)s",
        stream=sys.stderr,
        force=True,
    )


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM when the parent exits (backed up by the ppid check)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass


class GroupsInFlight:
    """The bytes of log groups sent to one receiver on the data path that it has not yet
    reported applied (``Progress``). Mailboxes are bounded in messages, and a group can be
    tens of MiB, so this is the byte bound: a group that would take it over ``bytes_max``
    is not sent (``skip``), nor is one its mailbox refused. The receiver reads what it
    missed from the log files: when the next group it gets leaves a gap in LSNs, or, if
    none comes, when the sender tells it with ``CatchUp`` (``applied`` says when: nothing
    is in flight any more and groups after what it applied were skipped). One group always
    goes when nothing is in flight."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self.groups: collections.deque[tuple[int, int]] = collections.deque()  # (last LSN, bytes)
        self.skipped = 0  # groups not sent, in all
        self.skipped_upto = 0  # the last LSN of the groups not sent, until announced

    def admits(self, size: int) -> bool:
        return self.bytes == 0 or self.bytes + size <= self.bytes_max

    def sent(self, last_lsn: int, size: int) -> None:
        self.groups.append((last_lsn, size))
        self.bytes += size

    def skip(self, last_lsn: int) -> None:
        self.skipped += 1
        self.skipped_upto = max(self.skipped_upto, last_lsn)

    def applied(self, lsn: int) -> int:
        """The receiver applied everything to ``lsn``. Returns the LSN to announce in a
        ``CatchUp`` (0: none; a group still in flight will show it the gap)."""
        groups = self.groups
        while groups and groups[0][0] <= lsn:
            self.bytes -= groups.popleft()[1]
        if self.skipped_upto <= lsn:
            self.skipped_upto = 0
            return 0
        if groups:
            return 0
        announce, self.skipped_upto = self.skipped_upto, 0
        return announce

    def reset(self) -> None:
        """The receiver restarted: it recovers from the log by itself."""
        self.groups.clear()
        self.bytes = 0
        self.skipped_upto = 0


class ProgressReport:
    """When a receiver on the data path tells its sender how far it applied (``Progress``):
    once it has applied ``bytes_min`` since it last said so (a fraction of the sender's
    ``GroupsInFlight`` bound), or ``interval_s`` after, never after every group. A report
    per group would wake the log manager once more per group commit, on the path of every
    acknowledgement, and cost three messages per group between the actors."""

    def __init__(self, bytes_min: int, interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self.bytes_min = bytes_min
        self.interval_s = interval_s
        self.lsn = 0  # the last LSN reported
        self.bytes = 0  # applied since
        self.at = 0.0  # when it was reported

    def applied(self, size: int) -> None:
        self.bytes += size

    def due(self, lsn: int, now: float) -> bool:
        return lsn > self.lsn and (self.bytes >= self.bytes_min or now - self.at >= self.interval_s)

    def sent(self, lsn: int, now: float) -> None:
        self.lsn, self.bytes, self.at = lsn, 0, now


class RefuseToStart(Exception):
    """Raised by ``on_start`` when the actor must not run; the node stops with the message."""


class Actor:
    """Base class. Subclasses set ``role`` handling in ``on_message`` and may add sockets."""

    def __init__(self, ctx: ActorContext) -> None:
        self.role = ctx.role
        self.cfg: NodeConfig = from_dict(ctx.config)
        self.run_dir = Path(ctx.run_dir)
        self.parent_pid = ctx.parent_pid
        self.zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.mailbox = self.zctx.socket(zmq.PULL)
        self.mailbox.setsockopt(zmq.LINGER, 0)
        self.mailbox.setsockopt(zmq.RCVHWM, self.cfg.limits.mailbox_messages_max)
        path = self.run_dir / f"{self.role}.sock"
        if path.exists():
            path.unlink()  # left by an earlier incarnation that was killed
        self.mailbox.bind(mailbox_address(self.run_dir, self.role))
        self.poller = zmq.Poller()
        self.poller.register(self.mailbox, zmq.POLLIN)
        self._out: dict[str, zmq.Socket[bytes]] = {}
        self.running = True
        self.crashed = False  # run() raised: on_stop must not trust half-done work
        self.stop_reason = ""
        self.events: collections.deque[str] = collections.deque(maxlen=EVENTS_KEPT)
        self.last_drain = 0
        self.current_frame = b""
        self._next_tick = time.monotonic() + TICK_S
        self._reported_at = 0.0
        self.started_at = time.time()

    # ---- sending ------------------------------------------------------------------

    def peer(self, role: str) -> zmq.Socket[bytes]:
        sock = self._out.get(role)
        if sock is None:
            sock = self.zctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self.cfg.limits.mailbox_messages_max)
            sock.connect(mailbox_address(self.run_dir, role))
            self._out[role] = sock
        return sock

    def send(self, role: str, msg: codec.Message, wait_ms: int = 0) -> bool:
        """Send to an actor's mailbox; False if it stayed full for ``wait_ms``."""
        return self.send_bytes(role, codec.encode(msg), wait_ms)

    def send_many(self, role: str, frames: list[bytes], wait_ms: int = 0) -> int:
        """Send encoded messages to one actor, as few ``Bundle``s as keep each frame under
        ``BUNDLE_BYTES_MAX``; returns how many were sent (a prefix of them)."""
        sent = 0
        for start, end in chunks([len(f) for f in frames], BUNDLE_BYTES_MAX):
            part = frames[start:end]
            ok = (self.send_bytes(role, part[0], wait_ms) if len(part) == 1
                  else self.send(role, Bundle(part), wait_ms))
            if not ok:
                break
            sent = end
        return sent

    def send_bytes(self, role: str, frame: bytes, wait_ms: int = 0) -> bool:
        sock = self.peer(role)
        try:
            sock.send(frame, zmq.NOBLOCK, copy=len(frame) < 65536)
            return True
        except zmq.Again:
            if wait_ms <= 0:
                return False
        if sock.poll(wait_ms, zmq.POLLOUT):
            try:
                sock.send(frame, zmq.NOBLOCK, copy=len(frame) < 65536)
                return True
            except zmq.Again:
                pass
        self.note(f"mailbox of {role} stayed full for {wait_ms} ms")
        return False

    # ---- hooks --------------------------------------------------------------------

    def on_start(self) -> None:
        """Recover state and open what the actor owns."""

    def on_message(self, msg: codec.Message) -> None:
        raise NotImplementedError

    def on_socket(self, sock: zmq.Socket[bytes]) -> None:
        """A socket other than the mailbox is readable."""

    def on_idle(self) -> None:
        """Called after each burst of messages (and on every poll timeout)."""

    def on_tick(self, now: float) -> None:
        """Called about once per ``TICK_S``."""

    def on_stop(self) -> None:
        """Make what is in hand durable and release what the actor owns."""

    def figures(self) -> dict[str, Any]:
        """Numbers for ``shardnode status``."""
        return {}

    def poll_timeout_ms(self) -> int:
        return POLL_MS_MAX

    # ---- the loop -----------------------------------------------------------------

    def note(self, event: str) -> None:
        self.events.append(f"{time.time():.3f} {event}")

    def stop(self, reason: str) -> None:
        if self.running:
            self.running = False
            self.stop_reason = reason
            log.info("stopping: %s", reason)

    def handle_frame(self, frame: bytes) -> None:
        self.current_frame = frame
        try:
            msg = codec.decode(frame)
        except codec.CodecError as exc:
            log.error("dropped a frame that is not a message: %s", exc)
            self.note(f"bad frame: {exc}")
            return
        if isinstance(msg, Stop):
            self.stop(msg.reason)
            return
        if isinstance(msg, Bundle):
            for inner in msg.frames:
                self.handle_frame(inner)
            return
        self.on_message(msg)

    def drain_mailbox(self) -> int:
        n = 0
        recv = self.mailbox.recv
        while n < DRAIN_MESSAGES_MAX:
            try:
                frame = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            self.handle_frame(frame)
            if not self.running:
                break
            self.keep_alive()
        return n

    def report(self) -> None:
        figures = self.figures()
        figures.setdefault("mailbox", self.last_drain)
        figures["started_at"] = self.started_at
        figures["reported_at"] = time.time()  # status figures are this old
        self.send(SUPERVISOR, Stats(self.role, os.getpid(), figures))
        self._reported_at = time.monotonic()

    def keep_alive(self) -> None:
        """Report if a tick's time has passed since the last report. Work that can outlast
        the supervisor's ``heartbeat_timeout_ms`` without returning to the loop (a writer
        far behind, reading the log back at low CPU priority on a busy machine) calls it
        between steps, or the supervisor would take it for hung and kill it. Not while
        starting: the first report tells the supervisor this actor is up (``run``)."""
        if self._reported_at and time.monotonic() - self._reported_at >= TICK_S:
            self.report()

    def run(self) -> None:
        self.on_start()
        self.report()
        while self.running:
            events = dict(self.poller.poll(self.poll_timeout_ms()))
            if self.mailbox in events:
                self.last_drain = self.drain_mailbox()
            for sock in events:
                if sock is not self.mailbox and self.running:
                    self.on_socket(sock)
            self.on_idle()
            now = time.monotonic()
            if now >= self._next_tick:
                self._next_tick = now + TICK_S
                if os.getppid() != self.parent_pid:
                    self.stop("the supervisor is gone")
                    break
                self.on_tick(now)
                self.report()

    def close(self) -> None:
        for sock in self._out.values():
            sock.close(0)
        self.mailbox.close(0)


def _actor_class(role: str) -> type[Actor]:
    if role == LOG_MANAGER:
        from actors.log_manager import LogManager
        return LogManager
    if role == TRANSACTION_MANAGER:
        from actors.transaction_manager import TransactionManager
        return TransactionManager
    if role == CACHE_MANAGER:
        from actors.cache_manager import CacheManager
        return CacheManager
    if role.startswith("writer-"):
        from actors.shard_writer import ShardWriter
        return ShardWriter
    if role == FRONT_DOOR:
        from node.front_door import FrontDoor
        return FrontDoor
    raise ValueError(f"no actor has role {role!r}")


def actor_main(ctx: ActorContext) -> None:
    """Entry point of every actor process (spawned by the supervisor)."""
    configure_logging(ctx.role)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    if ctx.role.startswith("writer-"):
        # Before RocksDB starts its background threads, which inherit this priority: the
        # writers' work (applying, flushing) is off the acknowledgement path.
        nice = int(ctx.config["shards"]["writer_nice"])
        if nice:
            os.nice(nice)
    actor: Actor | None = None

    def on_term(signum: int, frame: Any) -> None:
        if actor is not None:
            actor.stop("SIGTERM")
        else:
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    code = 0
    try:
        actor = _actor_class(ctx.role)(ctx)
        try:
            actor.run()
        except BaseException:
            actor.crashed = True
            raise
        finally:
            actor.on_stop()
            actor.close()
    except RefuseToStart as exc:
        log.critical("%s refuses to start: %s", ctx.role, exc)
        code = EXIT_REFUSED
    except Exception:
        log.exception("actor %s failed", ctx.role)
        code = EXIT_FAILED
    sys.exit(code)
