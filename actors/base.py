"""The Actor base: a process with one mailbox, a poll loop, and a clean stop.

An actor binds one PULL socket (its mailbox, ipc under the node's run directory) and
connects PUSH sockets to the mailboxes it sends to. The loop is setup / run / teardown
with hooks: ``on_start``, ``on_message``, ``on_idle`` (after each drained burst),
``on_tick`` (about every ``TICK_S``), ``on_stop``. Every receive has a timeout, every send
is bounded, and an actor whose parent died exits by itself. The process around it
(spawning, signals, exit codes) is ``actors/process.py``; roles are ``actors/roles.py``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from actors.flow import BUNDLE_BYTES_MAX, bundles, chunks
from actors.roles import FRONT_DOOR, SUPERVISOR
from config import NodeConfig
from config.schema import from_dict
from wire import codec
from wire.errors import ErrorCode
from wire.messages import Bundle, ErrorReply, Stats, Stop, Writes

log = logging.getLogger("shardnode")

TICK_S = 1.0
POLL_MS_MAX = 100
DRAIN_MESSAGES_MAX = 4096  # messages handled per burst before the actor looks up
# A frame this large goes to a mailbox after an empty marker frame, as a message of two
# parts, and is received without a copy (a view of ZeroMQ's own buffer). A received frame
# is otherwise copied into a new bytes object: for a 600 kB frame (a request of the Spark
# sink, a log group) that copy cost 120 us against 4-7 us without it, measured here, and
# every hop of the write path received each byte once. A small frame is received by copy:
# a ``Frame`` object costs more than the copy (1.2 us against 0.5 us for 60 bytes).
BULK_FRAME_BYTES_MIN = 65536
# pyzmq's flags are ``enum.Flag`` members: combining or testing them costs about 1.2 us each
# (the enum machinery) against 0.03 us for ints, measured here; the paths every message
# takes use these.
NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)
POLLIN = int(zmq.POLLIN)
EVENTS = int(zmq.EVENTS)


def send_frame(sock: zmq.Socket[bytes], frame: bytes | memoryview, flags: int = 0) -> None:
    """Send an encoded message to a mailbox; raises ``zmq.Again`` as ``send`` does. A frame
    of ``BULK_FRAME_BYTES_MIN`` or more is sent without a copy after an empty marker part:
    ZeroMQ queues a message of several parts whole or not at all, so once the marker is taken
    the frame is too."""
    if len(frame) < BULK_FRAME_BYTES_MIN:
        sock.send(frame, flags)
        return
    sock.send(b"", flags | SNDMORE)
    sock.send(frame, flags & ~NOBLOCK, copy=False)


def receive_frame(sock: zmq.Socket[bytes], flags: int = 0) -> bytes | memoryview:
    """The next frame sent by ``send_frame``: a large one as a view of ZeroMQ's buffer (kept
    alive by the view). Raises ``zmq.Again`` as ``recv`` does."""
    frame = sock.recv(flags)
    if frame or not sock.get(zmq.RCVMORE):
        return frame  # an empty frame alone is not a message: the decoder says so
    return sock.recv(flags, copy=False).buffer  # the rest of a message is there at once


def waiting_messages(sock: zmq.Socket[bytes], limit: int) -> Iterator[codec.Message]:
    """The messages already waiting on ``sock`` (at most ``limit``), decoded; a frame that
    is not a message is logged and skipped."""
    for _ in range(limit):
        try:
            frame = receive_frame(sock, NOBLOCK)
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


class RefuseToStart(Exception):
    """Raised by ``on_start`` when the actor must not run; the node stops with the message."""


class Actor:
    """Base class. Subclasses set ``role`` handling in ``on_message`` and may add sockets."""

    # Tags of the messages this actor reads with their large binary values as views into
    # the received frame (``wire.codec.decode``): only those it passes on or reads in part,
    # and never keeps past the message (a view keeps the whole frame alive).
    VIEW_TAGS: frozenset[int] = frozenset()

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
        self.sends_refused = 0  # messages not sent: the peer's mailbox stayed full
        self.unexpected_messages = 0  # messages of a type this actor does not handle
        self.last_drain = 0
        self.current_frame: bytes | memoryview = b""  # the frame being handled
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
        ``BUNDLE_BYTES_MAX``, a large one (``BULK_FRAME_BYTES_MIN``) alone; returns how many
        were sent (a prefix of them)."""
        sent = 0
        for start, end in bundles([len(f) for f in frames], BUNDLE_BYTES_MAX,
                                  BULK_FRAME_BYTES_MIN):
            part = frames[start:end]
            ok = (self.send_bytes(role, part[0], wait_ms) if len(part) == 1
                  else self.send(role, Bundle(part), wait_ms))
            if not ok:
                break
            sent = end
        return sent

    def send_writes(self, role: str, writes: Writes, wait_ms: int = 0) -> list[int]:
        """Send a burst of write requests to ``role`` as ``Writes`` messages of at most
        ``BUNDLE_BYTES_MAX`` each; returns the correlation ids of those not sent (a suffix:
        the peer's mailbox stayed full), which the caller must answer."""
        sent = 0
        runs = chunks(writes.sizes(), BUNDLE_BYTES_MAX)
        for start, end in runs:
            part = writes if len(runs) == 1 else writes.slice(start, end)
            if not self.send(role, part, wait_ms):
                break
            sent = end
        return list(writes.corrs[sent:])

    def send_bytes(self, role: str, frame: bytes | memoryview, wait_ms: int = 0) -> bool:
        sock = self.peer(role)
        try:
            send_frame(sock, frame, NOBLOCK)
            return True
        except zmq.Again:
            if wait_ms <= 0:
                return False
        if sock.poll(wait_ms, zmq.POLLOUT):
            try:
                send_frame(sock, frame, NOBLOCK)
                return True
            except zmq.Again:
                pass
        self.sends_refused += 1
        log.debug("mailbox of %s stayed full for %d ms", role, wait_ms)
        return False

    # ---- hooks --------------------------------------------------------------------

    def on_start(self) -> None:
        """Recover state and open what the actor owns."""

    def on_message(self, msg: codec.Message) -> None:
        raise NotImplementedError

    def unexpected(self, msg: codec.Message) -> None:
        """A message of a type this actor does not handle (the last case of each
        ``on_message``): log it and count it, and when it carries a correlation id, answer
        it with an error naming it (``refuse``), so that no client waits for an answer that
        will not come. The actor goes on: a crash would restart it and every actor after it."""
        name = type(msg).__name__
        self.unexpected_messages += 1
        log.error("actor %r does not handle %s: dropped", self.role, name)
        corr = getattr(msg, "corr", None)
        if type(corr) is int:
            self.refuse(corr, f"actor {self.role!r} does not handle {name}")

    def refuse(self, corr: int, text: str) -> None:
        """Answer request ``corr`` with an INTERNAL error: to the front door, which answers
        the client waiting for it."""
        self.send(FRONT_DOOR, ErrorReply(corr, ErrorCode.INTERNAL, text), wait_ms=100)

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

    def stop(self, reason: str) -> None:
        if self.running:
            self.running = False
            self.stop_reason = reason
            log.info("stopping: %s", reason)

    def handle_frame(self, frame: bytes | memoryview) -> None:
        self.current_frame = frame
        try:
            msg = codec.decode(frame, views=self.VIEW_TAGS)
        except codec.CodecError as exc:
            log.error("dropped a frame that is not a message: %s", exc)
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
        mailbox = self.mailbox
        while n < DRAIN_MESSAGES_MAX:
            # Asking first costs less than the exception of a receive that finds nothing,
            # which ended every burst (most bursts are of one or two messages).
            if not int(mailbox.getsockopt(EVENTS)) & POLLIN:
                break
            try:
                frame = receive_frame(mailbox, NOBLOCK)
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
        figures["sends_refused"] = self.sends_refused
        figures["unexpected_messages"] = self.unexpected_messages
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
