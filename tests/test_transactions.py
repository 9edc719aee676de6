"""The transaction manager's state machine (actors/transactions.py) and the log's ledger of
transactions (actors/txn_ledger.py, through actors/log_state.py), without processes."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from actors.instructions import Log, Request, Send
from actors.log_state import LogState
from actors.roles import FRONT_DOOR, LOG_MANAGER
from actors.transactions import TXN_ID_MAX, Phase, Transactions
from config import load_config
from wire import logrecord
from wire.errors import CONFLICT_TEXT, ErrorCode
from wire.logrecord import Kind
from wire.messages import (
    CreateTopic,
    Done,
    ErrorReply,
    TxnAppend,
    TxnAsk,
    TxnBegin,
    TxnCommitted,
    TxnId,
    TxnList,
    TxnOnce,
    TxnOutcome,
    TxnResolve,
    TxnsReply,
    TxnStart,
    TxnStep,
    TxnTable,
    TxnWrite,
    TxnWritten,
)
from wire.xid import Xid, parse

CFG = load_config()
BLOB = msgpack.packb([b"a", b"b"], use_bin_type=True)
XID = Xid(1, b"order-17", b"shard-a")


def machine(**txn: int) -> Transactions:
    t = Transactions(dataclasses.replace(CFG.txn, **txn), first_id=100)
    t.sync(TxnTable([], [], 1, []), now=0.0)
    return t


def error_code(out: list[Request | Send]) -> int:
    (o,) = out
    assert isinstance(o, Send) and o.role == FRONT_DOOR and isinstance(o.msg, ErrorReply), out
    return o.msg.code


def begin(t: Transactions, corr: int = 1, xid: Xid | None = None, timeout_ms: int = 0,
          now: float = 0.0) -> int:
    (out,) = t.begin(TxnBegin(corr, timeout_ms, None if xid is None else list(xid)), now)
    assert isinstance(out, Request) and out.role == LOG_MANAGER, out
    assert isinstance(out.msg, TxnStart)
    return out.msg.txn


def write(t: Transactions, txn: int, seq: int, corr: int = 2, now: float = 0.0) -> list[Request | Send]:
    return t.write(TxnWrite(corr, txn, seq, ((1, 0, 2, BLOB),), ()), now)


def step(t: Transactions, step: str, txn: int = 0, xid: Xid | None = None,
         corr: int = 3) -> list[Request | Send]:
    return t.step(TxnStep(corr, txn, None if xid is None else list(xid), step), 0.0)


# ---- local transactions ----------------------------------------------------------------


def test_local_transaction_begins_writes_and_commits() -> None:
    t = machine()
    txn = begin(t)
    (req,) = write(t, txn, 0)
    assert isinstance(req, Request) and isinstance(req.msg, TxnAppend)
    assert t.live[txn].records == 2 and t.live[txn].seq == 1
    (req,) = step(t, "commit", txn)
    assert isinstance(req, Request) and req.msg == TxnResolve(3, txn, "commit")
    assert txn not in t.live and t.finished[txn].phase is Phase.COMMITTED


def test_a_retried_write_is_answered_not_staged_again() -> None:
    t = machine()
    txn = begin(t)
    write(t, txn, 0)
    (again,) = write(t, txn, 0)
    assert isinstance(again, Send) and isinstance(again.msg, TxnWritten)
    assert t.live[txn].records == 2
    assert error_code(write(t, txn, 5)) == ErrorCode.BAD_REQUEST  # a gap


def test_misuse_gets_clear_errors() -> None:
    t = machine()
    assert error_code(write(t, 999, 0)) == ErrorCode.TXN_UNKNOWN
    txn = begin(t)
    step(t, "commit", txn)
    assert error_code(write(t, txn, 0)) == ErrorCode.TXN_STATE  # produce after commit
    assert error_code(step(t, "rollback", txn)) == ErrorCode.TXN_STATE  # abort after commit
    other = begin(t, corr=5)
    step(t, "rollback", other)
    assert error_code(step(t, "commit", other)) == ErrorCode.TXN_ABORTED  # commit after abort
    assert error_code(step(t, "prepare", begin(t, corr=6))) == ErrorCode.TXN_STATE


def test_a_commit_sent_again_after_a_compare_and_set_failed_is_told_so_again() -> None:
    """The front door rolled it back (its condition did not hold) and the client's answer
    was lost: TXN_STATE sent the client's retry on to begin again, which was refused 'in
    use', and the caller never learnt it had not committed."""
    t = machine()
    txn = begin(t)
    t.step(TxnStep(3, txn, None, "rollback", checked=True), 0.0)  # the front door's
    out = step(t, "commit", txn, corr=4)
    assert error_code(out) == ErrorCode.TXN_CONFLICT
    assert isinstance(out[0], Send) and isinstance(out[0].msg, ErrorReply)
    assert out[0].msg.text == CONFLICT_TEXT.format(txn)
    # A rollback the log manager's mailbox did not take leaves it open, and its timeout
    # is told as one (not as the conflict).
    open_again = machine()
    other = begin(open_again)
    open_again.step(TxnStep(3, other, None, "rollback", checked=True), 0.0)
    open_again.unsent(TxnResolve(3, other, "rollback"))
    assert open_again.live[other].phase is Phase.ACTIVE and not open_again.live[other].conflicted
    # Restarted, the transaction manager knows from the log that it was rolled back and
    # why (the rollback record's reason): told the same as before the restart.
    again = machine()
    again.sync(TxnTable([], [[txn, None, False, 1, "conflict"]], 1, []), now=0.0)
    out = step(again, "commit", txn, corr=5)
    assert error_code(out) == ErrorCode.TXN_CONFLICT
    assert isinstance(out[0], Send) and isinstance(out[0].msg, ErrorReply)
    assert out[0].msg.text == CONFLICT_TEXT.format(txn)
    # Rolled back by its client, or in a log written before the reason was kept: still
    # final (TXN_STATE sent the client's retry on to begin again, refused "in use").
    for reason in ("client", ""):
        again = machine()
        again.sync(TxnTable([], [[txn, None, False, 1, reason]], 1, []), now=0.0)
        assert error_code(step(again, "commit", txn, corr=5)) == ErrorCode.TXN_ABORTED


def test_commit_and_rollback_again_ask_the_log_for_the_first_outcome() -> None:
    t = machine()
    txn = begin(t)
    step(t, "commit", txn)
    (again,) = step(t, "commit", txn)
    assert isinstance(again, Request) and again.msg == TxnResolve(3, txn, "commit")
    other = begin(t)
    step(t, "rollback", other)
    (again,) = step(t, "rollback", other)
    assert isinstance(again, Request) and again.msg == TxnResolve(3, other, "rollback", "client")


def test_limits() -> None:
    t = machine(open_max=2, records_max=10_000, bytes_max=16_777_216)
    a = begin(t)
    begin(t)
    assert error_code(t.begin(TxnBegin(9, 0, None), 0.0)) == ErrorCode.TXN_LIMIT
    t = machine(records_max=3)
    a = begin(t)
    write(t, a, 0)
    assert error_code(write(t, a, 1)) == ErrorCode.TXN_LIMIT  # 2 + 2 > 3
    assert a in t.live and t.live[a].records == 2  # still open
    too_long = CFG.txn.timeout_ms_max + 1
    assert error_code(t.begin(TxnBegin(9, too_long, None), 0.0)) == ErrorCode.TXN_LIMIT


def test_an_open_transaction_times_out_and_says_so() -> None:
    t = machine()
    txn = begin(t, timeout_ms=1000, now=10.0)
    assert t.tick(10.5) == []
    (out,) = t.tick(11.5)
    assert isinstance(out, Send) and out.msg == TxnResolve(0, txn, "rollback", "timeout")
    assert error_code(write(t, txn, 0)) == ErrorCode.TXN_TIMED_OUT
    assert error_code(step(t, "commit", txn)) == ErrorCode.TXN_TIMED_OUT


def test_a_timeout_s_rollback_the_log_manager_did_not_take_is_sent_again() -> None:
    """The rollback of a transaction past its timeout is a message no client waits for: if
    the log manager's mailbox does not take it, the transaction is open again (as the log
    still has it), and the next tick times it out and sends the rollback again."""
    t = machine()
    txn = begin(t, timeout_ms=1000, now=10.0)
    (out,) = t.tick(11.5)
    assert isinstance(out, Send) and t.timed_out == 1
    t.unsent(out.msg)
    assert t.live[txn].phase is Phase.ACTIVE and txn not in t.finished and t.timed_out == 0
    (again,) = t.tick(11.6)
    assert isinstance(again, Send) and again.msg == TxnResolve(0, txn, "rollback", "timeout")
    assert t.timed_out == 1 and error_code(write(t, txn, 0)) == ErrorCode.TXN_TIMED_OUT


def test_what_the_log_manager_did_not_take_is_undone() -> None:
    t = machine()
    txn = begin(t)
    (req,) = write(t, txn, 0)
    t.unsent(req.msg)
    assert t.live[txn].seq == 0 and t.live[txn].records == 0
    (req,) = step(t, "commit", txn)
    t.unsent(req.msg)
    assert t.live[txn].phase is Phase.ACTIVE and txn not in t.finished
    (req,) = t.begin(TxnBegin(7, 0, None), 0.0)
    t.unsent(req.msg)
    assert len(t.live) == 1


def test_nothing_is_served_before_the_log_says_what_it_holds() -> None:
    t = Transactions(CFG.txn, first_id=100)
    assert error_code(t.begin(TxnBegin(1, 0, None), 0.0)) == ErrorCode.UNAVAILABLE


# ---- XA ---------------------------------------------------------------------------------


def test_xa_two_phase() -> None:
    t = machine()
    txn = begin(t, xid=XID)
    write(t, txn, 0)
    assert error_code(step(t, "prepare", xid=XID)) == ErrorCode.XAER_PROTO  # not ended
    (out,) = step(t, "end", xid=XID)
    assert isinstance(out, Send) and out.msg == TxnId(3, txn)
    assert error_code(write(t, txn, 1)) == ErrorCode.XAER_PROTO  # work after end
    (req,) = step(t, "prepare", xid=XID)
    assert isinstance(req, Request) and req.msg == TxnResolve(3, txn, "prepare")
    assert t.tick(1e9) == []  # prepared branches never time out
    (rec,) = t.listing(TxnList(4, True), 0.0)
    assert isinstance(rec.msg, TxnsReply) and rec.msg.rows == [list(XID)]
    assert error_code(step(t, "commit_one_phase", xid=XID)) == ErrorCode.XAER_PROTO
    (req,) = step(t, "commit", xid=XID)
    assert req.msg == TxnResolve(3, txn, "commit")
    (rec,) = t.listing(TxnList(4, True), 0.0)
    assert rec.msg.rows == []  # type: ignore[attr-defined]


def test_xa_errors() -> None:
    t = machine()
    assert error_code(step(t, "commit", xid=XID)) == ErrorCode.XAER_NOTA
    begin(t, xid=XID)
    assert error_code(t.begin(TxnBegin(9, 0, list(XID)), 0.0)) == ErrorCode.XAER_DUPID
    long_id = [1, b"x" * 65, b""]
    assert error_code(t.begin(TxnBegin(9, 0, long_id), 0.0)) == ErrorCode.XAER_INVAL
    assert error_code(step(t, "commit", xid=XID)) == ErrorCode.XAER_PROTO  # two-phase, not prepared
    other = Xid(1, b"other", b"")
    txn = begin(t, xid=other, timeout_ms=1000)
    t.tick(5.0)
    assert error_code(write(t, txn, 0)) == ErrorCode.XA_RBTIMEOUT


def test_xa_one_phase_commit_of_an_ended_branch() -> None:
    t = machine()
    txn = begin(t, xid=XID)
    assert error_code(step(t, "commit_one_phase", xid=XID)) == ErrorCode.XAER_PROTO  # not ended
    step(t, "end", xid=XID)
    (req,) = step(t, "commit_one_phase", xid=XID)
    assert req.msg == TxnResolve(3, txn, "commit")


def test_only_its_owner_ends_or_commits_an_active_transaction() -> None:
    """Another client ending an active branch committed what was staged so far, while its
    owner went on writing (XA associates a branch with its thread of control)."""
    t = machine()
    (out,) = t.begin(TxnBegin(1, 0, list(XID), txn=500, owner=7), 0.0)
    assert isinstance(out, Request) and out.msg == TxnStart(1, 500, list(XID))
    write(t, 500, 0)
    assert error_code(t.step(TxnStep(2, 0, list(XID), "end", owner=8), 0.0)) == ErrorCode.XAER_PROTO
    assert error_code(t.step(TxnStep(2, 0, list(XID), "end"), 0.0)) == ErrorCode.XAER_PROTO
    # Its own begin sent again is a retry; another client's is a duplicate.
    (again,) = t.begin(TxnBegin(3, 0, list(XID), txn=500, owner=7), 0.0)
    assert isinstance(again, Send) and again.msg == TxnId(3, 500)
    assert error_code(t.begin(TxnBegin(4, 0, list(XID), txn=500, owner=8), 0.0)) == (
        ErrorCode.XAER_DUPID)
    (ended,) = t.step(TxnStep(5, 0, list(XID), "end", writes=1, owner=7), 0.0)
    assert isinstance(ended, Send) and ended.msg == TxnId(5, 500)
    # Ended, the branch is any coordinator's: prepare and commit from another client.
    (prepared,) = t.step(TxnStep(6, 0, list(XID), "prepare"), 0.0)
    assert isinstance(prepared, Request)
    # A local transaction: another's commit is refused, anyone's rollback taken.
    (out,) = t.begin(TxnBegin(7, 0, None, txn=600, owner=7), 0.0)
    assert error_code(t.step(TxnStep(8, 600, None, "commit", owner=9), 0.0)) == ErrorCode.TXN_STATE
    assert t.live[600].phase is Phase.ACTIVE
    (rolled,) = t.step(TxnStep(9, 600, None, "rollback", owner=9), 0.0)
    assert isinstance(rolled, Request) and rolled.msg == TxnResolve(9, 600, "rollback", "client")
    # A begin that named no owner (a client of its own making) is not checked.
    begin(t, corr=10, xid=Xid(1, b"free", b"b"))
    assert isinstance(t.step(TxnStep(11, 0, list(Xid(1, b"free", b"b")), "end", owner=3),
                             0.0)[0], Send)


def test_printed_xids_parse_back() -> None:
    assert str(XID) == "1:6f726465722d3137:73686172642d61"
    assert parse(str(XID)) == XID
    with pytest.raises(Exception, match="not an xid"):
        parse("1:zz:00")


# ---- at a restart -----------------------------------------------------------------------


def test_a_restart_keeps_prepared_branches_and_rolls_back_the_open() -> None:
    t = Transactions(CFG.txn, first_id=100)
    table = TxnTable(open=[[7, list(XID), True, 2, 10, [[1, 0]], 5]],
                     outcomes=[[3, None, True, 2, ""], [4, None, False, 0, "client"],
                               [8, None, False, 1, "restart"], [9, None, False, 0, "timeout"],
                               [10, None, False, 0, "restart"]],
                     next_txn=11, aborted=[8])
    t.sync(table, now=0.0)
    assert t.live[7].phase is Phase.PREPARED and t.by_xid[XID] == 7
    assert error_code(write(t, 8, 0)) == ErrorCode.TXN_ABORTED
    assert error_code(write(t, 4, 0)) == ErrorCode.TXN_STATE
    # Why the others ended, from their rollback records: past their timeout, or at an
    # earlier restart (not rolled back on this sync, yet told as a restart's).
    assert error_code(write(t, 9, 0)) == ErrorCode.TXN_TIMED_OUT
    assert error_code(step(t, "commit", 9)) == ErrorCode.TXN_TIMED_OUT
    assert error_code(step(t, "commit", 10)) == ErrorCode.TXN_ABORTED
    assert t.finished[10].phase is Phase.ABORTED
    # Its begin sent again (the answer lost in the restart): rolled back, not "in use".
    assert error_code(t.begin(TxnBegin(5, 0, None, txn=8), 0.0)) == ErrorCode.TXN_ABORTED
    assert t.finished[3].phase is Phase.COMMITTED
    (again,) = step(t, "commit", 3)
    assert again.msg == TxnResolve(3, 3, "commit")  # answered by the log with its outcome
    (written,) = write(t, 3, 1)  # its second write sent again: answered, as it was staged
    assert isinstance(written, Send) and isinstance(written.msg, TxnWritten)
    assert error_code(write(t, 3, 2)) == ErrorCode.TXN_STATE  # a third never was


# ---- the log's side: records, offsets at commit, replay, snapshot -----------------------


def logged(out: object) -> Log:
    assert isinstance(out, Log), out
    return out


def log_with_topic() -> LogState:
    s = LogState(CFG)
    logged(s.admit(CreateTopic(1, "out", 2), 0))
    return s


def test_the_log_gives_offsets_at_commit_only_and_aborts_take_none() -> None:
    s = log_with_topic()
    tid = s.topics["out"].topic_id
    start = logged(s.admit(TxnStart(1, 50, None), 0))
    assert not start.early and start.reply == TxnId(1, 50)  # answered once durable
    w = logged(s.admit(TxnAppend(2, 50, ((tid, 0, 2, BLOB), (tid, 1, 2, BLOB)), ()), 0))
    assert w.early and isinstance(w.reply, TxnWritten) and w.reply.records == 4
    assert s.next_offset[(tid, 0)] == 0  # staged: no offsets yet
    # An aborted one in between takes nothing.
    logged(s.admit(TxnStart(3, 51, None), 0))
    logged(s.admit(TxnAppend(4, 51, ((tid, 0, 2, BLOB),), ()), 0))
    rb = logged(s.admit(TxnResolve(5, 51, "rollback", "client"), 0))
    assert isinstance(rb.reply, Done) and not rb.early
    c = logged(s.admit(TxnResolve(6, 50, "commit"), 0))
    assert isinstance(c.reply, TxnCommitted)
    assert c.reply.parts == [("out", 0, 0, 2), ("out", 1, 0, 2)]
    assert s.next_offset[(tid, 0)] == 2
    (entry,) = logrecord.iter_buffer(c.record)
    assert entry.kind == Kind.COMMIT and entry.body() == [50, [[tid, 0, 0, 2], [tid, 1, 0, 2]], []]
    # A commit retried after a lost answer: the same outcome, nothing logged.
    again = logged(s.admit(TxnResolve(7, 50, "commit"), 0))
    assert again.record == b"" and again.reply == TxnCommitted(7, c.lsn, c.reply.parts)


def test_the_ledger_comes_back_from_the_records_and_from_a_snapshot() -> None:
    tid = log_with_topic().topics["out"].topic_id  # the first topic's id
    s = LogState(CFG)
    records = []
    for msg in (CreateTopic(1, "out", 2), TxnStart(2, 60, list(XID)),
                TxnAppend(3, 60, ((tid, 1, 2, BLOB),), (("g", tid, 0, 0),)),
                TxnResolve(4, 60, "prepare"), TxnStart(5, 61, None),
                TxnAppend(6, 61, ((tid, 0, 2, BLOB),), ()), TxnResolve(7, 61, "commit"),
                TxnStart(8, 62, None), TxnStart(11, 63, None),
                TxnResolve(12, 63, "rollback", "conflict"), TxnStart(13, 64, None),
                TxnResolve(0, 64, "rollback", "timeout")):
        records.append(logged(s.admit(msg, 0)).record)
    replayed = LogState(CFG)
    for record in records:
        for entry in logrecord.iter_buffer(record):
            replayed.replay(entry)
    restored = LogState(CFG)
    restored.restore(msgpack.unpackb(msgpack.packb(s.snapshot(), use_bin_type=True),
                                     raw=False, strict_map_key=False))
    for other in (replayed, restored):
        assert other.txns.table() == s.txns.table()
        prepared = other.txns.open[60]
        assert prepared.prepared and prepared.xid == XID and prepared.counts == {(tid, 1): 2}
        assert prepared.offsets == {("g", tid, 0): 0}
        assert 62 in other.txns.open and other.txns.outcomes[61].committed
        assert other.next_offset[(tid, 0)] == 2
        # Why each rollback was made is in its record, and so in the snapshot.
        assert [other.txns.outcomes[t].reason for t in (61, 63, 64)] == ["", "conflict",
                                                                         "timeout"]
        # The transaction manager restarted: the open one is rolled back, the prepared kept.
        (rollback,), aborted = other.abort_open()
        assert aborted == [62] and 62 not in other.txns.open and 60 in other.txns.open
        (entry,) = logrecord.iter_buffer(rollback.record)
        assert entry.kind == Kind.ROLLBACK and rollback.reply is None
        assert entry.body()[2] == "restart" and other.txns.outcomes[62].reason == "restart"
        late = other.admit(TxnResolve(10, 62, "commit"), 0)  # a commit sent before the restart
        assert isinstance(late, Send) and isinstance(late.msg, ErrorReply)
        assert late.msg.code == ErrorCode.TXN_STATE
        c = logged(other.admit(TxnResolve(9, 60, "commit"), 0))
        assert isinstance(c.reply, TxnCommitted) and c.reply.parts == [("out", 1, 0, 2)]


def test_a_client_may_pick_the_id_and_retry_its_begin() -> None:
    t = machine()
    (out,) = t.begin(TxnBegin(1, 0, None, txn=4242), 0.0)
    assert isinstance(out, Request) and out.msg == TxnStart(1, 4242, None)
    (again,) = t.begin(TxnBegin(2, 0, None, txn=4242), 0.0)  # its answer was lost
    assert isinstance(again, Send) and again.msg == TxnId(2, 4242)
    write(t, 4242, 0)
    (again,) = t.begin(TxnBegin(3, 0, None, txn=4242), 0.0)  # writes followed: still its own
    assert isinstance(again, Send) and again.msg == TxnId(3, 4242)
    assert error_code(t.begin(TxnBegin(3, 0, list(XID), txn=4242), 0.0)) == ErrorCode.XAER_DUPID
    step(t, "commit", 4242)
    assert error_code(t.begin(TxnBegin(4, 0, None, txn=4242), 0.0)) == ErrorCode.TXN_STATE
    (again,) = write(t, 4242, 0)  # a write of the committed transaction sent again
    assert isinstance(again, Send) and again.msg == TxnWritten(2, 0, 2)
    assert error_code(write(t, 4242, 1)) == ErrorCode.TXN_STATE  # a new one is refused


def test_ids_the_node_picks_stay_in_range_after_a_client_picked_the_highest() -> None:
    """A client's ``txn`` of 2**63 - 1 made the log's ``next_txn`` 2**63, kept by its records
    and its snapshot: after a restart every id the node picked was one no request may name
    ("field 'txn' is out of range"), so its transactions could only time out."""
    s = log_with_topic()
    records = [logged(s.admit(msg, 0)).record
               for msg in (TxnStart(1, TXN_ID_MAX, None),
                           TxnResolve(2, TXN_ID_MAX, "rollback", "client"))]
    replayed = LogState(CFG)
    for record in records:
        for entry in logrecord.iter_buffer(record):
            replayed.replay(entry)
    restored = LogState(CFG)
    restored.restore(msgpack.unpackb(msgpack.packb(s.snapshot(), use_bin_type=True),
                                     raw=False, strict_map_key=False))
    for log in (s, replayed, restored):  # what a log written before the fix holds, too
        assert log.txns.next_txn == TXN_ID_MAX + 1
        t = Transactions(CFG.txn, first_id=(5 << 32) | 1)
        opened, outcomes = log.txns.table()
        t.sync(TxnTable(opened, outcomes, log.txns.next_txn, []), now=0.0)
        assert [begin(t, corr) for corr in (1, 2)] == [(5 << 32) | 1, (5 << 32) | 2]
    # Ids the node picks run up to the highest a request may name, then start again from
    # this incarnation's start, past the ids in use.
    t = Transactions(CFG.txn, first_id=7)
    t.sync(TxnTable([], [[7, None, True, 1, ""]], TXN_ID_MAX - 1, []), now=0.0)
    assert [begin(t, corr) for corr in range(1, 5)] == [TXN_ID_MAX - 1, TXN_ID_MAX, 8, 9]


def test_a_commit_that_names_more_writes_than_were_staged_is_refused() -> None:
    t = machine()
    txn = begin(t)
    write(t, txn, 0)
    out = t.step(TxnStep(3, txn, None, "commit", writes=2), 0.0)
    assert error_code(out) == ErrorCode.TXN_STATE and t.live[txn].phase is Phase.ACTIVE
    (req,) = t.step(TxnStep(4, txn, None, "commit", writes=1), 0.0)
    assert isinstance(req, Request) and req.msg == TxnResolve(4, txn, "commit")
    branch = begin(t, xid=XID)
    assert error_code(t.step(TxnStep(5, 0, list(XID), "end", writes=1), 0.0)) == ErrorCode.XAER_PROTO
    assert t.live[branch].phase is Phase.ACTIVE


def test_a_snapshot_and_a_rollback_record_written_before_reasons_still_restore() -> None:
    """Format 3 snapshots' outcomes, and format 2 segments' rollback records, hold no
    reason: they are read as "" (told as a client's rollback)."""
    s = log_with_topic()
    for msg in (TxnStart(1, 70, None), TxnResolve(2, 70, "rollback", "conflict")):
        s.admit(msg, 0)
    snap = s.snapshot()
    snap["format"] = 3
    snap["txn_outcomes"] = [row[:6] for row in snap["txn_outcomes"]]
    restored = LogState(CFG)
    restored.restore(snap)
    assert restored.txns.outcomes[70].reason == "" and not restored.txns.outcomes[70].committed
    replayed = log_with_topic()
    replayed.replay(next(logrecord.iter_buffer(logrecord.encode(2, Kind.TX_START, [71]))))
    replayed.replay(next(logrecord.iter_buffer(logrecord.encode(3, Kind.ROLLBACK, [71, [[1, 0]]]))))
    assert replayed.txns.outcomes[71].reason == ""


def test_a_snapshot_of_the_format_before_transactions_still_restores() -> None:
    s = log_with_topic()
    old = {k: v for k, v in s.snapshot().items() if k not in ("next_txn", "txns", "txn_outcomes")}
    old["format"] = 2
    restored = LogState(CFG)
    restored.restore(old)
    assert restored.topics == s.topics and restored.txns.open == {}


def test_a_transaction_with_compare_and_sets_commits_only_checked() -> None:
    t = machine()
    txn = begin(t)
    (req,) = t.write(TxnWrite(2, txn, 0, ((1, 0, 1, BLOB),), (), conditional=True), 0.0)
    assert isinstance(req, Request) and t.live[txn].conditional
    # A front door that restarted lost the conditions: it cannot check them, so no commit.
    assert error_code(step(t, "commit", txn)) == ErrorCode.TXN_CONFLICT
    assert t.live[txn].phase is Phase.ACTIVE  # open: the client rolls it back
    (req,) = t.step(TxnStep(4, txn, None, "commit", checked=True), 0.0)
    assert isinstance(req, Request) and req.msg == TxnResolve(4, txn, "commit")


def outcome(t: Transactions, txn: int, corr: int = 9) -> str:
    (o,) = t.ask(TxnAsk(corr, txn))
    assert isinstance(o, Send) and o.role == FRONT_DOOR and isinstance(o.msg, TxnOutcome), o
    return o.msg.outcome


def test_the_question_about_a_commit_says_how_it_ended_and_changes_nothing() -> None:
    """The front door asks how a checked commit that timed out there ended. It asked by
    sending the commit again, which committed a transaction whose first commit had been
    reopened (the log manager's mailbox did not take it) after its client's own retry was
    refused TXN_CONFLICT. The question commits nothing; asked after the commit (the front
    door's messages are taken in order) it tells the commit's effect."""
    t = machine()
    assert outcome(t, 12345) == "unknown"  # never begun, or forgotten
    txn = begin(t)
    t.write(TxnWrite(2, txn, 0, ((1, 0, 1, BLOB),), (), conditional=True), 0.0)
    assert outcome(t, txn) == "open"  # the commit never came
    (c1,) = t.step(TxnStep(4, txn, None, "commit", 1, checked=True), 0.0)
    assert isinstance(c1, Request)
    assert outcome(t, txn) == "committing"  # not in the log manager's mailbox yet
    t.unsent(c1.msg)  # it did not take it: reopened, the commit answered BUSY
    assert outcome(t, txn) == "open" and t.live[txn].phase is Phase.ACTIVE
    # The client's retry, unchecked, is refused; the question after it commits nothing.
    assert error_code(t.step(TxnStep(5, txn, None, "commit", 1), 0.0)) == ErrorCode.TXN_CONFLICT
    assert outcome(t, txn) == "open" and t.live[txn].phase is Phase.ACTIVE
    # Committed and taken by the log manager: its ledger answers with the LSN, once
    # durable. That request not taken in turn leaves the commit alone.
    (c2,) = t.step(TxnStep(6, txn, None, "commit", 1, checked=True), 0.0)
    t.sent(c2.msg)
    (q,) = t.ask(TxnAsk(7, txn))
    assert isinstance(q, Request) and q.role == LOG_MANAGER
    assert q.msg == TxnResolve(7, txn, "commit")
    t.unsent(q.msg)
    assert t.finished[txn].phase is Phase.COMMITTED and txn not in t.live
    # Ended without commit: rolled back, or timed out.
    rolled = begin(t, corr=10)
    t.sent(step(t, "rollback", rolled)[0].msg)
    timed = begin(t, corr=11, timeout_ms=10)
    t.tick(1.0)
    assert (outcome(t, rolled), outcome(t, timed)) == ("ended", "ended")


def test_the_question_waits_for_the_log_to_say_what_it_holds() -> None:
    t = Transactions(CFG.txn, first_id=100)
    assert error_code(t.ask(TxnAsk(1, 5))) == ErrorCode.UNAVAILABLE  # asked again later
    t.sync(TxnTable([], [[5, None, True, 1, ""], [6, None, False, 0, "client"]], 7, []), now=0.0)
    (q,) = t.ask(TxnAsk(2, 5))  # committed before the restart: the ledger has its LSN
    assert isinstance(q, Request) and q.msg == TxnResolve(2, 5, "commit")
    assert outcome(t, 6) == "ended"


def test_an_xa_branch_takes_no_compare_and_set() -> None:
    t = machine()
    txn = begin(t, xid=Xid(1, b"g", b"b"))
    out = t.write(TxnWrite(2, txn, 0, ((1, 0, 1, BLOB),), (), conditional=True), 0.0)
    assert error_code(out) == ErrorCode.BAD_REQUEST


# ---- a whole transaction in one message (txn_once) ---------------------------------------


def test_the_log_writes_a_whole_transaction_as_start_write_and_commit() -> None:
    s = log_with_topic()
    tid = s.topics["out"].topic_id
    s.next_offset[(tid, 1)] = 7
    out = s.once(TxnOnce(9, 80, ((tid, 0, 2, BLOB), (tid, 1, 2, BLOB)), (("g", tid, 1, 7),)), 0)
    assert isinstance(out, list)
    start, write_, commit = out
    assert start.reply is None and write_.reply is None and not write_.early
    assert commit.reply == TxnCommitted(9, commit.lsn, [("out", 0, 0, 2), ("out", 1, 7, 2)])
    assert [start.lsn, write_.lsn] == [commit.lsn - 2, commit.lsn - 1]
    entries = [e for log in out for e in logrecord.iter_buffer(log.record)]
    assert [e.kind for e in entries] == [Kind.TX_START, Kind.TXN_WRITE, Kind.COMMIT]
    assert entries[2].body() == [80, [[tid, 0, 0, 2], [tid, 1, 7, 2]], [["g", tid, 1, 7]]]
    assert s.next_offset[(tid, 0)] == 2 and 80 not in s.txns.open and s.txns.outcomes[80].committed
    # Replayed, its records give the same ledger and offsets (recovery sees nothing new).
    replayed = log_with_topic()
    replayed.next_offset[(tid, 1)] = 7
    for entry in entries:
        replayed.replay(entry)
    assert replayed.txns.table() == s.txns.table() and replayed.next_offset == s.next_offset
    # Sent again after a lost answer: the first outcome, nothing logged.
    retried = s.once(TxnOnce(10, 80, ((tid, 0, 2, BLOB),), ()), 0)
    assert isinstance(retried, list)
    (again,) = retried
    assert again.record == b"" and again.reply == TxnCommitted(10, commit.lsn, commit.reply.parts)


def test_the_log_refuses_a_whole_transaction_before_logging_any_of_it() -> None:
    s = LogState(dataclasses.replace(CFG, txn=dataclasses.replace(CFG.txn, records_max=3,
                                                                     bytes_max=10_000)))
    logged(s.admit(CreateTopic(1, "out", 2), 0))
    tid = s.topics["out"].topic_id
    lsn = s.last_lsn
    for msg, code, says in (
            (TxnOnce(1, 81, ((tid, 0, 2, BLOB),), (("g", tid, 0, 99),)), ErrorCode.BAD_REQUEST,
             "past the end"),
            (TxnOnce(2, 82, (), (("g", 999, 0, 0),)), ErrorCode.UNKNOWN_TOPIC, "999"),
            (TxnOnce(3, 83, ((tid, 0, 2, BLOB), (tid, 1, 2, BLOB)), ()), ErrorCode.TXN_LIMIT,
             "4 records would pass txn.records_max = 3"),
            (TxnOnce(4, 84, ((tid, 0, 1, b"x" * 10_001),), ()), ErrorCode.TXN_LIMIT,
             "10001 bytes would pass txn.bytes_max = 10000"),
            (TxnOnce(5, 0, ((tid, 0, 1, BLOB),), ()), ErrorCode.BAD_REQUEST, "not 0")):
        out = s.once(msg, 0)
        assert isinstance(out, Send) and isinstance(out.msg, ErrorReply), out
        assert out.msg.code == code and out.msg.corr == msg.corr and says in out.msg.text
        assert msg.txn not in s.txns.open and msg.txn not in s.txns.outcomes
    logged(s.admit(TxnStart(6, 85, None), 0))
    out = s.once(TxnOnce(7, 85, ((tid, 0, 2, BLOB),), ()), 0)  # an id that is open
    assert isinstance(out, Send) and isinstance(out.msg, ErrorReply)
    assert out.msg.code == ErrorCode.TXN_STATE and "in use" in out.msg.text
    assert s.last_lsn == lsn + 1 and s.next_offset[(tid, 0)] == 0 and s.txns_once == 0
