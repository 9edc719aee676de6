"""Smoke test of the benchmark: ``scripts/bench --quick --json OUT`` runs end to end.

It checks that the bench works — every scenario yields a shardnode row with a positive
rate, the floor and disk peers ran, the checkpoint scenario has inside and outside rows
for both modes after at least one checkpoint, and the txn scenario has the node's rows in
and out of transactions of each size (with its per-op latencies) and Redis MULTI/EXEC's —
not how fast anything is. The redis peer may be skipped when ``redis-server`` is missing
and cannot be installed.

The rabbitmq peer runs only when named (its server boots in a few seconds, after
installing Erlang on first use): a second quick run names it for its three scenarios and
checks that its server and epmd are gone afterwards. The kv and storage scenarios also run
only when named: a third quick run names them.

Both runs take the smallest workload that still yields every row: two producers (more than
one client lined up and fired together; each client is a process of its own to spawn, so
fewer make a shorter run) and 0.25 s timed runs (the checkpoint scenario keeps its own
2 s floor, so each mode still sees checkpoints).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("ingest-batched", "ingest-single", "read-tail", "read-key", "recovery")
TXN_SIZES = (100, 1)
TXN_OPS = {"begin", "produce", "commit"}
INGEST = ("ingest-batched", "ingest-single")
RABBITMQ_SCENARIOS = ("ingest-batched", "ingest-single", "read-tail")
CHECKPOINT_MODES = ("fuzzy", "blocking")
PHASES = ("inside", "outside")
SMALLEST = ("--quick", "--producers", "2", "--seconds", "0.25")


@pytest.mark.timeout(120)  # about 50 s here with the txn scenario, on a quiet machine
def test_bench_quick_writes_a_row_per_scenario(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    proc = subprocess.run([str(ROOT / "scripts" / "bench"), *SMALLEST, "--json", str(out),
                           "--plot", str(plot)],
                          cwd=ROOT, capture_output=True, text=True, timeout=115)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    png = plot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, "--plot wrote no real PNG"
    rows = json.loads(out.read_text())
    fields = {"scenario", "system", "msgs_per_s", "mb_per_s", "p50_ms", "p99_ms", "rss_mb"}
    assert all(fields <= row.keys() for row in rows)
    by = {(row["scenario"], row["system"]): row for row in rows if row["scenario"] in SCENARIOS}
    for scenario in SCENARIOS:
        row = by.get((scenario, "shardnode"))
        assert row is not None, f"no shardnode row for {scenario}"
        assert row["msgs_per_s"] > 0, row
        assert row["rss_mb"] is not None and row["rss_mb"] > 0, row
    for scenario in INGEST:
        for peer in ("floor", "disk"):
            assert by.get((scenario, peer), {}).get("msgs_per_s", 0) > 0, (scenario, peer)
    redis_rows = [row for row in rows if row["system"] == "redis"]
    if redis_rows:  # redis-server was there or installable: then it ran every scenario
        assert {row["scenario"] for row in redis_rows} == {*SCENARIOS, "txn"}
    else:
        assert "redis peer skipped" in proc.stdout
    txn = {(row["system"], row["per_request"], row["txn"]): row for row in rows
           if row["scenario"] == "txn"}
    expected = {("shardnode", n, in_txn) for n in TXN_SIZES for in_txn in (True, False)}
    if redis_rows:
        expected |= {("redis", n, True) for n in TXN_SIZES}
    assert set(txn) == expected, sorted(txn)
    for key, row in txn.items():
        assert row["msgs_per_s"] > 0 and row["p99_ms"] is not None and not row["errors"], key
        if key[0] == "redis":
            assert row["shardnode_ratio"] > 0, key
    for n in TXN_SIZES:
        ops = txn[("shardnode", n, True)]["ops_ms"]
        assert set(ops) == TXN_OPS and all(p50 > 0 for p50, _p99 in ops.values()), ops
    assert "txn of 100 costs <= 1.5x the same batch without one" in proc.stdout
    checkpoint = {(row["mode"], row["phase"]): row for row in rows
                  if row["scenario"] == "checkpoint"}
    assert all(row["system"] == "shardnode" for row in rows if row["scenario"] == "checkpoint")
    assert set(checkpoint) == {(m, p) for m in CHECKPOINT_MODES for p in PHASES}, sorted(checkpoint)
    for (mode, phase), row in checkpoint.items():
        assert row["checkpoints"] >= 1, (mode, phase, row)
        assert row["checkpoint_ms"] is not None and row["checkpoint_ms"] > 0, (mode, phase, row)
        assert row["records"] > 0 and row["p99_ms"] is not None, (mode, phase, row)
        assert row["rss_mb"] is not None and row["rss_mb"] > 0, (mode, phase, row)
    assert "goal: fuzzy p99 inside" in proc.stdout
    assert "targets (the issues' goals" in proc.stdout and "so its verdicts only indicate" \
        in proc.stdout, "a quick run prints the targets table, saying it is not comparable"


@pytest.mark.timeout(150)
def test_bench_quick_runs_rabbitmq_when_named_and_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    started = time.time()
    proc = subprocess.Popen([str(ROOT / "scripts" / "bench"), *RABBITMQ_SCENARIOS, *SMALLEST,
                             "--peers", "rabbitmq", "--json", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=140)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"bench failed:\n{stdout[-4000:]}\n{stderr[-4000:]}"
    rows = [row for row in json.loads(out.read_text()) if row["system"] == "rabbitmq"]
    if not rows:  # rabbitmq-server was not there and could not be installed
        assert "rabbitmq peer skipped: rabbitmq-server not available" in stdout
        return
    assert sorted(row["scenario"] for row in rows) == sorted(RABBITMQ_SCENARIOS)
    assert all(row["msgs_per_s"] > 0 and row["rss_mb"] > 0 for row in rows), rows
    # scripts/bench execs python, so the server's node name (in the environment of every
    # process it starts) carries this pid; the bench's own epmd started after `started`.
    node = f"shardnode-bench-{proc.pid}-"
    left = []
    for p in psutil.process_iter(["name", "create_time"]):
        try:
            ours = p.environ().get("RABBITMQ_NODENAME", "").startswith(node)
        except psutil.Error:  # gone, or not ours to read
            continue
        if ours or (p.info["name"] == "epmd" and p.info["create_time"] >= started):
            left.append((p.pid, p.info["name"]))
    assert not left, f"left running after the bench: {left}"


KV_KINDS = {("get", 1), ("get", 64), ("put", 1), ("put", 64), ("cas", 1), ("read_by_key", 64)}
STORAGE_ROWS = {f"{kind}: {what}" for kind in ("rocksdb", "memory")
                for what in ("ingest-single", "ingest-batched", "read-tail")}


@pytest.mark.timeout(90)  # about 12 s here
def test_bench_quick_runs_kv_and_storage_when_named(tmp_path: Path) -> None:
    """The kv and storage scenarios run only when named, so the run above leaves them out:
    each of their rows, for the node and (when it is there) Redis, with every value read
    checked against its key (a wrong one is an error)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([str(ROOT / "scripts" / "bench"), "kv", "storage", *SMALLEST,
                           "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=85)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = json.loads(out.read_text())
    kv = {(row["system"], row["op"], row["in_flight"]): row for row in rows
          if row["scenario"] == "kv"}
    systems = {system for system, _op, _n in kv}
    assert systems in ({"shardnode"}, {"shardnode", "redis"}), systems
    if systems == {"shardnode"}:
        assert "redis peer skipped" in proc.stdout
    assert set(kv) == {(system, op, n) for system in systems for op, n in KV_KINDS}, sorted(kv)
    for key, row in kv.items():
        assert row["msgs_per_s"] > 0 and row["p99_ms"] is not None and not row["errors"], key
    storage = {row["system"]: row for row in rows if row["scenario"] == "storage"}
    assert set(storage) == STORAGE_ROWS, sorted(storage)
    assert all(row["msgs_per_s"] > 0 and not row["errors"] for row in storage.values()), storage
    assert "kv_get 64 in flight >= 1.5x Redis GET" in proc.stdout
