"""ingest-single: one process with C single-record produce requests in flight. Latency: per
request."""

from __future__ import annotations

from ..bench import Bench, Runs, scenario_row
from ..clients import run_clients
from ..measure import Measurement, Row
from ..peers.base import Server


def ingest_single(b: Bench, server: Server) -> Runs:
    s = b.s

    def run() -> Row:
        topic = b.name("ingest-single")
        server.create_topic(topic, 1)
        job = b.job(0, server.target, topic, seconds=s.seconds)
        results, rss = run_clients(server.workloads.produce_single, [job], server.processes)
        return scenario_row("ingest-single", server, Measurement.of(results, rss),
                            f"{s.concurrency} single-record requests in flight")

    return Runs(run)
