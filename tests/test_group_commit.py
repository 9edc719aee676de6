"""The log manager's group-commit policy (``actors.group_commit.GroupCommit``): when a
group is committed, handed off, and when the transaction manager is told which requests
ended. No sockets, no clock: every answer is for the ``now`` passed in."""

from __future__ import annotations

import pytest

from actors.group_commit import ENDED_INTERVAL_S, ENDED_ROWS_MAX, GroupCommit
from actors.hand_off import HAND_OFF_BYTES, HAND_OFF_S
from actors.instructions import Log
from wire.messages import Ack


def request(corr: int, record_bytes: int = 10) -> Log:
    return Log(b"r" * record_bytes, Ack(corr, corr, []), corr)


def policy(bytes_max: int = 1000, requests_max: int = 4, wait_us_max: int = 0,
           track_ended: bool = False) -> GroupCommit:
    return GroupCommit(bytes_max, requests_max, wait_us_max, track_ended)


# ---- when a queued group is committed --------------------------------------------------


def test_a_group_is_full_at_group_requests_max() -> None:
    g = policy(requests_max=3)
    assert [g.add(request(c)) for c in (1, 2, 3)] == [False, False, True]
    assert [p.lsn for p in g.take()] == [1, 2, 3]
    assert g.queue == [] and g.queued_bytes == 0 and g.last_group_size == 3


def test_a_group_is_full_at_group_bytes_max_the_request_reaching_it_its_last() -> None:
    g = policy(bytes_max=100, requests_max=100)
    assert not g.add(request(1, 60))
    assert not g.add(request(2, 39))
    assert g.add(request(3, 1))  # exactly 100
    assert g.queued_bytes == 100
    g.take()
    assert g.add(request(4, 500))  # one request over the bound is a group of its own


def test_a_duplicate_with_no_record_counts_as_a_request_but_no_bytes() -> None:
    g = policy(bytes_max=10, requests_max=2)
    assert not g.add(request(1, 0))
    assert g.queued_bytes == 0
    assert g.add(request(2, 0))


def test_a_burst_is_split_into_full_groups_and_the_rest_goes_after_it() -> None:
    g = policy(requests_max=3)
    committed = []
    for corr in range(1, 8):  # one burst of 7 requests
        if g.add(request(corr)):
            committed.append([p.lsn for p in g.take()])
    assert committed == [[1, 2, 3], [4, 5, 6]]
    assert g.straggler_deadline(now=5.0) is None  # no straggler wait configured
    assert [p.lsn for p in g.take()] == [7]
    assert g.last_group_size == 1


def test_stragglers_are_waited_for_only_after_a_group_of_several() -> None:
    g = policy(wait_us_max=500)
    assert g.straggler_deadline(now=1.0) is None  # no group yet
    g.add(request(1))
    g.take()
    assert g.straggler_deadline(now=1.0) is None  # a lone writer is written at once
    g.add(request(2))
    g.add(request(3))
    g.take()
    assert g.straggler_deadline(now=1.0) == pytest.approx(1.0005)
    g.take()  # an empty group (a checkpoint's roll) resets it
    assert g.last_group_size == 0
    assert g.straggler_deadline(now=1.0) is None


def test_no_straggler_wait_when_group_wait_us_max_is_zero() -> None:
    g = policy(wait_us_max=0)
    for corr in (1, 2, 3):
        g.add(request(corr))
    g.take()
    assert g.last_group_size == 3
    assert g.straggler_deadline(now=1.0) is None


def test_the_straggler_wait_ends_at_the_deadline_or_when_the_group_is_full() -> None:
    g = policy(requests_max=3, wait_us_max=2500)
    g.add(request(1))
    g.add(request(2))
    g.take()
    g.add(request(3))
    deadline = g.straggler_deadline(now=10.0)
    assert deadline is not None
    assert g.straggler_wait_ms(10.0, deadline) == 3  # 2.5 ms left: poll a whole ms more
    assert g.straggler_wait_ms(10.002, deadline) == 1
    assert g.straggler_wait_ms(10.0025, deadline) == 0
    assert g.straggler_wait_ms(11.0, deadline) == 0
    g.add(request(4))
    g.add(request(5))  # full
    assert g.straggler_wait_ms(10.0, deadline) == 0


# ---- when durable groups are handed off ------------------------------------------------


def test_durable_groups_wait_hand_off_s_then_go_merged() -> None:
    g = policy()
    assert not g.hand_off_due(0.0) and g.hand_off_in_ms(0.0) is None
    assert g.take_hand_off() is None
    assert not g.durable(1, 2, [b"a", b"b"], 2, now=0.0)
    assert not g.durable(3, 3, [b"c"], 1, now=0.001)
    assert g.hand_off_in_ms(0.001) == 1
    assert not g.hand_off_due(0.001)
    assert g.hand_off_due(HAND_OFF_S)
    assert g.take_hand_off() == (1, 3, [b"a", b"b", b"c"], 3)
    assert not g.hand_off_due(5.0) and g.take_hand_off() is None


def test_enough_durable_bytes_are_handed_off_at_once() -> None:
    g = policy()
    assert not g.durable(1, 1, [b"x" * (HAND_OFF_BYTES - 1)], HAND_OFF_BYTES - 1, now=0.0)
    assert g.durable(2, 2, [b"y"], 1, now=0.0)


# ---- when the transaction manager is told which requests ended -------------------------


def test_nothing_is_kept_when_the_transaction_manager_did_not_begin_the_requests() -> None:
    g = policy(track_ended=False)
    g.ended_one(1)
    g.ended_group([request(2), request(3)])
    assert g.ended == []
    assert not g.tell_due(100.0, checkpoint_waits=True)


def test_ended_requests_are_told_every_interval() -> None:
    g = policy(track_ended=True)
    assert not g.tell_due(100.0, checkpoint_waits=True)  # nothing to tell
    g.ended_group([request(1), request(2)])
    g.ended_one(3)
    assert g.tell_due(0.0 + ENDED_INTERVAL_S, checkpoint_waits=False)  # told at 0.0: never
    assert g.take_ended(now=1.0) == [1, 2, 3]
    g.ended_one(4)
    assert not g.tell_due(1.0 + ENDED_INTERVAL_S / 2, checkpoint_waits=False)
    assert g.tell_due(1.0 + ENDED_INTERVAL_S, checkpoint_waits=False)


def test_ended_requests_are_told_at_once_while_a_checkpoint_waits() -> None:
    g = policy(track_ended=True)
    g.take_ended(now=1.0)
    g.ended_one(1)
    assert not g.tell_due(1.001, checkpoint_waits=False)
    assert g.tell_due(1.001, checkpoint_waits=True)


def test_ended_requests_are_told_once_ended_rows_max_wait() -> None:
    g = policy(track_ended=True)
    g.take_ended(now=1.0)
    for corr in range(ENDED_ROWS_MAX - 1):
        g.ended_one(corr)
    assert not g.tell_due(1.0, checkpoint_waits=False)
    g.ended_one(ENDED_ROWS_MAX)
    assert g.tell_due(1.0, checkpoint_waits=False)


def test_telling_nothing_still_restarts_the_interval() -> None:
    g = policy(track_ended=True)
    assert g.take_ended(now=5.0) == []
    g.ended_one(1)
    assert not g.tell_due(5.0 + ENDED_INTERVAL_S / 2, checkpoint_waits=False)
    assert g.take_ended(now=6.0) == [1]
    assert g.ended == []
