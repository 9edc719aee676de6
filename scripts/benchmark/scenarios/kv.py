"""kv (issue 14): K keys put into a namespace and K keyed records into a topic (Redis: K
SETs and a hash of K fields), untimed; then one client process each run: kv_get one at a
time and with --concurrency in flight, kv_put the same two ways (answered once durable;
Redis SET with ``appendfsync always``), CAS one at a time (a get, then kv_cas incrementing a
counter; Redis WATCH/GET/MULTI/SET/EXEC), and read_by_key with --concurrency in flight
(Redis HGET; the read-key scenario has it one at a time). Every value read is checked
against its key. Each kind is its own ``Runs``: kinds and systems take turns, run by run.
Latency: per request (CAS: per increment)."""

from __future__ import annotations

from ..bench import Bench, Runs
from ..clients import ClientFn, run_clients
from ..measure import Measurement, Row
from ..peers.base import Server
from ..settings import CAS, GET, KV, KV_PREFILL_IN_FLIGHT, PUT, READ_BY_KEY, SHARDNODE, Settings


def kinds(s: Settings) -> list[tuple[str, int]]:
    """The scenario's rows: (op, requests in flight), in the order they are printed."""
    many = s.concurrency
    return [(GET, 1), (GET, many), (PUT, 1), (PUT, many), (CAS, 1), (READ_BY_KEY, many)]


# How each system does each op; {n}: the requests in flight.
NOTES = {
    SHARDNODE: {
        GET: "kv_get", PUT: "kv_put, answered once durable",
        CAS: "kv_get, then kv_cas incrementing a counter",
        READ_BY_KEY: "read_by_key on a keyed topic",
    },
    "redis": {
        GET: "GET", PUT: "SET, appendfsync always",
        CAS: "WATCH, GET, MULTI, SET, EXEC incrementing a counter (redis-py pipeline, 3 round "
             "trips): the closest equivalent of get + kv_cas",
        READ_BY_KEY: "HGET on a hash: the nearest equivalent of read_by_key",
    },
}
HOW_MANY = {SHARDNODE: "{n} requests in flight on one socket (raw request frames)",
            "redis": "{n} requests in flight on one connection (pipelined, a window)"}


def kv(b: Bench, server: Server) -> list[Runs]:
    s = b.s
    fn = server.workloads.kv
    assert fn is not None, f"{server.system} has no kv workload"
    namespace, topic = b.name(KV), b.name("kv-read")
    fill = b.job(0, server.target, namespace, op=PUT, records_max=s.keys,
                 concurrency=KV_PREFILL_IN_FLIGHT)
    filled = Measurement.of(run_clients(fn, [fill])[0], None)
    if filled.errors or filled.records != s.keys:
        raise AssertionError(f"kv prefill: {filled.records} of {s.keys} keys put, "
                             f"{filled.errors} errors")
    server.create_topic(topic, s.producers)
    b.fill(server, topic, s.producers, s.keys, keyed=True)
    return [_runs(b, server, fn, topic if op == READ_BY_KEY else namespace, op, n)
            for op, n in kinds(s)]


def _runs(b: Bench, server: Server, fn: ClientFn, name: str, op: str, in_flight: int) -> Runs:
    s = b.s
    how = "one at a time" if in_flight == 1 else HOW_MANY.get(server.system, "").format(n=in_flight)
    note = f"{NOTES.get(server.system, {}).get(op, op)}; {how}; {s.keys:,} keys"

    def run() -> Row:
        job = b.job(0, server.target, name, seconds=s.seconds, keys=s.keys, seed=7, op=op,
                    concurrency=in_flight)
        results, rss = run_clients(fn, [job], server.processes)
        m = Measurement.of(results, rss)
        if m.errors:
            raise AssertionError(f"{op} x{in_flight}: {m.errors} of {m.records + m.errors} "
                                 f"requests failed or read a wrong value")
        row = Row.of(KV, server.system, m, note)
        row.op, row.in_flight = op, in_flight
        return row

    return Runs(run, label=f"{op} x{in_flight}")
