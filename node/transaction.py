"""The client's side of transactions: ``Transaction``, what ``NodeClient.transaction()`` and
``NodeClient.xa_start()`` return.

    with c.transaction(timeout_ms=60_000) as tx:    # commits on leaving the block,
        tx.produce("out", b"v", key=b"k")            # rolls back on an exception
        tx.produce_batch("out", values, partition=1)
        tx.commit_offset("billing", "in", partition, next_offset)
    tx.result.offsets                                # per produce call: [(partition, offset)]

Each write is sent as it is made, pipelined (a large transaction does not sit in the
client, and a small one takes one round trip: begin, writes and commit in one frame), and
is staged by the node: logged, invisible, without offsets until the commit, which gives
every record its offset (contiguous per partition) and returns them. Writes are numbered,
so a write sent again after a lost answer is not staged twice; a commit retried answers
the same; and the commit names how many writes were sent, so none can go missing.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

import zmq

from actors.roles import key_partition
from wire.errors import (
    ErrorCode,
    NodeError,
    RequestTimeout,
    TransactionError,
    Unavailable,
    UnknownTopic,
    UnknownTransaction,
    XAERNota,
    error_for,
)
from wire.placement import place
from wire.protocol import (
    KV_PREFIX,
    TXN_ONCE_OPS,
    TXN_ONCE_WRITES_MAX,
    kv_topic,
    pack_request,
    unpack_replies,
)
from wire.records import Record, as_bytes, as_tags, pack_batch
from wire.xid import Xid

if TYPE_CHECKING:
    from node.client import NodeClient


class TxnPart(NamedTuple):
    """Where a committed transaction's records landed in one partition."""

    topic: str
    partition: int
    first_offset: int
    record_count: int


@dataclass(frozen=True, slots=True)
class TxnResult:
    """A commit's outcome: its LSN, the partitions' offsets, and each produce call's records'
    ``(partition, offset)`` in the order they were given."""

    lsn: int
    parts: list[TxnPart]
    offsets: list[list[tuple[int, int]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TxnInfo:
    """A row of ``NodeClient.txn_list()`` (``shardnode txn list``)."""

    txn: int
    xid: str  # printed, as ``shardnode txn commit`` takes it; "" for a local transaction
    state: str
    age_ms: int
    records: int
    bytes: int
    partitions: int
    member: int = 0  # the cluster member it lives on (0: a single node)


# A transaction's requests are pipelined: queued, sent several to a frame, and answered in
# the background, so that begin, the writes and the commit of a small transaction take one
# round trip. These bound what one transaction holds in the client.
QUEUED_MAX = 64  # requests queued before they are sent as one frame
QUEUED_BYTES_MAX = 1 << 20  # request bytes queued before they are sent
IN_FLIGHT_MAX = 128  # requests sent and not answered; beyond it the client waits for answers

Pending = tuple[str, dict[str, Any]]  # a request: its op and fields
# A commit refused with these, after some of the transaction's requests failed, is sent again
# after them: its begin never arrived (UNKNOWN), or a write went missing (STATE, PROTO).
RESEND_AFTER = (ErrorCode.TXN_UNKNOWN, ErrorCode.TXN_STATE, ErrorCode.XAER_NOTA,
                ErrorCode.XAER_PROTO)


class Transaction:
    """A transaction on the node, local or an XA branch. Not thread-safe.

    Its requests are pipelined: ``produce``, ``produce_batch`` and ``commit_offset`` queue
    theirs and return at once (sending a frame when enough are queued), and their answers
    are read as they come. A request the node refused is raised by the call that finds it
    (a later write, ``commit``, ``NodeClient.xa_end``); one it could not take (BUSY, a
    timeout) is sent again, in order, with the same write number, which the node answers
    without staging it twice. The commit names how many writes were sent, so the node
    refuses a commit that lacks one."""

    def __init__(self, client: NodeClient, txn: int, xid: Xid | None = None,
                 begin: Pending | None = None, sock: zmq.Socket[bytes] | None = None) -> None:
        self.client = client
        self.id = txn
        self.xid = xid
        # The socket of the node it lives on. A client of a cluster picks the member that
        # owns its first write's partition (``_pin``), else its first endpoint's at the
        # first send: a transaction stays on one member.
        self.sock = sock
        self.seq = 0  # writes sent
        self.finished = False
        self.result: TxnResult | None = None
        self._queue: list[tuple[int, str, dict[str, Any], bytes]] = []
        self._queued_bytes = 0
        self._in_flight: dict[int, Pending] = {}
        self._failed: dict[int, tuple[str, dict[str, Any], NodeError]] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._produces: list[tuple[int, str]] = []  # each produce call: its request id, topic
        self._commit_rid: int | None = None
        self._once_rids: list[int] = []  # sent as one txn_once: its produce writes' ids
        self._begun = begin is None  # the node has the transaction (or it was begun apart)
        self.in_flight_max = IN_FLIGHT_MAX  # a caller may bound it lower (the Spark sink)
        if begin is not None:
            self._submit(*begin)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.finished or self.xid is not None:
            return  # an XA branch is its coordinator's to finish
        if kind is not None:
            self.abort()
            return
        try:
            self.commit()
        except (RequestTimeout, Unavailable):
            raise  # the node is not answering: its timeout rolls the transaction back
        except Exception:  # (not Ctrl-C: a rollback would wait for its answer)
            # A write it refused (an unknown topic, a value over a limit) or a commit it
            # refused: the node may hold the transaction open, with what it staged, until
            # its timeout. Rolled back now, as the block promises; the commit's error is
            # the one raised. A conflict is final here (``settle``), but one whose
            # compare-and-sets a restarted front door lost leaves it open: rolled back too
            # (a rollback of one rolled back already is answered the same).
            with contextlib.suppress(NodeError, zmq.ZMQError):
                if self.finished:
                    self._call("txn_abort", {"txn": self.id})
                else:
                    self.abort()
            raise

    def _check(self) -> None:
        if self.finished:
            raise TransactionError(f"transaction {self.id} is finished", ErrorCode.TXN_STATE)

    # ---- writes -----------------------------------------------------------------------

    def produce(self, topic: str, value: bytes | str, key: bytes | str | None = None,
                tags: Sequence[str] = (), timestamp: int | None = None,
                partition: int | None = None) -> None:
        """Stage one record (it gets its offset at the commit)."""
        rec = Record(as_bytes(value), None if key is None else as_bytes(key, "a key"),
                     as_tags(tags), timestamp)
        self.produce_batch(topic, [rec], partition)

    def _pin(self, topic: str, partition: int | None, first: Record | bytes | str | None = None
             ) -> None:
        """On a client of a cluster, before anything is sent: live on the member owning
        ``partition`` of ``topic`` (or the partition of ``first``'s key)."""
        c = self.client
        if self.sock is not None or not c.routed:
            return
        if partition is None and not (isinstance(first, Record) and first.key is not None):
            return
        try:
            owners = c.owners(topic)
        except UnknownTopic:
            if topic.startswith(KV_PREFIX):  # a namespace its first write creates, where
                members = c.members()      # the catalog member will place it
                self.sock = c._sock(members[place(topic, 1, members)[0]])
            return
        if partition is None:
            assert isinstance(first, Record) and first.key is not None
            partition = key_partition(first.key, len(owners))
        self.sock = c._sock(c.owner_endpoint(topic, partition))

    def unheard(self) -> bool:
        """Whether the node has heard nothing of this transaction: only its begin waits
        here, unsent (and so it is not yet tied to a member)."""
        return not self._begun and not self._in_flight and len(self._queue) == 1

    def _socket(self) -> zmq.Socket[bytes]:
        if self.sock is None:
            self.sock = self.client.sock
        return self.sock

    def _call(self, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        """One request, answered before it returns, to the node this transaction is on."""
        self.client.settle_transactions()
        return self.client._call_on(self._socket(), op, fields)

    def produce_batch(self, topic: str, records: Iterable[Record | bytes | str],
                      partition: int | None = None) -> None:
        """Stage a batch of records (they get their offsets at the commit)."""
        recs = list(records)
        if not recs:
            raise error_for(ErrorCode.EMPTY_BATCH, "a batch needs at least one record")
        self._pin(topic, partition, recs[0])
        self.produce_packed(topic, pack_batch(recs), partition)

    def produce_packed(self, topic: str, blob: bytes, partition: int | None = None) -> None:
        """Stage records already packed as ``wire/records.py`` lays a batch out (the Spark
        sink packs a column at a time)."""
        self._check()
        self._pin(topic, partition)
        fields: dict[str, Any] = {"txn": self.id, "seq": self.seq, "topic": topic,
                                  "records": blob}
        if partition is not None:
            fields["partition"] = partition
        self.seq += 1
        self._produces.append((self._submit("txn_produce", fields), topic))

    def commit_offset(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Stage a consumer group's offset: committed together with the records."""
        self._check()
        self._pin(topic, partition)
        self._submit("txn_commit_offset", {"txn": self.id, "seq": self.seq, "group": group,
                                           "topic": topic, "partition": partition,
                                           "offset": offset})
        self.seq += 1

    def kv_put(self, namespace: str, key: bytes | str, value: bytes | str) -> None:
        """Stage a key's new value: visible at the commit, with the rest (the namespace is
        created if it is new)."""
        self._kv(namespace, key, as_bytes(value))

    def kv_delete(self, namespace: str, key: bytes | str) -> None:
        """Stage a key's deletion: done at the commit, with the rest."""
        self._kv(namespace, key, None)

    def kv_cas(self, namespace: str, key: bytes | str, expected: bytes | str | None,
               new: bytes | str | None) -> None:
        """Stage ``key`` := ``new`` (None: delete) on the condition that its value is
        ``expected`` (None: absent) at the commit. The node checks every condition of the
        transaction when it commits, atomically with it: if one does not hold, the commit
        raises ``TransactionConflict`` and nothing of the transaction is visible. Local
        transactions only: in an XA branch it raises ``BadRequest`` at once (the node
        refuses it, and the refusal came at ``xa_end``)."""
        if self.xid is not None:
            raise error_for(ErrorCode.BAD_REQUEST, "a compare-and-set in a transaction needs "
                            "a local transaction (an XA branch's commit is its coordinator's)")
        self._kv(namespace, key, None if new is None else as_bytes(new),
                 expected=(None if expected is None else as_bytes(expected),))

    def _kv(self, namespace: str, key: bytes | str, value: bytes | None,
            expected: tuple[bytes | None] | None = None) -> None:
        self._check()
        self._pin(kv_topic(namespace), 0)
        fields: dict[str, Any] = {"txn": self.id, "seq": self.seq, "namespace": namespace,
                                  "key": as_bytes(key, "a key"), "value": value}
        if expected is not None:
            fields["expected"] = expected[0]
        self._submit("txn_kv", fields)
        self.seq += 1

    # ---- the end ----------------------------------------------------------------------

    def commit(self) -> TxnResult:
        """Commit: every staged record becomes visible at once, at the offsets returned.
        Returns once the commit is durable. (For an XA branch: one phase, after ``end``.)"""
        if self.result is not None:
            return self.result
        self._check()
        rid = self._commit_rid
        if rid is None and self._whole():
            rid = self._commit_rid = self._once()
        elif rid is None:  # else a commit sent before, whose answer did not come: again
            if self.xid is None:
                rid = self._submit("txn_commit", {"txn": self.id, "writes": self.seq,
                                                  "owner": self.client.producer_id})
            else:
                rid = self._submit("xa_commit", {"xid": list(self.xid), "one_phase": True})
            self._commit_rid = rid
        self.settle()
        self.finished = True
        reply = self._replies[rid]
        for write_rid, (parts, assign) in zip(self._once_rids, reply.get("produced", ()),
                                              strict=True):
            self._replies[write_rid] = {"parts": parts, "assign": assign}
        self.result = self._result(reply)
        return self.result

    def _whole(self) -> bool:
        """Whether the whole transaction is still queued here (its begin too) and may go as
        one ``txn_once`` request: a local one, of produce and offset writes only."""
        return (self.xid is None and not self._begun and not self._in_flight
                and not self._failed and 1 < len(self._queue) <= TXN_ONCE_WRITES_MAX + 1
                and all(op in TXN_ONCE_OPS for _rid, op, _f, _b in self._queue[1:]))

    def _once(self) -> int:
        """Send the queued begin and writes as one ``txn_once`` request; its answer stands
        for theirs (each produce's ``parts`` and ``assign``). Returns its request id."""
        _begin, *writes = self._queue
        self._queue.clear()
        self._queued_bytes = 0
        fields: dict[str, Any] = {
            "txn": self.id,
            "writes": [{"op": op, **{k: v for k, v in f.items() if k not in ("txn", "seq")}}
                       for _rid, op, f, _frame in writes]}
        rid = self._submit("txn_once", fields)
        self._once_rids = [r for r, op, _f, _frame in writes if op == "txn_produce"]
        return rid

    def abort(self) -> None:
        """Roll back: nothing staged is ever visible, and no offsets are taken."""
        if self.finished:
            return
        self.finished = True
        if not self._begun and not self._in_flight:
            self._queue.clear()  # the node never heard of it
            self.client._unsettled.discard(self)
            return
        self._send()
        self._collect(0)
        self._failed.clear()  # what failed is rolled back with the rest
        self.client._unsettled.discard(self)
        try:
            if self.xid is None:
                self._call("txn_abort", {"txn": self.id})
            else:
                self._call("xa_rollback", {"xid": list(self.xid)})
        except (UnknownTransaction, XAERNota):
            pass  # its begin never reached the node: nothing to roll back

    def settle(self) -> None:
        """Send what is queued and wait for every answer; send again, in order, what the node
        could not take; raise what it refused."""
        self._send()
        self._collect(0)
        self.client._unsettled.discard(self)
        rid = self._commit_rid
        failed = self._failed.get(rid) if rid is not None else None
        if rid is not None and failed is not None and failed[2].code == ErrorCode.TXN_CONFLICT:
            # Its compare-and-sets did not hold: the node rolled it back. Final.
            del self._failed[rid]
            self.finished = True
            raise failed[2]
        if rid is not None and rid in self._replies and self._failed:
            # The commit was answered: it stands for every write (it counts them), and for
            # the begin. What failed before it (an answer lost, a call that raised and was
            # kept to be sent again) is done: a begin sent again now would be refused as
            # an id in use. A produce's answer is asked again for where its records went.
            for rid in sorted(self._failed):
                op, fields, _err = self._failed.pop(rid)
                if op == "txn_produce":
                    self._replies[rid] = self._call(op, fields)
            return
        if rid in self._failed and len(self._failed) > 1:
            # The commit first: if it went through (its answer, or earlier ones, lost), it
            # answers the same again, and it stands for every write (it counts them).
            op, fields, _err = self._failed[rid]
            try:
                self._replies[rid] = self._call(op, fields)
                del self._failed[rid]
                for rid in sorted(self._failed):
                    op, fields, _err = self._failed.pop(rid)
                    if op == "txn_produce":  # its answer says where its records went
                        self._replies[rid] = self._call(op, fields)
                return
            except NodeError as exc:
                if exc.code not in RESEND_AFTER:
                    raise  # rolled back, timed out, ...: what came before cannot help
        for rid in sorted(self._failed):  # in the order they were made
            op, fields, _err = self._failed[rid]
            self._replies[rid] = self._call(op, fields)  # raises a refusal
            del self._failed[rid]  # (one that raised stays, to be sent again next time)

    # ---- the pipeline -----------------------------------------------------------------

    def _submit(self, op: str, fields: dict[str, Any]) -> int:
        rid = next(self.client._ids)
        frame = pack_request(op, rid, fields)
        if self._queue and self._queued_bytes + len(frame) > QUEUED_BYTES_MAX:
            self._send()
        self._queue.append((rid, op, fields, frame))
        self._queued_bytes += len(frame)
        self.client._unsettled.add(self)
        if len(self._queue) >= QUEUED_MAX:
            self._send()
        return rid

    def _send(self) -> None:
        if not self._queue:
            return
        with self.client.one_thread():
            self._send_queue()

    def _send_queue(self) -> None:
        if len(self._in_flight) + len(self._queue) > self.in_flight_max:
            self._collect(self.in_flight_max // 2)
        try:
            self._socket().send(b"".join(frame for _rid, _op, _fields, frame in self._queue))
        except zmq.Again:  # not connected within the client's timeout: sent again by settle
            lost = self.client.not_connected(self._socket())
            for rid, op, fields, _frame in self._queue:
                self._failed[rid] = (op, fields, lost)
            self._queue.clear()
            self._queued_bytes = 0
            return
        waiters = self.client._waiters
        for rid, op, fields, _frame in self._queue:
            self._in_flight[rid] = (op, fields)
            waiters[rid] = self
        self._begun = True
        self._queue.clear()
        self._queued_bytes = 0

    def _collect(self, until: int) -> None:
        """Read answers until at most ``until`` requests are in flight."""
        with self.client.one_thread():
            self._collect_until(until)

    def _collect_until(self, until: int) -> None:
        sock = self._socket()
        deadline = time.monotonic() + self.client.timeout_ms / 1000
        while len(self._in_flight) > until:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                for rid, (op, fields) in self._in_flight.items():
                    self._failed[rid] = (op, fields, RequestTimeout("no answer in time"))
                    self.client._waiters.pop(rid, None)
                self._in_flight.clear()
                return
            for reply in unpack_replies(sock.recv()):
                got = reply.get("id")
                if type(got) is int and got in self._in_flight:
                    del self.client._waiters[got]
                    self.take(got, reply)
                else:  # another transaction's, a pipeline's, or a late answer
                    self.client.hand_over(reply)

    def take(self, rid: int, reply: dict[str, Any]) -> None:
        """The answer to one of this transaction's requests in flight (read here, or by
        another reader of the socket: ``NodeClient.hand_over``)."""
        pending = self._in_flight.pop(rid, None)
        if pending is None:
            return
        if reply.get("ok"):
            self._replies[rid] = reply
        else:
            self._failed[rid] = (*pending, error_for(reply.get("code", 0), reply.get("error", "")))

    def _result(self, reply: dict[str, Any]) -> TxnResult:
        parts = [TxnPart(*row) for row in reply["parts"]]
        nxt = {(p.topic, p.partition): p.first_offset for p in parts}
        offsets: list[list[tuple[int, int]]] = []
        for rid, topic in self._produces:
            placed = self._replies[rid]
            assign = placed.get("assign")
            if assign is None:  # one partition: its offsets in a row, built at C speed
                ((p, n),) = placed["parts"]
                off = nxt.get((topic, p), -1)
                if off < 0:
                    offsets.append([(p, -1)] * n)
                else:
                    offsets.append(list(zip(itertools.repeat(p, n), range(off, off + n), strict=True)))
                    nxt[(topic, p)] = off + n
                continue
            mine = []
            for p in assign:
                off = nxt.get((topic, p), -1)  # -1: the topic was deleted before the commit
                mine.append((p, off))
                if off >= 0:
                    nxt[(topic, p)] = off + 1
            offsets.append(mine)
        return TxnResult(int(reply["lsn"]), parts, offsets)


def result_of(reply: dict[str, Any]) -> TxnResult:
    """A commit's outcome from its reply, without per-call offsets (an XA commit by xid)."""
    return TxnResult(int(reply["lsn"]), [TxnPart(*row) for row in reply["parts"]])
