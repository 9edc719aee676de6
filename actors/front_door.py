"""The front door actor: the client socket.

It owns one ROUTER socket on ``host:port``. Each request is decoded and checked against
``wire.protocol``; produce batches are checked record by record once, here, and split by
key hash when the client named no partition. Requests go on to the log manager (writes,
through the transaction manager when checkpoints are ``blocking``: ``writes_role``), the
cache manager (reads by offset), the owning shard writer (other reads), the log manager
or the supervisor, tagged with a correlation id; answers come back to this
actor's mailbox and are matched to the waiting client. It never touches the disk and never
blocks: a full queue is answered BUSY, a request nobody answered in ``request_timeout_ms``
is answered TIMEOUT, and bad input gets an error code and message. The logic is
``actors/front_state.py``; this is the shell around its sockets.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from typing import Any, assert_never

import zmq

from actors.base import (
    BULK_FRAME_BYTES_MIN,
    EVENTS,
    NOBLOCK,
    POLLIN,
    SNDMORE,
    Actor,
    ActorContext,
)
from actors.cluster_state import PEER_PREFIX, PEER_TOKEN_BYTES
from actors.curve import curve_client, curve_server, server_keys
from actors.front_state import FrontDoorState, Out
from actors.instructions import Produce, Reply, Request, ToPeer
from actors.roles import LOG_MANAGER
from config import NodeConfig
from wire import codec, protocol
from wire.codec import Message
from wire.errors import ErrorCode
from wire.messages import (
    Ack,
    Acks,
    AlterTopic,
    Catalog,
    CommitOffset,
    CreateTopic,
    DeleteRecord,
    DeleteTopic,
    Done,
    ErrorReply,
    Exported,
    GateHeld,
    Hello,
    OffsetsReply,
    OtherWrite,
    ProduceRow,
    RecordsReply,
    ShardsReply,
    StatusReply,
    TopicsReply,
    TxnCommitted,
    TxnId,
    TxnOutcome,
    TxnsReply,
    TxnWritten,
    ValueReply,
    Writes,
)

log = logging.getLogger("shardnode")

# The writes other than produce, which ride in a write burst (``Writes``) at their place.
BURST_WRITES = (CreateTopic, DeleteTopic, CommitOffset, DeleteRecord, AlterTopic)

CLIENT_BURST_MAX = 1024  # client requests read per poll before looking at the mailbox
# A request for a member whose connection is not up (yet, or again: a member reconnects
# within ZeroMQ's 100 ms after it restarts) is sent again for up to this long, then
# answered UNAVAILABLE: under a client's timeout of a second (at 1 s a client asking with
# that timeout heard nothing, and retried, and was told TIMEOUT after 6.6 s).
PEER_CONNECT_WAIT_S = 0.5
PEER_RETRY_POLL_MS = 20  # how often those requests are tried again
PEER_REFUSALS_LOGGED_EVERY = 1000  # a request refused a member's routing id: logged so often


def request_frame(frame: zmq.Frame) -> bytes | memoryview:
    """A client's request frame: a large one (a batch of the Spark sink, 0.5 MB) as a view of
    ZeroMQ's buffer, read in place by the parsing, which copies what it keeps; a small one as
    bytes, as a view costs more than copying it (``actors.base.BULK_FRAME_BYTES_MIN``)."""
    return frame.buffer if len(frame) >= BULK_FRAME_BYTES_MIN else frame.bytes


def member_keys(cfg: NodeConfig) -> frozenset[bytes]:
    """The public keys (Z85) of the cluster's members, this node's own for a member whose
    key the cluster file leaves out (as ``member_socket`` connects); none for one node."""
    if not cfg.cluster.file:
        return frozenset()
    keys = server_keys(cfg)
    assert keys is not None
    return frozenset(m.public_key.encode() or keys.public for m in cfg.members)


class FrontDoor(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        lim = self.cfg.limits
        self.router = self.zctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVHWM, lim.mailbox_messages_max)
        self.router.setsockopt(zmq.SNDHWM, lim.mailbox_messages_max)
        # Frames up to twice the limit are read and answered FRAME_TOO_LARGE; ZeroMQ drops
        # the connection of a client that sends more, so no frame can exhaust memory.
        self.router.setsockopt(zmq.MAXMSGSIZE, 2 * lim.frame_bytes_max)
        # A member that restarts connects again under its routing id (``cluster_state``):
        # the new connection takes it over from the old one.
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.auth = curve_server(self.router, self.cfg)  # before bind: with CURVE on, ZAP first
        # With CURVE on, the keys a message under a member's routing id must come with:
        # the members' (a client's key is refused one). None: CURVE off, nothing to check.
        self.member_keys = member_keys(self.cfg) if self.auth is not None else None
        self.refused_peers = 0
        self.peer_token = secrets.token_hex(PEER_TOKEN_BYTES).encode()
        self.router.bind(self.cfg.endpoint)
        self.poller.register(self.router, zmq.POLLIN)
        # Correlation ids from a random point in 1..2**62 (0 is "none" on the way), fresh
        # each start: an answer
        # meant for the front door before a restart matches no request of this one.
        self.state = FrontDoorState(self.cfg, 1 + random.SystemRandom().getrandbits(62))
        self.outbox: dict[str, list[tuple[int, bytes]]] = {}  # role → [(corr, encoded)]
        # The burst of write requests for ``state.writes_to``, in the order they came.
        self.write_corrs: list[int] = []
        self.write_produces: list[ProduceRow] = []
        self.write_others: list[OtherWrite] = []
        self.replies: dict[bytes, list[bytes]] = {}  # client identity → reply frames
        self.replies_dropped = 0
        self.peers: dict[int, zmq.Socket[bytes]] = {}  # member id → a socket to its front door
        # Requests a member was not connected to take: (member, corr, frame, give up at).
        self.unsent: list[tuple[int, int, bytes, float]] = []
        self.peer_of: dict[zmq.Socket[bytes], int] = {}

    def on_start(self) -> None:
        self.send(LOG_MANAGER, Hello(self.role), wait_ms=100)
        if self.state.cluster is not None:
            for member in self.state.cluster.view.others():  # connected before they are needed
                self.member_socket(member)
        log.info("listening on %s", self.cfg.endpoint)

    def on_stop(self) -> None:
        self.perform(self.state.stop())
        self.flush_replies()
        self.router.close(0)
        for sock in self.peers.values():
            sock.close(0)
        if self.auth is not None:
            self.auth.stop()

    def perform(self, outs: list[Out]) -> None:
        for out in outs:
            match out:
                case Reply(identity, frame):
                    # Replies wait for the end of this burst: what is ready for one client
                    # then goes out as one frame (``wire.protocol``).
                    frames = self.replies.get(identity)
                    if frames is None:
                        self.replies[identity] = [frame]
                    else:
                        frames.append(frame)
                case Produce(corr, request):
                    # As a row of the burst: nothing to encode per request here, nothing to
                    # decode per request in the log manager.
                    self.write_corrs.append(corr)
                    self.write_produces.append(request)
                case Request(role, corr, msg) if (role == self.state.writes_to
                                                   and isinstance(msg, BURST_WRITES)):
                    # The other writes to that actor go in the burst too, at their place.
                    self.write_others.append((len(self.write_corrs), codec.encode(msg)))
                    self.write_corrs.append(corr)
                case Request(role, corr, msg):
                    # A burst's requests to one actor go out together, as one bundle.
                    self.outbox.setdefault(role, []).append((corr, codec.encode(msg)))
                case ToPeer(member, corr, frame):
                    self.to_peer(member, corr, frame)
                case _:
                    assert_never(out)

    def member_socket(self, member: int) -> zmq.Socket[bytes]:
        """The socket to another member's front door, connected on first use. Messages are
        never queued for a member that is not connected (``IMMEDIATE``): a send to a member
        that is down fails at once, and the request is answered UNAVAILABLE."""
        sock = self.peers.get(member)
        if sock is None:
            assert self.state.cluster is not None
            cluster = self.state.cluster.view
            lim = self.cfg.limits
            sock = self.zctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.ROUTING_ID, cluster.peer_identity(self.peer_token))
            sock.setsockopt(zmq.SNDHWM, lim.mailbox_messages_max)
            sock.setsockopt(zmq.RCVHWM, lim.mailbox_messages_max)
            sock.setsockopt(zmq.MAXMSGSIZE, 2 * lim.read_bytes_max + 2 * lim.frame_bytes_max)
            keys = server_keys(self.cfg)
            if keys is not None:  # CURVE: this node is a client of the member, by its key
                theirs = cluster.members[member].public_key.encode() or keys.public
                curve_client(sock, theirs, keys.public, keys.secret)
            sock.connect(cluster.members[member].endpoint)
            self.poller.register(sock, zmq.POLLIN)
            self.peers[member] = sock
            self.peer_of[sock] = member
        return sock

    def to_peer(self, member: int, corr: int, frame: bytes) -> None:
        try:
            self.member_socket(member).send(frame, NOBLOCK)
        except zmq.Again:
            self.unsent.append((member, corr, frame, time.monotonic() + PEER_CONNECT_WAIT_S))

    def send_unsent(self) -> None:
        """Try the requests no member's connection took again; answer UNAVAILABLE those
        whose member stayed unreachable for ``PEER_CONNECT_WAIT_S``."""
        unsent, self.unsent = self.unsent, []
        now = time.monotonic()
        assert self.state.cluster is not None
        cluster = self.state.cluster.view
        for member, corr, frame, give_up_at in unsent:
            if corr not in self.state.pending:
                continue  # answered meanwhile (timed out)
            try:
                self.peers[member].send(frame, NOBLOCK)
            except zmq.Again:
                if now < give_up_at:
                    self.unsent.append((member, corr, frame, give_up_at))
                    continue
                self.perform(self.state.fail([corr], ErrorCode.UNAVAILABLE,
                                             f"{cluster.name(member)} is not reachable (down, "
                                             f"or its queue is full); retry later"))

    def poll_timeout_ms(self) -> int:
        return PEER_RETRY_POLL_MS if self.unsent else super().poll_timeout_ms()

    def flush_outbox(self) -> None:
        if self.write_corrs:
            role = self.state.writes_to
            writes = Writes(self.write_corrs, self.write_produces, self.write_others)
            self.write_corrs, self.write_produces, self.write_others = [], [], []
            self.busy(role, self.send_writes(role, writes))
        for role, items in self.outbox.items():
            if not items:
                continue
            corrs = [corr for corr, _r in items]
            self.busy(role, corrs[self.send_many(role, [frame for _c, frame in items]):])
            items.clear()

    def busy(self, role: str, unsent: list[int]) -> None:
        """Answer BUSY the requests that could not be sent to ``role``."""
        if unsent:
            self.perform(self.state.fail(unsent, ErrorCode.BUSY,
                                         f"the {role} queue is full; retry later"))

    def flush_replies(self) -> None:
        if not self.replies:
            return
        replies, self.replies = self.replies, {}
        send = self.router.send
        for identity, frames in replies.items():
            for frame in protocol.join_frames(frames):
                try:
                    send(identity, NOBLOCK | SNDMORE)
                    send(frame, NOBLOCK, copy=len(frame) < BULK_FRAME_BYTES_MIN)
                except zmq.Again:
                    self.replies_dropped += 1
                    log.warning("the send queue of a client is full: a reply was dropped")

    def on_socket(self, sock: zmq.Socket[bytes]) -> None:
        if sock is not self.router:
            self.on_peer(sock)
            return
        now = time.monotonic()
        state = self.state
        first = state.requests
        # A burst holds what it read until its end: up to a group commit's bytes (and the
        # frame that passes them), then the mailbox and the rest wait for the next poll.
        bytes_left = self.cfg.log.group_bytes_max
        try:
            router = self.router
            while state.requests - first < CLIENT_BURST_MAX and bytes_left > 0:
                # Asking first costs less than the exception of a receive that finds nothing
                # (the end of every burst: 15 us of a one-request burst's 100, measured here).
                if not int(router.getsockopt(EVENTS)) & POLLIN:
                    return
                try:
                    frames = router.recv_multipart(NOBLOCK, copy=False)
                except zmq.Again:
                    return
                parts = [request_frame(f) for f in frames[1:]]
                for part in parts:
                    bytes_left -= len(part)
                identity = frames[0].bytes
                refused = ""
                if self.member_keys is not None and identity.startswith(PEER_PREFIX):
                    refused = self.not_a_member(frames[-1])
                self.perform(state.request(identity, parts, now, refused))
                self.keep_alive()  # a burst of large frames may outlast a heartbeat
        finally:
            self.flush_outbox()
            self.flush_replies()

    def not_a_member(self, frame: zmq.Frame) -> str:
        """Why a message under a member's routing id is refused ("" if it came with a
        member's key): the key its CURVE handshake was made with (its ZAP User-Id)."""
        assert self.member_keys is not None
        try:
            key = str(frame.get("User-Id")).encode()
        except zmq.ZMQError:
            key = b""
        if key in self.member_keys:
            return ""
        self.refused_peers += 1
        if self.refused_peers == 1 or self.refused_peers % PEER_REFUSALS_LOGGED_EVERY == 0:
            log.warning("refused %d requests under a cluster member's routing id from a key "
                        "that is no member's (the last: %s)", self.refused_peers,
                        key.decode("ascii", "replace"))
        return (f"routing ids starting with {PEER_PREFIX.decode()} are the cluster members'; "
                f"this connection's key is not a member's")

    def on_peer(self, sock: zmq.Socket[bytes]) -> None:
        """Answers of another member to requests forwarded to it."""
        try:
            for _ in range(CLIENT_BURST_MAX):
                try:
                    frame = sock.recv(NOBLOCK)
                except zmq.Again:
                    return
                try:
                    replies = protocol.unpack_replies(frame)
                except ValueError as exc:  # its requests wait out their time: TIMEOUT
                    log.warning("node %d sent a frame that is not replies (dropped): %s",
                                self.peer_of[sock], exc)
                    continue
                for reply in replies:
                    self.perform(self.state.peer_reply(reply))
        finally:
            self.flush_outbox()
            self.flush_replies()

    def on_message(self, msg: Message) -> None:
        match msg:
            case Acks(rows):  # a group commit's produce requests, the most common message
                ack = self.state.ack
                for corr, lsn, parts in rows:
                    self.perform(ack(corr, lsn, parts))
            case Catalog():
                self.state.catalog(msg)
            case GateHeld(corrs, held):  # a blocking checkpoint's (actors/front_kv.py)
                self.perform(self.state.kv.gate_held(corrs, held))
            case (Ack() | Done() | RecordsReply() | ValueReply() | TopicsReply() | StatusReply()
                  | OffsetsReply() | ErrorReply() | TxnId() | TxnWritten() | TxnCommitted()
                  | TxnOutcome() | TxnsReply() | ShardsReply()
                  | Exported()):
                self.perform(self.state.answer(msg))
            case _:
                self.unexpected(msg)

    def refuse(self, corr: int, text: str) -> None:
        self.perform(self.state.fail([corr], ErrorCode.INTERNAL, text))

    def on_idle(self) -> None:
        if self.unsent:
            self.send_unsent()
        self.flush_outbox()
        self.flush_replies()

    def on_tick(self, now: float) -> None:
        self.perform(self.state.expire(now))
        self.perform(self.state.tick(now))
        self.flush_outbox()
        self.flush_replies()
        if self.state.catalog_version < 0:
            self.send(LOG_MANAGER, Hello(self.role))

    def figures(self) -> dict[str, Any]:
        s = self.state
        figures = {
            "mailbox": self.last_drain,
            "in_flight": len(s.pending),
            "requests": s.requests,
            "errors": s.errors,
            "timeouts": s.timeouts,
            "replies_dropped": self.replies_dropped,
            "forwarded": 0 if s.cluster is None else s.cluster.forwarded,
            "kv_gets_cached": s.kv.gets_cached,
            # A checked commit whose wait expired, holding its keys until its outcome is
            # known, and the questions about such commits sent to the transaction manager.
            "kv_late_commit": int(s.kv.late_commit is not None),
            "kv_late_asks": s.kv.late_asks,
            **s.kv.state.figures(),
            **s.memory.figures(),
        }
        if s.cluster is not None:  # a member: forwards waiting for answers, requests parked
            figures["forwards_open"] = s.cluster.forwards_open
            figures["parked"] = len(s.cluster.parked)
        return figures

