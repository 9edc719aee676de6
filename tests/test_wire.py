"""Unit tests of everything in ``wire/`` that is not the log format: the internal codec,
the client request schema, record batches and the error-code mapping. No processes."""

from __future__ import annotations

import collections.abc
import dataclasses
import threading
import types
import typing
from pathlib import Path
from typing import Any

import msgpack
import pytest

import wire.messages  # noqa: F401  (registers every message type)
from wire import codec, errors, packer
from wire.codec import CodecError
from wire.errors import (
    BadRequest,
    Busy,
    ErrorCode,
    NodeError,
    RequestTimeout,
    StaleSequence,
    TopicExists,
    Unavailable,
    UnknownPartition,
    UnknownTopic,
    error_for,
)
from wire.protocol import (
    OFFSET_MAX,
    OPS,
    REQUEST_ARRAY_LEN_MAX,
    REQUEST_ITEMS_MAX,
    REQUEST_MAP_LEN_MAX,
    TXN_ONCE_WRITES_MAX,
    Field,
    check_once_writes,
    describe,
    join_frames,
    parse_request,
    parse_requests,
    request_map,
    unpack_replies,
)
from wire.records import (
    TAGS_PER_RECORD_MAX,
    Record,
    check_batch,
    pack_batch,
    unpack_values,
)

FRAME_MAX = 1 << 20


def pack(obj: Any) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


# ---- the internal codec ---------------------------------------------------------------


def _sample(tp: Any, i: int, use_none: bool) -> Any:
    """A value of annotation ``tp``, distinct for each field index ``i``."""
    origin = typing.get_origin(tp)
    if tp is bool:
        return i % 2 == 0
    if tp is int:
        return [7, -3, 2**63 - 1, 0, 123456789][i % 5] + i * 1000
    if tp is str:
        return f"field-{i}-ü"
    if tp is bytes:
        return bytes([i, 0, 255]) * (i + 1)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if use_none and type(None) in args:
            return None
        return _sample(next(a for a in args if a is not type(None)), i, use_none)
    if tp is Any:
        return [i, f"t{i}", b"\x00blob", None, -1, [1, "x"]][i % 6]
    if origin is list:
        (item,) = typing.get_args(tp)
        if item is Any:
            return [i, f"t{i}", 3, b"\x00blob", None, [i + 1, -1]]
        return [_sample(item, i + k, use_none) for k in range(3)]
    if origin is collections.abc.Sequence:  # in messages whose arrays decode as tuples
        (item,) = typing.get_args(tp)
        return tuple(_sample(item, i + k, use_none) for k in range(3))
    if origin is tuple and typing.get_args(tp)[-1] is Ellipsis:  # tuple[int, ...]
        return tuple(_sample(typing.get_args(tp)[0], i + k, use_none) for k in range(3))
    if origin is tuple:  # a typed row
        return tuple(_sample(item, i + k, use_none) for k, item in enumerate(typing.get_args(tp)))
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):  # NamedTuple
        hints = typing.get_type_hints(tp)
        return tp(*[_sample(hints[name], i + k, use_none) for k, name in enumerate(tp._fields)])
    if origin is dict:
        return {"count": i, "nested": [1, "a", b"b", None], "map": {"x": 1.5}}
    raise AssertionError(f"no sample for annotation {tp!r}: teach this test the new type")


def _instances(cls: type) -> list[Any]:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    out = []
    for use_none in (False, True):
        out.append(cls(*[_sample(hints[f.name], i, use_none) for i, f in enumerate(fields)]))
    return out


REGISTERED = sorted(codec.registered().items())


def test_registry_is_not_empty_and_tags_match_classes() -> None:
    assert len(REGISTERED) >= 20
    for tag, cls in REGISTERED:
        assert tag == cls.TAG


def _as_lists(value: Any) -> Any:
    """``value`` with every tuple (rows included) a list, as msgpack gives arrays back."""
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize(("tag", "cls"), REGISTERED, ids=[c.__name__ for _, c in REGISTERED])
def test_round_trip_of_every_registered_message(tag: int, cls: type) -> None:
    fields = dataclasses.fields(cls)
    for msg in _instances(cls):
        frame = codec.encode(msg)
        # The layout is [TAG, fields in declaration order], checked independently of decode.
        expected = [tag] + [getattr(msg, f.name) for f in fields]
        assert msgpack.unpackb(frame, raw=False, strict_map_key=False) == _as_lists(expected)
        back = codec.decode(frame)
        assert type(back) is cls
        assert back == msg  # rows and tuples come back as what the class declares
        for f in fields:
            assert type(getattr(back, f.name)) is type(getattr(msg, f.name)), f.name


def test_rows_decode_as_their_named_tuple_and_hot_rows_as_tuples() -> None:
    from wire.messages import Acks, Catalog, Writes
    from wire.protocol import Topic

    cat = codec.decode(codec.encode(Catalog(3, [Topic("t", 2, 9)], 3)))
    assert isinstance(cat, Catalog) and cat.topics == [Topic("t", 2, 9)]
    assert cat.topics[0].topic_id == 9 and type(cat.topics) is list
    # Sent as lists on purpose (the type asks for tuples): they decode as tuples all the same.
    acks = codec.decode(codec.encode(Acks([[5, 7, [[0, 10, 1]]]])))  # type: ignore[list-item]
    assert isinstance(acks, Acks) and acks.rows == ((5, 7, ((0, 10, 1),)),)
    writes = codec.decode(codec.encode(Writes([1], [(9, 0, [(1, 0, 1, b"r")])], [])))
    assert isinstance(writes, Writes) and writes.produces == ((9, 0, ((1, 0, 1, b"r"),)),)
    with pytest.raises(CodecError, match="Topic"):
        codec.decode(pack([Catalog.TAG, 3, [["t", 2]], 3]))  # a row one field short


def test_a_tag_cannot_be_registered_twice() -> None:
    taken = REGISTERED[0][0]
    with pytest.raises(ValueError, match=str(taken)):

        @codec.message(taken)
        class Twin(codec.Message):
            x: int

    assert codec.registered()[taken] is REGISTERED[0][1]


def _good_frame() -> tuple[type, bytes]:
    _tag, cls = REGISTERED[0]
    return cls, codec.encode(_instances(cls)[0])


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # an array of 2 with one element: truncated
        pack([10, 1]) + b"\x00",  # trailing bytes after a whole message
        b"",
    ],
    ids=["never-used-byte", "truncated", "trailing-bytes", "empty"],
)
def test_decode_rejects_frames_that_are_not_msgpack(frame: bytes) -> None:
    with pytest.raises(CodecError) as info:
        codec.decode(frame)
    assert info.value.code == ErrorCode.BAD_REQUEST


@pytest.mark.parametrize(
    "obj",
    [{"tag": 10}, [], ["10", 1], [None], 10, [1.5, 1]],
    ids=["map", "empty-array", "str-tag", "nil-tag", "int", "float-tag"],
)
def test_decode_rejects_frames_that_are_not_tagged_arrays(obj: Any) -> None:
    with pytest.raises(CodecError):
        codec.decode(pack(obj))


def test_decode_rejects_an_unknown_tag() -> None:
    unknown = max(codec.registered()) + 1
    with pytest.raises(CodecError, match=f"unknown message tag {unknown}"):
        codec.decode(pack([unknown, 1, 2]))


@pytest.mark.parametrize(("tag", "cls"), REGISTERED, ids=[c.__name__ for _, c in REGISTERED])
def test_decode_rejects_the_wrong_number_of_fields(tag: int, cls: type) -> None:
    n = len(dataclasses.fields(cls))
    for wrong in (n - 1, n + 1):
        if wrong < 0:
            continue
        with pytest.raises(CodecError, match=cls.__name__):
            codec.decode(pack([tag] + [0] * wrong))


def test_decode_enforces_the_frame_size_limit() -> None:
    cls, frame = _good_frame()
    assert type(codec.decode(frame, frame_bytes_max=len(frame))) is cls  # at the limit: fine
    with pytest.raises(CodecError, match="over the limit"):
        codec.decode(frame, frame_bytes_max=len(frame) - 1)


# ---- the client request schema -----------------------------------------------------------

VALID_REQUESTS: dict[str, dict[str, Any]] = {
    "checkpoint": {},
    "stats": {},
    "compact": {"topic": "orders"},
    "snapshot_export": {"dir": "/var/backups/shardnode-1"},
    "produce": {"topic": "orders", "partition": 3, "producer_id": 9, "seq": 0,
                "records": pack([b"a", b"b"])},
    "create_topic": {"name": "orders", "partitions": 4},
    "delete_topic": {"name": "orders"},
    "alter_topic": {"name": "orders", "retention_ms": 60_000, "retention_bytes": 1 << 30},
    "list_topics": {},
    "cluster_map": {},
    "cluster_sync": {},
    "end_offsets": {"topic": "orders"},
    "read": {"topic": "orders", "partition": 0, "offset": 10, "max_records": 100},
    "read_by_key": {"topic": "orders", "partition": 1, "key": b"k1"},
    "read_by_tag": {"topic": "orders", "partition": 1, "tag": "red", "offset": 0,
                    "max_records": 5},
    "offset_for_timestamp": {"topic": "orders", "partition": 2, "timestamp": 1_700_000_000_000},
    "commit_offset": {"group": "g1", "topic": "orders", "partition": 0, "offset": OFFSET_MAX},
    "committed_offset": {"group": "g1", "topic": "orders", "partition": 0},
    "delete_by_key": {"topic": "orders", "partition": 1, "key": b"k1"},
    "delete_by_offset": {"topic": "orders", "partition": 1, "offset": 7},
    "status": {},
    "txn_begin": {"timeout_ms": 60_000},
    "txn_produce": {"txn": 5, "seq": 0, "topic": "orders", "records": pack([b"a"]),
                    "partition": 1},
    "txn_commit_offset": {"txn": 5, "seq": 1, "group": "g1", "topic": "orders",
                          "partition": 0, "offset": 3},
    "txn_commit": {"txn": 5},
    "txn_once": {"txn": 6, "writes": [
        {"op": "txn_produce", "topic": "orders", "records": pack([b"a"]), "partition": 1},
        {"op": "txn_commit_offset", "group": "g1", "topic": "orders", "partition": 0,
         "offset": 3}]},
    "txn_abort": {"txn": 5},
    "xa_start": {"xid": [1, b"order-17", b"a"], "timeout_ms": 1000},
    "xa_end": {"xid": [1, b"order-17", b"a"]},
    "xa_prepare": {"xid": [1, b"order-17", b"a"]},
    "xa_commit": {"xid": [1, b"order-17", b"a"], "one_phase": True},
    "xa_rollback": {"xid": [1, b"order-17", b"a"]},
    "xa_recover": {},
    "txn_list": {},
    # ---- key/value (kept together: other ops are added above) ----
    "kv_create": {"namespace": "config"},
    "kv_drop": {"namespace": "config"},
    "kv_put": {"namespace": "config", "key": b"k", "value": b"v", "producer_id": 9, "seq": 1},
    "kv_get": {"namespace": "config", "key": b"k"},
    "kv_delete": {"namespace": "config", "key": b"k"},
    "kv_scan": {"namespace": "config", "prefix": b"user/", "start_after": b"user/1",
                "limit": 10},
    "kv_cas": {"namespace": "config", "key": b"k", "expected": None, "new": b"w"},
    "txn_kv": {"txn": 5, "seq": 2, "namespace": "config", "key": b"k", "value": None},
}


def test_valid_request_examples_cover_every_op() -> None:
    assert set(VALID_REQUESTS) == set(OPS)


def _field(op: str, name: str) -> Field:
    (f,) = [f for f in OPS[op].request if f.name == name]
    return f


def _parse(req: Any, limit: int = FRAME_MAX) -> tuple[int, str, dict[str, Any]]:
    return parse_request(pack(req), limit)


def _reject(req: Any, limit: int = FRAME_MAX) -> NodeError:
    with pytest.raises(NodeError) as info:
        _parse(req, limit)
    return info.value


def request_id(err: NodeError) -> int:
    """The request id ``parse_request`` puts on its error: set at runtime, as an attribute
    ``NodeError`` does not declare (hence the ignore)."""
    rid = err.request_id  # type: ignore[attr-defined]
    assert isinstance(rid, int), rid
    return rid


def test_txn_once_writes_are_checked_as_the_requests_they_stand_for() -> None:
    writes = VALID_REQUESTS["txn_once"]["writes"]
    got = check_once_writes(7, 6, writes)
    assert [op for op, _f in got] == ["txn_produce", "txn_commit_offset"]
    assert [(f["txn"], f["seq"]) for _op, f in got] == [(6, 0), (6, 1)]  # filled in, in order
    assert got[1][1]["offset"] == 3 and got[0][1]["records"] == writes[0]["records"]


@pytest.mark.parametrize(("writes", "says"), [
    ([], "0 writes"),
    ([VALID_REQUESTS["txn_once"]["writes"][0]] * (TXN_ONCE_WRITES_MAX + 1), "1 to 64"),
    (["not a map"], "write 0 must be a map"),
    ([{"op": "txn_kv", "namespace": "c", "key": b"k", "value": None}], "write 0 must be"),
    ([{"op": "produce", "topic": "t", "records": b"\x90"}], "write 0 must be"),
    ([{"op": "txn_produce", "topic": "t", "records": b"\x91\xa1a", "seq": 3}],
     "must not carry 'id', 'txn' or 'seq'"),
    ([{"op": "txn_commit_offset", "group": "g", "topic": "t", "partition": 0, "offset": 1},
      {"op": "txn_produce", "topic": "t"}], "write 1: txn_produce: missing field 'records'"),
    ([{"op": "txn_commit_offset", "group": "g", "topic": "t", "partition": -1, "offset": 1}],
     "write 0: txn_commit_offset: field 'partition' is out of range"),
    ([{"op": "txn_produce", "topic": "t", "records": b"\x90", "colour": 1}],
     "write 0: txn_produce: unknown fields"),
])
def test_bad_txn_once_writes_are_refused_naming_the_write(writes: list[Any], says: str) -> None:
    with pytest.raises(NodeError) as info:
        check_once_writes(7, 6, writes)
    assert info.value.code == ErrorCode.BAD_REQUEST
    assert says in info.value.message
    assert request_id(info.value) == 7


@pytest.mark.parametrize("op", sorted(VALID_REQUESTS))
def test_every_op_is_accepted_with_valid_fields(op: str) -> None:
    req = {"op": op, "id": 41, **VALID_REQUESTS[op]}
    rid, got_op, fields = _parse(req)
    assert (rid, got_op) == (41, op)
    for name, value in VALID_REQUESTS[op].items():
        assert fields[name] == value


def test_produce_partition_is_optional_and_may_be_nil() -> None:
    base = {"op": "produce", "id": 1, **VALID_REQUESTS["produce"]}
    del base["partition"]
    assert _parse(base)[1] == "produce"
    assert _parse({**base, "partition": None})[2]["partition"] is None


def test_not_msgpack_is_a_bad_request() -> None:
    with pytest.raises(NodeError) as info:
        parse_request(b"\xc1\xc1", FRAME_MAX)
    assert info.value.code == ErrorCode.BAD_REQUEST
    assert request_id(info.value) == 0


@pytest.mark.parametrize("obj", [[1, 2], "produce", 5, None], ids=["array", "str", "int", "nil"])
def test_not_a_map_is_a_bad_request(obj: Any) -> None:
    err = _reject(obj)
    assert err.code == ErrorCode.BAD_REQUEST
    assert "map" in err.message


@pytest.mark.parametrize("rid", [None, "7", 1.0, True], ids=["absent", "str", "float", "bool"])
def test_a_request_without_an_integer_id_is_a_bad_request(rid: Any) -> None:
    req: dict[str, Any] = {"op": "status"}
    if rid is not None:
        req["id"] = rid
    err = _reject(req)
    assert err.code == ErrorCode.BAD_REQUEST
    assert "'id'" in err.message


@pytest.mark.parametrize("op", ["fly", "", None, 3, "PRODUCE"])
def test_an_unknown_op_is_answered_with_unknown_op_and_the_id(op: Any) -> None:
    req = {"id": 12}
    if op is not None:
        req["op"] = op
    err = _reject(req)
    assert err.code == ErrorCode.UNKNOWN_OP
    assert request_id(err) == 12


def _required(op: str) -> list[str]:
    return [f.name for f in OPS[op].request if f.required]


@pytest.mark.parametrize(
    ("op", "field"),
    [(op, f) for op in sorted(OPS) for f in _required(op)],
)
def test_a_missing_required_field_is_named(op: str, field: str) -> None:
    req = {"op": op, "id": 5, **VALID_REQUESTS[op]}
    del req[field]
    err = _reject(req)
    assert err.code == ErrorCode.BAD_REQUEST
    assert request_id(err) == 5
    assert f"'{field}'" in err.message and "missing" in err.message


def _wrong_value(value: Any) -> list[Any]:
    """Values of the wrong type for a field whose valid example is ``value``."""
    if type(value) is int:
        return ["1", 1.0, True, b"1", [1]]
    if type(value) is str:
        return [b"orders", 1, None, ["orders"]]
    if type(value) is bytes:
        return ["k1", 1, None, [b"k1"]]
    if type(value) is list:
        return ["x", 1, None, b"x", {"a": 1}]
    if type(value) is bool:
        return [1, "true", None, [True]]
    if value is None:  # a field that is bin or nil
        return ["k1", 1, [b"k1"]]
    raise AssertionError(value)


@pytest.mark.parametrize(
    ("op", "field"),
    [(op, f) for op in sorted(VALID_REQUESTS) for f in VALID_REQUESTS[op]],
)
def test_a_field_of_the_wrong_type_is_named(op: str, field: str) -> None:
    for wrong in _wrong_value(VALID_REQUESTS[op][field]):
        if wrong is None and type(None) in _field(op, field).types:
            continue
        req = {"op": op, "id": 6, **VALID_REQUESTS[op], field: wrong}
        err = _reject(req)
        assert err.code == ErrorCode.BAD_REQUEST, wrong
        assert f"'{field}'" in err.message


@pytest.mark.parametrize(
    ("op", "field"),
    [(op, f) for op in sorted(VALID_REQUESTS) for f, v in VALID_REQUESTS[op].items()
     # create_topic's partition count has its own range (1..PARTITIONS_MAX), checked by the
     # log manager: see test_log_state.
     if type(v) is int and (op, f) != ("create_topic", "partitions")],
)
def test_negative_and_overlarge_integers_are_out_of_range(op: str, field: str) -> None:
    for bad in (-1, OFFSET_MAX + 1):
        req = {"op": op, "id": 8, **VALID_REQUESTS[op], field: bad}
        err = _reject(req)
        assert err.code == ErrorCode.BAD_REQUEST
        assert f"'{field}'" in err.message


def test_negative_offset_is_rejected() -> None:
    err = _reject({"op": "read", "id": 2, **VALID_REQUESTS["read"], "offset": -5})
    assert err.code == ErrorCode.BAD_REQUEST
    assert "'offset'" in err.message


@pytest.mark.parametrize("op", sorted(VALID_REQUESTS))
def test_an_unknown_extra_field_is_named(op: str) -> None:
    err = _reject({"op": op, "id": 3, **VALID_REQUESTS[op], "colour": "blue"})
    assert err.code == ErrorCode.BAD_REQUEST
    assert "colour" in err.message


def test_a_frame_over_the_limit_is_frame_too_large() -> None:
    frame = pack({"op": "status", "id": 1, "pad": b""})
    frame_ok = pack({"op": "status", "id": 1})
    assert parse_request(frame_ok, len(frame_ok))[1] == "status"
    with pytest.raises(NodeError) as info:
        parse_request(frame, len(frame) - 1)
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    # Checked before decoding: a huge frame of garbage is "too large", not "not msgpack".
    with pytest.raises(NodeError) as info:
        parse_request(b"\xc1" * 100, 99)
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


# ---- the table as the client and the docs read it -----------------------------------------


def test_the_client_builds_each_valid_request_as_the_node_accepts_it() -> None:
    for op, fields in VALID_REQUESTS.items():
        req = request_map(op, 9, dict(reversed(fields.items())))  # any order in
        assert list(req) == [f.name for f in OPS[op].request if f.name in fields] + ["op", "id"]
        assert _parse(req) == (9, op, req)
        head = request_map(op, 9, fields, id_first=True)
        assert list(head)[:2] == ["op", "id"] and head == req


def test_the_client_names_a_field_that_is_missing_or_unknown() -> None:
    fields = dict(VALID_REQUESTS["produce"])
    del fields["partition"]  # optional
    assert list(request_map("produce", 1, fields))[:4] == ["topic", "producer_id", "seq",
                                                           "records"]
    with pytest.raises(BadRequest, match="missing field 'offset'"):
        request_map("read", 1, {"topic": "t", "partition": 0, "max_records": 1})
    with pytest.raises(BadRequest, match="colour"):
        request_map("status", 1, {"colour": "blue"})
    with pytest.raises(NodeError) as info:
        request_map("fly", 1, {})
    assert info.value.code == ErrorCode.UNKNOWN_OP


def test_every_op_has_reply_fields_and_bounded_fields_are_strings_or_bytes() -> None:
    for op in OPS.values():
        assert op.reply, op.name
        names = [f.name for f in op.request]
        assert len(names) == len(set(names)) and not {"op", "id"} & set(names), op.name
        for f in op.request:
            assert not f.len_max or f.types in ((str,), (bytes,)), (op.name, f.name)
            assert not f.non_negative or int in f.types, (op.name, f.name)


def test_the_architecture_doc_carries_the_table_as_the_code_has_it() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md").read_text()
    table = describe()
    assert table in doc, ("docs/ARCHITECTURE.md is out of step with wire.protocol.OPS: paste "
                          "in the output of `python -m wire.protocol`")
    for op in OPS:
        assert f"| `{op}` |" in table


# ---- record batches -----------------------------------------------------------------------


def test_check_batch_accepts_plain_values_and_full_records() -> None:
    recs: list[Record | bytes] = [
        b"plain",
        Record(b"v1", key=b"k1", tags=("a", "b"), timestamp=1234),
        Record(b"v2", key=None, tags=("only-tag",)),
        Record(b"v3", timestamp=0),
        Record(b""),
    ]
    items, bare = check_batch(pack_batch(recs), records_max=10, value_bytes_max=100)
    assert not bare
    assert items == [
        b"plain",
        [b"v1", b"k1", ["a", "b"], 1234],
        [b"v2", None, ["only-tag"], None],
        [b"v3", None, [], 0],
        b"",
    ]


def test_check_batch_accepts_exactly_records_max_records() -> None:
    n = 7
    items, bare = check_batch(pack([b"x"] * n), records_max=n, value_bytes_max=10)
    assert len(items) == n and bare


def test_check_batch_counts_records_not_the_fields_of_a_record() -> None:
    # A structured record is a 4-element array and its tags an array of any length; neither
    # is a "record" for the records_max limit.
    one = pack_batch([Record(b"v", key=b"k", tags=("t",), timestamp=1)])
    assert len(check_batch(one, records_max=1, value_bytes_max=10)[0]) == 1
    many_tags = pack_batch([Record(b"v", tags=tuple(f"t{i}" for i in range(10)))])
    assert len(check_batch(many_tags, records_max=2, value_bytes_max=10)[0]) == 1


def test_an_empty_batch_is_empty_batch() -> None:
    with pytest.raises(BadRequest) as info:
        check_batch(pack([]), records_max=10, value_bytes_max=10)
    assert info.value.code == ErrorCode.EMPTY_BATCH


@pytest.mark.parametrize("n", [11, 12, 500])
def test_more_than_records_max_is_batch_too_large(n: int) -> None:
    with pytest.raises(BadRequest) as info:
        check_batch(pack([b"x"] * n), records_max=10, value_bytes_max=10)
    assert info.value.code == ErrorCode.BATCH_TOO_LARGE


@pytest.mark.parametrize("form", ["plain", "full"])
def test_a_value_over_value_bytes_max_is_rejected(form: str) -> None:
    limit = 16
    ok: Any = b"v" * limit
    big: Any = b"v" * (limit + 1)
    if form == "full":
        ok, big = [ok, b"k", [], None], [big, b"k", [], None]
    assert check_batch(pack([ok]), records_max=4, value_bytes_max=limit)[0] == [ok]
    with pytest.raises(BadRequest) as info:
        check_batch(pack([b"small", big]), records_max=4, value_bytes_max=limit)
    assert info.value.code == ErrorCode.BAD_REQUEST
    assert "record 1" in info.value.message


@pytest.mark.parametrize(("items", "bare"), [
    ([b"a", b"bc", b"x" * 16], True),  # at the bound
    ([b"a", b"x" * 17], False),  # one longer: unpacked again, whole
    ([b"a", "a str"], False),
    ([b"a", [b"v", None, [], None]], False),
    ([b"a", None], False),
    ([], False),
])
def test_unpack_values_tells_bare_values_within_the_bound(items: list[Any], bare: bool) -> None:
    for use_list in (True, False):
        got, is_bare = unpack_values(pack(items), 16, use_list=use_list)
        assert is_bare is bare
        assert got == msgpack.unpackb(pack(items), raw=False, use_list=use_list)


def test_unpack_values_raises_what_msgpack_raises_for_what_is_not_msgpack() -> None:
    with pytest.raises(msgpack.FormatError):
        unpack_values(b"\xc1", 16)
    assert unpack_values(pack(5), 16) == (5, False)


@pytest.mark.parametrize(
    "item",
    [
        "a string value",
        5,
        None,
        [b"v", None, []],  # three fields
        [b"v", None, [], None, 1],  # five fields
        ["v", None, [], None],  # value not bin
        [b"v", "k", [], None],  # key not bin
        [b"v", None, "tag", None],  # tags not an array
        [b"v", None, [b"tag"], None],  # a tag not str
        [b"v", None, [], -1],  # negative timestamp
        [b"v", None, [], 1.5],  # float timestamp
        [b"v", None, [], True],  # bool timestamp
        {"value": b"v"},
    ],
)
def test_records_of_the_wrong_shape_or_type_are_bad_requests(item: Any) -> None:
    with pytest.raises(BadRequest) as info:
        check_batch(pack([b"fine", item]), records_max=4, value_bytes_max=100)
    assert info.value.code == ErrorCode.BAD_REQUEST
    assert "record 1" in info.value.message


@pytest.mark.parametrize("blob", [b"\xc1", pack({"a": 1}), pack(b"bytes"), b""],
                         ids=["not-msgpack", "map", "bin", "empty"])
def test_a_batch_that_is_not_an_array_is_a_bad_request(blob: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        check_batch(blob, records_max=4, value_bytes_max=100)
    assert info.value.code == ErrorCode.BAD_REQUEST


# ---- error codes ----------------------------------------------------------------------------

EXPECTED_CLASS: dict[ErrorCode, type[NodeError]] = {
    ErrorCode.BAD_REQUEST: BadRequest,
    ErrorCode.UNKNOWN_OP: BadRequest,
    ErrorCode.FRAME_TOO_LARGE: BadRequest,
    ErrorCode.EMPTY_BATCH: BadRequest,
    ErrorCode.BATCH_TOO_LARGE: BadRequest,
    ErrorCode.INVALID_NAME: BadRequest,
    ErrorCode.UNKNOWN_TOPIC: UnknownTopic,
    ErrorCode.UNKNOWN_PARTITION: UnknownPartition,
    ErrorCode.TOPIC_EXISTS: TopicExists,
    ErrorCode.NOT_OWNER: errors.NotOwner,
    ErrorCode.CROSS_NODE: errors.CrossNode,
    ErrorCode.STALE_SEQUENCE: StaleSequence,
    ErrorCode.BUSY: Busy,
    ErrorCode.TIMEOUT: RequestTimeout,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.INTERNAL: NodeError,
    ErrorCode.TXN_UNKNOWN: errors.UnknownTransaction,
    ErrorCode.TXN_STATE: errors.TransactionError,
    ErrorCode.TXN_TIMED_OUT: errors.TransactionTimedOut,
    ErrorCode.TXN_LIMIT: errors.TransactionLimit,
    ErrorCode.TXN_ABORTED: errors.TransactionAborted,
    ErrorCode.TXN_CONFLICT: errors.TransactionConflict,
    ErrorCode.OFFSET_OUT_OF_RANGE: errors.OffsetOutOfRange,
    ErrorCode.XAER_NOTA: errors.XAERNota,
    ErrorCode.XAER_PROTO: errors.XAERProto,
    ErrorCode.XAER_DUPID: errors.XAERDupid,
    ErrorCode.XAER_INVAL: errors.XAERInval,
    ErrorCode.XA_RBTIMEOUT: errors.XARBTimeout,
    ErrorCode.XA_RBROLLBACK: errors.XARBRollback,
    ErrorCode.XAER_RMERR: errors.XAError,
}


def test_expected_classes_cover_every_code() -> None:
    assert set(EXPECTED_CLASS) == set(ErrorCode)


@pytest.mark.parametrize("code", list(ErrorCode), ids=[c.name for c in ErrorCode])
def test_error_for_gives_the_class_for_the_code(code: ErrorCode) -> None:
    err = error_for(int(code), "what went wrong")
    assert isinstance(err, EXPECTED_CLASS[code])
    assert err.code == code
    assert err.message == "what went wrong"
    assert str(err) == f"{code.name}: what went wrong"


def test_error_for_an_unknown_code_is_internal_and_keeps_the_number() -> None:
    unknown = max(ErrorCode) + 1000
    err = error_for(unknown, "odd")
    assert type(err) is NodeError
    assert err.code == ErrorCode.INTERNAL
    assert str(unknown) in err.message and "odd" in err.message


def test_subclass_codes_are_not_shared_between_instances() -> None:
    a = error_for(ErrorCode.EMPTY_BATCH, "a")
    b = BadRequest("b")
    assert a.code == ErrorCode.EMPTY_BATCH
    assert b.code == ErrorCode.BAD_REQUEST
    assert BadRequest.code == ErrorCode.BAD_REQUEST


# ---- several requests or replies in one frame --------------------------------------------


def _status(rid: int) -> bytes:
    return pack({"op": "status", "id": rid})


def test_a_frame_of_several_requests_is_parsed_in_order() -> None:
    frame = _status(1) + pack({"op": "frobnicate", "id": 2}) + _status(3)
    out = parse_requests(frame, FRAME_MAX)
    assert [o[:2] if isinstance(o, tuple) else ("error", request_id(o))
            for o in out] == [(1, "status"), ("error", 2), (3, "status")]
    assert isinstance(out[1], NodeError) and out[1].code == ErrorCode.UNKNOWN_OP


def test_one_request_frame_parses_like_parse_request() -> None:
    assert parse_requests(_status(5), FRAME_MAX) == [parse_request(_status(5), FRAME_MAX)]


@pytest.mark.parametrize("tail, words", [(b"\xc1\xc1", "not msgpack"),
                                         (_status(3)[:-2], "ends inside a message")])
def test_bytes_that_do_not_decode_end_the_frame_with_one_error(tail: bytes, words: str) -> None:
    out = parse_requests(_status(1) + _status(2) + tail, FRAME_MAX)
    assert [o[0] if isinstance(o, tuple) else o for o in out[:2]] == [1, 2]
    (err,) = out[2:]
    assert isinstance(err, NodeError) and err.code == ErrorCode.BAD_REQUEST
    assert words in err.message and request_id(err) == 0


def test_an_empty_frame_is_answered() -> None:
    (err,) = parse_requests(b"", FRAME_MAX)
    assert isinstance(err, NodeError) and "empty" in err.message


def test_a_frame_past_the_request_limit_stops_with_one_error() -> None:
    frame = b"".join(_status(i) for i in range(1, 8))
    out = parse_requests(frame, FRAME_MAX, requests_max=5)
    assert [o[0] if isinstance(o, tuple) else o for o in out[:5]] == [1, 2, 3, 4, 5]
    (err,) = out[5:]
    assert isinstance(err, NodeError) and request_id(err) == 6
    assert "at most 5 requests" in err.message


def test_a_frame_of_requests_over_the_byte_limit_is_frame_too_large() -> None:
    frame = _status(1) + _status(2)
    errs = parse_requests(frame, len(frame) - 1)  # each under its own id, none decoded
    assert [(getattr(e, "request_id", None), getattr(e, "code", None)) for e in errs] == [
        (1, ErrorCode.FRAME_TOO_LARGE), (2, ErrorCode.FRAME_TOO_LARGE)]
    # No id to be found (not a map; an id that is no integer; not msgpack): once, id 0.
    for bad in (pack([1, 2]) + b"x" * 10, pack({"id": "7", "op": "status"}), b"\xc1" * 10):
        (err,) = parse_requests(bad, 5)
        assert isinstance(err, NodeError) and err.code == ErrorCode.FRAME_TOO_LARGE
        assert getattr(err, "request_id", None) == 0


def test_joined_replies_come_apart_in_order_and_respect_the_byte_bound() -> None:
    replies = [pack({"id": i, "ok": True, "pad": b"x" * (10 * i)}) for i in range(1, 30)]
    frames = join_frames(replies, bytes_max=300)
    assert len(frames) > 1
    for f in frames:  # a frame holds one reply, or several that fit in the bound
        assert len(f) <= 300 or len(unpack_replies(f)) == 1
    assert [r["id"] for f in frames for r in unpack_replies(f)] == list(range(1, 30))
    assert join_frames(replies[:1]) == replies[:1]


def test_a_reply_frame_cut_short_is_an_error() -> None:
    frame = pack({"id": 1, "ok": True}) + pack({"id": 2, "ok": True})
    with pytest.raises(ValueError, match="inside a message"):
        unpack_replies(frame[:-1])


def test_a_reply_frame_holding_anything_but_maps_is_an_error() -> None:
    """A node answers with maps only: a frame with any other value in it (a wrong peer, a
    protocol bug) is not trusted, alone or among replies (such values used to be skipped)."""
    reply = pack({"id": 1, "ok": True})
    for frame, at in ((pack([1, 2]), 0), (reply + pack("stray"), len(reply)),
                      (pack(7) + reply, 0), (pack(None), 0)):
        with pytest.raises(ValueError, match=f"at byte {at}: not a reply map"):
            unpack_replies(frame)


# ---- wire/packer.py: msgpack with a Packer kept per thread ----------------------------------

PACKED_SAMPLES: list[Any] = [
    None, True, 0, -1, 2**63, 1.5, "", "text", b"", b"\x00" * 300, [], (), {},
    (123, None, (), b"v" * 100), {"id": 7, "ok": True, "value": b"x"}, [[1, b"k", ("t",), 5]],
]


@pytest.mark.parametrize("obj", PACKED_SAMPLES)
def test_pack_gives_the_bytes_of_packb(obj: Any) -> None:
    assert packer.pack(obj) == msgpack.packb(obj, use_bin_type=True)


def test_pack_after_a_failure_and_after_a_large_object_packs_correctly() -> None:
    with pytest.raises(TypeError):
        packer.pack([1, object()])  # the Packer's half-written buffer must not leak into the next
    assert msgpack.unpackb(packer.pack([7, b"ab"])) == [7, b"ab"]
    big = b"z" * (packer.PACKER_KEPT_BYTES_MAX + 1)
    assert msgpack.unpackb(packer.pack(big)) == big
    assert packer.pack((1, b"a")) == msgpack.packb((1, b"a"), use_bin_type=True)


def test_threads_packing_at_once_each_get_their_own_bytes() -> None:
    failures: list[int] = []

    def work(n: int) -> None:
        for i in range(20_000):
            obj = [n, i, b"%d-%d" % (n, i)]
            if msgpack.unpackb(packer.pack(obj)) != obj:
                failures.append(n)
                return

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures and not any(t.is_alive() for t in threads)


BIG = b"B" * packer.JOIN_BYTES_MIN


@pytest.mark.parametrize("obj", [
    *PACKED_SAMPLES,
    BIG, [BIG], (1, BIG, b"small", [BIG + b"x", (2, BIG)]), [list(range(20)), [BIG] * 17],
    [7, [(1, 2, [(3, 0, 5, BIG)])] * 3, []], [b"s"] * 70_000,
])
def test_pack_joined_gives_the_bytes_of_packb(obj: Any) -> None:
    assert packer.pack_joined(obj) == msgpack.packb(obj, use_bin_type=True)


def test_messages_with_large_values_encode_as_packb_would() -> None:
    """Large values are joined in (``pack_joined``), small messages packed whole: the same
    bytes either way, and they decode to the same message."""
    from wire.messages import Bundle, LogGroup, RecordsReply, TxnWrite, Writes
    samples: list[Any] = [
        LogGroup(1, 2, BIG), LogGroup(1, 2, b"small"), RecordsReply(9, BIG, 3, 2),
        Bundle([BIG, b"x", BIG]), Bundle([b"x"] * 3),
        TxnWrite(5, 6, 0, ((1, 0, 3, BIG),), ()),
        Writes((1, 2), ((7, 1, ((3, 0, 10, BIG), (3, 1, 1, b"v"))),), ((1, b"other"),)),
    ]
    for msg in samples:
        fields = [msg.TAG, *(getattr(msg, f) for f in msg.__slots__)]
        assert codec.encode(msg) == msgpack.packb(fields, use_bin_type=True)
        assert codec.decode(codec.encode(msg)) == msg


@pytest.mark.parametrize("records", [
    [b"r" * 10, b"s" * 20],  # under JOIN_BYTES_MIN in all: packed as one small group
    [BIG], [BIG, b"small", BIG], [b"x" * 1000] * 70, [b"x"] * (packer.JOIN_BYTES_MIN + 1),
])
def test_a_log_group_from_its_records_is_the_frame_of_their_join(records: list[bytes]) -> None:
    """The log manager hands on merged groups as records (``encode_log_group``): the bytes
    of the ``LogGroup`` of their join, decoding to it."""
    from wire.messages import LogGroup, encode_log_group
    group = LogGroup(3, 9, b"".join(records))
    assert encode_log_group(3, 9, records) == codec.encode(group)
    assert codec.decode(encode_log_group(3, 9, records)) == group


def test_pack_map_joins_large_values_and_gives_packb_s_bytes() -> None:
    for fields in ({"id": 1, "records": BIG, "ok": True}, {"id": 1, "records": b"small"}, {}):
        assert packer.pack_map(fields) == msgpack.packb(fields, use_bin_type=True)


def test_a_batch_of_bare_values_packs_as_records_do() -> None:
    values = [b"a", b"", b"x" * 300]
    assert pack_batch(values) == pack(values)
    assert pack_batch(values) == pack_batch([Record(v) for v in values])  # bare either way
    assert pack_batch(iter(values)) == pack(values)
    mixed: list[Any] = [b"a", Record(b"b", key=b"k"), bytearray(b"c")]
    assert msgpack.unpackb(pack_batch(mixed)) == [b"a", [b"b", b"k", [], None], b"c"]


def test_the_largest_requests_the_table_allows_decode_within_the_bound() -> None:
    """``REQUEST_ITEMS_MAX`` bounds what a request decodes to; the largest the table allows
    (a txn_once of every write it may carry, each of the most fields) stays within it."""
    write = {"op": "txn_commit_offset", "group": "g", "topic": "t", "partition": 0,
             "offset": 1}
    rid, op, fields = _parse({"op": "txn_once", "id": 3, "txn": 6,
                              "writes": [write] * TXN_ONCE_WRITES_MAX})
    assert (rid, op, len(fields["writes"])) == (3, "txn_once", TXN_ONCE_WRITES_MAX)
    records = [[b"v", b"k", ["t"] * TAGS_PER_RECORD_MAX, 1]] * 50  # each the most it may
    items, bare = check_batch(pack(records), 50, 10)
    assert len(items) == 50 and not bare


@pytest.mark.parametrize("evil", [
    [[]] * (REQUEST_ITEMS_MAX + 1),  # one array longer than the bound
    [[[]] * 64] * 64,  # arrays within it, their items over it
    {"op": "status", "id": 1, "x": [{}] * 4000},  # maps
    {f"k{i}": 1 for i in range(REQUEST_MAP_LEN_MAX + 1)},  # one map longer than its bound
    [["ab"] * REQUEST_ARRAY_LEN_MAX] * 20,  # items over the bound, each array within its own
])
def test_a_request_decoding_to_more_items_than_any_request_holds_ends_the_frame(
        evil: Any) -> None:
    """One request's maps and arrays are bounded as they are decoded: a frame of empty
    arrays became a list each (64 bytes of memory a byte of the frame). The requests
    before it in the frame are read; it and the rest are not."""
    good = pack({"op": "status", "id": 8})
    out = parse_requests(good + pack(evil) + good, FRAME_MAX)
    first, err = out
    assert isinstance(first, tuple) and first[:2] == (8, "status")
    assert isinstance(err, NodeError) and err.code == ErrorCode.BAD_REQUEST
    assert "request 2 of the frame decodes to more than any request holds" in err.message
    (alone,) = parse_requests(pack(evil), FRAME_MAX)
    assert isinstance(alone, NodeError) and "request 1 of the frame" in alone.message


def test_a_batch_over_its_count_is_batch_too_large_however_far_over() -> None:
    """Far enough over, a batch's records trip the decoding's bounds first: the count its
    array's header says still decides the answer."""
    for n in (11, 1000, 100_000):
        with pytest.raises(BadRequest) as info:
            check_batch(pack([b"v"] * n), 10, 10)
        assert info.value.code == ErrorCode.BATCH_TOO_LARGE
        assert info.value.message == f"batch has {n} records; the limit is 10"


@pytest.mark.parametrize("records", [
    [[[]] * 70] * 100,  # records within the count, each an array of 70 empty arrays
    [[[[]] * 70] * 4] * 90,  # records within the count, nested past what one may hold
])
def test_records_decoding_to_more_than_a_batch_holds_are_refused(records: Any) -> None:
    with pytest.raises(BadRequest) as info:
        check_batch(pack(records), 100, 10)
    assert "records decode to more than a batch holds" in info.value.message
