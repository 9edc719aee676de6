"""Why a node does not answer: a probe of the ZeroMQ handshake with it.

A handshake that fails is silent to a socket's user: libzmq drops the connection (and
tries again, or not), and requests wait out their timeout. So a client refused by a CURVE
node, a client without CURVE calling one with it (or the other way round), a wrong server
key, and a port where something other than a node listens all looked alike:
``RequestTimeout``, after every retry. When a request has waited ``PROBE_AFTER_MS``
without an answer, the client opens one more socket to the node, set up as its own, with a
monitor (libzmq's ``zmq_socket_monitor``), and watches that socket's connection and
handshake for at most ``PROBE_TIMEOUT_MS``. A refusal no retry can mend (the node refused
the client's key; the security mechanisms differ; a handshake that failed each of
``PROBE_FAILURES_MAX`` times libzmq tried it, as with a wrong server key) is raised at once
as ``HandshakeFailed``; anything else it saw is said in the timeout's message.

Why a probe rather than a monitor on every socket: a monitor's events queue in an inproc
pipe, and once a thousand wait unread, libzmq's I/O thread blocks on the next (measured
here: a client whose handshakes failed in a loop stopped every socket of its context
within two seconds). A probe's monitor lives only while it is read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import zmq

from wire.errors import RequestTimeout

PROBE_AFTER_MS = 1000  # a request unanswered this long has its node's handshake probed
PROBE_TIMEOUT_MS = 2000  # how long a probe watches its handshake
# Failures a probe watches for one that says more: a peer that refuses the mechanism may
# close the connection before the client has read why (a failure with no detail), and the
# next attempt (libzmq reconnects after 100 ms) may read it. A handshake that failed this
# many times in a row, and never succeeded, fails for this client as it is set up (a wrong
# server key, or not a node there): no retry of a request mends it. A node that stops
# mid-handshake fails one, then refuses connections.
PROBE_FAILURES_MAX = 3
EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
          | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
ZAP_REFUSED = 400  # the ZAP status of a key the node does not allow (RFC 27)
# The protocol error of peers whose security mechanisms differ (CURVE against NULL).
MECHANISM_MISMATCH = 0x11000002  # ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH


class HandshakeFailed(RequestTimeout):
    """The node will never answer this client as it is set up: it refused the client's
    CURVE key, one side speaks CURVE and the other does not, or the handshake failed each
    time it was tried (a wrong server key). A ``RequestTimeout`` (what such a client got
    before it was told why), raised at once and never retried."""


class Verdict(NamedTuple):
    """What a probe saw: ``text`` for a message (empty: the handshake succeeded), and
    whether no retry can mend it."""

    text: str
    final: bool = False

    def raise_final(self) -> None:
        if self.final:
            raise HandshakeFailed(self.text)


def describe(kind: int, value: int, curve: bool) -> Verdict:
    """A failed handshake's monitor event as a verdict."""
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        if value == ZAP_REFUSED:
            return Verdict("the node refused this client's CURVE key (its public key is "
                           "not among those the node allows: curve_allowed_keys_dir)", True)
        return Verdict(f"the node's authentication failed (ZAP status {value})")
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == MECHANISM_MISMATCH:
        if curve:
            return Verdict("the node does not run CURVE, and this client has CURVE keys "
                           "(leave them out for this node)", True)
        return Verdict("the node runs CURVE, and this client has no keys (give it the "
                       "node's public key and a key pair the node allows)", True)
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return Verdict(f"the ZeroMQ handshake broke the protocol (error {value:#x}): is a "
                       f"shardnode node listening there?")
    if curve:
        return Verdict("the CURVE handshake failed: is the server key this node's public "
                       "key, and does the node run CURVE?")
    return Verdict("the ZeroMQ handshake failed: is a shardnode node listening there (and "
                   "not stopped or overloaded), and does it run CURVE (then this client needs "
                   "keys)?")


def probe(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str,
          secure: Callable[[zmq.Socket[bytes]], None], curve: bool,
          timeout_ms: int = PROBE_TIMEOUT_MS) -> Verdict:
    """Connect one more socket to ``endpoint``, set up by ``secure`` as the client's own
    are, and say how its handshake went within ``timeout_ms``."""
    # Here, not at the top: pyzmq's monitor module imports asyncio (40 ms), which every
    # client's process paid for at its start, for a probe that runs only now and then.
    from zmq.utils.monitor import recv_monitor_message

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor: zmq.Socket[bytes] | None = None
    connected = False
    unclear: Verdict | None = None  # the last failure that no retry is known not to mend
    failures = 0
    try:
        secure(sock)
        monitor = sock.get_monitor_socket(EVENTS)
        sock.connect(endpoint)
        deadline = time.monotonic() + timeout_ms / 1000
        while (left_ms := (deadline - time.monotonic()) * 1000) > 0:
            if not monitor.poll(int(left_ms) + 1, zmq.POLLIN):
                break
            event = recv_monitor_message(monitor)
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_CONNECTED:
                connected = True
            elif kind == zmq.EVENT_CONNECT_RETRIED and not connected:  # refused
                return Verdict("nothing accepted a connection there (is a node running?)")
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return Verdict("")
            else:
                verdict = describe(kind, value, curve)
                failures += 1
                if failures >= PROBE_FAILURES_MAX:  # failed each time: final, whatever it says
                    return verdict._replace(final=True)
                if verdict.final:
                    return verdict
                unclear = verdict
    finally:
        if monitor is not None:
            sock.disable_monitor()
            monitor.close(0)
        sock.close(0)
    if unclear is not None:
        return unclear
    if connected:
        return Verdict("connected, but no ZeroMQ handshake completed: is a shardnode node "
                       "listening there?")
    return Verdict("no connection could be made")
