"""recovery: a fresh server filled to about --recovery-mb of log, SIGKILLed, restarted, and
timed until the last record of every partition reads back. Run once, not repeated."""

from __future__ import annotations

import time

from ..bench import Bench, scenario_row
from ..measure import Measurement, Row, RssSampler
from ..peers.base import Server
from ..settings import MB, SERVE_TIMEOUT_S


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
