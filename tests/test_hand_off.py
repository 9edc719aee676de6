"""The log manager's hand-off to the cache manager (``actors.hand_off.HandOff``): durable
groups wait a moment and go on merged, as one group whose records are theirs, in order."""

from __future__ import annotations

from actors.hand_off import HAND_OFF_BYTES, HAND_OFF_S, HandOff
from wire import logrecord
from wire.logrecord import Kind


def group(first: int, last: int) -> list[bytes]:
    return [logrecord.encode(lsn, Kind.OFFSET_COMMIT, ["g", 1, 0, lsn])
            for lsn in range(first, last + 1)]


def add(h: HandOff, first: int, last: int, now: float) -> None:
    records = group(first, last)
    h.add(first, last, records, sum(map(len, records)), now=now)


def test_groups_merge_into_one_with_the_first_lsn_of_the_first_and_the_last_of_the_last() -> None:
    h = HandOff()
    add(h, 1, 3, now=10.0)
    add(h, 4, 4, now=10.001)
    add(h, 5, 9, now=10.0015)
    assert h.due == 10.0 + HAND_OFF_S  # the first group waits no longer than HAND_OFF_S
    assert not h.full()
    first, last, records, size = h.take()
    assert (first, last) == (1, 9) and size == sum(map(len, records))
    assert [e.lsn for e in logrecord.iter_buffer(b"".join(records))] == list(range(1, 10))
    assert not h.datas and h.size == 0


def test_after_a_take_the_next_group_starts_a_new_wait() -> None:
    h = HandOff()
    add(h, 1, 1, now=5.0)
    h.take()
    add(h, 2, 2, now=7.0)
    assert h.due == 7.0 + HAND_OFF_S
    assert h.take()[:2] == (2, 2)


def test_enough_bytes_waiting_make_it_full() -> None:
    h = HandOff()
    records = group(1, 1)
    size = len(records[0])
    lsn = 0
    while not h.full():
        lsn += 1
        h.add(lsn, lsn, records, size, now=0.0)
    assert h.size >= HAND_OFF_BYTES > h.size - size


def test_it_is_due_hand_off_s_after_the_first_group_and_says_how_long_until_then() -> None:
    h = HandOff()
    assert not h.is_due(100.0) and h.due_in_ms(100.0) is None  # nothing waits
    add(h, 1, 1, now=0.0)
    add(h, 2, 2, now=0.0015)  # a later group does not push the time back
    assert h.due_in_ms(0.0) == 2
    assert h.due_in_ms(0.0015) == 1  # 0.5 ms, rounded up: never wake too early
    assert not h.is_due(HAND_OFF_S / 2)
    assert h.is_due(HAND_OFF_S)
    assert h.due_in_ms(1.0) == 0
    h.take()
    assert not h.is_due(11.0) and h.due_in_ms(11.0) is None
