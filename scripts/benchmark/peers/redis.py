"""Redis Streams as a peer: Debian's ``redis-server`` with ``appendfsync always``, started
on a free loopback port in its own directory (installed when missing, as root)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import psutil

from node.local import free_port

from ..settings import REDIS, SERVE_TIMEOUT_S, Settings
from ..workloads.redis import (
    redis_kv,
    redis_produce,
    redis_produce_single,
    redis_read_key,
    redis_read_tail,
    redis_transact,
)
from .base import ServerPeer, Workloads, dir_bytes, find_or_install, which

SCENARIOS = frozenset({"ingest-batched", "ingest-single", "read-tail", "read-key", "recovery",
                       "txn", "kv"})


class RedisServer:
    """``redis-server`` with ``appendonly yes``, ``appendfsync always`` and no snapshots,
    on a free loopback port, in its own directory."""

    system = REDIS
    workloads = Workloads(redis_produce, redis_produce_single, redis_read_tail, redis_read_key,
                          redis_transact, redis_kv)
    note: Mapping[str, str] = MappingProxyType({
        "ingest-batched": "XADD pipelined, one stream per producer",
        "ingest-single": "redis.asyncio, concurrent XADDs",
        "read-tail": "XRANGE, 1000 entries a time",
        "read-key": "HGET on a hash: the nearest equivalent of read_by_key",
        "recovery": "AOF replay (auto-rewrite off)",
        "txn": "MULTI, XADD x n, EXEC in one round trip (pipeline, transaction=True)",
    })
    reads_consume = False

    def __init__(self, binary: str, work_dir: Path) -> None:
        self.binary = binary
        self.dir = work_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        (self.dir / "redis.conf").write_text(
            f"bind 127.0.0.1\nport {self.port}\ndir {self.dir}\n"
            "appendonly yes\nappendfsync always\nsave \"\"\n"
            "auto-aof-rewrite-percentage 0\ndaemonize no\n"
            f"logfile {self.dir / 'redis.log'}\n")

    def runs(self, scenario: str) -> bool:
        return scenario in SCENARIOS

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen([self.binary, str(self.dir / "redis.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}; "
                                       f"see {self.dir / 'redis.log'}")
                with contextlib.suppress(redis.exceptions.RedisError):
                    if r.ping():
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server not answering in {SERVE_TIMEOUT_S} s")
                time.sleep(0.01)  # poll interval while redis-server starts
        finally:
            r.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc = None

    def kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def processes(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [psutil.Process(self.proc.pid)]
        return []

    def create_topic(self, name: str, partitions: int) -> None:
        """Streams come into being with their first entry."""

    def log_bytes(self) -> int:
        return dir_bytes(self.dir / "appendonlydir")

    def serves(self, name: str, lasts: dict[int, str]) -> bool:
        import redis

        r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            return all(r.xrange(f"{name}:{p}", min=last, max=last) for p, last in lasts.items())
        except redis.exceptions.RedisError:  # LOADING while it replays, refused before that
            return False
        finally:
            r.close()

    def recovery_note(self) -> str:
        return ""


def find(install: bool) -> str:
    """The ``redis-server`` binary, installed from Debian's packages if missing and root."""
    return find_or_install("redis-server", "redis-server", which("redis-server"), install)


def make(binary: str, work_dir: Path, settings: Settings) -> RedisServer:
    return RedisServer(binary, work_dir)


PEER = ServerPeer(REDIS, "redis-server", find, make)
