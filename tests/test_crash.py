"""Crash safety, tested by killing processes: every acknowledged record is back exactly once,
in order, after SIGKILL of any actor or of the whole node; retries never duplicate."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack

from node.client import NodeClient
from node.crashcheck import PIPELINED_IN_FLIGHT, PipelinedProducer, Producer, check
from node.local import LocalNode
from wire.errors import NodeError

if TYPE_CHECKING:
    from tests.conftest import MakeNode

CONFIG = """
[limits]
request_timeout_ms = 2000

[supervisor]
restarts_max = 20
"""
TOPIC = "crash"
PARTITIONS = 3


def verify(c: NodeClient, producers: list[Producer]) -> int:
    return check(c, TOPIC, PARTITIONS, [p.ledger for p in producers])


def wait_until(what: str, cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # ok-sleep: poll interval, under a deadline


def restarted(node: LocalNode, role: str, old_pid: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with NodeClient(node.endpoint, timeout_ms=1000, retries=0) as c:
                for a in c.status()["actors"]:
                    if a["role"] == role:
                        return bool(a["pid"] != old_pid and a["state"] == "running")
        except NodeError:
            return False
        return False
    return check


def progressed(prods: list[Producer], batches: int) -> Callable[[], bool]:
    """Whether every producer has done ``batches`` batches."""
    return lambda: min(p.done_batches for p in prods) >= batches


def start_producers(node: LocalNode, batches: int = 60, batch: int = 50) -> list[Producer]:
    with node.client() as c:
        c.create_topic(TOPIC, partitions=PARTITIONS)
    prods = [Producer(node.endpoint, TOPIC, "a", batch, 0, batches),
             Producer(node.endpoint, TOPIC, "b", batch, 1, batches),
             Producer(node.endpoint, TOPIC, "c", batch, None, batches),
             PipelinedProducer(node.endpoint, TOPIC, "d", PIPELINED_IN_FLIGHT, None, batches)]
    for p in prods:
        p.start()
    return prods


def written(prods: list[Producer]) -> int:
    """Records the producers were allowed to write: every one must be acknowledged."""
    return sum(p.quota * p.batch for p in prods)


def finish(prods: list[Producer]) -> None:
    wait_until("producers done", lambda: all(p.idle() for p in prods), timeout_s=180)
    for p in prods:
        p.stop()
        p.join(10)
        assert p.error is None, repr(p.error)


def kill_actor_under_load(make_node: MakeNode, tmp_path: Path, role: str, kills: int = 2) -> None:
    node = make_node(CONFIG)
    prods = start_producers(node)
    for k in range(kills):
        target = (k + 1) * 15
        wait_until("progress", progressed(prods, target))
        pid = node.kill_actor(role)
        wait_until(f"{role} restart", restarted(node, role, pid))
    finish(prods)
    with node.client() as c:
        assert verify(c, prods) == written(prods)
    # And after a clean restart, the same again (nothing lost in RocksDB or the log).
    node.stop()
    node2 = make_node(CONFIG, data_dir=tmp_path / "data")
    with node2.client() as c:
        assert verify(c, prods) == written(prods)


def test_kill_log_manager_under_load(make_node: MakeNode, tmp_path: Path) -> None:
    kill_actor_under_load(make_node, tmp_path, "log")


def test_kill_shard_writer_under_load(make_node: MakeNode, tmp_path: Path) -> None:
    kill_actor_under_load(make_node, tmp_path, "writer-0")


def test_kill_cache_manager_under_load(make_node: MakeNode, tmp_path: Path) -> None:
    kill_actor_under_load(make_node, tmp_path, "cache", kills=1)


def test_kill_front_door_under_load(make_node: MakeNode, tmp_path: Path) -> None:
    kill_actor_under_load(make_node, tmp_path, "front", kills=1)


def test_kill_whole_node_under_load(make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node(CONFIG)
    prods = start_producers(node)
    for round_ in range(2):
        target = (round_ + 1) * 15
        wait_until("progress", progressed(prods, target))
        node.kill()
        node.start()  # same data dir and port; producers retry into the new node
    finish(prods)
    with node.client() as c:
        assert verify(c, prods) == written(prods)


def test_retry_after_lost_ack_does_not_duplicate(make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node(CONFIG)
    with node.client(producer_id=4242) as c:
        c.create_topic("t")
        fields = {"topic": "t", "producer_id": 4242, "seq": 0, "records": msgpack.packb([b"once"])}
        first = c.call("produce", **fields)
        again = c.call("produce", **fields)  # the ack of `first` "was lost"; same seq
        assert again["parts"] == first["parts"]
    node.kill()  # the producer's sequence numbers are remembered across a crash
    node.start()
    with node.client() as c:
        after = c.call("produce", **fields)
        assert after["parts"] == first["parts"]
        assert [r.value for r in c.read("t", 0, 0)] == [b"once"]
        fields["seq"] = 1
        assert c.call("produce", **fields)["parts"] == [[0, 1, 1]]


def test_writer_replays_log_after_kill(make_node: MakeNode, tmp_path: Path) -> None:
    """Records a writer had applied only in memory (RocksDB WAL is off) come back from the log."""
    node = make_node(CONFIG)
    with node.client() as c:
        c.create_topic("t", partitions=1)
        c.produce_batch("t", [f"v{i}".encode() for i in range(500)])
        owner = "writer-1"  # topic id 1, partition 0: (1 * 7919 + 0) % 2
        pid = node.kill_actor(owner)
        wait_until("writer restart", restarted(node, owner, pid))
        assert [r.value for r in c.read("t", 0, 0, 1000)] == [f"v{i}".encode() for i in range(500)]
        st = c.status()
    w = next(a for a in st["actors"] if a["role"] == owner)
    assert w["restarts"] == 1
    assert w["figures"]["replayed_bytes"] > 500 * 2, "the writer should have replayed the log"
