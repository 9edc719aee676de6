"""What a run measures: one ``ClientResult`` per client process, ``Measurement`` for clients
measured together, a ``Row`` per system and scenario, and the servers' RSS."""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Self

import psutil

from .settings import MB, RSS_INTERVAL_S


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
    ops_s: dict[str, list[float]] = field(default_factory=dict)  # txn: latency of each op

    def took(self, t0: float, t: float, records: int, payload_bytes: int) -> None:
        """A request sent at ``t0`` was answered at ``t``, with ``records`` records of
        ``payload_bytes`` bytes in all."""
        self.latencies_s.append(t - t0)
        self.records += records
        self.payload_bytes += payload_bytes
        self.finished = max(self.finished, t)


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


def ms(seconds: float | None) -> float | None:
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
    # the txn scenario only (None elsewhere)
    per_request: int | None = None      # records per transaction, or per batch without one
    txn: bool | None = None             # in transactions, or the same records without
    ops_ms: dict[str, list[float | None]] | None = None  # op → [p50, p99]: begin, produce, commit
    # the spark scenario only (None elsewhere)
    direction: str | None = None        # sink (Spark writes) | source (Spark reads)
    guarantee: str | None = None        # the shardnode sink's: exactly_once | at_least_once
    cpu_s: dict[str, float] | None = None  # CPU seconds of each group of processes in the run
    backlog_s: float | None = None      # the node's sink: the checkpoint after the run, in which
                                        # the shard writers applied what they had not yet
    # the cluster scenario only (None elsewhere; cpu_s: each member's and the clients')
    nodes: int | None = None            # members of the cluster
    routing: str | None = None          # routed | forwarded
    # the large-values scenario only (None elsewhere; msgs/s and MB/s: the ingest's)
    way: str | None = None              # [storage] large_values: chunks | blob_files
    value_bytes: int | None = None      # the size of every value written
    read_mb_per_s: float | None = None  # reading them all back, from the shards
    sst_mb: float | None = None         # SST files under the shards after a clean stop
    blob_mb: float | None = None        # blob files under the shards after a clean stop
    writer_rss_mb: float | None = None  # the largest RSS of the writer processes together
    # the kv scenario only (None elsewhere)
    op: str | None = None               # get | put | cas | read_by_key
    in_flight: int | None = None        # requests in flight: 1, or --concurrency

    @classmethod
    def of(cls, scenario: str, system: str, m: Measurement, note: str = "") -> Row:
        return cls(scenario, system, m.per_s, m.mb_per_s, ms(m.p50_s), ms(m.p99_s),
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
                 "checkpoint_ms", "p99_ratio", "backlog_s", "read_mb_per_s", "sst_mb",
                 "blob_mb", "writer_rss_mb"):
        setattr(out, name, med([getattr(r, name) for r in rows]))
    out.records = int(statistics.median(r.records for r in rows))
    counts = [r.checkpoints for r in rows if r.checkpoints is not None]
    out.checkpoints = int(statistics.median(counts)) if counts else None
    if first.cpu_s is not None:
        out.cpu_s = {name: statistics.median((r.cpu_s or {}).get(name, 0.0) for r in rows)
                     for name in first.cpu_s}
    if first.ops_ms is not None:
        out.ops_ms = {op: [med([(r.ops_ms or {}).get(op, [None, None])[i] for r in rows])
                           for i in (0, 1)] for op in first.ops_ms}
    return out


def op_percentiles(results: Sequence[ClientResult]) -> dict[str, list[float | None]]:
    """Each op's [p50, p99] in ms over every client's ``ops_s``."""
    out: dict[str, list[float | None]] = {}
    for op in dict.fromkeys(op for r in results for op in r.ops_s):
        latencies = [x for r in results for x in r.ops_s.get(op, ())]
        out[op] = [ms(percentile(latencies, 50)), ms(percentile(latencies, 99))]
    return out


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
