"""The protocol fuzz of tests/test_fuzz.py (its generator and its checks) sent to one node
whose checkpoints are ``blocking``.

There a checkpoint closes the transaction manager's gate and waits for every write in
flight and every transaction open and not prepared to end (up to
``checkpoint_timeout_ms``, then it gives up); meanwhile new writes are held (past
``held_requests_max`` refused BUSY), and a ``txn_begin``, ``xa_start`` or ``txn_once`` is
refused BUSY. The fuzz asks for checkpoints and transaction calls more often than
tests/test_fuzz.py does, and keeps fewer requests in flight, so that checkpoints start at
many moments: while transactions are open, with writes piling up at the closed gate
(some held past their ``request_timeout_ms``), and while transactions end (committed,
rolled back, timed out). The limits are short, so that a request left unanswered is found
in seconds: a transaction the fuzz leaves open is rolled back after ``TXN_TIMEOUT_MS``, a
checkpoint gives up after ``CHECKPOINT_TIMEOUT_MS``.

Checked, as for tests/test_fuzz.py: every request is answered exactly once, never
INTERNAL, with a known code and a message; a request the table refuses is refused; an
export is done; the front door then holds no request; the node creates a topic, produces
and reads back, and no actor has restarted. And for the mode: checkpoints asked for
completed (answered ok, counted by the log manager); once every answer came, the
transaction manager reports its gate open with nothing held, and every write it let
through told ended (none forgotten, none expired). After the fuzz, on the same node, a
transaction opened before a checkpoint keeps the checkpoint waiting at the closed gate,
with a produce held there, and commits; the checkpoint then completes and the produce is
stored after the transaction's record.

A failure names its seed (``-k 'seed-2'`` replays one on a new node).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from node.client import NodeClient
from node.local import LocalNode
from tests.conftest import module_node
from tests.test_fuzz import (
    CONFIG,
    OP_WEIGHTS,
    SEEDS,
    Exchange,
    Fuzzer,
    World,
    serves_and_nothing_restarted,
)
from wire.errors import TransactionConflict

if TYPE_CHECKING:
    from tests.conftest import MakeNode

REQUESTS_PER_SEED = 800
# limits.request_timeout_ms: short, so that a write held at the gate while a checkpoint
# waits may time out there (its late answer must not be a second one).
REQUEST_TIMEOUT_MS = 1500
# log.checkpoint_timeout_ms: a step waited for longer gives up. At 5 s, every checkpoint of
# a seed gave up on a busy machine once, their flushes slow (the node held some 400 shards,
# after many seeds in a row).
CHECKPOINT_TIMEOUT_MS = 10_000
SNAPSHOT_TIMEOUT_MS = 5000  # log.snapshot_timeout_ms: the front door waits 10 s past it
# txn.timeout_ms: a transaction the fuzz leaves open is rolled back within this (and the
# transaction manager's tick, about a second), well before a checkpoint waiting for it
# gives up. A begin may ask for up to TXN_TIMEOUT_MS_MAX (the fuzz's 60 s is refused);
# the transaction of the test after the fuzz does.
TXN_TIMEOUT_MS = 1000
TXN_TIMEOUT_MS_MAX = 2 * CHECKPOINT_TIMEOUT_MS
HELD_REQUESTS_MAX = 20  # txn.held_requests_max: small, so that the closed gate refuses some
IN_FLIGHT_MAX = 30  # answers awaited before more is sent: checkpoints start at many moments
# The longest the node may take to answer: an export's bound at the front door (a
# checkpoint's is 3 * CHECKPOINT_TIMEOUT_MS, a held write's REQUEST_TIMEOUT_MS), and the
# tick (about a second) that finds a request's time is up.
ANSWER_WAIT_MS = max(SNAPSHOT_TIMEOUT_MS + 10_000, 3 * CHECKPOINT_TIMEOUT_MS,
                     REQUEST_TIMEOUT_MS) + 2000
# For figures to be reported (every actor reports about once a second) and to settle.
STATUS_WAIT_S = 5.0
BLOCKING_CONFIG = f"""{CONFIG}request_timeout_ms = {REQUEST_TIMEOUT_MS}

[log]
checkpoint_mode = "blocking"
checkpoint_timeout_ms = {CHECKPOINT_TIMEOUT_MS}
snapshot_timeout_ms = {SNAPSHOT_TIMEOUT_MS}

[txn]
timeout_ms = {TXN_TIMEOUT_MS}
timeout_ms_max = {TXN_TIMEOUT_MS_MAX}
held_requests_max = {HELD_REQUESTS_MAX}
"""
# Checkpoints, and the calls that open and end transactions and XA branches, more often
# than tests/test_fuzz.py asks for them. (More of the latter, and a seed's requests were
# answered ok fewer than one time in ten now and then: most name a transaction that is not
# open, and the closed gate refuses begins BUSY.)
WEIGHTS = {**OP_WEIGHTS, "checkpoint": 3.0,
           **{op: 1.5 for op in ("txn_begin", "txn_commit", "txn_abort", "xa_start", "xa_end",
                                 "xa_prepare", "xa_commit", "xa_rollback")}}


@pytest.fixture(scope="module")
def blocking_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    with module_node(tmp_path_factory, "fuzz-blocking", BLOCKING_CONFIG) as n:
        yield n


def figures(c: NodeClient, role: str) -> dict[str, Any]:
    """The figures ``role`` last reported (about once a second)."""
    found: dict[str, Any] = next(a["figures"] for a in c.status()["actors"]
                                 if a["role"] == role)
    return found


def until(what: str, cond: Callable[[], Any], timeout_s: float = STATUS_WAIT_S,
          seen: Callable[[], object] = lambda: "") -> Any:
    """``cond()`` once it is true, asked every 50 ms for up to ``timeout_s``; a timeout
    names ``what`` and what ``seen()`` says was seen last."""
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what} {seen()}"
        time.sleep(0.05)  # ok-sleep: poll interval, under a deadline
    return got


def in_thread(results: dict[str, Any], name: str, call: Callable[[], Any]) -> threading.Thread:
    """``call()`` on a thread of its own; its result (or exception) in ``results[name]``."""
    def run() -> None:
        try:
            results[name] = call()
        except Exception as exc:  # the caller checks it, by name
            results[name] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def quiet(c: NodeClient) -> None:
    """Wait for the gate to be open with nothing held: a checkpoint the fuzz left running (a
    seed that failed before it waited for the gate to open) would answer a test's
    checkpoint when it ends, and open the gate under the write meant to be held there."""
    until("the gate open with nothing held", lambda: not (f := figures(c, "txn"))["gate"]
          and f["held"] == 0, timeout_s=3 * CHECKPOINT_TIMEOUT_MS / 1000)


def held_at_the_gate(node: LocalNode, c: NodeClient, what: str, write: Callable[[NodeClient], Any],
                     results: dict[str, Any]) -> tuple[threading.Thread, threading.Thread]:
    """With a transaction open: a checkpoint, which closes the gate and waits for it, then
    ``write`` on a client of its own, held at the gate; each on a thread (their results
    in ``results["checkpoint"]`` and ``results["held"]``), both waiting."""
    def on_its_client(call: Callable[[NodeClient], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with node.client(timeout_ms=ANSWER_WAIT_MS) as own:
                return call(own)
        return run

    ckpt = in_thread(results, "checkpoint", on_its_client(lambda own: own.checkpoint()))
    until("the gate to close", lambda: figures(c, "txn")["gate"])
    held = in_thread(results, "held", on_its_client(write))
    until(f"{what} to be held at the gate", lambda: figures(c, "txn")["held"])
    return ckpt, held


def joined(*threads: threading.Thread) -> None:
    for t in threads:
        t.join(ANSWER_WAIT_MS / 1000)


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed-{s}")
def test_bad_input_with_blocking_checkpoints_is_answered_and_the_node_keeps_serving(
        blocking_node: LocalNode, seed: int, tmp_path: Path) -> None:
    node = blocking_node
    world = World(seed, node.data_dir, tmp_path / "exports")
    with node.client() as c:
        world.make(c)
        before = figures(c, "log")["checkpoints"]
    fuzzer = Fuzzer(world, weights=WEIGHTS)
    ex = Exchange(node.endpoint, seed, answer_wait_ms=ANSWER_WAIT_MS,
                  in_flight_max=IN_FLIGHT_MAX)
    try:
        while ex.requests < REQUESTS_PER_SEED:
            ex.send(fuzzer.frame())
        ex.settle()
        settled = time.time()
        front = ex.front_door_figures()
    finally:
        ex.close()
    assert not ex.problems, "\n".join([f"{len(ex.problems)} problems:", *ex.problems[:40]])
    assert front.get("in_flight") == 0, f"seed {seed}: the front door still holds requests: {front}"
    # Not all refused: requests the table takes, answered ok, or refused by the closed gate
    # for want of room (BUSY past held_requests_max) or time (TIMEOUT, held past
    # request_timeout_ms), which under load answer some of a seed's valid requests (CI saw
    # seed 3 answered ok 80 times in 800).
    taken = sum(ex.codes.get(code, 0) for code in ("ok", "BUSY", "TIMEOUT"))
    assert taken > REQUESTS_PER_SEED // 10, ex.codes
    assert ex.ok_ops["snapshot_export"] >= 1, f"seed {seed}: no export done: {ex.codes}"
    # A checkpoint is answered ok once it completed (those asked for while one runs, when
    # that one does); the log manager counts it.
    assert ex.ok_ops["checkpoint"] >= 1, f"seed {seed}: no checkpoint completed: {ex.codes}"

    with node.client(timeout_ms=10_000) as c:
        # Reported after every answer came: the gate is open, nothing is held, and every
        # write it let through was told ended (none forgotten, none expired).
        last: dict[str, Any] = {}

        def settled_txn() -> dict[str, Any] | None:
            f = last["txn"] = figures(c, "txn")
            done = (f["reported_at"] > settled and not f["gate"] and f["held"] == 0
                    and f["active"] == 0 and f["began"] == f["ended"])
            return f if done else None
        txn = until(f"seed {seed}: the transaction manager to report its gate open with no "
                    f"write in flight", settled_txn, seen=lambda: last)
        assert txn["expired"] == 0, f"seed {seed}: writes forgotten: {txn}"
        until(f"seed {seed}: the log manager to count the checkpoints",
              lambda: figures(c, "log")["checkpoints"] > before)

    serves_and_nothing_restarted(node, seed)


def test_a_transaction_opened_before_a_checkpoint_commits_and_the_checkpoint_completes(
        blocking_node: LocalNode) -> None:
    """After the fuzz, on the same node: a transaction opened before a checkpoint keeps it
    waiting at the closed gate, where a produce is held; the transaction commits, then the
    checkpoint completes (its LSN past the commit's) and the produce goes on, after the
    transaction's record."""
    node = blocking_node
    topic = "gate"
    results: dict[str, Any] = {}
    with node.client(timeout_ms=10_000) as c:
        quiet(c)
        c.create_topic(topic, partitions=1)
        tx = c.transaction(timeout_ms=TXN_TIMEOUT_MS_MAX)
        tx.produce(topic, b"in the transaction")
        tx.settle()  # open on the node
        ckpt, held = held_at_the_gate(node, c, "the produce",
                                      lambda own: own.produce(topic, b"held"), results)
        assert ckpt.is_alive() and held.is_alive(), results  # both wait
        committed = tx.commit()
        joined(ckpt, held)
        assert type(results.get("checkpoint")) is int, results
        assert results["checkpoint"] >= committed.lsn, (results, committed)
        assert results.get("held") == (0, 1), results
        assert [r.value for r in c.read(topic, 0, 0)] == [b"in the transaction", b"held"]


def test_a_compare_and_set_commit_goes_ahead_of_a_put_of_its_key_held_at_the_gate(
        blocking_node: LocalNode) -> None:
    """A transaction with a compare-and-set on a key, open before a checkpoint, keeps the
    checkpoint waiting at the closed gate, where a plain put of the same key is held. The
    front door decides the commit ahead of the put (the put reaches the log after it): it
    commits, the checkpoint completes, and the put lands on top. (The commit waited for the
    put's answer, the put for the gate, the gate for the commit: the checkpoint gave up
    after checkpoint_timeout_ms, and the commit was refused TXN_CONFLICT or timed out.)"""
    node = blocking_node
    ns = "gate-kv"
    results: dict[str, Any] = {}
    with node.client(timeout_ms=10_000) as c:
        quiet(c)
        c.kv_put(ns, b"k", b"before")
        tx = c.transaction(timeout_ms=TXN_TIMEOUT_MS_MAX)
        tx.kv_cas(ns, b"k", b"before", b"by the transaction")
        tx.settle()  # open on the node
        ckpt, held = held_at_the_gate(node, c, "the put",
                                      lambda own: own.kv_put(ns, b"k", b"put at the gate"),
                                      results)
        assert ckpt.is_alive() and held.is_alive(), results  # both wait
        committed = tx.commit()
        joined(ckpt, held)
        assert type(results.get("checkpoint")) is int, results
        assert results["checkpoint"] >= committed.lsn, (results, committed)
        assert type(results.get("held")) is int and results["held"] > committed.lsn, results
        assert c.kv_get(ns, b"k") == b"put at the gate"


def test_a_compare_and_set_held_at_the_gate_and_a_transaction_s_on_one_value_not_both_swap(
        make_node: MakeNode) -> None:
    """A plain compare-and-set, decided at the front door and sent, is held at the gate; a
    transaction opened before the checkpoint has a compare-and-set on the same key from
    the same value. The commit is not decided ahead of the held write (it was, and both
    swapped: a lost update); it waits for it, the checkpoint gives up, the write lands and
    the commit is refused TXN_CONFLICT. Exactly one of the two swaps."""
    node = make_node(BLOCKING_CONFIG.replace(f"request_timeout_ms = {REQUEST_TIMEOUT_MS}",
                                             f"request_timeout_ms = {ANSWER_WAIT_MS}"))
    ns = "gate-cas"
    results: dict[str, Any] = {}
    with node.client(timeout_ms=ANSWER_WAIT_MS) as c:
        c.kv_put(ns, b"k", b"before")
        tx = c.transaction(timeout_ms=TXN_TIMEOUT_MS_MAX)
        tx.kv_cas(ns, b"k", b"before", b"by the transaction")
        tx.settle()
        ckpt, held = held_at_the_gate(
            node, c, "the compare-and-set",
            lambda own: own.kv_cas(ns, b"k", b"before", b"by the kv_cas"), results)
        try:
            tx.commit()
            committed = True
        except TransactionConflict:
            committed = False
        joined(ckpt, held)
        assert type(results.get("held")) is bool, results
        assert committed != results["held"], (committed, results)  # exactly one swapped
        assert c.kv_get(ns, b"k") == (b"by the transaction" if committed else b"by the kv_cas")
