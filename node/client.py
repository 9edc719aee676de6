"""The Python client: ``NodeClient(endpoint)``, synchronous, typed, a context manager.

Every call is one request on a DEALER socket and waits for its reply with a timeout.
Requests are built, and replies read, by the table of ops in ``wire.protocol`` (``OPS``):
``call(op, **fields)`` works for any op in it, and says which ops are safe to retry.
Produce is idempotent: each client has a random producer id and numbers its produce
requests, so a retry after a lost acknowledgement is recognised by the node and answered
with the original offsets instead of writing twice. Errors the node answers are raised
as ``wire.errors.NodeError`` subclasses carrying the code and message.

    with NodeClient("tcp://127.0.0.1:7400") as c:
        c.create_topic("events", partitions=4)
        partition, offset = c.produce("events", b"hello", key=b"user-1")
        for record in c.read("events", partition, 0):
            print(record.offset, record.value)

With CURVE on the node (``[security]``), a client names the node's public key and its own
key pair, Z85 as ``shardnode keygen`` writes them:

    NodeClient(endpoint, server_public_key=read_public_key("keys/node.pub"),
               client_keys=read_keypair("keys/client.key"))
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import random
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from actors.curve import curve_client, read_keypair, read_public_key
from actors.roles import key_partition
from node.handshake import PROBE_AFTER_MS, PROBE_TIMEOUT_MS, HandshakeFailed, probe
from node.pipeline import PIPELINE_IN_FLIGHT_MAX, Pipeline, expand_offsets
from node.transaction import Transaction, TxnInfo, TxnResult, result_of
from wire.errors import (
    Busy,
    ErrorCode,
    NodeError,
    NotOwner,
    OffsetOutOfRange,
    RequestTimeout,
    Unavailable,
    UnknownTopic,
    UnknownTransaction,
    XAERDupid,
    XAERNota,
    XARBRollback,
    error_for,
)
from wire.protocol import (
    DEFAULT_PORT,
    KV_PREFIX,
    NODE_FRAME_BYTES_MAX_DEFAULT,
    OPS,
    SHARD_STATS_ROW,
    WRITER_STATS_ROW,
    Topic,
    check_reply,
    kv_topic,
    pack_request,
    unpack_replies,
)
from wire.records import Record, as_bytes, as_tags, pack_batch, unpack_read
from wire.xid import Xid
from wire.xid import check as check_xid

__all__ = ["NodeClient", "NodeError", "Pipeline", "Record", "TopicInfo", "Transaction",
           "TxnInfo", "TxnResult", "Xid", "read_keypair", "read_public_key"]

DEFAULT_ENDPOINT = f"tcp://127.0.0.1:{DEFAULT_PORT}"
_RETRYABLE = (ErrorCode.BUSY, ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE)
XA_START_ATTEMPTS = 3  # an xa_start rolled back by restarts before it was answered is begun again


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    storage: str = "rocksdb"
    retention_ms: int = 0  # 0: records are kept whatever their age
    retention_bytes: int = 0  # 0: whatever a partition's size


def endpoint_problem(endpoint: object) -> str:
    """Why ``endpoint`` cannot be a node's ("" if it can): a node listens on
    ``tcp://HOST:PORT``. (ZeroMQ says only "Invalid argument", or "Protocol not
    supported".)"""
    if not isinstance(endpoint, str):
        return f"must be a str such as {DEFAULT_ENDPOINT}"
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return f"not an endpoint such as {DEFAULT_ENDPOINT}"
    if scheme != "tcp":
        return f"a node listens on tcp://HOST:PORT, not on {scheme}://"
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"needs a host and a port from 1 to 65535, such as {DEFAULT_ENDPOINT}"
    return ""


# Ops that name one partition: a client of a cluster sends them to its owner.
PARTITION_OPS = frozenset({"produce", "read", "read_by_key", "read_by_tag",
                           "offset_for_timestamp", "commit_offset", "committed_offset",
                           "delete_by_key", "delete_by_offset"})
# Key/value ops: a client of a cluster sends them to the namespace's owner, when it knows it.
KV_OPS = frozenset({"kv_put", "kv_get", "kv_delete", "kv_scan", "kv_cas"})
SEND_TIMEOUT_MS_MAX = 1000  # how long a send waits for a member's connection
CLOSE_ROLLBACK_MS = 2000  # how long close() waits for each open transaction's rollback
NOT_CONNECTED_HINT = " (is a node running there, and does it allow this client's keys?)"


class OneThread:
    """The guard of a client's sockets: a client is one thread's. Two threads read the same
    socket, took each other's answers, dropped them, and timed out saying "is a node running
    there?"; entered by a second thread while another's use is under way, it raises
    ``RuntimeError``. One thread after another may use the client; one thread may enter it
    again within its own use. Taken with one dict operation (atomic under the GIL): on every
    call's way, where a lock in a generator context cost 3-4 µs."""

    __slots__ = ("_depth", "_held")

    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._depth = 0

    def __enter__(self) -> None:
        me = threading.get_ident()
        if self._held.setdefault("owner", me) != me:
            raise RuntimeError(
                "this NodeClient is in use by another thread: a client is not thread-safe; "
                "give each thread its own (NodeClient(...) per thread)")
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if not self._depth:
            del self._held["owner"]


class NodeClient:
    """A synchronous client of one node, or of a cluster. Not thread-safe: use one per
    thread.

    Given one endpoint, every request goes to that node (a member of a cluster forwards
    what another member owns). Given a list, the client learns the cluster's members
    (``cluster_map``) and each topic's owners (``list_topics``) from any of them, and sends
    each request to the member owning its partition: a batch with no partition named is
    split by key and sent to each owner at once; a ``NotOwner`` answer refreshes the map
    and retries; topics are created and deleted on the catalog member.

    For nodes with CURVE on, ``server_public_key`` is the node's public key (in a cluster,
    the first endpoint's: the client learns the others' from the cluster map) and ``client_keys``
    this client's ``(public, secret)`` pair, all Z85 bytes (``read_public_key``,
    ``read_keypair``): both or neither. A client the node does not allow, one without
    CURVE, or one with a wrong server key, is never answered: its calls raise
    ``HandshakeFailed`` (a ``RequestTimeout``), not retried, once a probe of the handshake
    says so, a second or two into the first attempt (node/handshake.py).

    ``producer_id`` (random by default) numbers this client's writes with ``next_seq``, so a
    retry after a lost answer is recognised and not written twice. Give one only to go on
    with another client's numbering (its requests sent again under their ``seq``): two
    clients with one producer id, each numbering from 0, are taken for retries of each
    other, and the second's writes are answered with the first's offsets, not written."""

    def __init__(self, endpoint: str | Sequence[str] = DEFAULT_ENDPOINT, timeout_ms: int = 10_000,
                 retries: int = 5, producer_id: int | None = None, *,
                 server_public_key: bytes | None = None,
                 client_keys: tuple[bytes, bytes] | None = None) -> None:
        if (server_public_key is None) != (client_keys is None):
            raise ValueError("CURVE needs both server_public_key and client_keys, or neither")
        self.server_public_key = server_public_key
        self.client_keys = client_keys
        endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        if not endpoints:
            raise ValueError("NodeClient needs at least one endpoint")
        for e in endpoints:
            problem = endpoint_problem(e)
            if problem:
                raise ValueError(f"endpoint {e!r}: {problem}")
        if type(timeout_ms) is not int or timeout_ms < 1:
            raise ValueError(f"timeout_ms must be a whole number of ms, at least 1, not "
                             f"{timeout_ms!r}")
        if type(retries) is not int or retries < 0:
            raise ValueError(f"retries must be a whole number, at least 0, not {retries!r}")
        self.endpoints = endpoints
        self.routed = len(endpoints) > 1
        endpoint = endpoints[0]
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.retries = retries
        self.producer_id = producer_id if producer_id is not None else random.getrandbits(62)
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._partitions: dict[str, int] = {}
        # Transactions with requests queued or in flight (node/transaction.py): any other
        # call first sends theirs and reads their answers, so that the node sees every
        # request in the order it was made.
        self._unsettled: set[Transaction] = set()
        # Who waits for the answer of each request a transaction or a pipeline has in
        # flight: a reader of a socket hands every answer that is not its own to it
        # (``hand_over``), so several of them, and plain calls, can share the socket.
        self._waiters: dict[int, Transaction | Pipeline] = {}
        self._branches: weakref.WeakValueDictionary[Xid, Transaction] = weakref.WeakValueDictionary()
        self._local: weakref.WeakSet[Transaction] = weakref.WeakSet()  # rolled back at close
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._one_thread = OneThread()  # a second thread's use at once raises
        self._member_keys: dict[str, bytes] = {}  # endpoint → its CURVE key, from the map
        # What the probe of a handshake said in the call under way (node/handshake.py),
        # kept only within ``_one_probe``.
        self._probed: str | None = None
        self._probe_once = False
        self.sock = self._socket(endpoint)
        # A cluster (routed): member id → endpoint, topic → owners, endpoint → socket.
        self._members: dict[int, str] = {}
        self._owners: dict[str, tuple[int, ...]] = {}
        self._socks: dict[str, zmq.Socket[bytes]] = {endpoint: self.sock}

    def _socket(self, endpoint: str) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        self._secure(sock, self._member_keys.get(endpoint))
        # Never queue a request for a node that is not connected: ZeroMQ would keep it, and
        # deliver it once the node is back, long after the call gave up (a delete_topic or
        # kv_drop that raised RequestTimeout, run minutes later). A blocking send (a
        # pipeline's, a transaction's) waits up to a second for a connection; a call waits
        # as long as ``send_timeout_ms`` says (``_send_on``). A connection whose CURVE
        # handshake failed (a client without keys, or one the node does not allow) is
        # dropped, and so never found.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.SNDTIMEO, min(self.timeout_ms, SEND_TIMEOUT_MS_MAX))
        sock.connect(endpoint)
        return sock

    def send_timeout_ms(self) -> int:
        """How long a send waits for a connection: a member of a cluster that is down is
        passed over sooner than a single node is given up on."""
        return min(self.timeout_ms, SEND_TIMEOUT_MS_MAX) if self.routed else self.timeout_ms

    # ---- plumbing -------------------------------------------------------------------

    def _secure(self, sock: zmq.Socket[bytes], server_key: bytes | None = None) -> None:
        """Make ``sock`` a CURVE client of the node when this client has keys (the member's
        own key when the cluster map names one); before it connects."""
        if self.server_public_key is not None and self.client_keys is not None:
            curve_client(sock, server_key or self.server_public_key, *self.client_keys)

    def close(self) -> None:
        """Close the sockets, first rolling back the local transactions of this client still
        open (neither committed nor aborted: a ``with`` block does either), briefly: one try
        each, as the node may be down (it rolls them back after their timeout then; until
        that, each held a place in ``[txn] open_max``). XA branches are their
        coordinator's, and are left as they are."""
        open_local = [tx for tx in self._local if not tx.finished]
        if open_local:
            self.retries, self.timeout_ms = 0, min(self.timeout_ms, CLOSE_ROLLBACK_MS)
            for tx in open_local:
                with contextlib.suppress(NodeError, zmq.ZMQError):
                    tx.abort()
        for sock in self._socks.values():
            sock.close(0)

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_seq(self) -> int:
        return next(self._seq)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request of ``op`` (an op of ``wire.protocol.OPS``, with its request
        fields) and return its reply map, which carries the op's reply fields; retry what
        the table says is safe to retry. A client of a cluster sends it to the member that
        owns its partition, or that holds the catalog, and follows a changed map once."""
        with self.one_thread():
            self.settle_transactions()
            if not self.routed:
                return self._call_on(self.sock, op, fields)
            try:
                return self._call_on(self._route(op, fields), op, fields)
            except (NotOwner, UnknownTopic):
                if "topic" not in fields and "namespace" not in fields and op != "delete_topic":
                    raise
                self._owners.clear()  # the map changed: learn it again, and try once more
                return self._call_on(self._route(op, fields), op, fields)

    def _call_on(self, sock: zmq.Socket[bytes], op: str, fields: dict[str, Any]
                 ) -> dict[str, Any]:
        with self._one_probe():
            return self._attempts(sock, op, fields)

    @contextlib.contextmanager
    def _one_probe(self) -> Iterator[None]:
        """Within it, the node's handshake is probed at most once (``probe``): a call's
        retries, and ``not_connected``, take what it said."""
        with self.one_thread():
            self._probed, self._probe_once = None, True
            try:
                yield
            finally:
                self._probed, self._probe_once = None, False

    def one_thread(self) -> OneThread:
        """Around whatever sends on or reads this client's sockets (its calls, its pipelines'
        flushes and polls, its transactions' sends and reads): another thread's use under
        way meanwhile raises ``RuntimeError`` (``OneThread``)."""
        return self._one_thread

    def _attempts(self, sock: zmq.Socket[bytes], op: str, fields: dict[str, Any]
                  ) -> dict[str, Any]:
        attempts = self.retries + 1 if op in OPS and OPS[op].retry else 1
        backoff_s = 0.01
        last: NodeError | None = None
        start = time.monotonic()
        answered = False  # whether the node answered any attempt
        unconnected: NodeError | None = None  # the last attempt that found no connection
        frame_bytes = 0
        tried = 0
        while tried < attempts:
            tried += 1
            rid = next(self._ids)
            frame = pack_request(op, rid, fields)
            frame_bytes = len(frame)
            try:
                self._send_on(sock, frame)
            except zmq.Again:
                if not self.routed:  # waited a whole timeout_ms for a connection
                    last = unconnected = self.not_connected(sock)
                    if isinstance(last, HandshakeFailed):
                        raise last from None
                    continue
                last = Unavailable(f"{self._name(sock)} is not reachable (down?)")
                time.sleep(backoff_s)  # back off before retrying an unreachable node
                backoff_s = min(backoff_s * 2, 1.0)
                continue
            try:
                reply = self._await(rid, sock)
                check_reply(op, reply)
                return reply
            except NodeError as exc:
                if exc.code not in _RETRYABLE or isinstance(exc, HandshakeFailed):
                    raise
                answered = answered or not isinstance(exc, RequestTimeout)
                last = exc
                if (isinstance(exc, RequestTimeout) and not answered
                        and frame_bytes > 2 * NODE_FRAME_BYTES_MAX_DEFAULT):
                    break  # most likely dropped unread (below): sent again, dropped again
                time.sleep(backoff_s)  # back off before retrying a BUSY or unreachable node
                backoff_s = min(backoff_s * 2, 1.0)
        assert last is not None
        if last is unconnected:  # never connected at the last attempt: it says so
            raise last
        if isinstance(last, RequestTimeout) and not answered and (
                tried > 1 or frame_bytes > 2 * NODE_FRAME_BYTES_MAX_DEFAULT):
            note = f"; {self._probed}" if self._probed else ": is a node running there?"
            if frame_bytes > 2 * NODE_FRAME_BYTES_MAX_DEFAULT:
                note += (f" (or the request's {frame_bytes} bytes are over twice the node's "
                         f"[limits] frame_bytes_max, {NODE_FRAME_BYTES_MAX_DEFAULT} by "
                         f"default: it drops such a frame unanswered)")
            raise RequestTimeout(f"no reply from {self._name(sock)} to {tried} attempt(s) "
                                 f"over {time.monotonic() - start:.0f} s ({self.timeout_ms} "
                                 f"ms each){note}")
        raise last

    def _send_on(self, sock: zmq.Socket[bytes], frame: bytes) -> None:
        """Send a request. When no connection takes it at once, wait for one as long as the
        socket's send timeout (then ``zmq.Again``), probing the node's handshake once on the
        way: a refusal no retry can mend raises ``HandshakeFailed`` at once."""
        try:
            sock.send(frame, zmq.NOBLOCK)
            return
        except zmq.Again:
            pass
        start = time.monotonic()
        timeout_ms = self.send_timeout_ms()
        # A member of a cluster is passed over (SEND_TIMEOUT_MS_MAX) before a probe is due.
        probe_at = start + PROBE_AFTER_MS / 1000 if timeout_ms > PROBE_AFTER_MS else math.inf
        if not self._poll(sock, zmq.POLLOUT, start + timeout_ms / 1000, probe_at):
            raise zmq.Again
        sock.send(frame, zmq.NOBLOCK)

    def _poll(self, sock: zmq.Socket[bytes], event: int, deadline: float,
              probe_at: float) -> bool:
        """Wait for ``event`` on ``sock`` until ``deadline`` (False then); not come by
        ``probe_at``, probe the node's handshake, once a call (``probe``: raises a refusal
        no retry can mend)."""
        while True:
            due = deadline if self._probed is not None else min(deadline, probe_at)
            wait_ms = (due - time.monotonic()) * 1000
            if sock.poll(int(wait_ms) + 1 if wait_ms > 0 else 0, event):
                return True
            now = time.monotonic()
            if self._probed is None and now >= probe_at:
                self.probe(sock)
            elif now >= deadline:
                return False

    def probe(self, sock: zmq.Socket[bytes]) -> str:
        """Probe the handshake with ``sock``'s node (node/handshake.py): raise
        ``HandshakeFailed`` for a refusal no retry can mend; else what it saw, for a
        timeout's message ("" if the handshake succeeded). Once a call: its retries and
        ``not_connected`` take what it said. It watches no longer than ``timeout_ms``."""
        if self._probed is not None:
            return self._probed
        endpoint = self._endpoint_of(sock)
        verdict = probe(self._ctx, endpoint,
                        lambda s: self._secure(s, self._member_keys.get(endpoint)),
                        curve=self.client_keys is not None,
                        timeout_ms=min(PROBE_TIMEOUT_MS, self.timeout_ms))
        verdict.raise_final()
        if self._probe_once:
            self._probed = verdict.text
        return verdict.text

    def not_connected(self, sock: zmq.Socket[bytes]) -> RequestTimeout:
        """What a request gets whose send waited ``timeout_ms`` for a connection to a single
        node (``SNDTIMEO``): ``HandshakeFailed`` if the node refused the handshake."""
        try:
            note = self.probe(sock)
        except HandshakeFailed as exc:
            return exc
        return RequestTimeout(f"no reply from {self._name(sock)} within {self.timeout_ms} ms: "
                              f"not connected" + (f"; {note}" if note else NOT_CONNECTED_HINT))

    def settle_transactions(self) -> None:
        """Send what open transactions have queued and read their answers (what failed stays
        with each, raised by its next ``settle``): before any other request on the socket."""
        for tx in list(self._unsettled):
            if self.routed and tx.unheard():
                # Nothing sent yet: its begin waits for its first write, which picks the
                # member it lives on (a call in between must not tie it to the first one).
                continue
            self._unsettled.discard(tx)
            tx._send()
            tx._collect(0)

    def _await(self, rid: int, sock: zmq.Socket[bytes] | None = None) -> dict[str, Any]:
        sock = self.sock if sock is None else sock
        start = time.monotonic()
        deadline = start + self.timeout_ms / 1000
        # Unanswered this long, the node's handshake is probed (node/handshake.py).
        probe_at = start + min(PROBE_AFTER_MS, self.timeout_ms) / 1000
        while True:
            if not self._poll(sock, zmq.POLLIN, deadline, probe_at):
                note = f"; {self._probed}" if self._probed else ""
                raise RequestTimeout(f"no reply from {self._name(sock)} within "
                                     f"{self.timeout_ms} ms{note}")
            mine = None
            for reply in unpack_replies(sock.recv()):  # the whole frame: others' too
                if reply.get("id") == rid:
                    mine = reply
                else:
                    self.hand_over(reply)  # a transaction's or a pipeline's, or a late one
            if mine is None:
                continue
            if not mine.get("ok"):
                raise error_for(mine.get("code", 0), mine.get("error", ""))
            return mine

    def hand_over(self, reply: dict[str, Any]) -> None:
        """Give an answer read from a socket by someone it is not for to the transaction or
        pipeline waiting for it; the late answer to an attempt given up on is dropped."""
        rid = reply.get("id")
        if type(rid) is int and (waiter := self._waiters.pop(rid, None)) is not None:
            waiter.take(rid, reply)

    # ---- a cluster: members, owners, routing ---------------------------------------

    def _endpoint_of(self, sock: zmq.Socket[bytes]) -> str:
        return next((e for e, s in self._socks.items() if s is sock), self.endpoint)

    def _name(self, sock: zmq.Socket[bytes]) -> str:
        endpoint = self._endpoint_of(sock)
        member = next((m for m, e in self._members.items() if e == endpoint), 0)
        return f"node {member} ({endpoint})" if member else endpoint

    def _sock(self, endpoint: str) -> zmq.Socket[bytes]:
        sock = self._socks.get(endpoint)
        if sock is None:
            sock = self._socks[endpoint] = self._socket(endpoint)
        return sock

    def _any(self, op: str, fields: dict[str, Any], first: str | None = None
             ) -> dict[str, Any]:
        """``op`` answered by the first member that answers: ``first``, then the endpoints
        this client was given, then the other members it knows."""
        order = [first] if first else []
        order += self.endpoints + sorted(self._members.values())
        last: NodeError | None = None
        tried = list(dict.fromkeys(order))
        for endpoint in tried:
            try:
                return self._call_on(self._sock(endpoint), op, fields)
            except HandshakeFailed:
                raise  # this client's set-up, which another member would refuse too
            except (Unavailable, RequestTimeout) as exc:
                last = exc
        assert last is not None
        if len(tried) == 1:  # one node, not a cluster
            raise Unavailable(last.message)
        raise Unavailable(f"no member of the cluster answered: {last.message}")

    def members(self) -> dict[int, str]:
        """The cluster's members, id → endpoint (empty for a single node)."""
        if not self._members:
            reply = self._any("cluster_map", {})
            self._members = {int(m): str(e) for m, e, _k in reply["members"]}
            self._member_keys = {str(e): k.encode() for _m, e, k in reply["members"] if k}
        return dict(self._members)

    def owners(self, topic: str) -> tuple[int, ...]:
        """The member owning each partition of ``topic``, in partition order."""
        if topic not in self._owners:
            self.list_topics()
        if topic not in self._owners:
            raise error_for(ErrorCode.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")
        return self._owners[topic]

    def owner_endpoint(self, topic: str, partition: int) -> str:
        """The endpoint of the member owning a partition (this client's own on a single
        node)."""
        owners = self.owners(topic) if self.routed else ()
        if not owners or not 0 <= partition < len(owners):
            return self.endpoint  # the node answers UNKNOWN_PARTITION
        return self.members().get(owners[partition], self.endpoint)

    def _route(self, op: str, fields: dict[str, Any]) -> zmq.Socket[bytes]:
        if op in PARTITION_OPS and "partition" in fields:
            return self._sock(self.owner_endpoint(fields["topic"], fields["partition"]))
        if op in KV_OPS:
            topic = kv_topic(fields["namespace"])
            if topic not in self._owners:
                return self.sock  # not known (yet): the member asked forwards it
            return self._sock(self.owner_endpoint(topic, 0))
        if op in ("create_topic", "delete_topic", "alter_topic", "kv_create", "kv_drop"):
            members = self.members()
            return self._sock(members[min(members)] if members else self.endpoint)
        return self.sock

    def _produce_routed(self, topic: str, recs: list[Record | bytes | str], seq: int
                        ) -> list[tuple[int, int]]:
        """A batch with no partition named, on a cluster: split by key as the node splits
        it, each owner sent its records at once (same producer id and sequence number, so
        each recognises a retry), the answers joined in batch order."""
        owners = self.owners(topic)
        by_member: dict[int, list[int]] = {}
        for i, p in enumerate(self._spread(recs, seq, len(owners))):
            by_member.setdefault(owners[p], []).append(i)
        sent: list[tuple[int, list[int], dict[str, Any], zmq.Socket[bytes], int | None]] = []
        for member, idx in by_member.items():
            fields = {"topic": topic, "producer_id": self.producer_id, "seq": seq,
                      "records": pack_batch([recs[i] for i in idx])}
            sock = self._sock(self.members()[member])
            first = next(self._ids)
            rid: int | None = first
            try:
                sock.send(pack_request("produce", first, fields))
            except zmq.Again:
                rid = None  # sent again, with retries, below
            sent.append((member, idx, fields, sock, rid))
        out: list[tuple[int, int]] = [(0, 0)] * len(recs)
        for _member, idx, fields, sock, rid in sent:
            reply: dict[str, Any] | None = None
            if rid is not None:
                try:
                    with self._one_probe():
                        reply = self._await(rid, sock)
                    check_reply("produce", reply)
                except NodeError as exc:
                    if exc.code not in _RETRYABLE:
                        raise
            if reply is None:
                reply = self._call_on(sock, "produce", fields)
            for i, placed in zip(idx, expand_offsets(reply, len(idx)), strict=True):
                out[i] = placed
        return out

    def _spread(self, recs: Sequence[Record | bytes | str], seq: int, partitions: int) -> list[int]:
        """The partition of each record of a batch with no partition named, as the node
        picks it: its key's, or the batch's round-robin pick (by producer id and sequence
        number, so that a retry lands where the first attempt did)."""
        rr = (self.producer_id + seq) % partitions
        return [rr if not isinstance(rec, Record) or rec.key is None
                else key_partition(rec.key, partitions) for rec in recs]

    # ---- topics -------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, storage: str | None = None,
                     retention_ms: int | None = None, retention_bytes: int | None = None
                     ) -> None:
        """``storage``: "rocksdb" (the default: every acknowledged record durable) or
        "memory" (records kept by the node's front door within ``storage.memory_bytes_max``,
        acknowledged without a log write, gone when the node restarts; the topic stays).
        ``retention_ms`` / ``retention_bytes``: the node deletes records older than that, and
        a partition's oldest past that size, in the background (0 or None: keep them)."""
        fields: dict[str, Any] = {"name": name, "partitions": partitions}
        for field, value in (("storage", storage), ("retention_ms", retention_ms),
                             ("retention_bytes", retention_bytes)):
            if value is not None:
                fields[field] = value
        self.call("create_topic", **fields)
        self._partitions[name] = partitions

    def alter_topic(self, name: str, retention_ms: int | None = None,
                    retention_bytes: int | None = None) -> int:
        """Change a topic's retention (0: no bound); returns the LSN that made it durable.
        The shard writers apply it in the background, within a second or so."""
        fields: dict[str, Any] = {"name": name}
        if retention_ms is not None:
            fields["retention_ms"] = retention_ms
        if retention_bytes is not None:
            fields["retention_bytes"] = retention_bytes
        return int(self.call("alter_topic", **fields)["lsn"])

    def delete_topic(self, name: str) -> None:
        self.call("delete_topic", name=name)
        self._partitions.pop(name, None)

    def list_topics(self) -> list[TopicInfo]:
        if self.routed:  # the catalog member's are the latest
            members = self.members()
            reply = self._any("list_topics", {}, members[min(members)] if members else None)
        else:
            reply = self.call("list_topics")
        topics = [Topic.from_row(row) for row in reply["topics"]]
        self._partitions = {t.name: t.partitions for t in topics}
        self._owners = {t.name: t.owners for t in topics if t.owners}
        # KV namespaces are topics of the catalog too (kv:<name>): ``kv_namespaces`` lists them.
        return [TopicInfo(t.name, t.partitions, t.storage, int(t.settings.get("retention_ms", 0)),
                          int(t.settings.get("retention_bytes", 0)))
                for t in topics if not t.name.startswith(KV_PREFIX)]

    def partitions(self, topic: str) -> int:
        if topic not in self._partitions:
            self.list_topics()
        if topic not in self._partitions:
            raise error_for(ErrorCode.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")
        return self._partitions[topic]

    # ---- producing ----------------------------------------------------------------

    def produce(self, topic: str, value: bytes | str, key: bytes | str | None = None,
                tags: Sequence[str] = (), timestamp: int | None = None,
                partition: int | None = None) -> tuple[int, int]:
        """Write one record; return its (partition, offset) once it is durable."""
        rec = Record(as_bytes(value), None if key is None else as_bytes(key, "a key"),
                     as_tags(tags), timestamp)
        return self.produce_batch(topic, [rec], partition)[0]

    def produce_batch(self, topic: str, records: Iterable[Record | bytes | str],
                      partition: int | None = None, seq: int | None = None
                      ) -> list[tuple[int, int]]:
        """Write many records in one request; their (partition, offset) pairs, in order.
        ``seq`` sends an earlier request again under its sequence number (with the same
        records and partition: a retry the node answers with the first attempt's offsets);
        by default the next one."""
        recs = list(records)
        if not recs:
            raise error_for(ErrorCode.EMPTY_BATCH, "a batch needs at least one record")
        seq = self.next_seq() if seq is None else seq
        if self.routed and partition is None and len(self.owners(topic)) > 1:
            with self.one_thread():
                return self._produce_routed(topic, recs, seq)
        blob = pack_batch(recs)
        fields: dict[str, Any] = {"topic": topic, "producer_id": self.producer_id,
                                  "seq": seq, "records": blob}
        if partition is not None:
            fields["partition"] = partition
        return expand_offsets(self.call("produce", **fields), len(recs))

    # ---- reading ------------------------------------------------------------------

    def read(self, topic: str, partition: int, offset: int, max_records: int = 1000) -> list[Record]:
        """Up to ``max_records`` records from ``offset`` on, in offset order. A read may
        stop before them (at ``read_bytes_max``, or where the node's cache of recent records
        ends): read on from the last offset + 1, up to ``end_offsets``."""
        reply = self.call("read", topic=topic, partition=partition, offset=offset,
                          max_records=max_records)
        return unpack_read(reply["records"])

    def end_offsets(self, topic: str) -> list[int]:
        """The next offset of each partition, in partition order: every record below it is
        durable, and reads sent after this call see it."""
        return [int(o) for o in self.call("end_offsets", topic=topic)["offsets"]]

    def key_partition(self, topic: str, key: bytes | str) -> int:
        """The partition ``produce`` sends a key to when no partition is named."""
        return key_partition(as_bytes(key, "a key"), self.partitions(topic))

    def read_by_key(self, topic: str, key: bytes | str, partition: int | None = None) -> Record | None:
        """The latest record with ``key``: in the key's own partition unless one is named."""
        rows = unpack_read(self.call("read_by_key", **self._by_key(topic, key, partition))
                           ["records"])
        return rows[0] if rows else None

    def delete_by_key(self, topic: str, key: bytes | str, partition: int | None = None) -> int:
        """Delete the latest record with ``key`` (the one ``read_by_key`` answers), in the
        key's own partition unless one is named; returns the LSN that made it durable.
        Older records with the key stay (``delete_by_offset`` deletes any one)."""
        return int(self.call("delete_by_key", **self._by_key(topic, key, partition))["lsn"])

    def _by_key(self, topic: str, key: bytes | str, partition: int | None) -> dict[str, Any]:
        """The fields of a request by key. Unless a partition is named, a single node finds
        the key's own (this client's count of the topic's partitions may be of a topic
        deleted and made again since); a client of a cluster names it, to send the request
        to its owner."""
        fields: dict[str, Any] = {"topic": topic, "key": as_bytes(key, "a key")}
        if partition is not None:
            fields["partition"] = partition
        elif self.routed:
            fields["partition"] = self.key_partition(topic, key)
        return fields

    def delete_by_offset(self, topic: str, partition: int, offset: int) -> int:
        """Delete the record at ``offset``; the offsets of the others do not move."""
        return int(self.call("delete_by_offset", topic=topic, partition=partition,
                             offset=offset)["lsn"])

    def read_by_tag(self, topic: str, partition: int, tag: str, offset: int | None = None,
                    max_records: int = 1000) -> list[Record]:
        """Records carrying ``tag``, in offset order, from ``offset`` on; by default from
        the oldest kept. An ``offset`` below what retention or deletes left raises
        ``OffsetOutOfRange`` (with ``.earliest``), as ``read`` does."""
        fields = {"topic": topic, "partition": partition, "tag": tag,
                  "max_records": max_records}
        try:
            reply = self.call("read_by_tag", offset=offset or 0, **fields)
        except OffsetOutOfRange as exc:
            if offset is not None:
                raise
            # From the oldest kept, which the node named.
            reply = self.call("read_by_tag", offset=exc.earliest, **fields)
        return unpack_read(reply["records"])

    def offset_for_timestamp(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The first offset whose record's timestamp (ms) is at or after ``timestamp``."""
        value = self.call("offset_for_timestamp", topic=topic, partition=partition,
                          timestamp=timestamp)["value"]
        return None if value is None else int(value)

    # ---- consumer groups ----------------------------------------------------------

    def commit_offset(self, group: str, topic: str, partition: int, offset: int) -> None:
        self.call("commit_offset", group=group, topic=topic, partition=partition, offset=offset)

    def committed_offset(self, group: str, topic: str, partition: int) -> int | None:
        value = self.call("committed_offset", group=group, topic=topic, partition=partition)["value"]
        return None if value is None else int(value)

    # ---- key/value (a namespace's keys in its own shard; actors/kv_state.py) -------

    def kv_create(self, namespace: str) -> None:
        """Create a namespace (a first write to one creates it too)."""
        self.call("kv_create", namespace=namespace)

    def kv_drop(self, namespace: str) -> None:
        """Delete a namespace and every key in it."""
        self.call("kv_drop", namespace=namespace)

    def kv_namespaces(self) -> list[str]:
        self.list_topics()
        return sorted(name.removeprefix(KV_PREFIX) for name in self._partitions
                      if name.startswith(KV_PREFIX))

    def _kv_write(self, op: str, namespace: str, key: bytes | str,
                  **fields: Any) -> dict[str, Any]:
        # The producer id and a sequence number: a retry after a lost answer is answered
        # as the first attempt was, not logged again.
        return self.call(op, namespace=namespace, key=as_bytes(key, "a key"), **fields,
                         producer_id=self.producer_id, seq=self.next_seq())

    def kv_put(self, namespace: str, key: bytes | str, value: bytes | str) -> int:
        """Set a key; returns the LSN that made it durable. A get sent after it sees it."""
        return int(self._kv_write("kv_put", namespace, key, value=as_bytes(value))["lsn"])

    def kv_get(self, namespace: str, key: bytes | str) -> bytes | None:
        key_bytes = as_bytes(key, "a key")
        value: bytes | None = self.call("kv_get", namespace=namespace, key=key_bytes)["value"]
        return value

    def kv_delete(self, namespace: str, key: bytes | str) -> int:
        """Delete a key (if it is there); returns the LSN that made it durable."""
        return int(self._kv_write("kv_delete", namespace, key)["lsn"])

    def kv_scan(self, namespace: str, prefix: bytes | str = b"",
                start_after: bytes | str | None = None, limit: int = 1000
                ) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` pairs in key order, of keys starting with ``prefix``, after
        ``start_after``; asked for a page at a time (the node bounds each by
        ``read_records_max`` and ``read_bytes_max``)."""
        out: list[tuple[bytes, bytes]] = []
        after = None if start_after is None else as_bytes(start_after)
        while len(out) < limit:
            fields: dict[str, Any] = {"namespace": namespace, "prefix": as_bytes(prefix)}
            if after is not None:
                fields["start_after"] = after
            fields["limit"] = limit - len(out)
            reply = self.call("kv_scan", **fields)
            pairs = msgpack.unpackb(reply["pairs"], raw=False)
            out += [(k, v) for k, v in pairs]
            if not reply["more"] or not pairs:
                break
            after = out[-1][0]
        return out

    def kv_cas(self, namespace: str, key: bytes | str, expected: bytes | str | None,
               new: bytes | str | None) -> bool:
        """Set ``key`` to ``new`` (None: delete it) only if its value is ``expected``
        (None: absent); True if it did. Linearizable. Not retried: after a lost answer
        (``RequestTimeout``) the outcome is unknown, so read the key."""
        reply = self.call("kv_cas", namespace=namespace, key=as_bytes(key, "a key"),
                          expected=None if expected is None else as_bytes(expected),
                          new=None if new is None else as_bytes(new))
        return bool(reply["swapped"])

    # ---- the node -----------------------------------------------------------------

    def checkpoint(self) -> int:
        """Run a checkpoint now; returns the LSN up to which the shards are durable."""
        return int(self.call("checkpoint")["lsn"])

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.call("status")["status"]
        return status

    def stats(self) -> dict[str, list[dict[str, Any]]]:
        """RocksDB's figures of the shards on the node asked (in a cluster, that member's):
        ``shards`` and ``writers``, each row a dict with the names of ``wire.protocol``'s
        ``SHARD_STATS_ROW`` and ``WRITER_STATS_ROW``."""
        reply = self.call("stats")
        return {"shards": [dict(zip(SHARD_STATS_ROW, r, strict=True)) for r in reply["shards"]],
                "writers": [dict(zip(WRITER_STATS_ROW, r, strict=True))
                            for r in reply["writers"]]}

    def compact(self, topic: str) -> list[tuple[str, int, int, int]]:
        """Compact every shard of ``topic`` on the node asked (in a cluster, the ones that
        member owns); returns ``(topic, partition, bytes_before, bytes_after)`` of each.
        It takes as long as RocksDB takes: give the client a long ``timeout_ms``."""
        rows = self.call("compact", topic=topic)["shards"]
        return [(t, p, before, after) for t, p, before, after in rows]

    def snapshot_export(self, directory: str) -> dict[str, int]:
        """A point-in-time copy of the node asked (in a cluster, of that member) into
        ``directory`` (absolute; absent or empty): ``lsn``, ``shards``, ``bytes`` and
        ``elapsed_ms``. It takes as long as copying takes: give the client a long
        ``timeout_ms``. ``shardnode start --from-snapshot`` starts a node from it."""
        reply = self.call("snapshot_export", dir=directory)
        return {k: int(reply[k]) for k in ("lsn", "shards", "bytes", "elapsed_ms")}

    def pipeline(self, in_flight_max: int = PIPELINE_IN_FLIGHT_MAX) -> Pipeline:
        return Pipeline(self, in_flight_max)

    # ---- transactions (node/transaction.py) ---------------------------------------

    def transaction(self, timeout_ms: int | None = None) -> Transaction:
        """Begin a local transaction; use it as a context manager (commit on leaving the
        block, roll back on an exception), or call ``commit()`` / ``abort()``. The node
        rolls it back if it is still open after ``timeout_ms`` (default: ``[txn]``).

        Nothing is sent yet: the client picks the transaction's id, and its begin goes
        with its first writes (node/transaction.py)."""
        fields: dict[str, Any] = {"txn": random.getrandbits(62) + 1, "owner": self.producer_id}
        if timeout_ms is not None:
            # Checked here too: a transaction sent whole (``txn_once``) is never open, and
            # the node would not see it (the most it takes is [txn] timeout_ms_max).
            if type(timeout_ms) is not int or timeout_ms < 1:
                raise ValueError(f"timeout_ms must be a whole number of ms, at least 1, not "
                                 f"{timeout_ms!r}")
            fields["timeout_ms"] = timeout_ms
        tx = Transaction(self, fields["txn"], begin=("txn_begin", fields))
        self._local.add(tx)
        return tx

    def xa_start(self, xid: Xid, timeout_ms: int | None = None, member: int | None = None
                 ) -> Transaction:
        """Begin an XA branch (answered before it returns); stage work through the returned
        transaction, then ``xa_end``, ``xa_prepare`` and ``xa_commit`` (or ``xa_rollback``).
        On a client of a cluster the branch lives on ``member`` (an id of ``members()``;
        default: the first endpoint's), and its writes must stay on that member."""
        check_xid(list(xid))
        open_here = self._branches.get(xid)
        if open_here is not None and not open_here.finished:
            raise XAERDupid(f"xid {xid} is a branch this client began and has not finished")
        sock = None
        if member is not None:
            members = self.members() if self.routed else {}
            if member not in members:
                raise ValueError(f"member {member} is not one of this client's cluster "
                                 f"({sorted(members) or 'a single node'})")
            sock = self._sock(members[member])
        for attempt in range(XA_START_ATTEMPTS):
            fields: dict[str, Any] = {"xid": list(xid), "txn": random.getrandbits(62) + 1,
                                      "owner": self.producer_id}
            if timeout_ms is not None:
                fields["timeout_ms"] = timeout_ms
            tx = Transaction(self, fields["txn"], xid, begin=("xa_start", fields), sock=sock)
            try:
                tx.settle()
            except XARBRollback:
                # Begun, its answer lost, and rolled back by a restart of the node before
                # this call was answered: nothing was done in it; begin it again.
                if attempt + 1 == XA_START_ATTEMPTS:
                    raise
                continue
            self._branches[xid] = tx
            return tx
        raise AssertionError("unreachable")

    def xa_end(self, xid: Xid) -> None:
        """End the branch's work: its writes are all answered first, and the node checks it
        staged every one."""
        tx = self._branches.get(xid)
        if tx is None:
            self._xa_call("xa_end", xid, {"owner": self.producer_id})
            return
        tx.settle()
        self._xa_call("xa_end", xid, {"writes": tx.seq, "owner": self.producer_id})

    def xa_prepare(self, xid: Xid) -> int:
        """Phase one: the branch is durable and in doubt; returns the Prepare record's LSN."""
        return int(self._xa_call("xa_prepare", xid, {})["lsn"])

    def xa_commit(self, xid: Xid, one_phase: bool = False) -> TxnResult:
        result = result_of(self._xa_call("xa_commit", xid,
                                         {"one_phase": True} if one_phase else {}))
        self._finished(xid)
        return result

    def xa_rollback(self, xid: Xid) -> None:
        self._xa_call("xa_rollback", xid, {})
        self._finished(xid)

    def _xa_call(self, op: str, xid: Xid, fields: dict[str, Any]) -> dict[str, Any]:
        """An XA call by xid, on the node the branch lives on: the one this client began it
        on; on a cluster, for a branch begun elsewhere (a coordinator that restarted), each
        member in turn until one knows it."""
        fields = {"xid": list(xid), **fields}
        self.settle_transactions()
        tx = self._branches.get(xid)
        if tx is not None or not self.routed:
            return self._call_on(tx._socket() if tx is not None else self.sock, op, fields)
        return self._on_the_member_that_knows(op, fields, XAERNota, f"xid {xid}")

    def _on_the_member_that_knows(self, op: str, fields: dict[str, Any],
                                  unknown_type: type[NodeError], what: str) -> dict[str, Any]:
        """``op`` asked of each member in turn until one answers other than
        ``unknown_type`` (it does not know ``what``). One that does not answer may hold it:
        then the call fails ``Unavailable`` saying so, never ``unknown_type``."""
        unknown: NodeError | None = None
        unreachable: NodeError | None = None
        for endpoint in self._every_member():
            try:
                return self._call_on(self._sock(endpoint), op, fields)
            except (Unavailable, RequestTimeout) as exc:
                unreachable = exc
            except NodeError as exc:
                if not isinstance(exc, unknown_type):
                    raise
                unknown = exc
        if unreachable is not None:
            raise Unavailable(f"{what} was not found on the members that answered, and "
                              f"one did not: {unreachable.message}")
        assert unknown is not None
        raise unknown

    def _every_member(self) -> list[str]:
        """The endpoints of every member of the cluster, the catalog member's first."""
        members = self.members()
        return [members[m] for m in sorted(members)] or [self.endpoint]

    def _finished(self, xid: Xid) -> None:
        tx = self._branches.pop(xid, None)
        if tx is not None:
            tx.finished = True

    def xa_recover(self) -> list[Xid]:
        """The prepared branches, in doubt until committed or rolled back (on a cluster,
        of every member)."""
        return [Xid(*row) for reply in self._on_every_member("xa_recover")
                for row in reply["xids"]]

    def txn_abort(self, txn: int) -> None:
        """Roll back the local transaction ``txn`` by its id (as ``shardnode txn rollback``
        does, for an operator; its own client has ``Transaction.abort``). On a cluster, on
        the member that knows it."""
        if not self.routed:
            self.call("txn_abort", txn=txn)
            return
        self.settle_transactions()
        self._on_the_member_that_knows("txn_abort", {"txn": txn}, UnknownTransaction,
                                       f"transaction {txn}")

    def txn_list(self) -> list[TxnInfo]:
        """The open and prepared transactions (on a cluster, of every member, each with
        its member's id)."""
        if not self.routed:
            return [TxnInfo(*row) for row in self.call("txn_list")["txns"]]
        self.settle_transactions()
        members = self.members()
        return [dataclasses.replace(TxnInfo(*row), member=m) for m in sorted(members)
                for row in self._call_on(self._sock(members[m]), "txn_list", {})["txns"]]

    def _on_every_member(self, op: str) -> list[dict[str, Any]]:
        if not self.routed:
            return [self.call(op)]
        self.settle_transactions()
        return [self._call_on(self._sock(e), op, {}) for e in self._every_member()]


__all__ += ["Busy", "Unavailable"]
