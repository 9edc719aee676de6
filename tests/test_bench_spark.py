"""Smoke test of the benchmark's spark scenario: ``scripts/bench spark --quick`` runs end to
end in one SparkSession, with a row for each system in each direction (the node's sink with
both guarantees, Parquet's and the bare socket's; the node's source and Parquet's reader),
each with every row written or read and nothing wrong, and leaves no JVM behind. It checks
that the scenario works, not how fast anything is (a quick run skips the warm-up).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICK_ROWS = 20_000  # settings.QUICK's spark_rows
KINDS = {("sink", "shardnode", "exactly_once"), ("sink", "shardnode", "at_least_once"),
         ("sink", "parquet", None), ("sink", "zmq-pull", None),
         ("source", "shardnode", None), ("source", "parquet", None)}
CPU_GROUPS = {"node", "jvm", "py", "bench"}


def our_jvms(since: float) -> list[int]:
    """Spark JVMs of this worktree's bench, started after ``since``."""
    found = []
    for p in psutil.process_iter(["name", "create_time"]):
        try:
            if (p.info["name"] == "java" and p.info["create_time"] >= since
                    and "spark.app.name=shardnode-bench" in " ".join(p.cmdline())
                    and p.cwd() == str(ROOT)):
                found.append(p.pid)
        except psutil.Error:  # gone, or not ours to read
            continue
    return found


@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java")
@pytest.mark.timeout(240)  # about 45 s on a quiet machine, 90 s when others run Spark too
def test_bench_spark_quick_writes_and_reads_through_every_system(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    started = time.time()
    proc = subprocess.run([str(ROOT / "scripts" / "bench"), "spark", "--quick", "--peers",
                           "none", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = json.loads(out.read_text())
    assert {row["scenario"] for row in rows} == {"spark"}
    by = {(row["direction"], row["system"], row["guarantee"]): row for row in rows}
    assert set(by) == KINDS and len(rows) == len(KINDS), sorted(map(str, by))
    for kind, row in by.items():
        assert row["records"] == QUICK_ROWS and row["msgs_per_s"] > 0, kind
        assert row["errors"] == 0, (kind, row["note"])
        assert set(row["cpu_s"]) >= CPU_GROUPS and row["cpu_s"]["jvm"] > 0, (kind, row)
        if kind[1] == "shardnode":
            assert row["rss_mb"] > 0 and row["shardnode_ratio"] is None, kind
        else:
            assert row["rss_mb"] is None and row["shardnode_ratio"] > 0, kind
    for guarantee in ("exactly_once", "at_least_once"):
        sink = by[("sink", "shardnode", guarantee)]
        assert f"{QUICK_ROWS:,} records" in sink["note"] and "backlog" in sink["note"], sink
        assert sink["backlog_s"] > 0 and "node_after" in sink["cpu_s"], sink
    for text in ("spark sink >= 500 000 rows/s", "spark exactly_once costs <= 1.3x",
                 "so its verdicts only indicate"):
        assert text in proc.stdout, text
    assert our_jvms(started) == [], "the bench left Spark's JVM running"
