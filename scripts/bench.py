"""shardnode's benchmark: named scenarios against a node it starts itself, and the same
workloads against peers in the same run, on the same machine.

    scripts/bench                                   # every scenario, every peer
    scripts/bench ingest-batched read-tail --seconds 10 --repeat 3
    scripts/bench --quick --json out.json --plot docs/bench.png

Scenarios: ingest-batched, ingest-single, read-tail, read-key, recovery, checkpoint.
Systems: shardnode (the node, started here on a fresh data dir); redis (Redis Streams,
``appendfsync always``, started here on a free loopback port); floor (rocksdict, one
``sync=True`` put per record: ingest only); disk (raw fdatasync and synced 1 MiB writes under
the data dir: the ceiling, ingest only). ``checkpoint`` is shardnode's alone: acknowledgement
latency inside checkpoints against outside them, in both checkpoint modes, at half load.

Every client workload runs in its own process (spawn start method): the parent starts the
servers, lines the clients up, fires them together, samples the servers' RSS and collects
one ``ClientResult`` per client from a queue. Every wait has a timeout.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import logging
import math
import multiprocessing as mp
import os
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, Self, cast

import psutil
from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from node.client import NodeClient, NodeError, Pipeline, Record
from node.local import LocalNode, free_port
from wire.records import pack_batch

log = logging.getLogger("bench")
console = Console()

ROOT = Path(__file__).resolve().parent.parent
MB = 1_000_000
MIB = 1 << 20
KEY_BYTES = 16  # b"key-%012d"

START_TIMEOUT_S = 60.0      # a client process has this long to connect and line up
DRAIN_TIMEOUT_S = 15.0      # after its time is up, a client waits this long for answers
PREFILL_TIMEOUT_S = 600.0   # an untimed fill (prefill, recovery fill) must end by then
SERVE_TIMEOUT_S = 300.0     # a restarted server must serve the last record by then
RSS_INTERVAL_S = 0.5
DISK_SEQ_BYTES_MAX = 1 << 30  # the sequential-write probe stops after 1 GiB
FLOOR = "floor"
DISK = "disk"
SHARDNODE = "shardnode"
REDIS = "redis"

# The checkpoint scenario: paced producers at CKPT_LOAD of the node's batched capacity (in
# batches of CKPT_BATCH records, so there are many acknowledgements to classify) while a
# client runs checkpoints back to back, CKPT_GAP_S apart.
CKPT_MODES = ("fuzzy", "blocking")
CKPT_BATCH = 100
CKPT_LOAD = 0.5
CKPT_GAP_S = 0.5
CKPT_SECONDS_PER = 4        # the timed run is this many times --seconds (full: 20 s) ...
CKPT_SECONDS_MIN = 2.0      # ... and at least this long (quick: this long)
CKPT_CAPACITY_S_MAX = 2.0   # the capacity probe runs min(--seconds, this)
CKPT_IN_FLIGHT_MAX = 1000   # a paced producer's requests in flight (a blocking checkpoint
                            # holds them); under the client Pipeline's own bound of 1 024
CKPT_LATE_S = 0.005         # a send this far behind its schedule counts as late
CKPT_GOAL = 2.0             # fuzzy: p99 inside at most this many times p99 outside
CKPT_TIMEOUT_MS = 120_000   # one checkpoint request
CKPT_BYTES = 1 << 40        # checkpoint_bytes of the scenario's nodes: no automatic checkpoint
INSIDE = "inside"
OUTSIDE = "outside"


# ---- settings ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    scenarios: tuple[str, ...]
    producers: int = 4
    batch: int = 1000
    size: int = 100
    concurrency: int = 64
    seconds: float = 5.0
    repeat: int = 1
    read_records: int = 1_000_000
    keys: int = 200_000
    recovery_mb: int = 256
    peers: frozenset[str] = frozenset({REDIS, FLOOR, DISK})
    install: bool = True
    quick: bool = False

    def __post_init__(self) -> None:
        assert self.producers >= 1 and self.batch >= 1 and self.concurrency >= 1
        assert self.size >= KEY_BYTES, "values carry their key number: at least 16 bytes"
        assert self.seconds > 0 and self.repeat >= 1 and self.recovery_mb >= 1
        assert self.read_records >= self.batch and self.keys >= 1


QUICK = {"seconds": 0.5, "repeat": 1, "read_records": 20_000, "keys": 2_000, "recovery_mb": 4}


# ---- results and the shared timing helpers -------------------------------------------


@dataclass(slots=True)
class ClientResult:
    """What one client process measured. Times are ``time.monotonic()`` (system-wide)."""

    records: int = 0
    payload_bytes: int = 0
    started: float = 0.0
    finished: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    last: str = ""  # the position of the last record written (offset or stream id)
    sends_s: list[float] = field(default_factory=list)  # paced: send time of each latency
    late: int = 0  # paced: sends more than CKPT_LATE_S behind their schedule
    intervals: list[tuple[float, float]] = field(default_factory=list)  # checkpoints run


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Measurement:
    records: int
    payload_bytes: int
    elapsed_s: float
    p50_s: float | None
    p99_s: float | None
    errors: int
    rss_mb: float | None

    @classmethod
    def of(cls, results: Sequence[ClientResult], rss_mb: float | None) -> Measurement:
        """Clients measured together: their records over the span from first start to last end."""
        latencies = [x for r in results for x in r.latencies_s]
        span = max(r.finished for r in results) - min(r.started for r in results)
        return cls(sum(r.records for r in results), sum(r.payload_bytes for r in results),
                   max(span, 1e-9), percentile(latencies, 50), percentile(latencies, 99),
                   sum(r.errors for r in results), rss_mb)

    @property
    def per_s(self) -> float:
        return self.records / self.elapsed_s

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / MB / self.elapsed_s


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


@dataclass(slots=True)
class Row:
    """One line of a scenario's table, and one object of the ``--json`` list."""

    scenario: str
    system: str
    msgs_per_s: float
    mb_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    rss_mb: float | None
    records: int
    seconds: float
    errors: int = 0
    runs: int = 1
    note: str = ""
    shardnode_ratio: float | None = None  # shardnode ÷ this system (disk: shardnode's share)
    # the checkpoint scenario only (None elsewhere)
    mode: str | None = None             # checkpoint_mode: fuzzy | blocking
    phase: str | None = None            # inside | outside a checkpoint
    checkpoints: int | None = None      # checkpoints run during the timed part
    checkpoint_ms: float | None = None  # their mean duration, as the client saw it
    p99_ratio: float | None = None      # p99 inside ÷ p99 outside, for this mode

    @classmethod
    def of(cls, scenario: str, system: str, m: Measurement, note: str = "") -> Row:
        return cls(scenario, system, m.per_s, m.mb_per_s, _ms(m.p50_s), _ms(m.p99_s),
                   m.rss_mb, m.records, m.elapsed_s, m.errors, 1, note)


def median_row(rows: Sequence[Row]) -> Row:
    """The median of each figure over repeated runs of one scenario on one system."""
    assert rows and len({(r.scenario, r.system) for r in rows}) == 1

    def med(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    first = rows[0]
    out = replace(first, runs=len(rows), errors=sum(r.errors for r in rows))
    for name in ("msgs_per_s", "mb_per_s", "p50_ms", "p99_ms", "rss_mb", "seconds",
                 "checkpoint_ms", "p99_ratio"):
        setattr(out, name, med([getattr(r, name) for r in rows]))
    out.records = int(statistics.median(r.records for r in rows))
    counts = [r.checkpoints for r in rows if r.checkpoints is not None]
    out.checkpoints = int(statistics.median(counts)) if counts else None
    return out


# ---- records the clients send ---------------------------------------------------------


def key_of(i: int) -> bytes:
    return b"key-%012d" % i


def value_of(i: int, size: int) -> bytes:
    """A keyed record's value: its key number, padded; a read checks it against the key."""
    return (b"%016d" % i).ljust(size, b"v")


@dataclass(frozen=True, slots=True)
class Job:
    """One client's work. ``seconds`` or ``records_max`` (or both) bound it."""

    index: int
    target: str             # node endpoint, redis "host:port", or a directory
    name: str               # topic (redis: stream prefix, or hash for keyed records)
    partition: int = 0
    batch: int = 1000
    size: int = 100
    seconds: float = 0.0
    records_max: int = 0
    keyed: bool = False     # keyed records numbered from ``first``, partitioned by key
    first: int = 0
    keys: int = 0           # read-key: the key space to draw from
    concurrency: int = 1
    seed: int = 0
    rate: float = 0.0       # paced producer: records per second
    gap_s: float = 0.0      # checkpointer: pause after each checkpoint

    def __post_init__(self) -> None:
        assert self.seconds > 0 or self.records_max > 0, "a job needs a bound"


class Budget:
    """How long a client goes on: until its time is up or it has done ``records_max``."""

    def __init__(self, job: Job) -> None:
        limit_s = job.seconds if job.seconds > 0 else PREFILL_TIMEOUT_S
        self.deadline = time.monotonic() + limit_s
        self.records_max = job.records_max

    def next_count(self, done: int, batch: int) -> int:
        """Records for the next request; 0 when the client is done."""
        if time.monotonic() >= self.deadline:
            return 0
        if self.records_max:
            return max(0, min(batch, self.records_max - done))
        return batch


class Payload:
    """The records of one client: ``batch`` fixed random values, or keyed records."""

    def __init__(self, job: Job) -> None:
        self.job = job
        rng = random.Random(job.seed * 1000 + job.index)
        self.values = [] if job.keyed else [rng.randbytes(job.size) for _ in range(job.batch)]

    def batch(self, done: int, n: int) -> tuple[list[bytes] | None, list[bytes]]:
        """(keys or None, values) of the ``n`` records after the first ``done``."""
        if not self.job.keyed:
            return None, self.values if n == len(self.values) else self.values[:n]
        numbers = range(self.job.first + done, self.job.first + done + n)
        return [key_of(i) for i in numbers], [value_of(i, self.job.size) for i in numbers]


# ---- client processes: line up, go together, report through a queue -----------------


@dataclass(frozen=True, slots=True)
class Ready:
    index: int


@dataclass(frozen=True, slots=True)
class Finished:
    index: int
    result: ClientResult


@dataclass(frozen=True, slots=True)
class Failed:
    index: int
    error: str


class Gate:
    """A client's side of the start line: say it is ready, then wait for the start."""

    def __init__(self, index: int, reports: Any, go: Any) -> None:
        self.index, self.reports, self.go = index, reports, go

    def wait(self) -> None:
        self.reports.put(Ready(self.index))
        if not self.go.wait(START_TIMEOUT_S):
            raise TimeoutError(f"client {self.index}: no start signal in {START_TIMEOUT_S} s")


ClientFn = Callable[[Job, Gate], ClientResult]


def _client_main(fn: ClientFn, job: Job, reports: Any, go: Any) -> None:
    try:
        reports.put(Finished(job.index, fn(job, Gate(job.index, reports, go))))
    except BaseException:  # whatever it was, the parent must hear of it
        reports.put(Failed(job.index, traceback.format_exc()))


class ClientsFailed(RuntimeError):
    """A client process failed, died or did not finish in time."""


class RssSampler:
    """The largest total RSS of some processes, sampled every ``interval_s`` in a thread."""

    def __init__(self, processes: Callable[[], list[psutil.Process]],
                 interval_s: float = RSS_INTERVAL_S) -> None:
        self.processes = processes
        self.interval_s = interval_s
        self.max_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def sample(self) -> None:
        total = 0
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        self.max_bytes = max(self.max_bytes, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> Self:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.interval_s + 5)
        self.sample()

    @property
    def max_mb(self) -> float | None:
        return self.max_bytes / MB if self.max_bytes else None


def run_clients(fn: ClientFn | Sequence[ClientFn], jobs: Sequence[Job],
                rss_of: Callable[[], list[psutil.Process]] | None = None,
                timeout_s: float | None = None) -> tuple[list[ClientResult], float | None]:
    """Run ``fn`` once per job (or ``fn[i]`` for job ``i``), each in its own process, all
    starting together.

    Returns the results in job order and the largest RSS (MB) of ``rss_of()`` — or of the
    client processes themselves when it is None — seen while they ran.
    """
    fns = list(fn) if isinstance(fn, Sequence) else [fn] * len(jobs)
    assert len(fns) == len(jobs)
    what = "+".join(dict.fromkeys(f.__name__ for f in fns))
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_client_main, args=(f, job, reports, go), daemon=True,
                         name=f"{f.__name__}-{job.index}") for f, job in zip(fns, jobs, strict=True)]
    if timeout_s is None:
        longest = max(j.seconds for j in jobs)
        timeout_s = longest + DRAIN_TIMEOUT_S + 30 if longest > 0 else PREFILL_TIMEOUT_S
    results: dict[int, ClientResult] = {}
    ready: set[int] = set()

    def collect(until: Callable[[], bool], deadline: float, stage: str) -> None:
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientsFailed(f"{what}: clients not {stage} in time")
            try:
                msg = reports.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise ClientsFailed(f"client processes died: {dead}") from None
                continue
            if isinstance(msg, Failed):
                raise ClientsFailed(f"client {msg.index} of {what} failed:\n{msg.error}")
            if isinstance(msg, Ready):
                ready.add(msg.index)
            elif isinstance(msg, Finished):
                results[msg.index] = msg.result

    try:
        for p in procs:
            p.start()
        collect(lambda: len(ready) == len(jobs), time.monotonic() + START_TIMEOUT_S, "ready")
        live = [psutil.Process(p.pid) for p in procs if p.pid is not None]
        with RssSampler(rss_of or (lambda: live)) as rss:
            go.set()
            collect(lambda: len(results) == len(jobs), time.monotonic() + timeout_s, "finished")
    finally:
        finished = len(results) == len(jobs)
        for p in procs:
            p.join(timeout=5 if finished else 0)  # after a failure, end the others at once
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        reports.close()
    return [results[j.index] for j in jobs], rss.max_mb


# ---- workloads: shardnode (run inside client processes) -----------------------------


def sn_produce(job: Job, gate: Gate) -> ClientResult:
    """Batches of ``job.batch`` records, one produce request at a time, each acknowledged
    once durable. Unkeyed records go to ``job.partition``; keyed ones by key hash."""
    payload = Payload(job)
    res = ClientResult()
    with NodeClient(job.target, timeout_ms=30_000) as c:
        c.partitions(job.name)
        gate.wait()
        budget = Budget(job)
        res.started = time.monotonic()
        while n := budget.next_count(res.records, job.batch):
            keys, values = payload.batch(res.records, n)
            records: list[Record] | list[bytes] = values if keys is None else \
                [Record(v, k) for k, v in zip(keys, values, strict=True)]
            t0 = time.monotonic()
            offsets = c.produce_batch(job.name, records, None if job.keyed else job.partition)
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if len(offsets) != n:
                raise AssertionError(f"{n} records produced, {len(offsets)} offsets answered")
            res.records += n
            res.payload_bytes += n * job.size
            res.last = str(offsets[-1][1])
    return res


def take_answers(pipe: Pipeline, sent: dict[int, float], res: ClientResult, wait_ms: int,
                 records: int, size: int, keep_sends: bool = False) -> None:
    """Collect what ``pipe`` answers within ``wait_ms`` for the requests in ``sent`` (request
    id → send time), each of ``records`` records of ``size`` bytes: count them and their
    latency (and send time, with ``keep_sends``), or one error per failed request."""
    for rid, out in pipe.poll(wait_ms):
        t = time.monotonic()
        t0 = sent.pop(rid)
        if isinstance(out, NodeError):
            res.errors += 1
            continue
        res.records += records
        res.payload_bytes += records * size
        if keep_sends:
            res.sends_s.append(t0)
        res.latencies_s.append(t - t0)
        res.finished = t


def sn_produce_single(job: Job, gate: Gate) -> ClientResult:
    """Single-record produce requests, ``job.concurrency`` of them in flight at once."""
    value = random.Random(job.index).randbytes(job.size)
    blob = pack_batch([value])
    res = ClientResult()
    sent: dict[int, float] = {}
    with NodeClient(job.target, timeout_ms=30_000) as c:
        c.partitions(job.name)
        pipe = c.pipeline()
        gate.wait()
        res.started = time.monotonic()
        deadline = res.started + job.seconds
        while True:
            now = time.monotonic()
            if now < deadline:
                while len(sent) < job.concurrency:
                    sent[pipe.submit(job.name, [value], job.partition, blob=blob)] = now
            elif not sent or now > deadline + DRAIN_TIMEOUT_S:
                break
            take_answers(pipe, sent, res, 100, records=1, size=job.size)
        res.errors += len(sent)  # never answered within the drain time
    return res


def sn_read_tail(job: Job, gate: Gate) -> ClientResult:
    """Read a partition from offset 0 to ``job.records_max`` in reads of ``job.batch``."""
    res = ClientResult()
    with NodeClient(job.target, timeout_ms=30_000) as c:
        gate.wait()
        budget = Budget(job)
        res.started = time.monotonic()
        while n := budget.next_count(res.records, job.batch):
            t0 = time.monotonic()
            records = c.read(job.name, job.partition, res.records, n)
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if not records or records[0].offset != res.records or \
                    records[-1].offset != res.records + len(records) - 1:
                raise AssertionError(f"read at offset {res.records}: got offsets "
                                     f"{[r.offset for r in records[:1] + records[-1:]]}")
            res.records += len(records)
            res.payload_bytes += sum(len(r.value) for r in records)
    return res


def sn_read_key(job: Job, gate: Gate) -> ClientResult:
    """Random ``read_by_key`` calls, one at a time, each checked against its key."""
    rng = random.Random(job.seed * 1000 + job.index)
    res = ClientResult()
    with NodeClient(job.target, timeout_ms=30_000) as c:
        c.partitions(job.name)
        gate.wait()
        budget = Budget(job)
        res.started = time.monotonic()
        while budget.next_count(res.records, 1):
            i = rng.randrange(job.keys)
            t0 = time.monotonic()
            record = c.read_by_key(job.name, key_of(i))
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if record is None or record.value != value_of(i, job.size):
                res.errors += 1
            res.records += 1
            res.payload_bytes += job.size
    return res


def sn_produce_paced(job: Job, gate: Gate) -> ClientResult:
    """Open loop: a batch of ``job.batch`` records to ``job.partition`` every
    ``batch / rate`` seconds on a monotonic schedule (send k is due at start + k·interval),
    whether or not earlier ones were answered (at most ``job.concurrency`` in flight), so a
    stalled acknowledgement never postpones the sends behind it. Records (send, ack) per
    request in ``sends_s`` and ``latencies_s``."""
    values = Payload(job).values
    blob = pack_batch(values)
    interval = job.batch / job.rate
    res = ClientResult()
    sent: dict[int, float] = {}
    with NodeClient(job.target, timeout_ms=30_000) as c:
        c.partitions(job.name)
        pipe = c.pipeline()
        gate.wait()
        res.started = time.monotonic()
        end = res.started + job.seconds
        first = res.started + interval * random.Random(job.index).random()  # stagger clients
        k = 0
        while True:
            now = time.monotonic()
            due = first + k * interval
            if due < end:
                if now >= due and len(sent) < job.concurrency:
                    sent[pipe.submit(job.name, values, job.partition, blob=blob)] = now
                    if now - due > CKPT_LATE_S:
                        res.late += 1
                    k += 1
                    continue
                wait_ms = 1 if now >= due else math.ceil((due - now) * 1000)
            elif not sent or now > end + DRAIN_TIMEOUT_S:
                break
            else:
                wait_ms = 100
            take_answers(pipe, sent, res, wait_ms, records=job.batch, size=job.size,
                         keep_sends=True)
        res.errors += len(sent)  # never answered within the drain time
    return res


def sn_checkpointer(job: Job, gate: Gate) -> ClientResult:
    """Checkpoints back to back for ``job.seconds``: one waits ``job.gap_s`` after the start
    and after each checkpoint ends; records each one's [start, end] in ``intervals``."""
    res = ClientResult()
    with NodeClient(job.target, timeout_ms=CKPT_TIMEOUT_MS, retries=0) as c:
        gate.wait()
        res.started = time.monotonic()
        end = res.started + job.seconds
        next_start = res.started + job.gap_s  # the producers run alone first
        while next_start < end:
            time.sleep(max(0.0, next_start - time.monotonic()))  # until a deadline: no drift
            t0 = time.monotonic()
            try:
                c.checkpoint()
            except NodeError:  # abandoned or timed out: it still ran over this interval
                res.errors += 1
            t1 = time.monotonic()
            res.intervals.append((t0, t1))
            next_start = t1 + job.gap_s
        res.finished = time.monotonic()
    return res


# ---- workloads: redis ----------------------------------------------------------------


def _redis_address(target: str) -> tuple[str, int]:
    host, port = target.rsplit(":", 1)
    return host, int(port)


def _stream(job: Job) -> str:
    return f"{job.name}:{job.partition}"


def redis_produce(job: Job, gate: Gate) -> ClientResult:
    """XADD pipelined ``job.batch`` at a time into the job's stream (keyed records: one
    HSET of the batch into the hash ``job.name``)."""
    import redis

    host, port = _redis_address(job.target)
    payload = Payload(job)
    res = ClientResult()
    r = redis.Redis(host=host, port=port, socket_timeout=30)
    try:
        r.ping()
        gate.wait()
        budget = Budget(job)
        res.started = time.monotonic()
        stream = _stream(job)
        while n := budget.next_count(res.records, job.batch):
            keys, values = payload.batch(res.records, n)
            t0 = time.monotonic()
            pipe = r.pipeline(transaction=False)
            if keys is None:
                for v in values:
                    pipe.xadd(stream, {b"v": v})
            else:
                pipe.hset(job.name, mapping=dict(zip(keys, values, strict=True)))
            replies = pipe.execute()
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            res.records += n
            res.payload_bytes += n * job.size
            if keys is None:
                res.last = replies[-1].decode()
    finally:
        r.close()
    return res


def redis_produce_single(job: Job, gate: Gate) -> ClientResult:
    """``job.concurrency`` concurrent XADDs of one record each (redis.asyncio)."""
    import asyncio

    import redis.asyncio as aredis

    host, port = _redis_address(job.target)
    value = random.Random(job.index).randbytes(job.size)
    res = ClientResult()
    stream = _stream(job)

    async def main() -> None:
        r = aredis.Redis(host=host, port=port, socket_timeout=30,
                         max_connections=job.concurrency)
        try:
            await r.ping()
            gate.wait()
            res.started = time.monotonic()
            deadline = res.started + job.seconds

            async def writer() -> None:
                while time.monotonic() < deadline:
                    t0 = time.monotonic()
                    await r.xadd(stream, {b"v": value})
                    t = time.monotonic()
                    res.latencies_s.append(t - t0)
                    res.records += 1
                    res.payload_bytes += job.size
                    res.finished = max(res.finished, t)

            await asyncio.wait_for(asyncio.gather(*(writer() for _ in range(job.concurrency))),
                                   timeout=job.seconds + DRAIN_TIMEOUT_S)
        finally:
            await r.aclose()

    asyncio.run(main())
    return res


def redis_read_tail(job: Job, gate: Gate) -> ClientResult:
    """XRANGE ``job.batch`` entries at a time from the start of the stream."""
    import redis

    host, port = _redis_address(job.target)
    res = ClientResult()
    r = redis.Redis(host=host, port=port, socket_timeout=30)
    try:
        r.ping()
        gate.wait()
        budget = Budget(job)
        res.started = time.monotonic()
        start = "-"
        while n := budget.next_count(res.records, job.batch):
            t0 = time.monotonic()
            entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                           r.xrange(_stream(job), min=start, max="+", count=n))
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if not entries:
                raise AssertionError(f"stream ended after {res.records} entries")
            res.records += len(entries)
            res.payload_bytes += sum(len(e[1][b"v"]) for e in entries)
            start = "(" + entries[-1][0].decode()
    finally:
        r.close()
    return res


def redis_read_key(job: Job, gate: Gate) -> ClientResult:
    """Random HGETs on the hash ``job.name``: Redis' nearest equivalent of read_by_key."""
    import redis

    host, port = _redis_address(job.target)
    rng = random.Random(job.seed * 1000 + job.index)
    res = ClientResult()
    r = redis.Redis(host=host, port=port, socket_timeout=30)
    try:
        r.ping()
        gate.wait()
        budget = Budget(job)
        res.started = time.monotonic()
        while budget.next_count(res.records, 1):
            i = rng.randrange(job.keys)
            t0 = time.monotonic()
            value = r.hget(job.name, key_of(i))
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if value != value_of(i, job.size):
                res.errors += 1
            res.records += 1
            res.payload_bytes += job.size
    finally:
        r.close()
    return res


# ---- workloads: floor and disk -------------------------------------------------------


def floor_produce(job: Job, gate: Gate) -> ClientResult:
    """One process, one rocksdict put with ``sync=True`` (one fsync) per record."""
    from rocksdict import Options, Rdict, WriteOptions

    value = random.Random(job.index).randbytes(job.size)
    sync = WriteOptions()
    sync.sync = True
    res = ClientResult()
    db = Rdict(job.target, Options(raw_mode=True))
    try:
        gate.wait()
        budget = Budget(job)
        res.started = time.monotonic()
        while budget.next_count(res.records, 1):
            t0 = time.monotonic()
            db.put(key_of(res.records), value, sync)
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            res.records += 1
            res.payload_bytes += job.size
    finally:
        db.close()
    return res


def disk_synced_writes(job: Job, gate: Gate) -> ClientResult:
    """Append ``job.size`` bytes and fdatasync, again and again, to a file in ``job.target``."""
    path = Path(job.target) / f"disk-probe-{job.size}"
    data = random.Random(job.index).randbytes(job.size)
    res = ClientResult()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        gate.wait()
        budget = Budget(job)
        res.started = time.monotonic()
        while budget.next_count(res.records, 1):
            t0 = time.monotonic()
            os.write(fd, data)
            os.fdatasync(fd)
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            res.records += 1
            res.payload_bytes += job.size
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return res


# ---- servers -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workloads:
    """A system's client functions, one per kind of work."""

    produce: ClientFn
    produce_single: ClientFn
    read_tail: ClientFn
    read_key: ClientFn


class Server(Protocol):
    system: str
    workloads: Workloads
    target: str
    note: Mapping[str, str]

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def processes(self) -> list[psutil.Process]: ...
    def create_topic(self, name: str, partitions: int) -> None: ...
    def log_bytes(self) -> int: ...
    def serves(self, name: str, lasts: dict[int, str]) -> bool: ...
    def recovery_note(self) -> str: ...


def dir_bytes(path: Path) -> int:
    """Bytes under ``path``; a file deleted while we walk (a checkpoint, a rewrite) counts
    as empty."""
    total = 0
    for f in path.rglob("*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except FileNotFoundError:
            continue
    return total


class NodeServer:
    """shardnode through ``LocalNode``, on its own fresh data directory."""

    system = SHARDNODE
    workloads = Workloads(sn_produce, sn_produce_single, sn_read_tail, sn_read_key)
    note: Mapping[str, str] = MappingProxyType({})

    def __init__(self, work_dir: Path, config: Path | None = None) -> None:
        self.node = LocalNode(work_dir / "data", config=config, log_file=work_dir / "node.log")
        self.target = self.node.endpoint

    def start(self) -> None:
        self.node.start(timeout_s=SERVE_TIMEOUT_S)
        # LocalNode takes any node answering on its port for its own: make sure it is ours.
        with self.node.client(timeout_ms=5000) as c:
            pid = c.status()["pid"]
        if self.node.proc is None or pid != self.node.proc.pid:
            self.node.kill()
            raise RuntimeError(f"port {self.node.port} is answered by another node (pid {pid})")

    def stop(self) -> None:
        if self.node.proc is not None:
            self.node.stop()

    def kill(self) -> None:
        self.node.kill()

    def processes(self) -> list[psutil.Process]:
        return self.node.processes()

    def create_topic(self, name: str, partitions: int) -> None:
        with self.node.client() as c:
            c.create_topic(name, partitions)

    def log_bytes(self) -> int:
        return dir_bytes(self.node.data_dir / "log")

    def serves(self, name: str, lasts: dict[int, str]) -> bool:
        try:
            with NodeClient(self.target, timeout_ms=1000, retries=0) as c:
                for partition, last in lasts.items():
                    got = c.read(name, partition, int(last), 1)
                    if not got or got[0].offset != int(last):
                        return False
        except NodeError:
            return False
        return True

    def recovery_note(self) -> str:
        try:
            with self.node.client(timeout_ms=2000) as c:
                figures = c.status()["log"]
            return f"log scan {figures.get('recovery_ms')} ms by the node's own figure"
        except NodeError:
            return ""


class RedisServer:
    """``redis-server`` with ``appendonly yes``, ``appendfsync always`` and no snapshots,
    on a free loopback port, in its own directory."""

    system = REDIS
    workloads = Workloads(redis_produce, redis_produce_single, redis_read_tail, redis_read_key)
    note: Mapping[str, str] = MappingProxyType({
        "ingest-batched": "XADD pipelined, one stream per producer",
        "ingest-single": "redis.asyncio, concurrent XADDs",
        "read-tail": "XRANGE, 1000 entries a time",
        "read-key": "HGET on a hash: the nearest equivalent of read_by_key",
        "recovery": "AOF replay (auto-rewrite off)",
    })

    def __init__(self, binary: str, work_dir: Path) -> None:
        self.binary = binary
        self.dir = work_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        (self.dir / "redis.conf").write_text(
            f"bind 127.0.0.1\nport {self.port}\ndir {self.dir}\n"
            "appendonly yes\nappendfsync always\nsave \"\"\n"
            "auto-aof-rewrite-percentage 0\ndaemonize no\n"
            f"logfile {self.dir / 'redis.log'}\n")

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen([self.binary, str(self.dir / "redis.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}; "
                                       f"see {self.dir / 'redis.log'}")
                with contextlib.suppress(redis.exceptions.RedisError):
                    if r.ping():
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server not answering in {SERVE_TIMEOUT_S} s")
                time.sleep(0.01)  # poll interval while redis-server starts
        finally:
            r.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc = None

    def kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def processes(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [psutil.Process(self.proc.pid)]
        return []

    def create_topic(self, name: str, partitions: int) -> None:
        """Streams come into being with their first entry."""

    def log_bytes(self) -> int:
        return dir_bytes(self.dir / "appendonlydir")

    def serves(self, name: str, lasts: dict[int, str]) -> bool:
        import redis

        r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        try:
            return all(r.xrange(f"{name}:{p}", min=last, max=last) for p, last in lasts.items())
        except redis.exceptions.RedisError:  # LOADING while it replays, refused before that
            return False
        finally:
            r.close()

    def recovery_note(self) -> str:
        return ""


def find_redis_server(install: bool) -> str | None:
    """The ``redis-server`` binary, installed from Debian's packages if missing and root."""
    found = shutil.which("redis-server") or \
        shutil.which("redis-server", path="/usr/bin:/usr/sbin")
    if found:
        return found
    if not install:
        log.warning("redis-server is not installed (and --no-install): skipping the redis peer")
        return None
    if os.geteuid() != 0:
        log.warning("redis-server is not installed and this is not root: skipping the redis "
                    "peer (install it with: apt-get install -y redis-server)")
        return None
    log.info("installing redis-server from Debian's packages")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", "redis-server"]):
        try:
            subprocess.run(cmd, env=env, check=True, timeout=300, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
        except (subprocess.SubprocessError, OSError) as exc:
            log.warning("could not install redis-server (%s): skipping the redis peer", exc)
            return None
    return shutil.which("redis-server")


# ---- the bench: servers, peers and shared measuring steps ----------------------------


class Bench:
    def __init__(self, settings: Settings, work: Path) -> None:
        self.s = settings
        self.work = work
        self.servers: list[Server] = []
        self.redis_binary: str | None = None
        self._cache: dict[str, Row] = {}
        self.recovery_records: int | None = None  # every system recovers as many records
        # shardnode's batched ingest msgs/s by (records per batch, value bytes), once known
        self.capacity: dict[tuple[int, int], tuple[float, str]] = {}
        self._names = 0
        self.failures: list[str] = []  # what went wrong outside a scenario

    def start(self) -> None:
        node = NodeServer(self.work / SHARDNODE)
        node.start()
        self.servers.append(node)
        if REDIS in self.s.peers:
            self.redis_binary = find_redis_server(self.s.install)
            if self.redis_binary is not None:
                server = RedisServer(self.redis_binary, self.work / REDIS)
                try:
                    server.start()
                except Exception as exc:  # the node's figures are still worth having
                    log.error("redis-server did not start: %s", exc)
                    self.failures.append(f"redis-server did not start: {exc}")
                    server.kill()
                    return
                self.servers.append(server)

    def close(self) -> None:
        for server in self.servers:
            try:
                server.stop()
            except Exception as exc:  # stop every server, and say which did not stop cleanly
                log.error("%s did not stop cleanly: %s", server.system, exc)

    def fresh(self, system: str) -> Server:
        """A new server of ``system`` on a fresh directory of its own (recovery)."""
        work = self.work / f"{system}-{self.name('fresh')}"
        if system == SHARDNODE:
            return NodeServer(work)
        assert self.redis_binary is not None
        return RedisServer(self.redis_binary, work)

    def checkpoint_node(self, mode: str) -> NodeServer:
        """A fresh node in ``mode`` that checkpoints only when asked."""
        work = self.work / f"{SHARDNODE}-{self.name(f'checkpoint-{mode}')}"
        work.mkdir(parents=True, exist_ok=True)
        config = work / "node.toml"
        config.write_text(f'[log]\ncheckpoint_mode = "{mode}"\n'
                          f"checkpoint_bytes = {CKPT_BYTES}  # no automatic checkpoint\n")
        return NodeServer(work, config)

    def checkpoint_capacity(self, node: NodeServer, topic: str) -> tuple[float, str]:
        """shardnode's batched msgs/s in batches of CKPT_BATCH, and where the figure is from:
        ingest-batched's when it ran with that batch and value size, else measured once here
        (closed loop, as ingest-batched, for min(--seconds, CKPT_CAPACITY_S_MAX))."""
        key = (CKPT_BATCH, self.s.size)
        if key not in self.capacity:
            seconds = min(self.s.seconds, CKPT_CAPACITY_S_MAX)
            jobs = [replace(self.job(p, node.target, topic, partition=p, seconds=seconds),
                            batch=CKPT_BATCH) for p in range(self.s.producers)]
            results, _ = run_clients(sn_produce, jobs)
            m = Measurement.of(results, None)
            self.capacity[key] = (m.per_s, f"measured here: {self.s.producers} producers, "
                                           f"closed loop, {seconds:g} s")
        return self.capacity[key]

    def name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}-{self._names}"

    def job(self, index: int, target: str, name: str, **kw: Any) -> Job:
        return Job(index, target, name, batch=self.s.batch, size=self.s.size,
                   concurrency=self.s.concurrency, **kw)

    def fill(self, server: Server, name: str, clients: int, total: int, *, keyed: bool = False,
             one_partition: bool = False) -> list[tuple[Job, ClientResult]]:
        """Write ``total`` records with ``clients`` producers, untimed. Client ``i`` writes to
        partition ``i`` (or all to partition 0), or keyed records of the ``i``-th slice."""
        per = math.ceil(total / clients)
        jobs = [self.job(i, server.target, name, partition=0 if one_partition else i,
                         records_max=min(per, total - i * per), keyed=keyed, first=i * per)
                for i in range(clients) if total - i * per > 0]
        results, _ = run_clients(server.workloads.produce, jobs)
        return list(zip(jobs, results, strict=True))

    def repeated(self, run: Callable[[], Row]) -> Row:
        return median_row([run() for _ in range(self.s.repeat)])

    def once(self, what: str, run: Callable[[], Row]) -> Row:
        """A measurement shared by several scenarios, taken once per bench run."""
        if what not in self._cache:
            self._cache[what] = self.repeated(run)
        return self._cache[what]

    def peer_rows(self, scenario: str) -> list[Row]:
        """The floor and the disk, for an ingest scenario's table."""
        rows = []
        if FLOOR in self.s.peers:
            rows.append(replace(self.once(FLOOR, self.floor), scenario=scenario))
        if DISK in self.s.peers:
            rows.append(replace(self.once(DISK, self.disk), scenario=scenario))
        return rows

    def floor(self) -> Row:
        path = self.work / self.name(FLOOR)
        job = self.job(0, str(path), FLOOR, seconds=self.s.seconds)
        results, rss = run_clients(floor_produce, [job])
        shutil.rmtree(path, ignore_errors=True)
        return Row.of("ingest", FLOOR, Measurement.of(results, rss),
                      "rocksdict put sync=True, one process: one fsync per record")

    def disk(self) -> Row:
        """msgs/s and latency: fdatasyncs of small writes; MB/s: synced 1 MiB writes."""
        small = self.job(0, str(self.work), DISK, seconds=self.s.seconds)
        big = replace(small, size=MIB, records_max=DISK_SEQ_BYTES_MAX // MIB)
        syncs, _ = run_clients(disk_synced_writes, [small])
        seq, _ = run_clients(disk_synced_writes, [big])
        f, b = Measurement.of(syncs, None), Measurement.of(seq, None)
        row = Row.of("ingest", DISK, f)
        row.mb_per_s = b.mb_per_s
        row.note = (f"msgs/s, p50, p99: fdatasync of {self.s.size}-byte appends; "
                    f"MB/s: synced 1 MiB appends")
        return row


def scenario_row(scenario: str, server: Server, m: Measurement, note: str = "") -> Row:
    return Row.of(scenario, server.system, m, server.note.get(scenario, note))


# ---- scenarios: one function each, run for every server ------------------------------


@dataclass
class Runs:
    """A scenario set up on one server: each call of ``run`` measures it once.
    ``run_scenario`` calls it ``--repeat`` times, taking turns with the other servers so
    that every system sees the machine in the same moods, and hands the median row to
    ``done``."""

    run: Callable[[], Row]
    done: Callable[[Row], None] | None = None


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


def read_tail(b: Bench, server: Server) -> Runs:
    s = b.s
    topic = b.name("read-tail")
    server.create_topic(topic, 1)
    b.fill(server, topic, s.producers, s.read_records, one_partition=True)
    job = b.job(0, server.target, topic, records_max=s.read_records)

    def run() -> Row:
        results, rss = run_clients(server.workloads.read_tail, [job], server.processes)
        return scenario_row("read-tail", server, Measurement.of(results, rss),
                            f"offset 0 to {s.read_records:,}, reads of {s.batch}")

    return Runs(run)


def read_key(b: Bench, server: Server) -> Runs:
    s = b.s
    topic = b.name("read-key")
    server.create_topic(topic, s.producers)
    b.fill(server, topic, s.producers, s.keys, keyed=True)
    job = b.job(0, server.target, topic, seconds=s.seconds, keys=s.keys, seed=7)

    def run() -> Row:
        results, rss = run_clients(server.workloads.read_key, [job], server.processes)
        m = Measurement.of(results, rss)
        if m.errors:
            raise AssertionError(f"{m.errors} of {m.records} reads by key returned a wrong value")
        return scenario_row("read-key", server, m, f"one client, {s.keys:,} keys")

    return Runs(run)


def recovery(b: Bench, server: Server) -> Row:
    """Fill a fresh server's log to about ``recovery_mb`` (the first system run decides the
    record count; the others write as many records), SIGKILL it, restart it, and time until
    a read of the last record of every partition succeeds. Run once (not repeated)."""
    s = b.s
    fresh = b.fresh(server.system)
    fresh.start()
    try:
        topic = "recovery"
        fresh.create_topic(topic, s.producers)
        filled = b.fill(fresh, topic, 1, s.batch)  # to learn how many log bytes a record takes
        if b.recovery_records is None:  # the first system sets the count for the others
            per_record = max(1.0, fresh.log_bytes() / s.batch)
            b.recovery_records = max(2 * s.batch, int(s.recovery_mb * MB / per_record))
        filled += b.fill(fresh, topic, s.producers, b.recovery_records - s.batch)
        lasts = {job.partition: res.last for job, res in filled}  # later fills come later
        records = sum(res.records for _job, res in filled)
        fresh.kill()
        log_bytes = fresh.log_bytes()
        t0 = time.monotonic()
        with RssSampler(fresh.processes) as rss:
            fresh.start()
            deadline = t0 + SERVE_TIMEOUT_S
            while not fresh.serves(topic, lasts):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fresh.system} not serving the last record after "
                                       f"{SERVE_TIMEOUT_S} s")
                time.sleep(0.01)  # poll interval until the last record reads back
            elapsed = time.monotonic() - t0
        m = Measurement(records, log_bytes, elapsed, None, None, 0, rss.max_mb)
        own = fresh.recovery_note()
        row = scenario_row("recovery", fresh, m)
        what = (f"{log_bytes / MB:.0f} MB log, {records:,} records: serving after "
                f"{elapsed:.2f} s (MB/s = log bytes / time)")
        row.note = "; ".join(x for x in (what, server.note.get("recovery", ""), own) if x)
        return row
    finally:
        fresh.stop()


class Intervals:
    """Checkpoint intervals [start, end]: one runs at a time, so they are disjoint."""

    def __init__(self, spans: Sequence[tuple[float, float]]) -> None:
        self.spans = sorted(spans)
        self.ends = [end for _start, end in self.spans]

    def overlaps(self, start: float, end: float) -> bool:
        """Whether [start, end] shares a moment with any interval."""
        i = bisect.bisect_left(self.ends, start)  # the first interval not over before start
        return i < len(self.spans) and self.spans[i][0] <= end

    def covered_s(self, lo: float, hi: float) -> float:
        """Seconds of [lo, hi] inside some interval."""
        return sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in self.spans)


def checkpoint_rows(mode: str, producers: Sequence[ClientResult], checkpointer: ClientResult,
                    rss_mb: float | None, batch: int, size: int) -> tuple[Row, Row, float]:
    """The inside and outside rows of one timed run, and its overall msgs/s.

    A request is inside when [send, ack] overlaps a checkpoint's [start, end]; its latency
    counts there. A phase's msgs/s is the records acknowledged during that phase's time
    (ack inside a checkpoint interval, or not) over that time."""
    iv = Intervals(checkpointer.intervals)
    lo = min(r.started for r in producers)
    hi = max(max(r.finished for r in producers), lo + 1e-9)
    seconds = {INSIDE: iv.covered_s(lo, hi)}
    seconds[OUTSIDE] = hi - lo - seconds[INSIDE]
    latencies: dict[str, list[float]] = {INSIDE: [], OUTSIDE: []}
    acked = dict.fromkeys(latencies, 0)
    for r in producers:
        for sent, latency in zip(r.sends_s, r.latencies_s, strict=True):
            ack = sent + latency
            latencies[INSIDE if iv.overlaps(sent, ack) else OUTSIDE].append(latency)
            acked[INSIDE if iv.overlaps(ack, ack) else OUTSIDE] += 1
    durations = [end - start for start, end in checkpointer.intervals]
    mean_ms = statistics.fmean(durations) * 1000 if durations else None
    errors = sum(r.errors for r in producers) + checkpointer.errors
    rows = []
    for phase in (INSIDE, OUTSIDE):
        rate = acked[phase] * batch / seconds[phase] if seconds[phase] > 0 else 0.0
        rows.append(Row("checkpoint", SHARDNODE, rate, rate * size / MB,
                        _ms(percentile(latencies[phase], 50)),
                        _ms(percentile(latencies[phase], 99)), rss_mb,
                        len(latencies[phase]) * batch, seconds[phase], errors, mode=mode,
                        phase=phase, checkpoints=len(durations), checkpoint_ms=mean_ms))
    overall = sum(r.records for r in producers) / (hi - lo)
    return rows[0], rows[1], overall


def node_checkpoint_figures(node: NodeServer, expected: int) -> dict[str, Any]:
    """The node's own checkpoint figures, once its status counts ``expected`` checkpoints
    (actors report about once a second), or after a few seconds whatever it says."""
    deadline = time.monotonic() + 5.0
    with node.node.client(timeout_ms=5000) as c:
        while True:
            st = c.status()
            if st["log"].get("checkpoints", 0) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # poll until the log manager's next report
    flush = {a["role"]: a["figures"].get("last_flush_ms") for a in st["actors"]
             if a["role"].startswith("writer-")}
    return {**st["log"], "last_flush_ms": flush}


def checkpoint(b: Bench, server: Server) -> list[Row]:
    """Per mode, a fresh node: its batched capacity (measured once per bench run, or
    ingest-batched's when that ran with the same batch and value size), then paced producers
    at CKPT_LOAD of it while a client runs checkpoints CKPT_GAP_S apart; the acknowledgement
    latencies of requests inside checkpoints against the others."""
    assert server.system == SHARDNODE
    s = b.s
    seconds = max(CKPT_SECONDS_MIN, CKPT_SECONDS_PER * s.seconds)
    rows: list[Row] = []
    for mode in CKPT_MODES:
        node = b.checkpoint_node(mode)
        node.start()
        try:
            topic = "checkpoint"
            node.create_topic(topic, s.producers)
            capacity, how = b.checkpoint_capacity(node, topic)
            rate = CKPT_LOAD * capacity
            with node.node.client(timeout_ms=CKPT_TIMEOUT_MS) as c:
                c.checkpoint()  # the timed checkpoints flush only what the timed run wrote
            runs: list[tuple[Row, Row, float, int, int]] = []
            for _ in range(s.repeat):
                producers = [replace(b.job(p, node.target, topic, partition=p, seconds=seconds,
                                           rate=rate / s.producers),
                                     batch=CKPT_BATCH, concurrency=CKPT_IN_FLIGHT_MAX)
                             for p in range(s.producers)]
                checker = b.job(s.producers, node.target, topic, seconds=seconds,
                                gap_s=CKPT_GAP_S)
                results, rss = run_clients([sn_produce_paced] * s.producers + [sn_checkpointer],
                                           [*producers, checker], node.processes)
                inside, outside, overall = checkpoint_rows(mode, results[:-1], results[-1], rss,
                                                           CKPT_BATCH, s.size)
                # The raw figures, next to the node's log (kept with --keep or on failure).
                raw = {"intervals": results[-1].intervals,
                       "requests": [(t0, latency) for r in results[:-1]
                                    for t0, latency in zip(r.sends_s, r.latencies_s, strict=True)]}
                (node.node.log_file.parent / f"requests-{len(runs) + 1}.json").write_text(
                    json.dumps(raw))
                runs.append((inside, outside, overall, sum(r.late for r in results[:-1]),
                             sum(r.records for r in results[:-1]) // CKPT_BATCH))
            done = sum(r[0].checkpoints or 0 for r in runs)
            asked = 1 + done  # a fresh node: the first one above, then the timed ones
            node_figures = node_checkpoint_figures(node, asked)
        finally:
            node.stop()
        inside = median_row([r[0] for r in runs])
        outside = median_row([r[1] for r in runs])
        if inside.p99_ms is not None and outside.p99_ms:
            inside.p99_ratio = outside.p99_ratio = inside.p99_ms / outside.p99_ms
        overall = statistics.median(r[2] for r in runs)
        late = sum(r[3] for r in runs)
        requests = sum(r[4] for r in runs)
        extra = int(node_figures.get("checkpoints", 0)) - asked
        flush = ", ".join(f"{k} {v} ms" for k, v in node_figures["last_flush_ms"].items())
        note = (f"{overall:,.0f} msgs/s overall, target {rate:,.0f} ({CKPT_LOAD:.0%} of "
                f"{capacity:,.0f} msgs/s batched capacity, {how}); {s.producers} paced "
                f"producers, batches of {CKPT_BATCH} x {s.size} B, {seconds:g} s a run; "
                f"{late:,} of {requests:,} sends over {CKPT_LATE_S * 1000:g} ms late; "
                f"checkpoints {CKPT_GAP_S:g} s apart; node's own figures: last checkpoint "
                f"{node_figures.get('last_checkpoint_ms')} ms, last flush {flush}, "
                f"{node_figures.get('checkpoints_abandoned', 0)} abandoned")
        if extra:  # > 0: automatic ones fired; < 0: the log manager restarted (count reset)
            note += f"; the node counts {extra:+d} checkpoints beyond the {asked} asked for"
        for row in (inside, outside):
            row.note = note
        rows += [inside, outside]
    return rows


SCENARIOS: dict[str, Callable[[Bench, Server], Runs | Row | list[Row]]] = {
    "ingest-batched": ingest_batched,
    "ingest-single": ingest_single,
    "read-tail": read_tail,
    "read-key": read_key,
    "recovery": recovery,
    "checkpoint": checkpoint,
}
INGEST = ("ingest-batched", "ingest-single")
NODE_ONLY = ("checkpoint",)  # scenarios no peer runs


def run_scenario(b: Bench, scenario: str) -> tuple[list[Row], list[str]]:
    """Every system's row of one scenario, with the ratios; and what failed."""
    rows: list[Row] = []
    failures: list[str] = []
    prepared: list[tuple[Server, Runs, list[Row]]] = []
    for server in b.servers:
        if scenario in NODE_ONLY and server.system != SHARDNODE:
            continue
        log.info("%s: %s", scenario, server.system)
        try:
            got = SCENARIOS[scenario](b, server)
            if isinstance(got, Runs):
                prepared.append((server, got, []))
            else:
                rows += got if isinstance(got, list) else [got]
        except Exception as exc:
            log.error("%s on %s failed: %s", scenario, server.system, exc)
            failures.append(f"{scenario} on {server.system}: {exc}")
    for k in range(b.s.repeat):  # the systems take turns, run by run
        for server, runs, measured in list(prepared):
            log.info("%s: %s, run %d of %d", scenario, server.system, k + 1, b.s.repeat)
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
    sn = next((r for r in rows if r.system == SHARDNODE), None)
    if sn is None:
        return
    for r in rows:
        if r.system == DISK:
            r.shardnode_ratio = sn.mb_per_s / r.mb_per_s if r.mb_per_s else None
        elif r.system != SHARDNODE:
            r.shardnode_ratio = sn.msgs_per_s / r.msgs_per_s if r.msgs_per_s else None


# ---- output --------------------------------------------------------------------------


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio_text(r: Row) -> str:
    if r.shardnode_ratio is None:
        return ""
    if r.system == DISK:
        share = r.shardnode_ratio
        return f"{share:.0%} of disk MB/s" if share >= 0.1 else f"{share:.1%} of disk MB/s"
    return f"{r.shardnode_ratio:.2f}x"


def goal_met(inside: Row) -> bool | None:
    """Fuzzy mode's goal: p99 inside checkpoints at most CKPT_GOAL times p99 outside."""
    return None if inside.p99_ratio is None else inside.p99_ratio <= CKPT_GOAL


def goal_text(r: Row) -> str:
    if r.phase != INSIDE or r.mode != "fuzzy":
        return ""
    met = goal_met(r)
    return f"<={CKPT_GOAL:g}x " + ("?" if met is None else "met" if met else "MISSED")


def print_checkpoint_table(rows: list[Row], s: Settings) -> None:
    n = max((r.runs for r in rows), default=1)
    runs = "1 run" if n == 1 else f"median of {n} runs"
    t = Table(title=f"checkpoint  ({s.size}-byte values in batches of {CKPT_BATCH}, "
                    f"{CKPT_LOAD:.0%} load, {runs}; goal: fuzzy p99 inside <= "
                    f"{CKPT_GOAL:g}x outside)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("mode", "phase", "requests", "msgs/s", "p50 ms", "p99 ms", "ckpts", "ckpt ms",
                "in/out p99", "goal"):
        left = col in ("mode", "phase", "goal")
        t.add_column(col, justify="left" if left else "right", no_wrap=True)
    for r in rows:
        t.add_row(r.mode or "", r.phase or "", _num(r.records / CKPT_BATCH),
                  _num(r.msgs_per_s), _num(r.p50_ms, 2),
                  _num(r.p99_ms, 2), _num(r.checkpoints), _num(r.checkpoint_ms, 1),
                  "" if r.p99_ratio is None else f"{r.p99_ratio:.2f}x", goal_text(r))
    (console if console.is_terminal else Console(width=110)).print(t)  # a file: don't crop
    console.print("  a request is inside when \\[send, ack] overlaps a checkpoint; msgs/s of a "
                  "phase: records acknowledged during it over its time; ckpt ms: mean "
                  "checkpoint duration (client's view); MB/s and RSS: --json", highlight=False)
    for r in rows:
        if r.phase != INSIDE:
            continue
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        console.print(f"  {r.mode}: {r.note}{errors}", highlight=False)
        if r.mode == "fuzzy":
            met = goal_met(r)
            verdict = ("[yellow]no figure[/yellow]" if met is None else
                       "[green]met[/green]" if met else "[red]MISSED[/red]")
            ratio = "-" if r.p99_ratio is None else f"{r.p99_ratio:.2f}x"
            console.print(f"  goal: fuzzy p99 inside <= {CKPT_GOAL:g}x p99 outside: {verdict} "
                          f"({ratio})")
    console.print()


# ---- targets: the goals the issues set, checked on every run ---------------------------


def _shardnode_row(rows: Sequence[Row], scenario: str, phase: str | None = None) -> Row | None:
    return next((r for r in rows if r.scenario == scenario and r.system == SHARDNODE
                 and (phase is None or (r.mode, r.phase) == ("fuzzy", phase))), None)


def _figure(scenario: str, name: str, phase: str | None = None
            ) -> Callable[[Sequence[Row]], float | None]:
    def measure(rows: Sequence[Row]) -> float | None:
        row = _shardnode_row(rows, scenario, phase)
        return None if row is None else getattr(row, name)
    return measure


def _over_redis(scenario: str) -> Callable[[Sequence[Row]], float | None]:
    def measure(rows: Sequence[Row]) -> float | None:
        row = next((r for r in rows if r.scenario == scenario and r.system == REDIS), None)
        return None if row is None else row.shardnode_ratio
    return measure


def _rss_peak(rows: Sequence[Row]) -> float | None:
    peaks = [r.rss_mb for r in rows if r.system == SHARDNODE and r.rss_mb is not None]
    return max(peaks) if peaks else None


@dataclass(frozen=True)
class Target:
    """A goal an issue set for this machine, at the bench's default settings."""

    issue: int
    text: str
    measure: Callable[[Sequence[Row]], float | None]  # None: not measured in this run
    at_least: float | None = None
    at_most: float | None = None
    unit: str = ""

    def verdict(self, rows: Sequence[Row]) -> tuple[float | None, bool | None]:
        value = self.measure(rows)
        if value is None:
            return None, None
        return value, ((self.at_least is None or value >= self.at_least)
                       and (self.at_most is None or value <= self.at_most))


TARGETS = (
    Target(2, "ingest-batched >= 200 000 records/s", _figure("ingest-batched", "msgs_per_s"),
           at_least=200_000, unit="/s"),
    Target(2, "ingest-single >= 20 000 records/s", _figure("ingest-single", "msgs_per_s"),
           at_least=20_000, unit="/s"),
    Target(3, "ingest-batched >= 3x Redis Streams", _over_redis("ingest-batched"),
           at_least=3.0, unit="x"),
    Target(3, "ingest-batched >= 300 000 records/s", _figure("ingest-batched", "msgs_per_s"),
           at_least=300_000, unit="/s"),
    Target(3, "ingest-single >= 1x Redis Streams", _over_redis("ingest-single"),
           at_least=1.0, unit="x"),
    Target(3, "node RSS <= 400 MB in every scenario", _rss_peak, at_most=400, unit=" MB"),
    Target(3, "recovery >= 100 MB/s", _figure("recovery", "mb_per_s"), at_least=100,
           unit=" MB/s"),
    Target(4, f"fuzzy checkpoint p99 inside <= {CKPT_GOAL:g}x outside",
           _figure("checkpoint", "p99_ratio", phase="inside"), at_most=CKPT_GOAL, unit="x"),
)


def _defaults_differ(s: Settings) -> list[str]:
    """The settings of this run that differ from those the targets are set for."""
    base = Settings(s.scenarios)
    return [name for name in ("producers", "batch", "size", "concurrency", "seconds",
                              "read_records", "keys", "recovery_mb", "quick")
            if getattr(s, name) != getattr(base, name)]


def print_targets(rows: list[Row], s: Settings) -> None:
    t = Table(title="targets (the issues' goals for this machine)", title_justify="left")
    for col in ("issue", "target", "measured", "verdict"):
        t.add_column(col, justify="right" if col in ("issue", "measured") else "left")
    for target in TARGETS:
        value, met = target.verdict(rows)
        shown = "-" if value is None else (f"{value:.2f}{target.unit}" if target.unit == "x"
                                           else f"{_num(value)}{target.unit}")
        verdict = ("not run" if met is None else "[green]met[/green]" if met
                   else "[red]MISSED[/red]")
        t.add_row(str(target.issue), target.text, shown, verdict)
    console.print(t)
    differ = _defaults_differ(s)
    if differ:
        console.print(f"  the targets are set for the default settings; this run changed "
                      f"{', '.join(differ)}, so its verdicts only indicate", highlight=False,
                      soft_wrap=True)
    console.print()


def print_table(scenario: str, rows: list[Row], s: Settings) -> None:
    if scenario == "checkpoint":
        print_checkpoint_table(rows, s)
        return
    n = max((r.runs for r in rows), default=1)
    runs = "1 run" if n == 1 else f"median of {n} runs"
    t = Table(title=f"{scenario}  ({s.size}-byte values, {runs})", title_justify="left")
    for col in ("system", "msgs/s", "MB/s", "p50 ms", "p99 ms", "RSS MB", "shardnode ÷ this"):
        t.add_column(col, justify="left" if col == "system" else "right", no_wrap=True)
    for r in rows:
        t.add_row(r.system, _num(r.msgs_per_s), _num(r.mb_per_s, 1), _num(r.p50_ms, 2),
                  _num(r.p99_ms, 2), _num(r.rss_mb), ratio_text(r))
    console.print(t)
    for r in rows:
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        console.print(f"  {r.system}: {r.note}{errors}", highlight=False)
    console.print()


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def group_of(r: Row) -> str:  # the checkpoint scenario has a bar group per mode and phase
        return r.scenario if r.mode is None else f"{r.scenario}\n{r.mode} {r.phase}"

    scenarios = list(dict.fromkeys(group_of(r) for r in rows))
    systems = list(dict.fromkeys(r.system for r in rows))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(11.0, 1.3 * len(scenarios)), 8))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs, tput, p50, p99 = [], [], [], []
        for j, scenario in enumerate(scenarios):
            row = next((r for r in rows if group_of(r) == scenario and r.system == system),
                       None)
            if row is None:
                continue
            xs.append(j + (i - (len(systems) - 1) / 2) * width)
            tput.append(row.msgs_per_s)
            p50.append(row.p50_ms or 0.0)
            p99.append(row.p99_ms or 0.0)
        color = f"C{i}"
        top.bar(xs, tput, width, label=system, color=color)
        bottom.bar(xs, p99, width, color=color, alpha=0.4)
        bottom.bar(xs, p50, width, color=color)
    for ax, label in ((top, "records/s (log)"), (bottom, "latency ms, p50 solid, p99 pale (log)")):
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    top.legend(ncols=len(systems), fontsize=8)
    top.set_title(f"shardnode bench {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
                  f"{os.cpu_count()} CPUs (recovery: records replayed/s; checkpoint: "
                  f"acks/s in the phase)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help=f"any of {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--producers", type=int, default=4, help="producer processes (default 4)")
    p.add_argument("--batch", type=int, default=1000, help="records per batch (default 1000)")
    p.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    p.add_argument("--concurrency", type=int, default=64,
                   help="ingest-single: requests in flight (default 64)")
    p.add_argument("--seconds", type=float, help="length of each timed run (default 5)")
    p.add_argument("--repeat", type=int, help="runs per scenario, median reported (default 1)")
    p.add_argument("--read-records", type=int, help="read-tail: records to prefill and read")
    p.add_argument("--keys", type=int, help="read-key: keyed records to prefill")
    p.add_argument("--recovery-mb", type=int, help="recovery: log size to fill (default 256)")
    p.add_argument("--peers", default="redis,floor,disk",
                   help="comma-separated peers to run: redis, floor, disk, or none")
    p.add_argument("--no-install", action="store_true",
                   help="do not apt-get install redis-server when it is missing")
    p.add_argument("--quick", action="store_true", help="every scenario small (smoke run)")
    p.add_argument("--json", type=Path, help="write the rows as a JSON list to this file")
    p.add_argument("--plot", type=Path, help="draw throughput and latency to this PNG")
    p.add_argument("--work-dir", type=Path, help="where data goes (default ./var/bench/run-*)")
    p.add_argument("--keep", action="store_true", help="keep the data directories")
    a = p.parse_args(argv)
    unknown = [x for x in a.scenarios if x not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    peers = frozenset() if a.peers == "none" else frozenset(a.peers.split(","))
    if peers - {REDIS, FLOOR, DISK}:
        p.error(f"unknown peer(s) {sorted(peers - {REDIS, FLOOR, DISK})}")
    base = QUICK if a.quick else {}
    given = {k: v for k, v in (("seconds", a.seconds), ("repeat", a.repeat),
                               ("read_records", a.read_records), ("keys", a.keys),
                               ("recovery_mb", a.recovery_mb)) if v is not None}
    settings = Settings(tuple(a.scenarios or SCENARIOS), a.producers, a.batch, a.size,
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
    if REDIS in s.peers and bench.redis_binary is None:
        console.print("[yellow]redis peer skipped: redis-server not available[/yellow]")
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
