"""What the front door's key/value part holds stays bounded, and nothing it holds outlives
what it waits for (``KvDoor``, actors/front_kv.py), without sockets: the transactions and
XA branches begun here, transactions' compare-and-sets, and the keys a checked commit that
timed out holds."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from actors import front_kv
from actors.front_state import FrontDoorState
from actors.instructions import Produce, Reply, Request
from actors.roles import TRANSACTION_MANAGER
from config import load_config
from wire.errors import ErrorCode
from wire.messages import (
    Catalog,
    Done,
    ErrorReply,
    KvGet,
    RecordsReply,
    TxnAsk,
    TxnBegin,
    TxnCommitted,
    TxnId,
    TxnOutcome,
    TxnStep,
    TxnTable,
    TxnWrite,
    TxnWritten,
)
from wire.protocol import Topic

ID = b"client-1"
CFG = 3  # the topic id of namespace "cfg"
TIMEOUT_S = 1.0  # limits.request_timeout_ms, below


def state(**limits: int) -> FrontDoorState:
    cfg = load_config(overrides={"limits": {"request_timeout_ms": int(TIMEOUT_S * 1000),
                                            **limits}})
    s = FrontDoorState(cfg)
    s.catalog(Catalog(7, [Topic("t", 4, 1), Topic("kv:cfg", 1, CFG)], 7))
    return s


def req(op: str, rid: int = 1, **fields: Any) -> list[bytes]:
    return [msgpack.packb({"op": op, "id": rid, **fields}, use_bin_type=True)]


def reply_of(out: Any) -> dict[str, Any]:
    assert isinstance(out, Reply) and out.identity == ID
    decoded: dict[str, Any] = msgpack.unpackb(out.frame, raw=False)
    return decoded


def sent(outs: list[Any]) -> Request:
    (out,) = outs
    assert isinstance(out, Request), out
    return out


def begin(s: FrontDoorState, txn: int, now: float = 0.0) -> None:
    b = sent(s.request(ID, req("txn_begin", rid=txn, txn=txn), now=now))
    (rep,) = s.answer(TxnId(b.corr, txn))
    assert reply_of(rep)["txn"] == txn


def cas(s: FrontDoorState, txn: int, seq: int, key: bytes = b"k", expected: bytes = b"old",
        now: float = 0.0) -> Any:
    """A compare-and-set staged in transaction ``txn`` (its write answered), or the reply
    that refused it."""
    (out,) = s.request(ID, req("txn_kv", rid=100 + seq, txn=txn, seq=seq, namespace="cfg",
                               key=key, value=b"new", expected=expected), now=now)
    if isinstance(out, Request):
        assert isinstance(out.msg, TxnWrite) and out.msg.conditional
        (rep,) = s.answer(TxnWritten(out.corr, 3, seq + 1))
        assert reply_of(rep)["ok"] is True
    return out


# ---- A: the transactions and XA branches begun here --------------------------------


def test_refused_begins_are_forgotten_and_leave_the_branch_that_holds_the_id_alone() -> None:
    """A begin is remembered as it is sent (writes sent behind it in the same frame name
    its namespaces), and forgotten if the transaction manager refuses it. Remembered,
    100 000 xa_start naming one transaction id and distinct xids (all but the first
    refused XAER_DUPID) took the front door from 33 to 81 MB for good, and 65 536 refused
    begins filled the table of transactions: every commit after them counted as one that
    may change any namespace."""
    s = state()
    first = sent(s.request(ID, req("xa_start", rid=1, txn=7, xid=[1, b"g", b"b0"]), now=0.0))
    s.answer(TxnId(first.corr, 7))
    for i in range(1, 50):
        r = sent(s.request(ID, req("xa_start", rid=1 + i, txn=7, xid=[1, b"g", b"b%d" % i]),
                           now=0.0))
        (rep,) = s.answer(ErrorReply(r.corr, ErrorCode.XAER_DUPID, "transaction id 7 is in use"))
        assert reply_of(rep)["code"] == ErrorCode.XAER_DUPID
        assert s.errors == i
    for txn in range(100, 150):
        r = sent(s.request(ID, req("txn_begin", rid=txn, txn=txn), now=0.0))
        (rep,) = s.answer(ErrorReply(r.corr, ErrorCode.TXN_LIMIT, "txn.open_max"))
        assert reply_of(rep)["code"] == ErrorCode.TXN_LIMIT
    assert s.kv.xids == {(1, b"g", b"b0"): 7}
    assert list(s.kv.txns) == [7] and s.kv.xa == {7}  # the branch that holds it, still XA
    assert not s.pending


def test_the_xid_table_is_bounded_like_the_table_of_transactions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Begins not answered yet (or that timed out: they may have begun) are remembered up
    to TXNS_REMEMBERED_MAX, xids as transactions: only the transactions were bounded."""
    monkeypatch.setattr(front_kv, "TXNS_REMEMBERED_MAX", 4)
    s = state()
    for i in range(10):
        s.request(ID, req("xa_start", rid=1 + i, txn=7, xid=[1, b"g", b"b%d" % i]), now=0.0)
    assert len(s.kv.xids) <= 4 and len(s.kv.txns) <= 4


def test_transactions_begun_here_are_forgotten_once_they_must_have_ended() -> None:
    """A transaction whose client went away, or whose begin timed out, is rolled back by
    the transaction manager within txn.timeout_ms_max, unseen here: it is forgotten twice
    that long after its begin (on the front door's tick), and its commit, if one still
    came, counts as one that may change any namespace."""
    s = state()
    begin(s, 5)
    assert isinstance(cas(s, 5, 0), Request)
    timed_out = sent(s.request(ID, req("xa_start", rid=9, txn=6, xid=[1, b"g", b"x"]), now=0.0))
    (rep,) = s.expire(TIMEOUT_S)
    assert reply_of(rep)["code"] == ErrorCode.TIMEOUT
    assert set(s.kv.txns) == {5, 6} and list(s.kv.xids) == [(1, b"g", b"x")]  # may have begun
    s.answer(TxnId(timed_out.corr, 6))  # its late answer changes nothing
    later = s.kv.cond_horizon_s + 1
    assert s.tick(later) == []
    assert (s.kv.txns, s.kv.xids, s.kv.xa, s.kv.conds, s.kv.cond_bytes) == ({}, {}, set(), {}, 0)
    commit = sent(s.request(ID, req("txn_commit", rid=10, txn=5), now=later))
    assert isinstance(commit.msg, TxnStep) and not commit.msg.checked  # refused there
    assert s.kv.state.commits_anywhere == 1


def test_a_begin_sent_again_after_a_timeout_keeps_the_namespaces_of_its_writes() -> None:
    """A begin that timed out may have begun its transaction, and its writes may be staged:
    it is not forgotten then (a retry of the begin would remember the transaction as
    writing no namespace, and its commit would leave the cache serving stale values)."""
    s = state()
    b = sent(s.request(ID, req("txn_begin", rid=1, txn=5), now=0.0))
    assert isinstance(b.msg, TxnBegin)
    put = sent(s.request(ID, req("txn_kv", rid=2, txn=5, seq=0, namespace="cfg", key=b"k",
                                 value=b"v"), now=0.0))
    s.answer(TxnWritten(put.corr, 3, 1))
    s.expire(TIMEOUT_S)
    begin(s, 5, now=2.0)
    sent(s.request(ID, req("txn_commit", rid=3, txn=5), now=2.0))
    assert s.kv.state.blocked(CFG) and s.kv.state.commits_anywhere == 0


# ---- B: transactions' compare-and-sets ---------------------------------------------


@pytest.mark.parametrize("op, fields", [
    ("txn_kv", {"txn": 5, "seq": 0, "value": b"new", "expected": b"x" * 1001}),
    ("kv_cas", {"new": b"new", "expected": b"x" * 1001}),
])
def test_an_expected_value_over_the_limit_is_refused_as_a_value_is(
        op: str, fields: dict[str, Any]) -> None:
    """``expected`` is a value: over limits.value_bytes_max it is refused BAD_REQUEST, as
    ``value`` and ``new`` are. It was not checked: 20 txn_kv with an `expected` of 15 MiB
    (the limit is 12) were taken, and the front door went from 33 to 396 MB for good."""
    s = state(value_bytes_max=1000)
    (rep,) = s.request(ID, req(op, rid=8, namespace="cfg", key=b"k", **fields), now=0.0)
    reply = reply_of(rep)
    assert (reply["ok"], reply["code"]) == (False, ErrorCode.BAD_REQUEST), reply
    assert "1001 bytes" in reply["error"] and "value_bytes_max" in reply["error"]
    assert not s.pending and not s.kv.conds and not s.kv.state.lines


def test_the_conditions_held_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """What transactions' compare-and-sets hold here, counted in bytes, is bounded: past
    CONDS_BYTES_MAX a compare-and-set is refused TXN_LIMIT before it is staged, with room
    again once a transaction ends. Nothing counted them (``txn_list`` said 190 bytes of a
    transaction holding 15 MiB here)."""
    monkeypatch.setattr(front_kv, "CONDS_BYTES_MAX", 3000)
    s = state(value_bytes_max=1000)
    for txn in (1, 2):
        begin(s, txn)
        assert isinstance(cas(s, txn, 0, expected=b"x" * 1000), Request)
    assert s.kv.cond_bytes == 2 * (1 + 1000 + front_kv.COND_OVERHEAD_BYTES)
    begin(s, 3)
    reply = reply_of(cas(s, 3, 0, expected=b"x" * 1000))
    assert reply["code"] == ErrorCode.TXN_LIMIT, reply
    assert "bytes" in reply["error"] and "CONDS_BYTES_MAX" in reply["error"], reply
    assert reply_of(cas(s, 1, 1, key=b"j", expected=b"x" * 1000))["code"] == ErrorCode.TXN_LIMIT
    assert 3 not in s.kv.conds and len(s.kv.conds[1]) == 1
    abort = sent(s.request(ID, req("txn_abort", rid=9, txn=1), now=0.0))
    assert s.kv.cond_bytes == 1 + 1000 + front_kv.COND_OVERHEAD_BYTES
    s.answer(Done(abort.corr, 9))
    assert isinstance(cas(s, 3, 0, expected=b"x" * 1000), Request)


def test_conditions_are_let_go_when_their_transaction_ends_in_any_way() -> None:
    """Committed (checked and sent, or refused TXN_CONFLICT), rolled back, or rolled back
    by its timeout unseen here (forgotten on the tick, not only when another conditional
    transaction comes): nothing of its conditions stays, counted or held."""
    s = state()
    # Committed: checked on the key's value, and sent.
    begin(s, 1)
    assert isinstance(cas(s, 1, 0), Request)
    load = sent(s.request(ID, req("txn_commit", rid=20, txn=1), now=0.0))
    assert isinstance(load.msg, KvGet)
    commit = sent(s.answer(RecordsReply(load.corr, msgpack.packb([[b"k", b"old"]]), 4)))
    assert isinstance(commit.msg, TxnStep) and commit.msg.checked
    assert s.kv.cond_bytes > 0 and not s.kv.commits and not s.kv.conds  # with the commit
    (rep,) = s.answer(TxnCommitted(commit.corr, 8, []))
    assert reply_of(rep)["ok"] is True
    assert s.kv.cond_bytes == 0
    # Refused: the value is not the one expected.
    begin(s, 2)
    assert isinstance(cas(s, 2, 0, expected=b"other"), Request)
    load = sent(s.request(ID, req("txn_commit", rid=21, txn=2), now=0.0))
    rollback = sent(s.answer(RecordsReply(load.corr, msgpack.packb([[b"k", b"new"]]), 9)))
    assert isinstance(rollback.msg, TxnStep) and rollback.msg.step == "rollback"
    assert s.kv.cond_bytes == 0
    # Rolled back by its client.
    begin(s, 3)
    assert isinstance(cas(s, 3, 0), Request)
    sent(s.request(ID, req("txn_abort", rid=22, txn=3), now=0.0))
    assert s.kv.cond_bytes == 0 and not s.kv.conds
    # Rolled back by its timeout, unseen here.
    begin(s, 4)
    assert isinstance(cas(s, 4, 0), Request)
    assert s.kv.cond_bytes > 0
    s.tick(s.kv.cond_horizon_s + 1)
    assert (s.kv.conds, s.kv.cond_since, s.kv.cond_bytes) == ({}, {}, 0)


# ---- C: a checked commit that timed out --------------------------------------------


def timed_out_commit(s: FrontDoorState) -> Request:
    """A transaction with a compare-and-set on "k", checked and sent, whose wait expired
    (the client was answered TIMEOUT): the commit that may still be applied."""
    begin(s, 5)
    assert isinstance(cas(s, 5, 0), Request)
    load = sent(s.request(ID, req("txn_commit", rid=20, txn=5, writes=1), now=0.0))
    commit = sent(s.answer(RecordsReply(load.corr, msgpack.packb([[b"k", b"old"]]), 4)))
    assert isinstance(commit.msg, TxnStep) and commit.msg.checked
    (rep,) = s.expire(TIMEOUT_S)
    assert reply_of(rep)["code"] == ErrorCode.TIMEOUT
    return commit


def put_k(s: FrontDoorState, now: float) -> list[Any]:
    return s.request(ID, req("kv_put", rid=30, namespace="cfg", key=b"k", value=b"mine",
                             producer_id=1, seq=0), now=now)


def test_a_checked_commit_that_timed_out_is_asked_about_and_its_keys_let_go() -> None:
    """Its keys stayed held until a late answer, which may never come: every put of them and
    every other conditional commit timed out after it, for good. Now the front door asks
    the transaction manager how the transaction ended (``TxnAsk``, which changes nothing)
    and lets go on the answer. Until then its keys stay held and its namespace is not
    answered from the cache (the commit may yet be applied: a put logged before it would
    be overwritten by a commit checked against an older value, and a cached value would
    be stale)."""
    s = state()
    timed_out_commit(s)
    assert put_k(s, 1.5) == []  # held
    assert s.kv.state.blocked(CFG)
    assert s.tick(1.5) == []  # not yet: its late answer may still come
    ask = sent(s.tick(30.0))
    assert ask.role == TRANSACTION_MANAGER and ask.msg == TxnAsk(ask.corr, 5)
    assert s.tick(40.0) == []  # one question at a time
    assert s.kv.state.blocked(CFG)
    (put,) = s.answer(TxnCommitted(ask.corr, 40, []))
    assert isinstance(put, Produce)  # the put goes on, after the commit
    assert s.lsn_seen >= 40 and not s.kv.state.blocked(CFG)
    assert (s.kv.late_commit, s.kv.deciding, s.kv.state.barred) == (None, False, set())
    assert (s.kv.conds, s.kv.cond_bytes) == ({}, 0)  # committed: its conditions let go


def test_conditions_of_a_commit_that_timed_out_waiting_its_turn_stay_counted() -> None:
    """A conditional commit waiting behind another one, whose wait expires, gives its
    conditions back to the table, for a retry to be decided on them: still counted, and
    let go when its transaction ends."""
    s = state()
    timed_out_commit(s)  # holds its keys: the next one waits its turn
    begin(s, 6, now=0.5)
    assert isinstance(cas(s, 6, 0, key=b"j", now=0.5), Request)
    assert s.request(ID, req("txn_commit", rid=21, txn=6), now=0.5) == []
    one = 1 + 3 + front_kv.COND_OVERHEAD_BYTES  # (the commit that timed out holds one)
    assert s.kv.cond_bytes == 2 * one
    (rep,) = s.expire(1.5)
    assert reply_of(rep)["code"] == ErrorCode.TIMEOUT
    assert not s.kv.commits and s.kv.conds[6] == [(CFG, b"j", b"old")]
    assert s.kv.cond_bytes == 2 * one
    sent(s.request(ID, req("txn_abort", rid=22, txn=6), now=1.6))
    assert (s.kv.conds, s.kv.cond_bytes) == ({}, one)


@pytest.mark.parametrize("answer, final", [
    (ErrorCode.TXN_UNKNOWN, True),  # forgotten by the log manager's ledger: ended long ago
    (ErrorCode.UNAVAILABLE, False),  # the transaction manager is starting: ask again
    (ErrorCode.TIMEOUT, False),
    (ErrorCode.BUSY, False),
    ("ended", True),  # rolled back, timed out, or at a restart: it never commits
    ("unknown", True),  # forgotten: its namespaces' values dropped, its keys let go
    ("open", True),
    ("committing", False),  # not in the log yet: ask again
])
def test_what_the_answer_to_the_question_says(answer: ErrorCode | str, final: bool) -> None:
    s = state()
    timed_out_commit(s)
    assert put_k(s, 1.5) == []
    ask_at = TIMEOUT_S + front_kv.LATE_COMMIT_ASK_MS / 1000
    ask = sent(s.tick(ask_at))
    out = s.answer(TxnOutcome(ask.corr, answer) if isinstance(answer, str)
                   else ErrorReply(ask.corr, answer, "no"))
    if final:
        (put,) = out
        assert isinstance(put, Produce) and s.kv.late_commit is None and not s.kv.deciding
        assert not s.kv.state.blocked(CFG)
        # Open, the transaction keeps its conditions for its commit; else they are let go.
        assert s.kv.conds == ({5: [(CFG, b"k", b"old")]} if answer == "open" else {})
        assert (s.kv.cond_bytes > 0) == (answer == "open")
        return
    assert out == [] and s.kv.late_commit is not None and s.kv.state.blocked(CFG)
    again = sent(s.tick(ask_at + front_kv.LATE_COMMIT_ASK_MS / 1000))
    assert again.msg == TxnAsk(again.corr, 5)


def test_a_late_answer_of_the_commit_itself_lets_its_keys_go() -> None:
    """Before the question is asked, the commit's own answer comes: it is the outcome (a
    commit makes later reads wait for its LSN)."""
    s = state()
    commit = timed_out_commit(s)
    assert put_k(s, 1.2) == []
    (put,) = s.answer(TxnCommitted(commit.corr, 40, []))
    assert isinstance(put, Produce) and s.lsn_seen >= 40
    assert s.kv.late_commit is None and s.tick(100.0) == []


def test_the_next_conditional_commit_is_decided_once_the_first_is_let_go() -> None:
    s = state()
    timed_out_commit(s)
    begin(s, 6)
    assert isinstance(cas(s, 6, 0, key=b"j"), Request)
    assert s.request(ID, req("txn_commit", rid=40, txn=6), now=1.5) == []  # waits its turn
    ask = sent(s.tick(TIMEOUT_S + front_kv.LATE_COMMIT_ASK_MS / 1000))
    load = sent(s.answer(TxnOutcome(ask.corr, "ended")))
    assert isinstance(load.msg, KvGet) and load.msg.key == b"j"
    commit = sent(s.answer(RecordsReply(load.corr, msgpack.packb([[b"j", b"old"]]), 4)))
    assert isinstance(commit.msg, TxnStep) and commit.msg.txn == 6


# ---- the question about a late commit changes nothing; conditions kept until the outcome


def test_the_question_about_a_late_commit_commits_nothing_after_a_conflict() -> None:
    """The front door asked how a checked commit that timed out ended by sending it again:
    when the first was reopened (the log manager's mailbox did not take it, answered BUSY)
    and the client's retry, unchecked, had been told TXN_CONFLICT, the question committed
    the transaction. Now it is a question (``TxnAsk``): the transaction stays open, the
    keys are let go and the conditions go back to it, and a retry is checked on them."""
    from actors.transactions import Phase, Transactions

    cfg = load_config(overrides={"limits": {"request_timeout_ms": int(TIMEOUT_S * 1000)}})
    tm = Transactions(cfg.txn, first_id=1000)
    tm.sync(TxnTable([], [], 1000, []), 0.0)
    s = state()

    def to_tm(r: Request) -> Any:
        assert r.role == TRANSACTION_MANAGER
        match r.msg:
            case TxnBegin():
                (o,) = tm.begin(r.msg, 0.0)
            case TxnWrite():
                (o,) = tm.write(r.msg, 0.0)
            case TxnStep():
                (o,) = tm.step(r.msg, 0.0)
            case TxnAsk():
                (o,) = tm.ask(r.msg)
            case _:
                raise AssertionError(r.msg)
        return o

    b = sent(s.request(ID, req("txn_begin", rid=1, txn=5), now=0.0))
    to_tm(b)
    s.answer(TxnId(b.corr, 5))
    w = cas(s, 5, 0, now=0.0)
    to_tm(w)
    load = sent(s.request(ID, req("txn_commit", rid=3, txn=5, writes=1), now=0.0))
    c1 = sent(s.answer(RecordsReply(load.corr, msgpack.packb([[b"k", b"old"]]), 4)))
    (rep,) = s.expire(TIMEOUT_S)
    assert reply_of(rep)["code"] == ErrorCode.TIMEOUT
    # The client's retry waits for the first commit's outcome (it was sent unchecked).
    assert s.request(ID, req("txn_commit", rid=4, txn=5, writes=1), now=TIMEOUT_S) == []
    q = sent(s.tick(TIMEOUT_S + front_kv.LATE_COMMIT_ASK_MS / 1000))
    # The transaction manager takes C1, then the question, in order.
    resolve = to_tm(c1)
    tm.unsent(resolve.msg)  # not taken by the log manager: reopened, C1 answered BUSY
    answer = to_tm(q)
    assert answer.msg == TxnOutcome(q.corr, "open") and tm.live[5].phase is Phase.ACTIVE
    # The question's answer lets go and gives the conditions to the waiting retry, which
    # is decided on them (the key is loaded again: its namespace's values were dropped).
    load2 = sent(s.answer(answer.msg))
    assert isinstance(load2.msg, KvGet) and load2.msg.key == b"k"
    assert s.answer(ErrorReply(c1.corr, ErrorCode.BUSY, "log manager busy")) == []  # late
    c2 = sent(s.answer(RecordsReply(load2.corr, msgpack.packb([[b"k", b"old"]]), 5)))
    assert isinstance(c2.msg, TxnStep) and c2.msg.checked and c2.msg.step == "commit"
    assert tm.live[5].phase is Phase.ACTIVE  # nothing committed it but the checked retry


def staged_two(s: FrontDoorState) -> Request:
    """Transaction 5 with compare-and-sets on "k1" and "k2" (both staged), its checked
    commit sent: the decided commit."""
    begin(s, 5)
    assert isinstance(cas(s, 5, 0, key=b"k1"), Request)
    assert isinstance(cas(s, 5, 1, key=b"k2"), Request)
    load1, load2 = s.request(ID, req("txn_commit", rid=12, txn=5, writes=2), now=0.0)
    assert isinstance(load1, Request) and isinstance(load2, Request)
    assert s.answer(RecordsReply(load1.corr, msgpack.packb([[b"k1", b"old"]]), 4)) == []
    commit = sent(s.answer(RecordsReply(load2.corr, msgpack.packb([[b"k2", b"old"]]), 4)))
    assert isinstance(commit.msg, TxnStep) and commit.msg.checked
    return commit


@pytest.mark.parametrize("code", [ErrorCode.TXN_STATE, ErrorCode.BUSY, ErrorCode.TXN_LIMIT])
def test_a_checked_commit_refused_leaving_its_transaction_open_keeps_its_conditions(
        code: ErrorCode) -> None:
    """The conditions were dropped when the commit was decided: refused in a way that
    leaves the transaction open ("2 writes sent, 1 staged; it stays open", or BUSY), the
    client's retry was decided on the conditions staged again only, or none, and a key
    written meanwhile was overwritten (a lost update). Now they go back to the transaction,
    and a retry after a write of k1 is refused TXN_CONFLICT."""
    s = state()
    commit = staged_two(s)
    (rep,) = s.answer(ErrorReply(commit.corr, code, "it stays open"))
    assert reply_of(rep)["code"] == code
    assert s.kv.conds[5] == [(CFG, b"k1", b"old"), (CFG, b"k2", b"old")]
    (put,) = s.request(ID, req("kv_put", rid=30, namespace="cfg", key=b"k1", value=b"mine",
                               producer_id=1, seq=0), now=0.1)
    assert isinstance(put, Produce)
    s.ack(put.corr, 20, [])
    # The client's retry (node/transaction.py sends the missing write, then the commit).
    out = s.request(ID, req("txn_commit", rid=14, txn=5, writes=2), now=0.2)
    values = {b"k1": b"mine", b"k2": b"old"}
    while out and all(isinstance(o, Request) and isinstance(o.msg, KvGet) for o in out):
        loads, out = out, []
        for load in loads:
            assert isinstance(load, Request) and isinstance(load.msg, KvGet)
            out += s.answer(RecordsReply(load.corr, msgpack.packb(
                [[load.msg.key, values[load.msg.key]]]), 21))
    rollback = sent(out)
    assert isinstance(rollback.msg, TxnStep) and rollback.msg.step == "rollback"


def test_a_checked_commit_the_front_door_could_not_send_keeps_its_conditions() -> None:
    """Failed BUSY at the front door (the transaction manager's queue full), its retry
    went unchecked and was refused TXN_CONFLICT ("the front door restarted")."""
    s = state()
    commit = staged_two(s)
    (rep,) = s.fail([commit.corr], ErrorCode.BUSY, "the transaction-manager queue is full")
    assert reply_of(rep)["code"] == ErrorCode.BUSY
    loads = s.request(ID, req("txn_commit", rid=14, txn=5, writes=2), now=0.1)
    # Decided again, on both conditions (their values loaded again).
    assert sorted(o.msg.key for o in loads if isinstance(o, Request)
                  and isinstance(o.msg, KvGet)) == [b"k1", b"k2"]


def test_a_late_refusal_leaving_the_transaction_open_gives_its_conditions_back() -> None:
    s = state()
    commit = timed_out_commit(s)
    assert s.kv.late_commit is not None and 5 not in s.kv.conds
    s.answer(ErrorReply(commit.corr, ErrorCode.TXN_STATE, "it stays open"))
    assert s.kv.late_commit is None and s.kv.conds[5] == [(CFG, b"k", b"old")]
    # A final refusal lets them go.
    s2 = state()
    commit = timed_out_commit(s2)
    s2.answer(ErrorReply(commit.corr, ErrorCode.TXN_TIMED_OUT, "rolled back"))
    assert (s2.kv.late_commit, s2.kv.conds, s2.kv.cond_bytes) == (None, {}, 0)


def test_a_commit_by_xid_while_another_branch_s_start_of_it_is_refused_names_its_namespaces(
        ) -> None:
    """An xa_start reusing an xid held by a branch begun here replaced the xid's entry as it
    was sent: an xa_commit by that xid sent before the refusal came took the new entry
    ("writes no namespace") and a stale value stayed cached. Now the xid is taken only on
    the begin's OK answer."""
    s = state()
    xid = [1, b"g", b"b"]
    a = sent(s.request(ID, req("xa_start", rid=1, txn=7, xid=xid), now=0.0))
    s.answer(TxnId(a.corr, 7))
    w = sent(s.request(ID, req("txn_kv", rid=2, txn=7, seq=0, namespace="cfg", key=b"k",
                               value=b"v2"), now=0.0))
    s.answer(TxnWritten(w.corr, 3, 1))
    g = sent(s.request(ID, req("kv_get", rid=3, namespace="cfg", key=b"k"), now=0.0))
    s.answer(RecordsReply(g.corr, msgpack.packb([[b"k", b"v1"]]), 10))  # cached: v1
    dup = sent(s.request(ID, req("xa_start", rid=4, txn=8, xid=xid), now=0.0))
    c = sent(s.request(ID, req("xa_commit", rid=5, xid=xid, one_phase=True), now=0.0))
    assert s.pending[c.corr].commit == (CFG,) and s.kv.state.blocked(CFG)
    s.answer(ErrorReply(dup.corr, ErrorCode.XAER_DUPID, "in use"))
    s.answer(TxnCommitted(c.corr, 20, []))
    g2 = sent(s.request(ID, req("kv_get", rid=6, namespace="cfg", key=b"k"), now=0.1))
    assert isinstance(g2.msg, KvGet)  # not the stale v1 from the cache


def test_an_xid_another_branch_held_is_taken_on_the_begin_s_ok() -> None:
    s = state()
    xid = [1, b"g", b"b"]
    a = sent(s.request(ID, req("xa_start", rid=1, txn=7, xid=xid), now=0.0))
    s.answer(TxnId(a.corr, 7))
    b = sent(s.request(ID, req("xa_start", rid=2, txn=8, xid=xid), now=0.0))
    assert s.kv.xids == {(1, b"g", b"b"): 7}  # not yet
    s.answer(TxnId(b.corr, 8))  # branch 7 had ended unseen
    assert s.kv.xids == {(1, b"g", b"b"): 8}
    c = sent(s.request(ID, req("xa_start", rid=3, txn=9, xid=xid), now=0.0))
    s.expire(TIMEOUT_S)  # it may have begun: the xid's commit may change any namespace
    assert c.corr not in s.pending and s.kv.xids == {}
