"""msgpack read without copying its binary values: each comes back as a view into the
buffer it was read from (``memoryview``), everything else as ``msgpack.unpackb`` gives it.

For the few objects around large binary values that an actor passes on or reads only in
part: a burst of a transaction's writes the transaction manager hands on to the log
manager, a log group of which a shard writer applies only its own shards' records.
``unpackb`` copies every binary value into a new bytes object; here the bytes stay where
they are until someone needs them. It is Python, so it costs about a microsecond an
object: use it for a few large values, never for many small ones (``VIEW_BYTES_MIN``).
The views keep the buffer they point into alive.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

VIEW_BYTES_MIN = 64 * 1024  # a buffer smaller than this is read faster by msgpack's unpackb
ITEMS_MAX = 64  # an array or map longer than this: many small objects, for unpackb


class TooManyItems(ValueError):
    """An array or map of more than ``items_max`` items: read it with msgpack's unpackb."""

_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")
_b = struct.Struct(">b")
_h = struct.Struct(">h")
_i = struct.Struct(">i")
_q = struct.Struct(">q")
_f = struct.Struct(">f")
_d = struct.Struct(">d")
_SCALARS = {0xCC: _B, 0xCD: _H, 0xCE: _I, 0xCF: _Q, 0xD0: _b, 0xD1: _h, 0xD2: _i, 0xD3: _q,
            0xCA: _f, 0xCB: _d}
_LENGTHS = {0xC4: _B, 0xC5: _H, 0xC6: _I,  # bin 8, 16, 32
            0xD9: _B, 0xDA: _H, 0xDB: _I,  # str 8, 16, 32
            0xDC: _H, 0xDD: _I,  # array 16, 32
            0xDE: _H, 0xDF: _I}  # map 16, 32
_BIN = (0xC4, 0xC5, 0xC6)
_STR = (0xD9, 0xDA, 0xDB)
_ARRAY = (0xDC, 0xDD)
_DEPTH_MAX = 64


def unpack_views(buf: bytes | memoryview, use_list: bool = True,
                 items_max: int = ITEMS_MAX) -> Any:
    """The object packed in ``buf`` (all of it), binary values as views into ``buf``;
    arrays as lists (tuples with ``use_list`` false). Raises ``ValueError`` for bytes that
    are not one msgpack object, or that use what the node never packs (extension types),
    and ``TooManyItems`` at an array or map of more than ``items_max`` items (a burst of a
    thousand small requests: Python would take ten times msgpack's time over them)."""
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    try:
        obj, end = _Reader(view, use_list, items_max).read(0, 0)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    if end != len(view):
        raise ValueError(f"not one msgpack object: {len(view) - end} bytes after it")
    return obj


def unpackb(buf: bytes | memoryview, use_list: bool = True) -> Any:
    """``buf`` read the faster way: with its binary values as views (``unpack_views``) when
    it is ``VIEW_BYTES_MIN`` or more and holds few objects, else by msgpack, which copies
    them (``strict_map_key`` off, as the node's messages need)."""
    if len(buf) >= VIEW_BYTES_MIN:
        try:
            return unpack_views(buf, use_list=use_list)
        except TooManyItems:
            pass  # many small objects: msgpack reads them faster
    return msgpack.unpackb(buf, raw=False, use_list=use_list, strict_map_key=False)


class _Reader:
    __slots__ = ("items_max", "use_list", "view")

    def __init__(self, view: memoryview, use_list: bool, items_max: int) -> None:
        self.view = view
        self.use_list = use_list
        self.items_max = items_max

    def read(self, pos: int, depth: int) -> tuple[Any, int]:
        """The object at ``pos`` and where it ends."""
        if depth > _DEPTH_MAX:
            raise ValueError(f"nested more than {_DEPTH_MAX} deep")
        view = self.view
        b = view[pos]
        pos += 1
        if b <= 0x7F:
            return b, pos
        if b >= 0xE0:
            return b - 0x100, pos
        if 0x90 <= b <= 0x9F:
            return self.items(pos, b & 0x0F, depth)
        if 0xA0 <= b <= 0xBF:
            n = b & 0x1F
            return str(view[pos:pos + n], "utf-8"), pos + n
        if 0x80 <= b <= 0x8F:
            return self.map(pos, b & 0x0F, depth)
        if b == 0xC0:
            return None, pos
        if b == 0xC2:
            return False, pos
        if b == 0xC3:
            return True, pos
        scalar = _SCALARS.get(b)
        if scalar is not None:
            return scalar.unpack_from(view, pos)[0], pos + scalar.size
        length = _LENGTHS.get(b)
        if length is None:
            raise ValueError(f"msgpack type byte 0x{b:02x} is not read here")
        n = length.unpack_from(view, pos)[0]
        pos += length.size
        if b in _BIN:
            if pos + n > len(view):
                raise ValueError("a binary value runs past the end")
            return view[pos:pos + n], pos + n
        if b in _STR:
            return str(view[pos:pos + n], "utf-8"), pos + n
        if b in _ARRAY:
            return self.items(pos, n, depth)
        return self.map(pos, n, depth)

    def items(self, pos: int, n: int, depth: int) -> tuple[Any, int]:
        if n > self.items_max:
            raise TooManyItems(f"an array of {n} items")
        items = []
        for _ in range(n):
            item, pos = self.read(pos, depth + 1)
            items.append(item)
        return (items if self.use_list else tuple(items)), pos

    def map(self, pos: int, n: int, depth: int) -> tuple[Any, int]:
        if n > self.items_max:
            raise TooManyItems(f"a map of {n} items")
        out = {}
        for _ in range(n):
            key, pos = self.read(pos, depth + 1)
            if type(key) is memoryview:
                key = bytes(key)  # a view is no dictionary key
            out[key], pos = self.read(pos, depth + 1)
        return out, pos
