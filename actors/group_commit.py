"""The log manager's group-commit policy: when to commit, to hand off, to tell.

No I/O and no clock: the log manager (``actors/log_manager.py``) passes ``now`` in, asks,
and does the writing, fsyncing and sending itself.

- **Commit.** Requests queue as the log manager admits them; a group is committed once it
  reaches ``group_bytes_max`` or ``group_requests_max``, else after the burst that brought
  them. When the previous group held more than one request, a crowd is writing: the group
  then waits up to ``group_wait_us_max`` for stragglers (or until it is full).
- **Hand off.** Durable groups go on to the cache manager merged (``HandOff``).
- **Tell.** When writes come through the transaction manager, it hears which requests
  ended every ``ENDED_INTERVAL_S``, or once ``ENDED_ROWS_MAX`` wait, and at once while a
  checkpoint waits for it. Telling it after every group commit woke it once more per
  group, for nothing outside a checkpoint.

Asked once per admitted request (``add``), so it keeps to plain attributes.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.hand_off import HandOff
from actors.instructions import Log

# The transaction manager hears which requests were answered at least this often (s), or
# once this many are waiting to be told, and at once while a checkpoint waits for it.
ENDED_INTERVAL_S = 0.05
ENDED_ROWS_MAX = 8192


class GroupCommit:
    """The queue of the next group commit, the groups waiting to be handed off, and the
    requests ended but not yet told."""

    __slots__ = ("bytes_max", "ended", "ended_told", "hand_off", "last_group_size", "queue",
                 "queued_bytes", "requests_max", "track_ended", "wait_us_max")

    def __init__(self, bytes_max: int, requests_max: int, wait_us_max: int,
                 track_ended: bool) -> None:
        self.bytes_max = bytes_max
        self.requests_max = requests_max
        self.wait_us_max = wait_us_max
        self.queue: list[Log] = []
        self.queued_bytes = 0
        self.last_group_size = 0  # requests in the group committed last
        self.hand_off = HandOff()
        self.track_ended = track_ended  # the transaction manager began these requests
        self.ended: list[int] = []  # requests answered since it was last told
        self.ended_told = 0.0  # when it was last told

    # ---- committing -------------------------------------------------------------------

    def add(self, out: Log) -> bool:
        """Queue a request's record for the next group; True: the group is full, commit
        it now."""
        self.queue.append(out)
        self.queued_bytes += len(out.record)
        return self.queued_bytes >= self.bytes_max or len(self.queue) >= self.requests_max

    def straggler_deadline(self, now: float) -> float | None:
        """After a burst, with requests queued: until when to wait for stragglers before
        committing them, or None to commit now."""
        if self.last_group_size > 1 and self.wait_us_max > 0:
            return now + self.wait_us_max / 1e6
        return None

    def straggler_wait_ms(self, now: float, deadline: float) -> int:
        """How long to wait for the next straggler (ms); 0: stop waiting, the group is full
        or the time is up."""
        if len(self.queue) >= self.requests_max:
            return 0
        left_ms = (deadline - now) * 1000
        return int(left_ms) + 1 if left_ms > 0 else 0

    def take(self) -> list[Log]:
        """The group to commit now (it may be empty); the queue starts again."""
        group, self.queue, self.queued_bytes = self.queue, [], 0
        self.last_group_size = len(group)
        return group

    # ---- handing off ------------------------------------------------------------------

    def durable(self, first_lsn: int, last_lsn: int, records: Sequence[bytes], size: int,
                now: float) -> bool:
        """A group is durable and acknowledged; True: enough waits, hand off now."""
        self.hand_off.add(first_lsn, last_lsn, records, size, now)
        return self.hand_off.full()

    def hand_off_due(self, now: float) -> bool:
        return self.hand_off.is_due(now)

    def hand_off_in_ms(self, now: float) -> int | None:
        """How long the log manager may sleep before handing off (ms); None: no limit."""
        return self.hand_off.due_in_ms(now)

    def take_hand_off(self) -> tuple[int, int, list[bytes], int] | None:
        """The durable groups not handed off yet, merged: first LSN, last LSN, records, and
        their bytes."""
        return self.hand_off.take() if self.hand_off.datas else None

    # ---- telling the transaction manager ----------------------------------------------

    def ended_one(self, corr: int) -> None:
        """A request was answered without a group commit."""
        if self.track_ended:
            self.ended.append(corr)

    def ended_group(self, group: list[Log]) -> None:
        """A group's requests were answered."""
        if self.track_ended:
            self.ended.extend(p.reply.corr for p in group if p.reply is not None)

    def tell_due(self, now: float, checkpoint_waits: bool) -> bool:
        """Whether to tell the transaction manager now which requests ended."""
        if not self.ended:
            return False
        return (checkpoint_waits or len(self.ended) >= ENDED_ROWS_MAX
                or now - self.ended_told >= ENDED_INTERVAL_S)

    def take_ended(self, now: float) -> list[int]:
        """The requests to tell it of (maybe none), as it is told at ``now``."""
        self.ended_told = now
        if not self.ended:
            return []
        ended, self.ended = self.ended, []
        return ended
