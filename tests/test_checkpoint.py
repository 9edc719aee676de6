"""The checkpoint handshake across processes: it truncates the log, keeps every record,
bounds the log under endless load, and recovers from a crash at every step."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from actors import wal
from actors.faults import fired_dir
from node.client import NodeClient
from node.local import LocalNode
from wire.errors import ErrorCode, NodeError

if TYPE_CHECKING:
    from tests.conftest import MakeNode

SMALL = """
[limits]
frame_bytes_max = 1048576
value_bytes_max = 65536
request_timeout_ms = 3000

[log]
segment_bytes_max = 1048576
group_bytes_max = 1048576
checkpoint_bytes = {ckpt}
checkpoint_mode = "{mode}"
checkpoint_timeout_ms = 10000

[supervisor]
restarts_max = 20
"""


def config(mode: str = "fuzzy", ckpt: int = 2 * 1024 * 1024) -> str:
    return SMALL.format(mode=mode, ckpt=ckpt)


def log_bytes(data_dir: Path) -> int:
    return wal.segments_bytes(data_dir / "log")


def produce(c: NodeClient, n_batches: int, start: int = 0, batch: int = 100) -> list[bytes]:
    values = []
    for b in range(start, start + n_batches):
        vals = [f"{b}-{i}-".encode() + b"x" * 200 for i in range(batch)]
        c.produce_batch("t", vals, partition=b % 2)
        values += vals
    return values


def stored(c: NodeClient) -> list[bytes]:
    out: list[bytes] = []
    for p in range(2):
        off = 0
        while recs := c.read("t", p, off, 1000):
            out += [r.value for r in recs]
            last = recs[-1].offset
            assert last is not None  # records read back carry their offset
            off = last + 1
    return out


def wait_status(node: LocalNode, what: str, cond: Any, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    with node.client(timeout_ms=2000, retries=0) as c:
        while True:
            try:
                st = c.status()
                if cond(st):
                    return st
            except Exception:
                pass
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)  # ok-sleep: poll interval, under a deadline


def txn_figures(status: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = next(a for a in status["actors"] if a["role"] == "txn")["figures"]
    return figures


@pytest.mark.parametrize("mode", ["fuzzy", "blocking"])
def test_checkpoint_truncates_the_log_and_keeps_every_record(make_node: MakeNode,
                                                              mode: str) -> None:
    node = make_node(config(mode, ckpt=64 * 1024 * 1024))
    with node.client() as c:
        c.create_topic("t", partitions=2)
        values = produce(c, 60)
        before = log_bytes(node.data_dir)
        assert before > 1024 * 1024
        lsn = c.checkpoint()
        assert lsn >= 61
        after = log_bytes(node.data_dir)
        assert after < 1024 * 1024, f"{before} -> {after} bytes"
        assert sorted(stored(c)) == sorted(values)
        values += produce(c, 10, start=60)
    written_at = time.time()
    if mode == "blocking":  # every write began at the gate and was told ended, none forgotten
        st = wait_status(node, "the transaction manager's figures",
                         lambda st: 0 < txn_figures(st)["began"] == txn_figures(st)["ended"])
        assert txn_figures(st)["expired"] == 0
    else:  # fuzzy: writes go straight to the log manager (figures reported after them)
        st = wait_status(node, "a report of the transaction manager's after the writes",
                         lambda st: txn_figures(st)["reported_at"] > written_at)
        assert txn_figures(st)["began"] == 0
    node.kill()  # the snapshot and the shards must carry what was truncated
    node2 = make_node(config(mode, ckpt=64 * 1024 * 1024), data_dir=node.data_dir)
    with node2.client() as c:
        assert sorted(stored(c)) == sorted(values)
        assert c.produce("t", b"more", partition=0)[1] == 35 * 100


def test_writes_held_at_a_blocking_checkpoints_gate_go_on_when_it_opens(
        make_node: MakeNode) -> None:
    """Produce requests arriving while a blocking checkpoint holds the gate wait in the
    transaction manager and are logged after it: each acknowledged record is stored once."""
    node = make_node(config("blocking", ckpt=1024 * 1024))
    acked: list[bytes] = []
    with node.client(timeout_ms=20_000) as c:
        c.create_topic("t", partitions=2)
        pipe = c.pipeline(in_flight_max=64)
        sent: dict[int, bytes] = {}
        n = 0
        deadline = time.monotonic() + 60
        held = 0
        while held == 0:
            assert time.monotonic() < deadline, "no write was ever held at the gate"
            for _ in range(40):  # ~40 rounds of up to 64 requests of 1 KiB between looks
                while len(sent) < 64:
                    value = f"{n}-".encode() + b"v" * 1000
                    sent[pipe.submit("t", [value], n % 2)] = value
                    n += 1
                for rid, result in pipe.poll(5000):
                    value = sent.pop(rid)
                    if isinstance(result, NodeError):
                        assert result.code == ErrorCode.BUSY, result  # the held queue was full
                    else:
                        acked.append(value)
            held = txn_figures(c.status()).get("held_total", 0)
        while sent:
            for rid, result in pipe.poll(5000):
                value = sent.pop(rid)
                if isinstance(result, NodeError):
                    assert result.code == ErrorCode.BUSY, result
                else:
                    acked.append(value)
        assert sorted(stored(c)) == sorted(acked)
        assert len(set(acked)) == len(acked) > 0


def test_a_clean_stop_with_blocking_checkpoints_does_not_wait_for_open_transactions(
        make_node: MakeNode) -> None:
    """A clean stop closes the front door first: no client can end a transaction open
    then. The checkpoint at stop waited for it anyway (the blocking gate), for the whole
    ``checkpoint_timeout_ms``, and gave up: the stop took that long, left no checkpoint,
    and the next start refused a change of the writer count. It waits for the writes in
    flight only, and the transaction is rolled back at the next start, as a fuzzy
    checkpoint's would be."""
    node = make_node(config("blocking"))
    with node.client() as c:
        c.create_topic("t", partitions=2)
        c.produce("t", b"kept", partition=0)
        tx = c.transaction()  # [txn] timeout_ms (60 s): open past the stop
        tx.produce("t", b"open", partition=1)
        tx.settle()  # open on the node
    marker = node.data_dir / "writers" / "clean-stop"
    started = time.monotonic()
    node.stop()
    took_s = time.monotonic() - started
    assert marker.exists(), f"no checkpoint at stop:\n{node.log_tail()}"
    assert took_s < 10, f"the stop took {took_s:.1f} s, checkpoint_timeout_ms is 10 s"
    node2 = make_node(config("blocking"), data_dir=node.data_dir)
    with node2.client() as c:
        assert [r.value for r in c.read("t", 0, 0)] == [b"kept"]
        assert c.read("t", 1, 0) == []  # the open transaction's record: rolled back
        assert c.txn_list() == []


def test_checkpoints_take_turns_between_the_snapshot_slots_across_restarts(
        make_node: MakeNode) -> None:
    node = make_node(config("fuzzy", ckpt=64 * 1024 * 1024))
    log_dir = node.data_dir / "log"
    slots = []
    with node.client() as c:
        c.create_topic("t", partitions=2)
        values: list[bytes] = []
        for i in range(2):
            values += produce(c, 3, start=3 * i)
            lsn = c.checkpoint()
            snap, slot = wal.load_snapshot(log_dir)
            assert snap is not None and snap["last_lsn"] >= lsn
            slots.append(slot)
    assert slots == [0, 1]
    node.kill()
    node2 = make_node(config("fuzzy", ckpt=64 * 1024 * 1024), data_dir=node.data_dir)
    with node2.client() as c:
        values += produce(c, 2, start=6)
        c.checkpoint()  # the restarted log manager writes the slot not holding the newest
        assert wal.load_snapshot(log_dir)[1] == 0
        assert sorted(stored(c)) == sorted(values)


def test_log_stays_bounded_under_endless_load(make_node: MakeNode) -> None:
    ckpt = 2 * 1024 * 1024
    node = make_node(config("fuzzy", ckpt=ckpt))
    peak = 0
    with node.client() as c:
        c.create_topic("t", partitions=2)
        total = 0
        for b in range(600):  # ~12 MB of records, six times the checkpoint size
            produce(c, 1, start=b)
            total += 100
            peak = max(peak, log_bytes(node.data_dir))
    wait_status(node, "checkpoints to be reported", lambda st: st["log"]["checkpoints"] >= 3)
    assert peak < 3 * ckpt + 2 * 1024 * 1024, f"log grew to {peak} bytes"
    assert log_bytes(node.data_dir) < 3 * ckpt


@pytest.mark.parametrize("point", [
    "checkpoint.after_request",
    "checkpoint.after_ready",
    "checkpoint.after_flushed",
    "checkpoint.snapshot_created",  # the first snapshot: its slot left zeros, no other one
    "checkpoint.after_snapshot",
    "checkpoint.after_truncate",
    "writer.after_flush",
])
def test_crash_at_each_step_of_the_handshake(make_node: MakeNode, point: str) -> None:
    node = make_node(config("fuzzy", ckpt=64 * 1024 * 1024), env={"SHARDNODE_FAULTS": point})
    with node.client(timeout_ms=20_000) as c:
        c.create_topic("t", partitions=2)
        values = produce(c, 30)
        with contextlib.suppress(NodeError):
            c.checkpoint()  # an actor dies mid-way; the client's retry may finish it
    fired = sorted(p.name for p in fired_dir(node.data_dir).iterdir())
    assert fired == [point], "the fault must have fired exactly once"
    wait_status(node, "restart", lambda st: all(a["state"] == "running" for a in st["actors"])
                and sum(a["restarts"] for a in st["actors"]) > 0)
    with node.client(timeout_ms=20_000) as c:
        values += produce(c, 10, start=30)
        assert sorted(stored(c)) == sorted(values)
        c.checkpoint()  # the next checkpoint completes
        assert log_bytes(node.data_dir) < 1024 * 1024
    node.kill()
    node2 = make_node(config("fuzzy", ckpt=64 * 1024 * 1024), data_dir=node.data_dir)
    with node2.client() as c:
        assert sorted(stored(c)) == sorted(values)


def test_fsync_failure_is_fatal_to_the_log_manager_and_recovered(make_node: MakeNode) -> None:
    node = make_node(config(), env={"SHARDNODE_FAULTS": "log.fsync"})
    with node.client(timeout_ms=20_000) as c:
        with contextlib.suppress(NodeError):
            c.create_topic("t", partitions=2)  # its fsync fails: the log manager exits
        wait_status(node, "log restart", lambda st: st["actors"][0]["restarts"] == 1
                    and all(a["state"] == "running" for a in st["actors"]))
        if "t" not in [t.name for t in c.list_topics()]:
            c.create_topic("t", partitions=2)  # unacknowledged, so possibly not there
        values = produce(c, 5)
        assert sorted(stored(c)) == sorted(values)
    assert "log write/fsync failed" in node.log_file.read_text()


def test_rest_for_one_restarts_those_after_the_dead_actor(node: LocalNode) -> None:
    with node.client() as c:
        before = {a["role"]: a["pid"] for a in c.status()["actors"]}
    node.kill_actor("txn")
    st = wait_status(node, "restart", lambda st: st["actors"][1]["pid"] != before["txn"]
                     and all(a["state"] == "running" for a in st["actors"]))
    after = {a["role"]: a["pid"] for a in st["actors"]}
    assert after["log"] == before["log"], "actors before the dead one keep running"
    for role in ("txn", "cache", "writer-0", "writer-1", "front"):
        assert after[role] != before[role], f"{role} should have been restarted"


def test_too_many_restarts_stop_the_node(make_node: MakeNode) -> None:
    node = make_node("[supervisor]\nrestarts_max = 2\nrestart_window_s = 600\n")
    for _ in range(3):
        pid = node.kill_actor("writer-1")
        deadline = time.monotonic() + 60
        while True:
            assert node.proc is not None
            if node.proc.poll() is not None:
                break
            try:
                if node.actor_pid("writer-1") != pid:
                    break
            except Exception:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)  # ok-sleep: poll until restarted or stopped, under a deadline
    assert node.proc is not None and node.proc.wait(60) == 1
    assert "3 actor restarts within 600 s" in node.log_file.read_text()
    node.proc = None
