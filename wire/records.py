"""Records as they travel in batches: the packed records array, and its validation.

A batch is one msgpack array. Each element is either a ``bin`` (a value with no key, tags
or timestamp) or ``[value: bin, key: bin|nil, tags: [str, ...], timestamp_ms: int|nil]``
(the bounds below: ``KEY_BYTES_MAX``, ``TAGS_PER_RECORD_MAX``, ``TAG_BYTES_MAX``,
``TIMESTAMP_MAX``).
The front door checks a batch once on the way in; after that it travels as bytes until a
shard writer decodes it to store and index each record.

Records read back travel as ``[offset, timestamp_ms, key, tags, value]`` arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack

from wire.errors import BadRequest, ErrorCode
from wire.packer import pack

# A record's timestamp, ms since the epoch: up to 9999-12-31T23:59:59.999Z, the last instant
# Spark's timestamps (and Python's datetime) hold; past it a reader turned it into a wrong
# date or an overflow.
TIMESTAMP_MAX = 253_402_300_799_999
# Keys and tags are index keys in RocksDB (a tag's length is stored in two bytes): bound them
# where records come in, so that no durable record can be one a shard writer cannot apply.
KEY_BYTES_MAX = 4096
TAG_BYTES_MAX = 1024
TAGS_PER_RECORD_MAX = 64
# What a batch's record may count at the most (``counting_hook``): once in the batch's
# array, its array of four once and an item each, its tags' array once and a tag each.
RECORD_ITEMS_MAX = 1 + (1 + 4) + (1 + TAGS_PER_RECORD_MAX)

C = TypeVar("C", list[Any], dict[Any, Any])


class ItemsOver(ValueError):
    """What a ``counting_hook`` raises past its bound."""


def over_bounds(exc: Exception) -> bool:
    """Whether a decoding stopped at its bounds (``bounds``): the hook's count, or one map
    or array longer than msgpack's ``max_array_len``/``max_map_len`` ("N exceeds
    max_array_len(M)", as msgpack words it)."""
    if isinstance(exc, ItemsOver):
        return True
    return isinstance(exc, ValueError) and any(
        f"exceeds max_{kind}_len" in str(exc) for kind in ("array", "map"))


def counting_hook(items_max: int) -> tuple[Callable[[C], C], list[int]]:
    """A msgpack ``list_hook`` and ``object_hook`` that counts the arrays and maps decoded
    and their items, and raises ``ItemsOver`` past ``items_max``; and the cell holding what
    is left (to set again between the objects of one unpacker).

    Without a bound on them, what a client's bytes decode to is bounded by nothing but the
    frame: a 16 MiB frame of empty arrays decoded to 16 million lists (1.1 GB, 8 s in the
    front door, which was killed for its silence). A bin or a string counts once however
    long it is; msgpack's ``max_array_len`` and ``max_map_len`` (set to ``items_max`` too)
    bound each container before the hook sees it."""
    left = [items_max]

    def hook(container: C) -> C:
        left[0] -= len(container) + 1
        if left[0] < 0:
            raise ItemsOver(f"it decodes to over {items_max} map and array items")
        return container

    return hook, left


def bounds(items_max: int, array_len_max: int | None = None, map_len_max: int | None = None
           ) -> tuple[dict[str, Any], list[int]]:
    """``msgpack.unpackb``'s (or ``Unpacker``'s) arguments that bound what it decodes to
    ``items_max`` (``counting_hook``), one array to ``array_len_max`` items and one map to
    ``map_len_max`` (``items_max`` unless given), and the hook's cell of what is left.

    The hook sees a container once it is whole: containers nested as deep as msgpack goes
    (1 024) are each built up to their length bound before any is counted, so those bounds
    are what keeps a hostile frame's decoding small: at 4 096 a request of nested arrays
    of two-character strings reached 315 MB; at the protocol's 256 and 64, about 16 MB. A
    batch's records need arrays of ``batch_records_max``: what they decode to is bounded
    by the frame, up to about 25 bytes of memory a byte of it (a 14 MiB blob: 371 MB)."""
    hook, left = counting_hook(items_max)
    return {"list_hook": hook, "object_hook": hook,
            "max_array_len": items_max if array_len_max is None else array_len_max,
            "max_map_len": items_max if map_len_max is None else map_len_max}, left


@dataclass(frozen=True, slots=True)
class Record:
    """A record: ``value`` with an optional ``key``, ``tags`` and ``timestamp`` (ms since epoch).

    Records read from the node also carry their ``offset`` in the partition.
    """

    value: bytes
    key: bytes | None = None
    tags: tuple[str, ...] = ()
    timestamp: int | None = None
    offset: int | None = field(default=None, compare=True)


def as_bytes(value: bytes | str, what: str = "a value") -> bytes:
    """A value or key as a client gives it: bytes (or a buffer of them), or str (UTF-8).
    Anything else is refused (``bytes(5)`` would be five zero bytes)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or str, not {type(value).__name__}")


def as_tags(tags: Sequence[str]) -> tuple[str, ...]:
    """A record's tags as a client gives them: a sequence of str (one str alone would be
    taken letter by letter)."""
    if isinstance(tags, (str, bytes)):
        raise TypeError(f"tags must be a sequence of str (such as [{tags!r}]), not one "
                        f"{type(tags).__name__}")
    return tuple(tags)


def to_wire(record: Record | bytes | str) -> Any:
    """The packed form of one record to send."""
    if isinstance(record, (bytes, bytearray, memoryview, str)):
        return as_bytes(record)
    if not isinstance(record, Record):
        raise TypeError(f"a record must be bytes, str or a Record, not {type(record).__name__}")
    if record.key is None and not record.tags and record.timestamp is None:
        return record.value
    return [record.value, record.key, list(record.tags), record.timestamp]


def pack_batch(records: Iterable[Record | bytes | str]) -> bytes:
    recs = records if type(records) is list else list(records)
    if values_only(recs):  # bare values: packed as they are, at C speed
        return pack(recs)
    return pack([to_wire(r) for r in recs])


def check_batch(blob: bytes, records_max: int, value_bytes_max: int
                ) -> tuple[list[Any], bool]:
    """Unpack and check a client's batch; return its elements, and whether they are all
    bare values (``values_only``: no key, tags or timestamp). Raises ``BadRequest``."""
    # No max_array_len of records_max: msgpack applies it to every array; the count is
    # checked below, and what the blob may decode to is bounded (``counting_hook``).
    try:
        items, bare = unpack_values(blob, value_bytes_max,
                                    items_max=1 + records_max * RECORD_ITEMS_MAX)
    except Exception as exc:
        if not over_bounds(exc):
            raise BadRequest(f"records are not msgpack: {exc}") from None
        count = array_len(blob)
        if count is not None and count > records_max:  # told as any batch over the count
            raise BadRequest(f"batch has {count} records; the limit is {records_max}",
                             ErrorCode.BATCH_TOO_LARGE) from None
        raise BadRequest(f"records decode to more than a batch holds (at most {records_max} "
                         f"records, each [value, key, tags, timestamp] with at most "
                         f"{TAGS_PER_RECORD_MAX} tags)") from None
    if type(items) is not list:
        raise BadRequest("records must be an array")
    if not items:
        raise BadRequest("a batch needs at least one record", ErrorCode.EMPTY_BATCH)
    if len(items) > records_max:
        raise BadRequest(f"batch has {len(items)} records; the limit is {records_max}",
                         ErrorCode.BATCH_TOO_LARGE)
    if bare:
        return items, True  # checked at C speed (the loop below names a bad one)
    for i, item in enumerate(items):
        t = type(item)
        if t is bytes:
            if len(item) > value_bytes_max:
                raise BadRequest(f"record {i}: value of {len(item)} bytes is over {value_bytes_max}")
            continue
        if t is not list or len(item) != 4:
            raise BadRequest(f"record {i}: must be bin or [value, key, tags, timestamp]")
        value, key, tags, ts = item
        if type(value) is not bytes:
            raise BadRequest(f"record {i}: value must be bin")
        if len(value) > value_bytes_max:
            raise BadRequest(f"record {i}: value of {len(value)} bytes is over {value_bytes_max}")
        if key is not None and (type(key) is not bytes or len(key) > KEY_BYTES_MAX):
            raise BadRequest(f"record {i}: key must be bin of at most {KEY_BYTES_MAX} bytes, "
                             f"or nil")
        if type(tags) is not list:
            raise BadRequest(f"record {i}: tags must be an array of str")
        if tags:  # most records have none: no generator to see so
            if any(type(t) is not str for t in tags):
                raise BadRequest(f"record {i}: tags must be an array of str")
            if (len(tags) > TAGS_PER_RECORD_MAX
                    or any(len(t.encode()) > TAG_BYTES_MAX for t in tags)):
                raise BadRequest(f"record {i}: at most {TAGS_PER_RECORD_MAX} tags of at most "
                                 f"{TAG_BYTES_MAX} bytes each")
        if ts is not None and (type(ts) is not int or ts < 0 or ts > TIMESTAMP_MAX):
            raise BadRequest(f"record {i}: timestamp must be an int of ms since the epoch, "
                             f"0 to {TIMESTAMP_MAX} (9999-12-31), or nil")
    return items, bare


def array_len(blob: bytes | memoryview) -> int | None:
    """The length a msgpack array's header says, read without decoding it; None if
    ``blob`` does not start with one."""
    if not blob:
        return None
    first = blob[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    width = {0xDC: 2, 0xDD: 4}.get(first)
    if width is None or len(blob) < 1 + width:
        return None
    return int.from_bytes(blob[1:1 + width], "big")


def unpack_values(blob: bytes | memoryview, bytes_max: int, use_list: bool = True,
                  items_max: int | None = None) -> tuple[Any, bool]:
    """``blob`` unpacked, and whether it is an array of bare values of at most ``bytes_max``
    bytes each, told at C speed: msgpack refuses a longer bin as it reads it
    (``max_bin_len``), then one pass over the elements' types. Checking the lengths
    afterwards (``max(map(len, items))``) took longer than the unpacking: for 5 000 values
    of 100 bytes, 400 us against 230 measured here. When a bin is longer (or ``blob`` is not
    msgpack) it is unpacked again without the bound, and raises what msgpack raises.
    ``items_max`` bounds what a client's blob decodes to (``counting_hook``: ``ItemsOver``);
    a blob of bare values costs it one call, a keyed record two."""
    try:
        items = msgpack.unpackb(blob, raw=False, use_list=use_list, max_bin_len=bytes_max,
                                **({} if items_max is None else bounds(items_max)[0]))
    except Exception as exc:
        if over_bounds(exc):
            raise
        items = msgpack.unpackb(blob, raw=False, use_list=use_list,
                                **({} if items_max is None else bounds(items_max)[0]))
        return items, False
    return items, type(items) in (list, tuple) and values_only(items)


def values_only(items: Sequence[Any]) -> bool:
    """Whether every element of a batch is a bare value (no key, tags or timestamp): the
    batches of most producers and of the Spark sink, told apart without a Python loop."""
    return set(map(type, items)) == {bytes}


def key_of(item: Any) -> bytes | None:
    """The key of a checked batch element."""
    return None if type(item) is bytes else item[1]


def unpack_read(blob: bytes) -> list[Record]:
    """Records of a read reply."""
    out = []
    for offset, ts, key, tags, value in msgpack.unpackb(blob, raw=False, use_list=False):
        out.append(Record(value=value, key=key, tags=tuple(tags), timestamp=ts, offset=offset))
    return out


def pack_read(rows: Sequence[Any]) -> bytes:
    """Pack ``[offset, ts, key, tags, value]`` rows for a read reply."""
    return pack(rows)
