"""Transactions and XA branches as the transaction manager runs them, with no I/O.

The contract, step by step (ZODB's ``IDataManager`` names in brackets; XA's calls after
them). What may fail where is the point of writing it down:

- **begin** (``txn_begin``; ``xa_start``): a new id; the start record (Tx-Start, or Dtx-Start
  with the xid) goes to the log, and the id is answered once that is durable (a client
  holding an id the log lost would share it with the next one given it). Fails over ``[txn] open_max`` (TXN_LIMIT), on an xid in
  use (XAER_DUPID), on a bad xid (XAER_INVAL), while the node starts (UNAVAILABLE).
- **write** (``txn_produce``, ``txn_commit_offset``): records and offsets are staged — logged
  now, applied by the shard writers into each shard's ``staged`` column family, invisible,
  without offsets. Only while ACTIVE. A write numbered below the next expected one is a
  retry and is answered again, not staged twice. Fails over ``records_max``/``bytes_max``
  (TXN_LIMIT: the transaction stays open), after the timeout (TXN_TIMED_OUT /
  XA_RBTIMEOUT: it was rolled back), in another state (TXN_STATE / XAER_PROTO).
- **end** (XA only, ``xa_end``): ACTIVE → IDLE, no more work. Nothing is logged. Only the
  client that began it (its ``owner``) ends a branch, or commits an active local
  transaction (XAER_PROTO / TXN_STATE); rolling back is anyone's.
- **vote** (``tpc_vote``; ``xa_prepare``): IDLE → PREPARED; the Prepare record is durable
  before the answer. From here the branch cannot fail by itself: it survives any crash and
  any checkpoint, never times out, and waits for **finish** or **abort** from its
  coordinator or an operator (``shardnode txn commit|rollback XID``).
- **finish** (``tpc_finish``; ``txn_commit``, ``xa_commit``): the Commit record gives every
  staged record its offset, contiguous per partition, and is durable before the answer,
  which carries the offsets. A local transaction commits from ACTIVE; an XA branch from
  PREPARED, or from IDLE with ``one_phase``. Committing again answers the first outcome.
- **abort** (``tpc_abort``; ``txn_abort``, ``xa_rollback``): from any unfinished state; the
  Rollback record drops what was staged; no offsets are taken, so none are skipped.
  Rolling back again answers as the first time; after a commit it fails.
- **ask** (the front door's ``TxnAsk``, about a checked commit whose wait expired there):
  how the transaction stands, changing nothing: open, ended, committing, not known, or
  committed (its LSN from the log manager's ledger). Taken in order after the front door's
  earlier steps, so the answer includes the commit it asks about if that was sent.

A transaction that was open but not prepared when the transaction manager (or the node)
restarted is rolled back at its start: its client may have lost writes in flight, and
seed 004's recovery drops never-prepared transactions. The log manager does it as it
answers the new transaction manager's ``TxnSync``, in its mailbox's order, so a commit
sent just before the restart either came first and stands, or is refused after. Its next call gets TXN_ABORTED
(XA_RBROLLBACK for a branch).

A whole local transaction sent as one ``txn_once`` request (begin, writes and commit) does
not come here: it is never open between two messages, so it takes the route of writes and
the log manager checks and logs it (``LogState.once``).

The log manager keeps what the log holds of each transaction (``actors/txn_ledger.py``):
this module decides, the ledger records. ``actors/transaction_manager.py`` is the shell.
"""

from __future__ import annotations

import collections
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from actors.instructions import Request, Send
from actors.roles import FRONT_DOOR, LOG_MANAGER
from config import TxnConfig
from wire import xid as xids
from wire.codec import Message
from wire.errors import CONFLICT_TEXT, ErrorCode, NodeError
from wire.messages import (
    ErrorReply,
    TxnAppend,
    TxnAsk,
    TxnBegin,
    TxnId,
    TxnList,
    TxnOutcome,
    TxnResolve,
    TxnsReply,
    TxnStart,
    TxnStep,
    TxnTable,
    TxnWrite,
    TxnWritten,
)
from wire.protocol import OFFSET_MAX
from wire.xid import Xid

ANSWER_WAIT_MS = 1000
# The highest id a request may name (the protocol's bound on its integers): an id the node
# picks never passes it, whatever ids clients picked (``Transactions._new_id``).
TXN_ID_MAX = OFFSET_MAX
STARTING_TEXT = "the transaction manager is starting (reading the log's transactions); retry"


class Phase(enum.Enum):
    ACTIVE = "active"
    IDLE = "idle"  # an XA branch after xa_end
    PREPARED = "prepared"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    TIMED_OUT = "timed out"
    ABORTED = "rolled back at a restart"


LIVE = (Phase.ACTIVE, Phase.IDLE, Phase.PREPARED)


@dataclass(slots=True)
class Txn:
    txn: int
    xid: Xid | None
    phase: Phase
    began: float
    deadline: float  # monotonic seconds; inf when prepared
    seq: int = 0  # writes staged so far
    records: int = 0
    bytes: int = 0
    shards: set[tuple[int, int]] = field(default_factory=set)
    conditional: bool = False  # it has compare-and-sets: the front door checks them
    conflicted: bool = False  # rolled back by the front door: a compare-and-set did not hold
    owner: int = 0  # the client that began it (0: not said): only it ends or commits it active
    before: Phase = Phase.ACTIVE  # the phase before the last step (undone if it is not sent)

    def name(self) -> str:
        return f"transaction {self.txn}" if self.xid is None else f"XA branch {self.xid}"


Out = Request | Send


def _reason(t: Txn) -> str:
    """Why ``t``, finished and not committed, was rolled back (``ROLLBACK_REASONS``)."""
    if t.conflicted:
        return "conflict"
    return {Phase.TIMED_OUT: "timeout", Phase.ABORTED: "restart"}.get(t.phase, "client")


class Transactions:
    def __init__(self, cfg: TxnConfig, first_id: int) -> None:
        assert 1 <= first_id <= TXN_ID_MAX, first_id
        self.cfg = cfg
        self.first_id = first_id  # this incarnation's random start, and where ids wrap to
        self.live: dict[int, Txn] = {}
        self.by_xid: dict[Xid, int] = {}
        # Finished transactions, for clear errors and repeated commits; bounded.
        self.finished: collections.OrderedDict[int, Txn] = collections.OrderedDict()
        self.finished_xids: dict[Xid, int] = {}
        self.next_id = first_id
        self.synced = False
        self.begun = 0
        self.committed = 0
        self.rolled_back = 0
        self.timed_out = 0

    # ---- at start ---------------------------------------------------------------------

    def sync(self, table: TxnTable, now: float) -> None:
        """What the log holds (the transaction manager just started): prepared branches come
        back in doubt; the log manager rolled back the open ones as it answered (see the
        module's doc), and their next call says so."""
        self.live.clear()
        self.by_xid.clear()
        aborted = set(table.aborted)
        for txn, xid, committed, writes, reason in table.outcomes:
            phase = (Phase.COMMITTED if committed
                     else Phase.ABORTED if txn in aborted or reason == "restart"
                     else Phase.TIMED_OUT if reason == "timeout" else Phase.ROLLED_BACK)
            self._remember(Txn(txn, None if xid is None else Xid(*xid), phase, now, math.inf,
                               seq=writes, conflicted=reason == "conflict",
                               before=phase))  # (logged: ``sent``)
        for txn, xid, _prepared, records, nbytes, shards, _first_lsn in table.open:
            self._add(Txn(txn, None if xid is None else Xid(*xid), Phase.PREPARED, now,
                          math.inf, records=records, bytes=nbytes,
                          shards={(t, p) for t, p in shards}))
        self.next_id = max(self.next_id, table.next_txn)
        self.synced = True

    # ---- requests ---------------------------------------------------------------------

    def begin(self, msg: TxnBegin, now: float) -> list[Out]:
        try:
            xid = None if msg.xid is None else xids.check(msg.xid)
            self._ready()
            if msg.txn:
                again = self._chosen(msg.txn, xid, msg.owner)
                if again is not None:
                    return [Send(FRONT_DOOR, TxnId(msg.corr, again), ANSWER_WAIT_MS)]
            if msg.timeout_ms > self.cfg.timeout_ms_max:
                raise NodeError(f"timeout_ms {msg.timeout_ms} is over txn.timeout_ms_max = "
                                f"{self.cfg.timeout_ms_max}",
                                ErrorCode.TXN_LIMIT if xid is None else ErrorCode.XAER_INVAL)
            if xid is not None and (xid in self.by_xid):
                raise NodeError(f"XA branch {xid} is in use", ErrorCode.XAER_DUPID)
            if len(self.live) >= self.cfg.open_max:
                raise NodeError(f"{len(self.live)} transactions are open or prepared, "
                                f"txn.open_max; commit or roll back some first",
                                ErrorCode.TXN_LIMIT if xid is None else ErrorCode.XAER_RMERR)
        except NodeError as exc:
            return [self._error(msg.corr, exc.code, exc.message)]
        txn = msg.txn or self._new_id()
        timeout_ms = msg.timeout_ms or self.cfg.timeout_ms
        t = Txn(txn, xid, Phase.ACTIVE, now, now + timeout_ms / 1000, owner=msg.owner)
        self._add(t)
        self.begun += 1
        return [Request(LOG_MANAGER, msg.corr,
                        TxnStart(msg.corr, txn, None if xid is None else list(xid)))]

    def _chosen(self, txn: int, xid: Xid | None, owner: int) -> int | None:
        """Check an id a client picked: None if it is free; the id again if this is a retry
        of its begin (the same branch of the same client, still active); else raise why
        not."""
        t = self.live.get(txn)
        if t is not None and t.xid == xid and t.phase is Phase.ACTIVE and t.owner == owner:
            return txn  # its begin sent again (the answer was lost; writes may have followed)
        done = self.finished.get(txn)
        if t is None and done is not None and done.phase is Phase.ABORTED:
            # Begun before a restart (its answer lost), and rolled back by it.
            raise NodeError(f"transaction id {txn} was rolled back at a restart; begin again "
                            f"with another", ErrorCode.TXN_ABORTED if xid is None
                            else ErrorCode.XA_RBROLLBACK)
        if t is not None or done is not None:
            raise NodeError(f"transaction id {txn} is in use; pick another",
                            ErrorCode.TXN_STATE if xid is None else ErrorCode.XAER_DUPID)
        return None

    def write(self, msg: TxnWrite, now: float) -> list[Out]:
        t = self.live.get(msg.txn)
        if t is None:
            done = self.finished.get(msg.txn)
            if done is not None and done.phase is Phase.COMMITTED and msg.seq < done.seq:
                # A write of a committed transaction sent again (its answer was lost): it
                # was staged and committed; answered as the first time.
                return [Send(FRONT_DOOR, TxnWritten(msg.corr, 0, done.records), ANSWER_WAIT_MS)]
            return [self._gone(msg.corr, msg.txn, None, "write to")]
        if t.phase is not Phase.ACTIVE:
            return [self._state(msg.corr, t, "stage more work in")]
        if msg.seq < t.seq:  # a retry of a write staged already
            return [Send(FRONT_DOOR, TxnWritten(msg.corr, 0, t.records), ANSWER_WAIT_MS)]
        if msg.seq > t.seq:
            return [self._error(msg.corr, ErrorCode.BAD_REQUEST,
                                f"write {msg.seq} of {t.name()} came before write {t.seq}")]
        if msg.conditional and t.xid is not None:
            return [self._error(msg.corr, ErrorCode.BAD_REQUEST,
                                f"{t.name()}: a compare-and-set in a transaction needs a local "
                                f"transaction (an XA branch's commit is its coordinator's)")]
        records = sum(row[2] for row in msg.parts)
        nbytes = sum(len(row[3]) for row in msg.parts)
        if t.records + records > self.cfg.records_max:
            return [self._limit(msg.corr, t, f"{t.records} + {records} records would pass "
                                f"txn.records_max = {self.cfg.records_max}")]
        if t.bytes + nbytes > self.cfg.bytes_max:
            return [self._limit(msg.corr, t, f"{t.bytes} + {nbytes} bytes would pass "
                                f"txn.bytes_max = {self.cfg.bytes_max}")]
        t.seq += 1
        t.conditional = t.conditional or msg.conditional
        t.records += records
        t.bytes += nbytes
        t.shards.update((row[0], row[1]) for row in msg.parts)
        t.shards.update((row[1], row[2]) for row in msg.offsets)
        return [Request(LOG_MANAGER, msg.corr,
                        TxnAppend(msg.corr, t.txn, msg.parts, msg.offsets))]

    def step(self, msg: TxnStep, now: float) -> list[Out]:
        corr, step = msg.corr, msg.step
        try:
            self._ready()
            xid = None if msg.xid is None else xids.check(msg.xid)
        except NodeError as exc:
            return [self._error(corr, exc.code, exc.message)]
        txn = msg.txn if xid is None else self.by_xid.get(xid, self.finished_xids.get(xid, 0))
        t = self.live.get(txn)
        if t is None:
            done = self.finished.get(txn)
            if done is None:
                return [self._gone(corr, txn, xid, step)]
            return self._again(corr, done, step)
        if (t.xid is None) != (xid is None):
            kind = "a local transaction: use txn_" if t.xid is None else "an XA branch: use xa_"
            return [self._error(corr, ErrorCode.BAD_REQUEST, f"{t.name()} is {kind}* calls")]
        if (t.phase is Phase.ACTIVE and t.owner and msg.owner != t.owner
                and (step == "end" or (step == "commit" and t.xid is None))):
            # XA associates an active branch with its thread of control: another client
            # ending it (and so committing what was staged so far) is refused, and so is
            # another's commit of an active local transaction. Rolling back is anyone's.
            # (An active branch's commit is refused by its state, below, whoever asks.)
            code = ErrorCode.TXN_STATE if t.xid is None else ErrorCode.XAER_PROTO
            return [self._error(corr, code, f"cannot {step} {t.name()}: it is active in "
                                f"another client, which alone may {step} it (or roll it "
                                f"back: anyone may)")]
        if msg.writes >= 0 and msg.writes != t.seq and t.phase is Phase.ACTIVE:
            code = ErrorCode.TXN_STATE if t.xid is None else ErrorCode.XAER_PROTO
            return [self._error(corr, code, f"cannot {step} {t.name()}: {msg.writes} writes "
                                f"were sent, {t.seq} staged (one was refused or lost); it "
                                f"stays open: send the missing ones again, or roll it back")]
        match step, t.phase:
            case "end", Phase.ACTIVE if t.xid is not None:
                t.phase = Phase.IDLE
                return [Send(FRONT_DOOR, TxnId(corr, t.txn), ANSWER_WAIT_MS)]
            case "prepare", Phase.IDLE:
                self._move(t, Phase.PREPARED)
                t.deadline = math.inf  # in doubt: only its coordinator or an operator ends it
                return [Request(LOG_MANAGER, corr, TxnResolve(corr, t.txn, "prepare"))]
            case "commit", Phase.ACTIVE if t.xid is None:
                if t.conditional and not msg.checked:
                    return [self._error(corr, ErrorCode.TXN_CONFLICT, (
                        f"{t.name()} has compare-and-sets that were not checked (the front "
                        f"door restarted since they were staged); it stays open: roll it "
                        f"back"))]
                return self._finish(corr, t, Phase.COMMITTED)
            case "commit", Phase.PREPARED:
                return self._finish(corr, t, Phase.COMMITTED)
            case "commit_one_phase", Phase.IDLE:
                return self._finish(corr, t, Phase.COMMITTED)
            case "rollback", _:
                t.conflicted = msg.checked
                return self._finish(corr, t, Phase.ROLLED_BACK)
        return [self._state(corr, t, step.replace("_", " in one phase "
                                                  if step == "commit_one_phase" else " "))]

    def ask(self, msg: TxnAsk) -> list[Out]:
        """How transaction ``txn`` ended, for the front door (a checked commit of it timed
        out there), changing nothing. The front door's messages are taken in order, so the
        answer reflects every step it sent before the question: committed (the log
        manager's ledger answers ``TxnCommitted`` with its LSN once durable; asked so, a
        commit already logged is answered, never made), or ``TxnOutcome``: still open
        (the commit never came, was refused leaving it open, or was reopened when the log
        manager could not take it), ended (rolled back, timed out, or at a restart),
        committing (its commit not yet taken by the log manager's mailbox: it may yet be
        reopened), or not known (forgotten, or never begun)."""
        corr, txn = msg.corr, msg.txn
        if not self.synced:
            return [self._error(corr, ErrorCode.UNAVAILABLE, STARTING_TEXT)]
        if txn in self.live:
            return [self._outcome(corr, "open")]
        done = self.finished.get(txn)
        if done is None:
            return [self._outcome(corr, "unknown")]
        if done.phase is not Phase.COMMITTED:
            return [self._outcome(corr, "ended")]
        if done.before is not Phase.COMMITTED:  # not yet in the log manager's mailbox
            return [self._outcome(corr, "committing")]
        return [Request(LOG_MANAGER, corr, TxnResolve(corr, txn, "commit"))]

    def _outcome(self, corr: int, outcome: str) -> Send:
        return Send(FRONT_DOOR, TxnOutcome(corr, outcome), ANSWER_WAIT_MS)

    def _again(self, corr: int, t: Txn, step: str) -> list[Out]:
        """A step on a finished transaction: the same outcome again, or why not."""
        if t.phase is Phase.COMMITTED and step in ("commit", "commit_one_phase"):
            return [Request(LOG_MANAGER, corr, TxnResolve(corr, t.txn, "commit"))]
        if t.phase is not Phase.COMMITTED and step == "rollback":
            return [Request(LOG_MANAGER, corr, TxnResolve(corr, t.txn, "rollback",
                                                          _reason(t)))]
        if t.conflicted and step == "commit":
            # Its first answer, lost: TXN_STATE sent the client's retry on to begin again.
            return [self._error(corr, ErrorCode.TXN_CONFLICT, CONFLICT_TEXT.format(t.txn))]
        if t.phase is Phase.ROLLED_BACK and t.xid is None and step == "commit":
            # Final, so that a client's commit sent again after a lost answer raises it
            # (TXN_STATE means "a write is missing" to it, and it would begin again). A
            # conflict was answered above: this one was rolled back by its client (or in a
            # log written before the reason was kept, either).
            return [self._error(corr, ErrorCode.TXN_ABORTED, (
                f"cannot commit {t.name()}: it is rolled back (by its client, or because "
                f"a compare-and-set of it did not hold)"))]
        return [self._state(corr, t, step)]

    def _finish(self, corr: int, t: Txn, phase: Phase) -> list[Out]:
        self._move(t, phase)
        del self.live[t.txn]
        if t.xid is not None:
            self.by_xid.pop(t.xid, None)
        self._remember(t)
        if phase is Phase.COMMITTED:
            self.committed += 1
        else:
            self.rolled_back += 1
        if phase is Phase.COMMITTED:
            return [Request(LOG_MANAGER, corr, TxnResolve(corr, t.txn, "commit"))]
        return [Request(LOG_MANAGER, corr, TxnResolve(corr, t.txn, "rollback", _reason(t)))]

    def listing(self, msg: TxnList, now: float) -> list[Out]:
        if not self.synced:
            return [self._error(msg.corr, ErrorCode.UNAVAILABLE, STARTING_TEXT)]
        if msg.prepared_only:
            rows = [list(t.xid) for t in self.live.values()
                    if t.phase is Phase.PREPARED and t.xid is not None]
            return [Send(FRONT_DOOR, TxnsReply(msg.corr, "xids", rows), ANSWER_WAIT_MS)]
        rows = [[t.txn, "" if t.xid is None else str(t.xid), t.phase.value,
                 int((now - t.began) * 1000), t.records, t.bytes, len(t.shards)]
                for t in self.live.values()]
        return [Send(FRONT_DOOR, TxnsReply(msg.corr, "txns", rows), ANSWER_WAIT_MS)]

    # ---- time, and what could not be sent --------------------------------------------

    def tick(self, now: float) -> list[Out]:
        """Roll back the transactions open past their timeout."""
        out: list[Out] = []
        for t in [t for t in self.live.values() if now > t.deadline]:
            self._move(t, Phase.TIMED_OUT)
            del self.live[t.txn]
            if t.xid is not None:
                self.by_xid.pop(t.xid, None)
            self._remember(t)
            self.timed_out += 1
            out.append(Send(LOG_MANAGER, TxnResolve(0, t.txn, "rollback", "timeout"),
                            ANSWER_WAIT_MS))
        return out

    def sent(self, msg: Message) -> None:
        """The log manager's mailbox took ``msg``: a step it logs can no longer be undone.
        (Else ``unsent`` of a later message naming the transaction — a retried commit's,
        a question's — reopened one whose commit the log manager had taken.)"""
        if isinstance(msg, TxnResolve):
            t = self.live.get(msg.txn) or self.finished.get(msg.txn)
            if t is not None:
                t.before = t.phase

    def unsent(self, msg: Message) -> None:
        """The log manager's mailbox did not take ``msg``: undo what sending it did."""
        match msg:
            case TxnStart(txn=txn):
                t = self.live.pop(txn, None)
                if t is not None and t.xid is not None:
                    self.by_xid.pop(t.xid, None)
            case TxnAppend(txn=txn, parts=parts):
                t = self.live.get(txn)
                if t is not None:
                    t.seq -= 1
                    t.records -= sum(row[2] for row in parts)
                    t.bytes -= sum(len(row[3]) for row in parts)
            case TxnResolve(txn=txn):
                t = self.live.get(txn) or self.finished.get(txn)
                if t is not None and t.phase is not t.before:
                    if t.phase not in LIVE:
                        self.finished.pop(txn, None)
                        if t.xid is not None:
                            self.finished_xids.pop(t.xid, None)
                        self.committed -= t.phase is Phase.COMMITTED
                        self.rolled_back -= t.phase is Phase.ROLLED_BACK
                        self.timed_out -= t.phase is Phase.TIMED_OUT
                    t.phase = t.before
                    t.conflicted = False  # open again: its next end says how it ends
                    self._add(t)

    def open_count(self) -> int:
        """Transactions open and not prepared: what a blocking checkpoint waits for."""
        return sum(1 for t in self.live.values() if t.phase is not Phase.PREPARED)

    # ---- helpers ----------------------------------------------------------------------

    def _ready(self) -> None:
        if not self.synced:
            raise NodeError(STARTING_TEXT, ErrorCode.UNAVAILABLE)

    def _new_id(self) -> int:
        """The next free id above every id the log has seen; past ``TXN_ID_MAX`` (a client
        picked an id at the top: the log remembers it as the highest, through restarts and
        snapshots) the ids start again from this incarnation's random start, as those of a
        node with an empty log do."""
        while (self.next_id > TXN_ID_MAX or self.next_id in self.live
               or self.next_id in self.finished):
            self.next_id = self.first_id if self.next_id > TXN_ID_MAX else self.next_id + 1
        txn = self.next_id
        self.next_id += 1
        return txn

    def _add(self, t: Txn) -> None:
        self.live[t.txn] = t
        if t.xid is not None:
            self.by_xid[t.xid] = t.txn

    def _move(self, t: Txn, phase: Phase) -> None:
        t.before, t.phase = t.phase, phase

    def _remember(self, t: Txn) -> None:
        self.finished[t.txn] = t
        self.finished.move_to_end(t.txn)
        if t.xid is not None:
            self.finished_xids[t.xid] = t.txn
        while len(self.finished) > self.cfg.outcomes_max:
            _txn, old = self.finished.popitem(last=False)
            if old.xid is not None and self.finished_xids.get(old.xid) == old.txn:
                del self.finished_xids[old.xid]

    def _error(self, corr: int, code: ErrorCode, text: str) -> Send:
        return Send(FRONT_DOOR, ErrorReply(corr, code, text), ANSWER_WAIT_MS)

    def _gone(self, corr: int, txn: int, xid: Xid | None, what: str) -> Send:
        done = self.finished.get(txn)
        if done is not None:
            return self._state(corr, done, what)
        if xid is not None:
            return self._error(corr, ErrorCode.XAER_NOTA, f"no XA branch {xid} is known")
        return self._error(corr, ErrorCode.TXN_UNKNOWN, f"no transaction {txn} is known "
                           f"(never begun, finished long ago, or committed whole by one "
                           f"txn_once request)")

    def _limit(self, corr: int, t: Txn, text: str) -> Send:
        code = ErrorCode.TXN_LIMIT if t.xid is None else ErrorCode.XAER_RMERR
        return self._error(corr, code, f"{t.name()}: {text}; the transaction stays open")

    def _state(self, corr: int, t: Txn, what: str) -> Send:
        """The error for a call ``what`` that ``t``'s phase does not allow."""
        text = f"cannot {what} {t.name()}: it is {t.phase.value}"
        xa = t.xid is not None
        if t.phase is Phase.TIMED_OUT:
            code = ErrorCode.XA_RBTIMEOUT if xa else ErrorCode.TXN_TIMED_OUT
            text += " (open past its timeout, and rolled back)"
        elif t.phase is Phase.ABORTED:
            code = ErrorCode.XA_RBROLLBACK if xa else ErrorCode.TXN_ABORTED
            text += " (the node restarted before it was prepared or committed)"
        else:
            code = ErrorCode.XAER_PROTO if xa else ErrorCode.TXN_STATE
        return self._error(corr, code, text)

    def figures(self) -> dict[str, Any]:
        phases = collections.Counter(t.phase.value for t in self.live.values())
        return {
            "txn_open": phases["active"] + phases["idle"],
            "txn_prepared": phases["prepared"],
            "txn_begun": self.begun,
            "txn_committed": self.committed,
            "txn_rolled_back": self.rolled_back,
            "txn_timed_out": self.timed_out,
        }
