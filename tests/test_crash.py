"""Crash safety, tested by killing processes: every acknowledged record is back exactly once,
in order, after SIGKILL of any actor or of the whole node; retries never duplicate."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from node.client import NodeClient
from node.local import LocalNode
from wire.errors import NodeError

CONFIG = """
[limits]
request_timeout_ms = 2000

[supervisor]
restarts_max = 20
"""
TOPIC = "crash"
PARTITIONS = 3


class Producer(threading.Thread):
    """Writes numbered batches; retries each batch with the same sequence number until it is
    acknowledged, as an idempotent producer must. Records what was acknowledged."""

    def __init__(self, endpoint: str, name: str, batches: int, batch: int,
                 partition: int | None) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.tag, self.batches, self.batch = endpoint, name, batches, batch
        self.partition = partition
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.sent: set[bytes] = set()
        self.error: BaseException | None = None
        self.done_batches = 0

    def run(self) -> None:
        try:
            with NodeClient(self.endpoint, timeout_ms=3000, retries=0) as c:
                for b in range(self.batches):
                    values = [f"{self.tag}-{b}-{i}".encode() for i in range(self.batch)]
                    self.sent.update(values)
                    fields: dict[str, Any] = {"topic": TOPIC, "producer_id": c.producer_id,
                                              "seq": b, "records": msgpack.packb(values)}
                    if self.partition is not None:
                        fields["partition"] = self.partition
                    deadline = time.monotonic() + 120
                    while True:
                        try:
                            reply = c.call("produce", **fields)
                            break
                        except NodeError:
                            if time.monotonic() > deadline:
                                raise
                    (p, first, n), = reply["parts"]
                    assert n == len(values)
                    for i, v in enumerate(values):
                        self.acked[v] = (p, first + i)
                    self.done_batches = b + 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def read_all(c: NodeClient) -> dict[int, list[bytes]]:
    out = {}
    for p in range(PARTITIONS):
        values: list[bytes] = []
        while True:
            recs = c.read(TOPIC, p, len(values), 1000)
            if not recs:
                break
            assert [r.offset for r in recs] == list(range(len(values), len(values) + len(recs))), \
                f"offsets of partition {p} are not contiguous"
            values += [r.value for r in recs]
        out[p] = values
    return out


def verify(c: NodeClient, producers: list[Producer]) -> int:
    stored = read_all(c)
    where: dict[bytes, tuple[int, int]] = {}
    for p, values in stored.items():
        for off, v in enumerate(values):
            assert v not in where, f"{v!r} stored twice: at {where[v]} and {(p, off)}"
            where[v] = (p, off)
    sent = set().union(*(pr.sent for pr in producers))
    assert set(where) <= sent, f"records that were never sent: {sorted(set(where) - sent)[:5]}"
    acked = 0
    for pr in producers:
        for v, pos in pr.acked.items():
            assert where.get(v) == pos, f"acknowledged {v!r} at {pos}, found at {where.get(v)}"
            acked += 1
    return acked


def wait_until(what: str, cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # poll interval


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


def start_producers(node: LocalNode, batches: int = 60, batch: int = 50) -> list[Producer]:
    with node.client() as c:
        c.create_topic(TOPIC, partitions=PARTITIONS)
    prods = [Producer(node.endpoint, "a", batches, batch, 0),
             Producer(node.endpoint, "b", batches, batch, 1),
             Producer(node.endpoint, "c", batches, batch, None)]
    for p in prods:
        p.start()
    return prods


def finish(prods: list[Producer]) -> None:
    for p in prods:
        p.join(180)
        assert not p.is_alive(), "producer stuck"
        assert p.error is None, repr(p.error)


def kill_actor_under_load(make_node: Any, tmp_path: Path, role: str, kills: int = 2) -> None:
    node = make_node(CONFIG)
    prods = start_producers(node)
    for k in range(kills):
        target = (k + 1) * 15
        wait_until("progress", lambda t=target: min(p.done_batches for p in prods) >= t)
        pid = node.kill_actor(role)
        wait_until(f"{role} restart", restarted(node, role, pid))
    finish(prods)
    with node.client() as c:
        assert verify(c, prods) == 3 * 60 * 50
    # And after a clean restart, the same again (nothing lost in RocksDB or the log).
    node.stop()
    node2 = make_node(CONFIG, data_dir=tmp_path / "data")
    with node2.client() as c:
        assert verify(c, prods) == 3 * 60 * 50


def test_kill_log_manager_under_load(make_node: Any, tmp_path: Path) -> None:
    kill_actor_under_load(make_node, tmp_path, "log")


def test_kill_shard_writer_under_load(make_node: Any, tmp_path: Path) -> None:
    kill_actor_under_load(make_node, tmp_path, "writer-0")


def test_kill_cache_manager_under_load(make_node: Any, tmp_path: Path) -> None:
    kill_actor_under_load(make_node, tmp_path, "cache", kills=1)


def test_kill_front_door_under_load(make_node: Any, tmp_path: Path) -> None:
    kill_actor_under_load(make_node, tmp_path, "front", kills=1)


def test_kill_whole_node_under_load(make_node: Any, tmp_path: Path) -> None:
    node = make_node(CONFIG)
    prods = start_producers(node)
    for round_ in range(2):
        target = (round_ + 1) * 15
        wait_until("progress", lambda t=target: min(p.done_batches for p in prods) >= t)
        node.kill()
        node.start()  # same data dir and port; producers retry into the new node
    finish(prods)
    with node.client() as c:
        assert verify(c, prods) == 3 * 60 * 50


def test_retry_after_lost_ack_does_not_duplicate(make_node: Any, tmp_path: Path) -> None:
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


def test_writer_replays_log_after_kill(make_node: Any, tmp_path: Path) -> None:
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
