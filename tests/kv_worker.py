"""A client process for tests/test_kv.py: ``python tests/kv_worker.py MODE ENDPOINT SEED N``.

- ``cas-inc``: N attempts to add one to the counter ``count`` of namespace ``inc`` by
  get and compare-and-set; prints how many swapped.
- ``history``: N random puts, deletes, gets and compare-and-sets on three keys of namespace
  ``lin``; prints each call as JSON ``[start, end, key, kind, args, result]`` (hex bytes),
  timed by the monotonic clock every process shares.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from node.client import NodeClient
from wire.errors import NodeError


def _hex(v: bytes | None) -> str | None:
    return None if v is None else v.hex()


def cas_inc(c: NodeClient, n: int) -> None:
    """``unknown``: 1 if the node went away with a compare-and-set unanswered (it may or may
    not have been applied); the worker stops there."""
    swapped = unknown = 0
    for _ in range(n):
        try:
            raw = c.kv_get("inc", b"count")
        except NodeError:
            break
        now = int(raw) if raw is not None else 0
        try:
            if c.kv_cas("inc", b"count", raw, str(now + 1).encode()):
                swapped += 1
        except NodeError:
            unknown = 1
            break
    print(json.dumps({"swapped": swapped, "unknown": unknown}))


def history(c: NodeClient, seed: int, n: int) -> None:
    rng = random.Random(seed)
    keys = [b"a", b"b", b"c"]
    values: list[bytes | None] = [None]  # what this client saw or wrote: CAS expects them
    calls: list[list[Any]] = []
    for i in range(n):
        key = rng.choice(keys)
        kind = rng.choice(["put", "get", "get", "cas", "cas", "delete"])
        mine = f"{seed}-{i}".encode()
        start = time.monotonic()
        args: list[Any] = []
        result: Any = None
        if kind == "put":
            c.kv_put("lin", key, mine)
            args = [mine.hex()]
            values.append(mine)
        elif kind == "delete":
            c.kv_delete("lin", key)
        elif kind == "get":
            got = c.kv_get("lin", key)
            result = _hex(got)
            values.append(got)
        else:
            expected = rng.choice(values)
            result = c.kv_cas("lin", key, expected, mine)
            args = [_hex(expected), mine.hex()]
        calls.append([start, time.monotonic(), key.hex(), kind, args, result])
    print(json.dumps(calls))


def main() -> None:
    mode, endpoint, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with NodeClient(endpoint, timeout_ms=int(sys.argv[5]) if len(sys.argv) > 5 else 30_000,
                    retries=0 if len(sys.argv) > 5 else 5) as c:
        if mode == "cas-inc":
            cas_inc(c, n)
        else:
            history(c, seed, n)


if __name__ == "__main__":
    main()
