"""cluster (issue 13): ingest through routed clients on local clusters of 1, 2 and 3 members
of this machine, and the cost of forwarding (clients that know one member) against
routing. Run only when named.

Every cluster size is started once, before the first run, and kept up to the scenario's end
(an idle member takes no CPU to speak of); the kinds and sizes take turns, run by run. Each
kind writes to a fresh topic of ``producers`` partitions, placed over the members by the
catalog member; producer ``p`` writes to partition ``p``:

- ``batched``: batches of ``--batch`` records, one at a time per producer, as
  ingest-batched; routed: each batch to its partition's owner (``NodeClient`` given every
  member); forwarded: every producer knows member 1 only, which forwards what it does not
  own.
- ``single``: single-record requests, ``--concurrency`` in flight in all, split over the
  producers (a ``Pipeline`` each: routed, each request to its partition's owner; forwarded:
  every request to member 1).

Each row carries the CPU seconds each member's processes used in the run, and the
machine's (every process, the clients' too):
on two cores, more members cannot add CPU, only spread the work (and the Python overhead of
more processes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace

import psutil

from node.client import NodeClient
from node.local import LocalCluster

from ..bench import Bench, Runs
from ..clients import run_clients
from ..measure import Measurement, Row
from ..peers.base import Server
from ..settings import CLUSTER, CLUSTER_SIZES, FORWARDED, ROUTED, SERVE_TIMEOUT_S, SHARDNODE
from ..workloads.node import sn_produce, sn_produce_single


def cluster(b: Bench, server: Server) -> list[Runs]:
    """One ``Runs`` per (size, kind, routing); only the node runs this scenario."""
    clusters: dict[int, LocalCluster] = {}

    def up(n: int) -> LocalCluster:
        if n not in clusters:
            cl = LocalCluster(b.work / f"cluster-{n}", n)
            b.after_scenario(f"stopping the cluster of {n}", cl.stop)
            clusters[n] = cl.start(SERVE_TIMEOUT_S)
        return clusters[n]

    runs = []
    for n in CLUSTER_SIZES[:2] if b.s.quick else CLUSTER_SIZES:  # a smoke run: 1 and 2
        for batch in (b.s.batch, 1):
            runs.append(_runs(b, up, n, batch, ROUTED))
            if n > 1:
                runs.append(_runs(b, up, n, batch, FORWARDED))
    return runs


def _runs(b: Bench, up: Callable[[int], LocalCluster], n: int, batch: int,
          routing: str) -> Runs:
    s = b.s
    kind = "batched" if batch > 1 else "single"

    def run() -> Row:
        cl = up(n)
        topic = b.name(CLUSTER)
        with NodeClient(cl.endpoints, timeout_ms=30_000) as c:
            c.create_topic(topic, s.producers)
            owners = c.owners(topic)
            first = cl.nodes[min(cl.nodes)].endpoint
            # A routed client each, or one that knows member 1 only.
            targets = [first if routing == FORWARDED else ",".join(cl.endpoints)] * s.producers
        per = max(1, s.concurrency // s.producers)
        jobs = [replace(b.job(p, targets[p], topic, partition=p, seconds=s.seconds),
                        batch=batch, concurrency=per) for p in range(s.producers)]
        meter = NodeCpu(cl)
        meter.start()
        results, rss = run_clients(sn_produce if batch > 1 else sn_produce_single, jobs,
                                   lambda: [p for node in cl.nodes.values()
                                            for p in node.processes()])
        row = Row.of(CLUSTER, SHARDNODE, Measurement.of(results, rss),
                           f"{n} member{'s' if n > 1 else ''}, {kind}, {routing}: "
                           f"{s.producers} producers, partitions on members {list(owners)}"
                           + (f", {per} requests in flight each" if batch == 1 else ""))
        row.per_request, row.nodes, row.routing = batch, n, routing
        row.cpu_s = meter.stop()
        return row

    return Runs(run, label=f"{n} member{'s' if n > 1 else ''}, {kind}, {routing}")


class NodeCpu:
    """CPU seconds (user + system) of each member's processes between ``start`` and
    ``stop``, and the machine's busy CPU seconds (every process: the clients too, which
    have exited by ``stop``)."""

    def __init__(self, cl: LocalCluster) -> None:
        self.cl = cl
        self.before: dict[int, float] = {}
        self.machine_before = 0.0

    def _sample(self) -> dict[int, tuple[str, float]]:
        out: dict[int, tuple[str, float]] = {}
        for member, node in self.cl.nodes.items():
            for p in node.processes():
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    out[p.pid] = (f"node-{member}", t.user + t.system)
        return out

    @staticmethod
    def _machine() -> float:
        t = psutil.cpu_times()
        return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))

    def start(self) -> None:
        self.before = {pid: cpu for pid, (_g, cpu) in self._sample().items()}
        self.machine_before = self._machine()

    def stop(self) -> dict[str, float]:
        used = {f"node-{m}": 0.0 for m in self.cl.nodes}
        for pid, (group, cpu) in self._sample().items():
            used[group] += max(0.0, cpu - self.before.get(pid, 0.0))
        used["machine"] = self._machine() - self.machine_before
        return used
