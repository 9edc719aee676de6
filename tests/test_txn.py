"""Transactions and XA end to end: real node processes, sockets and RocksDB on tmp_path."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import pytest

from actors import wal
from actors.roles import shard_owner
from config import load_config
from node.client import NodeClient
from node.local import LocalNode
from wire.errors import (
    ErrorCode,
    NodeError,
    RequestTimeout,
    TransactionAborted,
    TransactionError,
    TransactionTimedOut,
    UnknownTransaction,
    XAERInval,
    XAERNota,
    XAERProto,
)
from wire.records import pack_batch
from wire.xid import Xid

if TYPE_CHECKING:
    from tests.conftest import MakeNode

SMALL_LOG = """
[log]
segment_bytes_max = 262144
group_bytes_max = 262144
checkpoint_bytes = 262144
checkpoint_mode = "{mode}"
checkpoint_timeout_ms = 10000

[limits]
frame_bytes_max = 262144
value_bytes_max = 65536

[supervisor]
restarts_max = 20
"""


def values(c: NodeClient, topic: str, partition: int) -> list[bytes]:
    out: list[bytes] = []
    off = 0
    while recs := c.read(topic, partition, off, 1000):
        out += [r.value for r in recs]
        off = (recs[-1].offset or 0) + 1
    return out


def until(what: str, cond: Any, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # ok-sleep: poll interval, under a deadline


def prepare_a_branch(c: NodeClient, xid: Xid, first: list[bytes], second: bytes) -> None:
    """A topic "out" of two partitions, and the XA branch ``xid`` prepared with ``first``
    in partition 0 and ``second`` in partition 1."""
    c.create_topic("out", partitions=2)
    branch = c.xa_start(xid)
    branch.produce_batch("out", first, partition=0)
    branch.produce("out", second, partition=1)
    c.xa_end(xid)
    c.xa_prepare(xid)


def test_records_are_invisible_until_commit_and_aborts_leave_no_gap(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("out", partitions=2)
        c.create_topic("in", partitions=1)
        c.produce_batch("in", [b"i0", b"i1", b"i2"])
        tx = c.transaction()
        tx.produce("out", b"a", partition=0)
        tx.produce_batch("out", [b"b", b"c"], partition=1)
        tx.commit_offset("billing", "in", 0, 3)
        assert values(c, "out", 0) == [] and values(c, "out", 1) == []
        assert c.committed_offset("billing", "in", 0) is None
        aborted = c.transaction()
        aborted.produce_batch("out", [b"x", b"y"], partition=0)
        aborted.abort()
        res = tx.commit()
        assert [tuple(p) for p in res.parts] == [("out", 0, 0, 1), ("out", 1, 0, 2)]
        assert res.offsets == [[(0, 0)], [(1, 0), (1, 1)]]
        assert values(c, "out", 0) == [b"a"] and values(c, "out", 1) == [b"b", b"c"]
        assert c.committed_offset("billing", "in", 0) == 3
        assert c.produce("out", b"after", partition=0) == (0, 1)  # no gap left by the abort
        with c.transaction() as tx2:  # commits on leaving the block
            tx2.produce("out", b"k1", key=b"user-1", partition=0)
        assert c.read_by_key("out", b"user-1", partition=0) is not None
        with pytest.raises(RuntimeError), c.transaction() as tx3:  # aborts on an exception
            tx3.produce("out", b"never", partition=0)
            raise RuntimeError("boom")
        assert values(c, "out", 0) == [b"a", b"after", b"k1"]


def test_a_block_whose_commit_fails_leaves_nothing_open(node: LocalNode) -> None:
    """``with c.transaction()`` rolls back when its commit raises too: a write the node
    refused (an unknown topic; a value over a limit), found only at the commit, left the
    transaction open with what it staged, until its timeout, and a thousand such blocks
    took every slot of ``[txn] open_max`` from every other client."""
    with node.client() as c:
        c.create_topic("blocked", partitions=1)
        big = b"x" * (load_config().limits.value_bytes_max + 1)
        for label, last in (("unknown topic", ("nosuch", b"x")), ("too large", ("blocked", big))):
            with pytest.raises(NodeError) as raised, c.transaction() as tx:
                tx.produce("blocked", b"staged", partition=0)
                tx.settle()  # the node has begun it (not one txn_once request, never open)
                tx.produce(*last)
            assert raised.value.code in (ErrorCode.UNKNOWN_TOPIC, ErrorCode.BAD_REQUEST)
            assert c.txn_list() == [], label
        assert values(c, "blocked", 0) == []


def test_large_writes_in_and_out_of_transactions_land_whole(node: LocalNode) -> None:
    """Writes past 64 KiB, which the transaction manager passes on and the writers apply as
    views into the frames they came in (``wire.views``), on every writer's shards."""
    with node.client() as c:
        c.create_topic("big", partitions=4)
        batch = [bytes([i % 251]) * 1000 for i in range(150)]  # 150 kB a request
        for p in range(4):
            c.produce_batch("big", batch, partition=p)
        tx = c.transaction()
        for p in range(4):
            tx.produce_batch("big", [v[::-1] + b"t" for v in batch], partition=p)
        aborted = c.transaction()
        aborted.produce_batch("big", [b"never" * 200] * 150, partition=1)
        aborted.abort()
        tx.commit()
        for p in range(4):
            assert values(c, "big", p) == batch + [v[::-1] + b"t" for v in batch], p


def test_a_commit_retried_answers_the_same_and_applies_nothing_twice(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("out", partitions=1)
        tx = c.transaction()
        tx.produce_batch("out", [b"a", b"b"])
        mine = c.producer_id  # the owner its begin named: only it commits it while active
        first = c.call("txn_commit", txn=tx.id, owner=mine)
        again = c.call("txn_commit", txn=tx.id, owner=mine)
        assert first["lsn"] == again["lsn"] and first["parts"] == again["parts"]
        assert values(c, "out", 0) == [b"a", b"b"]
        # A write retried (same sequence number) is staged once.
        tx = c.transaction()
        for _ in range(2):
            c.call("txn_produce", txn=tx.id, seq=0, topic="out", records=pack_batch([b"x"]))
        with pytest.raises(TransactionError, match="2 writes were sent, 1 staged"):
            c.call("txn_commit", txn=tx.id, writes=2, owner=mine)  # one went missing: refused
        assert c.call("txn_commit", txn=tx.id, writes=1, owner=mine)["parts"] == [
            ["out", 0, 2, 1]]


def test_a_commit_answered_after_a_lost_begin_answer_is_the_outcome(node: LocalNode) -> None:
    """A begin whose answers were lost (a front door restarting: every attempt timed out,
    and it stayed to be sent again) was sent again after the commit it preceded was
    answered, and refused "transaction id ... is in use": a committed transaction raised.
    Seen once in `scripts/crashtest --kv` (seed 516580292, trial 9)."""
    with node.client() as c:
        c.create_topic("lost-begin")
        tx = c.transaction()
        tx.produce("lost-begin", b"v")
        tx.settle()  # begun and staged: the node has both
        begin_fields = {"txn": tx.id, "owner": c.producer_id}
        tx._failed[0] = ("txn_begin", begin_fields, RequestTimeout("no answer in time"))
        res = tx.commit()
        assert [tuple(p) for p in res.parts] == [("lost-begin", 0, 0, 1)]
        assert values(c, "lost-begin", 0) == [b"v"]


def test_a_whole_transaction_goes_as_one_request_and_a_retry_answers_the_same(
        node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("out", partitions=2)
        c.create_topic("in", partitions=1)
        c.produce_batch("in", [b"i0", b"i1"])
        sent: list[str] = []  # the ops of the requests the client sends
        send = c.sock.send

        def spy(frame: bytes, *a: Any, **kw: Any) -> Any:
            sent.extend(r["op"] for r in msgpack.Unpacker(io.BytesIO(frame)))
            return send(frame, *a, **kw)

        c.sock.send = spy  # type: ignore[method-assign,assignment]
        tx = c.transaction()
        tx.produce_batch("out", [b"a", b"b"], partition=1)
        tx.produce("out", b"k", key=b"user-7")
        tx.commit_offset("billing", "in", 0, 2)
        res = tx.commit()
        assert sent == ["txn_once"]  # not begin, three writes and a commit
        c.sock.send = send  # type: ignore[method-assign]
        keyed_p = res.offsets[1][0][0]
        assert res.offsets[0] == [(1, 0), (1, 1)]
        assert res.offsets[1] == [(keyed_p, 0 if keyed_p == 0 else 2)]
        assert c.read_by_key("out", b"user-7", partition=keyed_p) is not None
        assert c.committed_offset("billing", "in", 0) == 2
        # The same request sent again (its answer lost): the first outcome, nothing twice.
        writes = [{"op": "txn_produce", "topic": "out", "records": pack_batch([b"x", b"y"]),
                   "partition": 0}]
        first = c.call("txn_once", txn=777, writes=writes)
        again = c.call("txn_once", txn=777, writes=writes)
        assert (again["lsn"], again["parts"], again["produced"]) == \
            (first["lsn"], first["parts"], first["produced"])
        assert first["produced"] == [[[[0, 2]], None]]
        assert values(c, "out", 0).count(b"x") == 1
        # An id an open transaction holds is refused; so is a write no txn_once takes.
        open_tx = c.transaction()
        open_tx.produce("out", b"o", partition=0)
        open_tx.settle()
        with pytest.raises(TransactionError, match="in use"):
            c.call("txn_once", txn=open_tx.id, writes=writes)
        with pytest.raises(NodeError, match="write 0 must be a map with 'op' one of"):
            c.call("txn_once", txn=778, writes=[{"op": "txn_kv", "namespace": "n", "key": b"k",
                                                 "value": None}])
        open_tx.abort()
        assert values(c, "out", 0).count(b"o") == 0


def test_misuse_is_refused_with_clear_errors(make_node: MakeNode) -> None:
    node = make_node("[txn]\nrecords_max = 10000\nopen_max = 3\n")
    with node.client(retries=0) as c:
        c.create_topic("out", partitions=1)
        with pytest.raises(UnknownTransaction):
            c.call("txn_commit", txn=12345)
        tx = c.transaction()
        tx.produce("out", b"a")
        tx.commit()  # one txn_once: the transaction manager never held it
        with pytest.raises(UnknownTransaction, match="committed whole by one txn_once"):
            c.call("txn_produce", txn=tx.id, seq=1, topic="out", records=pack_batch([b"x"]))
        tx = c.transaction()
        tx.produce("out", b"a")
        tx.settle()  # begun on its own
        tx.commit()
        with pytest.raises(TransactionError, match="committed"):
            c.call("txn_produce", txn=tx.id, seq=1, topic="out", records=pack_batch([b"x"]))
        ab = c.transaction()
        ab.produce("out", b"z")
        ab.settle()  # sent and staged (else abort just forgets it: the node never heard of it)
        ab.abort()
        with pytest.raises(TransactionError, match="rolled back"):
            c.call("txn_commit", txn=ab.id)
        big = c.transaction()
        big.produce_batch("out", [b"v"] * 4000)
        big.settle()  # begun on its own (not one txn_once): it stays open when refused
        for _ in range(2):
            big.produce_batch("out", [b"v"] * 4000)
        with pytest.raises(TransactionError, match="records_max"):
            big.commit()  # the third write was refused: so is the commit
        opened = [c.transaction() for _ in range(2)]  # with ``big``: three open
        for t in opened:
            t.settle()
        with pytest.raises(TransactionError, match="open_max"):
            c.transaction().settle()
        for t in [big, *opened]:
            t.abort()
        with pytest.raises(XAERInval, match="64"):
            c.xa_start(Xid(1, b"g" * 65, b""))  # the client checks, and so does the node:
        with pytest.raises(XAERInval, match="64"):
            c.call("xa_start", xid=[1, b"g" * 65, b""])
        assert c.produce("out", b"still") == (0, 2)  # and the node keeps serving


def test_an_open_transaction_times_out(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("out", partitions=1)
        tx = c.transaction(timeout_ms=300)
        tx.produce("out", b"late")

        def timed_out() -> bool:
            try:
                tx.produce("out", b"more")
                tx.settle()
            except TransactionTimedOut:
                return True
            return False

        until("the transaction to time out", timed_out)
        assert values(c, "out", 0) == []
        assert c.produce("out", b"next") == (0, 0)


def test_a_reader_never_sees_part_of_a_transaction(node: LocalNode) -> None:
    """Each transaction writes one record to each of two partitions, which two different
    shard writers own. Reading one partition and then the other, the second must show
    every transaction the first showed (and the other way round)."""
    with node.client() as c:
        c.create_topic("pair", partitions=4)
        (row,) = c.call("list_topics")["topics"]
        topic_id = row[2]
    a, b = next((p, q) for p in range(4) for q in range(4)
                if shard_owner(topic_id, p, 2) != shard_owner(topic_id, q, 2))
    stop = threading.Event()
    committed = [0]
    errors: list[BaseException] = []

    def commit_pairs() -> None:
        try:
            with node.client() as w:
                i = 0
                while not stop.is_set():
                    with w.transaction() as tx:
                        tx.produce("pair", f"{i}".encode(), partition=a)
                        tx.produce("pair", f"{i}".encode(), partition=b)
                    committed[0] = i = i + 1
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    writer = threading.Thread(target=commit_pairs, daemon=True)
    writer.start()
    reads = 0
    try:
        with node.client() as r:
            deadline = time.monotonic() + 60
            while (committed[0] < 150 or reads < 150) and time.monotonic() < deadline:
                first, second = (a, b) if reads % 2 == 0 else (b, a)
                seen_first = set(values(r, "pair", first))
                seen_second = set(values(r, "pair", second))
                missing = seen_first - seen_second
                assert not missing, (f"partition {first} shows transactions {sorted(missing)} "
                                     f"that partition {second}, read after it, does not")
                reads += 1
    finally:
        stop.set()
        writer.join(30)
    assert not errors, errors
    assert committed[0] >= 150 and reads >= 150


def test_a_prepared_branch_survives_kills_and_ten_checkpoints(make_node: MakeNode,
                                                            tmp_path: Path) -> None:
    node = make_node(SMALL_LOG.format(mode="fuzzy"))
    xid = Xid(1, b"order-17", b"shard-a")
    with node.client() as c:
        prepare_a_branch(c, xid, [b"p1", b"p2"], b"p3")
        assert values(c, "out", 0) == []
    log_sizes = []
    for round_ in range(10):
        if round_ in (2, 5):
            node.kill()  # the whole node
            node.start()
        elif round_ in (3, 7):
            for role in ("log", "txn"):
                node.kill_actor(role)
        with node.client() as c:
            until("the node to serve", lambda: c.xa_recover() == [xid])
            for i in range(8):  # 8 x 40 KiB: past checkpoint_bytes
                c.produce_batch("out", [bytes(40_000)], partition=i % 2)
            c.checkpoint()
            log_sizes.append(wal.segments_bytes(node.data_dir / "log"))
    assert max(log_sizes) < 1024 * 1024, log_sizes  # the branch does not pin the log
    with node.client() as c:
        (row,) = c.txn_list()
        assert row.xid == str(xid) and row.state == "prepared" and row.records == 3
        res = c.xa_commit(xid)
        assert sorted((p.partition, p.first_offset, p.record_count) for p in res.parts) == [
            (0, 40, 2), (1, 40, 1)]
        assert values(c, "out", 0)[-2:] == [b"p1", b"p2"]
        assert values(c, "out", 1)[-1:] == [b"p3"]
        assert c.xa_recover() == []
        with pytest.raises(XAERNota):
            c.xa_rollback(Xid(1, b"nobody", b""))


def test_another_client_cannot_end_a_branch_that_is_active(node: LocalNode) -> None:
    """Another client's xa_end, then prepare and commit, committed the first half of a
    branch while its owner was still writing the second."""
    xid = Xid(3, b"owned", b"a")
    with node.client() as c, node.client() as d:
        c.create_topic("owned")
        branch = c.xa_start(xid)
        branch.produce("owned", b"first-half")
        branch.settle()
        with pytest.raises(XAERProto, match="active in another client"):
            d.xa_end(xid)
        branch.produce("owned", b"second-half")
        c.xa_end(xid)
        d.xa_prepare(xid)  # ended, the branch is any coordinator's
        d.xa_commit(xid)
        assert values(c, "owned", 0) == [b"first-half", b"second-half"]


def test_closing_a_client_rolls_back_its_open_local_transactions(node: LocalNode) -> None:
    """A transaction neither committed nor aborted when its client closed stayed open, its
    records staged, for its whole timeout (a place in [txn] open_max); an XA branch is its
    coordinator's and stays."""
    xid = Xid(9, b"kept", b"b")
    with node.client() as other:
        other.create_topic("closing")
        c = node.client()
        tx = c.transaction(timeout_ms=600_000)
        tx.produce("closing", b"staged")
        tx.settle()  # the node holds it open
        branch = c.xa_start(xid)
        branch.produce("closing", b"branch")
        c.xa_end(xid)
        assert len(other.txn_list()) == 2
        c.close()
        assert [info.xid for info in other.txn_list()] == [str(xid)]
        assert tx.finished
        other.xa_rollback(xid)
        assert values(other, "closing", 0) == []


def test_xa_calls_in_the_wrong_state_and_a_rollback(node: LocalNode) -> None:
    xid = Xid(7, b"g", b"b")
    with node.client(retries=0) as c:
        c.create_topic("out", partitions=1)
        branch = c.xa_start(xid)
        branch.produce("out", b"v")
        with pytest.raises(XAERProto):
            c.xa_prepare(xid)  # not ended
        with pytest.raises(XAERProto) as info:
            c.xa_commit(xid)  # not ended: its own client is told so, not of another client
        assert "it is active" in info.value.message and "another" not in info.value.message
        c.xa_end(xid)
        with pytest.raises(XAERProto):
            branch.produce("out", b"after end")
            branch.settle()
        c.xa_prepare(xid)
        with pytest.raises(XAERProto):
            c.xa_commit(xid, one_phase=True)
        c.xa_rollback(xid)
        c.xa_rollback(xid)  # again: the same outcome
        assert values(c, "out", 0) == []
        one = Xid(7, b"one-phase", b"")
        branch = c.xa_start(one)
        branch.produce("out", b"w")
        c.xa_end(one)
        assert c.xa_commit(one, one_phase=True).parts[0].first_offset == 0


def test_a_restart_rolls_back_open_transactions(node: LocalNode) -> None:
    with node.client() as first:  # open through the kill: its close would roll it back
        first.create_topic("out", partitions=1)
        tx = first.transaction()
        tx.produce("out", b"lost")
        tx.settle()  # staged
        node.kill()
        node.start()
        with node.client() as c:
            with pytest.raises(TransactionAborted):
                c.call("txn_produce", txn=tx.id, seq=1, topic="out",
                       records=pack_batch([b"more"]))
            with pytest.raises(TransactionAborted):
                c.call("txn_commit", txn=tx.id)
            assert values(c, "out", 0) == []
            assert c.txn_list() == []


def test_ids_the_node_picks_stay_in_range_after_a_client_picked_the_highest(
        node: LocalNode) -> None:
    """The log remembered 2**63 - 1 as the highest id seen: after a restart the node picked
    2**63, which no request may name, and its transaction could only time out."""
    top = 2**63 - 1
    with node.client() as c:
        c.create_topic("out", partitions=1)
        assert c.call("txn_begin", txn=top)["txn"] == top
        c.call("txn_abort", txn=top)
    node.kill()
    node.start()
    with node.client() as c:
        txn = c.call("txn_begin")["txn"]
        assert 0 < txn <= top
        c.call("txn_produce", txn=txn, seq=0, topic="out", records=pack_batch([b"x"]))
        c.call("txn_abort", txn=txn)
        assert values(c, "out", 0) == []


def test_a_blocking_checkpoint_waits_for_open_transactions(make_node: MakeNode) -> None:
    node = make_node(SMALL_LOG.format(mode="blocking"))
    with node.client() as c:
        c.create_topic("out", partitions=1)
        tx = c.transaction()
        tx.produce("out", b"v")
        tx.settle()  # sent: open on the node (queued in the client, the node would not know it)
        done: list[int] = []
        ckpt = threading.Thread(target=lambda: done.append(node.client().checkpoint()),
                                daemon=True)
        ckpt.start()

        def txn_figures() -> dict[str, Any]:
            st = c.status()
            figures: dict[str, Any] = next(a for a in st["actors"]
                                           if a["role"] == "txn")["figures"]
            return figures

        until("the gate to close", lambda: txn_figures()["gate"])
        assert ckpt.is_alive() and not done  # waiting for the open transaction
        # A whole transaction in one request is a write the gate holds back: refused BUSY
        # while it is closed, and sent again by the client until it opens.
        with node.client(retries=0) as other:
            with pytest.raises(NodeError) as info:
                other.call("txn_once", txn=4321, writes=[
                    {"op": "txn_produce", "topic": "out", "records": pack_batch([b"w"])}])
            assert info.value.code == ErrorCode.BUSY and "checkpoint" in info.value.message
        once: list[Any] = []
        later = threading.Thread(target=lambda: once.append(_one_commit(node)), daemon=True)
        later.start()
        tx.commit()
        ckpt.join(30)
        later.join(30)
        assert done and done[0] >= 1
        assert once and once[0].parts[0].record_count == 1
        assert sorted(values(c, "out", 0)) == [b"v", b"w"]
        assert txn_figures()["active"] == 0  # what the gate waited for ended


def _one_commit(node: LocalNode) -> Any:
    with node.client(retries=30) as c, c.transaction() as tx:
        tx.produce("out", b"w")
    return tx.result


def _cli(node: LocalNode, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "node", *args, "--port", str(node.port)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == code, out.stderr
    return out


def test_operators_list_and_resolve_branches_in_doubt(node: LocalNode) -> None:
    a, b = Xid(1, b"order-17", b"shard-a"), Xid(1, b"order-18", b"")
    with node.client() as c:
        c.create_topic("out", partitions=1)
        for xid, value in ((a, b"A"), (b, b"B")):
            branch = c.xa_start(xid)
            branch.produce("out", value)
            c.xa_end(xid)
            c.xa_prepare(xid)
        local = c.transaction()
        local.produce("out", b"L")
        local.settle()
        status = _cli(node, "status").stdout
        assert "transactions open / prepared" in status
        assert "1 / 2" in until("the figures to show them", lambda: (
            out if "1 / 2" in (out := _cli(node, "status").stdout) else None))
        listed = _cli(node, "txn", "list").stdout
        assert "1:6f726465722d3137:73686172642d61" in listed and str(b) in listed
        assert listed.count("│ prepared") == 2 and "│ active" in listed
        out = _cli(node, "txn", "commit", str(a)).stdout  # pasted back as printed
        assert f"committed {a}" in out and "out/0 0..0" in out
        _cli(node, "txn", "rollback", str(b))
        _cli(node, "txn", "rollback", str(local.id))
        assert values(c, "out", 0) == [b"A"]
        assert c.xa_recover() == [] and c.txn_list() == []
        refused = _cli(node, "txn", "commit", "not-an-xid", code=1)
        assert "XAER_INVAL" in refused.stderr and "Traceback" not in refused.stderr


def test_writes_held_in_memory_come_back_after_kills_and_stay_through_checkpoints(
        make_node: MakeNode) -> None:
    """Shard writers hold a transaction's writes in memory until its commit
    (actors/held_writes.py); a shard made durable meanwhile (here by a compaction) goes past
    them and records where the log has them, so a writer killed then holds them again, and
    a checkpoint writes them into the shard before the log after them may go."""
    node = make_node(SMALL_LOG.format(mode="fuzzy"))
    xid = Xid(1, b"held", b"")
    with node.client() as c:
        prepare_a_branch(c, xid, [b"h1", b"h2"], b"h3")
        c.produce_batch("out", [b"plain"], partition=0)
        c.produce_batch("out", [b"plain"], partition=1)
        c.compact("out")  # every shard flushed past the held writes, which stay held
    for role in ("writer-0", "writer-1"):
        node.kill_actor(role)
    with node.client() as c:
        until("the writers to be back", lambda: all(
            a["state"] == "running" for a in c.status()["actors"]))
        assert c.xa_recover() == [xid]
        c.produce_batch("out", [b"after"], partition=0)
        assert values(c, "out", 0) == [b"plain", b"after"]
    node.kill()  # the whole node: the writers hold them again from the log
    node.start()
    with node.client() as c:
        until("the node to serve", lambda: c.xa_recover() == [xid])
        for i in range(8):  # 8 x 40 KiB: past checkpoint_bytes, and the log rolls
            c.produce_batch("out", [bytes(40_000)], partition=i % 2)
        c.checkpoint()
        c.checkpoint()
    node.kill()  # the log before the checkpoints is gone: the shards have the writes now
    node.start()
    with node.client() as c:
        until("the node to serve", lambda: c.xa_recover() == [xid])
        res = c.xa_commit(xid)
        assert sorted((p.partition, p.record_count) for p in res.parts) == [(0, 2), (1, 1)]
        assert values(c, "out", 0)[-2:] == [b"h1", b"h2"]
        assert values(c, "out", 1)[-1:] == [b"h3"]
        assert wal.segments_bytes(node.data_dir / "log") < 1024 * 1024


def test_a_commits_offsets_follow_each_produce_call_in_order() -> None:
    """The offsets a commit reports, from its parts and each produce call's split: a call to
    one partition gets them in a row, a split one record by record, and a topic deleted
    before the commit -1 for each record."""
    from node.transaction import Transaction

    tx = Transaction(None, 1)  # type: ignore[arg-type]  # no client: nothing is sent
    tx._produces = [(1, "a"), (2, "b"), (3, "a"), (4, "gone")]
    tx._replies = {1: {"parts": [[0, 3]]}, 2: {"parts": [[0, 1], [1, 2]], "assign": [1, 0, 1]},
                   3: {"parts": [[0, 2]]}, 4: {"parts": [[0, 2]]}}
    res = tx._result({"lsn": 9, "parts": [["a", 0, 10, 5], ["b", 0, 4, 1], ["b", 1, 7, 2]]})
    assert res.lsn == 9
    assert res.offsets == [[(0, 10), (0, 11), (0, 12)], [(1, 7), (0, 4), (1, 8)],
                           [(0, 13), (0, 14)], [(0, -1), (0, -1)]]


def test_transactions_and_a_pipeline_on_one_client_each_get_their_own_answers(
        node: LocalNode) -> None:
    """Two transactions with requests in flight at once on one socket, and a pipeline beside
    them: whichever reads the socket hands what is not its own to the one it is for. (An
    answer read by the wrong reader was dropped: the other transaction waited out its
    timeout, sent its writes again after its commit had gone through, and raised.)"""
    with NodeClient(node.endpoint, timeout_ms=60_000) as c:
        c.create_topic("two", partitions=2)
        pipe = c.pipeline()
        first, second = c.transaction(), c.transaction()
        for i in range(70):  # past QUEUED_MAX: each sends a frame of writes at once
            first.produce("two", f"a{i}".encode(), partition=0)
            second.produce("two", f"b{i}".encode(), partition=1)
        piped = pipe.submit("two", [b"piped"], partition=0)
        pipe.flush()
        outcome: dict[str, Any] = {}

        def finish() -> None:
            try:
                outcome["first"] = first.commit()    # reads the second's answers too
                outcome["second"] = second.commit()
                outcome["plain"] = c.produce("two", b"plain", partition=1)  # and the pipe's
            except Exception as exc:  # raised in the test's thread below
                outcome["error"] = exc

        worker = threading.Thread(target=finish)
        worker.start()
        worker.join(30)  # the node answers at once; a lost answer would wait 60 s
        assert not worker.is_alive(), "an answer was lost: a commit waited for it"
        assert "error" not in outcome, outcome.get("error")
        answers: list[tuple[int, Any]] = []
        deadline = time.monotonic() + 30
        while not answers:
            assert time.monotonic() < deadline, "the pipeline's answer was lost"
            answers += pipe.poll(100)
        assert [rid for rid, _out in answers] == [piped]
        assert not isinstance(answers[0][1], Exception), answers[0][1]
        assert [len(o) for o in outcome["first"].offsets] == [1] * 70
        assert values(c, "two", 1)[:70] == [f"b{i}".encode() for i in range(70)]
        assert sorted(values(c, "two", 0)) == sorted([f"a{i}".encode() for i in range(70)]
                                                     + [b"piped"])
