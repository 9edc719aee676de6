"""The transaction manager's logic: begin and end in bursts, and the checkpoint gate."""

from __future__ import annotations

from actors.instructions import Forward, Send
from actors.roles import LOG_MANAGER
from actors.txn_state import TxnState, busy
from wire.messages import CheckpointReady


def ready(ckpt_id: int, oldest_lsn: int) -> Send:
    return Send(LOG_MANAGER, CheckpointReady(ckpt_id, oldest_lsn), wait_ms=1000)


def forward(corrs: list[int], requests: list[bytes]) -> Forward:
    return Forward(LOG_MANAGER, corrs, list(requests))


def items(*corrs: int) -> list[tuple[int, bytes]]:
    return [(c, f"frame-{c}".encode()) for c in corrs]


def test_fuzzy_mode_forwards_and_is_ready_at_once() -> None:
    s = TxnState("fuzzy", held_max=10, stale_s=5, gate_s_max=60)
    (fwd,) = s.requests(items(1, 2), now=0)
    assert fwd == forward([1, 2], [b"frame-1", b"frame-2"])
    assert s.checkpoint_requested(7) == [ready(7, 0)]
    assert s.requests(items(3), now=0) == [forward([3], [b"frame-3"])]  # writes never stop


def test_blocking_gate_waits_for_active_and_holds_new() -> None:
    s = TxnState("blocking", held_max=10, stale_s=5, gate_s_max=60)
    s.requests(items(1, 2), now=0)
    assert s.checkpoint_requested(3) == []  # two still active
    assert s.requests(items(4, 5), now=0) == []  # held back
    assert s.held_total == 2
    assert s.end([1]) == []
    assert s.end([2]) == [ready(3, 0)]
    assert s.end([2]) == []  # ready is said once
    assert s.checkpoint_finished(99, now=1) == []  # not ours
    assert s.checkpoint_finished(3, now=1) == [forward([4, 5], [b"frame-4", b"frame-5"])]
    assert set(s.active) == {4, 5}


def test_gate_with_nothing_active_is_ready_immediately() -> None:
    s = TxnState("blocking", held_max=10, stale_s=5, gate_s_max=60)
    assert s.checkpoint_requested(1) == [ready(1, 0)]


def test_held_queue_is_bounded() -> None:
    s = TxnState("blocking", held_max=2, stale_s=5, gate_s_max=60)
    s.checkpoint_requested(1)
    assert s.requests(items(1, 2, 3), now=0) == [busy(3)]
    assert len(s.held) == 2 and s.held_total == 2


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
    assert s.tick(now=31) == [forward([7], [b"frame-7"])]
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


def test_the_transaction_manager_reads_only_the_correlation_ids_of_a_burst() -> None:
    from actors.transaction_manager import writes_corrs
    from wire import codec
    from wire.messages import Ended, Writes

    frame = codec.encode(Writes([4, 5], [b"\x01" * 100_000, b"\x02"]))
    assert writes_corrs(frame) == [4, 5]
    assert writes_corrs(codec.encode(Ended([4, 5]))) is None
    assert writes_corrs(b"\xc1 not msgpack") is None
    assert writes_corrs(frame[:3]) is None
