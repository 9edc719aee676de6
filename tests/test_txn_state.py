"""The transaction manager's logic: begin and end in bursts, and the checkpoint gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.base import ActorContext
from actors.instructions import Forward, Send
from actors.roles import FRONT_DOOR, LOG_MANAGER, TRANSACTION_MANAGER
from actors.txn_state import TxnState, busy
from config import load_config
from wire import codec
from wire.messages import (
    CheckpointFinished,
    CheckpointReady,
    CheckpointRequest,
    GateHeld,
    ProduceRow,
    TxnBegin,
    TxnResolve,
    TxnStep,
    TxnTable,
    TxnWrite,
    Writes,
)


def ready(ckpt_id: int, oldest_lsn: int) -> Send:
    return Send(LOG_MANAGER, CheckpointReady(ckpt_id, oldest_lsn), wait_ms=1000)


def produce(corr: int) -> ProduceRow:
    return (9, corr, [(1, 0, 1, f"records-{corr}".encode())])


def items(*corrs: int) -> Writes:
    """A burst: odd correlation ids are produce requests, even ones other writes."""
    return Writes(list(corrs), [produce(c) for c in corrs if c % 2],
                  [(at, f"frame-{c}".encode()) for at, c in enumerate(corrs) if not c % 2])


def forward(*corrs: int) -> Forward:
    return Forward(LOG_MANAGER, items(*corrs))


def gate_held(*corrs: int, held: bool = True) -> Send:
    """The front door told that these are held at the gate (or let through)."""
    return Send(FRONT_DOOR, GateHeld(list(corrs), held), wait_ms=100)


def test_fuzzy_mode_forwards_and_is_ready_at_once() -> None:
    s = TxnState("fuzzy", held_max=10, stale_s=5, gate_s_max=60)
    (fwd,) = s.requests(items(1, 2), now=0)
    assert fwd == forward(1, 2)
    assert s.checkpoint_requested(7) == [ready(7, 0)]
    assert s.requests(items(3), now=0) == [forward(3)]  # writes never stop


def test_blocking_gate_waits_for_active_and_holds_new() -> None:
    s = TxnState("blocking", held_max=10, stale_s=5, gate_s_max=60)
    s.requests(items(1, 2), now=0)
    assert s.checkpoint_requested(3) == []  # two still active
    assert s.requests(items(4, 5), now=0) == [gate_held(4, 5)]  # held back
    assert s.held_total == 2
    assert s.holds([4, 5]) and s.holds([5]) and not s.holds([4, 1])
    assert s.end([1]) == []
    assert s.end([2]) == [ready(3, 0)]
    assert s.end([2]) == []  # ready is said once
    assert s.checkpoint_finished(99, now=1) == []  # not ours
    assert s.checkpoint_finished(3, now=1) == [forward(4, 5), gate_held(4, 5, held=False)]
    assert set(s.active) == {4, 5}
    assert not s.holds([4])  # let through


def test_gate_with_nothing_active_is_ready_immediately() -> None:
    s = TxnState("blocking", held_max=10, stale_s=5, gate_s_max=60)
    assert s.checkpoint_requested(1) == [ready(1, 0)]


def test_held_queue_is_bounded() -> None:
    s = TxnState("blocking", held_max=2, stale_s=5, gate_s_max=60)
    s.checkpoint_requested(1)
    assert s.requests(items(1, 2, 3), now=0) == [gate_held(1, 2), busy(3)]
    assert s.held_count == 2 and s.held_total == 2
    assert s.requests(items(5), now=0) == [busy(5)]
    assert not s.holds([3]) and not s.holds([5])  # answered BUSY, not held
    assert s.checkpoint_finished(1, now=0) == [forward(1, 2), gate_held(1, 2, held=False)]


def test_lost_transactions_expire_and_release_the_gate() -> None:
    s = TxnState("blocking", held_max=10, stale_s=5, gate_s_max=60)
    s.requests(items(1), now=0)
    assert s.checkpoint_requested(2) == []
    assert s.tick(now=4) == []
    assert s.tick(now=6) == [ready(2, 0)]
    assert s.expired == 1 and not s.active


def test_a_gate_whose_finish_was_lost_opens_by_itself() -> None:
    s = TxnState("blocking", held_max=10, stale_s=5, gate_s_max=30)
    assert s.checkpoint_requested(1, now=0) == [ready(1, 0)]
    s.requests(items(7), now=1)
    assert s.tick(now=20) == []
    assert s.tick(now=31) == [forward(7), gate_held(7, held=False)]
    assert s.gate is None


def test_a_burst_begins_whole_while_the_gate_is_open_and_not_while_it_is_closed() -> None:
    st = TxnState("blocking", held_max=10, stale_s=60.0, gate_s_max=60)
    assert st.begin([1, 2, 3], now=0.0)
    assert set(st.active) == {1, 2, 3} and st.began == 3
    st.checkpoint_requested(7, now=1.0)
    assert not st.begin([4], now=1.0)  # the caller takes the path that holds it
    assert 4 not in st.active and st.began == 3
    st.end([1, 2, 3])
    st.checkpoint_finished(7, now=2.0)
    assert st.begin([5], now=2.0) and 5 in st.active


def test_bursts_held_at_the_gate_go_on_as_one_in_the_order_they_came() -> None:
    s = TxnState("blocking", held_max=10, stale_s=5, gate_s_max=60)
    s.checkpoint_requested(1)
    s.requests(items(1, 2, 3), now=0)
    s.requests(items(4, 5), now=0)
    s.requests(items(6), now=0)
    fwd, _released = s.checkpoint_finished(1, now=0)
    assert isinstance(fwd, Forward)
    assert fwd == forward(1, 2, 3, 4, 5, 6)
    assert list(fwd.writes.others) == [(1, b"frame-2"), (3, b"frame-4"), (5, b"frame-6")]


def test_a_burst_cut_anywhere_keeps_each_request_at_its_place() -> None:
    burst = items(1, 2, 3, 4, 5, 6, 8, 9)
    for start in range(len(burst.corrs) + 1):
        for end in range(start, len(burst.corrs) + 1):
            assert burst.slice(start, end) == items(*burst.corrs[start:end]), (start, end)
    cut = [burst.slice(0, 3), burst.slice(3, 3), burst.slice(3, 8)]
    assert Writes.join(cut) == burst
    sizes = burst.sizes()
    assert len(sizes) == len(burst.corrs)
    assert sizes[1] < sizes[0]  # an other write (a 7-byte frame) is smaller than a produce


def test_the_transaction_manager_reads_only_the_correlation_ids_of_a_burst() -> None:
    from actors.transaction_manager import writes_corrs
    from wire import codec
    from wire.messages import Ended

    frame = codec.encode(Writes([4, 5], [(9, 0, [(1, 0, 1, b"\x01" * 100_000)])],
                                [(1, b"\x02")]))
    assert writes_corrs(frame) == [4, 5]
    assert writes_corrs(codec.encode(Ended([4, 5]))) is None
    assert writes_corrs(b"\xc1 not msgpack") is None
    assert writes_corrs(frame[:3]) is None
    # A view of a received frame (actors.base.receive_frame), and ids that take more than
    # one read of a few KiB: all of them, in order.
    assert writes_corrs(memoryview(frame)) == [4, 5]
    many = list(range(1 << 40, (1 << 40) + 5000))  # 9 bytes each: 45 kB of ids
    big = codec.encode(Writes(many, [(9, 0, [(1, 0, 1, b"\x01" * 100)])] * 5000, []))
    assert writes_corrs(memoryview(big)) == many
    assert writes_corrs(big[:20_000]) is None  # the ids cut short


def test_once_the_front_door_is_closed_the_gate_waits_no_more_for_open_transactions() -> None:
    """A clean stop closes the front door, then checkpoints: a transaction open then can
    no longer be ended by its client, so the blocking gate waits only for the writes in
    flight (it waited for the transaction until the checkpoint gave up)."""
    open_txns = 1
    s = TxnState("blocking", held_max=10, stale_s=5, gate_s_max=60,
                 open_transactions=lambda: open_txns)
    s.requests(items(1), now=0)
    assert s.checkpoint_requested(4, now=0) == []  # a write in flight, a transaction open
    assert s.front_closed() == []  # the write is still in flight
    assert s.end([1]) == [ready(4, 0)]
    assert s.checkpoint_finished(4, now=1) == []
    assert s.checkpoint_requested(5, now=2) == [ready(5, 0)]  # and at the next one


def test_writes_the_log_manager_could_not_take_end_at_once_and_the_gate_says_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The transaction manager's shell: writes it could not pass on (the log manager's
    mailbox full) are answered BUSY and end, and a blocking gate waiting for them says
    ready then (what ``end`` said was dropped: ready waited for the next tick)."""
    from actors.transaction_manager import TransactionManager

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(overrides={"log": {"checkpoint_mode": "blocking"}})
    tm = TransactionManager(ActorContext(TRANSACTION_MANAGER, cfg.to_dict(), str(run_dir), 0))
    try:
        sent: list[tuple[str, object]] = []

        def send(role: str, msg: object, wait_ms: int = 0) -> bool:
            sent.append((role, msg))
            return True

        monkeypatch.setattr(tm, "send", send)
        monkeypatch.setattr(tm, "send_writes", lambda role, writes, wait_ms=0: writes.corrs)
        (fwd,) = tm.state.requests(items(1, 2), now=0)
        assert tm.state.checkpoint_requested(4, now=0) == []  # waits for writes 1 and 2
        tm.perform([fwd])
        assert (LOG_MANAGER, CheckpointReady(4, 0)) in sent
    finally:
        tm.close()


def test_a_commit_decided_ahead_of_held_writes_reaches_the_log_manager_before_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell, in one burst: a checked commit decided ahead of a put held at the gate,
    then the checkpoint abandoned (another transaction stays open), which opens the gate.
    The held put was sent at once and the commit at the burst's end: after it."""
    from actors.transaction_manager import TransactionManager

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(overrides={"log": {"checkpoint_mode": "blocking"}})
    tm = TransactionManager(ActorContext(TRANSACTION_MANAGER, cfg.to_dict(), str(run_dir), 0))
    try:
        to_log: list[str] = []

        def send(role: str, msg: object, wait_ms: int = 0) -> bool:
            if role == LOG_MANAGER:
                to_log.append(type(msg).__name__)
            return True

        def send_many(role: str, frames: list[bytes], wait_ms: int = 0) -> int:
            for f in frames:
                m = codec.decode(f)
                to_log.append(f"{type(m).__name__}:{m.step}" if isinstance(m, TxnResolve)
                              else type(m).__name__)
            return len(frames)

        def send_writes(role: str, writes: Writes, wait_ms: int = 0) -> list[int]:
            to_log.append(f"Writes{list(writes.corrs)}")
            return []

        monkeypatch.setattr(tm, "send", send)
        monkeypatch.setattr(tm, "send_many", send_many)
        monkeypatch.setattr(tm, "send_writes", send_writes)
        tm.on_message(TxnTable([], [], 1, []))
        tm.on_message(TxnBegin(100, 0, None, txn=7))  # with a compare-and-set
        tm.on_message(TxnWrite(101, 7, 0, [(1, 0, 1, b"kv")], (), True))
        tm.on_message(TxnBegin(102, 0, None, txn=8))  # another client's, open long
        tm.on_idle()
        to_log.clear()
        tm.on_message(CheckpointRequest(1))  # the gate closes: two open, no ready
        tm.on_message(items(5))  # the put of transaction 7's key: held
        tm.on_idle()
        assert tm.state.holds([5])
        tm.on_message(TxnStep(200, 7, None, "commit", 1, checked=True, ahead_of=[5]))
        tm.on_message(CheckpointFinished(1))  # abandoned: the gate opens
        tm.on_idle()
        assert to_log.index("TxnResolve:commit") < to_log.index("Writes[5]"), to_log
    finally:
        tm.close()
