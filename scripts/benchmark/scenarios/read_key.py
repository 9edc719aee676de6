"""read-key: prefill K keyed records (untimed), then one client reads random keys, one at a
time, checking each value against its key."""

from __future__ import annotations

from ..bench import Bench, Runs, scenario_row
from ..clients import run_clients
from ..measure import Measurement, Row
from ..peers.base import Server


def read_key(b: Bench, server: Server) -> Runs:
    s = b.s
    read = server.workloads.read_key
    assert read is not None, f"{server.system} has no read-key workload"
    topic = b.name("read-key")
    server.create_topic(topic, s.producers)
    b.fill(server, topic, s.producers, s.keys, keyed=True)
    job = b.job(0, server.target, topic, seconds=s.seconds, keys=s.keys, seed=7)

    def run() -> Row:
        results, rss = run_clients(read, [job], server.processes)
        m = Measurement.of(results, rss)
        if m.errors:
            raise AssertionError(f"{m.errors} of {m.records} reads by key returned a wrong value")
        return scenario_row("read-key", server, m, f"one client, {s.keys:,} keys")

    return Runs(run)
