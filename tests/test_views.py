"""``wire.views.unpack_views``: msgpack read with binary values as views into the buffer,
and the codec's use of it (``decode(..., views=...)``)."""

from __future__ import annotations

import os
from typing import Any

import msgpack
import pytest

from actors.flow import bundles
from wire import codec
from wire.messages import LogGroup, TxnAppend, TxnWrite
from wire.views import VIEW_BYTES_MIN, unpack_views

BIG = os.urandom(VIEW_BYTES_MIN)


def as_bytes(obj: Any) -> Any:
    if type(obj) is memoryview:
        return bytes(obj)
    if type(obj) in (list, tuple):
        return type(obj)(as_bytes(x) for x in obj)
    if type(obj) is dict:
        return {k: as_bytes(v) for k, v in obj.items()}
    return obj


SAMPLES: list[Any] = [
    0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32, 2**64 - 1, -1, -32, -33, -128, -129,
    -(2**15) - 1, -(2**31) - 1, -(2**63), 1.5, None, True, False, "", "a" * 31, "é" * 40,
    "x" * 70_000, b"", b"x" * 255, b"y" * 70_000, [], [1] * 15, [2] * 16, [3] * 70_000, {},
    {"a": 1}, {i: i for i in range(20)}, {b"k": [b"v", [1, 2]]},
    [1, 2, 3, [[9, 0, 5, BIG]], [["g", 1, 2, 3]], False],
]


@pytest.mark.parametrize("obj", SAMPLES)
def test_it_reads_what_unpackb_reads(obj: Any) -> None:
    packed = msgpack.packb(obj, use_bin_type=True)
    assert as_bytes(unpack_views(packed, items_max=1 << 20)) == msgpack.unpackb(
        packed, raw=False, strict_map_key=False)
    assert as_bytes(unpack_views(packed, use_list=False, items_max=1 << 20)) == msgpack.unpackb(
        packed, raw=False, strict_map_key=False, use_list=False)


def test_binary_values_are_views_into_the_buffer() -> None:
    packed = msgpack.packb([7, [[1, 0, 3, BIG]], b"small"], use_bin_type=True)
    _seven, [[*_, blob]], small = unpack_views(packed)
    assert type(blob) is memoryview and type(small) is memoryview
    assert blob.obj is packed  # nothing copied
    assert bytes(blob) == BIG and bytes(small) == b"small"


@pytest.mark.parametrize("bad", [
    b"", b"\x92\x01", b"\x01\x02", b"\xc1", b"\xd4\x01\x02", b"\xc4\x05ab", b"\xa3\xff\xfe\xfd",
    b"\x91" * 100 + b"\x01",
])
def test_what_is_not_one_msgpack_object_is_refused(bad: bytes) -> None:
    with pytest.raises(ValueError):
        unpack_views(bad)


def test_the_codec_reads_the_tags_asked_for_with_views_and_the_rest_with_copies() -> None:
    write = TxnWrite(5, 6, 0, ((1, 0, 3, BIG), (1, 1, 1, b"v")), (("g", 1, 0, 9),))
    frame = codec.encode(write)
    viewed = codec.decode(memoryview(frame), views=frozenset({TxnWrite.TAG}))
    assert viewed == codec.decode(frame) == write  # a view compares as its bytes
    assert isinstance(viewed, TxnWrite) and type(viewed.parts[0][3]) is memoryview
    copied = codec.decode(frame, views=frozenset({LogGroup.TAG}))
    assert isinstance(copied, TxnWrite) and type(copied.parts[0][3]) is bytes
    small = codec.decode(codec.encode(TxnWrite(5, 6, 0, ((1, 0, 1, b"v"),), ())),
                         views=frozenset({TxnWrite.TAG}))
    assert isinstance(small, TxnWrite) and type(small.parts[0][3]) is bytes


def test_a_message_holding_views_encodes_as_the_same_message_of_bytes() -> None:
    parts = ((1, 0, 3, memoryview(BIG)), (2, 1, 1, memoryview(b"v")))
    with_views = codec.encode(TxnAppend(9, 7, parts, ()))
    assert with_views == codec.encode(TxnAppend(9, 7, ((1, 0, 3, BIG), (2, 1, 1, b"v")), ()))
    assert with_views == msgpack.packb([TxnAppend.TAG, 9, 7, [[1, 0, 3, BIG], [2, 1, 1, b"v"]],
                                        []], use_bin_type=True)


@pytest.mark.parametrize(("sizes", "runs"), [
    ([], []),
    ([5], [(0, 1)]),
    ([100], [(0, 1)]),
    ([1, 2, 100, 3, 4, 200, 5], [(0, 2), (2, 3), (3, 5), (5, 6), (6, 7)]),
    ([6, 6, 6], [(0, 1), (1, 2), (2, 3)]),  # over bytes_max together: one each
    ([100, 100], [(0, 1), (1, 2)]),
])
def test_large_messages_go_alone_and_small_ones_in_bundles(
        sizes: list[int], runs: list[tuple[int, int]]) -> None:
    assert bundles(sizes, 10, 100) == runs


def test_a_long_array_is_left_to_msgpack() -> None:
    """A burst of many small requests: ``TooManyItems`` before any is read, and the codec
    reads such a frame by copy (as it came, the same message)."""
    from wire.messages import Writes
    from wire.views import ITEMS_MAX, TooManyItems
    assert unpack_views(msgpack.packb([1] * ITEMS_MAX)) == [1] * ITEMS_MAX
    with pytest.raises(TooManyItems):
        unpack_views(msgpack.packb([BIG, [1] * (ITEMS_MAX + 1)]))
    with pytest.raises(TooManyItems):
        unpack_views(msgpack.packb({i: i for i in range(ITEMS_MAX + 1)}))
    burst = Writes(list(range(1000)), [(7, i, ((3, 0, 1, b"v" * 100),)) for i in range(1000)],
                   [])
    frame = codec.encode(burst)
    assert len(frame) >= VIEW_BYTES_MIN
    got = codec.decode(frame, views=frozenset({Writes.TAG}))
    assert got == codec.decode(frame) and isinstance(got, Writes)
    assert type(got.produces[0][2][0][3]) is bytes


def test_unpackb_reads_views_only_where_they_pay() -> None:
    """``wire.views.unpackb``, the one choice the codec and the shard writers make: views
    for a large buffer of few objects, msgpack's copies for a small one or for many."""
    from wire.views import ITEMS_MAX, unpackb
    large = msgpack.packb([7, BIG])
    got = unpackb(large)
    assert type(got[1]) is memoryview and bytes(got[1]) == BIG
    assert unpackb(large, use_list=False) == (7, got[1])
    small = msgpack.packb([7, b"v" * 100])
    assert unpackb(small) == [7, b"v" * 100] and type(unpackb(small)[1]) is bytes
    many = msgpack.packb([BIG, [b"v"] * (ITEMS_MAX + 1)])
    assert type(unpackb(many)[0]) is bytes  # left to msgpack
    assert unpackb(msgpack.packb({1: BIG[:10]})) == {1: BIG[:10]}  # int keys, as messages use
