"""The floor: one process putting each record into rocksdict with ``sync=True``, one fsync
per record: what a store that syncs every record gets. A reference peer, ingest only."""

from __future__ import annotations

import random
import shutil
import time
from typing import TYPE_CHECKING

from ..clients import Gate, Job, key_of, run_clients, start_clock
from ..measure import ClientResult, Measurement, Row
from ..settings import FLOOR

if TYPE_CHECKING:
    from ..bench import Bench


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
        budget = start_clock(job, res)
        while budget.next_count(res.records, 1):
            t0 = time.monotonic()
            db.put(key_of(res.records), value, sync)
            res.took(t0, time.monotonic(), 1, job.size)
    finally:
        db.close()
    return res




def measure(b: Bench) -> Row:
    path = b.work / b.name(FLOOR)
    job = b.job(0, str(path), FLOOR, seconds=b.s.seconds)
    results, rss = run_clients(floor_produce, [job])
    shutil.rmtree(path, ignore_errors=True)
    return Row.of("ingest", FLOOR, Measurement.of(results, rss),
                  "rocksdict put sync=True, one process: one fsync per record")
