"""The transaction manager's logic, with no I/O: store transactions and the checkpoint gate.

Every write (produce, topic change, offset commit) is a store transaction: it begins when
the transaction manager passes it on to the log manager and ends when the log manager has
answered it (its group is durable, or it was refused). Begin and end are batched — a burst
of requests begins together, a group commit ends together — so the hot path pays no round
trip per record.

During a ``blocking`` checkpoint (SwiftMQ's) the gate is closed: new transactions are held
back, and once the active ones have ended the manager says ready. In ``fuzzy`` mode it says
ready at once, with the oldest LSN an active transaction still needs (none: see
``oldest_lsn``). Clients' transactions (``actors/transactions.py``) are checked here too: a
blocking checkpoint also waits for those open and not prepared, but for the one at a clean
stop (``front_closed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from actors.instructions import Forward, Send
from actors.roles import FRONT_DOOR, LOG_MANAGER
from wire.errors import ErrorCode
from wire.messages import CheckpointReady, ErrorReply, GateHeld, Writes

HELD_FULL_TEXT = "the log manager cannot take more now (a full queue or a checkpoint); retry later"


def busy(corr: int) -> Send:
    """Answer a write request BUSY: it never began (the held queue is full, or the log
    manager's mailbox was)."""
    return Send(FRONT_DOOR, ErrorReply(corr, ErrorCode.BUSY, HELD_FULL_TEXT), wait_ms=100)


class TxnState:
    def __init__(self, mode: str, held_max: int, stale_s: float,
                 gate_s_max: float, open_transactions: Callable[[], int] = lambda: 0) -> None:
        assert mode in ("fuzzy", "blocking")
        self.mode = mode
        # Clients' transactions open and not prepared (actors/transactions.py): a blocking
        # checkpoint waits for them too; prepared ones it does not wait for (they may stay
        # in doubt for days), as their staged records are in the shards it flushes.
        self.open_transactions = open_transactions
        self.held_max = held_max
        self.stale_s = stale_s  # an active transaction older than this was lost with its request
        self.active: dict[int, float] = {}  # corr → when it began
        self.gate: int | None = None  # the checkpoint holding new transactions back
        self.ready_sent = False  # said ready for the gate's checkpoint already
        self.gate_s_max = gate_s_max  # a gate whose "finished" was lost opens by itself
        self.gate_since = 0.0
        self.held: list[Writes] = []  # bursts held back at the closed gate, in order
        self.held_count = 0  # the requests in them
        self.held_corrs: set[int] = set()  # their correlation ids
        self.began = 0
        self.held_total = 0  # requests ever held back at a closed gate
        self.ended = 0
        self.expired = 0
        # The node is stopping and its front door is closed: no client can end an open
        # transaction any more, so the gate no longer waits for them.
        self.front_is_closed = False

    def oldest_lsn(self) -> int:
        """The oldest LSN an active transaction still needs; 0 when none needs any.

        None does: a store transaction's record reaches the log only in the group commit
        that ends it, and what a client's transaction staged is applied to the shards'
        ``staged`` column family, which the checkpoint flushes before it truncates, while
        its state is in the log manager's snapshot (docs/ARCHITECTURE.md, "Transactions")."""
        return 0

    def recheck(self) -> list[Forward | Send]:
        """A client's transaction ended: a closed gate may now say ready."""
        return self._maybe_ready()

    def front_closed(self) -> list[Forward | Send]:
        """A clean stop closed the front door: the checkpoint at stop waits for the writes
        in flight only. A transaction still open is rolled back at the next start (its
        records are staged in the shards the checkpoint flushes, as a fuzzy one's are);
        waiting for it, the checkpoint gave up after ``checkpoint_timeout_ms``."""
        self.front_is_closed = True
        return self._maybe_ready()

    def requests(self, writes: Writes, now: float) -> list[Forward | Send]:
        """New write requests from the front door: begun and passed on, or held back while
        the gate is closed (those past ``held_max`` are answered BUSY)."""
        if self.gate is None:
            return [self._begin(writes, now)]
        room = max(0, self.held_max - self.held_count)
        n = len(writes.corrs)
        out: list[Forward | Send] = []
        if room:
            self.held.append(writes if n <= room else writes.slice(0, room))
            taken = min(n, room)
            self.held_count += taken
            self.held_total += taken
            corrs = list(writes.corrs[:taken])
            self.held_corrs.update(corrs)
            # For the front door's checked commits, which may go ahead of these (GateHeld).
            out.append(Send(FRONT_DOOR, GateHeld(corrs, True), wait_ms=100))
        return out + [busy(corr) for corr in writes.corrs[room:]]

    def holds(self, corrs: Iterable[int]) -> bool:
        """Whether every one of these write requests is held at the closed gate."""
        return self.gate is not None and all(c in self.held_corrs for c in corrs)

    def begin(self, corrs: list[int], now: float) -> bool:
        """Begin these write transactions at once, their requests to be passed on as they
        came; False (nothing begun) while the gate is closed: then ``requests`` holds them."""
        if self.gate is not None:
            return False
        for corr in corrs:
            self.active[corr] = now
        self.began += len(corrs)
        return True

    def _begin(self, writes: Writes, now: float) -> Forward:
        for corr in writes.corrs:
            self.active[corr] = now
        self.began += len(writes.corrs)
        return Forward(LOG_MANAGER, writes)

    def end(self, corrs: list[int]) -> list[Forward | Send]:
        for corr in corrs:
            if self.active.pop(corr, None) is not None:
                self.ended += 1
        return self._maybe_ready()

    def checkpoint_requested(self, ckpt_id: int, now: float = 0.0) -> list[Forward | Send]:
        if self.mode == "fuzzy":
            return [self._ready(ckpt_id)]
        self.gate = ckpt_id
        self.gate_since = now
        self.ready_sent = False
        return self._maybe_ready()

    def checkpoint_finished(self, ckpt_id: int, now: float) -> list[Forward | Send]:
        if self.gate != ckpt_id:
            return []
        self.gate = None
        if not self.held:
            return []
        held, self.held, self.held_count = self.held, [], 0
        released, self.held_corrs = self.held_corrs, set()
        return [self._begin(Writes.join(held), now),
                Send(FRONT_DOOR, GateHeld(sorted(released), False), wait_ms=100)]

    def tick(self, now: float) -> list[Forward | Send]:
        """Forget transactions whose request was lost (a restarted log manager, say)."""
        stale = [corr for corr, began in self.active.items() if now - began > self.stale_s]
        for corr in stale:
            del self.active[corr]
        self.expired += len(stale)
        if self.gate is not None and now - self.gate_since > self.gate_s_max:
            return self.checkpoint_finished(self.gate, now)  # its "finished" never came
        return self._maybe_ready()

    def _ready(self, ckpt_id: int) -> Send:
        return Send(LOG_MANAGER, CheckpointReady(ckpt_id, self.oldest_lsn()), wait_ms=1000)

    def _maybe_ready(self) -> list[Forward | Send]:
        # The gate stays closed until the checkpoint finishes; ready is said once.
        if (self.gate is not None and not self.active and not self.ready_sent
                and (self.front_is_closed or not self.open_transactions())):
            self.ready_sent = True
            return [self._ready(self.gate)]
        return []
