"""Smoke test of the benchmark's cluster scenario: ``scripts/bench cluster --quick`` starts
clusters of 1 and 2 members, writes through routed clients and through one member that
forwards, and reports a row for each with every member's CPU. It checks that the scenario
works, not how fast anything is; and that the cluster's RSS (every member's) is not taken
for one node's in the RSS target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KINDS = {(1, 1000, "routed"), (1, 1, "routed"), (2, 1000, "routed"), (2, 1000, "forwarded"),
         (2, 1, "routed"), (2, 1, "forwarded")}


@pytest.mark.timeout(180)
def test_bench_cluster_quick_writes_through_routed_and_forwarding_clients(
        tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    # Two producers, 0.25 s runs: the least that still writes to both members of a cluster
    # of two (a partition each) from more than one client, in every kind of run.
    proc = subprocess.run([sys.executable, "-m", "scripts.benchmark", "cluster", "--quick",
                           "--producers", "2", "--seconds", "0.25",
                           "--peers", "none", "--json", str(out), "--work-dir",
                           str(tmp_path / "work")],
                          cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = json.loads(out.read_text())
    by = {(row["nodes"], row["per_request"], row["routing"]): row for row in rows}
    assert set(by) == KINDS and len(rows) == len(KINDS), sorted(map(str, by))
    for kind, row in by.items():
        assert row["msgs_per_s"] > 0 and row["errors"] == 0, (kind, row["note"])
        members = {k for k in row["cpu_s"] if k.startswith("node-")}
        assert members == {f"node-{m}" for m in range(1, kind[0] + 1)}, (kind, row["cpu_s"])
        assert all(row["cpu_s"][m] > 0 for m in members), (kind, row["cpu_s"])
    assert "node RSS <= 400 MB" in proc.stdout
    rss_line = next(line for line in proc.stdout.splitlines() if "node RSS <= 400 MB" in line)
    assert "not run" in rss_line  # no single node ran: the clusters' RSS is not one node's
