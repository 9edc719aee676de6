"""Flow control on the data path: how much a sender may have in flight to a receiver, when
the receiver says how far it got, and how a burst is cut into frames under a byte bound.

The log manager sends durable groups to the cache manager, which sends them on to the
shard writers. Mailboxes are bounded in messages, and a group can be tens of MiB, so each
sender also bounds the bytes in flight (``GroupsInFlight``); each receiver reports what it
applied (``ProgressReport`` decides when). A receiver that was skipped reads what it
missed from the log files.
"""

from __future__ import annotations

import collections

from wire.codec import FRAME_BYTES_MAX_DEFAULT

BUNDLE_BYTES_MAX = 16 * 1024 * 1024  # one frame of bundled messages between actors
# A bundle's frame carries its messages and their framing: room to spare under the codec's bound.
assert BUNDLE_BYTES_MAX * 2 <= FRAME_BYTES_MAX_DEFAULT
PROGRESS_BYTES_DIVISOR = 8  # a receiver reports once it applied this fraction of the sender's bound
PROGRESS_INTERVAL_S = 0.025  # ... or at least this often while it applies


def chunks(sizes: list[int], bytes_max: int) -> list[tuple[int, int]]:
    """Split items into consecutive [start, end) runs of at most ``bytes_max`` bytes each
    (an item larger than that gets a run of its own)."""
    runs = []
    start = total = 0
    for i, size in enumerate(sizes):
        if i > start and total + size > bytes_max:
            runs.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        runs.append((start, len(sizes)))
    return runs


def bundles(sizes: list[int], bytes_max: int, alone_min: int) -> list[tuple[int, int]]:
    """``chunks``, except that an item of ``alone_min`` bytes or more gets a run of its own:
    a large message goes alone (and without a copy, ``actors.base.send_frame``) rather
    than copied into a bundle with its neighbours."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i, size in enumerate([*sizes, alone_min]):  # the last closes the last stretch
        if size >= alone_min:
            runs.extend((start + a, start + b) for a, b in chunks(sizes[start:i], bytes_max))
            if i < len(sizes):
                runs.append((i, i + 1))
            start = i + 1
    return runs



class GroupsInFlight:
    """The bytes of log groups sent to one receiver on the data path that it has not yet
    reported applied (``Progress``). Mailboxes are bounded in messages, and a group can be
    tens of MiB, so this is the byte bound: a group that would take it over ``bytes_max``
    is not sent (``skip``), nor is one its mailbox refused. The receiver reads what it
    missed from the log files: when the next group it gets leaves a gap in LSNs, or, if
    none comes, when the sender tells it with ``CatchUp`` (``applied`` says when: nothing
    is in flight any more and groups after what it applied were skipped). One group always
    goes when nothing is in flight."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self.groups: collections.deque[tuple[int, int]] = collections.deque()  # (last LSN, bytes)
        self.skipped = 0  # groups not sent, in all
        self.skipped_upto = 0  # the last LSN of the groups not sent, until announced

    def admits(self, size: int) -> bool:
        return self.bytes == 0 or self.bytes + size <= self.bytes_max

    def sent(self, last_lsn: int, size: int) -> None:
        self.groups.append((last_lsn, size))
        self.bytes += size

    def skip(self, last_lsn: int) -> None:
        self.skipped += 1
        self.skipped_upto = max(self.skipped_upto, last_lsn)

    def applied(self, lsn: int) -> int:
        """The receiver applied everything to ``lsn``. Returns the LSN to announce in a
        ``CatchUp`` (0: none; a group still in flight will show it the gap)."""
        groups = self.groups
        while groups and groups[0][0] <= lsn:
            self.bytes -= groups.popleft()[1]
        if self.skipped_upto <= lsn:
            self.skipped_upto = 0
            return 0
        if groups:
            return 0
        announce, self.skipped_upto = self.skipped_upto, 0
        return announce

    def reset(self) -> None:
        """The receiver restarted: it recovers from the log by itself."""
        self.groups.clear()
        self.bytes = 0
        self.skipped_upto = 0


class ProgressReport:
    """When a receiver on the data path tells its sender how far it applied (``Progress``):
    once it has applied ``bytes_min`` since it last said so (a fraction of the sender's
    ``GroupsInFlight`` bound), or ``interval_s`` after, never after every group. A report
    per group would wake the log manager once more per group commit, on the path of every
    acknowledgement, and cost three messages per group between the actors."""

    def __init__(self, bytes_min: int, interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self.bytes_min = bytes_min
        self.interval_s = interval_s
        self.lsn = 0  # the last LSN reported
        self.bytes = 0  # applied since
        self.at = 0.0  # when it was reported

    def applied(self, size: int) -> None:
        self.bytes += size

    def due(self, lsn: int, now: float) -> bool:
        return lsn > self.lsn and (self.bytes >= self.bytes_min or now - self.at >= self.interval_s)

    def sent(self, lsn: int, now: float) -> None:
        self.lsn, self.bytes, self.at = lsn, 0, now

    def refused(self) -> None:
        """The report just ``sent`` did not get through (the sender's mailbox stayed full):
        it is due again at once."""
        self.lsn, self.at = 0, 0.0
