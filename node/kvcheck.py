"""Crash checking of key/value state: writers that create namespaces, put, delete and
compare-and-set keys and commit KV transactions, each keeping a model of what the node
acknowledged, and the check that after any kill the node holds what the models allow.

Used by ``scripts/crashtest --kv``, beside the idempotent producers of
``node/crashcheck.py``; I/O through the public client only. Each writer owns its keys
(``<tag>/<n>``, ``KEYS`` of them in each namespace it writes): in a namespace all the
writers share, and in namespaces of its own that it creates as it runs (one a trial, by
``kv_create`` or by a first put) and drops once it has more than ``OWN_NAMESPACES_MAX``.
No one else writes its keys, so its model of each is the set of values the key may hold:

- a write answered ok (a put or delete, retried under its producer id and sequence number
  until answered; a compare-and-set that swapped; a transaction's commit) leaves exactly
  its value (None: absent);
- a write whose answer never came (a put sent once, a compare-and-set: neither is retried)
  may have been applied or not: the key may hold its old values or the new one, nothing
  else;
- a compare-and-set refused, a transaction rolled back (by its writer, by a conflict of its
  compare-and-sets, or by the node) changes nothing; a refused compare-and-set answers a
  value the key may hold, and one that expected the only value the key may hold, or a
  transaction whose conditions all held, must not be refused.

Values are unique (``<tag>.<op>``), so a value that appears where no write put it, or a
refused write applied, is seen. The writer checks what the node answers as it goes (a
failure stops it, surfaced by the trial); ``check_kv`` reads every key, by ``kv_scan`` and
by ``kv_get``, once the writers are idle.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from node.client import NodeClient
from node.crashcheck import RETRYABLE, CheckFailed, KillPoint, Producer
from node.txncheck import GONE, Gone, answered
from wire.errors import ErrorCode, NodeError, TopicExists, UnknownTopic

Value = bytes | None
Cell = tuple[str, bytes]  # (namespace, key)

KEYS = 12  # keys a writer owns in each namespace it writes
OWN_NAMESPACES_MAX = 3  # a writer drops its oldest namespace beyond this many
HISTORY_MAX = 8  # events kept per key, for the check's messages
TXN_TIMEOUT_MS = 30_000  # longer than any restart: only the node's restart ends these
TXN_WRITES_MAX = 4
# What a writer does in one step, and how often (a namespace is created once per trial, at a
# random step of it, and whenever armed at "create").
OPS = {
    "put": 25,  # retried under its sequence number until answered
    "put-once": 8,  # sent once: a lost answer leaves the key either way
    "delete": 10,  # retried until answered
    "cas": 20,  # expecting what the model says (a get first when it allows several)
    "cas-refused": 6,  # expecting a value the key never had: must be refused
    "txn": 15,  # a local transaction of 1-4 key writes, maybe over two namespaces
    "txn-conflict": 4,  # one whose compare-and-set cannot hold: TXN_CONFLICT, nothing applied
    "txn-abort": 4,  # staged, then rolled back by the writer
}
POINTS = ("create", "kv-commit")  # where a writer can be armed to signal a kill


@dataclass
class KvCounts:
    acked: int = 0  # writes answered ok (puts, deletes, swaps, committed transactions' writes)
    retried: int = 0  # of them, answered only on a retry
    unanswered: int = 0  # writes sent once whose answer never came
    swapped: int = 0
    refused: int = 0  # compare-and-sets refused, as expected
    committed: int = 0  # transactions
    rolled_back: int = 0  # transactions rolled back: by their writer, a conflict or the node
    created: int = 0  # namespaces
    dropped: int = 0

    def add(self, other: KvCounts) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class KvModel:
    """What one writer's keys may hold, and its namespaces. No I/O."""

    tag: str
    namespaces: list[str] = field(default_factory=list)  # alive: the shared one first
    dropped: list[str] = field(default_factory=list)
    possible: dict[Cell, frozenset[Value]] = field(default_factory=dict)
    history: dict[Cell, collections.deque[str]] = field(default_factory=dict)

    def key(self, n: int) -> bytes:
        return f"{self.tag}/{n}".encode()

    def may(self, cell: Cell) -> frozenset[Value]:
        return self.possible.get(cell, frozenset({None}))

    def note(self, cell: Cell, event: str) -> None:
        self.history.setdefault(cell, collections.deque(maxlen=HISTORY_MAX)).append(event)

    def acked(self, cell: Cell, value: Value, event: str) -> None:
        self.possible[cell] = frozenset({value})
        self.note(cell, event)

    def lost(self, cell: Cell, value: Value, event: str) -> None:
        self.possible[cell] = self.may(cell) | {value}
        self.note(cell, event)

    def unsettled(self) -> int:
        """How many keys of its namespaces may hold more than one value."""
        return sum(
            len(may) > 1 for (ns, _key), may in self.possible.items() if ns in self.namespaces
        )

    def drop(self, namespace: str) -> None:
        self.namespaces.remove(namespace)
        self.dropped.append(namespace)
        for cell in [cell for cell in self.possible if cell[0] == namespace]:
            del self.possible[cell]

    def allows(self, cell: Cell, value: Value, where: str) -> None:
        """Raise ``CheckFailed`` unless ``cell`` may hold ``value`` (as ``where`` found it)."""
        may = self.may(cell)
        if value in may:
            return
        ns, key = cell
        said = " ".join(f"[{e}]" for e in self.history.get(cell, ())) or "never written"
        raise CheckFailed(
            f"{where}: key {key!r} of namespace {ns!r} holds {value!r}; its writer "
            f"{self.tag} allows only {sorted(may, key=repr)} (its last writes: {said})"
        )


@dataclass
class Step:
    """What a writer was doing when it reached a kill point, and how that ended."""

    what: str
    outcome: str = "under way"

    def __str__(self) -> str:
        return f"{self.what}: {self.outcome}"


class KvWriter(Producer):
    """Runs numbered steps of random kinds (``OPS``, from its own seeded random) until
    stopped or done: the ``batches`` of ``Producer`` are steps here. ``arm(point)`` makes
    it signal, once, when it reaches a kill point of ``POINTS``."""

    def __init__(self, endpoint: str, name: str, shared: str, seed: int) -> None:
        super().__init__(endpoint, shared, name, 0, None, batches_max=0)
        self.rng = random.Random(seed)
        self.model = KvModel(name, [shared])
        self.counts = KvCounts()
        self.made = 0  # namespaces of its own created so far
        self.create_at = -1  # the step of this trial that creates a namespace
        self.kill: KillPoint[Step] = KillPoint()

    def allow(self, more: int) -> None:
        """As ``Producer.allow``; and one of the ``more`` steps creates a namespace."""
        self.create_at = self.done_batches + self.rng.randrange(max(more, 1))
        super().allow(more)

    # ---- kill points ------------------------------------------------------------------

    def arm(self, point: str) -> threading.Event:
        """Signal the returned event when next reaching ``point``: ``create`` (just before
        a namespace's creation is sent) or ``kv-commit`` (just before a transaction's commit
        is sent)."""
        assert point in POINTS
        return self.kill.arm(point)

    def release(self) -> None:
        self.kill.disarm()

    @property
    def fired_in(self) -> Step | None:
        return self.kill.fired_in

    def reached(self, point: str, step: Step) -> None:
        self.kill.reach(point, step)

    # ---- one step ---------------------------------------------------------------------

    def write(self, c: NodeClient, b: int) -> None:
        point = self.kill.armed_at()
        if point == "create" or b == self.create_at:
            self.create(c, b)
            return
        kind = "txn" if point == "kv-commit" else self.rng.choices(list(OPS), list(OPS.values()))[0]
        match kind:
            case "put" | "delete":
                self.put(c, b, kind)
            case "put-once":
                self.put_once(c, b)
            case "cas":
                self.cas(c, b)
            case "cas-refused":
                self.cas_refused(c, b)
            case "txn" | "txn-conflict" | "txn-abort":
                self.txn(c, b, kind)
            case _:
                raise AssertionError(f"unknown step {kind!r}")

    def cell(self, namespace: str | None = None) -> Cell:
        ns = namespace if namespace is not None else self.rng.choice(self.model.namespaces)
        return ns, self.model.key(self.rng.randrange(KEYS))

    def value(self, b: int, i: int | None = None) -> bytes:
        return f"{self.tag}.{b}".encode() if i is None else f"{self.tag}.{b}.{i}".encode()

    def retried(self, fn: Callable[[], object], lost: list[int]) -> None:
        """``fn`` until answered (``answered``), counted as an acknowledged write."""
        answered(fn, lost)
        self.counts.acked += 1
        self.counts.retried += lost[0] > 0

    def put(self, c: NodeClient, b: int, kind: str) -> None:
        """A put or a delete, sent again under its sequence number until it is answered: the
        node answers a retry as it did the first attempt, without logging it twice."""
        (ns, key), lost = self.cell(), [0]
        value = self.value(b) if kind == "put" else None
        fields = {"value": value} if kind == "put" else {}
        self.retried(
            functools.partial(
                c.call,
                f"kv_{kind}",
                namespace=ns,
                key=key,
                producer_id=c.producer_id,
                seq=c.next_seq(),
                **fields,
            ),
            lost,
        )
        self.model.acked(
            (ns, key), value, f"{b}: {kind} {value!r} ok" + (" on a retry" if lost[0] else "")
        )

    def put_once(self, c: NodeClient, b: int) -> None:
        cell, value = self.cell(), self.value(b)
        try:
            c.kv_put(*cell, value)
        except NodeError as exc:
            if exc.code not in RETRYABLE:
                raise
            self.counts.unanswered += 1
            self.model.lost(cell, value, f"{b}: put {value!r} unanswered ({exc.code.name})")
            return
        self.counts.acked += 1
        self.model.acked(cell, value, f"{b}: put {value!r} ok")

    def expected(self, c: NodeClient, cell: Cell) -> tuple[Value, bool]:
        """The value to expect: the model's when it allows one, else what a get answers
        (which it must allow). And whether the model allowed only that one."""
        may = self.model.may(cell)
        if len(may) == 1:
            return next(iter(may)), True
        got = answered(functools.partial(c.kv_get, *cell))
        self.model.allows(cell, got, f"writer {self.tag}: a get")
        return got, False

    def cas(self, c: NodeClient, b: int) -> None:
        cell = self.cell()
        expected, only = self.expected(c, cell)
        new = None if expected is not None and self.rng.random() < 0.2 else self.value(b)
        said = f"cas {expected!r} -> {new!r}"
        try:
            reply = c.call("kv_cas", namespace=cell[0], key=cell[1], expected=expected, new=new)
        except NodeError as exc:
            if exc.code not in RETRYABLE:
                raise
            self.counts.unanswered += 1
            self.model.lost(cell, new, f"{b}: {said} unanswered ({exc.code.name})")
            return
        if reply["swapped"]:
            self.counts.acked += 1
            self.counts.swapped += 1
            self.model.acked(cell, new, f"{b}: {said} swapped")
            return
        found = reply.get("value")
        if only or found == expected:
            raise CheckFailed(
                f"writer {self.tag}: {said} of key {cell[1]!r} in {cell[0]!r} "
                f"was refused, finding {found!r}; the key may hold only "
                f"{sorted(self.model.may(cell), key=repr)}"
            )
        self.model.allows(cell, found, f"writer {self.tag}: a refused {said}")
        self.counts.refused += 1
        self.model.note(cell, f"{b}: {said} refused, found {found!r}")

    def cas_refused(self, c: NodeClient, b: int) -> None:
        cell, value = self.cell(), self.value(b)
        expected = b"never:" + value  # no write puts such a value
        try:
            reply = c.call("kv_cas", namespace=cell[0], key=cell[1], expected=expected, new=value)
        except NodeError as exc:
            if exc.code not in RETRYABLE:
                raise
            self.model.note(cell, f"{b}: cas {expected!r} -> {value!r} unanswered")
            return  # it cannot have swapped: the key never held ``expected``
        if reply["swapped"]:
            raise CheckFailed(
                f"writer {self.tag}: cas {expected!r} -> {value!r} of key "
                f"{cell[1]!r} in {cell[0]!r} swapped; no write ever put "
                f"{expected!r}"
            )
        self.model.allows(cell, reply.get("value"), f"writer {self.tag}: a refused cas")
        self.counts.refused += 1
        self.model.note(cell, f"{b}: cas {expected!r} -> {value!r} refused")

    def txn(self, c: NodeClient, b: int, kind: str) -> None:
        """A local transaction of key writes over one or two namespaces: committed (half
        the time once its writes are staged on the node, else begin, writes and commit go
        together), one whose compare-and-set cannot hold, or one rolled back."""
        spaces = self.rng.sample(self.model.namespaces, min(2, len(self.model.namespaces)))
        n = self.rng.randint(1, TXN_WRITES_MAX)
        cells = list(dict.fromkeys(self.cell(self.rng.choice(spaces)) for _ in range(n)))
        writes: list[tuple[Cell, Value]] = []
        expects: dict[Cell, Value] = {}  # the compare-and-sets' expected values
        for i, cell in enumerate(cells):
            may = self.model.may(cell)
            writes.append((cell, None if self.rng.random() < 0.25 else self.value(b, i)))
            if kind == "txn-conflict" and i == 0:
                expects[cell] = b"never:" + self.value(b, i)
            elif len(may) == 1 and self.rng.random() < 0.4:
                expects[cell] = next(iter(may))
        staged_first = self.rng.random() < 0.5 or kind == "txn-abort"
        # The front door's pid before anything of it is sent: one that restarts meanwhile
        # forgets its conditions (a call sends a transaction's queued requests first).
        front = front_pid(c) if expects else 0
        tx = c.transaction(timeout_ms=TXN_TIMEOUT_MS)
        for cell, value in writes:
            if cell in expects:
                tx.kv_cas(*cell, expects[cell], value)
            elif value is None:
                tx.kv_delete(*cell)
            else:
                tx.kv_put(*cell, value)
        step = Step(
            f"{self.tag}.{b}, {kind} of {len(writes)} key write{'s' if len(writes) > 1 else ''}"
        )
        if staged_first:
            try:
                tx.settle()
            except NodeError as exc:  # the commit (or rollback) tells what became of it
                if exc.code not in RETRYABLE and exc.code not in GONE:
                    raise
        if kind == "txn-abort":
            try:
                tx.abort()
            except NodeError as exc:  # lost, or ended already: rolled back all the same
                if exc.code not in RETRYABLE and exc.code not in GONE:
                    raise
            self.rolled_back(b, writes, step, "rolled back by its writer")
            return
        self.reached("kv-commit", step)
        lost = [0]
        try:
            answered(tx.commit, lost)
        except Gone as exc:
            self.rolled_back(
                b, writes, step, f"{exc.code.name}" + (" after a lost answer" if lost[0] else "")
            )
            return
        except NodeError as exc:
            if exc.code is not ErrorCode.TXN_CONFLICT:
                raise
            # A front door that restarted since the writes were sent lost their conditions:
            # the node refuses to commit unchecked, and the transaction stays open. (A lost
            # answer that the transaction sent again within ``commit`` is not counted in
            # ``lost``: it shows as the front door restarted.)
            restarted = front != 0 and front_pid(c) != front
            if kind != "txn-conflict" and not (expects and (lost[0] or restarted)):
                raise CheckFailed(
                    f"writer {self.tag}: transaction {b}'s commit answered "
                    f"TXN_CONFLICT, but each of its compare-and-sets expected "
                    f"the only value its key may hold"
                ) from exc
            with contextlib.suppress(NodeError):  # else its timeout rolls it back
                c.call("txn_abort", txn=tx.id)
            why = "TXN_CONFLICT" + (" after a lost answer" if lost[0] else "")
            self.rolled_back(
                b, writes, step, why + (" (the front door restarted)" if restarted else "")
            )
            return
        if kind == "txn-conflict":
            raise CheckFailed(
                f"writer {self.tag}: transaction {b} committed, but its "
                f"compare-and-set expected a value no write ever put"
            )
        step.outcome = "committed" + (" on a retry" if lost[0] else "")
        self.counts.committed += 1
        self.counts.acked += len(writes)
        self.counts.retried += len(writes) if lost[0] else 0
        for cell, value in writes:
            self.model.acked(cell, value, f"{b}: transaction's write of {value!r} {step.outcome}")

    def rolled_back(self, b: int, writes: list[tuple[Cell, Value]], step: Step, why: str) -> None:
        step.outcome = why
        self.counts.rolled_back += 1
        for cell, value in writes:
            self.model.note(cell, f"{b}: transaction's write of {value!r}: {why}")

    def answered_once(self, call: Callable[[], object], done: type[NodeError],
                      wrong: str) -> int:
        """``call`` until answered (``answered``: a lost answer sent again); the error
        ``done`` says its effect is there: an earlier attempt's whose answer was lost, or,
        if none was lost, the node's mistake (``wrong`` says which). The answers lost."""
        lost = [0]
        try:
            answered(call, lost)
        except done:
            if not lost[0]:
                raise CheckFailed(f"writer {self.tag}: {wrong}") from None
        return lost[0]

    def create(self, c: NodeClient, b: int) -> None:
        """A namespace of its own, by ``kv_create`` or by a first put; then the oldest of its
        own dropped if it has more than ``OWN_NAMESPACES_MAX``."""
        ns = f"kv-{self.tag}-{self.made}"
        self.made += 1
        explicit = self.rng.random() < 0.5
        step = Step(f"{ns}, by {'kv_create' if explicit else 'a first put'}")
        self.reached("create", step)
        if explicit:
            lost_answers = self.answered_once(functools.partial(c.kv_create, ns), TopicExists,
                                              f"creating {ns!r} answered that it exists; "
                                              f"nothing created it before")
            step.outcome = "created" + (" on a retry" if lost_answers else "")
            self.model.namespaces.append(ns)
        else:
            lost = [0]
            self.model.namespaces.append(ns)
            cell, value = (ns, self.model.key(0)), self.value(b)
            self.retried(
                functools.partial(
                    c.call,
                    "kv_put",
                    namespace=ns,
                    key=cell[1],
                    value=value,
                    producer_id=c.producer_id,
                    seq=c.next_seq(),
                ),
                lost,
            )
            self.model.acked(cell, value, f"{b}: put {value!r} creating the namespace, ok")
            step.outcome = "created by its first put" + (" on a retry" if lost[0] else "")
        self.counts.created += 1
        own = self.model.namespaces[1:]
        if len(own) > OWN_NAMESPACES_MAX:
            self.drop(c, own[0])

    def drop(self, c: NodeClient, ns: str) -> None:
        self.answered_once(functools.partial(c.kv_drop, ns), UnknownTopic,
                           f"dropping {ns!r} answered that it does not exist; it was "
                           f"created and not dropped")
        self.model.drop(ns)
        self.counts.dropped += 1


def front_pid(c: NodeClient) -> int:
    """The pid of the node's front door, as its status says."""
    actors = answered(c.status)["actors"]
    return next(int(a["pid"]) for a in actors if a["role"] == "front")


# ---- the check -----------------------------------------------------------------------


def check_kv(c: NodeClient, models: Sequence[KvModel], dropped_checked: int = 2) -> int:
    """Raise ``CheckFailed`` unless every namespace alive in a model is listed and every
    dropped one is not; each key a model knows holds, read by ``kv_scan`` and by ``kv_get``,
    a value the model allows; and no namespace holds a key no writer wrote. The last
    ``dropped_checked`` namespaces each writer dropped must answer no value to ``kv_get``.
    Returns how many keys were checked. Call it while the writers are idle."""
    listed = set(answered(c.kv_namespaces))
    alive = {ns for m in models for ns in m.namespaces}
    for m in models:
        missing = [ns for ns in m.namespaces if ns not in listed]
        if missing:
            raise CheckFailed(
                f"writer {m.tag}'s namespaces {missing} are not listed "
                f"(kv_namespaces: {sorted(listed)})"
            )
        back = [ns for ns in m.dropped if ns in listed]
        if back:
            raise CheckFailed(f"writer {m.tag} dropped namespaces {back}, but they are listed")
    stored = {
        ns: dict(answered(functools.partial(c.kv_scan, ns, limit=100_000))) for ns in sorted(alive)
    }
    checked = 0
    for m in models:
        for ns in m.namespaces:
            for n in range(KEYS):
                cell = (ns, m.key(n))
                m.allows(cell, stored[ns].pop(cell[1], None), "kv_scan")
                m.allows(cell, answered(functools.partial(c.kv_get, *cell)), "kv_get")
                checked += 1
        for ns in m.dropped[-dropped_checked:]:
            for n in range(KEYS):
                got = answered(functools.partial(c.kv_get, ns, m.key(n)))
                if got is not None:
                    raise CheckFailed(
                        f"kv_get of key {m.key(n)!r} of namespace {ns!r}, "
                        f"dropped by writer {m.tag}, answered {got!r}"
                    )
    for ns, rest in stored.items():
        if rest:
            raise CheckFailed(
                f"namespace {ns!r} holds {len(rest)} keys no writer wrote, e.g. "
                f"{sorted(rest.items())[:3]}"
            )
    return checked
