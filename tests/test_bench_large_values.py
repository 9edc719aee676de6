"""Smoke test of the benchmark's large-values scenario: ``scripts/bench large-values --quick``
writes and reads back values of 1 MiB and 10 MiB through a node keeping them in chunks and
one using RocksDB's blob files, and reports a row for each. It checks that the scenario
works and that each way keeps the values where it says (SST files, or blob files), not how
fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


@pytest.mark.timeout(240)
def test_bench_large_values_quick_keeps_values_in_chunks_or_in_blob_files(
        tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "scripts.benchmark", "large-values", "--quick",
                           "--peers", "none", "--json", str(out), "--work-dir",
                           str(tmp_path / "work")],
                          cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = json.loads(out.read_text())
    by = {(row["way"], row["value_bytes"]): row for row in rows}
    assert set(by) == {(w, s) for w in ("chunks", "blob_files") for s in (MIB, 10 * MIB)}
    for (way, size), row in by.items():
        written_mb = row["records"] * size / 1e6
        assert row["mb_per_s"] > 0 and row["read_mb_per_s"] > 0 and row["errors"] == 0
        assert row["writer_rss_mb"] > 0 and row["rss_mb"] >= row["writer_rss_mb"]
        kept, other = ((row["sst_mb"], row["blob_mb"]) if way == "chunks"
                       else (row["blob_mb"], row["sst_mb"]))
        assert kept >= written_mb and other < written_mb / 10, (way, size, row["note"])
