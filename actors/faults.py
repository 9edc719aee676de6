"""Fault injection seams, for tests: crash an actor at a named point, fail an fsync, or slow
a step down.

``SHARDNODE_FAULTS`` lists the armed points, comma-separated, e.g.
``checkpoint.after_snapshot,log.fsync``. Each crash or failure fires once per data
directory, in one process only: firing first creates ``<data dir>/faults-fired/<point>``
exclusively, so a second actor reaching the point at the same moment, or the restarted
actor, goes on normally. A seam that slows a step (``armed``) stays armed.
With the variable unset (always, outside tests) every call is one dictionary lookup.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("shardnode")

ENV = "SHARDNODE_FAULTS"
EXIT_INJECTED = 99

_armed = frozenset(p for p in os.environ.get(ENV, "").split(",") if p)


def fired_dir(data_dir: Path) -> Path:
    return data_dir / "faults-fired"


def _fire(point: str, data_dir: Path) -> bool:
    if point not in _armed:
        return False
    marker = fired_dir(data_dir) / point
    marker.parent.mkdir(exist_ok=True)
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False  # fired already, here or in another actor
    os.fsync(fd)
    os.close(fd)
    log.warning("fault injected at %s", point)
    return True


def crash_point(point: str, data_dir: Path) -> None:
    """Exit at once, as a SIGKILL would, if ``point`` is armed and has not fired yet."""
    if _armed and _fire(point, data_dir):
        os._exit(EXIT_INJECTED)


def fails(point: str, data_dir: Path) -> bool:
    """True once if ``point`` is armed: the caller then behaves as if its I/O failed."""
    return bool(_armed) and _fire(point, data_dir)


def armed(point: str) -> bool:
    """True while ``point`` is armed, every time: for a seam that slows a step rather than
    failing it once. Callers ask once, at start."""
    return point in _armed
