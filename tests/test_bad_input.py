"""Every kind of malformed or invalid request gets an error code and message, and the node
keeps serving. Requests are sent on a raw DEALER socket, as a buggy client would."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from node.client import NodeClient
from node.local import LocalNode
from tests.conftest import module_node
from wire.errors import BadRequest, ErrorCode
from wire.protocol import unpack_replies

FRAME_MAX = 2 * 1024 * 1024
CONFIG = f"""
[limits]
frame_bytes_max = {FRAME_MAX}
batch_records_max = 100
value_bytes_max = 1000
"""


@pytest.fixture(scope="module")
def small_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    with module_node(tmp_path_factory, "bad", CONFIG) as n:
        with n.client() as c:
            c.create_topic("t", partitions=2)
        yield n


@pytest.fixture
def sock(small_node: LocalNode) -> Iterator[zmq.Socket[bytes]]:
    s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(small_node.endpoint)
    yield s
    s.close(0)


def ask(sock: zmq.Socket[bytes], *frames: bytes) -> dict[str, Any]:
    sock.send_multipart(list(frames))
    assert sock.poll(10_000, zmq.POLLIN), "no reply within 10 s"
    reply: dict[str, Any] = msgpack.unpackb(sock.recv(), raw=False)
    return reply


def req(**fields: Any) -> bytes:
    return bytes(msgpack.packb(fields, use_bin_type=True))


_SEQ = itertools.count(1)


def good_produce(rid: int = 99) -> bytes:
    return req(op="produce", id=rid, topic="t", partition=0, producer_id=1, seq=next(_SEQ),
               records=msgpack.packb([b"ok"]))


def assert_error(reply: dict[str, Any], code: ErrorCode, *words: str) -> None:
    assert reply["ok"] is False, reply
    assert reply["code"] == code, (ErrorCode(reply["code"]).name, reply["error"])
    for w in words:
        assert w in reply["error"], reply["error"]


def assert_still_serving(sock: zmq.Socket[bytes], rid: int) -> None:
    reply = ask(sock, good_produce(rid))
    assert reply["ok"] is True and reply["id"] == rid, reply


BATCH = msgpack.packb


@pytest.mark.parametrize("frame, code, words", [
    (b"\xc1 not msgpack", ErrorCode.BAD_REQUEST, ["not msgpack"]),
    (msgpack.packb([1, 2, 3]), ErrorCode.BAD_REQUEST, ["map"]),
    (req(op="list_topics"), ErrorCode.BAD_REQUEST, ["'id'"]),
    (req(op="frobnicate", id=1), ErrorCode.UNKNOWN_OP, ["frobnicate"]),
    (req(op=7, id=1), ErrorCode.UNKNOWN_OP, []),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1), ErrorCode.BAD_REQUEST,
     ["missing field 'records'"]),
    (req(op="produce", id=1, topic=5, producer_id=1, seq=1, records=BATCH([b"x"])),
     ErrorCode.BAD_REQUEST, ["'topic'", "str"]),
    (req(op="read", id=1, topic="t", partition="0", offset=0, max_records=1),
     ErrorCode.BAD_REQUEST, ["'partition'"]),
    (req(op="read", id=1, topic="t", partition=0, offset=-1, max_records=1),
     ErrorCode.BAD_REQUEST, ["'offset'", "range"]),
    (req(op="read", id=1, topic="t", partition=0, offset=0, max_records=1, extra=1),
     ErrorCode.BAD_REQUEST, ["extra"]),
    (req(op="read", id=1, topic="nope", partition=0, offset=0, max_records=1),
     ErrorCode.UNKNOWN_TOPIC, ["nope"]),
    (req(op="read", id=1, topic="t", partition=2, offset=0, max_records=1),
     ErrorCode.UNKNOWN_PARTITION, ["partitions 0..1"]),
    (req(op="produce", id=1, topic="t", partition=9, producer_id=1, seq=1, records=BATCH([b"x"])),
     ErrorCode.UNKNOWN_PARTITION, []),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1, records=BATCH([])),
     ErrorCode.EMPTY_BATCH, []),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1, records=b"\xc1"),
     ErrorCode.BAD_REQUEST, ["records are not msgpack"]),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1, records=BATCH([b"x"] * 101)),
     ErrorCode.BATCH_TOO_LARGE, ["100"]),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1, records=BATCH([b"x" * 1001])),
     ErrorCode.BAD_REQUEST, ["1001 bytes"]),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1, records=BATCH([[b"v", 5, [], None]])),
     ErrorCode.BAD_REQUEST, ["key"]),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1, records=BATCH([[b"v", None, [1], None]])),
     ErrorCode.BAD_REQUEST, ["tags"]),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1, records=BATCH({"a": 1})),
     ErrorCode.BAD_REQUEST, ["array"]),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1,
         records=BATCH([[b"v", None, ["x" * 70_000], None]])), ErrorCode.BAD_REQUEST, ["tags"]),
    (req(op="produce", id=1, topic="t", producer_id=1, seq=1,
         records=BATCH([[b"v", b"k" * 5000, [], None]])), ErrorCode.BAD_REQUEST, ["key"]),
    (req(op="read_by_tag", id=1, topic="t", partition=0, tag="x" * 70_000, offset=0,
         max_records=1), ErrorCode.BAD_REQUEST, ["'tag'", "longer"]),
    (msgpack.packb({"op": "list_topics", "id": 1, 1: 0, "z": 0}), ErrorCode.BAD_REQUEST,
     ["unknown fields"]),
    (req(op="create_topic", id=1, name="bad name!", partitions=1), ErrorCode.INVALID_NAME, []),
    (req(op="create_topic", id=1, name="ok", partitions=0), ErrorCode.BAD_REQUEST, ["partitions"]),
    (req(op="create_topic", id=1, name="t", partitions=1), ErrorCode.TOPIC_EXISTS, []),
    (req(op="commit_offset", id=1, group="g", topic="t", partition=0, offset=10**6),
     ErrorCode.BAD_REQUEST, ["past the end"]),
])
def test_bad_request_gets_error_and_node_keeps_serving(
        sock: zmq.Socket[bytes], frame: bytes, code: ErrorCode, words: list[str]) -> None:
    assert_error(ask(sock, frame), code, *words)
    assert_still_serving(sock, 1000 + next(_SEQ))


def test_error_reply_carries_request_id(sock: zmq.Socket[bytes]) -> None:
    reply = ask(sock, req(op="read", id=4242, topic="nope", partition=0, offset=0, max_records=1))
    assert reply["id"] == 4242


def test_two_frames_in_one_request(sock: zmq.Socket[bytes]) -> None:
    assert_error(ask(sock, good_produce(5), b"extra"), ErrorCode.BAD_REQUEST, "one frame")
    assert_still_serving(sock, 6)


def test_frame_over_the_limit(sock: zmq.Socket[bytes]) -> None:
    big = req(op="produce", id=1, topic="t", producer_id=1, seq=1,
              records=msgpack.packb([b"x" * 900] * 2400))
    assert FRAME_MAX < len(big) < 2 * FRAME_MAX
    assert_error(ask(sock, big), ErrorCode.FRAME_TOO_LARGE, str(FRAME_MAX))
    assert_still_serving(sock, 7)


def test_each_request_of_a_frame_over_the_limit_is_answered_under_its_own_id(
        small_node: LocalNode, sock: zmq.Socket[bytes]) -> None:
    """The frame is not decoded, but its requests' ids are read (their other values
    skipped): a client waiting for its id heard an answer under id 0, which was not its,
    and sent its request again until its retries ran out (a minute, then "is a node
    running there?")."""
    big = req(records=b"x" * FRAME_MAX, op="produce", id=31, topic="t", producer_id=1, seq=1)
    sock.send(big + good_produce(32))
    replies: list[dict[str, Any]] = []
    while len(replies) < 2:
        assert sock.poll(10_000, zmq.POLLIN), "no reply within 10 s"
        replies += unpack_replies(sock.recv())
    assert [(r["id"], r["code"]) for r in replies] == [(31, ErrorCode.FRAME_TOO_LARGE),
                                                      (32, ErrorCode.FRAME_TOO_LARGE)]
    assert f"frame_bytes_max = {FRAME_MAX}" in replies[0]["error"]
    assert_still_serving(sock, 33)
    with small_node.client() as c:  # raised at once, not sent again until the retries end
        started = time.monotonic()
        with pytest.raises(BadRequest) as raised:
            c.produce_batch("t", [b"v" * 900] * 3000, partition=0)
        assert raised.value.code == ErrorCode.FRAME_TOO_LARGE
        assert time.monotonic() - started < c.timeout_ms / 1000


def test_huge_frame_is_cut_off_and_others_are_served(small_node: LocalNode,
                                                     sock: zmq.Socket[bytes]) -> None:
    rogue: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(small_node.endpoint)
    try:
        rogue.send(b"\x00" * (3 * FRAME_MAX))
        assert_still_serving(sock, 8)
    finally:
        rogue.close(0)


def test_stale_producer_sequence(small_node: LocalNode) -> None:
    with small_node.client(producer_id=777) as c:
        for seq in range(1030):  # past the remembered window (1024)
            c.call("produce", topic="t", partition=1, producer_id=777, seq=seq,
                   records=msgpack.packb([b"s"]))
        with pytest.raises(Exception) as info:
            c.call("produce", topic="t", partition=1, producer_id=777, seq=0,
                   records=msgpack.packb([b"s"]))
        assert getattr(info.value, "code", None) == ErrorCode.STALE_SEQUENCE


def test_requests_sharing_a_frame_are_answered_one_by_one(sock: zmq.Socket[bytes]) -> None:
    """A frame of three requests, the middle one bad: each gets its own reply, and the two
    produces, acknowledged by one group commit, come back joined in one frame."""
    frame = good_produce(501) + req(op="frobnicate", id=502) + good_produce(503)
    sock.send(frame)
    got: dict[int, dict[str, Any]] = {}
    frames: list[list[int]] = []
    while len(got) < 3:
        assert sock.poll(10_000, zmq.POLLIN), f"no reply within 10 s; have {sorted(got)}"
        replies = unpack_replies(sock.recv())
        frames.append([r["id"] for r in replies])
        got.update((r["id"], r) for r in replies)
    assert sorted(got) == [501, 502, 503]
    assert got[501]["ok"] and got[503]["ok"]
    assert got[503]["parts"][0][1] == got[501]["parts"][0][1] + 1  # in request order
    assert_error(got[502], ErrorCode.UNKNOWN_OP, "frobnicate")
    assert [501, 503] in frames, frames
    assert_still_serving(sock, 504)


def test_requests_for_the_status_sharing_a_frame_are_each_answered(
        sock: zmq.Socket[bytes]) -> None:
    """The front door sends a burst's requests for one actor as one bundle; the supervisor,
    which answers ``status``, took single messages only and dropped the bundle: both were
    answered TIMEOUT after request_timeout_ms (10 s)."""
    sock.send(req(op="status", id=601) + req(op="status", id=602))
    got: dict[int, dict[str, Any]] = {}
    while len(got) < 2:
        assert sock.poll(5_000, zmq.POLLIN), f"no reply within 5 s; have {sorted(got)}"
        got.update((r["id"], r) for r in unpack_replies(sock.recv()))
    assert sorted(got) == [601, 602]
    assert all(r["ok"] and r["status"]["actors"] for r in got.values()), got


@pytest.mark.parametrize("directory", ["/tmp/a\x00b", "/tmp/" + "x" * 256])
def test_an_export_directory_no_path_can_name_is_refused_and_nothing_restarts(
        small_node: LocalNode, sock: zmq.Socket[bytes], directory: str) -> None:
    """A NUL byte (ValueError) or a name over 255 bytes (ENAMETOOLONG, from ``exists``)
    made the log manager's check of the directory raise: the log manager died, and the
    node restarted it and the actors after it."""
    reply = ask(sock, req(op="snapshot_export", id=701, dir=directory))
    assert_error(reply, ErrorCode.BAD_REQUEST, "cannot create the export directory")
    assert_still_serving(sock, 702)
    with small_node.client() as c:
        actors = c.status()["actors"]
    assert [(a["role"], a["restarts"]) for a in actors] == [(a["role"], 0) for a in actors]


def _front_door_pid(node: LocalNode) -> int:
    with node.client() as c:
        (pid,) = [a["pid"] for a in c.status()["actors"] if a["role"] == "front"]
    return int(pid)


def _memory_kib(pid: int, field: str) -> int:
    """A field of ``/proc/PID/status`` in KiB: VmRSS now, VmHWM the peak so far."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _empty_arrays(n: int) -> bytes:
    """A msgpack array of ``n`` empty arrays: a byte each in the frame, a list each (56
    bytes) if decoded whole."""
    return b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n


@pytest.mark.parametrize("shape", ["request", "records"])
def test_a_frame_of_empty_arrays_is_refused_without_being_decoded_whole(
        small_node: LocalNode, sock: zmq.Socket[bytes], shape: str) -> None:
    """What a request (or a batch's records) decodes to is bounded by what one can hold,
    not only by the frame: a frame of empty arrays was decoded to a list each, 64 bytes of
    the front door's memory a byte of the frame (a 16 MiB frame: 1.1 GB and 8 s, and the
    supervisor killed the silent front door)."""
    pid = _front_door_pid(small_node)
    n = FRAME_MAX - 200
    if shape == "request":
        frame, code, says = _empty_arrays(n), ErrorCode.BAD_REQUEST, "map and array items"
    else:
        frame = req(op="produce", id=801, topic="t", partition=0, producer_id=1, seq=next(_SEQ),
                    records=_empty_arrays(n - 100))
        code, says = ErrorCode.BATCH_TOO_LARGE, "records; the limit is 100"
    assert len(frame) <= FRAME_MAX
    before = _memory_kib(pid, "VmRSS")
    for _ in range(3):
        assert_error(ask(sock, frame), code, says)
    grown_mib = (_memory_kib(pid, "VmHWM") - before) / 1024
    # Decoded whole, one frame would take about 120 MiB; two copies of the frame are 4.
    assert grown_mib < 32, f"the front door's peak grew by {grown_mib:.0f} MiB"
    assert_still_serving(sock, 802)


def test_the_client_refuses_what_it_cannot_send_with_a_clear_error(
        small_node: LocalNode) -> None:
    """Values were taken as they came: ``produce(topic, 5)`` stored five zero bytes
    (``bytes(5)``), tags given as one str were stored letter by letter, a pipeline's str
    value raised AttributeError, and an integer past msgpack's range raised msgpack's
    OverflowError with no word of which field."""
    with small_node.client() as c:
        for call, says in (
                (lambda: c.produce("t", 5), "a value must be bytes or str, not int"),  # type: ignore[arg-type]
                (lambda: c.produce("t", b"v", key=7), "a key must be bytes or str"),  # type: ignore[arg-type]
                (lambda: c.produce("t", b"v", tags="abc"), "not one str"),
                (lambda: c.produce_batch("t", [1]),  # type: ignore[list-item]
                 "a record must be bytes, str or a Record"),
                (lambda: c.kv_put("ns", b"k", 1.5), "a value must be bytes or str"),  # type: ignore[arg-type]
        ):
            with pytest.raises(TypeError, match=says):
                call()
        with pytest.raises(BadRequest, match=r"read: field 'offset' cannot be sent"):
            c.read("t", 0, 2**64)
        for timeout_ms in (0, -1, 1.5):  # refused before a one-request transaction skips it
            with pytest.raises(ValueError, match="timeout_ms must be"):
                c.transaction(timeout_ms=timeout_ms)  # type: ignore[arg-type]
        first = c.end_offsets("t")[0]
        assert c.produce_batch("t", ["s", b"b"], partition=0) == [(0, first), (0, first + 1)]
        pipe = c.pipeline()
        rid = pipe.submit("t", ["p"], partition=0)
        assert pipe.poll(10_000) == [(rid, [(0, first + 2)])]
        assert [r.value for r in c.read("t", 0, first)] == [b"s", b"b", b"p"]
    for kw, says in (({"timeout_ms": 0}, "timeout_ms must be"), ({"retries": -1}, "retries must"),
                     ({"endpoint": "127.0.0.1:7400"}, "not an endpoint such as"),
                     ({"endpoint": "tcp://127.0.0.1:abc"}, "needs a host and a port"),
                     ({"endpoint": "http://127.0.0.1:7400"}, "listens on tcp://")):
        with pytest.raises(ValueError, match=says):
            NodeClient(**kw)
