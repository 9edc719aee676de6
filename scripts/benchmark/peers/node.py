"""The node under test: shardnode through ``LocalNode``, on a fresh data directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import psutil

from actors.wal import list_segments, zeros_at_end
from node.client import NodeClient, NodeError
from node.local import LocalNode

from ..settings import SERVE_TIMEOUT_S, SHARDNODE
from ..workloads.node import (
    sn_kv,
    sn_produce,
    sn_produce_single,
    sn_read_key,
    sn_read_tail,
    sn_transact,
)
from .base import Workloads, dir_bytes


class NodeServer:
    """shardnode through ``LocalNode``, on its own fresh data directory."""

    system = SHARDNODE
    workloads = Workloads(sn_produce, sn_produce_single, sn_read_tail, sn_read_key, sn_transact,
                          sn_kv)
    note: Mapping[str, str] = MappingProxyType({})
    reads_consume = False

    def runs(self, scenario: str) -> bool:
        """The node runs every scenario."""
        return True

    def __init__(self, work_dir: Path, config: Path | None = None) -> None:
        self.node = LocalNode(work_dir / "data", config=config, log_file=work_dir / "node.log")
        self.target = self.node.endpoint

    def start(self) -> None:
        self.node.start(timeout_s=SERVE_TIMEOUT_S)
        # LocalNode takes any node answering on its port for its own: make sure it is ours.
        with self.node.client(timeout_ms=5000) as c:
            pid = c.status()["pid"]
        if self.node.proc is None or pid != self.node.proc.pid:
            self.node.kill()
            raise RuntimeError(f"port {self.node.port} is answered by another node (pid {pid})")

    def stop(self) -> None:
        if self.node.proc is not None:
            self.node.stop()

    def kill(self) -> None:
        self.node.kill()

    def processes(self) -> list[psutil.Process]:
        return self.node.processes()

    def create_topic(self, name: str, partitions: int) -> None:
        with self.node.client() as c:
            c.create_topic(name, partitions)

    def log_bytes(self) -> int:
        """The log's bytes, without the zeros the live segment was written ahead with."""
        log_dir = self.node.data_dir / "log"
        segments = list_segments(log_dir)
        ahead = zeros_at_end(segments[-1][1]) if segments else 0
        return dir_bytes(log_dir) - ahead

    def serves(self, name: str, lasts: dict[int, str]) -> bool:
        try:
            with NodeClient(self.target, timeout_ms=1000, retries=0) as c:
                for partition, last in lasts.items():
                    got = c.read(name, partition, int(last), 1)
                    if not got or got[0].offset != int(last):
                        return False
        except NodeError:
            return False
        return True

    def recovery_note(self) -> str:
        try:
            with self.node.client(timeout_ms=2000) as c:
                figures = c.status()["log"]
            return f"log scan {figures.get('recovery_ms')} ms by the node's own figure"
        except NodeError:
            return ""
