"""The log manager's truncate job (``actors.truncator.Truncator``): a thread writes the
snapshot slot, deletes the segments and wakes the actor's loop. Real files on tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from actors import wal
from actors.log_state import LogState
from actors.truncator import TruncateResult, Truncator
from config import load_config


@pytest.fixture
def truncator(tmp_path: Path) -> Iterator[Truncator]:
    (tmp_path / "log").mkdir()
    t = Truncator(zmq.Context.instance(), tmp_path / "log", tmp_path)
    yield t
    t.close()


def segments(log_dir: Path, firsts: list[int]) -> None:
    for first in firsts:
        (log_dir / wal.segment_name(first)).write_bytes(b"")


def state_at(lsn: int) -> dict[str, object]:
    st = LogState(load_config(overrides={"log": {"producers_max": 10, "producer_window_max": 4}}))
    st.last_lsn = lsn
    return st.snapshot()


def wait_result(t: Truncator) -> TruncateResult:
    assert t.wake.poll(10_000, zmq.POLLIN), "the job never woke the loop"
    result = t.collect(timeout_s=10)
    assert result is not None
    return result


def test_the_snapshot_is_written_then_the_segments_below_go(truncator: Truncator) -> None:
    log_dir = truncator.log_dir
    segments(log_dir, [1, 11, 21])
    truncator.start(ckpt_id=4, upto=20, snapshot=state_at(25))
    assert truncator.busy
    result = wait_result(truncator)
    assert (result.ckpt_id, result.upto, result.deleted, result.error) == (4, 20, 2, "")
    assert not truncator.busy
    assert [f for f, _p in wal.list_segments(log_dir)] == [21]
    snap, slot = wal.load_snapshot(log_dir)
    assert slot == 0 and snap is not None and snap["last_lsn"] == 25
    truncator.start(ckpt_id=5, upto=20, snapshot=state_at(30))
    wait_result(truncator)
    assert wal.load_snapshot(log_dir)[1] == 1  # the other slot, by turns


def test_a_snapshot_that_cannot_be_written_deletes_nothing_and_says_so(
        truncator: Truncator) -> None:
    log_dir = truncator.log_dir
    segments(log_dir, [1, 11])
    (log_dir / wal.SNAPSHOT_SLOTS[0]).mkdir()  # the slot cannot be opened as a file
    truncator.start(ckpt_id=1, upto=20, snapshot=state_at(25))
    result = wait_result(truncator)
    assert "slot 0" in result.error and result.deleted == 0
    assert len(wal.list_segments(log_dir)) == 2
    # The next snapshot goes to the slot that failed, never over the other (the only good
    # one once a slot is spoiled), so a crash during it cannot leave none.
    assert truncator.next_slot == 0


def test_a_job_that_raises_wakes_the_loop_and_collect_raises_it(
        truncator: Truncator) -> None:
    """A job's error it did not turn into a result (a bug, a state it cannot encode)
    fails the actor, to be restarted: the job woke nobody, and the checkpoint waiting for
    it (TRUNCATING has no time limit) waited for good, and every checkpoint after it."""
    truncator.start(ckpt_id=1, upto=0, snapshot={"last_lsn": object()})  # no msgpack for it
    assert truncator.wake.poll(10_000, zmq.POLLIN), "the job never woke the loop"
    with pytest.raises(RuntimeError, match="the truncate job failed") as info:
        truncator.collect(timeout_s=10)
    assert info.value.__cause__ is not None
    assert not truncator.busy
    truncator.start(ckpt_id=2, upto=0, snapshot=state_at(2))  # the next one runs
    assert wait_result(truncator).error == ""


def test_only_one_job_at_a_time(truncator: Truncator) -> None:
    truncator.start(ckpt_id=1, upto=0, snapshot=state_at(1))
    with pytest.raises(RuntimeError, match="already running"):
        truncator.start(ckpt_id=2, upto=0, snapshot=state_at(2))
    wait_result(truncator)


@pytest.mark.parametrize(("newest", "next_slot"), [(None, 0), (0, 1), (1, 0)])
def test_after_recovery_the_slot_not_holding_the_newest_snapshot_is_next(
        truncator: Truncator, newest: int | None, next_slot: int) -> None:
    truncator.after_recovery(newest)
    assert truncator.next_slot == next_slot
