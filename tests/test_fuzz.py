"""A seeded fuzz of the client protocol against a real node: bad input gets a clear error
code and message, and the node keeps serving.

Requests are built from every op of ``wire.protocol.OPS`` (its fields' names, types and
bounds): valid ones, and mutations of them — a field dropped, a field of another msgpack
type, an integer at the edges of msgpack's range (msgpack has no encoding past 64 bits:
-2**63 and 2**64 - 1 are as far as a client can go), a string or bin over its bound, an
unknown field, nested garbage, a produce's ``records`` blob corrupted (truncated, random
bytes, wrong shapes), a transaction's ``xid`` or ``writes`` malformed, ``id`` missing or
not an integer, ``op`` unknown, values that are not maps, bytes that are not msgpack. They
go out on a raw DEALER socket, one to a frame or several (``wire.protocol``), with frames
of two parts and frames over ``frame_bytes_max`` now and then.

Checked: every request with an integer id is answered exactly once under it, and every
other part of a frame by one answer with id 0 (a frame is read as the protocol reads it:
one answer per map without an integer id or value that is not a map, one for bytes that
do not decode, which end the frame); an error carries a known code, never INTERNAL (an
exception the node did not handle), and a message; a request the table refuses is
refused; an accepted one carries the table's reply fields. Once every answer came, the
front door holds no request (one it forgot would be answered again, TIMEOUT, when its
time is up). Then the node creates a topic, produces and reads back, and no actor has
restarted. An export is done: the fuzz's first valid one goes to a fresh directory (and
others at random).

A failure names its seed and the request. Each seed names its own topics, namespaces,
transactions and xids, so ``-k 'seed-2'`` replays one on a new node.
tests/test_fuzz_cluster.py sends the same fuzz to both members of a cluster.
"""

from __future__ import annotations

import collections
import itertools
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from node.client import NodeClient
from node.local import LocalNode
from tests.conftest import module_node
from wire.errors import ErrorCode
from wire.protocol import KV_PREFIX, OFFSET_MAX, OPS, Field, unpack_replies
from wire.records import (
    KEY_BYTES_MAX,
    TAG_BYTES_MAX,
    TAGS_PER_RECORD_MAX,
    TIMESTAMP_MAX,
    Record,
)
from wire.xid import FORMAT_ID_MAX, XID_PART_BYTES_MAX

FRAME_MAX = 256 * 1024
BATCH_RECORDS_MAX = 100
VALUE_BYTES_MAX = 1000
PARTITIONS_MAX = 1024  # limits.partitions_max, the default
# Its [limits] table comes last: tests/test_fuzz_cluster.py adds to it.
CONFIG = f"""
[limits]
frame_bytes_max = {FRAME_MAX}
batch_records_max = {BATCH_RECORDS_MAX}
value_bytes_max = {VALUE_BYTES_MAX}
"""

SEEDS = (1, 2, 3)
REQUESTS_PER_SEED = 1000
IN_FLIGHT_MAX = 200  # answers awaited before more is sent
ANSWER_WAIT_MS = 15_000  # past request_timeout_ms (10 s), after which the node says TIMEOUT
STATUS_POLL_MS = 50  # how often the front door's figures are asked for after the fuzz
# How long a report of the front door with no request in flight is waited for (it reports
# every second); well under request_timeout_ms, after which a forgotten one is answered.
IDLE_WAIT_S = 5.0
OWN_IDS = 2**62  # the ids of the exchange's own requests start here, past the fuzzer's
# How often an op is picked, against 1 for the others: those that flush or copy every
# shard are picked less (each takes a while, and they say nothing new after a few).
OP_WEIGHTS = {"checkpoint": 0.2, "compact": 0.2, "stats": 0.3, "snapshot_export": 0.5}

INTS_EXTREME = (-1, -(2**31), -(2**63), 2**31, 2**32, OFFSET_MAX, 2**63, 2**64 - 1)
TEXT = "abcXYZ019._- :/é\x00\u2603\U0001f600\n"
KEYS = (b"k0", b"k1", b"k2", b"\x00\xff")
TAGS = ("a", "b", "é")
TAG_EDGE = "é" * (TAG_BYTES_MAX // 2)  # a tag of the most bytes a record may carry
KNOWN_CODES = frozenset(int(code) for code in ErrorCode)


@dataclass(frozen=True, slots=True)
class Sent:
    """A request sent: its text (for a failure's message), its op when it names one of the
    table, and whether the table refuses it (a mutation no valid request has)."""

    what: str
    op: str | None
    refused: bool


@dataclass(slots=True)
class Frame:
    """A message to send: its parts (one, unless a message of two is the test), and the
    requests built into it with an integer id."""

    parts: list[bytes]
    built: dict[int, Sent] = field(default_factory=dict)
    undecodable_tail: bool = False  # its last bytes are garbage made not to decode whole


@dataclass(frozen=True, slots=True)
class World:
    """What one seed's requests name, made before its fuzz where they must exist: a topic
    on RocksDB, one in memory and one with retention (2 partitions or more each), spare
    topic and namespace names to create and delete, transaction ids and xids. The node's
    ``data_dir`` is where no export may go; ``exports``, where they may (a fresh directory
    under it each)."""

    seed: int
    data_dir: Path
    exports: Path

    @property
    def topic(self) -> str:
        return f"fz{self.seed}"

    @property
    def memory(self) -> str:
        return f"fz{self.seed}-mem"

    @property
    def retained(self) -> str:
        return f"fz{self.seed}-ret"

    @property
    def spares(self) -> list[str]:
        return [f"fz{self.seed}-new{i}" for i in range(3)]

    @property
    def namespaces(self) -> list[str]:
        return [f"fz{self.seed}kv{i}" for i in range(3)]

    @property
    def txns(self) -> list[int]:
        return [self.seed * 1000 + i for i in range(1, 21)]

    @property
    def xids(self) -> list[list[Any]]:
        return [[self.seed, b"g%d" % i, b"b"] for i in range(4)]

    def make(self, c: NodeClient) -> None:
        c.create_topic(self.topic, partitions=3)
        c.create_topic(self.memory, partitions=2, storage="memory")
        c.create_topic(self.retained, partitions=2, retention_ms=3_600_000)
        for name in (self.topic, self.memory, self.retained):
            c.produce_batch(name, [Record(b"v%d" % i, key=KEYS[i % 3], tags=(TAGS[i % 3],),
                                          timestamp=1000 * i) for i in range(6)])
        c.kv_put(self.namespaces[0], b"k0", b"v0")


class Fuzzer:
    """Frames of requests, valid and mutated, drawn from ``random.Random(seed)``; another
    ``stream`` than 0 draws others from the same seed (one for each member of a cluster).
    ``weights``: how often an op is picked after the first round, against 1 for an op it
    does not name (tests/test_fuzz_blocking.py picks checkpoints and transactions more)."""

    def __init__(self, world: World, stream: int = 0,
                 weights: Mapping[str, float] = OP_WEIGHTS) -> None:
        self.rng = random.Random(world.seed if stream == 0 else f"{world.seed}/{stream}")
        self.w = world
        self.stream = stream
        self.exports = 0  # exports asked for into a fresh directory
        self.ids = itertools.count(1)
        self.ops = sorted(OPS)
        self.weights = [weights.get(op, 1.0) for op in self.ops]
        # Every op goes out as the table has it and mutated first, then ops drawn at random.
        self.first = [(op, mutated) for op in self.ops for mutated in (False, True)]

    # ---- values --------------------------------------------------------------------

    def text(self, n: int) -> str:
        return "".join(self.rng.choice(TEXT) for _ in range(n))

    def scalar(self) -> Any:
        r = self.rng
        makers: list[Callable[[], Any]] = [
            lambda: r.choice(INTS_EXTREME), lambda: r.randint(-5, 5), lambda: self.text(3),
            lambda: r.randbytes(3), lambda: None, lambda: r.random() < 0.5,
            lambda: r.choice([0.0, -1.5, 1e300, float("inf"), float("nan")]),
            lambda: msgpack.ExtType(r.randrange(128), r.randbytes(2)),
            lambda: msgpack.Timestamp(r.randrange(2**32)),
        ]
        return r.choice(makers)()

    def garbage(self, depth: int = 0) -> Any:
        """A value of any msgpack shape, nested up to a few levels."""
        r = self.rng
        if depth >= 4 or r.random() < 0.3:
            return self.scalar()
        if r.random() < 0.5:
            return [self.garbage(depth + 1) for _ in range(r.randint(0, 3))]
        return {self.map_key(): self.garbage(depth + 1) for _ in range(r.randint(0, 3))}

    def map_key(self) -> Any:
        """A map key msgpack reads back as a hashable value."""
        r = self.rng
        makers: list[Callable[[], Any]] = [
            lambda: self.text(2), lambda: r.randint(-3, 3), lambda: r.randbytes(2),
            lambda: None, lambda: True, lambda: 1.5]
        return r.choice(makers)()

    def nested(self) -> Any:
        """Garbage no field takes: a map, or an array whose first element is an array (an
        xid starts with an int, and each of txn_once's writes is a map)."""
        if self.rng.random() < 0.5:
            return {self.map_key(): self.garbage(1)}
        return [[self.garbage(2)], *(self.garbage(1) for _ in range(self.rng.randint(0, 2)))]

    def of_another_type(self, types: tuple[type, ...]) -> Any:
        """A value whose msgpack type is none of ``types`` (a bool is not an int here, as
        it is not on the wire)."""
        r = self.rng
        makers: list[tuple[type, Callable[[], Any]]] = [
            (int, lambda: r.choice((*INTS_EXTREME, 0, 1))), (str, lambda: self.text(4)),
            (bytes, lambda: r.randbytes(4)), (list, lambda: [r.randint(0, 3)]),
            (dict, lambda: {"a": 1}), (type(None), lambda: None),
            (bool, lambda: r.random() < 0.5), (float, lambda: r.choice([0.0, 2.5, 1e30])),
            (msgpack.ExtType, lambda: msgpack.ExtType(1, b"x"))]
        return r.choice([make for t, make in makers if t not in types])()

    def batch(self) -> bytes:
        """A valid batch: small records mostly, some at the bounds (a value, key or tag of
        the most bytes, the most tags, the latest timestamp)."""
        r = self.rng
        records: list[Any] = []
        for _ in range(r.randint(1, 5)):
            edge = r.random() < 0.1
            value = b"v" * VALUE_BYTES_MAX if edge else r.randbytes(r.randint(0, 40))
            if r.random() < 0.5:
                records.append(value)
                continue
            key = b"k" * KEY_BYTES_MAX if edge else r.choice((None, *KEYS))
            tags = (r.choice([[TAG_EDGE], ["t"] * TAGS_PER_RECORD_MAX]) if edge
                    else r.sample(TAGS, r.randint(0, 2)))
            records.append([value, key, tags, r.choice((None, r.randrange(2 * 10**12), 0,
                                                        TIMESTAMP_MAX))])
        return bytes(msgpack.packb(records))

    def bad_batch(self) -> tuple[bytes, bool]:
        """A corrupted ``records`` blob, and whether it is surely refused (random bytes may
        happen to be a batch)."""
        r = self.rng
        good = self.batch()
        kind = r.randrange(4)
        if kind == 0:
            return good[:r.randrange(len(good))], True  # truncated
        if kind == 1:
            return r.randbytes(r.randint(1, 30)), False
        if kind == 2:
            return b"\x91" * r.randint(100, 3000) + b"\xc0", True  # nested deeper than it reads
        shapes: list[Any] = [
            {}, {"value": b"x"}, 5, "records", b"x", None, [], [1, 2], [[b"v"]],
            [[b"v", None, [], None, 5]], [[1, None, [], None]], [[b"v", 5, [], None]],
            [[b"v", None, "tag", None]], [[b"v", None, [1], None]], [[b"v", None, [], -1]],
            [[b"v", None, [], "ts"]], [[b"v", None, [], 2**64 - 1]], [[b"v", None, [], 1.5]],
            [b"x"] * (BATCH_RECORDS_MAX + 1), [b"x" * (VALUE_BYTES_MAX + 1)],
            [[b"v", b"k" * 4097, [], None]], [[b"v", None, ["t"] * 65, None]],
            [[b"v", None, ["t" * 1025], None]], [[b"v", None, ["é" * 600], None]],
            [msgpack.ExtType(3, b"v")], [b"ok", self.nested()], [[b"v", None, [], None], 7],
        ]
        return bytes(msgpack.packb(r.choice(shapes))), True

    def bad_xid(self) -> Any:
        r = self.rng
        return r.choice([
            [], [1, b"g"], [1, b"g", b"b", 4], [1, b"", b""], [-1, b"g", b""],
            [FORMAT_ID_MAX + 1, b"g", b""], [2**64 - 1, b"g", b""], [1, "g", b""],
            [1, b"g" * (XID_PART_BYTES_MAX + 1), b""], [1, b"g", b"b" * (XID_PART_BYTES_MAX + 1)],
            [1, [1], b""], [1, {"a": 1}, b""], [[1], b"g", b""], [1, b"g", None],
            [True, b"g", b""], [1.0, b"g", b""], [self.w.seed, self.garbage(), self.garbage()],
        ])

    def valid(self, op: str, f: Field) -> Any:
        """A value of field ``f`` of ``op`` that the table takes (the node may still refuse
        it: a partition a topic lacks, a transaction it does not know)."""
        r, w = self.rng, self.w
        match f.name:
            case "topic":
                return r.choice([w.topic, w.topic, w.memory, w.retained, w.spares[0],
                                 f"fz{w.seed}-none", KV_PREFIX + w.namespaces[0], "bad name!"])
            case "name":
                if op == "alter_topic":
                    return r.choice([w.topic, w.memory, w.retained, *w.spares])
                return r.choice([*w.spares, "bad name!", ""])
            case "partition":
                if type(None) in f.types and r.random() < 0.2:
                    return None
                return r.choice([0, 1, 0, 1, 2, 5])
            case "partitions":
                return r.choice([1, 2, 0])
            case "offset":
                return r.choice([0, 1, 3, 100, OFFSET_MAX])
            case "max_records" | "limit":
                return r.choice([0, 1, 10, OFFSET_MAX])
            case "group":
                return r.choice(["g1", "g2", "bad group"])
            case "key" | "prefix" | "start_after":
                edge = b"k" * (f.len_max or KEY_BYTES_MAX)
                return r.choice((*KEYS, b"", edge))
            case "tag":
                # The table bounds its characters; "é" * 1024 is twice TAG_BYTES_MAX bytes.
                return r.choice((*TAGS, TAG_EDGE, "é" * TAG_BYTES_MAX))
            case "timestamp":
                return r.choice([0, 2000, OFFSET_MAX])
            case "producer_id":
                return w.seed * 100 + r.randrange(10)
            case "seq":
                return r.randrange(6)
            case "records":
                return self.batch()
            case "storage":
                return r.choice(["rocksdb", "memory", "disk"])
            case "retention_ms" | "retention_bytes":
                return r.choice([0, 1000, 10**9])
            case "namespace":
                return r.choice([*w.namespaces, "bad ns!"])
            case "value" | "expected" | "new":
                if type(None) in f.types and r.random() < 0.3:
                    return None
                return r.choice([b"v0", b"v1", b""])
            case "txn":
                return r.choice(w.txns) if r.random() < 0.9 else r.randrange(OFFSET_MAX)
            case "timeout_ms":
                return r.choice([1, 100, 60_000, 10**9])
            case "xid":
                return list(r.choice(w.xids))
            case "one_phase":
                return r.random() < 0.5
            case "writes" if list in f.types:
                return [self.once_write(r.choice(["txn_produce", "txn_commit_offset"]))
                        for _ in range(r.randint(1, 3))]
            case "writes":
                return r.randrange(4)
            case "owner":
                return r.choice([0, 1, 2])
            case "dir":
                # A fresh directory under ``exports`` (always the first time: the valid
                # export of the fuzz's first requests, the only export then, is done), or
                # none an export could go to: relative, inside the data dir, under a file,
                # or no path at all (a NUL byte, a name over 255 bytes).
                if not self.exports or r.random() < 0.4:
                    self.exports += 1
                    return str(w.exports / f"s{w.seed}-{self.stream}-{self.exports}")
                return r.choice(["", "relative/dir", str(w.data_dir), str(w.data_dir / "x"),
                                 f"{w.data_dir.parent}/node.toml/x", f"{w.data_dir}/x\x00y",
                                 "/\x00", f"{w.data_dir.parent}/{'x' * 256}",
                                 f"{w.data_dir.parent}/{'é' * 200}"])
        raise AssertionError(f"no values for field {f.name!r} of {op}")

    def once_write(self, op: str) -> dict[str, Any]:
        """One of txn_once's writes: the fields of ``op`` without txn and seq, and its op."""
        write = {f.name: self.valid(op, f) for f in OPS[op].request
                 if f.name not in ("txn", "seq") and (f.required or self.rng.random() < 0.5)}
        write["op"] = op
        return write

    # ---- mutations -----------------------------------------------------------------

    def mutate(self, op: str, req: dict[Any, Any], filled: tuple[str, ...] = ()
               ) -> tuple[str, bool]:
        """Change one field of ``req`` the way a buggy client might; say how, and whether
        the table refuses the result. ``filled``: fields ``req`` lacks because the node
        fills them in (a txn_once write's txn and seq)."""
        r = self.rng
        fields = tuple(f for f in OPS[op].request if f.name not in filled)
        kinds = ["extra"]
        if fields:
            kinds += ["drop", "type", "garbage"]
        if any(int in f.types for f in fields):
            kinds.append("int")
        if any(str in f.types or bytes in f.types for f in fields):
            kinds.append("long")
        if any(f.name == "records" and bytes in f.types for f in fields):
            kinds += ["records", "records"]
        if any(f.name == "xid" for f in fields):
            kinds += ["xid", "xid"]
        if op == "txn_once":
            kinds += ["write", "write"]
        kind = r.choice(kinds)
        if kind == "extra":
            names = {f.name for f in fields} | {"op", "id"}
            name = r.choice([k for k in ("extra", "", "Topic", "ids", 7, None, b"op", 1.5, True)
                             if k not in names])
            req[name] = self.garbage()
            return f"unknown field {name!r}", True
        if kind == "drop":
            f = r.choice(fields)
            req.pop(f.name, None)
            return f"without {f.name!r}", f.required
        if kind == "type":
            f = r.choice(fields)
            req[f.name] = self.of_another_type(f.types)
            return f"{f.name!r} of another type", True
        if kind == "garbage":
            f = r.choice(fields)
            req[f.name] = self.nested()
            return f"{f.name!r} nested garbage", True
        if kind == "int":
            f = r.choice([f for f in fields if int in f.types])
            value = r.choice(INTS_EXTREME)
            req[f.name] = value
            out = not 0 <= value <= OFFSET_MAX if f.non_negative else (
                f.name == "partitions" and not 1 <= value <= PARTITIONS_MAX)
            return f"{f.name!r} = {value}", out
        if kind == "long":
            f = r.choice([f for f in fields if str in f.types or bytes in f.types])
            bound = f.len_max or (VALUE_BYTES_MAX if f.name in ("value", "new") else 300)
            n = bound + r.choice([1, r.randint(2, 3000)])
            if str in f.types:
                req[f.name] = r.choice(["x", "é", "\U0001f600"]) * n
            else:
                req[f.name] = b"x" * n
            return f"{f.name!r} of {n}", bool(f.len_max) or f.name in ("value", "new", "storage")
        if kind == "records":
            req["records"], refused = self.bad_batch()
            return "records corrupted", refused
        if kind == "xid":
            req["xid"] = self.bad_xid()
            return "a malformed xid", True
        # txn_once: one write malformed, or too few or too many, or one not a map
        writes = req["writes"]
        how = r.randrange(5)
        if how == 0:
            req["writes"] = []
            return "no writes", True
        if how == 1:
            req["writes"] = [self.once_write("txn_commit_offset") for _ in range(65)]
            return "65 writes", True
        if how == 2:
            writes[r.randrange(len(writes))] = r.choice([self.garbage(), {"op": "produce"},
                                                         {"op": "txn_kv"}, "txn_produce"])
            return "a write that is not one", True
        if how == 3:
            writes[0][r.choice(["id", "txn", "seq"])] = 1
            return "a write with id, txn or seq", True
        write = writes[0]
        what, refused = self.mutate(write["op"], write, filled=("txn", "seq"))
        return f"write 0: {what}", refused

    # ---- requests and frames -------------------------------------------------------

    def request(self) -> tuple[Any, int | None, Sent]:
        """One request: the value to pack, its integer id (None: it has none), and what
        was sent."""
        r = self.rng
        if self.first:
            op, mutated = self.first.pop(0)
            roll = 0.0 if mutated else 1.0
        else:
            op, roll = r.choices(self.ops, self.weights)[0], r.random()
        req: dict[Any, Any] = {f.name: self.valid(op, f) for f in OPS[op].request
                               if f.required or r.random() < 0.5}
        rid: Any = next(self.ids)
        refused = False
        what = "valid"
        if roll < 0.55:
            what, refused = self.mutate(op, req)
        elif roll < 0.6:
            rid = r.choice([-rid, 2**63 + rid])  # an id at either end: still an id
            what = "an id at the ends of msgpack's range"
        elif roll < 0.65:
            op_value: Any = r.choice(["frobnicate", op.upper(), "", None, 7, op.encode(), [op]])
            req["op"], req["id"] = op_value, rid
            return req, rid, Sent(f"op {op_value!r}: {req!r}"[:400], None, True)
        elif roll < 0.7:
            bad_id = r.choice([None, str(rid), float(rid), True, [rid], {"id": rid}, b"1"])
            req["op"], req["id"] = op, bad_id
            return req, None, Sent(f"id {bad_id!r}: {req!r}"[:400], None, True)
        elif roll < 0.72:
            req["op"] = op
            return req, None, Sent(f"no id: {req!r}"[:400], None, True)
        elif roll < 0.75:
            value = r.choice([self.garbage(), [req], op, rid, None, b"\x81"])
            if type(value) is dict:
                value = [value]
            return value, None, Sent(f"not a map: {value!r}"[:400], None, True)
        req["op"], req["id"] = op, rid
        # The fields first or op and id first, as clients do (request_map's two orders).
        if r.random() < 0.5:
            req = {"op": op, "id": rid, **{k: v for k, v in req.items() if k not in ("op", "id")}}
        return req, rid, Sent(f"{op} ({what}): {req!r}"[:400], op, refused)

    def garbage_tail(self) -> bytes:
        """Bytes that do not decode whole, to end a frame: a byte msgpack never uses, a
        request cut short, random bytes, a map with a key that cannot be one (an array),
        or arrays nested deeper than a reader goes."""
        r = self.rng
        kind = r.randrange(5)
        if kind == 0:
            return b"\xc1" + r.randbytes(r.randint(0, 20))
        if kind == 1:
            whole = bytes(msgpack.packb({"op": "produce", "id": 1, "topic": self.w.topic,
                                         "records": self.batch()}))
            return whole[:r.randrange(1, len(whole))]
        if kind == 2:
            return r.randbytes(r.randint(1, 64))
        if kind == 3:
            return bytes(msgpack.packb({(1, 2): 3, "op": "status", "id": 1}))
        return b"\x91" * r.randint(1000, 100_000) + b"\xc0"

    def frame(self) -> Frame:
        r = self.rng
        roll = r.random() if not self.first else 1.0
        if roll < 0.01:
            return Frame([b""])
        if roll < 0.02:  # over frame_bytes_max: refused whole, under ZeroMQ's cut-off
            value, rid, sent = self.request()
            big = bytes(msgpack.packb({"op": "produce", "id": next(self.ids),
                                       "topic": self.w.topic, "producer_id": 1, "seq": 1,
                                       "records": msgpack.packb([b"x" * 900] * 300)}))
            assert FRAME_MAX < len(big) < 2 * FRAME_MAX
            return Frame([big + bytes(msgpack.packb(value))])
        if roll < 0.03:  # two parts: one answer with id 0, the requests unread
            value, rid, sent = self.request()
            return Frame([bytes(msgpack.packb(value)), r.choice([b"", b"x", b"\x80"])])
        frame = Frame([b""])
        blob = b""
        for _ in range(1 if self.first or r.random() < 0.6 else r.randint(2, 6)):
            value, rid, sent = self.request()
            blob += bytes(msgpack.packb(value))
            if rid is not None:
                frame.built[rid] = sent
        if roll < 0.08:
            blob += self.garbage_tail()
            frame.undecodable_tail = True
        frame.parts = [blob]
        return frame


def over_the_limit(frame: bytes) -> tuple[list[Any], int]:
    """What a frame over ``frame_bytes_max`` gets: FRAME_TOO_LARGE under the id of each of
    its requests up to the first value that is not a map (its maps read key by key, as
    ``wire.protocol.request_ids`` does, the last "id" of a map its id), or under id 0 once
    when it has none."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(frame))
    unpacker.feed(frame)
    ids: list[Any] = []
    try:
        while unpacker.tell() < len(frame):
            rid = 0
            for _ in range(unpacker.read_map_header()):
                key, value = unpacker.unpack(), unpacker.unpack()
                if key == "id":
                    rid = value if type(value) is int else 0
            ids.append(rid)
    except Exception:
        pass
    ids = [rid for rid in ids if rid]
    return (ids, 0) if ids else ([], 1)


def read_frame(frame: bytes) -> tuple[list[Any], int]:
    """What a frame asks, as the protocol reads it: the integer ids of its requests, and
    how many answers with id 0 it gets (one per value that is not a map with an integer
    id, one for bytes that do not decode or an empty frame, which end it)."""
    if len(frame) > FRAME_MAX:
        return over_the_limit(frame)
    if not frame:
        return [], 1
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(frame))
    unpacker.feed(frame)
    ids: list[Any] = []
    anonymous = 0
    end = 0
    try:
        for value in unpacker:
            end = unpacker.tell()
            rid = value.get("id") if type(value) is dict else None
            if type(rid) is int:
                ids.append(rid)
            else:
                anonymous += 1
    except Exception:
        return ids, anonymous + 1
    return ids, anonymous + (end != len(frame))


class Exchange:
    """Frames out on one DEALER socket, answers in, each checked against what was sent;
    what is wrong is collected in ``problems``."""

    def __init__(self, endpoint: str, seed: int, name: str = "",
                 answer_wait_ms: int = ANSWER_WAIT_MS, in_flight_max: int = IN_FLIGHT_MAX
                 ) -> None:
        self.seed = seed
        self.name = name  # in each problem's text, after the seed (a cluster's member)
        self.answer_wait_ms = answer_wait_ms  # past the node's request_timeout_ms
        self.in_flight_max = in_flight_max  # answers awaited before more is sent
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.awaited: dict[Any, Sent] = {}
        self.answered: set[Any] = set()
        self.anonymous_expected = 0
        self.anonymous_got = 0
        self.problems: list[str] = []
        self.requests = 0
        self.codes: dict[str, int] = {}
        self.ok_ops: collections.Counter[str] = collections.Counter()  # accepted, by op
        self.own_ids = itertools.count(OWN_IDS)
        self.kept: dict[int, dict[str, Any]] = {}  # answers to the exchange's own requests

    def close(self) -> None:
        self.sock.close(0)

    def problem(self, text: str) -> None:
        self.problems.append(f"seed {self.seed}{self.name}: {text}")

    def send(self, frame: Frame) -> None:
        if len(frame.parts) == 1:
            ids, anonymous = read_frame(frame.parts[0])
        else:
            ids, anonymous = [], 1  # a request is one part: the message is refused whole
        if not frame.undecodable_tail and len(frame.parts) == 1 and len(frame.parts[0]) <= FRAME_MAX:
            assert set(frame.built) <= set(ids), (self.seed, frame.built, ids)
        for rid in ids:
            assert rid not in self.awaited and rid not in self.answered, (self.seed, rid)
            self.awaited[rid] = frame.built.get(rid) or Sent("a map decoded from random bytes",
                                                             None, False)
        self.anonymous_expected += anonymous
        self.requests += len(ids) + anonymous
        # Past twice the limit ZeroMQ drops the connection (front_door: MAXMSGSIZE).
        assert all(len(part) < 2 * FRAME_MAX for part in frame.parts), self.seed
        self.sock.send_multipart(frame.parts)
        while len(self.awaited) + self.anonymous_expected - self.anonymous_got > self.in_flight_max:
            self.receive()

    def settle(self) -> None:
        """Wait for every answer still awaited."""
        while (self.awaited or self.anonymous_got < self.anonymous_expected) and self.receive():
            pass

    def ask(self, op: str) -> dict[str, Any]:
        """An answer to a request of the exchange's own ({} if it did not come)."""
        rid = next(self.own_ids)
        self.awaited[rid] = Sent(op, op, False)
        self.kept[rid] = {}
        self.sock.send(msgpack.packb({"op": op, "id": rid}))
        while rid in self.awaited and self.receive():
            pass
        return self.kept.pop(rid)

    def front_door_figures(self) -> dict[str, Any]:
        """The front door's figures from its first report from now on with no request in
        flight, or the last one if none comes in ``IDLE_WAIT_S``. A request it still holds
        after every answer came was forgotten: it would be answered again, TIMEOUT, once
        its time is up. Answers coming meanwhile are taken and checked.

        An idle front door reports when a request wakes it, with that request in flight
        if it waits for an answer, as ``status`` does: ``cluster_map`` (answered at once)
        wakes it first."""
        since = time.time()
        deadline = time.monotonic() + IDLE_WAIT_S
        figures: dict[str, Any] = {}
        while time.monotonic() < deadline:
            asked = time.monotonic()
            self.ask("cluster_map")
            status = self.ask("status").get("status", {})
            figures = next((a["figures"] for a in status.get("actors", ())
                            if a["role"] == "front"), {})
            if figures.get("reported_at", 0) > since and figures.get("in_flight") == 0:
                break
            while (left_ms := STATUS_POLL_MS - (time.monotonic() - asked) * 1000) > 0:
                if not self.receive(int(left_ms) + 1, quiet=True):
                    break
        return figures

    def receive(self, wait_ms: int | None = None, quiet: bool = False) -> bool:
        """Take one frame of answers; False if none came in ``wait_ms`` (``answer_wait_ms``
        unless given; a problem unless ``quiet``: answers are awaited)."""
        if not self.sock.poll(self.answer_wait_ms if wait_ms is None else wait_ms, zmq.POLLIN):
            if quiet:
                return False
            missing = list(self.awaited.items())[:10]
            self.problem(f"no answer within {self.answer_wait_ms} ms: {len(self.awaited)} requests "
                         f"unanswered ({missing}), {self.anonymous_expected - self.anonymous_got} "
                         f"answers with id 0 missing")
            self.awaited.clear()
            self.anonymous_got = self.anonymous_expected
            return False
        for reply in unpack_replies(self.sock.recv()):
            self.take(reply)
        return True

    def take(self, reply: dict[str, Any]) -> None:
        rid = reply.get("id")
        if type(rid) is not int:
            self.problem(f"an answer without an integer id: {reply!r}")
            return
        if rid == 0:
            self.anonymous_got += 1
            if self.anonymous_got > self.anonymous_expected:
                self.problem(f"an answer with id 0 nothing asked for: {reply!r}")
            self.check(reply, Sent("a request with no integer id", None, True))
            return
        sent = self.awaited.pop(rid, None)
        if sent is None:
            self.problem(f"{'a second' if rid in self.answered else 'an'} answer to id {rid}: "
                         f"{reply!r}")
            return
        self.answered.add(rid)
        if rid in self.kept:
            self.kept[rid] = reply
        self.check(reply, sent)

    def check(self, reply: dict[str, Any], sent: Sent) -> None:
        shown = repr(reply)[:300]
        if reply.get("ok") is True:
            self.codes["ok"] = self.codes.get("ok", 0) + 1
            if sent.refused:
                self.problem(f"accepted a request the table refuses: {sent.what} -> {shown}")
            elif sent.op is not None:
                self.ok_ops[sent.op] += 1
                missing = [f.name for f in OPS[sent.op].reply if f.required and f.name not in reply]
                if missing:
                    self.problem(f"the reply lacks {missing}: {sent.what} -> {shown}")
            return
        code, text = reply.get("code"), reply.get("error")
        if reply.get("ok") is not False or type(code) is not int:
            self.problem(f"an answer neither ok nor an error with a code: {sent.what} -> {shown}")
            return
        if code not in KNOWN_CODES:
            self.problem(f"an unknown error code {code}: {sent.what} -> {shown}")
        elif code == ErrorCode.INTERNAL:
            self.problem(f"INTERNAL: {sent.what} -> {shown}")
        else:
            name = ErrorCode(code).name
            self.codes[name] = self.codes.get(name, 0) + 1
        if type(text) is not str or not text.strip():
            self.problem(f"an error without a message: {sent.what} -> {shown}")


@pytest.fixture(scope="module")
def fuzz_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    with module_node(tmp_path_factory, "fuzz", CONFIG) as n:
        yield n


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed-{s}")
def test_bad_input_is_answered_and_the_node_keeps_serving(fuzz_node: LocalNode, seed: int,
                                                           tmp_path: Path) -> None:
    world = World(seed, fuzz_node.data_dir, tmp_path / "exports")
    with fuzz_node.client() as c:
        world.make(c)
    fuzzer = Fuzzer(world)
    ex = Exchange(fuzz_node.endpoint, seed)
    try:
        while ex.requests < REQUESTS_PER_SEED:
            ex.send(fuzzer.frame())
        ex.settle()
        front = ex.front_door_figures()
    finally:
        ex.close()
    assert not ex.problems, "\n".join([f"{len(ex.problems)} problems:", *ex.problems[:40]])
    assert front.get("in_flight") == 0, f"seed {seed}: the front door still holds requests: {front}"
    assert ex.codes.get("ok", 0) > REQUESTS_PER_SEED // 10, ex.codes  # not all refused
    assert ex.ok_ops["snapshot_export"] >= 1, f"seed {seed}: no export done: {ex.codes}"

    serves_and_nothing_restarted(fuzz_node, seed)


def serves_and_nothing_restarted(node: LocalNode, seed: int) -> None:
    """After a seed's fuzz: a topic is created, written and read back, and no actor of the
    node has restarted."""
    with node.client(timeout_ms=10_000) as c:
        after = f"fz{seed}-after"
        c.create_topic(after, partitions=2)
        values = [b"after-%d" % i for i in range(5)]
        c.produce_batch(after, values, partition=1)
        assert [r.value for r in c.read(after, 1, 0)] == values
        actors = c.status()["actors"]
    assert [(a["role"], a["restarts"], a["state"]) for a in actors] == [
        (a["role"], 0, "running") for a in actors], f"seed {seed}"
