"""Log records to test with: a few records of every kind, and a segment's bytes built of them."""

from __future__ import annotations

from typing import Any

import msgpack

from wire.logrecord import Kind, encode


def sample_bodies() -> list[tuple[Kind, Any]]:
    blob = msgpack.packb([b"a", [b"b", b"k", ["t"], 5]], use_bin_type=True)
    return [
        (Kind.TOPIC_CREATE, [1, "orders", 4]),
        (Kind.PRODUCE, [7, 0, 1_700_000_000_000, [[1, 0, 0, 2, blob], [1, 3, 0, 2, blob]]]),
        (Kind.OFFSET_COMMIT, ["group-1", 1, 0, 2]),
        (Kind.PRODUCE, [7, 1, 1_700_000_000_001, [[1, 0, 2, 1, b"\x91\xa1x" * 50]]]),
        (Kind.TOPIC_DELETE, [1, "orders"]),
    ]


def build(first_lsn: int = 1,
          bodies: list[tuple[Kind, Any]] | None = None) -> tuple[bytes, list[int]]:
    """A segment's bytes and the start position of each record (plus the end, last)."""
    bodies = sample_bodies() if bodies is None else bodies
    buf = b""
    starts = []
    for i, (kind, body) in enumerate(bodies):
        starts.append(len(buf))
        buf += encode(first_lsn + i, kind, body)
    starts.append(len(buf))
    return buf, starts


# ---- the record format ------------------------------------------------------------------
