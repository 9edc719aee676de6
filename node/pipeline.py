"""Many produce requests in flight on one client: ``NodeClient.pipeline()``.

A ``Pipeline`` queues produce requests and sends them as one frame (the protocol allows
several maps in a frame, as Redis pipelines commands on one stream), and reads their
answers as they come, out of order. It shares its client's sockets: each request it has
in flight is registered with the client, and whoever reads an answer hands it to the one
waiting for it (``NodeClient.hand_over``). No request waits longer than its client's
``timeout_ms``: one unanswered by then is answered ``RequestTimeout`` by the pipeline.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import zmq

from node.handshake import PROBE_AFTER_MS, HandshakeFailed
from wire.errors import Busy, NodeError, RequestTimeout, Unavailable, error_for
from wire.packer import pack, pack_map
from wire.protocol import Placed, unpack_replies
from wire.records import Record, to_wire

log = logging.getLogger("shardnode")

if TYPE_CHECKING:
    from collections.abc import Sequence

    from node.client import NodeClient

# The node remembers each producer's last 1 024 sequence numbers (``[log]
# producer_window_max``); a producer with more requests in flight could not have a retry of
# the oldest told apart from a new write.
PIPELINE_IN_FLIGHT_MAX = 1024


def expand_offsets(reply: dict[str, Any], count: int) -> list[tuple[int, int]]:
    """Per-record (partition, offset) from a produce reply."""
    parts = [Placed._make(row) for row in reply["parts"]]
    assign = reply.get("assign")
    if assign is None:
        (placed,) = parts
        return [(placed.partition, placed.first_offset + i) for i in range(placed.record_count)]
    nxt = {placed.partition: placed.first_offset for placed in parts}
    out = []
    for p in assign:
        out.append((p, nxt[p]))
        nxt[p] += 1
    return out


class Pipeline:
    """Many produce requests in flight on one client, answered out of order.

    ``submit`` queues a request and returns its id; ``flush`` sends what is queued as one
    frame (``wire.protocol``), and ``poll`` flushes, then returns finished requests as
    ``(id, offsets or NodeError)``. A queue of ``SUBMIT_QUEUE_MAX`` requests or
    ``SUBMIT_QUEUE_BYTES_MAX`` bytes is sent at once. At most ``in_flight_max`` requests may
    be in flight, queued ones included: ``submit`` raises ``Busy`` beyond that (poll first).
    Used by the benchmark and the crash test.

    On a client of a cluster (routed), each request goes to the member owning the partition
    it names, or, naming none, the one partition its records land on (by key, or the
    request's round-robin pick); a request whose records land on several members goes to
    the client's first endpoint, which splits it and forwards the parts. Each member's
    requests are queued and sent as frames of their own. A request that cannot be sent
    (its member is down: sockets are ``IMMEDIATE``) is answered ``Unavailable`` by the next
    ``poll``; sending it again under its sequence number is safe. A topic's owners are
    learned by a call to the cluster at a submit that needs them. So for a single node: its
    sockets are ``IMMEDIATE`` too, and a frame it does not take within a second (it is down,
    or restarting) is never sent, its requests answered ``RequestTimeout`` (not connected)
    by the next ``poll``; ZeroMQ kept them, and sent them once the node was back, long after
    they were given up. A flush to a node that is down takes a second, and a probe of its
    handshake (up to ``PROBE_TIMEOUT_MS`` more) to say why in the answers.

    A pipeline shares its client's sockets with the client's calls and transactions: what
    one of them reads that is another's is handed to it (``NodeClient.hand_over``).

    Every wait is bounded: a request unanswered ``timeout_ms`` (its client's) after it was
    sent is given up, and answered ``RequestTimeout`` by the ``poll`` that finds it so
    (its answer, if it comes later, is dropped; sending it again under its sequence number
    is safe). The node may have lost it (its front door restarted), or never seen it: a
    node that refuses this client's ZeroMQ handshake (a CURVE key it does not allow, CURVE
    on one side only) never answers. So, as a ``NodeClient`` call does, a ``poll`` with
    nothing to return probes the handshake (node/handshake.py) once a request has waited
    ``PROBE_AFTER_MS`` while its node said nothing: a refusal no retry can mend raises
    ``HandshakeFailed`` (the requests stay in flight: close the pipeline), and whatever
    else the probe saw is said in the timeouts' message. At most one probe a ``poll``,
    which may then take up to ``PROBE_TIMEOUT_MS`` longer than asked.
    """

    SUBMIT_QUEUE_MAX = 256
    SUBMIT_QUEUE_BYTES_MAX = 1 << 20

    def __init__(self, client: NodeClient, in_flight_max: int = PIPELINE_IN_FLIGHT_MAX) -> None:
        if not 1 <= in_flight_max <= PIPELINE_IN_FLIGHT_MAX:
            raise ValueError(f"in_flight_max must be 1..{PIPELINE_IN_FLIGHT_MAX}, "
                             f"got {in_flight_max}")
        self.client = client
        self.in_flight_max = in_flight_max
        # Request id → record count; in the order submitted, which is the ids' order.
        self.in_flight: dict[int, int] = {}
        # When requests were sent: (the newest request a flush sent, when), oldest first;
        # those before the oldest request in flight are dropped as it is looked up
        # (``oldest``). One entry a flush, not one a request: the hot path stays cheap.
        self.sends: deque[tuple[int, float]] = deque()
        # What each socket's node last did: when it was last heard from (a frame read), and
        # what a probe of its handshake said since (node/handshake.py).
        self.heard: dict[zmq.Socket[bytes], float] = {}
        self.probed: dict[zmq.Socket[bytes], str] = {}
        self.queued: list[bytes] = []  # packed requests not sent yet (a single node)
        self.queued_bytes = 0
        # A routed client: the requests not sent yet, (id, packed), by the member's socket,
        # and the socket of each request in flight; the answers of requests that could not
        # be sent, for the next poll.
        self.routed_queues: dict[zmq.Socket[bytes], list[tuple[int, bytes]]] = {}
        self.routes: dict[int, zmq.Socket[bytes]] = {}
        self.unsent: list[tuple[int, list[tuple[int, int]] | NodeError]] = []
        # Answers another reader of the socket handed over (``take``): id, count, reply.
        self.handed: list[tuple[int, int, dict[str, Any]]] = []

    def submit(self, topic: str, records: Sequence[Record | bytes | str],
               partition: int | None = None,
               blob: bytes | None = None, seq: int | None = None) -> int:
        """Queue a produce request; returns its id. ``seq`` resends an earlier request
        under its sequence number (a retry the node recognises); by default the next one."""
        if len(self.in_flight) >= self.in_flight_max:
            raise Busy(f"{len(self.in_flight)} requests in flight, this pipeline's limit; "
                       f"poll for answers first")
        c = self.client
        rid = next(c._ids)
        seq = c.next_seq() if seq is None else seq
        # The hot path of the client: the map is written out here, in the order
        # ``request_map("produce", rid, fields, id_first=True)`` gives (a test holds the two
        # together), which cost 0.4-0.6 µs more per request.
        fields: dict[str, Any] = {"op": "produce", "id": rid, "topic": topic,
                                  "producer_id": c.producer_id, "seq": seq,
                                  "records": blob if blob is not None else
                                  pack([to_wire(r) for r in records])}
        if partition is not None:
            fields["partition"] = partition
        frame = pack_map(fields)
        if c.routed:
            sock = self.member_socket(topic, records, partition, blob, seq)
            self.in_flight[rid] = len(records)  # before a send its queue may make fails
            self.routes[rid] = sock
            c._waiters[rid] = self
            self.queue_routed(rid, frame, sock)
            return rid
        if self.queued and self.queued_bytes + len(frame) > self.SUBMIT_QUEUE_BYTES_MAX:
            self.flush()
        self.queued.append(frame)
        self.queued_bytes += len(frame)
        self.in_flight[rid] = len(records)
        c._waiters[rid] = self
        if len(self.queued) >= self.SUBMIT_QUEUE_MAX:
            self.flush()
        return rid

    def member_socket(self, topic: str, records: Sequence[Record | bytes | str],
                      partition: int | None, blob: bytes | None, seq: int
                      ) -> zmq.Socket[bytes]:
        """A routed client's socket for a request: its partition's owner's, when the request
        lands on one member and the topic's owners are known; the first endpoint's else."""
        c = self.client
        owners = c._owners.get(topic)
        if owners is None:
            try:
                owners = c.owners(topic)
            except NodeError:
                owners = None  # the first endpoint answers the request with the error
        if not owners:
            return c.sock
        if partition is not None:
            ps = {partition}
        elif blob is None:
            ps = set(c._spread(records, seq, len(owners)))
        else:
            return c.sock  # its keys are in the blob: the member that receives it splits it
        members = {owners[p] for p in ps if 0 <= p < len(owners)}
        if len(members) != 1:
            return c.sock  # several members (the first endpoint splits it), or no partition
        endpoint = c.members().get(members.pop())
        return c.sock if endpoint is None else c._sock(endpoint)

    def queue_routed(self, rid: int, frame: bytes, sock: zmq.Socket[bytes]) -> None:
        queue = self.routed_queues.setdefault(sock, [])
        queue.append((rid, frame))
        self.queued_bytes += len(frame)
        if len(queue) >= self.SUBMIT_QUEUE_MAX or self.queued_bytes > self.SUBMIT_QUEUE_BYTES_MAX:
            self.flush()

    def flush(self) -> None:
        """Send the queued requests, as one frame (to each member, on a cluster)."""
        with self.client.one_thread():
            self._flush()

    def _flush(self) -> None:
        self.client.settle_transactions()  # the node sees requests in the order they were made
        if (self.queued or self.routed_queues) and self.in_flight:
            # Each request in flight is sent now, the newest too; noted before the sends (a
            # member down takes up to a second of each, and a send cut short by an
            # exception leaves none of them unnoted).
            self.sends.append((next(reversed(self.in_flight)), time.monotonic()))
        if self.queued:
            frame = self.queued[0] if len(self.queued) == 1 else b"".join(self.queued)
            count, self.queued, self.queued_bytes = len(self.queued), [], 0
            try:
                self.client.sock.send(frame, 0, copy=len(frame) < 65536)
            except zmq.Again:  # no connection within a second (IMMEDIATE): never sent
                lost = self.client.not_connected(self.client.sock)
                if isinstance(lost, HandshakeFailed):
                    raise lost from None  # they stay in flight, unsent: close the pipeline
                for rid in list(self.in_flight)[-count:]:  # the queued ones: the newest
                    del self.in_flight[rid]
                    self.client._waiters.pop(rid, None)
                    self.unsent.append((rid, lost))
        if self.routed_queues:
            queues, self.routed_queues, self.queued_bytes = self.routed_queues, {}, 0
            for sock, items in queues.items():
                self.send_routed(sock, items)

    def send_routed(self, sock: zmq.Socket[bytes], items: list[tuple[int, bytes]]) -> None:
        frame = b"".join(f for _rid, f in items)
        try:
            sock.send(frame, 0, copy=len(frame) < 65536)
        except zmq.Again:  # not connected (IMMEDIATE), within the socket's send timeout
            down = Unavailable(f"{self.client._name(sock)} is not reachable (down?)")
            for rid, _f in items:
                if self.in_flight.pop(rid, None) is not None:
                    self.client._waiters.pop(rid, None)
                    del self.routes[rid]
                    self.unsent.append((rid, down))

    def poll(self, timeout_ms: int, offsets: bool = True
             ) -> list[tuple[int, list[tuple[int, int]] | NodeError]]:
        """Finished requests: each one's records' ``(partition, offset)``, or its error.
        Waits up to ``timeout_ms`` for one (less when the oldest request's time is up
        first): a request unanswered its client's ``timeout_ms`` after it was sent is
        answered ``RequestTimeout``, and a node that refuses this client's handshake raises
        ``HandshakeFailed`` (the class's docstring). With ``offsets=False`` a success is an
        empty list: a caller that does not use them (the Spark sink) saves building a pair
        per record."""
        with self.client.one_thread():
            return self._poll(timeout_ms, offsets)

    def _poll(self, timeout_ms: int, offsets: bool
              ) -> list[tuple[int, list[tuple[int, int]] | NodeError]]:
        self._flush()
        out, self.unsent = self.unsent, []
        if self.handed:
            handed, self.handed = self.handed, []
            for rid, count, reply in handed:
                self.answer(out, rid, count, reply, offsets)
        poller = None
        if self.client.routed:
            poller = zmq.Poller()
            for sock in self.client._socks.values():
                poller.register(sock, zmq.POLLIN)
        now = time.monotonic()
        end = now if out else now + timeout_ms / 1000
        may_probe = not out  # once a call, and with nothing to return (a probe may raise)
        while True:
            until, probe_at = end, math.inf
            if self.in_flight:
                sent_at, sock = self.oldest()
                until = min(end, sent_at + self.client.timeout_ms / 1000)
                if may_probe and sock not in self.probed:
                    silent_since = max(sent_at, self.heard.get(sock, sent_at))
                    probe_at = silent_since + min(PROBE_AFTER_MS, self.client.timeout_ms) / 1000
            self.wait(poller, min(until, probe_at) - now, out, offsets)
            now = time.monotonic()
            if out:
                break
            if now >= probe_at:
                self.probed[sock] = self.client.probe(sock)  # raises a refusal
                may_probe = False
                now = time.monotonic()
            elif now >= until:
                break  # the end of the wait, or the oldest request's time is up
        self.give_up(out, now)
        return out

    def wait(self, poller: zmq.Poller | None, wait_s: float,
             out: list[tuple[int, list[tuple[int, int]] | NodeError]], offsets: bool) -> None:
        """Wait up to ``wait_s`` for a frame on the client's socket (on ``poller``'s, routed)
        and read what came: the answers to this pipeline's requests go to ``out``."""
        wait_ms = int(wait_s * 1000) + 1 if wait_s > 0 else 0
        if poller is None:
            sock = self.client.sock
            if sock.poll(wait_ms, zmq.POLLIN):
                self.drain(sock, out, offsets)
            return
        for sock, _ev in poller.poll(wait_ms):
            self.drain(sock, out, offsets)

    def oldest(self) -> tuple[float, zmq.Socket[bytes]]:
        """When the oldest request in flight was sent, and the socket it went on (there must
        be one: ``poll`` flushes first)."""
        rid = next(iter(self.in_flight))
        return self.sent_at(rid), self.routes.get(rid, self.client.sock)

    def sent_at(self, rid: int) -> float:
        """When request ``rid`` was sent, the requests before it forgotten: the requests of
        one send share its entry, that of the newest. (Every send notes one; a request with
        none, as after a send an interrupt cut short, counts from now.)"""
        sends = self.sends
        while sends and sends[0][0] < rid:
            sends.popleft()
        if not sends:
            sends.append((next(reversed(self.in_flight)), time.monotonic()))
        return sends[0][1]

    def give_up(self, out: list[tuple[int, list[tuple[int, int]] | NodeError]],
                now: float) -> None:
        """Answer ``RequestTimeout`` to each request sent its client's ``timeout_ms`` ago or
        more, and forget it: its answer, if it comes, is dropped (``NodeClient.hand_over``)."""
        if not self.in_flight:
            return
        c = self.client
        sent_by = now - c.timeout_ms / 1000
        if self.oldest()[0] > sent_by:
            return  # the common case: the oldest request has time left, so all have
        expired = []
        for rid in self.in_flight:  # oldest first
            if self.sent_at(rid) > sent_by:
                break
            expired.append(rid)
        errors: dict[zmq.Socket[bytes], RequestTimeout] = {}
        for rid in expired:
            del self.in_flight[rid]
            c._waiters.pop(rid, None)
            sock = self.routes.pop(rid, c.sock)
            exc = errors.get(sock)
            if exc is None:
                exc = errors[sock] = self.timed_out(sock)
            out.append((rid, exc))
        for sock in errors:
            self.probed.pop(sock, None)  # the next requests' silence gets a probe of its own

    def timed_out(self, sock: zmq.Socket[bytes]) -> RequestTimeout:
        """The answer to a request on ``sock`` given up, with what a probe of its node's
        handshake said, if one did (as a ``NodeClient`` call's timeout says it)."""
        c = self.client
        note = self.probed.get(sock)
        return RequestTimeout(f"no reply from {c._name(sock)} within {c.timeout_ms} ms"
                              f"{f'; {note}' if note else ''}: given up, its answer is dropped "
                              f"if it comes; sending it again under its sequence number is safe")

    def drain(self, sock: zmq.Socket[bytes],
              out: list[tuple[int, list[tuple[int, int]] | NodeError]], offsets: bool) -> None:
        """Read the frames waiting on ``sock``: the answers to this pipeline's requests."""
        self.heard[sock] = time.monotonic()
        if self.probed:
            self.probed.pop(sock, None)  # it answers: what a probe said of it is stale
        in_flight, routes = self.in_flight, self.routes
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                replies = unpack_replies(frame)
            except ValueError as exc:  # not the node's, or a protocol bug: dropped
                log.warning("%s sent a frame that is not replies (dropped): %s",
                            self.client._name(sock), exc)
                continue
            for reply in replies:
                rid = reply.get("id")
                if type(rid) is not int or (count := in_flight.pop(rid, None)) is None:
                    self.client.hand_over(reply)  # a transaction's, or a late answer
                    continue
                del self.client._waiters[rid]
                if routes:
                    del routes[rid]
                self.answer(out, rid, count, reply, offsets)

    @staticmethod
    def answer(out: list[tuple[int, list[tuple[int, int]] | NodeError]], rid: int, count: int,
               reply: dict[str, Any], offsets: bool) -> None:
        if reply.get("ok"):
            out.append((rid, expand_offsets(reply, count) if offsets else []))
        else:
            out.append((rid, error_for(reply.get("code", 0), reply.get("error", ""))))

    def close(self) -> None:
        """Give up the requests still unanswered: their answers, if they come, are dropped
        (a pipeline given up on would be kept, with them, by its client)."""
        for rid in self.in_flight:
            self.client._waiters.pop(rid, None)
        self.in_flight.clear()
        self.queued.clear()  # never sent: a poll after close sent them
        self.queued_bytes = 0
        self.routed_queues.clear()
        self.routes.clear()
        self.sends.clear()
        self.probed.clear()
        self.heard.clear()
        self.handed.clear()
        self.unsent.clear()

    def take(self, rid: int, reply: dict[str, Any]) -> None:
        """An answer to one of this pipeline's requests that another reader of the socket
        read (``NodeClient.hand_over``): returned by the next ``poll``."""
        count = self.in_flight.pop(rid, None)
        if count is not None:
            self.routes.pop(rid, None)
            self.handed.append((rid, count, reply))
