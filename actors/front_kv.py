"""The front door's key/value requests, with no I/O: the ``kv_*`` ops, reads by key from its
cache, and transactions' compare-and-sets, decided at their commit.

``actors/kv_state.py`` decides: what a key's value is, which write of a key goes next, when
a compare-and-set matches. ``KvDoor`` carries its steps out with the front door's waits
(``FrontDoorState``, ``actors/front_state.py``, which owns this part and routes the ops
here): a write becomes a ``Produce`` answered by its acknowledgement, a read or a load of a
key a request to the namespace's shard writer, and answers go back to ``KvState``. It also
remembers what the cache must not serve while a commit is in flight: the transactions
begun here and the namespaces they write (``track_txn``), and each transaction's
compare-and-sets, checked one commit at a time (``conditional_commit``).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, assert_never

import msgpack

from actors.cluster_state import PARKED_MAX
from actors.instructions import Produce, Reply, Request
from actors.kv_state import Generation, KeyOp, KvState, Load, Refused, Send, Step
from actors.roles import TRANSACTION_MANAGER
from config import NodeConfig
from wire import protocol
from wire.errors import CONFLICT_TEXT, ErrorCode, NodeError
from wire.messages import (
    Answer,
    CreateTopic,
    DeleteTopic,
    ErrorReply,
    KvGet,
    KvScan,
    PlacedRow,
    ReadByKey,
    RecordsReply,
    TxnAsk,
    TxnCommitted,
    TxnStep,
    TxnWrite,
)
from wire.packer import pack
from wire.placement import place
from wire.protocol import Topic, kv_topic

if TYPE_CHECKING:
    from actors.front_state import Failure, Fields, FrontDoorState, Out, Target, Then, Waiting

# Key/value ops (a namespace is the one-partition topic ``kv_topic(namespace)``): in a
# cluster, the namespace's owner answers them; ``KV_CREATING_OPS`` create it when it is new.
KV_OPS = frozenset({"kv_put", "kv_get", "kv_delete", "kv_scan", "kv_cas"})
KV_CREATING_OPS = frozenset({"kv_put", "kv_cas", "txn_kv"})
# Commits: a namespace they may change is not answered from the cache meanwhile.
COMMIT_OPS = frozenset({"txn_commit", "xa_commit"})
TXN_TRACKED_OPS = COMMIT_OPS | {"txn_begin", "xa_start", "txn_abort", "xa_rollback"}
# Transactions begun here whose KV namespaces the front door knows, and as many xids of XA
# branches begun here; and transactions holding compare-and-sets.
TXNS_REMEMBERED_MAX = 65536
# What transactions' compare-and-sets hold here (their conditions, until their commit is
# decided or they end), in bytes: each condition's key and expected value, and
# COND_OVERHEAD_BYTES (its tuple, list slot and bytes objects' headers; an estimate). Past
# it a compare-and-set is refused TXN_LIMIT before it is staged. At least twice
# limits.value_bytes_max, so that a condition on the largest value always fits.
CONDS_BYTES_MAX = 32 * 1024 * 1024
COND_OVERHEAD_BYTES = 200
# A checked commit whose wait expired: its outcome is asked of the transaction manager this
# long after, and again this long after each answer that did not tell it (``LateCommit``).
LATE_COMMIT_ASK_MS = 1000
# Answers that do not say a transaction's write or begin was refused: it may have been
# taken all the same.
NOT_REFUSED = (ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL)
# Answers to the question about a late commit that do not tell its outcome: asked again.
ASK_AGAIN = (*NOT_REFUSED, ErrorCode.BUSY)
# Refusals of a checked commit that leave its transaction open (the transaction manager
# refused it before committing, or reopened it when the log manager could not take it):
# its conditions go back to the transaction, for the client's retry to be checked on them.
LEAVES_OPEN = (ErrorCode.BUSY, ErrorCode.TXN_STATE, ErrorCode.TXN_LIMIT)

KvCond = tuple[int, int, bytes, bytes | None]  # a compare-and-set's txn, topic id, key, expected
Cond = tuple[int, bytes, bytes | None]  # a transaction's compare-and-set: topic id, key, expected
Keys = tuple[tuple[int, bytes], ...]
Decided = tuple[int, list[Cond]]  # a checked commit sent: its transaction and conditions
Parked = tuple[bytes, int, str, dict[str, Any]]  # a client's request: identity, id, op, fields
K = TypeVar("K")


def cond_bytes(key: bytes, expected: bytes | None) -> int:
    """What a compare-and-set's condition counts against CONDS_BYTES_MAX."""
    return len(key) + len(expected or b"") + COND_OVERHEAD_BYTES


def remembered_by(since: dict[K, float], horizon: float) -> list[K]:
    """The keys of ``since`` (oldest first) remembered at ``horizon`` or before."""
    old = []
    for k, t in since.items():
        if t > horizon:
            break
        old.append(k)
    return old


@dataclass(frozen=True, slots=True)
class KvRead:
    """A KV read sent to a shard writer: a client's get or scan, or the front door's own
    load of a value a compare-and-set needs."""

    kind: str  # "get", "scan" or "load"; "rbk": a topic's read_by_key
    tid: int
    key: bytes
    generation: Generation
    limit: int = 0  # a scan's, as the client asked (the writer is asked for one more)
    partition: int = 0  # read_by_key's


class CheckedCommit(NamedTuple):
    """A commit with compare-and-sets, waiting its turn to be decided (``commit_next``)."""

    corr: int
    txn: int
    writes: int  # how many writes its client sent (-1: not said)
    owner: int  # its client's producer id (0: not said)
    conds: list[Cond]  # its compare-and-sets; restored into, so not a tuple


@dataclass(slots=True)
class LateCommit:
    """A checked commit whose wait expired (its client was answered TIMEOUT): it may still
    be applied, late. Until its outcome is known its keys stay held and its namespaces out
    of the cache, as while it was in flight: a write of one of its keys logged before it
    would be overwritten by a commit checked against an older value, and a value cached
    meanwhile would be stale once it is applied. Its conditions stay with it: given back to
    the transaction if it turns out open, let go if it committed or ended. Known from its
    own late answer (``KvDoor.late_answer``), or else from the transaction manager, asked
    on the front door's tick ``LATE_COMMIT_ASK_MS`` after the wait expired (``KvDoor.ask``:
    a question, which changes nothing)."""

    corr: int  # the commit's
    txn: int
    conds: list[Cond]
    keys: Keys  # held
    commit: tuple[int, ...] | None  # the namespaces it may change (None: any)
    ask_at: float  # when to ask the transaction manager next
    asking: int = 0  # the question in flight: its correlation id


class KvDoor:
    """The front door's key/value part: ``door`` is the front door whose waits it uses."""

    def __init__(self, door: FrontDoorState, cfg: NodeConfig) -> None:
        self.door = door
        # The cache and each key's writes (actors/kv_state.py).
        self.state = KvState(cfg.limits.kv_cache_bytes_max)
        self.late: dict[int, KeyOp] = {}  # KV writes sent that timed out: their answers
        self.creating: dict[str, list[Parked]] = {}  # namespaces being created: their requests
        # Transactions begun here (their KV namespaces, maybe none), and XA branches by xid:
        # a commit of one not known may change any namespace. Remembered as the begin is
        # sent (writes sent behind it in the same frame name their namespaces), and when,
        # oldest first; forgotten when the transaction manager refuses the begin
        # (``begin``), when a commit or rollback of it is sent, and ``cond_horizon_s``
        # after the begin (``forget_old``: ended by then, unseen here, or an XA branch
        # prepared, whose commit then counts as one that may change any namespace). At
        # most TXNS_REMEMBERED_MAX of each.
        self.txns: dict[int, set[int]] = {}
        self.txns_since: dict[int, float] = {}
        self.xids: dict[tuple[Any, ...], int] = {}
        self.xids_since: dict[tuple[Any, ...], float] = {}
        self.xa: set[int] = set()  # those of txns that are XA branches: no compare-and-set
        self.gets_cached = 0
        # Transactions' compare-and-sets (txn_kv with `expected`), checked at their commit:
        # the conditions by transaction, and the commits waiting to be decided, one at a time.
        self.conds: dict[int, list[Cond]] = {}
        # When each transaction's first condition was remembered, oldest first. A
        # transaction is rolled back by its timeout, at most txn.timeout_ms_max after its
        # begin: its conditions are forgotten twice that long after the first (a commit
        # then goes unchecked, which the transaction manager refuses), so transactions
        # their clients gave up on do not fill the table for good.
        self.cond_since: dict[int, float] = {}
        self.cond_horizon_s = 2 * cfg.txn.timeout_ms_max / 1000
        self.commits: collections.deque[CheckedCommit] = collections.deque()  # in turn
        # What the conditions in ``conds`` and ``commits`` hold (``cond_bytes``).
        self.cond_bytes = 0
        self.deciding = False  # the first of commits is being decided or committed
        # The checked commit whose wait expired, until its outcome is known (the next is
        # decided once it is let go).
        self.late_commit: LateCommit | None = None
        self.late_asks = 0  # questions about late commits sent (``ask``)
        # The last commit answered here: a read reflecting a later one saw a commit this
        # front door did not send (it restarted meanwhile), so the cache forgets everything.
        self.commit_lsn = 0

    # ---- requests ---------------------------------------------------------------------

    def create(self, req: dict[str, Any]) -> Target:
        ns = req["namespace"]
        protocol.check_name("namespace", ns)
        owners: list[int] = []
        cluster = self.door.cluster
        if cluster is not None:
            owners = list(place(kv_topic(ns), 1, cluster.view.members))
        return self.door.writes_to, lambda c: CreateTopic(c, kv_topic(ns), 1, owners)

    def drop(self, req: dict[str, Any]) -> Target:
        name = kv_topic(req["namespace"])
        self.door.topic(name, kv=True)
        return self.door.writes_to, lambda c: DeleteTopic(c, name)

    def checked(self, op: str, req: dict[str, Any]) -> Topic:
        """The topic of the namespace a KV request (or ``txn_kv``) names, once what can be
        checked without it is: a value over ``value_bytes_max`` and a name no namespace
        could have are refused whether the namespace exists or not (a compare-and-set in
        a new one was answered "not swapped", a put created it). Raises UNKNOWN_TOPIC for
        a namespace not known here."""
        d = self.door
        ns = req["namespace"]
        new = req.get("new") if op == "kv_cas" else req.get("value")
        for name, value in (("value", new), ("expected value", req.get("expected"))):
            if value is not None and len(value) > d.lim.value_bytes_max:
                raise NodeError(f"{name} of {len(value)} bytes; at most "
                                f"{d.lim.value_bytes_max} (limits.value_bytes_max)",
                                ErrorCode.BAD_REQUEST)
        t = d.topics.get(kv_topic(ns))
        if t is None:  # (an existing namespace's name was checked when it was created)
            protocol.check_name("namespace", ns)
            t = d.topic(kv_topic(ns), kv=True)
        return t

    def request(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
                now: float) -> list[Out]:
        d = self.door
        key = req.get("key", b"")
        new = req.get("new") if op == "kv_cas" else req.get("value")
        tid = self.checked(op, req).topic_id
        writer = d.writer_of(tid, 0)
        if op == "kv_get":
            hit, value = self.state.cached(tid, key)
            if hit:
                self.gets_cached += 1
                return [Reply(identity, protocol.ok(rid, value=value))]
            corr = d.wait(identity, rid, now)
            d.pending[corr].kv_read = KvRead("get", tid, key, self.state.read_generation(tid))
            return [Request(writer, corr, KvGet(corr, tid, 0, key, d.lsn_seen))]
        if op == "kv_scan":
            limit = min(req.get("limit", d.lim.read_records_max), d.lim.read_records_max)
            corr = d.wait(identity, rid, now)
            d.pending[corr].kv_read = KvRead("scan", tid, b"", (0, 0, 0), limit)
            return [Request(writer, corr, KvScan(corr, tid, 0, req.get("prefix", b""),
                                                 req.get("start_after"), limit + 1,
                                                 d.lsn_seen))]
        corr = d.wait(identity, rid, now)
        kop = KeyOp(corr, tid, key, new, cas=op == "kv_cas", expected=req.get("expected"),
                    producer=(req.get("producer_id", 0), req.get("seq", 0)))
        d.pending[corr].kv = kop
        return self.steps(self.state.write(kop))

    def read_by_key(self, identity: bytes, rid: int, req: dict[str, Any],
                    now: float) -> list[Out]:
        """``read_by_key`` from the cache when it holds the answer (kept like a KV value,
        dropped when the partition is written: actors/kv_state.py), else from the shard
        writer, whose answer fills it."""
        d = self.door
        tid, p = d.partition(req["topic"], req["partition"])
        key = req["key"]
        settings = d.topics[req["topic"]].settings
        if "retention_ms" in settings or "retention_bytes" in settings:
            # Retention deletes in the background, unseen here: never from the cache.
            corr = d.wait(identity, rid, now)
            return [Request(d.writer_of(tid, p), corr, ReadByKey(corr, tid, p, key,
                                                                  d.lsn_seen))]
        hit, records = self.state.read_cached(tid, p, key)
        if hit:
            self.gets_cached += 1
            return [Reply(identity, protocol.ok(rid, records=records))]
        corr = d.wait(identity, rid, now)
        d.pending[corr].kv_read = KvRead("rbk", tid, key, self.state.read_generation(tid, p),
                                         partition=p)
        return [Request(d.writer_of(tid, p), corr, ReadByKey(corr, tid, p, key, d.lsn_seen))]

    def unknown(self, identity: bytes, rid: int, op: str, req: dict[str, Any],
                now: float) -> list[Out]:
        """A KV request naming a namespace that does not exist: a read finds nothing, a
        delete has nothing to do, a write creates the namespace first."""
        d = self.door
        if op == "kv_get":
            return [Reply(identity, protocol.ok(rid, value=None))]
        if op == "kv_scan":
            return [Reply(identity, protocol.ok(rid, pairs=msgpack.packb([]), more=False))]
        if op == "kv_delete":
            return [Reply(identity, protocol.ok(rid, lsn=d.lsn_seen))]
        if op == "kv_cas" and req["expected"] is not None:
            return [Reply(identity, protocol.ok(rid, swapped=False, lsn=0, value=None))]
        if op not in KV_CREATING_OPS:
            return [Reply(identity, protocol.error(
                rid, ErrorCode.UNKNOWN_TOPIC,
                f"KV namespace {req['namespace']!r} does not exist"))]
        ns = req["namespace"]
        waiting = self.creating.get(ns)
        if waiting is not None:  # being created: go on once it is
            if len(waiting) >= PARKED_MAX:
                raise NodeError(f"{len(waiting)} requests wait for namespace {ns!r} to be "
                                f"created; retry later", ErrorCode.BUSY)
            waiting.append((identity, rid, op, req))
            return []
        then = self.created(ns)
        out = None if d.cluster is None else d.cluster.create_namespace(ns, now, then)
        if out is None:  # here: a single node, or the catalog member
            role, make = self.create({"namespace": ns})
            corr = d.wait(b"", 0, now)
            d.pending[corr].then = then
            out = [Request(role, corr, make(corr))]
        # Only once the creation is on its way (refused, BUSY or a bad name, this request's
        # error is its answer): the requests behind it wait for its answer.
        self.creating[ns] = [(identity, rid, op, req)]
        return out

    def created(self, ns: str) -> Then:
        def done(_w: Waiting, _ok: Fields | None, err: Failure | None) -> list[Out]:
            d = self.door
            waiting = self.creating.pop(ns, [])
            if err is not None and err[0] != ErrorCode.TOPIC_EXISTS:
                d.errors += len(waiting)
                return [Reply(identity, protocol.error(rid, *err))
                        for identity, rid, _op, _req in waiting]
            if d.cluster is not None and not d.cluster.view.is_catalog:
                # Known here once the catalog is copied: then they are routed again.
                return d.cluster.park_all(waiting)
            out: list[Out] = []
            for identity, rid, op, req in waiting:
                out += d.one(identity, rid, op, req, d.clock, may_park=False)
            return out
        return done

    # ---- carrying out KvState's steps, and its answers --------------------------------

    def steps(self, steps: list[Step]) -> list[Out]:
        """Carry out what the KV state decided."""
        d = self.door
        out: list[Out] = []
        for step in steps:
            match step:
                case Send(op):
                    op.sent, op.lsn_floor = True, d.lsn_seen
                    blob = pack(((op.key, op.new),))
                    pid, seq = op.producer
                    out.append(Produce(op.corr, (pid, seq, [(op.tid, 0, 1, blob)])))
                case Refused(corr, found):
                    w = d.pending.pop(corr, None)
                    if w is not None:
                        out.append(Reply(w.identity, protocol.ok(
                            w.rid, swapped=False, lsn=0, value=found)))
                case Load(tid, key, generation):
                    # Not bounded by pending_requests_max: one per key with a CAS waiting,
                    # which is a request already counted.
                    corr = d.wait(b"", 0, d.clock, bounded=False)
                    d.pending[corr].kv_read = KvRead("load", tid, key, generation)
                    out.append(Request(d.writer_of(tid, 0), corr,
                                       KvGet(corr, tid, 0, key, d.lsn_seen)))
                case _:
                    assert_never(step)
        if self.commits and not self.deciding:  # a commit waiting for these keys
            out += self.commit_next()
        return out

    def written(self, w: Waiting, op: KeyOp, lsn: int) -> list[Out]:
        """A KV write is durable: its reply, and what waited behind it."""
        out = self.steps(self.state.written(op, lsn))
        fields: Fields = {"swapped": True, "lsn": lsn} if op.cas else {"lsn": lsn}
        return [*out, *self.door.settle(w, fields, None)]

    def late_ack(self, corr: int, lsn: int) -> list[Out]:
        """An acknowledgement nobody waits for: a KV write that timed out is durable now."""
        late = self.late.pop(corr, None)
        return [] if late is None else self.steps(self.state.written(late, lsn))

    def late_answer(self, msg: Answer) -> list[Out]:
        """An answer nobody waits for: a checked commit that timed out has ended, or a KV
        write that timed out was refused."""
        late = self.late_commit
        if late is not None and msg.corr == late.corr:
            # Its outcome: nothing else can commit the transaction meanwhile (the question
            # changes nothing, and a retry of the commit waits for this one's outcome).
            if isinstance(msg, TxnCommitted):
                return self.let_go(msg.lsn)
            return self.let_go(0, still_open=isinstance(msg, ErrorReply)
                               and msg.code in LEAVES_OPEN)
        op = self.late.pop(msg.corr, None)
        return [] if op is None else self.steps(self.state.written(op, None))

    def answer(self, w: Waiting, msg: Answer) -> list[Out]:
        """An answer to a KV write (one that failed: durable ones are acks) or read."""
        d = self.door
        failure: Failure | None = None
        if isinstance(msg, ErrorReply):
            failure = (msg.code, msg.text)
        elif not isinstance(msg, RecordsReply):
            failure = (ErrorCode.INTERNAL, f"unexpected answer {type(msg).__name__}")
        if w.kv is not None:
            out = self.steps(self.state.written(w.kv, None))
            return out + d.settle(w, None, failure or (ErrorCode.INTERNAL, "no answer"))
        r = w.kv_read
        assert r is not None
        if failure is not None or not isinstance(msg, RecordsReply):
            assert failure is not None
            if r.kind != "load":
                return d.settle(w, None, failure)
            return self.load_failed(r, failure)
        self.saw_commit(msg.commit_lsn)
        if r.kind == "rbk":
            self.state.read_filled(r.tid, r.partition, r.key, msg.records, msg.lsn, r.generation)
            return d.settle(w, {"records": msg.records}, None)
        pairs = msgpack.unpackb(msg.records, raw=False)
        if r.kind == "scan":
            # A page is cut at ``limit`` (the writer was asked for one more, to tell) or once
            # it holds ``read_bytes_max`` bytes, with keys left or not: the client asks on
            # (a page cut by bytes at the last key costs it one empty page).
            more = (len(pairs) > r.limit
                    or sum(len(k) + len(v) for k, v in pairs) >= d.lim.read_bytes_max)
            records = pack(pairs[:r.limit]) if more else msg.records
            return d.settle(w, {"pairs": records, "more": more}, None)
        value = pairs[0][1] if pairs else None
        if r.kind == "get":
            self.state.read_answered(r.tid, r.key, value, msg.lsn, r.generation)
            return d.settle(w, {"value": value}, None)
        return self.steps(self.state.loaded(r.tid, r.key, value, msg.lsn, r.generation))

    def give_back(self, corr: int, w: Waiting, failure: Failure, timed_out: bool
                  ) -> list[Out]:
        """What a wait that failed or was forgotten holds of KV state, given back: a
        commit's namespaces and keys, a key's write, a key's load (``failure`` fails what
        waits on it)."""
        out: list[Out] = []
        if w.undecided:
            out += self.undecided(corr)
        if w.commit is not None:
            # Failed here without timing out, it was never sent: its transaction is open.
            out += self.commit_done(w, still_open=not timed_out,
                                    late_corr=corr if timed_out else 0)
        if w.kv is not None:
            out += self.failed(corr, w.kv, timed_out)
        if w.kv_read is not None and w.kv_read.kind == "load":
            out += self.load_failed(w.kv_read, failure)
        return out

    def failed(self, corr: int, op: KeyOp, timed_out: bool) -> list[Out]:
        """A KV write answered with an error by the front door: one that timed out in flight
        may still be logged (its late answer is awaited); any other was not sent, or never
        will be."""
        if not op.sent:
            self.state.cancel({corr})
            return []
        if timed_out and len(self.late) < self.door.lim.pending_requests_max:
            self.state.lost(op)
            self.late[corr] = op
            return []
        return self.steps(self.state.written(op, None))

    def undecided(self, corr: int) -> list[Out]:
        """A commit with compare-and-sets failed (it timed out) before it was decided: it was
        never sent, and its transaction is still open. Its conditions go back, for its retry
        to be decided on them (dropped, the retry went unchecked, and the transaction
        manager refused it TXN_CONFLICT); the commits behind it go on."""
        for entry in self.commits:
            if entry.corr == corr:
                self.commits.remove(entry)
                self.conds_restore(entry.txn, entry.conds)
                return self.commit_next()
        return []

    def load_failed(self, r: KvRead, failure: Failure) -> list[Out]:
        """A key's value could not be loaded: the compare-and-sets waiting on it fail with
        that, and so does the commit to be decided on it (``commit_next``), whose
        transaction stays open with its compare-and-sets, for a retry to decide again. (The
        commit loaded the key again at once, until it timed out: under a namespace dropped
        meanwhile, thousands of failed loads a second.)"""
        d = self.door
        out: list[Out] = []
        for corr in self.state.load_failed(r.tid, r.key):
            w = d.pending.pop(corr, None)
            if w is not None:
                out += d.settle(w, None, failure)
        k = (r.tid, r.key)
        if self.commits and any((tid, key) == k for tid, key, _e in self.commits[0].conds):
            first = self.commits.popleft()
            self.conds_restore(first.txn, first.conds)
            w = d.pending.pop(first.corr, None)
            if w is not None:
                out += d.settle(w, None, failure)
        line = self.state.lines.get(k)
        if line is not None:
            out += self.steps(self.state.pump(k, line))
        elif self.commits and not self.deciding:
            out += self.commit_next()
        return out

    # ---- transactions: their namespaces, their compare-and-sets -----------------------

    def partitions_written(self, tid: int, parts: Sequence[PlacedRow]) -> None:
        """Records of topic ``tid`` are durable in these partitions (or deleted from them):
        its reads by key cached here are stale."""
        self.state.partitions_written(tid, parts)

    def txn_wrote(self, txn: int, tid: int) -> None:
        """A transaction begun here writes topic (or namespace) ``tid``: its commit makes
        cached reads of it stale."""
        if txn in self.txns:
            self.txns[txn].add(tid)

    def txn_kv(self, identity: bytes, rid: int, req: dict[str, Any], now: float) -> Request:
        d = self.door
        key, value, txn, seq = req["key"], req["value"], req["txn"], req["seq"]
        tid = self.checked("txn_kv", req).topic_id
        self.txn_wrote(txn, tid)
        conditional = "expected" in req
        conds = self.conds.get(txn) if conditional else None
        cost = cond_bytes(key, req.get("expected"))
        if conditional:
            self.cond_room(txn, conds, cost, now)
        blob = pack(((key, value),))
        corr = d.wait(identity, rid, now)
        if conditional:
            # Remembered as it is sent, so that a commit sent behind it (in the same frame)
            # is checked against it; forgotten if the transaction manager refuses the write.
            if conds is None:
                conds = self.conds[txn] = []
                self.cond_since[txn] = now
            conds.append((tid, key, req["expected"]))
            self.cond_bytes += cost
            d.pending[corr].cond = (txn, tid, key, req["expected"])
        return Request(TRANSACTION_MANAGER, corr,
                       TxnWrite(corr, txn, seq, [(tid, 0, 1, blob)], (), conditional))

    def cond_room(self, txn: int, conds: list[Cond] | None, cost: int, now: float) -> None:
        """Refuse a compare-and-set whose condition could not be remembered, before it is
        staged: every staged one is checked at the commit. (Past these bounds they went
        unremembered, and a commit was sent checked against the others, or none.)"""
        lim = self.door.lim
        if txn in self.xa:
            raise NodeError("a compare-and-set in a transaction needs a local transaction "
                            "(an XA branch's commit is its coordinator's)",
                            ErrorCode.BAD_REQUEST)
        self.forget_old(now)
        bytes_max = max(CONDS_BYTES_MAX, 2 * lim.value_bytes_max)
        if self.cond_bytes + cost > bytes_max:
            raise NodeError(f"the compare-and-sets of open transactions hold {self.cond_bytes} "
                            f"bytes here; {cost} more would pass {bytes_max} "
                            f"(front_kv.CONDS_BYTES_MAX); retry when some have ended",
                            ErrorCode.TXN_LIMIT)
        if conds is not None:
            if len(conds) >= lim.batch_records_max:
                raise NodeError(f"a transaction holds at most {lim.batch_records_max} "
                                f"compare-and-sets (limits.batch_records_max)",
                                ErrorCode.TXN_LIMIT)
            return
        if len(self.conds) >= TXNS_REMEMBERED_MAX:
            raise NodeError(f"{len(self.conds)} transactions with compare-and-sets are "
                            f"open here, the most there may be; retry when some have "
                            f"ended", ErrorCode.TXN_LIMIT)

    def conds_take(self, txn: int) -> list[Cond]:
        """A transaction's conditions, taken out of the table (empty if it had none), still
        counted in ``cond_bytes``: for its commit to be decided on (``conds_done``)."""
        self.cond_since.pop(txn, None)
        return self.conds.pop(txn, [])

    def conds_done(self, conds: list[Cond]) -> None:
        """Conditions let go: their bytes no longer count."""
        self.cond_bytes -= sum(cond_bytes(key, expected) for _tid, key, expected in conds)

    def conds_drop(self, txn: int) -> None:
        """A transaction ended, or must have: its conditions are let go."""
        self.conds_done(self.conds_take(txn))

    def conds_restore(self, txn: int, conds: list[Cond]) -> None:
        """Conditions of a commit that did not commit, given back to their transaction,
        which is still open: to a commit of it waiting to be decided (a retry sent while
        they were out), else to the table, for the next. (Dropped, the retry went unchecked
        and was refused TXN_CONFLICT, or was checked against the conditions staged since
        only, and a key written meanwhile was overwritten: a lost update.)"""
        if not conds:
            return
        for waiting in self.commits:
            if waiting.txn == txn:
                waiting.conds[:0] = conds
                return
        self.conds[txn] = conds + self.conds.get(txn, [])
        self.cond_since.setdefault(txn, self.door.clock)

    def checks(self, txn: int) -> bool:
        """Whether a commit of ``txn`` is to be decided here: it has conditions, or a
        commit of it that timed out holds them (a retry then waits for its outcome, and
        takes them back if the transaction is still open)."""
        late = self.late_commit
        return txn in self.conds or (late is not None and late.txn == txn)

    def forget_old(self, now: float) -> None:
        """Forget what is remembered of transactions that must have ended: begun, or their
        first compare-and-set made, ``cond_horizon_s`` ago or more. Their conditions go with
        them: a commit then goes unchecked, which the transaction manager refuses, never
        commits."""
        horizon = now - self.cond_horizon_s
        for txn in remembered_by(self.txns_since, horizon):
            self.txn_forget(txn)
            self.conds_drop(txn)
        for xid in remembered_by(self.xids_since, horizon):
            self.xid_forget(xid)
        for txn in remembered_by(self.cond_since, horizon):
            self.conds_drop(txn)

    def txn_forget(self, txn: int) -> set[int] | None:
        """The namespaces a transaction begun here writes, and it forgotten (None: not
        known here, so it may write any)."""
        self.txns_since.pop(txn, None)
        self.xa.discard(txn)
        return self.txns.pop(txn, None)

    def xid_forget(self, xid: tuple[Any, ...]) -> int:
        """The transaction of an XA branch begun here (0: not known), the xid forgotten."""
        self.xids_since.pop(xid, None)
        return self.xids.pop(xid, 0)

    def cond_refused(self, cond: KvCond) -> None:
        """A compare-and-set the transaction manager refused (an unknown transaction, a
        limit): its condition no longer gates the transaction's commit. Remembered, those
        of writes to transactions that never existed filled the table, and every
        compare-and-set after them went unremembered, its commit refused TXN_CONFLICT."""
        txn, tid, key, expected = cond
        conds = self.conds.get(txn)
        if conds is not None and (tid, key, expected) in conds:
            conds.remove((tid, key, expected))
            self.conds_done([(tid, key, expected)])
            if not conds:
                self.conds_take(txn)

    def conditional_commit(self, identity: bytes, rid: int, req: dict[str, Any],
                           now: float) -> list[Out]:
        """The commit of a transaction with compare-and-sets: decided here, one such commit
        at a time, on its keys' values when nothing of them is in flight. Matching, it is
        sent with their keys held (no write of them goes out until its answer, so none is
        logged between the check and the commit); not matching, the transaction is rolled
        back and the commit answered TXN_CONFLICT."""
        txn = req["txn"]
        corr = self.door.wait(identity, rid, now)
        self.door.pending[corr].undecided = True
        self.commits.append(CheckedCommit(corr, txn, req.get("writes", -1),
                                          req.get("owner", 0), self.conds_take(txn)))
        return self.commit_next()

    def commit_next(self) -> list[Out]:
        d = self.door
        out: list[Out] = []
        while self.commits and not self.deciding:
            corr, txn, writes, owner, conds = self.commits[0]
            w = d.pending[corr]  # (one that timed out waiting left the queue: ``undecided``)
            keys = tuple(dict.fromkeys((tid, key) for tid, key, _e in conds))
            values, loads = self.state.settled(keys)
            if values is None:
                self.deciding = True  # no other decision while this one loads
                out += self.steps(loads)
                self.deciding = False
                return out
            self.commits.popleft()
            w.undecided = False
            if all(values[(tid, key)] == expected for tid, key, expected in conds):
                tids = self.txn_forget(txn)
                # With its compare-and-sets' namespaces: a write sent before its begin is not
                # in ``txns``, and an empty set made the commit's end (``commit_done``,
                # where () is "unknown") take back a commit anywhere that never started.
                if tids is not None:
                    tids |= {tid for tid, _key, _expected in conds}
                commit = None if tids is None else tuple(sorted(tids))
                self.state.commit_started(commit)
                self.state.bar(keys)
                w.commit, w.barred = (commit if commit is not None else ()), keys
                # The conditions go with it until its outcome is known: given back if it
                # leaves the transaction open (``commit_done``).
                w.decided = (txn, conds)
                self.deciding = True
                out.append(Request(TRANSACTION_MANAGER, corr,
                                   TxnStep(corr, txn, None, "commit", writes, checked=True,
                                           ahead_of=self.state.gated_on(keys),
                                           owner=owner)))
                return out
            self.conds_done(conds)  # rolled back: they are let go
            self.txn_forget(txn)
            w.then = self.conflict(txn)
            out.append(Request(TRANSACTION_MANAGER, corr,
                               TxnStep(corr, txn, None, "rollback", checked=True)))
        return out

    def gate_held(self, corrs: Sequence[int], held: bool) -> list[Out]:
        """The transaction manager holds these writes at a blocking checkpoint's gate (or let
        them through): a checked commit waiting for one of its keys' writes may now be
        decided ahead of those held (the gate waits for the commit: it would wait for good,
        ``checkpoint_timeout_ms``, with the write waiting for the gate)."""
        for corr in corrs:
            w = self.door.pending.get(corr)
            op = w.kv if w is not None else self.late.get(corr)
            if op is not None and op.sent:
                self.state.held_at_gate(op, held)
        if held and self.commits and not self.deciding:
            return self.commit_next()
        return []

    def conflict(self, txn: int) -> Then:
        def done(w: Waiting, _ok: Fields | None, err: Failure | None) -> list[Out]:
            self.door.errors += 1
            text = CONFLICT_TEXT.format(txn)
            if err is not None:
                text += f" (the rollback failed: {err[1]})"
            return [Reply(w.identity, protocol.error(w.rid, ErrorCode.TXN_CONFLICT, text))]
        return done

    def track_txn(self, op: str, req: dict[str, Any], w: Waiting) -> None:
        """Remember the transactions begun here (their KV namespaces are learned from their
        writes), and mark a commit with the namespaces it may change: none of them is
        answered from the cache until the commit's answer (``commit_done``)."""
        txn = req.get("txn", 0)
        xid = tuple(req["xid"]) if "xid" in req else None
        if op in ("txn_begin", "xa_start"):
            if txn:  # (not a transaction manager's pick, unknown here)
                w.then = self.begin(txn, xid)
            return
        if xid is not None:
            txn = self.xid_forget(xid)
        self.conds_drop(txn)  # rolled back, or (a retry) committed already
        tids = self.txn_forget(txn) if txn else None
        if op not in COMMIT_OPS:
            return  # rolled back: nothing of it becomes visible
        if tids is not None and not tids:
            return  # known to write no KV namespace
        commit = None if tids is None else tuple(sorted(tids))
        self.state.commit_started(commit)
        w.commit = commit if commit is not None else ()

    def begin(self, txn: int, xid: tuple[Any, ...] | None) -> Then:
        """Remember a begin as it is sent (a retry of one keeps what its writes named), and
        what it changed: refused, it began nothing, and that is undone when it is answered.
        Not on a timeout: it may have begun, and its writes may be staged (forgotten, a
        retried begin would remember it as writing no namespace, and its commit would leave
        stale values cached); ``forget_old`` forgets it later."""
        now = self.door.clock
        self.forget_old(now)
        new_txn = txn not in self.txns and len(self.txns) < TXNS_REMEMBERED_MAX
        if new_txn:
            self.txns[txn] = set()
            self.txns_since[txn] = now
            if xid is not None:
                self.xa.add(txn)
        had = None if xid is None else self.xids.get(xid)
        # An xid free here is remembered as the begin is sent; one held by another branch
        # only once the begin is answered OK (replaced as it was sent, a commit by that xid
        # sent before the refusal came back took the new entry, "writes no namespace", and
        # the branch's namespaces stayed cached). Meanwhile a commit by xid names the other
        # branch's namespaces, or (not known) any: never fewer than it may change.
        new_xid = (xid is not None and txn in self.txns and had is None
                   and len(self.xids) < TXNS_REMEMBERED_MAX)
        taken_xid = xid is not None and txn in self.txns and had is not None and had != txn
        if new_xid:
            assert xid is not None
            self.xids[xid] = txn
            self.xids_since[xid] = now

        def done(w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
            d = self.door
            if err is None:
                assert ok is not None
                if taken_xid and xid is not None:  # the other branch had ended unseen
                    self.xid_forget(xid)
                    self.xids[xid], self.xids_since[xid] = txn, d.clock
                return [Reply(w.identity, protocol.ok(w.rid, **ok))]
            if err[0] not in NOT_REFUSED:
                if new_txn:
                    self.txn_forget(txn)
                if new_xid and xid is not None and self.xids.get(xid) == txn:
                    self.xid_forget(xid)
            elif taken_xid and xid is not None and self.xids.get(xid) == had:
                self.xid_forget(xid)  # it may have begun: its xid's commit may change any
            d.errors += 1
            return [Reply(w.identity, protocol.error(w.rid, *err))]
        return done

    def commit_started(self, w: Waiting, tids: tuple[int, ...]) -> None:
        """A whole transaction (``txn_once``) writing topics ``tids`` is on its way: no read
        of them is answered from the cache until its answer."""
        w.commit = tids
        self.state.commit_started(tids)

    def committed(self, lsn: int) -> None:
        """A commit answered here, at ``lsn``."""
        self.commit_lsn = max(self.commit_lsn, lsn)

    def saw_commit(self, commit_lsn: int) -> None:
        """A read's answer reflects the commits up to ``commit_lsn``: every read after it
        waits for them, and a commit not answered here leaves nothing cached."""
        d = self.door
        if commit_lsn > d.lsn_seen:
            d.lsn_seen = commit_lsn
        if commit_lsn > self.commit_lsn:
            # Seen before its answer (if it is one of this front door's): one forget a
            # commit at most, and only while transactions commit.
            self.commit_lsn = commit_lsn
            self.state.forget()

    def commit_done(self, w: Waiting, still_open: bool = False, late_corr: int = 0
                    ) -> list[Out]:
        """A commit that may change KV namespaces was answered, or failed (``still_open``:
        it left its transaction open; ``late_corr``: it timed out, and may still be
        committed: a checked one holds its keys, namespaces and conditions until its
        outcome is known, ``LateCommit``). A checked one's conditions go back to its
        transaction if it is open, and are let go if it committed or ended."""
        commit, w.commit = w.commit, None
        decided, w.decided = w.decided, None
        if decided is not None:
            txn, conds = decided
            if late_corr:
                ask_at = self.door.clock + LATE_COMMIT_ASK_MS / 1000
                self.late_commit = LateCommit(late_corr, txn, conds, w.barred, commit or None,
                                              ask_at)
                return []
            self.conds_settle(txn, conds, still_open)
        out = self.steps(self.state.commit_ended(commit or None))
        if w.barred:
            out += self.unbar(w.barred)
        return out

    def conds_settle(self, txn: int, conds: list[Cond], still_open: bool) -> None:
        """A checked commit's outcome is known: its conditions go back to the transaction
        if it is still open, and are let go if it committed or ended."""
        if still_open:
            self.conds_restore(txn, conds)
        else:
            self.conds_done(conds)

    def unbar(self, keys: Keys) -> list[Out]:
        self.deciding = False
        return self.steps(self.state.unbar(keys))

    def let_go(self, lsn: int, still_open: bool = False) -> list[Out]:
        """The checked commit that timed out has an outcome (``lsn``: committed there; 0:
        not, and ``still_open``: its transaction is open): later reads wait for it, its
        namespaces' cached values are dropped, its conditions settled and its keys let go."""
        late, self.late_commit = self.late_commit, None
        assert late is not None
        d = self.door
        if lsn:
            d.lsn_seen = max(d.lsn_seen, lsn)
            self.committed(lsn)
        self.conds_settle(late.txn, late.conds, still_open)
        out = self.steps(self.state.commit_ended(late.commit))
        return out + self.unbar(late.keys)

    def tick(self, now: float) -> list[Out]:
        """Forget transactions that must have ended, and ask about the checked commit that
        timed out if its outcome is still not known."""
        self.forget_old(now)
        late = self.late_commit
        if late is None or late.asking or late.ask_at > now:
            return []
        return [self.ask(late, now)]

    def ask(self, late: LateCommit, now: float) -> Request:
        """Ask the transaction manager how a checked commit that timed out ended
        (``TxnAsk``, which changes nothing: sending the commit again could commit a
        transaction whose client's own retry had been told TXN_CONFLICT, once the first
        reopened it). The transaction manager takes the front door's messages in order, so
        the question comes after the commit and its answer is the commit's effect:
        committed (from the log manager's ledger, once durable), still open (the commit
        was refused leaving it open, or reopened: its conditions go back), ended, still
        committing (asked again), or not known (forgotten long ago: its namespaces'
        values are dropped and its keys let go)."""
        d = self.door
        q = d.wait(b"", 0, now, bounded=False)  # one at a time, of one commit at most
        late.asking = q
        self.late_asks += 1

        def answered(_w: Waiting, ok: Fields | None, err: Failure | None) -> list[Out]:
            if self.late_commit is not late or late.asking != q:
                return []  # let go already (the commit's own answer came)
            late.asking = 0
            if err is None:
                assert ok is not None
                outcome = ok.get("outcome")
                if outcome is None:  # TxnCommitted
                    return self.let_go(ok["lsn"])
                if outcome != "committing":
                    return self.let_go(0, still_open=outcome == "open")
            elif err[0] not in ASK_AGAIN:
                return self.let_go(0)  # refused: forgotten by the log manager's ledger
            late.ask_at = d.clock + LATE_COMMIT_ASK_MS / 1000  # not told: asked again
            return []

        d.pending[q].then = answered
        return Request(TRANSACTION_MANAGER, q, TxnAsk(q, late.txn))
