"""ingest-batched: P producers, each sending batches of B records to its own partition; a
batch counts when its durable acknowledgement comes back. Latency: per batch."""

from __future__ import annotations

from ..bench import Bench, Runs, scenario_row
from ..clients import run_clients
from ..measure import Measurement, Row
from ..peers.base import Server
from ..settings import SHARDNODE


def ingest_batched(b: Bench, server: Server) -> Runs:
    s = b.s

    def run() -> Row:
        topic = b.name("ingest-batched")
        server.create_topic(topic, s.producers)
        jobs = [b.job(p, server.target, topic, partition=p, seconds=s.seconds)
                for p in range(s.producers)]
        results, rss = run_clients(server.workloads.produce, jobs, server.processes)
        return scenario_row("ingest-batched", server, Measurement.of(results, rss),
                            f"{s.producers} producers, batches of {s.batch}")

    def done(row: Row) -> None:
        if server.system == SHARDNODE:  # the checkpoint scenario's load is set from this
            b.capacity[(s.batch, s.size)] = (row.msgs_per_s, "ingest-batched's in this run")

    return Runs(run, done)
