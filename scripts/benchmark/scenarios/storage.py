"""storage: what a memory topic gains and costs against a RocksDB topic (issue 14), on the
node only: single-record ingest with C requests in flight (as ingest-single), batched ingest
(as ingest-batched, P producers), and reading one partition from its start (as read-tail),
each on a topic created with ``storage="rocksdb"`` and on one with ``storage="memory"``,
taking turns. The memory topic's budget (``storage.memory_bytes_max``, 64 MiB by default)
bounds what it keeps: the read-tail fill is sized to fit in it."""

from __future__ import annotations

from collections.abc import Callable

from ..bench import Bench, Runs
from ..clients import run_clients
from ..measure import Measurement, Row
from ..peers.base import Server
from ..peers.node import NodeServer
from ..settings import STORAGE

STORAGES = ("rocksdb", "memory")
READ_RECORDS_MAX = 100_000  # of 100-byte values: about 22 MB of the 64 MiB a memory topic may keep


def storage(b: Bench, server: Server) -> list[Runs]:
    if not isinstance(server, NodeServer):
        return []
    s = b.s
    runs: list[Runs] = []
    for kind in STORAGES:
        def create(name: str, partitions: int, kind: str = kind) -> str:
            topic = b.name(f"{name}-{kind}")
            with server.node.client() as c:
                c.create_topic(topic, partitions, storage=kind)
            return topic

        single = create("storage-single", 1)
        batched = create("storage-batched", s.producers)
        tail = create("storage-tail", 1)
        records = min(s.read_records, READ_RECORDS_MAX)

        def recreate(topic: str, partitions: int, kind: str = kind) -> None:
            """After an ingest run, untimed: a memory topic's records would otherwise take
            the budget the read-tail topic needs (the largest partitions lose first)."""
            with server.node.client() as c:
                c.delete_topic(topic)
                c.create_topic(topic, partitions, storage=kind)

        def run_single(topic: str = single, kind: str = kind,
                       recreate: Callable[[str, int], None] = recreate) -> Row:
            job = b.job(0, server.target, topic, seconds=s.seconds)
            results, rss = run_clients(server.workloads.produce_single, [job], server.processes)
            recreate(topic, 1)
            return Row.of(STORAGE, f"{kind}: ingest-single", Measurement.of(results, rss),
                          f"{s.concurrency} single-record requests in flight")

        def run_batched(topic: str = batched, kind: str = kind,
                        recreate: Callable[[str, int], None] = recreate) -> Row:
            jobs = [b.job(i, server.target, topic, partition=i, seconds=s.seconds)
                    for i in range(s.producers)]
            results, rss = run_clients(server.workloads.produce, jobs, server.processes)
            recreate(topic, s.producers)
            return Row.of(STORAGE, f"{kind}: ingest-batched", Measurement.of(results, rss),
                          f"{s.producers} producers, batches of {s.batch}")

        def run_tail(topic: str = tail, kind: str = kind, records: int = records,
                     recreate: Callable[[str, int], None] = recreate) -> Row:
            # Filled afresh, untimed: a memory topic's ingest runs may have taken the
            # budget from it (the largest partitions lose first, down to an equal share).
            recreate(topic, 1)
            b.fill(server, topic, s.producers, records, one_partition=True)
            job = b.job(0, server.target, topic, records_max=records)
            results, rss = run_clients(server.workloads.read_tail, [job], server.processes)
            return Row.of(STORAGE, f"{kind}: read-tail", Measurement.of(results, rss),
                          f"offset 0 to {records:,}, reads of {s.batch}")

        runs += [Runs(run_single, label=f"ingest-single {kind}"),
                 Runs(run_batched, label=f"ingest-batched {kind}"),
                 Runs(run_tail, label=f"read-tail {kind}")]
    return runs
