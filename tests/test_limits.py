"""Large requests and answers stay within the internal frame limit: they are split or capped,
never silently dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack
import pytest
import zmq

from wire.protocol import unpack_replies
from wire.records import Record

if TYPE_CHECKING:
    from tests.conftest import MakeNode


def test_many_maximum_size_produces_at_once_all_succeed(make_node: MakeNode) -> None:
    node = make_node()
    with node.client() as c:
        c.create_topic("big", partitions=2)
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(node.endpoint)
    try:
        value = b"v" * (1024 * 1024 - 64)
        n = 6  # 6 x 15 MB in one burst: far over one internal frame if bundled whole
        for i in range(n):
            sock.send(msgpack.packb({"op": "produce", "id": i, "topic": "big", "partition": i % 2,
                                     "producer_id": 5, "seq": i,
                                     "records": msgpack.packb([value] * 15)}))
        replies: list[dict[str, Any]] = []
        while len(replies) < n:
            assert sock.poll(60_000, zmq.POLLIN), "no reply: a request was dropped"
            replies.extend(unpack_replies(sock.recv()))
    finally:
        sock.close(0)
    assert all(r["ok"] for r in replies), [r.get("error") for r in replies if not r["ok"]]
    with node.client() as c:
        assert sum(len(c.read("big", p, 0, 10)) for p in range(2)) >= 2


def test_reads_are_capped_by_bytes(make_node: MakeNode) -> None:
    node = make_node("[limits]\nread_bytes_max = 2097152\n")
    value = b"x" * 500_000
    with node.client() as c:
        c.create_topic("t")
        c.produce_batch("t", [Record(value, tags=("all",)) for _ in range(20)], partition=0)
        first = c.read("t", 0, 0, max_records=1000)  # from the cache
        assert 1 <= len(first) <= 5, len(first)
        got = list(first)
        while len(got) < 20:
            more = c.read("t", 0, len(got), max_records=1000)
            assert more, "a capped read must still make progress"
            got += more
        assert [r.offset for r in got] == list(range(20))
        tagged = c.read_by_tag("t", 0, "all")  # from the writer
        assert 1 <= len(tagged) <= 5, len(tagged)


@pytest.mark.parametrize("stalled", ["writers", "cache"])
def test_groups_for_a_stalled_receiver_are_bounded_in_bytes_and_read_back_from_the_log(
        make_node: MakeNode, stalled: str) -> None:
    """A writer (or the cache manager, and so every writer behind it) that stops taking
    groups gets no more than ``group_bytes_queued_max`` queued; the rest it reads from the
    log files once it goes on, though no group follows the ones it missed."""
    import os
    import signal
    import time

    queued_max = 1024 * 1024
    node = make_node(f"""
[limits]
frame_bytes_max = {queued_max}
value_bytes_max = 65536
group_bytes_queued_max = {queued_max}
[log]
group_bytes_max = {queued_max}
segment_bytes_max = {4 * queued_max}
[supervisor]
heartbeat_timeout_ms = 120000
""")

    def status() -> dict[str, Any]:
        with node.client() as c:
            return {a["role"]: a for a in c.status()["actors"]}

    def wait_for(what: str, cond: Any) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while not cond(st := status()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)  # ok-sleep: poll interval, under a deadline
        return st

    sender, prefix = ("cache", "writer-") if stalled == "writers" else ("log", "cache")
    stopped = [a["pid"] for role, a in status().items() if role.startswith(prefix)]
    values = [f"{i:05d}".encode() + b"v" * 1000 for i in range(3000)]  # ~3 MB
    with node.client() as c:
        c.create_topic("t", partitions=2)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            for start in range(0, len(values), 100):  # acknowledged: writers are off that path
                c.produce_batch("t", [Record(v, tags=("x",)) for v in values[start:start + 100]],
                                partition=(start // 100) % 2)
            # One log record per request: the topic, then each batch.
            last_lsn = 1 + len(values) // 100
            st = wait_for(f"the {sender} to report", lambda s: s[sender]["figures"].get(
                "groups_not_sent", 0) >= 1 and s["log"]["figures"]["last_lsn"] >= last_lsn)
            figures = st[sender]["figures"]
            queued = figures["writer_queued_bytes" if sender == "cache" else "cache_queued_bytes"]
            assert queued <= len(stopped) * (queued_max + 200_000)
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        st = wait_for("the writers to catch up from the log", lambda s: all(
            s[w]["figures"]["processed_lsn"] >= last_lsn for w in s if w.startswith("writer-")))
        assert all(st[w]["figures"]["replayed_bytes"] > 0 for w in st if w.startswith("writer-"))
        got: list[bytes] = []
        for p in range(2):  # read_by_tag is served by the writers' stores, not the cache
            offset = 0
            while recs := c.read_by_tag("t", p, "x", offset=offset):
                got += [r.value for r in recs]
                last = recs[-1].offset
                assert last is not None  # records read back carry their offset
                offset = last + 1
        assert sorted(got) == values
