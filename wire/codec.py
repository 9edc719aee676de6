"""The one msgpack codec: internal messages as ``[tag, *fields]`` arrays, with limits.

Every message type is a frozen dataclass registered here under a small integer tag.
Encoding is positional in the order the dataclass declares its fields, so the layout
lives in one place (the class), never in comments. Decoding checks the tag and the
field count; messages between our own processes are trusted beyond that.

msgpack gives arrays back as lists. Two things make them what the class declares:

- a field declared as a list of rows, ``list[Row]`` with ``Row`` a ``NamedTuple``, is
  decoded into those rows (``Catalog.topics``: rare messages, where names cost nothing);
- a message registered with ``arrays=tuple`` has every array in it decoded as a tuple, so
  its fields can be typed tuples (``tuple[int, int, int, bytes]``): the hot path's rows,
  where a ``NamedTuple`` per row would cost about 0.25 µs more to build or decode, and a
  tuple costs what a list does (and decodes faster).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, dataclass_transform

import msgpack

from config.schema import GROUP_BYTES_LIMIT
from wire import views as views_reader
from wire.errors import ErrorCode, NodeError
from wire.packer import JOIN_BYTES_MIN, pack, pack_joined

FRAME_BYTES_MAX_DEFAULT = 64 * 1024 * 1024  # internal hop; client frames are capped in config
# A log group (and a read's answer) travels as one message: it must fit, with its framing.
assert GROUP_BYTES_LIMIT + 1024 * 1024 <= FRAME_BYTES_MAX_DEFAULT


class CodecError(NodeError):
    """A frame that is not a message: bad msgpack, unknown tag, wrong arity or too large."""

    code = ErrorCode.BAD_REQUEST


class Message:
    """Base of every internal message. Subclasses are frozen dataclasses with a ``TAG``."""

    TAG: ClassVar[int] = -1
    __slots__ = ()


_REGISTRY: dict[int, type[Message]] = {}
_ARITY: dict[int, int] = {}
_ROWS: dict[int, list[tuple[int, Any]]] = {}  # tag → [(field index, its NamedTuple row)]
# Tags of the messages whose arrays decode as tuples. Such a message encodes as a fixarray
# (at most 14 fields) starting with its tag as a positive fixint (below 128), so its first
# two bytes tell it apart before decoding (msgpack decodes a whole frame one way).
_TUPLE_TAGS: set[int] = set()
_FIXARRAY = 0x90
# Tags of the messages that may carry large binary values (a log group, a burst of writes,
# a read's records): those with a ``bulk_bytes`` method, the bytes of such values in one.
# At JOIN_BYTES_MIN or more they are encoded by ``pack_joined``.
_BULK_TAGS: set[int] = set()

M = TypeVar("M", bound=type[Message])


@dataclass_transform(frozen_default=True)
def message(tag: int, arrays: type = list) -> Callable[[M], M]:
    """Class decorator: make a frozen, slotted dataclass and register it under ``tag``.

    ``arrays=tuple``: every array in the message decodes as a tuple (see above)."""
    assert arrays in (list, tuple)

    def wrap(cls: M) -> M:
        if tag in _REGISTRY:
            raise ValueError(f"message tag {tag} used twice: {_REGISTRY[tag].__name__}, {cls.__name__}")
        dc: Any = dataclasses.dataclass(frozen=True, slots=True)(cls)
        dc.TAG = tag
        fields = dataclasses.fields(dc)
        _REGISTRY[tag] = dc
        _ARITY[tag] = len(fields)
        hints = typing.get_type_hints(dc)
        rows = [(i, row) for i, f in enumerate(fields) if (row := _row_type(hints[f.name]))]
        if rows:
            _ROWS[tag] = rows
        if hasattr(dc, "bulk_bytes"):
            _BULK_TAGS.add(tag)
        if arrays is tuple:
            assert 0 <= tag < 128 and len(fields) < 15, "must encode as a fixarray and fixint"
            assert not rows, "rows are for messages decoded with lists"
            _TUPLE_TAGS.add(tag)
        return dc  # type: ignore[no-any-return]

    return wrap


def _row_type(annotation: Any) -> Any:
    """``Row`` if ``annotation`` is ``list[Row]`` with ``Row`` a NamedTuple, else None."""
    if typing.get_origin(annotation) not in (list, collections.abc.Sequence):
        return None
    (item,) = typing.get_args(annotation)
    is_row = isinstance(item, type) and issubclass(item, tuple) and hasattr(item, "_fields")
    return item if is_row else None


def encode(msg: Message) -> bytes:
    """Pack a message as ``[TAG, field0, field1, ...]``."""
    slots: tuple[str, ...] = msg.__slots__  # the dataclass's fields, in declared order
    fields: list[Any] = [msg.TAG]
    fields.extend(getattr(msg, f) for f in slots)
    if msg.TAG in _BULK_TAGS and msg.bulk_bytes() >= JOIN_BYTES_MIN:  # type: ignore[attr-defined]
        return pack_joined(fields)
    return pack(fields)


def decode(frame: bytes | memoryview, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
           views: frozenset[int] = frozenset()) -> Message:
    """Unpack one frame into its message; raise ``CodecError`` with the reason if it is not one.
    A message whose tag is in ``views``, in a frame of ``VIEW_BYTES_MIN`` or more, has its
    binary values as views into ``frame`` (``wire.views``), not copies: for an actor that
    passes them on or reads only some, and keeps none (unless it holds many small objects,
    ``TooManyItems``: then it is read as any other)."""
    if len(frame) > frame_bytes_max:
        raise CodecError(f"frame of {len(frame)} bytes is over the limit of {frame_bytes_max}")
    array = len(frame) > 1 and frame[0] & 0xF0 == _FIXARRAY
    tuples = array and frame[1] in _TUPLE_TAGS
    try:
        if array and frame[1] in views:
            obj = views_reader.unpackb(frame, use_list=not tuples)
        else:
            obj = msgpack.unpackb(frame, raw=False, use_list=not tuples, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"frame is not msgpack: {exc}") from None
    if not isinstance(obj, (list, tuple)) or not obj or not isinstance(obj[0], int):
        raise CodecError("frame is not a tagged message array")
    tag = obj[0]
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise CodecError(f"unknown message tag {tag}")
    if len(obj) - 1 != _ARITY[tag]:
        raise CodecError(f"{cls.__name__} needs {_ARITY[tag]} fields, frame has {len(obj) - 1}")
    rows = _ROWS.get(tag)
    if rows is None:
        return cls(*obj[1:])
    fields = list(obj[1:])
    try:
        for i, row in rows:
            make = getattr(row, "from_row", row._make)
            fields[i] = [make(r) for r in fields[i]]
    except (TypeError, ValueError) as exc:
        raise CodecError(f"{cls.__name__}: a row is not {row.__name__}: {exc}") from None
    return cls(*fields)


def registered() -> dict[int, type[Message]]:
    """Tag → class, for tests and debugging."""
    return dict(_REGISTRY)
