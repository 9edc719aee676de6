"""The one msgpack codec: internal messages as ``[tag, *fields]`` arrays, with limits.

Every message type is a frozen dataclass registered here under a small integer tag.
Encoding is positional in the order the dataclass declares its fields, so the layout
lives in one place (the class), never in comments. Decoding checks the tag and the
field count; messages between our own processes are trusted beyond that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, dataclass_transform

import msgpack

from config.schema import GROUP_BYTES_LIMIT
from wire.errors import ErrorCode, NodeError

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

M = TypeVar("M", bound=type[Message])


@dataclass_transform(frozen_default=True)
def message(tag: int) -> Callable[[M], M]:
    """Class decorator: make a frozen, slotted dataclass and register it under ``tag``."""

    def wrap(cls: M) -> M:
        if tag in _REGISTRY:
            raise ValueError(f"message tag {tag} used twice: {_REGISTRY[tag].__name__}, {cls.__name__}")
        dc: Any = dataclasses.dataclass(frozen=True, slots=True)(cls)
        dc.TAG = tag
        _REGISTRY[tag] = dc
        _ARITY[tag] = len(dataclasses.fields(dc))
        return dc  # type: ignore[no-any-return]

    return wrap


def encode(msg: Message) -> bytes:
    """Pack a message as ``[TAG, field0, field1, ...]``."""
    slots: tuple[str, ...] = msg.__slots__  # the dataclass's fields, in declared order
    fields: list[Any] = [msg.TAG]
    fields.extend(getattr(msg, f) for f in slots)
    return bytes(msgpack.packb(fields, use_bin_type=True))


def decode(frame: bytes, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> Message:
    """Unpack one frame into its message; raise ``CodecError`` with the reason if it is not one."""
    if len(frame) > frame_bytes_max:
        raise CodecError(f"frame of {len(frame)} bytes is over the limit of {frame_bytes_max}")
    try:
        obj = msgpack.unpackb(frame, raw=False, use_list=True, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"frame is not msgpack: {exc}") from None
    if not isinstance(obj, list) or not obj or not isinstance(obj[0], int):
        raise CodecError("frame is not a tagged message array")
    tag = obj[0]
    cls = _REGISTRY.get(tag)
    if cls is None:
        raise CodecError(f"unknown message tag {tag}")
    if len(obj) - 1 != _ARITY[tag]:
        raise CodecError(f"{cls.__name__} needs {_ARITY[tag]} fields, frame has {len(obj) - 1}")
    return cls(*obj[1:])


def registered() -> dict[int, type[Message]]:
    """Tag → class, for tests and debugging."""
    return dict(_REGISTRY)
