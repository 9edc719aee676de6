"""What a system under test is to the bench.

Two kinds of peer stand next to the node. A **server** (the node itself, redis, rabbitmq)
is a program the bench starts on a fresh directory and a free loopback port, runs the
scenarios' client workloads against, and stops: ``Server``; a peer of this kind is found
(or installed) and made through its ``ServerPeer``. A **reference** (floor, disk) is one
measurement taken once per bench run and shown in every ingest scenario's table.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from ..clients import ClientFn
from ..settings import Settings

log = logging.getLogger(__name__)

APT_TIMEOUT_S = 600        # one apt-get command (an install may fetch a runtime too)
APT_LOCK_TIMEOUT_S = 120   # apt-get waits this long for another apt-get to finish


@dataclass(frozen=True, slots=True)
class Workloads:
    """A system's client functions, one per kind of work (None: this system does not do it)."""

    produce: ClientFn
    produce_single: ClientFn
    read_tail: ClientFn
    read_key: ClientFn | None = None
    transact: ClientFn | None = None  # the txn scenario: produce in transactions
    kv: ClientFn | None = None        # the kv scenario: ``job.op`` with ``job.concurrency``
                                      # in flight


class Server(Protocol):
    """A system the bench starts, measures and stops. ``target`` is what its client
    workloads connect to; ``note`` says per scenario how the system does the work."""

    system: str
    workloads: Workloads
    target: str
    note: Mapping[str, str]
    reads_consume: bool  # a read takes the records away (a queue): refill before re-reading

    def runs(self, scenario: str) -> bool: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def processes(self) -> list[psutil.Process]: ...
    def create_topic(self, name: str, partitions: int) -> None: ...
    def log_bytes(self) -> int: ...
    def serves(self, name: str, lasts: dict[int, str]) -> bool: ...
    def recovery_note(self) -> str: ...


class Unavailable(Exception):
    """A peer's program is missing and cannot be installed; the message says why."""


@dataclass(frozen=True, slots=True)
class ServerPeer:
    """A peer run as a server: how to find its program, installing it when allowed (raises
    ``Unavailable``), and how to make a server of it (not started) on a work directory."""

    system: str
    program: str
    find: Callable[[bool], str]
    make: Callable[[str, Path, Settings], Server]


def find_or_install(program: str, package: str, locate: Callable[[], str | None],
                    install: bool) -> str:
    """``locate()``'s answer, after installing Debian's ``package`` when it has none, this is
    root and ``install`` allows it. Raises ``Unavailable`` saying why there is none."""
    found = locate()
    if found:
        return found
    if not install:
        raise Unavailable(f"{program} is not installed (and --no-install)")
    if os.geteuid() != 0:
        raise Unavailable(f"{program} is not installed and this is not root "
                          f"(install it with: apt-get install -y {package})")
    log.info("installing %s from Debian's packages", package)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = f"DPkg::Lock::Timeout={APT_LOCK_TIMEOUT_S}"
    for cmd in (["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "-o", lock, "--no-install-recommends",
                 package]):
        try:
            subprocess.run(cmd, env=env, check=True, timeout=APT_TIMEOUT_S,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except (subprocess.SubprocessError, OSError) as exc:
            raise Unavailable(f"could not install {program} ({exc})") from exc
    found = locate()
    if not found:
        raise Unavailable(f"{package} installed, yet no {program} found")
    return found


def which(program: str) -> Callable[[], str | None]:
    """Finds ``program`` on PATH or in /usr/bin:/usr/sbin."""
    return lambda: shutil.which(program) or shutil.which(program, path="/usr/bin:/usr/sbin")


def dir_bytes(path: Path) -> int:
    """Bytes under ``path``; a file deleted while we walk (a checkpoint, a rewrite) counts
    as empty."""
    total = 0
    for f in path.rglob("*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except FileNotFoundError:
            continue
    return total
