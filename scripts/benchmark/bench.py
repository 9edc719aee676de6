"""A bench run's state: the servers it started, the steps scenarios share (jobs, untimed
fills, measurements taken once), and the node's batched capacity once known."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from .clients import Job, run_clients
from .measure import ClientResult, Measurement, Row, median_row
from .peers import REFERENCES, SERVER_PEERS
from .peers.base import Server, Unavailable
from .peers.node import NodeServer
from .settings import (
    CKPT_BATCH,
    CKPT_BYTES,
    CKPT_CAPACITY_S_MAX,
    SHARDNODE,
    Settings,
)
from .workloads.node import sn_produce

log = logging.getLogger(__name__)


class Bench:
    def __init__(self, settings: Settings, work: Path) -> None:
        self.s = settings
        self.work = work
        self.servers: list[Server] = []
        self.programs: dict[str, str] = {}  # each server peer's program, once found
        self.skipped: dict[str, str] = {}   # peers not run: why
        self._cache: dict[str, Row] = {}
        self.recovery_records: int | None = None  # every system recovers as many records
        # shardnode's batched ingest msgs/s by (records per batch, value bytes), once known
        self.capacity: dict[tuple[int, int], tuple[float, str]] = {}
        self._names = 0
        self.failures: list[str] = []  # what went wrong outside a scenario
        self._teardown: list[tuple[str, Callable[[], None]]] = []  # the running scenario's

    def start(self) -> None:
        node = NodeServer(self.work / SHARDNODE)
        node.start()
        self.servers.append(node)
        for peer in SERVER_PEERS.values():
            if peer.system not in self.s.peers:
                continue
            try:
                self.programs[peer.system] = peer.find(self.s.install)
            except Unavailable as exc:
                log.warning("%s: skipping the %s peer", exc, peer.system)
                self.skipped[peer.system] = f"{peer.program} not available ({exc})"
                continue
            server = peer.make(self.programs[peer.system], self.work / peer.system, self.s)
            try:
                server.start()
            except Exception as exc:  # the node's figures are still worth having
                log.error("%s did not start: %s", peer.program, exc)
                self.failures.append(f"{peer.program} did not start: {exc}")
                server.kill()
                continue
            self.servers.append(server)

    def after_scenario(self, what: str, step: Callable[[], None]) -> None:
        """Run ``step`` once the running scenario's runs are over, failed or not (what it
        set up for them all: Spark's session, a socket); the last added runs first."""
        self._teardown.append((what, step))

    def end_scenario(self) -> list[str]:
        """Run the steps ``after_scenario`` left, and say which failed."""
        failed = []
        while self._teardown:
            what, step = self._teardown.pop()
            try:
                step()
            except Exception as exc:  # run every step, and say which failed
                log.error("%s failed: %s", what, exc)
                failed.append(f"{what}: {exc}")
        return failed

    def close(self) -> None:
        self.failures += self.end_scenario()
        for server in self.servers:
            try:
                server.stop()
            except Exception as exc:  # stop every server, and say which did not stop cleanly
                log.error("%s did not stop cleanly: %s", server.system, exc)

    def fresh(self, system: str) -> Server:
        """A new server of ``system`` on a fresh directory of its own (recovery)."""
        work = self.work / f"{system}-{self.name('fresh')}"
        if system == SHARDNODE:
            return NodeServer(work)
        return SERVER_PEERS[system].make(self.programs[system], work, self.s)

    def checkpoint_node(self, mode: str) -> NodeServer:
        """A fresh node in ``mode`` that checkpoints only when asked."""
        work = self.work / f"{SHARDNODE}-{self.name(f'checkpoint-{mode}')}"
        work.mkdir(parents=True, exist_ok=True)
        config = work / "node.toml"
        config.write_text(f'[log]\ncheckpoint_mode = "{mode}"\n'
                          f"checkpoint_bytes = {CKPT_BYTES}  # no automatic checkpoint\n")
        return NodeServer(work, config)

    def checkpoint_capacity(self, node: NodeServer, topic: str) -> tuple[float, str]:
        """shardnode's batched msgs/s in batches of CKPT_BATCH, and where the figure is from:
        ingest-batched's when it ran with that batch and value size, else measured once here
        (closed loop, as ingest-batched, for min(--seconds, CKPT_CAPACITY_S_MAX))."""
        key = (CKPT_BATCH, self.s.size)
        if key not in self.capacity:
            seconds = min(self.s.seconds, CKPT_CAPACITY_S_MAX)
            jobs = [replace(self.job(p, node.target, topic, partition=p, seconds=seconds),
                            batch=CKPT_BATCH) for p in range(self.s.producers)]
            results, _ = run_clients(sn_produce, jobs)
            m = Measurement.of(results, None)
            self.capacity[key] = (m.per_s, f"measured here: {self.s.producers} producers, "
                                           f"closed loop, {seconds:g} s")
        return self.capacity[key]

    def name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}-{self._names}"

    def job(self, index: int, target: str, name: str, **kw: Any) -> Job:
        """A client's job with the run's batch, value size and concurrency, unless ``kw``
        says otherwise."""
        return Job(index, target, name, **{"batch": self.s.batch, "size": self.s.size,
                                           "concurrency": self.s.concurrency, **kw})

    def fill(self, server: Server, name: str, clients: int, total: int, *, keyed: bool = False,
             one_partition: bool = False) -> list[tuple[Job, ClientResult]]:
        """Write ``total`` records with ``clients`` producers, untimed. Client ``i`` writes to
        partition ``i`` (or all to partition 0), or keyed records of the ``i``-th slice."""
        per = math.ceil(total / clients)
        jobs = [self.job(i, server.target, name, partition=0 if one_partition else i,
                         records_max=min(per, total - i * per), keyed=keyed, first=i * per)
                for i in range(clients) if total - i * per > 0]
        results, _ = run_clients(server.workloads.produce, jobs)
        return list(zip(jobs, results, strict=True))

    def repeated(self, run: Callable[[], Row]) -> Row:
        return median_row([run() for _ in range(self.s.repeat)])

    def once(self, what: str, run: Callable[[], Row]) -> Row:
        """A measurement shared by several scenarios, taken once per bench run."""
        if what not in self._cache:
            self._cache[what] = self.repeated(run)
        return self._cache[what]

    def peer_rows(self, scenario: str) -> list[Row]:
        """The references (floor, disk), for an ingest scenario's table."""
        return [replace(self.once(name, partial(measure, self)), scenario=scenario)
                for name, measure in REFERENCES.items() if name in self.s.peers]


def scenario_row(scenario: str, server: Server, m: Measurement, note: str = "") -> Row:
    return Row.of(scenario, server.system, m, server.note.get(scenario, note))


@dataclass
class Runs:
    """A scenario set up on one server: each call of ``run`` measures it once.
    ``run_scenario`` calls it ``--repeat`` times, taking turns with the other servers (and
    the server's other ``Runs`` of the scenario) so that every system sees the machine in
    the same moods, and hands the median row to ``done``. ``label`` tells the log which of
    a server's runs this is, when it has several."""

    run: Callable[[], Row]
    done: Callable[[Row], None] | None = None
    label: str = ""
