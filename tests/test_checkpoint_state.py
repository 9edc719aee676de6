"""The checkpoint coordinator (actors/checkpoint.py) without processes: the steps it asks
for, in order, for both modes, and how it ends, abandons and refuses to overlap."""

from __future__ import annotations

import pytest

from actors.checkpoint import Coordinator, Phase
from actors.instructions import AskFlush, AskTxn, Finish, Roll, Truncate

WAITER = ("front", 7)


def run_to_truncate(c: Coordinator, lsn: int = 100, oldest: int = 0) -> Truncate:
    c.start(0.0, WAITER)
    c.ready(c.ckpt_id, oldest, 0.1)
    c.asked_flush(lsn)
    steps = c.flushed(c.ckpt_id, lsn)
    assert len(steps) == 1 and isinstance(steps[0], Truncate)
    return steps[0]


def test_fuzzy_rolls_at_the_request_and_blocking_at_ready() -> None:
    fuzzy = Coordinator("fuzzy", timeout_s=10)
    assert fuzzy.start(0.0) == [Roll(), AskTxn(1)]
    assert fuzzy.ready(1, 0, 0.1) == [AskFlush(1)]
    blocking = Coordinator("blocking", timeout_s=10)
    assert blocking.start(0.0) == [AskTxn(1)]
    assert blocking.ready(1, 0, 0.1) == [Roll(), AskFlush(1)]


def test_truncate_waits_for_the_shell_then_finishes_and_answers_waiters() -> None:
    c = Coordinator("fuzzy", timeout_s=10)
    step = run_to_truncate(c, lsn=100)
    assert step == Truncate(1, 100)
    assert (c.phase, c.done) == (Phase.TRUNCATING, 0)  # a tuple: no narrowing of c.phase
    assert c.truncated(1) == [Finish(1, 100, [WAITER], "")]
    assert c.phase is Phase.IDLE and c.done == 1 and c.abandoned == 0


def test_truncation_stays_below_what_an_active_transaction_needs() -> None:
    c = Coordinator("fuzzy", timeout_s=10)
    assert run_to_truncate(c, lsn=100, oldest=40).upto == 39
    c.truncated(1)
    assert run_to_truncate(c, lsn=200, oldest=0).upto == 200


def test_a_failed_truncate_abandons_the_checkpoint_with_its_reason() -> None:
    c = Coordinator("fuzzy", timeout_s=10)
    run_to_truncate(c)
    assert c.truncated(1, "disk full") == [Finish(1, 100, [WAITER], "disk full")]
    assert c.abandoned == 1 and c.done == 0


def test_a_shard_behind_the_target_abandons_the_checkpoint() -> None:
    c = Coordinator("fuzzy", timeout_s=10)
    c.start(0.0, WAITER)
    c.ready(1, 0, 0.1)
    c.asked_flush(100)
    [finish] = c.flushed(1, 99)
    assert isinstance(finish, Finish) and "99" in finish.error and c.abandoned == 1


@pytest.mark.parametrize("phase_steps", [0, 1], ids=["waiting-ready", "waiting-flushed"])
def test_a_slow_step_is_abandoned_after_the_timeout(phase_steps: int) -> None:
    c = Coordinator("fuzzy", timeout_s=2)
    c.start(0.0, WAITER)
    step_started = 0.0
    if phase_steps:
        step_started = 1.0
        c.ready(1, 0, step_started)
    assert c.tick(step_started + 1.9) == []
    [finish] = c.tick(step_started + 2.1)
    assert isinstance(finish, Finish) and "took over" in finish.error
    assert c.phase is Phase.IDLE and c.abandoned == 1


def test_truncating_is_never_abandoned_so_no_second_checkpoint_overlaps_it() -> None:
    c = Coordinator("fuzzy", timeout_s=2)
    run_to_truncate(c)
    assert c.tick(1000.0) == []
    assert c.start(1000.0, ("front", 8)) == []  # joins as a waiter of the running one
    [finish] = c.truncated(1)
    assert isinstance(finish, Finish) and finish.waiters == [WAITER, ("front", 8)]


def test_late_or_foreign_answers_are_ignored() -> None:
    c = Coordinator("fuzzy", timeout_s=2)
    c.start(0.0)
    assert c.flushed(1, 100) == []  # not waiting for flushes yet
    assert c.ready(2, 0, 0.1) == []  # another checkpoint's answer
    c.ready(1, 0, 0.1)
    assert c.truncated(1) == []  # not truncating yet
    c.tick(10.0)  # abandoned
    assert c.ready(1, 0, 10.1) == [] and c.flushed(1, 100) == []
