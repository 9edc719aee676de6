"""The transaction manager actor: store transactions, and the checkpoint gate.

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
import io
import logging
import time
from typing import Any, assert_never

import msgpack

from actors.base import Actor, ActorContext
from actors.instructions import Forward, Send
from actors.roles import LOG_MANAGER
from actors.txn_state import TxnState, busy
from wire.codec import Message
from wire.messages import (
    CheckpointFinished,
    CheckpointRequest,
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    Ended,
    Writes,
)

log = logging.getLogger("shardnode")

CORRS_READ_BYTES = 8192  # read this much of a burst at a time to find its correlation ids
WRITES_ARRAY_LEN = 1 + len(dataclasses.fields(Writes))  # its tag, then its fields: corrs first


def writes_corrs(frame: bytes) -> list[int] | None:
    """The correlation ids of a ``Writes`` frame, read without decoding its requests; None
    for any other message (or a frame that is not one)."""
    # Read through a file over the frame, a few KiB at a time: feeding the frame to the
    # unpacker would copy all of it.
    unpacker = msgpack.Unpacker(io.BytesIO(frame), read_size=CORRS_READ_BYTES, raw=False)
    try:
        if unpacker.read_array_header() != WRITES_ARRAY_LEN or unpacker.unpack() != Writes.TAG:
            return None
        corrs = unpacker.unpack()
    except Exception:  # not msgpack, or not an array: the codec says why
        return None
    return corrs if type(corrs) is list and all(type(c) is int for c in corrs) else None


class TransactionManager(Actor):
    def __init__(self, ctx: ActorContext) -> None:
        super().__init__(ctx)
        self.state = TxnState(self.cfg.log.checkpoint_mode, self.cfg.transactions.held_requests_max,
                              stale_s=2 * self.cfg.limits.request_timeout_ms / 1000,
                              gate_s_max=2 * self.cfg.log.checkpoint_timeout_ms / 1000)
        self.incoming: list[Writes] = []  # bursts read whole (the gate was closed), in order
        self.passing: list[tuple[list[int], bytes]] = []  # bursts begun, to pass on as they came
        self.gate_closed_at = 0.0

    def handle_frame(self, frame: bytes) -> None:
        corrs = writes_corrs(frame)
        if corrs is not None and not self.incoming and self.state.begin(corrs, time.monotonic()):
            self.passing.append((corrs, frame))
            return
        super().handle_frame(frame)

    def on_message(self, msg: Message) -> None:
        match msg:
            case Writes():
                self.incoming.append(msg)
            case CreateTopic(corr) | DeleteTopic(corr) | CommitOffset(corr):
                # A write request sent alone: a burst of one, as its encoded message.
                self.incoming.append(Writes([corr], [], [(0, self.current_frame)]))
            case Ended(corrs):
                self.perform(self.state.end(corrs))
            case CheckpointRequest(ckpt_id):
                self.gate_closed_at = time.monotonic()
                self.perform(self.state.checkpoint_requested(ckpt_id, time.monotonic()))
            case CheckpointFinished(ckpt_id):
                if self.state.gate is not None:
                    log.info("checkpoint %d finished; gate was closed %.1f ms", ckpt_id,
                             (time.monotonic() - self.gate_closed_at) * 1000)
                self.perform(self.state.checkpoint_finished(ckpt_id, time.monotonic()))
            case _:
                self.unexpected(msg)

    def on_idle(self) -> None:
        if self.passing:
            passing, self.passing = self.passing, []
            for i, (_corrs, frame) in enumerate(passing):
                if not self.send_bytes(LOG_MANAGER, frame, wait_ms=1000):
                    # The log manager is behind or restarting: these never began.
                    unsent = [c for cs, _f in passing[i:] for c in cs]
                    self.state.end(unsent)
                    self.perform([busy(corr) for corr in unsent])
                    break
        if self.incoming:
            incoming, self.incoming = self.incoming, []
            self.perform(self.state.requests(Writes.join(incoming), time.monotonic()))

    def on_tick(self, now: float) -> None:
        self.perform(self.state.tick(now))

    def perform(self, instructions: list[Forward | Send]) -> None:
        for ins in instructions:
            match ins:
                case Forward(role, writes):
                    unsent = self.send_writes(role, writes, wait_ms=1000)
                    if unsent:
                        # The log manager is behind or restarting: the rest never began.
                        self.state.end(unsent)
                        self.perform([busy(corr) for corr in unsent])
                case Send(role, msg, wait_ms):
                    self.send(role, msg, wait_ms)
                case _:
                    assert_never(ins)

    def figures(self) -> dict[str, Any]:
        s = self.state
        return {
            "active": len(s.active),
            "held": s.held_count,
            "held_total": s.held_total,
            "gate": s.gate is not None,
            "began": s.began,
            "ended": s.ended,
            "expired": s.expired,
        }
