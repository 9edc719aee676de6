"""A linearizability check of key/value histories (Wing and Gong's search, with the
memoisation of Lowe's refinement): each key is a register with put, delete, get and
compare-and-set, and linearizability is local, so each key's history is checked alone."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple


class Call(NamedTuple):
    """One completed operation: when it was invoked and answered (one monotonic clock for
    every process), the key, what it was and what it returned."""

    start: float
    end: float
    key: bytes
    kind: str  # "put", "delete", "get" or "cas"
    args: tuple[Any, ...]  # put: (value,); cas: (expected, new)
    result: Any  # get: the value (None: absent); cas: swapped


def _step(state: bytes | None, call: Call) -> tuple[bool, bytes | None]:
    """Whether ``call`` could have returned what it did on ``state``, and the state after."""
    if call.kind == "put":
        return True, call.args[0]
    if call.kind == "delete":
        return True, None
    if call.kind == "get":
        return call.result == state, state
    expected, new = call.args
    if state == expected:
        return call.result is True, new
    return call.result is False, state


def linearizable(calls: Sequence[Call], initial: bytes | None = None) -> bool:
    """Whether one key's calls have a sequential order, consistent with their real-time
    order, in which every call returns what it did."""
    ops = sorted(calls, key=lambda c: c.start)
    full = (1 << len(ops)) - 1
    seen: set[tuple[int, bytes | None]] = set()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(ops) + 100))

    def search(done: int, state: bytes | None) -> bool:
        if done == full:
            return True
        if (done, state) in seen:
            return False
        seen.add((done, state))
        left = [i for i in range(len(ops)) if not done >> i & 1]
        first_end = min(ops[i].end for i in left)
        for i in left:
            if ops[i].start > first_end:
                break  # sorted by start: no later one can go next either
            ok, after = _step(state, ops[i])
            if ok and search(done | 1 << i, after):
                return True
        return False

    try:
        return search(0, initial)
    finally:
        sys.setrecursionlimit(limit)


def check(calls: Sequence[Call]) -> list[bytes]:
    """The keys whose histories are not linearizable (every key starts absent)."""
    by_key: dict[bytes, list[Call]] = defaultdict(list)
    for c in calls:
        by_key[c.key].append(c)
    return sorted(k for k, cs in by_key.items() if not linearizable(cs))
