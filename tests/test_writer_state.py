"""A shard writer's logic: gaps in the groups it gets, its waiting reads, what it reports."""

from __future__ import annotations

from actors.instructions import Apply, Flush, ReadLog, Send, Serve
from actors.roles import CACHE_MANAGER
from actors.writer_state import WriterState, error_reply
from wire.errors import ErrorCode
from wire.messages import (
    CommittedOffset,
    Flushed,
    Progress,
    Read,
    ReadByKey,
    ReadRequest,
)

WAIT_S = 10.0


def state(processed: int = 0, parked_max: int = 100, progress_bytes_min: int = 1000) -> WriterState:
    s = WriterState("writer-0", parked_max, read_wait_s=WAIT_S,
                    progress_bytes_min=progress_bytes_min)
    assert s.recover(processed) == [ReadLog(None)]  # at start: the whole log after it
    return s


def read(corr: int, lsn_min: int) -> Read:
    return Read(corr, 1, 0, 0, 10, lsn_min)


def timeout(corr: int, applied: int, needs: int) -> Send:
    return error_reply(corr, ErrorCode.TIMEOUT,
                       f"writer has applied LSN {applied}, the read needs {needs}")


# ---- groups, gaps, catch-up ------------------------------------------------------------


def test_a_group_that_follows_is_applied() -> None:
    s = state(processed=10)
    assert s.group(11, 15, b"g") == [Apply(11, b"g")]


def test_a_group_already_applied_is_skipped() -> None:
    s = state(processed=10)
    assert s.group(5, 10, b"old") == []
    assert s.progress.bytes == 0  # nothing new to report either


def test_a_group_overlapping_what_is_applied_is_applied_past_it() -> None:
    s = state(processed=10)
    assert s.group(8, 12, b"g") == [Apply(8, b"g")]  # the shell skips LSNs ≤ 10


def test_a_group_past_a_gap_reads_the_log_up_to_it_first() -> None:
    s = state(processed=10)
    assert s.group(20, 25, b"g") == [ReadLog(19), Apply(20, b"g")]


def test_catch_up_reads_the_log_only_when_behind() -> None:
    s = state(processed=10)
    assert s.catch_up(10) == []
    assert s.catch_up(7) == []
    assert s.catch_up(30) == [ReadLog(30)]


def test_applied_moves_the_lsn() -> None:
    s = state(processed=10)
    s.applied(15)
    assert s.processed_lsn == 15
    assert s.group(16, 20, b"g") == [Apply(16, b"g")]
    assert s.group(12, 15, b"g") == []


# ---- the checkpoint's flush ------------------------------------------------------------


def test_flush_to_reads_the_log_when_behind_then_flushes() -> None:
    s = state(processed=10)
    assert s.flush_to(3, 10) == [Flush(3)]
    assert s.flush_to(4, 8) == [Flush(4)]
    assert s.flush_to(5, 12) == [ReadLog(12), Flush(5)]


def test_flushed_reports_the_applied_lsn() -> None:
    s = state(processed=10)
    s.flush_to(5, 12)
    s.applied(14)  # the log had more than L: it reports what it holds
    assert s.flushed(5) == [Send(CACHE_MANAGER, Flushed(5, "writer-0", 14), wait_ms=1000)]


def test_flushed_short_of_the_lsn_says_so() -> None:
    """The log lacked records: the writer says how far it got, the checkpoint abandons."""
    s = state(processed=10)
    s.flush_to(5, 12)
    assert s.flushed(5) == [Send(CACHE_MANAGER, Flushed(5, "writer-0", 10), wait_ms=1000)]


# ---- reads -----------------------------------------------------------------------------


def test_a_read_already_applied_is_served_at_once() -> None:
    s = state(processed=10)
    r = read(1, 10)
    assert s.read(r, now=0) == [Serve(r)]
    assert not s.parked


def test_a_read_ahead_waits_until_its_lsn_is_applied() -> None:
    s = state(processed=10)
    early, late = read(1, 12), read(2, 15)
    assert s.read(early, now=0) == []
    assert s.read(late, now=0) == []
    assert s.applied(11) == []
    assert s.applied(12) == [Serve(early)]
    assert s.applied(20) == [Serve(late)]
    assert not s.parked


def test_waiting_reads_are_served_in_arrival_order() -> None:
    s = state(processed=10)
    reads: list[ReadRequest] = [read(1, 14), read(2, 12), ReadByKey(3, 1, 0, b"k", 13)]
    for r in reads:
        s.read(r, now=0)
    assert s.applied(14) == [Serve(r) for r in reads]


def test_reads_over_the_bound_are_answered_busy() -> None:
    s = state(processed=10, parked_max=2)
    s.read(read(1, 11), now=0)
    s.read(read(2, 11), now=0)
    assert s.read(read(3, 11), now=0) == [
        error_reply(3, ErrorCode.BUSY, "too many reads waiting for this writer")]
    assert len(s.parked) == 2
    assert s.read(read(4, 10), now=0) == [Serve(read(4, 10))]  # one it can serve still goes


def test_a_read_waits_until_its_deadline_then_times_out() -> None:
    s = state(processed=10)
    s.read(read(1, 12), now=100)
    s.read(read(2, 12), now=105)
    assert s.expire(100 + WAIT_S - 0.001) == []
    assert s.expire(100 + WAIT_S) == [timeout(1, 10, 12)]
    assert s.expire(105 + WAIT_S) == [timeout(2, 10, 12)]
    assert not s.parked


def test_tick_reads_the_log_for_reads_whose_group_never_came() -> None:
    s = state(processed=10)
    assert s.tick(now=0) == []
    s.read(read(1, 14), now=0)
    s.read(CommittedOffset(2, "g", 1, 0, 17), now=0)
    assert s.tick(now=1) == [ReadLog(17)]
    s.applied(17)
    assert not s.parked
    assert s.tick(now=2) == []


def test_a_read_served_by_the_ticks_catch_up_does_not_time_out() -> None:
    """The shell reads the log for the tick, then expires: what the log served is gone."""
    s = state(processed=10)
    r = read(1, 12)
    s.read(r, now=0)
    assert s.tick(now=WAIT_S) == [ReadLog(12)]
    assert s.applied(12) == [Serve(r)]
    assert s.expire(now=WAIT_S) == []


def test_expire_says_how_far_the_writer_got() -> None:
    s = state(processed=10)
    s.read(read(1, 20), now=0)
    s.tick(now=WAIT_S)
    s.applied(15)  # the log had only so much
    assert s.expire(now=WAIT_S) == [timeout(1, 15, 20)]


# ---- reports ---------------------------------------------------------------------------


def progress(lsn: int) -> Send:
    return Send(CACHE_MANAGER, Progress("writer-0", lsn), wait_ms=100)


def test_progress_is_reported_by_bytes_or_time_never_per_group() -> None:
    s = state(processed=10, progress_bytes_min=1000)
    s.progress.sent(10, 0.0)
    s.group(11, 11, b"x" * 600)
    s.applied(11)
    assert s.idle(now=0.001) == []  # 600 bytes, 1 ms: not yet
    s.group(12, 12, b"x" * 600)
    s.applied(12)
    assert s.idle(now=0.002) == [progress(12)]  # 1200 bytes
    assert s.idle(now=0.003) == []  # said already
    s.group(13, 13, b"x")
    s.applied(13)
    assert s.idle(now=0.01) == []
    assert s.idle(now=0.002 + s.progress.interval_s) == [progress(13)]  # by time


def test_a_refused_progress_report_is_sent_again() -> None:
    s = state(processed=10)
    s.group(11, 11, b"x" * 2000)
    s.applied(11)
    (report,) = s.idle(now=1.0)
    assert report == progress(11)
    assert s.idle(now=1.0) == []
    assert s.refused(report.msg) == []
    assert s.idle(now=1.0) == [progress(11)]


def test_a_refused_reply_is_dropped() -> None:
    s = state(processed=10)
    reply = error_reply(1, ErrorCode.BUSY, "x")
    assert s.refused(reply.msg) == []
    assert s.idle(now=1.0) == [progress(10)]  # untouched: the first report is due anyway
