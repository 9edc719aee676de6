"""read-tail: prefill one partition (untimed, P writers), then one consumer reads it from
its start to its end in reads of B. A system whose reads take the records away (a queue)
is filled again before each repeated run."""

from __future__ import annotations

from ..bench import Bench, Runs, scenario_row
from ..clients import run_clients
from ..measure import Measurement, Row
from ..peers.base import Server


def read_tail(b: Bench, server: Server) -> Runs:
    s = b.s
    topic = b.name("read-tail")
    server.create_topic(topic, 1)
    b.fill(server, topic, s.producers, s.read_records, one_partition=True)
    job = b.job(0, server.target, topic, records_max=s.read_records)
    filled = True

    def run() -> Row:
        nonlocal filled
        if not filled:  # the last run's reads took the records: write them again, untimed
            b.fill(server, topic, s.producers, s.read_records, one_partition=True)
        results, rss = run_clients(server.workloads.read_tail, [job], server.processes)
        filled = not server.reads_consume
        return scenario_row("read-tail", server, Measurement.of(results, rss),
                            f"offset 0 to {s.read_records:,}, reads of {s.batch}")

    return Runs(run)
