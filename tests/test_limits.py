"""Large requests and answers stay within the internal frame limit: they are split or capped,
never silently dropped."""

from __future__ import annotations

from typing import Any

import msgpack
import zmq

from wire.records import Record


def test_many_maximum_size_produces_at_once_all_succeed(make_node: Any) -> None:
    node = make_node()
    with node.client() as c:
        c.create_topic("big", partitions=2)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(node.endpoint)
    try:
        value = b"v" * (1024 * 1024 - 64)
        n = 6  # 6 x 15 MB in one burst: far over one internal frame if bundled whole
        for i in range(n):
            sock.send(msgpack.packb({"op": "produce", "id": i, "topic": "big", "partition": i % 2,
                                     "producer_id": 5, "seq": i,
                                     "records": msgpack.packb([value] * 15)}))
        replies = []
        for _ in range(n):
            assert sock.poll(60_000, zmq.POLLIN), "no reply: a request was dropped"
            replies.append(msgpack.unpackb(sock.recv()))
    finally:
        sock.close(0)
    assert all(r["ok"] for r in replies), [r.get("error") for r in replies if not r["ok"]]
    with node.client() as c:
        assert sum(len(c.read("big", p, 0, 10)) for p in range(2)) >= 2


def test_reads_are_capped_by_bytes(make_node: Any) -> None:
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
