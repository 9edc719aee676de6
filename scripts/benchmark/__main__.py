"""shardnode's benchmark: named scenarios against a node it starts itself, and the same
workloads against peers in the same run, on the same machine.

    scripts/bench                                   # every scenario, every peer
    scripts/bench ingest-batched read-tail --seconds 10 --repeat 3
    scripts/bench --quick --json out.json --plot docs/bench.png
    scripts/bench ingest-batched ingest-single read-tail --peers rabbitmq
    scripts/bench spark --repeat 3
    scripts/bench cluster --repeat 3 --peers none
    scripts/bench large-values --repeat 2 --peers none
    scripts/bench kv --repeat 3

Scenarios: ingest-batched, ingest-single, read-tail, read-key, recovery, checkpoint, txn;
spark, cluster, large-values, kv and storage, only when named.
Systems: shardnode (the node, started here on a fresh data dir); redis (Redis Streams,
``appendfsync always``, started here on a free loopback port); rabbitmq (quorum queues,
publisher confirms, started here on free loopback ports: ingest-batched, ingest-single and
read-tail; runs only when named in --peers); floor (rocksdict, one
``sync=True`` put per record: ingest only); disk (raw fdatasync and synced 1 MiB writes under
the data dir: the ceiling, ingest only). ``checkpoint`` is shardnode's alone: acknowledgement
latency inside checkpoints against outside them, in both checkpoint modes, at half load.
``txn``: the node's transactions of 100 and of 1 record against the same records without a
transaction, and Redis MULTI/XADD/EXEC (redis). ``spark``: one SparkSession writing the same
rows through the shardnode sink (exactly_once, at_least_once), to Parquet files and to a
bare ZeroMQ socket, and reading them back through the shardnode source and from Parquet.
``cluster``: clusters of 1, 2 and 3 members started here, written to through routed clients
and through one member that forwards. ``large-values``: values of 1 MiB and 10 MiB written
and read back through a node keeping them in chunks and one leaving them to RocksDB's blob
files. ``kv``: kv_get, kv_put (one at a time and
--concurrency in flight), CAS increments and read_by_key in flight, against Redis GET, SET,
WATCH/GET/MULTI/SET/EXEC and HGET (redis). ``storage``: the node's single-record and batched
ingest and its read-tail on a memory topic against a RocksDB topic.

Every client workload runs in its own process (spawn start method): the parent starts the
servers, lines the clients up, fires them together, samples the servers' RSS and collects
one ``ClientResult`` per client from a queue. Every wait has a timeout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler

from .bench import Bench
from .measure import Row
from .peers import NAMES as PEERS
from .report import console, plot, print_table, print_targets
from .scenarios import NAMED_ONLY, SCENARIOS, run_scenario
from .settings import DISK, FLOOR, QUICK, RABBITMQ, REDIS, Settings

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
# RabbitMQ runs when named: its read-tail alone (fill 1 000 000 messages, consume them)
# takes over 5 minutes here, each --repeat again, and it boots in seconds.
DEFAULT_PEERS = (REDIS, FLOOR, DISK)


def parse_args(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    paragraphs = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(prog="scripts/bench", description=paragraphs[0],
                                epilog=paragraphs[2],  # the scenarios and the systems
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help=f"any of {', '.join(SCENARIOS)} (default: all but "
                        f"{', '.join(NAMED_ONLY)}, which run only when named)")
    p.add_argument("--producers", type=int, default=4, help="producer processes (default 4)")
    p.add_argument("--batch", type=int, default=1000, help="records per batch (default 1000)")
    p.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument("--concurrency", type=int, default=64,
                   help="ingest-single, kv: requests in flight (default 64)")
    p.add_argument("--seconds", type=float, help="length of each timed run (default 5)")
    p.add_argument("--repeat", type=int, help="runs per scenario, median reported (default 1)")
    p.add_argument("--read-records", type=int, help="read-tail: records to prefill and read")
    p.add_argument("--keys", type=int, help="read-key, kv: keys to prefill")
    p.add_argument("--recovery-mb", type=int, help="recovery: log size to fill (default 256)")
    p.add_argument("--spark-rows", type=int,
                   help="spark: rows each system writes and reads (default 1 000 000)")
    p.add_argument("--peers",
                   help=f"comma-separated peers to run: {', '.join(PEERS)}, or none (default: "
                        f"{','.join(DEFAULT_PEERS)}; {RABBITMQ} runs only when named)")
    p.add_argument("--no-install", action="store_true",
                   help="do not apt-get install a peer's server (redis-server, rabbitmq-server) "
                        "when it is missing")
    p.add_argument("--quick", action="store_true", help="every scenario small (smoke run)")
    p.add_argument("--json", type=Path, help="write the rows as a JSON list to this file")
    p.add_argument("--plot", type=Path, help="draw throughput and latency to this PNG")
    p.add_argument("--work-dir", type=Path, help="where data goes (default ./var/bench/run-*)")
    p.add_argument("--keep", action="store_true", help="keep the data directories")
    a = p.parse_args(argv)
    unknown = [x for x in a.scenarios if x not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    chosen = a.peers or ",".join(DEFAULT_PEERS)
    peers = frozenset() if chosen == "none" else frozenset(chosen.split(","))
    if peers - set(PEERS):
        p.error(f"unknown peer(s) {sorted(peers - set(PEERS))}")
    base = QUICK if a.quick else {}
    given = {k: v for k, v in (("seconds", a.seconds), ("repeat", a.repeat),
                               ("read_records", a.read_records), ("keys", a.keys),
                               ("recovery_mb", a.recovery_mb),
                               ("spark_rows", a.spark_rows)) if v is not None}
    default = tuple(x for x in SCENARIOS if x not in NAMED_ONLY)
    settings = Settings(tuple(a.scenarios or default), a.producers, a.batch, a.size,
                        a.concurrency, peers=peers, install=not a.no_install, quick=a.quick,
                        **{**base, **given})
    return settings, a


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", datefmt="%H:%M:%S",
                        handlers=[RichHandler(console=Console(stderr=True), show_path=False)])
    s, a = parse_args(argv)
    if a.work_dir is not None:
        a.work_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="run-", dir=a.work_dir))
    else:
        (ROOT / "var" / "bench").mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="run-", dir=ROOT / "var" / "bench"))
    log.info("bench in %s: %s; %s", work, ", ".join(s.scenarios),
             {k: v for k, v in asdict(s).items() if k not in ("scenarios", "peers")})
    started = time.monotonic()
    rows: list[Row] = []
    failures: list[str] = []
    bench = Bench(s, work)
    try:
        bench.start()
        for scenario in s.scenarios:
            got, failed = run_scenario(bench, scenario)
            rows += got
            failures += failed
    except Exception as exc:
        log.exception("the bench could not run")
        failures.append(f"bench: {exc}")
    finally:
        bench.close()
        failures += bench.failures
    for scenario in s.scenarios:
        print_table(scenario, [r for r in rows if r.scenario == scenario], s)
    print_targets(rows, s)
    for name, why in bench.skipped.items():
        console.print(f"[yellow]{name} peer skipped: {why}[/yellow]", highlight=False)
    if a.json is not None:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    if a.plot is not None and rows:
        plot(rows, a.plot)
    console.print(f"{len(rows)} rows in {time.monotonic() - started:.0f} s, "
                  f"{os.cpu_count()} CPUs, data in {work}")
    for f in failures:
        console.print(f"[red]FAILED[/red] {f}")
    if not failures and not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
