"""The transaction writes a shard writer holds until their commit (``actors.held_writes``):
no processes, no I/O."""

from __future__ import annotations

from actors.held_writes import HeldWrite, HeldWrites


def write(lsn: int, blob: bytes = b"x" * 10, part: int = 0) -> HeldWrite:
    return HeldWrite(lsn, part, 1000, 1, blob)


def test_writes_are_taken_by_transaction_and_shard_in_the_order_held() -> None:
    held = HeldWrites(bytes_max=1000)
    held.hold(7, (1, 0), write(10))
    held.hold(8, (1, 0), write(11))
    held.hold(7, (1, 0), write(12))
    held.hold(7, (1, 1), write(12, part=1))
    assert held.bytes == 40
    assert [w.lsn for w in held.take(7, (1, 0))] == [10, 12]
    assert held.take(7, (1, 0)) == []  # taken once
    assert held.bytes == 20
    assert [w.part for w in held.take(7, (1, 1))] == [1]
    assert held.bytes == 10 and not held.over()


def test_oldest_is_where_a_restarted_writer_must_read_the_log_from() -> None:
    held = HeldWrites(bytes_max=1000)
    assert held.oldest((1, 0)) == 0
    held.hold(7, (1, 0), write(10))
    held.hold(8, (1, 0), write(11))
    held.hold(9, (2, 0), write(5))
    assert held.oldest((1, 0)) == 10 and held.oldest((2, 0)) == 5
    held.take(7, (1, 0))
    assert held.oldest((1, 0)) == 11
    held.take(8, (1, 0))
    assert held.oldest((1, 0)) == 0


def test_over_the_budget_everything_is_taken_per_shard_in_log_order() -> None:
    held = HeldWrites(bytes_max=25)
    held.hold(8, (1, 0), write(11))
    held.hold(7, (1, 0), write(10))
    held.hold(7, (1, 0), write(12, part=1))
    held.hold(7, (1, 0), write(12, part=0))
    held.hold(9, (2, 0), write(3))
    assert held.over()
    spilled = held.take_all()
    assert [(txn, w.lsn, w.part) for txn, w in spilled[(1, 0)]] == [
        (7, 10, 0), (8, 11, 0), (7, 12, 0), (7, 12, 1)]
    assert [(txn, w.lsn) for txn, w in spilled[(2, 0)]] == [(9, 3)]
    assert held.bytes == 0 and held.writes == {} and not held.over()


def test_a_deleted_shard_s_writes_are_dropped() -> None:
    held = HeldWrites(bytes_max=100)
    held.hold(7, (1, 0), write(10))
    held.hold(7, (2, 0), write(10))
    held.drop_shard((1, 0))
    assert held.oldest((1, 0)) == 0 and held.bytes == 10 and list(held.writes) == [(7, (2, 0))]
