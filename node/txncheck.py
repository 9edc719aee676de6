"""Crash checking of transactions: producers of local transactions and XA branches that
record what each one staged and how it ended, a reader that watches two partitions for a
partial view, and the check that every transaction is whole or absent.

Used by ``scripts/crashtest --txn`` and ``tests/test_txn_crash.py``, beside the idempotent
producers of ``node/crashcheck.py``. Every transaction writes at least one record to
partition 0 and one to partition 1 of its topic, each value ``T:<tag>:<n>`` (the tag names
the transaction), and maybe more to any partition, by key or not, and a consumer-group
offset. How each one ends is its **fate**:

- ``COMMITTED``: a commit was answered ok (the first time, or a retry after a lost answer):
  every record must be present once, at the offsets the commit returned, contiguous in
  each partition; its group offset is the group's if it is the latest committed.
- ``ABSENT``: rolled back by the producer, left open to time out, or ended by the node
  (TXN_ABORTED, TXN_TIMED_OUT, TXN_UNKNOWN, XA_RB*, XAER_NOTA, to a call or to a commit
  retried after a lost answer): none of its records may be present, or ever have been seen.
- ``IN_DOUBT``: an XA branch whose prepare was answered ok and that is not resolved yet:
  invisible, listed by ``xa_recover()`` whatever was killed since, and committed or rolled
  back later by ``resolve_in_doubt``.

A call that is not answered (a kill) is retried until it is: writes carry their number, so
a retry is not staged twice, and a commit or rollback retried answers the first outcome.
"""

from __future__ import annotations

import enum
import functools
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from actors.roles import key_partition
from node.client import NodeClient
from node.crashcheck import RETRYABLE, CheckFailed, KillPoint, Ledger, Producer, positions
from node.transaction import Transaction, TxnPart, TxnResult
from wire.errors import ErrorCode, NodeError
from wire.records import Record
from wire.xid import Xid

T = TypeVar("T")

CALL_RETRY_S_MAX = 120.0  # a call not answered in this long fails the producer
TXN_TIMEOUT_MS = 30_000  # longer than any restart: only the node's restart ends these
ABANDON_TIMEOUT_MS = 1_000  # a transaction left open on purpose: rolled back by its timeout
RESUME_S_MAX = 60.0  # a producer held between prepare and commit waits this long at most
XA_FORMAT = 7001
VALUE_PREFIX = b"T:"
SRC_RECORDS = 4096  # records of the topic whose offsets transactions commit for their group
# Ended by the node: the transaction is rolled back, or was never begun in the log.
GONE = (ErrorCode.TXN_ABORTED, ErrorCode.TXN_TIMED_OUT, ErrorCode.TXN_UNKNOWN,
        ErrorCode.XA_RBROLLBACK, ErrorCode.XA_RBTIMEOUT, ErrorCode.XAER_NOTA)
# Kinds of transaction and how often a producer picks each.
KINDS = {
    "commit": 30,  # local, committed
    "abort": 10,  # local, rolled back by the producer
    "abandon": 5,  # local, left open until its timeout rolls it back
    "xa-commit": 20,  # end, prepare, commit
    "xa-rollback": 10,  # end, prepare, rollback
    "xa-1pc": 10,  # end, commit in one phase
    "xa-doubt": 15,  # end, prepare, and left for resolve_in_doubt (maybe across kills)
}
# The kinds that pass a kill point, for a producer armed at it.
POINT_KINDS = {"begin": tuple(KINDS), "commit": ("commit", "xa-commit", "xa-1pc"),
               "prepared": ("xa-commit", "xa-rollback")}


class Fate(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABSENT = "absent"
    IN_DOUBT = "in doubt"


@dataclass
class TxnLog:
    """One transaction as its producer saw it."""

    tag: str
    kind: str
    values: list[tuple[int, bytes]] = field(default_factory=list)  # (partition, value), staged order
    group_offset: int | None = None  # the offset staged for the producer's consumer group
    xid: Xid | None = None
    txn_id: int = 0  # the id the node answered its begin with (0 while none)
    fate: Fate = Fate.OPEN
    why: str = ""  # how it ended, for the check's messages
    lsn: int = 0  # of its commit
    parts: list[TxnPart] = field(default_factory=list)  # as the commit answered them
    client_offsets: list[tuple[int, int]] | None = None  # TxnResult.offsets, flattened
    lost_commit: bool = False  # a commit (or rollback) answered only when retried

    def end(self, fate: Fate, why: str) -> None:
        self.fate, self.why = fate, why

    def committed(self, res: TxnResult, why: str) -> None:
        self.end(Fate.COMMITTED, why)
        self.lsn, self.parts = res.lsn, list(res.parts)
        if res.offsets:
            self.client_offsets = [pos for call in res.offsets for pos in call]


class Gone(Exception):
    """The node ended the transaction (one of the ``GONE`` codes)."""

    def __init__(self, exc: NodeError) -> None:
        super().__init__(str(exc))
        self.code = exc.code


def answered(fn: Callable[[], T], lost: list[int] | None = None) -> T:
    """``fn()`` once the node answers it: retried while the node is busy, restarting or
    silent. Any other error is raised (``Gone`` for the node's ending of a transaction).
    ``lost``, if given, counts the attempts whose answer never came."""
    deadline = time.monotonic() + CALL_RETRY_S_MAX
    while True:
        try:
            return fn()
        except NodeError as exc:
            if exc.code in GONE:
                raise Gone(exc) from exc
            if exc.code not in RETRYABLE or time.monotonic() > deadline:
                raise
            if lost is not None:
                lost[0] += 1


class TxnProducer(Producer):
    """Runs numbered transactions of random kinds (``KINDS``, from its own seeded random)
    on ``topic`` until stopped or done: the ``batches`` of ``Producer`` are transactions
    here. ``arm(point)`` makes it signal, once, when it reaches a kill point."""

    def __init__(self, endpoint: str, topic: str, partitions: int, src_topic: str, name: str,
                 seed: int) -> None:
        super().__init__(endpoint, topic, name, 0, None, batches_max=0)
        self.partitions = partitions
        self.src_topic = src_topic
        self.group = f"g-{name}"
        self.rng = random.Random(seed)
        self.txns: list[TxnLog] = []
        self.lost = [0]  # attempts whose answer was lost, all calls
        self.kill: KillPoint[TxnLog] = KillPoint()  # its fired_in: the transaction there
        self.resume = threading.Event()

    # ---- kill points ------------------------------------------------------------------

    def arm(self, point: str) -> threading.Event:
        """Signal the returned event when next reaching ``point``: ``begin`` (a begin was
        just answered), ``commit`` (just before a commit is sent) or ``prepared`` (after a
        prepare was answered; the producer then waits for ``release`` before committing or
        rolling back)."""
        assert point in POINT_KINDS
        self.resume.clear()
        return self.kill.arm(point)

    def release(self) -> None:
        """Disarm, and let a producer held at ``prepared`` go on."""
        self.kill.disarm()
        self.resume.set()

    @property
    def fired_in(self) -> TxnLog | None:
        return self.kill.fired_in

    def reached(self, point: str, t: TxnLog) -> None:
        if self.kill.reach(point, t) and point == "prepared":
            self.resume.wait(RESUME_S_MAX)

    def pick_kind(self) -> str:
        point = self.kill.armed_at()
        kinds = list(POINT_KINDS[point]) if point else list(KINDS)
        return self.rng.choices(kinds, [KINDS[k] for k in kinds])[0]

    # ---- one transaction ----------------------------------------------------------------

    def write(self, c: NodeClient, b: int) -> None:
        t = TxnLog(f"{self.tag}.{b}", self.pick_kind())
        self.txns.append(t)
        try:
            if t.kind.startswith("xa"):
                self.xa(c, t)
            else:
                self.local(c, t)
        except Gone as exc:
            t.end(Fate.ABSENT, f"a call answered {exc.code.name}")

    def plan(self, t: TxnLog) -> list[tuple[str, int, list[Record]]]:
        """The writes of a transaction: (what, partition or -1 for by key, records)."""
        rng, n = self.rng, 0

        def recs(count: int, keyed: bool = False) -> list[Record]:
            nonlocal n
            out = []
            for _ in range(count):
                value = VALUE_PREFIX + f"{t.tag}:{n}".encode()
                out.append(Record(value, f"k{rng.randrange(1000)}".encode() if keyed else None))
                n += 1
            return out

        steps = [("batch", 0, recs(1)), ("batch", 1, recs(1))]  # what the reader watches
        for _ in range(rng.randrange(3)):
            if rng.random() < 0.5:
                steps.append(("batch", rng.randrange(self.partitions), recs(rng.randint(1, 4))))
            else:
                steps.append(("batch", -1, recs(rng.randint(2, 4), keyed=True)))
        if rng.random() < 0.4:
            steps.append(("offset", 1 + rng.randrange(SRC_RECORDS - 1), []))
        rng.shuffle(steps)
        return steps

    def stage(self, tx: Transaction, t: TxnLog) -> None:
        for what, partition, recs in self.plan(t):
            if what == "offset":
                t.group_offset = partition
                answered(functools.partial(tx.commit_offset, self.group, self.src_topic, 0,
                                           partition), self.lost)
                continue
            for r in recs:
                p = partition if partition >= 0 else key_partition(r.key or b"", self.partitions)
                t.values.append((p, r.value))
            self.ledger.sent.update(r.value for r in recs)
            answered(functools.partial(tx.produce_batch, self.topic, recs,
                                       None if partition < 0 else partition), self.lost)

    def local(self, c: NodeClient, t: TxnLog) -> None:
        timeout = ABANDON_TIMEOUT_MS if t.kind == "abandon" else TXN_TIMEOUT_MS
        # A begin whose answer was lost began a transaction nobody knows: empty, it times out.
        tx = answered(lambda: c.transaction(timeout_ms=timeout), self.lost)
        t.txn_id = tx.id
        self.reached("begin", t)
        self.stage(tx, t)
        if t.kind == "abandon":
            t.end(Fate.ABSENT, "left open")
        elif t.kind == "abort":
            self.finish(t, tx.abort)
            t.end(Fate.ABSENT, "rolled back" + (" (answered on a retry)" if t.lost_commit else ""))
        else:
            self.commit(t, tx.commit)

    def xa(self, c: NodeClient, t: TxnLog) -> None:
        branch = 0
        while True:  # a start whose answer was lost: that xid is taken, so try the next
            xid = Xid(XA_FORMAT, t.tag.encode(), f"b{branch}".encode())
            try:
                tx = c.xa_start(xid, timeout_ms=TXN_TIMEOUT_MS)
                break
            except NodeError as exc:
                if exc.code not in RETRYABLE:
                    raise
                branch += 1
        t.xid, t.txn_id = xid, tx.id
        self.reached("begin", t)
        self.stage(tx, t)
        self.retried_step(lambda: c.xa_end(xid), ErrorCode.XAER_PROTO)  # PROTO: ended already
        if t.kind == "xa-1pc":
            self.commit(t, tx.commit)
            return
        if not self.retried_step(lambda: c.xa_prepare(xid), ErrorCode.XAER_PROTO):
            self.prepare_unanswered(c, t, xid)
            return
        if t.kind == "xa-doubt":
            t.end(Fate.IN_DOUBT, "prepared")
            return
        self.reached("prepared", t)
        try:
            if t.kind == "xa-commit":
                t.committed(self.finish(t, lambda: c.xa_commit(xid)), "prepared, committed")
            else:
                self.finish(t, lambda: c.xa_rollback(xid))
                t.end(Fate.ABSENT, "prepared, rolled back")
        except Gone as exc:
            raise AssertionError(f"XA branch {t.tag}, prepared, answered {exc.code.name} to "
                                 f"its {t.kind[3:]}: a prepared branch must survive") from exc

    def retried_step(self, fn: Callable[[], object], first_took: ErrorCode) -> bool:
        """An XA step that is not to be retried blindly: True once answered ok; False when a
        retry was answered ``first_took`` (the lost attempt may have taken effect)."""
        lost = [0]
        try:
            answered(fn, lost)
        except NodeError as exc:
            if lost[0] and exc.code is first_took:
                return False
            raise
        finally:
            self.lost[0] += lost[0]
        return True

    def prepare_unanswered(self, c: NodeClient, t: TxnLog, xid: Xid) -> None:
        """A prepare whose answer was lost, as a coordinator resolves it: a branch listed in
        doubt may be committed (ok: whole; rolled back: absent); else it is rolled back."""
        listed = xid in answered(c.xa_recover, self.lost)
        try:
            if listed and self.rng.random() < 0.5:
                t.committed(self.finish(t, lambda: c.xa_commit(xid)), "prepare unanswered, "
                            "listed in doubt, committed")
                return
            self.finish(t, lambda: c.xa_rollback(xid))
            t.end(Fate.ABSENT, "prepare unanswered, rolled back")
        except Gone as exc:
            t.end(Fate.ABSENT, f"prepare unanswered; then {exc.code.name}")

    def finish(self, t: TxnLog, fn: Callable[[], T]) -> T:
        """A commit or rollback, retried until answered; notes a lost answer."""
        lost = [0]
        try:
            return answered(fn, lost)
        finally:
            t.lost_commit = t.lost_commit or lost[0] > 0
            self.lost[0] += lost[0]

    def commit(self, t: TxnLog, fn: Callable[[], TxnResult]) -> None:
        self.reached("commit", t)
        try:
            res = self.finish(t, fn)
        except Gone as exc:
            t.end(Fate.ABSENT, f"commit answered {exc.code.name}"
                  + (" after a lost answer" if t.lost_commit else ""))
            return
        t.committed(res, "committed" + (" (answered on a retry)" if t.lost_commit else ""))


def resolve_in_doubt(c: NodeClient, producers: list[TxnProducer], rng: random.Random,
                     keep: float = 0.3) -> tuple[int, int]:
    """Check that ``xa_recover()`` lists exactly the branches in doubt, then commit or roll
    back each (but a ``keep`` share, left for later); returns (listed, resolved). Call it
    while the producers are idle."""
    listed = set(answered(c.xa_recover))
    doubt = {t.xid: t for p in producers for t in p.txns if t.fate is Fate.IN_DOUBT}
    missing = [str(x) for x in doubt if x not in listed]
    if missing:
        raise CheckFailed(f"{len(missing)} prepared XA branches are not listed by xa_recover, "
                          f"e.g. {missing[:3]}")
    extra = [str(x) for x in listed if x not in doubt]
    if extra:
        raise CheckFailed(f"xa_recover lists {len(extra)} branches not in doubt, e.g. {extra[:3]}")
    resolved = 0
    for xid, t in doubt.items():
        assert xid is not None
        if rng.random() < keep:
            continue
        try:
            if rng.random() < 0.5:
                t.committed(answered(functools.partial(c.xa_commit, xid)), "in doubt, committed")
            else:
                answered(functools.partial(c.xa_rollback, xid))
                t.end(Fate.ABSENT, "in doubt, rolled back")
        except Gone as exc:
            raise CheckFailed(f"XA branch {t.tag}, prepared, answered {exc.code.name} when "
                              f"resolved: a prepared branch must survive") from exc
        resolved += 1
    return len(listed), resolved


# ---- the reader ----------------------------------------------------------------------


def tag_of(value: bytes) -> str | None:
    """The transaction a record belongs to, or None for a record not written in one."""
    if not value.startswith(VALUE_PREFIX):
        return None
    return value[len(VALUE_PREFIX):].rsplit(b":", 1)[0].decode()


class Views:
    """What a reader saw of two partitions, each read from the start to its end again and
    again: the transactions seen in each. A transaction seen in one and then not in the
    other, read to its end afterwards, is a partial view. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: tuple[set[str], set[str]] = (set(), set())
        self.violations: list[str] = []

    def saw(self, side: int, tags: Iterable[str]) -> None:
        with self.lock:
            self.seen[side].update(tags)

    def only(self, side: int) -> frozenset[str]:
        """The transactions seen in ``side`` and not (yet) in the other."""
        with self.lock:
            return frozenset(self.seen[side] - self.seen[1 - side])

    def read_after(self, side: int, pending: frozenset[str]) -> None:
        """The other side was just read to its end, after ``side`` showed ``pending``."""
        with self.lock:
            missing = pending - self.seen[1 - side]
            if missing:
                self.violations.append(
                    f"a partial view: {len(missing)} transactions seen in partition {side} "
                    f"were then missing from partition {1 - side}, e.g. {sorted(missing)[:3]}")

    def all_seen(self) -> set[str]:
        with self.lock:
            return self.seen[0] | self.seen[1]


class Reader(threading.Thread):
    """Reads partitions 0 and 1 of ``topic`` to their ends, in turn one first then the
    other, until stopped, and records in ``views`` what it saw and any partial view."""

    def __init__(self, endpoint: str, topic: str) -> None:
        super().__init__(daemon=True, name="txn-reader")
        self.endpoint, self.topic = endpoint, topic
        self.views = Views()
        self.next = [0, 0]
        self.rounds = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            with NodeClient(self.endpoint, timeout_ms=3000, retries=0) as c:
                while not self.stopping.is_set():
                    first = self.rounds % 2
                    if not self.read_to_end(c, first):
                        return
                    pending = self.views.only(first)
                    if not self.read_to_end(c, 1 - first):
                        return
                    self.views.read_after(first, pending)
                    self.rounds += 1
                    self.stopping.wait(0.01)  # ok-sleep: the pace of the reads
        except BaseException as exc:  # surfaced by the check
            self.error = exc

    def read_to_end(self, c: NodeClient, side: int) -> bool:
        """Read ``side`` until a read comes back empty; False if stopped meanwhile."""
        while not self.stopping.is_set():
            try:
                recs = c.read(self.topic, side, self.next[side], 1000)
            except NodeError as exc:
                if exc.code not in RETRYABLE:
                    raise
                self.stopping.wait(0.05)  # ok-sleep: back off while the node restarts
                continue
            if not recs:
                return True
            offsets = [r.offset for r in recs]
            if offsets != list(range(self.next[side], self.next[side] + len(recs))):
                with self.views.lock:
                    self.views.violations.append(
                        f"partition {side}: read from {self.next[side]} returned offsets "
                        f"{offsets[:5]}...")
            self.next[side] += len(recs)
            self.views.saw(side, (tag for r in recs if (tag := tag_of(r.value)) is not None))
        return False


# ---- the check -----------------------------------------------------------------------


@dataclass
class TxnCounts:
    committed: int = 0
    absent: int = 0
    in_doubt: int = 0
    lost_commits: int = 0  # commits and rollbacks answered only on a retry


def expected_positions(t: TxnLog, topic: str) -> dict[bytes, tuple[int, int]]:
    """Where a committed transaction's records must be: in each partition, in the order
    they were staged, from the first offset its commit answered."""
    staged: dict[int, list[bytes]] = {}
    for p, v in t.values:
        staged.setdefault(p, []).append(v)
    parts = {part.partition: part for part in t.parts if part.topic == topic}
    if parts.keys() != staged.keys() or len(parts) != len(t.parts):
        raise CheckFailed(f"transaction {t.tag} ({t.kind}) staged records in partitions "
                          f"{sorted(staged)}, but its commit answered {t.parts}")
    where: dict[bytes, tuple[int, int]] = {}
    for p, values in staged.items():
        part = parts[p]
        if part.record_count != len(values):
            raise CheckFailed(f"transaction {t.tag} ({t.kind}) staged {len(values)} records in "
                              f"partition {p}, but its commit answered {part}")
        for i, v in enumerate(values):
            where[v] = (p, part.first_offset + i)
    return where


def check_txns(c: NodeClient, topic: str, partitions: int, txn_producers: list[TxnProducer],
               plain: list[Ledger], src_topic: str, seen: set[str] | None = None) -> TxnCounts:
    """Raise ``CheckFailed`` unless, in ``topic``: offsets are contiguous; nothing is
    stored twice or was never sent; each plain producer's acknowledged record is at its
    offset; no transaction id was handed out twice; each committed transaction is whole at its commit's offsets; every other one
    is absent and, if ``seen`` (the transactions a reader saw) is given, was never seen;
    and each producer's group offset is that of its latest committed transaction."""
    where = positions(c, topic, partitions)
    ledgers = [*plain, *(tp.ledger for tp in txn_producers)]
    sent = set().union(*(ledger.sent for ledger in ledgers))
    unknown = set(where) - sent
    if unknown:
        raise CheckFailed(f"{len(unknown)} records were never sent, e.g. {sorted(unknown)[:3]}")
    for ledger in plain:
        for v, pos in ledger.acked.items():
            if where.get(v) != pos:
                raise CheckFailed(f"acknowledged {v!r} at {pos}, found at {where.get(v)}")
    told: dict[int, str] = {}
    for tp in txn_producers:
        for t in tp.txns:
            if t.txn_id and told.setdefault(t.txn_id, t.tag) != t.tag:
                raise CheckFailed(f"transaction id {t.txn_id} was handed out twice: to "
                                  f"{told[t.txn_id]} and to {t.tag}")
    counts = TxnCounts()
    for tp in txn_producers:
        latest: TxnLog | None = None
        for t in tp.txns:
            counts.lost_commits += t.lost_commit
            if t.fate is Fate.COMMITTED:
                counts.committed += 1
                check_committed(t, topic, where)
                if t.group_offset is not None and (latest is None or t.lsn > latest.lsn):
                    latest = t
                continue
            if t.fate is Fate.OPEN:
                raise CheckFailed(f"transaction {t.tag} ({t.kind}) never ended")
            counts.absent += t.fate is Fate.ABSENT
            counts.in_doubt += t.fate is Fate.IN_DOUBT
            present = [v for _p, v in t.values if v in where]
            if present:
                raise CheckFailed(f"transaction {t.tag} ({t.kind}, {t.fate.value}: {t.why}) is "
                                  f"visible: {len(present)} of its {len(t.values)} records, "
                                  f"e.g. {present[0]!r} at {where[present[0]]}")
            if seen is not None and t.tag in seen:
                raise CheckFailed(f"transaction {t.tag} ({t.kind}, {t.fate.value}: {t.why}) "
                                  f"was seen by the reader")
        want = None if latest is None else latest.group_offset
        got = answered(functools.partial(c.committed_offset, tp.group, src_topic, 0))
        if got != want:
            raise CheckFailed(f"group {tp.group} has offset {got} in {src_topic}, but its latest "
                              f"committed transaction "
                              f"{'(none)' if latest is None else latest.tag} staged {want}")
    return counts


def check_committed(t: TxnLog, topic: str, where: dict[bytes, tuple[int, int]]) -> None:
    expected = expected_positions(t, topic)
    found = [v for _p, v in t.values if v in where]
    if len(found) != len(t.values):
        raise CheckFailed(f"transaction {t.tag} ({t.kind}, {t.why} at LSN {t.lsn}) is partial: "
                          f"{len(found)} of its {len(t.values)} records are present")
    for _p, v in t.values:
        if where[v] != expected[v]:
            raise CheckFailed(f"transaction {t.tag} ({t.kind}, {t.why} at LSN {t.lsn}): {v!r} "
                              f"is at {where[v]}, its commit placed it at {expected[v]}")
    if t.client_offsets is not None and t.client_offsets != [expected[v] for _p, v in t.values]:
        raise CheckFailed(f"transaction {t.tag}: the client's offsets {t.client_offsets} are not "
                          f"those of the commit's parts")
