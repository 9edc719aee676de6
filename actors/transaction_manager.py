"""The transaction manager actor: clients' transactions and XA branches, store transactions,
and the checkpoint gate.

Clients' transaction calls come here from the front door; the logic
(``actors/transactions.py``) decides, and what is to be logged goes on to the log manager,
which answers the client through the front door. At start it asks the log manager which
transactions the log holds (``TxnSync``) and answers UNAVAILABLE until it knows.

When checkpoints are ``blocking``, write requests from the front door pass through here on
their way to the log manager (a burst of them as one ``Writes`` message), so that the gate
can hold them; the log manager tells it which ended, every 50 ms or at once while a
checkpoint waits. While the gate is open a burst goes on as the very frame that came: only
its correlation ids are read, the requests (up to 16 MiB of records) are neither decoded
nor copied. With ``fuzzy`` checkpoints nothing is held, and writes go straight to the log
manager (``actors.roles.writes_role``): here a checkpoint request is answered ready at once.
See ``actors/txn_state.py`` for the logic.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any, assert_never

import msgpack

from actors.base import Actor, ActorContext
from actors.instructions import Forward, Request, Send
from actors.roles import FRONT_DOOR, LOG_MANAGER
from actors.transactions import Transactions
from actors.txn_state import TxnState, busy
from wire import codec
from wire.codec import Message
from wire.errors import ErrorCode
from wire.messages import (
    AlterTopic,
    CheckpointFinished,
    CheckpointRequest,
    CommitOffset,
    CreateTopic,
    DeleteRecord,
    DeleteTopic,
    Ended,
    ErrorReply,
    FrontClosed,
    TxnAsk,
    TxnBegin,
    TxnList,
    TxnOnce,
    TxnStep,
    TxnSync,
    TxnTable,
    TxnWrite,
    Writes,
)

log = logging.getLogger("shardnode")

SYNC_RETRY_S = 1.0  # ask the log manager again for its transactions if no answer came
GATE_TEXT = ("a blocking checkpoint is waiting for open transactions to end; begin this one "
             "after it (retry)")
AHEAD_TEXT = ("a write of a compare-and-set's key left the checkpoint's gate as the commit was "
              "decided; commit again (retry)")
CORRS_READ_BYTES = 8192  # read this much of a burst at a time to find its correlation ids
WRITES_ARRAY_LEN = 1 + len(dataclasses.fields(Writes))  # its tag, then its fields: corrs first
WRITES_HEADER = 0x90 | WRITES_ARRAY_LEN  # msgpack's fixarray of that length
assert WRITES_ARRAY_LEN < 16 and Writes.TAG < 128  # a fixarray, then a positive fixint


def writes_corrs(frame: bytes | memoryview) -> list[int] | None:
    """The correlation ids of a ``Writes`` frame, read without decoding its requests; None
    for any other message (or a frame that is not one)."""
    # Its first two bytes tell a Writes (an array of its fields, then its tag) from the
    # rest; then it is read a few KiB at a time until the ids are whole: feeding the whole
    # frame to an unpacker would copy all of it.
    if len(frame) < 2 or frame[0] != WRITES_HEADER or frame[1] != Writes.TAG:
        return None
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(frame))
    unpacker.feed(frame[2:CORRS_READ_BYTES])
    pos = CORRS_READ_BYTES
    while True:
        try:
            corrs = unpacker.unpack()
            break
        except msgpack.OutOfData:
            if pos >= len(frame):
                return None
            unpacker.feed(frame[pos:pos + CORRS_READ_BYTES])
            pos += CORRS_READ_BYTES
        except Exception:  # not msgpack: the codec says why
            return None
    return corrs if type(corrs) is list and all(type(c) is int for c in corrs) else None


class TransactionManager(Actor):
    # A transaction's writes go on to the log manager as they came (``TxnAppend``, ``TxnOnce``).
    VIEW_TAGS = frozenset({TxnWrite.TAG, TxnOnce.TAG})

    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        # Ids of this incarnation start at a random point, or above every id in the log
        # (``Transactions.sync``). An id handed out just before a crash, whose start never
        # reached the log, may so be handed out again: its client was never told it, as a
        # start is answered only once durable (``actors/log_state.py``).
        self.txns = Transactions(self.cfg.txn, first_id=secrets.randbits(30) << 32 | 1)
        self.state = TxnState(self.cfg.log.checkpoint_mode, self.cfg.txn.held_requests_max,
                              stale_s=2 * self.cfg.limits.request_timeout_ms / 1000,
                              gate_s_max=2 * self.cfg.log.checkpoint_timeout_ms / 1000,
                              open_transactions=self.txns.open_count)
        self.sync_asked = 0.0
        self.to_log: list[Message] = []  # transactions' requests for the log manager
        self.incoming: list[Writes] = []  # bursts read whole (the gate was closed), in order
        # Bursts begun, to pass on as they came.
        self.passing: list[tuple[list[int], bytes | memoryview]] = []
        self.gate_closed_at = 0.0

    def on_start(self) -> None:
        self.ask_sync()

    def ask_sync(self) -> None:
        self.sync_asked = time.monotonic()
        self.send(LOG_MANAGER, TxnSync(self.role), wait_ms=1000)

    def handle_frame(self, frame: bytes | memoryview) -> None:
        corrs = writes_corrs(frame)
        if corrs is not None and not self.incoming and self.state.begin(corrs, time.monotonic()):
            self.passing.append((corrs, frame))
            return
        super().handle_frame(frame)

    def on_message(self, msg: Message) -> None:
        match msg:
            case Writes():
                self.incoming.append(msg)
            case (CreateTopic(corr) | DeleteTopic(corr) | CommitOffset(corr)
                  | DeleteRecord(corr) | AlterTopic(corr)):
                # A write request sent alone: a burst of one, as its encoded message.
                self.incoming.append(Writes([corr], [], [(0, bytes(self.current_frame))]))
            case TxnBegin(corr):
                if self.state.gate is not None:
                    self.perform([Send(FRONT_DOOR, ErrorReply(corr, ErrorCode.BUSY, GATE_TEXT),
                                       wait_ms=100)])
                else:
                    self.perform(self.txns.begin(msg, time.monotonic()))
            case TxnWrite():
                self.perform(self.txns.write(msg, time.monotonic()))
            case TxnOnce(corr):
                # A whole transaction in one request takes the write route (the log manager
                # checks it, ``LogState.once``): it comes here only to pass the gate of a
                # blocking checkpoint, held back (refused BUSY: the client sends it again)
                # while the gate is closed, and waited for while it is open.
                if self.state.begin([corr], time.monotonic()):
                    self.perform([Request(LOG_MANAGER, corr, msg)])
                else:
                    self.perform([Send(FRONT_DOOR, ErrorReply(corr, ErrorCode.BUSY, GATE_TEXT),
                                       wait_ms=100)])
            case TxnStep(corr, ahead_of=ahead_of) if ahead_of and not self.state.holds(ahead_of):
                # Decided at the front door ahead of writes it was told were held at the
                # gate, which has let some through since: they may be logged before it.
                self.perform([Send(FRONT_DOOR, ErrorReply(corr, ErrorCode.BUSY, AHEAD_TEXT),
                                   wait_ms=100)])
            case TxnStep():
                self.perform(self.txns.step(msg, time.monotonic()))
                self.perform(self.state.recheck())
            case TxnList():
                self.perform(self.txns.listing(msg, time.monotonic()))
            case TxnAsk():
                self.perform(self.txns.ask(msg))
            case TxnTable():
                self.txns.sync(msg, time.monotonic())
                log.info("transactions: %d prepared in doubt, %d open rolled back at start",
                         len(self.txns.live), len(msg.open) - len(self.txns.live))
            case Ended(corrs):
                self.perform(self.state.end(corrs))
            case CheckpointRequest(ckpt_id):
                self.gate_closed_at = time.monotonic()
                self.perform(self.state.checkpoint_requested(ckpt_id, time.monotonic()))
            case FrontClosed():
                self.perform(self.state.front_closed())
            case CheckpointFinished(ckpt_id):
                if self.state.gate is not None:
                    log.info("checkpoint %d finished; gate was closed %.1f ms", ckpt_id,
                             (time.monotonic() - self.gate_closed_at) * 1000)
                self.perform(self.state.checkpoint_finished(ckpt_id, time.monotonic()))
            case _:
                self.unexpected(msg)

    def on_stop(self) -> None:
        self.flush_to_log()

    def on_idle(self) -> None:
        self.flush_to_log()
        if self.passing:
            passing, self.passing = self.passing, []
            for i, (_corrs, frame) in enumerate(passing):
                if not self.send_bytes(LOG_MANAGER, frame, wait_ms=1000):
                    # The log manager is behind or restarting: these never began.
                    unsent = [c for cs, _f in passing[i:] for c in cs]
                    self.perform([busy(corr) for corr in unsent])
                    self.perform(self.state.end(unsent))  # a closed gate may say ready
                    break
        if self.incoming:
            incoming, self.incoming = self.incoming, []
            self.perform(self.state.requests(Writes.join(incoming), time.monotonic()))

    def on_tick(self, now: float) -> None:
        if not self.txns.synced and now - self.sync_asked > SYNC_RETRY_S:
            self.ask_sync()  # the log manager was restarting
        self.perform(self.txns.tick(now))
        self.perform(self.state.tick(now))

    def perform(self, instructions: Sequence[Forward | Send | Request]) -> None:
        for ins in instructions:
            match ins:
                case Request(role, _corr, msg):
                    # Sent at the end of the burst, with the others, as one bundle.
                    assert role == LOG_MANAGER
                    self.to_log.append(msg)
                case Forward(role, writes):
                    if role == LOG_MANAGER:
                        # After the transactions' requests made before: a checked commit
                        # decided ahead of held writes must reach the log before them.
                        self.flush_to_log()
                    unsent = self.send_writes(role, writes, wait_ms=1000)
                    if unsent:
                        # The log manager is behind or restarting: the rest never began.
                        self.perform([busy(corr) for corr in unsent])
                        self.perform(self.state.end(unsent))  # a closed gate may say ready
                case Send(role, msg, wait_ms):
                    if role == LOG_MANAGER:
                        self.flush_to_log()  # in the order they were made
                    if not self.send(role, msg, wait_ms) and role == LOG_MANAGER:
                        # A timeout's rollback: open again, it is timed out (and sent)
                        # again at the next tick.
                        self.txns.unsent(msg)
                case _:
                    assert_never(ins)

    def flush_to_log(self) -> None:
        """Send the transactions' requests of this burst to the log manager, as one bundle;
        those it cannot take are undone and answered BUSY."""
        if not self.to_log:
            return
        msgs, self.to_log = self.to_log, []
        sent = self.send_many(LOG_MANAGER, [codec.encode(m) for m in msgs], wait_ms=1000)
        for msg in msgs[:sent]:
            self.txns.sent(msg)
        for msg in msgs[sent:]:
            self.txns.unsent(msg)
            corr = getattr(msg, "corr", 0)
            if corr:
                self.perform(self.state.end([corr]))  # a TxnOnce a blocking gate waits for
                self.perform([busy(corr)])

    def figures(self) -> dict[str, Any]:
        s = self.state
        return {
            **self.txns.figures(),
            "active": len(s.active),
            "held": s.held_count,
            "held_total": s.held_total,
            "gate": s.gate is not None,
            "began": s.began,
            "ended": s.ended,
            "expired": s.expired,
        }
