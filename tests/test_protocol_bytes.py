"""The client protocol's bytes, pinned: requests as the client encodes them and replies as
the front door encodes them must stay byte-for-byte what they were.

The literals below were written out from the code before the request/reply table
(``wire/protocol.py``) replaced the hand-written schema and client calls; a change to a
field name, the order of a map's keys or a value's layout fails here. Requests go through
``NodeClient`` and ``Pipeline`` over a socket that only records what it is given; replies
through ``FrontDoorState``, fed the actors' answers."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import zmq

from actors.front_state import FrontDoorState, Out
from actors.instructions import Produce, Reply, Request
from config import load_config
from node.client import NodeClient
from wire.errors import ErrorCode
from wire.messages import (
    Answer,
    Catalog,
    Done,
    ErrorReply,
    RecordsReply,
    StatusReply,
    TopicsReply,
    ValueReply,
)
from wire.protocol import Topic, request_map, unpack_replies
from wire.records import Record, pack_read

# ---- requests, as the client sends them ---------------------------------------------------


class RecordingSocket:
    """Stands in for the client's DEALER socket: keeps what is sent, answers ``reply``."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.sent: list[bytes] = []
        self.reply = reply

    def send(self, frame: bytes, *_args: Any, **_kw: Any) -> None:
        self.sent.append(bytes(frame))

    def poll(self, *_args: Any, **_kw: Any) -> int:
        return 1

    def recv(self, *_args: Any, **_kw: Any) -> bytes:
        rid = msgpack.unpackb(self.sent[-1])["id"]
        return bytes(msgpack.packb({"id": rid, "ok": True, **self.reply}, use_bin_type=True))

    def close(self, *_args: Any) -> None:
        pass


def client(**reply: Any) -> tuple[NodeClient, RecordingSocket]:
    c = NodeClient("tcp://127.0.0.1:1", producer_id=77)
    c.sock.close(0)
    sock = RecordingSocket(reply)
    c.sock = sock  # type: ignore[assignment]  # a stand-in for the zmq socket, on purpose
    return c, sock


def test_produce_requests_keep_their_bytes() -> None:
    c, sock = client(lsn=5, parts=[[0, 10, 1]])
    c.produce("events", b"hello", key=b"k1", tags=["red"], timestamp=1700000000000)
    c.produce("events", b"v", partition=0)
    assert sock.sent == [
        b"\x86\xa5topic\xa6events\xabproducer_idM\xa3seq\x00\xa7records\xc4\x1b\x91\x94\xc4"
        b"\x05hello\xc4\x02k1\x91\xa3red\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xa2op\xa7produce"
        b"\xa2id\x01",
        b"\x87\xa5topic\xa6events\xabproducer_idM\xa3seq\x01\xa7records\xc4\x04\x91\xc4\x01v"
        b"\xa9partition\x00\xa2op\xa7produce\xa2id\x02",
    ]


def test_pipelined_produce_requests_keep_their_bytes() -> None:
    c, sock = client()
    p = c.pipeline()
    p.submit("events", [b"a", Record(b"b", b"k", ("t",), 5)])
    p.submit("events", [b"c"], partition=1, seq=3)
    p.flush()
    assert sock.sent == [
        b"\x86\xa2op\xa7produce\xa2id\x01\xa5topic\xa6events\xabproducer_idM\xa3seq\x00"
        b"\xa7records\xc4\x0f\x92\xc4\x01a\x94\xc4\x01b\xc4\x01k\x91\xa1t\x05"
        b"\x87\xa2op\xa7produce\xa2id\x02\xa5topic\xa6events\xabproducer_idM\xa3seq\x03"
        b"\xa7records\xc4\x04\x91\xc4\x01c\xa9partition\x01"
    ]


def test_the_pipeline_writes_its_requests_as_the_table_orders_them() -> None:
    """The Pipeline writes its produce map out by hand (its hot path); the table decides."""
    c, sock = client()
    p = c.pipeline()
    p.submit("events", [b"a"])
    p.submit("events", [b"b"], partition=2)
    p.flush()
    for req in unpack_replies(sock.sent[0]):  # maps, one after another, as replies come
        fields = {k: v for k, v in req.items() if k not in ("op", "id")}
        built = request_map("produce", req["id"], fields, id_first=True)
        assert list(req.items()) == list(built.items())


def test_read_and_topic_requests_keep_their_bytes() -> None:
    c, sock = client(records=msgpack.packb([]), topics=[["events", 4, 1]], lsn=3, value=5)
    c.read("events", 2, 100, max_records=50)
    c.list_topics()
    c.create_topic("events", partitions=4)
    c.commit_offset("g1", "events", 1, 99)
    c.offset_for_timestamp("events", 1, 1700000000000)
    c.read_by_tag("events", 1, "red")
    c.read_by_key("events", b"k1", partition=1)
    assert sock.sent == [
        b"\x86\xa5topic\xa6events\xa9partition\x02\xa6offsetd\xabmax_records2\xa2op\xa4read"
        b"\xa2id\x01",
        b"\x82\xa2op\xablist_topics\xa2id\x02",
        b"\x84\xa4name\xa6events\xaapartitions\x04\xa2op\xaccreate_topic\xa2id\x03",
        b"\x86\xa5group\xa2g1\xa5topic\xa6events\xa9partition\x01\xa6offsetc\xa2op"
        b"\xadcommit_offset\xa2id\x04",
        b"\x85\xa5topic\xa6events\xa9partition\x01\xa9timestamp\xcf\x00\x00\x01\x8b\xcf\xe5h"
        b"\x00\xa2op\xb4offset_for_timestamp\xa2id\x05",
        b"\x87\xa5topic\xa6events\xa9partition\x01\xa3tag\xa3red\xa6offset\x00\xabmax_records"
        b"\xcd\x03\xe8\xa2op\xabread_by_tag\xa2id\x06",
        b"\x85\xa5topic\xa6events\xa9partition\x01\xa3key\xc4\x02k1\xa2op\xabread_by_key"
        b"\xa2id\x07",
    ]


# ---- replies, as the front door sends them ------------------------------------------------


@pytest.fixture
def front() -> FrontDoorState:
    s = FrontDoorState(load_config())
    s.catalog(Catalog(7, [Topic("events", 4, 1), Topic("one", 1, 2)], 7))
    return s


def send(s: FrontDoorState, op: str, rid: int, **fields: Any) -> Out:
    frame = msgpack.packb({"op": op, "id": rid, **fields}, use_bin_type=True)
    (out,) = s.request(b"c", [frame], 0.0)
    return out


def ask(s: FrontDoorState, op: str, rid: int, **fields: Any) -> Request:
    """A request the front door passes on to an actor, to be answered with ``answer``."""
    out = send(s, op, rid, **fields)
    assert isinstance(out, Request), out
    return out


def answer(s: FrontDoorState, msg: Answer) -> bytes:
    (reply,) = s.answer(msg)
    assert isinstance(reply, Reply)
    return reply.frame


def test_produce_replies_keep_their_bytes(front: FrontDoorState) -> None:
    out = send(front, "produce", 11, topic="events", partition=2, producer_id=9, seq=0,
               records=msgpack.packb([b"a", b"b"]))
    assert isinstance(out, Produce)
    (reply,) = front.ack(out.corr, 41, [(2, 100, 2)])
    assert isinstance(reply, Reply)
    assert reply.frame == b"\x84\xa3lsn)\xa5parts\x91\x93\x02d\x02\xa2id\x0b\xa2ok\xc3"
    out = send(front, "produce", 12, topic="events", producer_id=9, seq=1,
               records=msgpack.packb([[b"a", b"k1", [], None], [b"b", b"k2", [], None]]))
    assert isinstance(out, Produce)
    (reply,) = front.ack(out.corr, 42, [(1, 7, 1), (3, 7, 1)])  # split by key: 1 and 3
    assert isinstance(reply, Reply)
    assert reply.frame == (b"\x85\xa3lsn*\xa5parts\x92\x93\x01\x07\x01\x93\x03\x07\x01\xa6assign"
                           b"\x92\x01\x03\xa2id\x0c\xa2ok\xc3")


def test_answers_keep_their_bytes(front: FrontDoorState) -> None:
    out = ask(front, "list_topics", 13)
    topics = [Topic("events", 4, 1), Topic("one", 1, 2)]
    # (Each row gained its settings, a map: empty here, \x80.)
    assert answer(front, TopicsReply(out.corr, topics)) == (
        b"\x83\xa6topics\x92\x95\xa6events\x04\x01\x90\x80\x95\xa3one\x01\x02\x90\x80"
        b"\xa2id\r\xa2ok\xc3")
    out = ask(front, "read", 14, topic="events", partition=0, offset=0, max_records=10)
    records = pack_read([[0, 1700000000000, b"k1", ["red"], b"hello"]])
    assert answer(front, RecordsReply(out.corr, records, 40)) == (
        b"\x83\xa7records\xc4\x1c\x91\x95\x00\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xc4\x02k1\x91"
        b"\xa3red\xc4\x05hello\xa2id\x0e\xa2ok\xc3")
    out = ask(front, "create_topic", 15, name="orders", partitions=2)
    assert answer(front, Done(out.corr, 43)) == b"\x83\xa3lsn+\xa2id\x0f\xa2ok\xc3"
    out = ask(front, "committed_offset", 16, group="g", topic="events", partition=0)
    assert answer(front, ValueReply(out.corr, None)) == b"\x83\xa5value\xc0\xa2id\x10\xa2ok\xc3"
    out = ask(front, "offset_for_timestamp", 17, topic="events", partition=0, timestamp=5)
    assert answer(front, ValueReply(out.corr, 12)) == b"\x83\xa5value\x0c\xa2id\x11\xa2ok\xc3"
    out = ask(front, "status", 21)
    assert answer(front, StatusReply(out.corr, {"node": {"pid": 1}})) == (
        b"\x83\xa6status\x81\xa4node\x81\xa3pid\x01\xa2id\x15\xa2ok\xc3")


def test_error_replies_keep_their_bytes(front: FrontDoorState) -> None:
    asked = ask(front, "delete_topic", 18, name="events")
    text = "topic 'events' does not exist"
    assert answer(front, ErrorReply(asked.corr, int(ErrorCode.UNKNOWN_TOPIC), text)) == (
        b"\x84\xa2id\x12\xa2ok\xc2\xa4code\n\xa5error\xbdtopic 'events' does not exist")
    checked: dict[tuple[str, int], dict[str, object]] = {
        ("fly", 19): {},
        ("read", 20): {"topic": "nope", "partition": 0, "offset": 0, "max_records": 1},
        ("read", 30): {"topic": "events", "partition": 0, "offset": 0},
        ("read", 31): {"topic": "events", "partition": "0", "offset": 0, "max_records": 1},
        ("read", 32): {"topic": "events", "partition": 0, "offset": -1, "max_records": 1},
        ("status", 33): {"colour": "blue"},
        ("produce", 35): {"topic": "events", "partition": None, "producer_id": 9, "seq": "x",
                          "records": b""},
    }
    frames = []
    for (op, rid), fields in checked.items():
        out = send(front, op, rid, **fields)
        assert isinstance(out, Reply)
        frames.append(out.frame)
    assert frames == [
        # (The list of known ops grew with the transactions' ops: a str 8 became a str 16;
        # then with stats and compact; then with the KV ops, snapshot_export, the deletes and
        # alter_topic: 0x01b6 became 0x0255; then with txn_once: 0x0261.)
        b"\x84\xa2id\x13\xa2ok\xc2\xa4code\x02\xa5error\xda\x02\x61unknown op 'fly'; known: "
        b"['alter_topic', 'checkpoint', 'cluster_map', 'cluster_sync', 'commit_offset', 'committed_offset', 'compact', 'create_topic', "
        b"'delete_by_key', 'delete_by_offset', 'delete_topic', "
        b"'end_offsets', 'kv_cas', 'kv_create', 'kv_delete', 'kv_drop', 'kv_get', 'kv_put', "
        b"'kv_scan', 'list_topics', 'offset_for_timestamp', 'produce', 'read', 'read_by_key', "
        b"'read_by_tag', "
        b"'snapshot_export', "
        b"'stats', 'status', 'txn_abort', 'txn_begin', 'txn_commit', 'txn_commit_offset', "
        b"'txn_kv', 'txn_list', 'txn_once', 'txn_produce', 'xa_commit', 'xa_end', 'xa_prepare', 'xa_recover', "
        b"'xa_rollback', 'xa_start']",
        b"\x84\xa2id\x14\xa2ok\xc2\xa4code\n\xa5error\xbbtopic 'nope' does not exist",
        b"\x84\xa2id\x1e\xa2ok\xc2\xa4code\x01\xa5error\xd9!read: missing field 'max_records'",
        b"\x84\xa2id\x1f\xa2ok\xc2\xa4code\x01\xa5error\xd9,read: field 'partition' must be "
        b"int, got str",
        b"\x84\xa2id \xa2ok\xc2\xa4code\x01\xa5error\xd9$read: field 'offset' is out of range",
        b"\x84\xa2id!\xa2ok\xc2\xa4code\x01\xa5error\xd9#status: unknown fields "
        b"[\"'colour'\"]",
        b"\x84\xa2id#\xa2ok\xc2\xa4code\x01\xa5error\xd9)produce: field 'seq' must be int, "
        b"got str",
    ]
    out = send(front, "read_by_key", 34, topic="events", partition=0, key=b"k" * 4097)
    assert isinstance(out, Reply)
    assert out.frame == (b"\x84\xa2id\"\xa2ok\xc2\xa4code\x01\xa5error\xd9,read_by_key: "
                         b"field 'key' is longer than 4096")


class JoiningSocket(RecordingSocket):
    """Answers a call once, in one frame with the answers of two pipelined requests around
    it, as the front door joins the replies of one burst to one client."""

    def __init__(self) -> None:
        super().__init__({})
        self.answered = False

    def poll(self, *_args: Any, **_kw: Any) -> int:
        return 0 if self.answered else 1

    def recv(self, *_args: Any, **_kw: Any) -> bytes:
        if self.answered:
            raise zmq.Again
        self.answered = True
        *piped, call = [m["id"] for frame in self.sent for m in unpack_replies(frame)]
        first, second = piped[0], piped[-1]
        return b"".join(msgpack.packb(m, use_bin_type=True) for m in (
            {"lsn": 4, "parts": [[0, 10, 1]], "id": first, "ok": True},
            {"topics": [], "id": call, "ok": True},
            {"lsn": 4, "parts": [[0, 11, 1]], "id": second, "ok": True}))


def test_a_call_hands_the_answers_around_its_own_in_a_frame_to_their_waiters() -> None:
    """A frame may hold others' answers after the call's own: each goes to its pipeline
    (the call returned at its own, and the pipeline's second answer was lost for good)."""
    c = NodeClient("tcp://127.0.0.1:1", producer_id=77)
    c.sock.close(0)
    sock = JoiningSocket()
    c.sock = sock  # type: ignore[assignment]  # a stand-in for the zmq socket, on purpose
    pipe = c.pipeline()
    ids = [pipe.submit("events", [b"a"], partition=0), pipe.submit("events", [b"b"], partition=0)]
    pipe.flush()
    assert c.list_topics() == []
    answers = pipe.poll(0)
    assert sorted(rid for rid, _out in answers) == ids
    assert not pipe.in_flight and not c._waiters
