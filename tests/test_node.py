"""End to end: a real node (supervisor + actor processes) on tmp_path, driven by the client."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import zmq

from actors.roles import key_partition
from node.client import NodeClient, Record
from node.local import LocalNode
from node.pipeline import Pipeline
from tests.conftest import request_of, silent_router
from wire.errors import NodeError, RequestTimeout, TopicExists, UnknownPartition, UnknownTopic
from wire.protocol import unpack_replies

if TYPE_CHECKING:
    from tests.conftest import MakeNode


def test_topics_create_list_delete(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("alpha", partitions=3)
        c.create_topic("beta")
        assert [(t.name, t.partitions) for t in c.list_topics()] == [("alpha", 3), ("beta", 1)]
        with pytest.raises(TopicExists):
            c.create_topic("alpha")
        c.delete_topic("alpha")
        assert [t.name for t in c.list_topics()] == ["beta"]
        with pytest.raises(UnknownTopic):
            c.produce("alpha", b"x")
        with pytest.raises(UnknownTopic):
            c.delete_topic("alpha")


def test_recreated_topic_starts_empty(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t")
        c.produce_batch("t", [b"a", b"b"])
        c.delete_topic("t")
        c.create_topic("t")
        assert c.read("t", 0, 0) == []
        assert c.produce("t", b"c") == (0, 0)


def test_produce_then_read_in_offset_order(node: LocalNode) -> None:
    values = [f"value-{i}".encode() for i in range(2500)]
    with node.client() as c:
        c.create_topic("t", partitions=1)
        got = []
        for i in range(0, len(values), 1000):
            got += c.produce_batch("t", values[i:i + 1000])
        assert got == [(0, i) for i in range(len(values))]
        read: list[Record] = []
        while len(read) < len(values):
            batch = c.read("t", 0, len(read), max_records=700)
            assert batch, "read returned nothing before the end"
            read += batch
        assert [r.value for r in read] == values
        assert [r.offset for r in read] == list(range(len(values)))
        assert c.read("t", 0, len(values)) == []


def test_partition_choice_by_key_hash_and_round_robin(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t", partitions=4)
        keys = [f"user-{i}".encode() for i in range(40)]
        for k in keys:
            p, _off = c.produce("t", b"v", key=k)
            assert p == zlib.crc32(k) % 4 == c.key_partition("t", k)
        keyless = {c.produce("t", b"v")[0] for _ in range(8)}
        assert keyless == {0, 1, 2, 3}
        # A keyed batch without a partition is split by key, offsets given in record order.
        recs = [Record(f"v{i}".encode(), key=keys[i]) for i in range(40)]
        pairs = c.produce_batch("t", recs)
        assert [p for p, _ in pairs] == [zlib.crc32(k) % 4 for k in keys]
        for (p, off), rec in zip(pairs, recs, strict=False):
            assert c.read("t", p, off, 1)[0].value == rec.value
        assert c.produce_batch("t", [b"x", b"y"], partition=2)[0][0] == 2


def test_read_by_key_tag_and_timestamp(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t", partitions=2)
        base = 1_700_000_000_000
        recs = [Record(f"v{i}".encode(), key=f"k{i % 5}".encode(),
                       tags=("even",) if i % 2 == 0 else ("odd", "x"),
                       timestamp=base + i * 10) for i in range(50)]
        pairs = c.produce_batch("t", recs, partition=1)
        latest = c.read_by_key("t", "k3", partition=1)
        assert latest is not None and latest.value == b"v48" and latest.offset == pairs[48][1]
        assert c.read_by_key("t", "nope", partition=1) is None
        odd = c.read_by_tag("t", 1, "odd")
        assert [r.value for r in odd] == [f"v{i}".encode() for i in range(1, 50, 2)]
        assert [r.value for r in c.read_by_tag("t", 1, "even", offset=40)] == \
            [b"v40", b"v42", b"v44", b"v46", b"v48"]
        assert c.offset_for_timestamp("t", 1, base + 205) == 21
        assert c.offset_for_timestamp("t", 1, base) == 0
        assert c.offset_for_timestamp("t", 1, base + 10_000) is None
        rec = c.read("t", 1, 7, 1)[0]
        assert (rec.key, rec.tags, rec.timestamp) == (b"k2", ("odd", "x"), base + 70)


def test_timestamp_defaults_to_append_time(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t")
        before = int(time.time() * 1000)
        c.produce("t", b"now")
        after = int(time.time() * 1000)
        ts = c.read("t", 0, 0)[0].timestamp
        assert ts is not None and before - 5 <= ts <= after + 5


def test_read_by_key_without_partition_uses_key_routing(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t", partitions=3)
        for i in range(3):
            c.produce("t", f"v{i}", key="same")
        rec = c.read_by_key("t", "same")
        assert rec is not None and rec.value == b"v2"


def test_consumer_group_offsets(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t", partitions=2)
        c.produce_batch("t", [b"a", b"b", b"c"], partition=1)
        assert c.committed_offset("g1", "t", 1) is None
        c.commit_offset("g1", "t", 1, 2)
        c.commit_offset("g2", "t", 1, 1)
        assert c.committed_offset("g1", "t", 1) == 2
        assert c.committed_offset("g2", "t", 1) == 1
        assert c.committed_offset("g1", "t", 0) is None
        with pytest.raises(UnknownPartition):
            c.commit_offset("g1", "t", 5, 0)


def test_reads_see_every_acknowledged_write_at_once(node: LocalNode) -> None:
    """A read right after an ack must see the record, through the cache or a writer."""
    with node.client() as c:
        c.create_topic("t", partitions=2)
        for i in range(200):
            p, off = c.produce("t", f"v{i}", key=f"k{i}", tags=["t"])
            assert c.read("t", p, off, 1)[0].value == f"v{i}".encode()
            rec = c.read_by_key("t", f"k{i}", partition=p)
            assert rec is not None and rec.offset == off


def test_end_offsets_count_what_is_durable_and_reads_below_them_see_it(node: LocalNode) -> None:
    """Another client's end offsets: every record below them can be read at once, committed
    transactions count, staged ones do not."""
    with node.client() as writer, node.client() as reader:
        writer.create_topic("t", partitions=3)
        assert reader.end_offsets("t") == [0, 0, 0]
        tx = writer.transaction()
        tx.produce_batch("t", [b"staged"] * 4, partition=0)
        tx.settle()
        pipe = writer.pipeline()
        for i in range(60):
            pipe.submit("t", [f"v{i}".encode()], partition=i % 3)
        pipe.flush()
        ends = reader.end_offsets("t")  # asked while the produces are in flight
        assert all(0 <= e <= 20 for e in ends), ends
        for p, end in enumerate(ends):
            got = reader.read("t", p, 0, max_records=100)
            assert [r.offset for r in got][:end] == list(range(end))
        answered = 0
        while answered < 60:
            answered += len(pipe.poll(5000))
        assert reader.end_offsets("t") == [20, 20, 20]
        tx.commit()
        assert reader.end_offsets("t") == [24, 20, 20]
        assert len(reader.read("t", 0, 20, max_records=100)) == 4
        with pytest.raises(UnknownTopic):
            reader.end_offsets("nope")


def test_a_request_given_up_while_the_node_was_down_is_not_run_once_it_is_back(
        make_node: MakeNode) -> None:
    """A call that raised RequestTimeout while the node was down must not land later: its
    requests were queued by ZeroMQ and delivered once the node was back (topics created,
    namespaces dropped, minutes after the call gave up)."""
    n = make_node()
    with NodeClient(n.endpoint, timeout_ms=300, retries=1) as c:
        assert c.list_topics() == []  # connected
        assert n.stop() == 0
        with pytest.raises(RequestTimeout, match="not connected"):
            c.create_topic("ghost")
        n.start()
        c.timeout_ms = 10_000
        assert c.list_topics() == []
        c.create_topic("real")
        assert [t.name for t in c.list_topics()] == ["real"]


def test_reads_and_deletes_by_key_find_the_keys_partition_after_the_topic_is_made_again(
        node: LocalNode) -> None:
    """A client counted the topic's partitions; another deletes it and makes it again with
    more. read_by_key looked in the partition of the old count (None), and delete_by_key
    deleted nothing and answered an LSN: the node now finds the key's own partition."""
    with node.client() as old, node.client() as other:
        old.create_topic("again", partitions=1)
        assert old.partitions("again") == 1
        other.delete_topic("again")
        other.create_topic("again", partitions=4)
        keys = [f"k{i}" for i in range(8)]
        for k in keys:
            other.produce("again", k.encode(), key=k)
        assert {key_partition(k.encode(), 4) for k in keys} != {0}, "some key off partition 0"
        for k in keys:
            got = old.read_by_key("again", k)
            assert got is not None and got.value == k.encode(), k
            old.delete_by_key("again", k)
            assert other.read_by_key("again", k) is None, k


def test_data_survives_clean_restart(make_node: MakeNode, tmp_path: Path) -> None:
    n = make_node()
    with n.client() as c:
        c.create_topic("t", partitions=2)
        pairs = c.produce_batch("t", [Record(f"v{i}".encode(), key=b"k") for i in range(300)],
                                partition=0)
        c.commit_offset("g", "t", 0, 120)
    assert n.stop() == 0
    n2 = make_node(data_dir=tmp_path / "data")
    with n2.client() as c:
        assert [(t.name, t.partitions) for t in c.list_topics()] == [("t", 2)]
        assert [r.value for r in c.read("t", 0, 0, 1000)] == [f"v{i}".encode() for i in range(300)]
        assert c.committed_offset("g", "t", 0) == 120
        assert c.produce("t", b"next", partition=0) == (0, pairs[-1][1] + 1)
        st = c.status()
    writers = [a for a in st["actors"] if a["role"].startswith("writer")]
    assert sum(a["figures"].get("replayed_bytes", 0) for a in writers) == 0, \
        "a clean stop leaves nothing to replay"


def test_status_lists_every_actor(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t")
        c.produce_batch("t", [b"x"] * 10)
        st = c.status()
    roles = [a["role"] for a in st["actors"]]
    assert roles == ["log", "txn", "cache", "writer-0", "writer-1", "front"]
    for a in st["actors"]:
        assert a["state"] == "running" and a["pid"] > 0 and a["rss_bytes"] > 0
        assert a["restarts"] == 0
    assert st["log"]["last_lsn"] >= 0


def _cli(node: LocalNode, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "node", *args, "--port", str(node.port)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cli_produce_consume_status(node: LocalNode) -> None:
    _cli(node, "create-topic", "cli", "--partitions", "2")
    out = _cli(node, "produce", "cli", "hello", "world", "--partition", "1", "--tag", "greet")
    assert out.splitlines() == ["cli/1@0 hello", "cli/1@1 world"]
    _cli(node, "produce", "cli", "keyed", "--key", "k")
    lines = _cli(node, "consume", "cli", "--partition", "1").splitlines()
    assert [ln.split()[-1] for ln in lines[:2]] == ["hello", "world"]
    assert "tags=greet" in lines[0]
    assert [ln.split()[0] for ln in _cli(node, "consume", "cli", "--partition", "1",
                                        "--from", "1").splitlines()][:1] == ["1"]
    status = _cli(node, "status")
    for word in ("log", "cache", "writer-0", "front", "fsyncs/s", "RSS",
                 "queued for the writers MB", "groups read back from the log"):
        assert word in status
    assert re.search(r"log manager \(figures \d+\.\d s old\)", status), status
    assert "cli" in _cli(node, "topics")


def test_cli_offsets_shows_end_offsets_and_each_groups_lag(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("t", partitions=2)
        c.produce_batch("t", [b"x"] * 7, partition=0)
        c.produce_batch("t", [b"y"] * 3, partition=1)
        c.commit_offset("readers", "t", 0, 5)
    rows = [ln.split("│")[1:-1] for ln in _cli(node, "offsets", "t", "--group", "readers")
            .splitlines() if ln.startswith("│") and ln.split("│")[1].strip().isdigit()]
    assert [[cell.strip() for cell in row] for row in rows] == [["0", "7", "5", "2"],
                                                                 ["1", "3", "-", "3"]]


def test_cli_reports_errors_cleanly(node: LocalNode) -> None:
    out = subprocess.run([sys.executable, "-m", "node", "produce", "missing", "x",
                          "--port", str(node.port)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "UNKNOWN_TOPIC" in out.stderr and "Traceback" not in out.stderr


def test_second_node_on_same_data_dir_is_refused(node: LocalNode, tmp_path: Path) -> None:
    other = LocalNode(node.data_dir, log_file=tmp_path / "other.log")
    with pytest.raises(Exception, match="another node is using"):
        other.start(timeout_s=30)
    assert other.proc is not None and other.proc.returncode == 1


def test_cli_consume_follow_prints_records_as_they_arrive(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("live")
        c.produce("live", b"before", partition=0)
    follower = subprocess.Popen([sys.executable, "-m", "node", "consume", "live", "--follow",
                                 "--poll-ms", "50", "--port", str(node.port)],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline().split()[-1] == "before"
        with node.client() as c:
            for i in range(3):
                c.produce("live", f"after-{i}", partition=0)
                line = follower.stdout.readline()  # blocks until --follow prints it
                assert line.split()[0] == str(i + 1) and line.split()[-1] == f"after-{i}"
        assert follower.poll() is None, "--follow must keep running"
    finally:
        follower.kill()
        follower.wait(10)


def test_a_pipeline_answers_out_of_order_and_bounds_what_is_in_flight(node: LocalNode) -> None:
    from wire.errors import Busy

    with node.client() as c:
        c.create_topic("p", partitions=2)
        pipe = c.pipeline(in_flight_max=8)
        sent = {pipe.submit("p", [f"v{i}".encode()], partition=i % 2): i for i in range(8)}
        with pytest.raises(Busy, match="in flight"):
            pipe.submit("p", [b"one too many"], partition=0)
        answers: dict[int, list[tuple[int, int]] | NodeError] = {}
        deadline = time.monotonic() + 30
        while len(answers) < 8:
            assert time.monotonic() < deadline, "answers never came"
            answers.update(pipe.poll(1000))
        assert set(answers) == set(sent)
        errors = [out for out in answers.values() if isinstance(out, NodeError)]
        assert not errors, errors
        offsets = sorted((out[0][0], out[0][1]) for out in answers.values()
                         if not isinstance(out, NodeError))
        assert offsets == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
        pipe.submit("p", [b"room again"], partition=0)  # answered ones free their places
        pipe.submit("p", [b"bad"], partition=7)
        late: list[tuple[int, list[tuple[int, int]] | NodeError]] = []
        while len(late) < 2:
            assert time.monotonic() < deadline, "answers never came"
            late += pipe.poll(1000, offsets=False)  # successes without their offsets
        assert sorted(type(out).__name__ for _rid, out in late) == ["UnknownPartition", "list"]
        assert [out for _rid, out in late if isinstance(out, list)] == [[]]
        for bad in (0, 1025):
            with pytest.raises(ValueError, match=r"1\.\.1024"):
                c.pipeline(in_flight_max=bad)


# ---- a pipeline's requests are answered within the client's timeout -----------------------


PipelineAnswers = list[tuple[int, list[tuple[int, int]] | NodeError]]


def first_answers(pipe: Pipeline, sent: float, wait_s: float, poll_ms: int = 100
                  ) -> tuple[PipelineAnswers, float]:
    """What ``pipe.poll`` first returns, polling from ``sent`` on for at most ``wait_s``,
    and how long after ``sent`` it came."""
    got: PipelineAnswers = []
    while not got:
        assert time.monotonic() - sent < wait_s, f"no answer, nor a give-up, in {wait_s} s"
        got = pipe.poll(poll_ms)
    return got, time.monotonic() - sent


def produced(rid: int, partition: int = 0) -> bytes:
    """A produce request's answer: one record, at offset 0 of ``partition``."""
    from wire.packer import pack

    return pack({"id": rid, "ok": True, "lsn": 1, "parts": [[partition, 0, 1]]})


def test_a_pipeline_gives_up_a_request_unanswered_within_its_timeout_and_drops_the_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that took a request and lost it (its front door restarted): the pipeline's
    poll answers it ``RequestTimeout`` once the client's ``timeout_ms`` is up, having probed
    the handshake once (not on every poll), and the answer coming after that is dropped. It
    used to stay in flight, unanswered, for good."""
    timeout_ms = 1500
    router, endpoint = silent_router()
    try:
        with NodeClient(endpoint, timeout_ms=timeout_ms) as c:
            probes: list[str] = []
            real_probe = c.probe

            def counted(sock: zmq.Socket[bytes]) -> str:
                probes.append(real_probe(sock))
                return probes[-1]

            monkeypatch.setattr(c, "probe", counted)
            pipe = c.pipeline()
            rid = pipe.submit("t", [b"v"], partition=0)
            sent = time.monotonic()
            pipe.flush()
            peer, request = request_of(router)
            assert request["id"] == rid
            got, waited_s = first_answers(pipe, sent, timeout_ms / 1000 + 10)
            ((answered, error),) = got
            assert answered == rid and isinstance(error, RequestTimeout), got
            assert timeout_ms / 1000 <= waited_s < timeout_ms / 1000 + 2, waited_s
            assert f"no reply from {endpoint} within {timeout_ms} ms" in error.message
            assert "again under its sequence number is safe" in error.message
            assert probes == [""]  # once; the handshake succeeded: no note
            assert rid not in c._waiters and not pipe.in_flight
            seen: list[int] = []  # what reached the client and was nobody's
            real_hand_over = c.hand_over

            def recorded(reply: dict[str, Any]) -> None:
                seen.append(reply["id"])
                real_hand_over(reply)

            monkeypatch.setattr(c, "hand_over", recorded)
            router.send_multipart([peer, produced(rid)])  # the late answer
            deadline = time.monotonic() + 10
            while rid not in seen:
                assert time.monotonic() < deadline, "the late answer never reached the client"
                assert pipe.poll(100) == []
            assert pipe.poll(0) == []
    finally:
        router.close(0)


class _InterruptedOnce:
    """A client socket whose first send is cut short (as Ctrl-C during a send that waits
    for a connection would)."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.sock, self.armed = sock, True

    def send(self, *args: Any, **kw: Any) -> Any:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return self.sock.send(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_a_pipeline_goes_on_after_a_send_cut_short_and_past_a_frame_that_is_not_replies(
        ) -> None:
    """A send an exception cut short leaves its requests in flight, unsent: they are given
    up in time like any other (every later poll raised IndexError, the pipeline broken for
    good). A frame that is not replies is dropped, and the answers read before it in the
    same poll are kept (they were lost with it, never answered nor given up)."""
    router, endpoint = silent_router()
    with NodeClient(endpoint, timeout_ms=500, retries=0) as c:
        real = c.sock
        c.sock = _InterruptedOnce(real)  # type: ignore[assignment]
        pipe = c.pipeline()
        cut = pipe.submit("t", [b"v"], partition=0)
        with pytest.raises(KeyboardInterrupt):
            pipe.poll(10)
        deadline = time.monotonic() + 5
        got, _waited_s = first_answers(pipe, time.monotonic(), 5)
        assert [(rid, type(out)) for rid, out in got] == [(cut, RequestTimeout)]

        first, second = (pipe.submit("t", [b"v"], partition=0) for _ in range(2))
        pipe.flush()
        assert router.poll(5000, zmq.POLLIN)
        peer, frame = router.recv_multipart()  # the two in one frame; none sent before them
        assert [r["id"] for r in unpack_replies(frame)] == [first, second]
        router.send_multipart([peer, produced(first)])
        router.send_multipart([peer, b"\x05"])  # a msgpack int, not a reply map
        router.send_multipart([peer, produced(second)])
        answered: dict[int, Any] = {}
        while len(answered) < 2:
            assert time.monotonic() < deadline + 5, f"answers lost: {answered}"
            answered.update(pipe.poll(100))
        assert answered == {first: [(0, 0)], second: [(0, 0)]}
        c.sock = real
    router.close()


def test_a_routed_pipeline_names_the_member_that_did_not_answer() -> None:
    """On a client of a cluster each request's time runs on its own member's socket: the one
    member that answers is heard, the other's request is given up in its name."""

    routers = [silent_router(), silent_router()]
    endpoints = [e for _r, e in routers]
    try:
        with NodeClient(endpoints, timeout_ms=1000) as c:
            c._members = {1: endpoints[0], 2: endpoints[1]}  # the map, as if learned
            c._owners = {"t": (1, 2)}
            pipe = c.pipeline()
            kept, lost = (pipe.submit("t", [b"v"], partition=p) for p in (0, 1))
            pipe.flush()
            peer, request = request_of(routers[0][0])
            assert request["id"] == kept
            routers[0][0].send_multipart([peer, produced(kept)])
            assert request_of(routers[1][0])[1]["id"] == lost  # and never answered
            got: dict[int, list[tuple[int, int]] | NodeError] = {}
            deadline = time.monotonic() + 10
            while len(got) < 2:
                assert time.monotonic() < deadline, f"answered only {got}"
                got.update(pipe.poll(100))
            assert got[kept] == [(0, 0)]
            error = got[lost]
            assert isinstance(error, RequestTimeout), error
            assert f"no reply from node 2 ({endpoints[1]}) within 1000 ms" in error.message
            assert not pipe.in_flight and not pipe.routes
    finally:
        for router, _e in routers:
            router.close(0)


def test_a_pipeline_to_a_node_killed_with_its_request_says_so_within_its_timeout(
        node: LocalNode) -> None:
    """The node takes the request (the kernel does: the node is stopped) and is killed
    before it reads it: the poll answers ``RequestTimeout`` about the client's
    ``timeout_ms`` after the send, saying what the probe of the handshake found."""
    import os
    import signal

    from node.handshake import HandshakeFailed

    timeout_ms = 1500
    with node.client(timeout_ms=timeout_ms) as c:
        c.create_topic("lost")
        pipe = c.pipeline()
        assert node.proc is not None
        os.killpg(node.proc.pid, signal.SIGSTOP)  # connected, and reading nothing
        try:
            rid = pipe.submit("lost", [b"v"], partition=0)
            sent = time.monotonic()
            pipe.flush()
            assert not pipe.unsent  # sent: on the connection made before
        finally:
            node.kill()
        got, waited_s = first_answers(pipe, sent, timeout_ms / 1000 + 10, poll_ms=200)
        ((answered, error),) = got
        assert answered == rid, got
        assert isinstance(error, RequestTimeout) and not isinstance(error, HandshakeFailed)
        assert timeout_ms / 1000 <= waited_s < timeout_ms / 1000 + 3, waited_s
        assert "nothing accepted a connection there" in error.message, error.message
        assert pipe.poll(300) == [] and not pipe.in_flight and rid not in c._waiters


def test_a_pipeline_request_a_down_node_cannot_take_is_answered_and_never_sent(
        make_node: MakeNode) -> None:
    """The node stops: a pipeline's request is answered RequestTimeout (not connected) by the
    next poll, and is never sent, not even once the node is back (ZeroMQ kept it, and sent
    it then); requests after it go in order; ``close`` drops what was queued and never
    sent (a poll after it sent them)."""
    n = make_node()
    with NodeClient(n.endpoint, timeout_ms=5000, retries=0) as c:
        c.create_topic("p")
        pipe = c.pipeline()
        assert n.stop() == 0
        given_up = pipe.submit("p", [b"given-up"], partition=0)
        got, _waited_s = first_answers(pipe, time.monotonic(), 10)
        assert [(rid, type(out)) for rid, out in got] == [(given_up, RequestTimeout)]
        assert "not connected" in str(got[0][1])
        n.start()
        first, second = (pipe.submit("p", [v], partition=0) for v in (b"first", b"second"))
        answered: dict[int, Any] = {}
        deadline = time.monotonic() + 30
        while len(answered) < 2:
            assert time.monotonic() < deadline, answered
            answered.update(pipe.poll(200))
        assert answered == {first: [(0, 0)], second: [(0, 1)]}
        pipe.submit("p", [b"closed"], partition=0)  # queued, not sent
        pipe.close()
        assert pipe.poll(100) == []
        assert [r.value for r in c.read("p", 0, 0, 10)] == [b"first", b"second"]


def test_a_client_used_by_two_threads_at_once_says_so() -> None:
    """A client is one thread's: a second thread's call while the first waits for its answer
    raises at once, naming the cause (they took each other's answers, and timed out saying
    'is a node running there?'). One after the other, threads may share it."""
    import threading

    router, endpoint = silent_router()
    try:
        with NodeClient(endpoint, timeout_ms=3000, retries=0) as c:
            failures: list[BaseException] = []

            def waits() -> None:
                try:
                    c.call("status")
                except RequestTimeout:
                    pass
                except BaseException as exc:  # reported by the test
                    failures.append(exc)

            first = threading.Thread(target=waits)
            first.start()
            request_of(router)  # the first thread's call is under way
            with pytest.raises(RuntimeError, match="in use by another thread"):
                c.call("status")
            first.join()
            assert failures == []
            second = threading.Thread(target=waits)  # the first is done: no error
            second.start()
            request_of(router)
            second.join()
            assert failures == []
            pipe = c.pipeline()  # a pipeline's poll, too: it reads the same socket
            pipe.submit("t", [b"v"], partition=0)
            polling = threading.Thread(target=lambda: pipe.poll(2000))
            polling.start()
            request_of(router)
            with pytest.raises(RuntimeError, match="in use by another thread"):
                c.call("status")
            polling.join()
    finally:
        router.close(0)


def test_a_request_over_twice_the_frame_limit_is_sent_once_and_its_timeout_says_why() -> None:
    """A node drops a frame over twice its frame_bytes_max unanswered: sent again after each
    timeout, a 33 MiB value held its caller for retries x timeout (a minute by default)."""
    from wire.protocol import NODE_FRAME_BYTES_MAX_DEFAULT

    router, endpoint = silent_router()
    try:
        with NodeClient(endpoint, timeout_ms=1000, retries=5) as c:
            started = time.monotonic()
            with pytest.raises(RequestTimeout, match="over twice the node's") as info:
                c.produce("t", b"x" * (2 * NODE_FRAME_BYTES_MAX_DEFAULT + 1), partition=0)
            # One attempt of 1 s, not 6 (6 s and more).
            assert time.monotonic() - started < 4.5, "sent again after its timeout"
            assert "to 1 attempt(s)" in info.value.message
    finally:
        router.close(0)


def test_a_single_node_that_does_not_answer_is_not_called_a_cluster() -> None:
    from node.local import free_port
    from wire.errors import Unavailable

    endpoint = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with NodeClient(endpoint, timeout_ms=200, retries=0) as c, \
            pytest.raises(Unavailable) as info:
        c.members()  # what the Spark source asks first
    assert "cluster" not in info.value.message
    assert endpoint in info.value.message


def test_a_timeout_says_what_the_handshake_with_the_port_showed() -> None:
    """Nothing listening, and something listening that is not a node, are told apart in the
    timeout's message (a probe of the handshake, node/handshake.py)."""
    import socket
    import threading

    from node.local import free_port

    nothing = f"tcp://127.0.0.1:{free_port()}"
    with NodeClient(nothing, timeout_ms=300, retries=0) as c, \
            pytest.raises(RequestTimeout, match="nothing accepted a connection"):
        c.list_topics()
    with socket.socket() as listener:  # a port where something else answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def answer_like_a_web_server() -> None:
            with listener.accept()[0] as conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                conn.recv(64)  # until the client goes away

        threading.Thread(target=answer_like_a_web_server, daemon=True).start()
        other = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        with NodeClient(other, timeout_ms=300, retries=0) as c, \
                pytest.raises(RequestTimeout, match="is a shardnode node listening there"):
            c.list_topics()


def test_a_call_probes_the_handshake_once_whatever_its_retries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A port that takes connections and never speaks (a frozen process, or not a node):
    the call's retries take the first probe's verdict, and each probe watches no longer
    than the client's timeout (a probe per attempt, of up to 2 s each, made a call of
    four 200 ms attempts take 9 s)."""
    import socket

    import node.client
    from node import handshake

    probes: list[int] = []
    real = handshake.probe

    def counted(*args: Any, **kw: Any) -> Any:
        probes.append(kw["timeout_ms"])
        return real(*args, **kw)

    monkeypatch.setattr(node.client, "probe", counted)
    with socket.socket() as listener:  # the kernel accepts; nobody reads or writes
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        endpoint = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        with NodeClient(endpoint, timeout_ms=200, retries=3) as c, \
                pytest.raises(RequestTimeout, match="no ZeroMQ handshake completed"):
            c.list_topics()
    assert probes == [200]
