"""``scripts/demo`` end to end, small: a node, Spark's write through the ``shardnode`` sink
and read back through its source, and the check that every row arrived once. Also the
check's verdicts on counts that are wrong, so that it can be seen to fail."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from node.local import free_port
from scripts.demo import Check

ROOT = Path(__file__).resolve().parent.parent
ROWS = 20_000
BATCH_ROWS = 10_000  # 2 micro-batches in each query


@pytest.mark.timeout(90)  # 37 s on 2 cores kept busy by other jobs: mostly Spark starting
def test_demo_writes_every_row_and_reads_each_back_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "demo"), "--rows", str(ROWS), "--batch-rows", str(BATCH_ROWS),
         "--port", str(free_port()), "--data-dir", str(tmp_path / "demo")],
        cwd=ROOT, capture_output=True, text=True, timeout=85,
        env={**os.environ, "COLUMNS": "200"})  # the summary's rows on one line each
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed:\n{out[-4000:]}\n{proc.stderr[-4000:]}"
    assert f"OK: each of the {ROWS:,} rows read back exactly once" in out, out
    for query in ("write → shardnode", "read ← shardnode"):
        line = next((ln for ln in out.splitlines() if query in ln), None)
        assert line is not None, f"no summary line for {query!r}:\n{out}"
        rows, per_s, batches, warm_per_s, seconds = re.findall(r"[\d,.]+", line)
        assert (rows, batches) == (f"{ROWS:,}", str(ROWS // BATCH_ROWS)), line
        assert float(per_s.replace(",", "")) > 0 and float(warm_per_s.replace(",", "")) > 0
        assert float(seconds) > 0, line


def test_check_passes_each_row_once() -> None:
    assert Check(count=10, distinct=10, low=0, high=9, bad=0).failures(10) == []


@pytest.mark.parametrize(("check", "says"), [
    (Check(count=9, distinct=9, low=0, high=9, bad=0), "9 rows read back, 10 written"),
    (Check(count=10, distinct=9, low=0, high=9, bad=0), "10 rows read back carry 9 distinct numbers"),
    (Check(count=10, distinct=10, low=1, high=10, bad=0), "row numbers 1..10, expected 0..9"),
    (Check(count=10, distinct=10, low=0, high=9, bad=2), "2 rows with a key, value or"),
    (Check(count=0, distinct=0, low=None, high=None, bad=0), "row numbers None..None"),
])
def test_check_fails_a_row_missing_twice_or_changed(check: Check, says: str) -> None:
    failures = check.failures(10)
    assert any(says in f for f in failures), failures
