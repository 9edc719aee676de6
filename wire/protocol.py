"""The client protocol: msgpack maps over ZeroMQ, one or more per frame.

A request is ``{"op": str, "id": int, ...fields}``; the client picks ``id`` and the reply
carries it back, so many requests can be in flight on one DEALER socket. A reply is
``{"id": int, "ok": true, ...}`` or ``{"id": int, "ok": false, "code": int, "error": str}``.

A frame carries one map, or several concatenated (as Redis pipelines commands on one
stream): at most ``REQUESTS_PER_FRAME_MAX`` requests from a client, and as many replies as
the node had ready for that client at once, up to ``REPLY_FRAME_BYTES_MAX`` (a larger reply
travels alone). Each request is still answered by its own reply; the frame only saves a
ZeroMQ message per request on both ends.

``REQUESTS`` below is the whole request schema; ``parse_request`` checks a decoded map
against it and names the first field that is wrong.
"""

from __future__ import annotations

import re
from typing import Any

import msgpack

from wire.errors import BadRequest, ErrorCode, NodeError
from wire.records import KEY_BYTES_MAX, TAG_BYTES_MAX

DEFAULT_PORT = 7400
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
OFFSET_MAX = 2**63 - 1
REQUESTS_PER_FRAME_MAX = 1024  # a client's Pipeline keeps at most this many in flight
REPLY_FRAME_BYTES_MAX = 262144  # replies are joined into one frame up to this size

_INT = (int,)
_OPT_INT = (int, type(None))
_STR = (str,)
_BIN = (bytes,)

# op → {field: (accepted types, required)}
REQUESTS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "produce": {
        "topic": (_STR, True),
        "partition": (_OPT_INT, False),
        "producer_id": (_INT, True),
        "seq": (_INT, True),
        "records": (_BIN, True),
    },
    "create_topic": {"name": (_STR, True), "partitions": (_INT, True)},
    "delete_topic": {"name": (_STR, True)},
    "list_topics": {},
    "read": {
        "topic": (_STR, True),
        "partition": (_INT, True),
        "offset": (_INT, True),
        "max_records": (_INT, True),
    },
    "read_by_key": {"topic": (_STR, True), "partition": (_INT, True), "key": (_BIN, True)},
    "read_by_tag": {
        "topic": (_STR, True),
        "partition": (_INT, True),
        "tag": (_STR, True),
        "offset": (_INT, True),
        "max_records": (_INT, True),
    },
    "offset_for_timestamp": {
        "topic": (_STR, True),
        "partition": (_INT, True),
        "timestamp": (_INT, True),
    },
    "commit_offset": {
        "group": (_STR, True),
        "topic": (_STR, True),
        "partition": (_INT, True),
        "offset": (_INT, True),
    },
    "committed_offset": {"group": (_STR, True), "topic": (_STR, True), "partition": (_INT, True)},
    "status": {},
    "checkpoint": {},
}

# Fields bounded in length (the same bounds as records' keys and tags in wire.records).
_BYTES_MAX = {"key": KEY_BYTES_MAX, "tag": TAG_BYTES_MAX, "group": 200, "name": 200,
              "topic": 200}

# Integer fields that must not be negative.
_NON_NEGATIVE = ("partition", "offset", "max_records", "timestamp", "seq", "producer_id")

# The schema above, unrolled per op once so that checking a request is one pass over its
# fields: (name, accepted types, required, must not be negative), and the bounded fields.
_CHECKS = {op: [(name, types, required, name in _NON_NEGATIVE)
                for name, (types, required) in fields.items()]
           for op, fields in REQUESTS.items()}
_BOUNDED = {op: [(name, _BYTES_MAX[name]) for name in fields if name in _BYTES_MAX]
            for op, fields in REQUESTS.items()}


def parse_request(frame: bytes, frame_bytes_max: int) -> tuple[int, str, dict[str, Any]]:
    """Decode and check a frame of exactly one request; return ``(id, op, fields)``.

    Raises ``NodeError`` with the request id (when it could be read) in ``.request_id``.
    """
    first, *rest = parse_requests(frame, frame_bytes_max, requests_max=1)
    if isinstance(first, NodeError):
        raise first
    if rest:  # anything after the one request ends the frame with an error
        err = rest[0]
        assert isinstance(err, NodeError)
        raise err
    return first


def parse_requests(frame: bytes, frame_bytes_max: int,
                   requests_max: int = REQUESTS_PER_FRAME_MAX,
                   ) -> list[tuple[int, str, dict[str, Any]] | NodeError]:
    """Decode and check every request of a frame, in order: each one parsed, or the error
    to answer it with. Bytes that do not decode end the frame with one error."""
    if len(frame) > frame_bytes_max:
        return [_error(0, ErrorCode.FRAME_TOO_LARGE,
                       f"request of {len(frame)} bytes is over the limit of {frame_bytes_max}")]
    if not frame:
        return [_error(0, ErrorCode.BAD_REQUEST, "request is not msgpack: the frame is empty")]
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(frame))
    unpacker.feed(frame)
    out: list[tuple[int, str, dict[str, Any]] | NodeError] = []
    end = 0  # where the last whole request ended (``tell`` runs on into a partial one)
    try:
        for req in unpacker:
            end = unpacker.tell()
            if len(out) >= requests_max:
                rid = req.get("id") if type(req) is dict else None
                out.append(_error(rid if type(rid) is int else 0, ErrorCode.BAD_REQUEST,
                                  f"a frame carries at most {requests_max} requests; "
                                  f"this one and the rest of the frame were not read"))
                return out
            try:
                out.append(check_request(req))
            except NodeError as exc:
                out.append(exc)
    except Exception as exc:
        why = str(exc) or type(exc).__name__
        out.append(_error(0, ErrorCode.BAD_REQUEST, f"request is not msgpack: {why}"))
        return out
    if end != len(frame):
        out.append(_error(0, ErrorCode.BAD_REQUEST, "request is not msgpack: the frame ends "
                          "inside a message"))
    return out


def check_request(req: Any) -> tuple[int, str, dict[str, Any]]:
    """Check one decoded request against the schema; return ``(id, op, fields)``."""
    if type(req) is not dict:
        raise _error(0, ErrorCode.BAD_REQUEST, "request must be a msgpack map")
    rid = req.get("id")
    if type(rid) is not int:
        raise _error(0, ErrorCode.BAD_REQUEST, "request needs an integer 'id'")
    op = req.get("op")
    checks = _CHECKS.get(op) if type(op) is str else None
    if checks is None or not isinstance(op, str):
        raise _error(rid, ErrorCode.UNKNOWN_OP, f"unknown op {op!r}; known: {sorted(REQUESTS)}")
    present = 2  # "op" and "id"
    for name, types, required, non_negative in checks:
        if name not in req:
            if required:
                raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: missing field '{name}'")
            continue
        present += 1
        value = req[name]
        if type(value) not in types:
            want = " or ".join("nil" if t is type(None) else t.__name__ for t in types)
            raise _error(rid, ErrorCode.BAD_REQUEST,
                         f"{op}: field '{name}' must be {want}, got {type(value).__name__}")
        if non_negative and type(value) is int and not 0 <= value <= OFFSET_MAX:
            raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: field '{name}' is out of range")
    if len(req) != present:
        extra = set(req) - set(REQUESTS[op]) - {"op", "id"}
        raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: unknown fields {sorted(map(repr, extra))}")
    for name, limit in _BOUNDED[op]:
        value = req.get(name)
        if isinstance(value, (str, bytes)) and len(value) > limit:
            raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: field '{name}' is longer than {limit}")
    return rid, op, req


def unpack_replies(frame: bytes) -> list[dict[str, Any]]:
    """Every reply map of a frame (the node may join several into one)."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(frame) or 1)
    unpacker.feed(frame)
    replies = []
    end = 0
    for reply in unpacker:
        end = unpacker.tell()
        if type(reply) is dict:
            replies.append(reply)
    if end != len(frame):
        raise ValueError("reply frame ends inside a message")
    return replies


def join_frames(frames: list[bytes], bytes_max: int = REPLY_FRAME_BYTES_MAX) -> list[bytes]:
    """Concatenate encoded maps into as few frames as keep each under ``bytes_max``
    (a map larger than that travels alone)."""
    if len(frames) == 1:
        return frames
    out: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for f in frames:
        if run and size + len(f) > bytes_max:
            out.append(b"".join(run))
            run, size = [], 0
        run.append(f)
        size += len(f)
    if run:
        out.append(b"".join(run))
    return out


def _error(rid: int, code: ErrorCode, text: str) -> NodeError:
    err = NodeError(text, code)
    err.request_id = rid  # type: ignore[attr-defined]
    return err


def check_name(what: str, name: str) -> None:
    if not NAME_RE.match(name):
        raise BadRequest(
            f"{what} {name!r} is not valid: 1-200 characters of letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit", ErrorCode.INVALID_NAME)


def ok(rid: int, **fields: Any) -> bytes:
    fields["id"] = rid
    fields["ok"] = True
    return bytes(msgpack.packb(fields, use_bin_type=True))


def error(rid: int, code: int, text: str) -> bytes:
    return bytes(msgpack.packb({"id": rid, "ok": False, "code": int(code), "error": text},
                               use_bin_type=True))
