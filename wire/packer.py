"""msgpack encoding with a Packer kept for reuse.

``msgpack.packb`` builds a new ``Packer`` for every call, which is most of what it costs
for the small objects the node packs by the million (a record's row in its shard, a reply,
a message between actors): 0.85 us against 0.29 us for a tuple of four holding 100 bytes,
measured here. ``pack`` gives the same bytes (binary as bin: ``use_bin_type``).

One Packer per thread: a Packer must not be shared between threads (the log manager's
truncator and export copier run on their own). A Packer keeps the buffer its largest object
grew it to, so after a large one it is replaced rather than kept.

``pack_joined`` packs an object holding large binary values (a log group, a burst of
writes) as pieces joined once: the Packer copies such a value into a buffer it grows as it
goes and then copies the whole again, 21 ms for a message of 16 MiB against 3.8 ms for the
join, measured here; the log manager spent half its time there under the Spark sink.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

import msgpack

PACKER_KEPT_BYTES_MAX = 1 << 20  # a Packer that packed more is dropped (its buffer with it)

_local = threading.local()


def pack(obj: Any) -> bytes:
    """``obj`` as msgpack; the bytes ``msgpack.packb(obj, use_bin_type=True)`` gives."""
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    data: bytes = packer.pack(obj)
    if len(data) > PACKER_KEPT_BYTES_MAX:
        _local.packer = msgpack.Packer(use_bin_type=True)
    return data


JOIN_BYTES_MIN = 64 * 1024  # a binary value this large is joined in, not packed

_BIN32 = struct.Struct(">BI")
_ARRAY16 = struct.Struct(">BH")
_ARRAY32 = struct.Struct(">BI")


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items (the smallest, as msgpack packs it)."""
    if n < 16:
        return bytes((0x90 | n,))
    return _ARRAY16.pack(0xDC, n) if n < 1 << 16 else _ARRAY32.pack(0xDD, n)


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    return _ARRAY16.pack(0xDE, n) if n < 1 << 16 else _ARRAY32.pack(0xDF, n)


def pack_map(fields: dict[str, Any]) -> bytes:
    """A request or reply map: with ``pack_joined`` when one of its values is a large
    binary value (a batch of records, a read's records), else with ``pack``."""
    for v in fields.values():  # a loop: on every reply, where a generator costs more
        if type(v) is bytes and len(v) >= JOIN_BYTES_MIN:
            return pack_joined(fields)
    return pack(fields)


def _pieces(obj: Any, out: list[Any]) -> None:
    t = type(obj)
    if t is bytes or t is memoryview:  # a view: of a received frame (``wire.views``)
        if len(obj) >= JOIN_BYTES_MIN:
            out.append(_BIN32.pack(0xC6, len(obj)))
            out.append(obj)
        else:
            out.append(pack(obj))
    elif t is list or t is tuple:
        if not any(type(x) in _HOLDERS for x in obj):
            out.append(pack(obj))  # nothing large can be in it
            return
        out.append(array_header(len(obj)))
        for x in obj:
            _pieces(x, out)
    elif t is dict:
        out.append(_map_header(len(obj)))
        for k, v in obj.items():
            out.append(pack(k))
            _pieces(v, out)
    else:
        out.append(pack(obj))


_HOLDERS = (bytes, memoryview, list, tuple)  # what may hold a large binary value


def pieces(obj: Any) -> list[bytes]:
    """``obj`` packed as ``pack_joined`` packs it, as the pieces to join (a caller that
    frames them may checksum and join them with its header in one go)."""
    out: list[bytes] = []
    _pieces(obj, out)
    return out


def pack_with_bin(head: Sequence[Any], pieces: Sequence[bytes]) -> bytes:
    """``pack_joined([*head, b"".join(pieces)])`` for pieces of ``JOIN_BYTES_MIN`` bytes or
    more in all, without joining them first: the array's values, then one binary value
    made of the pieces, all joined once."""
    out = [array_header(len(head) + 1)]
    for x in head:
        _pieces(x, out)
    out.append(_BIN32.pack(0xC6, sum(map(len, pieces))))
    out.extend(pieces)
    return b"".join(out)


def pack_joined(obj: Any) -> bytes:
    """What ``pack`` gives for ``obj``, except that a binary value of ``JOIN_BYTES_MIN``
    bytes or more inside lists, tuples and maps is written with a 32-bit length (msgpack's bin 32;
    every reader takes it) and joined in as it is: one copy. For objects known to carry
    large values; a small one packs faster with ``pack``."""
    out: list[bytes] = []
    _pieces(obj, out)
    return b"".join(out)
