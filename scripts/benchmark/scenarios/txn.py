"""txn (issue 11): P producers, one transaction at a time each, of 100 records and of 1
(begin, one produce_batch to the producer's own partition, commit: answered once durable),
against the same records produced without a transaction (one produce_batch at a time, to
the same partitions), and Redis MULTI / XADD x n / EXEC (``appendfsync always``). Latency:
per transaction (per batch without one), and for the node's transactions per op too
(begin, produce, commit). Each kind is its own ``Runs``: kinds and systems take turns, run
by run."""

from __future__ import annotations

from ..bench import Bench, Runs, scenario_row
from ..clients import ClientFn, run_clients
from ..measure import Measurement, Row, op_percentiles
from ..peers.base import Server
from ..settings import SHARDNODE, TXN, TXN_SIZES


def txn(b: Bench, server: Server) -> list[Runs]:
    """The server's transactions of each of TXN_SIZES records; for the node, the same
    records without a transaction beside each."""
    transact = server.workloads.transact
    assert transact is not None, f"{server.system} has no transaction workload"
    kinds: list[tuple[bool, ClientFn]] = [(True, transact)]
    if server.system == SHARDNODE:
        kinds.append((False, server.workloads.produce))
    return [_runs(b, server, size, in_txn, fn) for size in TXN_SIZES for in_txn, fn in kinds]


def _runs(b: Bench, server: Server, size: int, in_txn: bool, fn: ClientFn) -> Runs:
    s = b.s
    what = (f"transactions of {size}: begin, produce_batch, commit" if in_txn
            else f"produce_batch of {size}, no transaction")

    def run() -> Row:
        topic = b.name(TXN)
        server.create_topic(topic, s.producers)
        jobs = [b.job(p, server.target, topic, partition=p, seconds=s.seconds, batch=size)
                for p in range(s.producers)]
        results, rss = run_clients(fn, jobs, server.processes)
        row = scenario_row(TXN, server, Measurement.of(results, rss),
                           f"{s.producers} producers, {what}, one at a time each")
        row.per_request, row.txn = size, in_txn
        if server.system == SHARDNODE and in_txn:
            row.ops_ms = op_percentiles(results)
        return row

    return Runs(run, label=f"{'txn' if in_txn else 'plain'} x{size}")
