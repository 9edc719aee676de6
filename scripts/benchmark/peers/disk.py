"""The disk: appends of one record's size, each fdatasync'ed, and synced 1 MiB appends,
under the bench's directory: the ceiling for anything durable. A reference peer, ingest
only."""

from __future__ import annotations

import os
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..clients import Gate, Job, run_clients, start_clock
from ..measure import ClientResult, Measurement, Row
from ..settings import DISK, DISK_SEQ_BYTES_MAX, MIB

if TYPE_CHECKING:
    from ..bench import Bench


def disk_synced_writes(job: Job, gate: Gate) -> ClientResult:
    """Append ``job.size`` bytes and fdatasync, again and again, to a file in ``job.target``."""
    path = Path(job.target) / f"disk-probe-{job.size}"
    data = random.Random(job.index).randbytes(job.size)
    res = ClientResult()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        gate.wait()
        budget = start_clock(job, res)
        while budget.next_count(res.records, 1):
            t0 = time.monotonic()
            os.write(fd, data)
            os.fdatasync(fd)
            res.took(t0, time.monotonic(), 1, job.size)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return res


def measure(b: Bench) -> Row:
    """msgs/s and latency: fdatasyncs of small writes; MB/s: synced 1 MiB writes."""
    small = b.job(0, str(b.work), DISK, seconds=b.s.seconds)
    big = replace(small, size=MIB, records_max=DISK_SEQ_BYTES_MAX // MIB)
    syncs, _ = run_clients(disk_synced_writes, [small])
    seq, _ = run_clients(disk_synced_writes, [big])
    f, m = Measurement.of(syncs, None), Measurement.of(seq, None)
    row = Row.of("ingest", DISK, f)
    row.mb_per_s = m.mb_per_s
    row.note = (f"msgs/s, p50, p99: fdatasync of {b.s.size}-byte appends; "
                f"MB/s: synced 1 MiB appends")
    return row
