"""The scenarios, one module each, and the runner that takes every system through one.

A new scenario is a module here: a function ``(Bench, Server) -> Result`` (``Runs`` to be
repeated, or rows measured once; a list when a system has several rows) registered in
``SCENARIOS`` (a server says which scenarios it runs: ``Server.runs``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..bench import Bench, Runs
from ..measure import Row, median_row
from ..peers.base import Server
from ..settings import (
    AT_LEAST_ONCE,
    CLUSTER,
    DISK,
    KV,
    LARGE_VALUES,
    SHARDNODE,
    SPARK,
    STORAGE,
    TXN,
)
from .checkpoint import checkpoint
from .cluster import cluster
from .ingest_batched import ingest_batched
from .ingest_single import ingest_single
from .kv import kv
from .large_values import large_values
from .read_key import read_key
from .read_tail import read_tail
from .recovery import recovery
from .spark import spark
from .storage import storage
from .txn import txn

log = logging.getLogger(__name__)

Result = Runs | Row | Sequence[Runs | Row]
SCENARIOS: dict[str, Callable[[Bench, Server], Result]] = {
    "ingest-batched": ingest_batched,
    "ingest-single": ingest_single,
    "read-tail": read_tail,
    "read-key": read_key,
    "recovery": recovery,
    "checkpoint": checkpoint,
    TXN: txn,
    SPARK: spark,
    CLUSTER: cluster,
    LARGE_VALUES: large_values,
    KV: kv,
    STORAGE: storage,
}
# Run only when named: Spark needs Java, a JVM of about 1 GB, 10-30 s; the cluster scenario
# starts three clusters (six more nodes); large-values writes 200 MiB four times over; kv
# has twelve timed runs (about 2 min with Redis).
NAMED_ONLY = (SPARK, CLUSTER, LARGE_VALUES, KV, STORAGE)
INGEST = ("ingest-batched", "ingest-single")  # the scenarios that show the references


def run_scenario(b: Bench, scenario: str) -> tuple[list[Row], list[str]]:
    """Every system's row of one scenario, with the ratios; and what failed. What the
    scenario set up for all its runs (``Bench.after_scenario``) is torn down at its end."""
    try:
        return _run_scenario(b, scenario)
    finally:
        b.failures += b.end_scenario()


def _run_scenario(b: Bench, scenario: str) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    failures: list[str] = []
    prepared: list[tuple[Server, Runs, list[Row]]] = []
    for server in b.servers:
        if not server.runs(scenario):
            continue
        log.info("%s: %s", scenario, server.system)
        try:
            got = SCENARIOS[scenario](b, server)
            for item in got if isinstance(got, Sequence) else [got]:
                if isinstance(item, Runs):
                    prepared.append((server, item, []))
                else:
                    rows.append(item)
        except Exception as exc:
            log.error("%s on %s failed: %s", scenario, server.system, exc)
            failures.append(f"{scenario} on {server.system}: {exc}")
    for k in range(b.s.repeat):  # the systems take turns, run by run
        for server, runs, measured in list(prepared):
            log.info("%s: %s%s, run %d of %d", scenario, server.system,
                     f" ({runs.label})" if runs.label else "", k + 1, b.s.repeat)
            try:
                measured.append(runs.run())
            except Exception as exc:
                log.error("%s on %s failed: %s", scenario, server.system, exc)
                failures.append(f"{scenario} on {server.system}: {exc}")
                prepared.remove((server, runs, measured))
    for _server, runs, measured in prepared:
        row = median_row(measured)
        if runs.done is not None:
            runs.done(row)
        rows.append(row)
    if scenario in INGEST:
        try:
            rows += b.peer_rows(scenario)
        except Exception as exc:
            log.error("%s: floor/disk failed: %s", scenario, exc)
            failures.append(f"{scenario} floor/disk: {exc}")
    add_ratios(rows)
    return rows, failures


def add_ratios(rows: list[Row]) -> None:
    """Each peer's row against the node's: the node's first row, or in the txn scenario its
    transactions of as many records, in the spark scenario its exactly-once sink or its
    source, in the kv scenario its row of the same op with as many in flight. Disk: the
    node's share of its MB/s."""
    for r in rows:
        sn = next((x for x in rows if x.system == SHARDNODE and x.per_request == r.per_request
                   and x.txn is not False and x.direction == r.direction
                   and x.guarantee != AT_LEAST_ONCE and x.op == r.op
                   and x.in_flight == r.in_flight), None)
        if sn is None:
            continue
        if r.system == DISK:
            r.shardnode_ratio = sn.mb_per_s / r.mb_per_s if r.mb_per_s else None
        elif r.system != SHARDNODE:
            r.shardnode_ratio = sn.msgs_per_s / r.msgs_per_s if r.msgs_per_s else None
