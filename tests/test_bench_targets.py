"""The bench's targets table: each issue's goal judged on the rows of a run."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from scripts.benchmark.measure import Row, median_row
from scripts.benchmark.scenarios import add_ratios
from scripts.benchmark.targets import KV_TARGETS, SPARK_TARGETS, TARGETS, TXN_TARGETS

ROOT = Path(__file__).resolve().parent.parent


def row(scenario: str, system: str, **kw: Any) -> Row:
    base = {"msgs_per_s": 1.0, "mb_per_s": 1.0, "p50_ms": 1.0, "p99_ms": 1.0, "rss_mb": 100.0,
            "records": 1, "seconds": 1.0}
    return Row(scenario, system, **{**base, **kw})


def verdicts(rows: list[Row]) -> dict[str, tuple[float | None, bool | None]]:
    return {t.text: t.verdict(rows) for t in TARGETS}


def test_each_target_is_met_missed_or_not_run_from_the_rows() -> None:
    rows = [
        row("ingest-batched", "shardnode", msgs_per_s=250_000, rss_mb=390),
        row("ingest-batched", "redis", msgs_per_s=80_000, shardnode_ratio=250_000 / 80_000),
        row("ingest-single", "shardnode", msgs_per_s=19_999, rss_mb=401),
        row("ingest-single", "redis", msgs_per_s=15_000, shardnode_ratio=19_999 / 15_000),
        row("checkpoint", "shardnode", mode="fuzzy", phase="inside", p99_ratio=2.0),
        row("checkpoint", "shardnode", mode="fuzzy", phase="outside", p99_ratio=2.0),
    ]
    v = verdicts(rows)
    assert v["ingest-batched >= 200 000 records/s"] == (250_000, True)
    assert v["ingest-batched >= 300 000 records/s"] == (250_000, False)
    assert v["ingest-batched >= 3x Redis Streams"][1] is True
    assert v["ingest-single >= 20 000 records/s"] == (19_999, False)
    assert v["ingest-single >= 1x Redis Streams"][1] is True
    assert v["node RSS <= 400 MB in every scenario"] == (401, False)  # the largest of any row
    assert v["recovery >= 100 MB/s"] == (None, None)  # not run
    assert v["fuzzy checkpoint p99 inside <= 2x outside"] == (2.0, True)  # at the bound


def txn_rows(node_txn: float, node_plain: float, redis: float, size: int) -> list[Row]:
    """The txn scenario's rows of one size, records/s each, with the ratio to Redis as
    ``run_scenario`` sets it."""
    return [
        row("txn", "shardnode", msgs_per_s=node_txn, per_request=size, txn=True,
            ops_ms={"begin": [1.0, 2.0], "produce": [1.0, 2.0], "commit": [2.0, 4.0]}),
        row("txn", "shardnode", msgs_per_s=node_plain, per_request=size, txn=False),
        row("txn", "redis", msgs_per_s=redis, per_request=size, txn=True,
            shardnode_ratio=node_txn / redis),
    ]


def test_the_txn_targets_judge_transactions_of_100_and_report_those_of_1() -> None:
    # 100: cost 15 000 / 10 000 = 1.5 (at the bound), 10 000 / 5 000 = 2x Redis (at it);
    # 1: cost 3x, 0.5x Redis, reported with no verdict.
    rows = txn_rows(10_000, 15_000, 5_000, 100) + txn_rows(500, 1_500, 1_000, 1)
    v = verdicts(rows)
    assert v["txn of 100 costs <= 1.5x the same batch without one"] == (1.5, True)
    assert v["txn/s (of 100) >= 2x Redis MULTI/EXEC"] == (2.0, True)
    assert v["txn of 1 costs, over a produce of 1 (no goal)"] == (3.0, None)
    assert v["txn/s (of 1) over Redis MULTI/EXEC (no goal)"] == (0.5, None)
    missed = verdicts(txn_rows(10_000, 15_001, 5_001, 100))
    assert missed["txn of 100 costs <= 1.5x the same batch without one"][1] is False
    assert missed["txn/s (of 100) >= 2x Redis MULTI/EXEC"][1] is False


def test_the_txn_targets_are_not_run_without_their_rows() -> None:
    only_node = [r for r in txn_rows(10_000, 12_000, 4_000, 100) if r.system != "redis"]
    no_plain = [r for r in txn_rows(10_000, 12_000, 4_000, 100) if r.txn is not False]
    assert verdicts(only_node)["txn/s (of 100) >= 2x Redis MULTI/EXEC"] == (None, None)
    assert verdicts(only_node)["txn of 100 costs <= 1.5x the same batch without one"][1] is True
    assert verdicts(no_plain)["txn of 100 costs <= 1.5x the same batch without one"] == (None, None)
    assert verdicts(no_plain)["txn/s (of 100) >= 2x Redis MULTI/EXEC"] == (2.5, True)
    # rows of another scenario with the same systems do not count
    other = [replace(r, scenario="ingest-batched") for r in txn_rows(1, 1, 1, 100)]
    assert all(verdicts(other)[t.text] == (None, None) for t in TXN_TARGETS)


def test_the_txn_ratios_compare_rows_of_the_same_size() -> None:
    """run_scenario's ratios: Redis MULTI/EXEC of n against the node's transactions of n."""
    rows = txn_rows(10_000, 15_000, 4_000, 100) + txn_rows(500, 1_500, 1_000, 1)
    for r in rows:
        r.shardnode_ratio = None
    add_ratios(rows)
    ratios = {(r.system, r.per_request, r.txn): r.shardnode_ratio for r in rows}
    assert ratios == {("shardnode", 100, True): None, ("shardnode", 100, False): None,
                      ("redis", 100, True): 2.5, ("shardnode", 1, True): None,
                      ("shardnode", 1, False): None, ("redis", 1, True): 0.5}


def test_repeated_txn_runs_give_the_median_of_each_op() -> None:
    runs = [row("txn", "shardnode", msgs_per_s=x, per_request=100, txn=True,
                ops_ms={"begin": [x / 1000, 2 * x / 1000], "commit": [x / 100, None]})
            for x in (3_000.0, 1_000.0, 2_000.0)]
    med = median_row(runs)
    assert (med.msgs_per_s, med.runs, med.per_request, med.txn) == (2_000.0, 3, 100, True)
    assert med.ops_ms == {"begin": [2.0, 4.0], "commit": [20.0, None]}


def kv_rows(node: dict[tuple[str, int], float], redis: dict[tuple[str, int], float]
            ) -> list[Row]:
    """The kv scenario's rows, ops/s by (op, in flight), with the ratios as
    ``run_scenario`` sets them."""
    rows = [row("kv", system, msgs_per_s=x, op=op, in_flight=n)
            for system, figures in (("shardnode", node), ("redis", redis))
            for (op, n), x in figures.items()]
    add_ratios(rows)
    return rows


KV_NODE = {("get", 1): 10_000.0, ("get", 64): 60_000.0, ("put", 1): 500.0,
           ("put", 64): 20_000.0, ("cas", 1): 900.0, ("read_by_key", 64): 29_999.0}
KV_REDIS = {("get", 1): 10_000.0, ("get", 64): 40_000.0, ("put", 1): 1_000.0,
            ("put", 64): 10_000.0, ("cas", 1): 1_000.0, ("read_by_key", 64): 20_000.0}


def test_the_kv_targets_compare_the_same_op_with_as_many_in_flight() -> None:
    rows = kv_rows(KV_NODE, KV_REDIS)
    ratios = {(r.system, r.op, r.in_flight): r.shardnode_ratio for r in rows}
    assert ratios[("redis", "get", 1)] == 1.0 and ratios[("redis", "get", 64)] == 1.5
    assert ratios[("redis", "put", 1)] == 0.5 and ratios[("redis", "put", 64)] == 2.0
    assert all(v is None for (system, _op, _n), v in ratios.items() if system == "shardnode")
    v = verdicts(rows)
    assert v["kv_get one at a time >= 1x Redis GET"] == (1.0, True)  # at the bound
    assert v["kv_get 64 in flight >= 1.5x Redis GET"] == (1.5, True)
    assert v["read_by_key 64 in flight >= 1.5x Redis HGET"] == (29_999 / 20_000, False)
    assert v["kv_put 64 in flight >= 2x Redis SET (AOF always)"] == (2.0, True)
    assert v["kv_cas >= 1x Redis WATCH/MULTI/EXEC"] == (0.9, False)
    assert v["kv_put one at a time over Redis SET (no goal)"] == (0.5, None)
    # one at a time, read_by_key is the read-key scenario's row
    assert v["read_by_key one at a time (read-key) >= 1x Redis HGET"] == (None, None)
    read_key = [row("read-key", "shardnode", msgs_per_s=3_000.0),
                row("read-key", "redis", msgs_per_s=2_000.0, shardnode_ratio=1.5)]
    assert verdicts(read_key)["read_by_key one at a time (read-key) >= 1x Redis HGET"] == \
        (1.5, True)


def test_the_kv_targets_are_not_run_without_redis_rows() -> None:
    only_node = [r for r in kv_rows(KV_NODE, KV_REDIS) if r.system == "shardnode"]
    assert all(verdicts(only_node)[t.text] == (None, None) for t in KV_TARGETS)
    # another --concurrency still counts as the rows in flight
    rows = kv_rows({("get", 16): 30_000.0}, {("get", 16): 10_000.0})
    assert verdicts(rows)["kv_get 64 in flight >= 1.5x Redis GET"] == (3.0, True)
    assert verdicts(rows)["kv_get one at a time >= 1x Redis GET"] == (None, None)


def spark_rows(eo: float, alo: float, parquet: float, bare: float, source: float,
               parquet_read: float) -> list[Row]:
    """The spark scenario's rows, rows/s each, with the ratios as ``run_scenario`` sets them."""
    rows = [
        row("spark", "shardnode", msgs_per_s=eo, direction="sink", guarantee="exactly_once"),
        row("spark", "shardnode", msgs_per_s=alo, direction="sink", guarantee="at_least_once"),
        row("spark", "parquet", msgs_per_s=parquet, direction="sink"),
        row("spark", "zmq-pull", msgs_per_s=bare, direction="sink"),
        row("spark", "shardnode", msgs_per_s=source, direction="source"),
        row("spark", "parquet", msgs_per_s=parquet_read, direction="source"),
    ]
    add_ratios(rows)
    return rows


def test_the_spark_targets_judge_the_exactly_once_sink() -> None:
    # 500 000/s at the bound, = Parquet's, half the bare socket's, 650 000 / 500 000 = 1.3x
    v = verdicts(spark_rows(500_000, 650_000, 500_000, 1_000_000, 100_000, 400_000))
    assert v["spark sink >= 500 000 rows/s"] == (500_000, True)
    assert v["spark sink >= 1x Spark's Parquet sink"] == (1.0, True)
    assert v["spark sink >= 0.5x a bare ZeroMQ socket"] == (0.5, True)
    assert v["spark exactly_once costs <= 1.3x at_least_once"] == (1.3, True)
    assert v["spark sink at_least_once rows/s (no goal)"] == (650_000, None)
    assert v["spark source over Spark's Parquet reader (no goal)"] == (0.25, None)
    # at_least_once's figures do not stand in for exactly_once's
    missed = verdicts(spark_rows(200_000, 900_000, 400_000, 600_000, 1, 1))
    assert missed["spark sink >= 500 000 rows/s"] == (200_000, False)
    assert missed["spark sink >= 1x Spark's Parquet sink"] == (0.5, False)
    assert missed["spark sink >= 0.5x a bare ZeroMQ socket"][1] is False
    assert missed["spark exactly_once costs <= 1.3x at_least_once"] == (4.5, False)


def test_the_spark_cost_with_the_backlog_counts_the_checkpoint_after_each_write() -> None:
    rows = spark_rows(500_000, 600_000, 1, 1, 1, 1)
    eo, alo = rows[0], rows[1]
    eo.records = alo.records = 1_000_000
    eo.seconds, eo.backlog_s = 2.0, 2.5   # 4.5 s in all
    alo.seconds, alo.backlog_s = 1.5, 0.0
    v = verdicts(rows)
    assert v["spark exactly_once costs <= 1.3x at_least_once"] == (1.2, True)
    assert v["spark exactly_once cost with the writers' backlog (no goal)"] == (3.0, None)
    alo.backlog_s = None  # not measured: no figure
    assert verdicts(rows)["spark exactly_once cost with the writers' backlog (no goal)"] == \
        (None, None)


def test_the_spark_ratios_compare_the_same_direction() -> None:
    rows = spark_rows(200_000, 250_000, 400_000, 800_000, 50_000, 500_000)
    ratios = {(r.direction, r.system, r.guarantee): r.shardnode_ratio for r in rows}
    assert ratios == {("sink", "shardnode", "exactly_once"): None,
                      ("sink", "shardnode", "at_least_once"): None,
                      ("sink", "parquet", None): 0.5, ("sink", "zmq-pull", None): 0.25,
                      ("source", "shardnode", None): None, ("source", "parquet", None): 0.1}
    without_eo = [r for r in rows if r.guarantee != "exactly_once"]
    for r in without_eo:
        r.shardnode_ratio = None
    add_ratios(without_eo)
    judged = verdicts(without_eo)
    assert all(judged[t.text] == (None, None) for t in SPARK_TARGETS
               if "source" not in t.text and "at_least_once rows/s" not in t.text)
    assert judged["spark sink at_least_once rows/s (no goal)"] == (250_000, None)


def test_repeated_spark_runs_give_the_median_of_each_cpu_group() -> None:
    runs = [row("spark", "shardnode", msgs_per_s=x, direction="sink", guarantee="exactly_once",
                cpu_s={"node": x / 100_000, "jvm": 1.0}) for x in (300_000.0, 100_000.0, 200_000.0)]
    med = median_row(runs)
    assert (med.msgs_per_s, med.direction, med.guarantee) == (200_000.0, "sink", "exactly_once")
    assert med.cpu_s == {"node": 2.0, "jvm": 1.0}


def test_a_recorded_run_is_judged_as_its_notes_say() -> None:
    """Run 13 (docs/BENCHMARKS.md): every target met but the fuzzy checkpoint's and issue
    14's read_by_key one at a time (its read-key row: 0.24x Redis HGET); issue 11's, 12's
    and 14's others were not run (the txn, spark and kv scenarios came later)."""
    names = {f.name for f in fields(Row)}
    rows = [Row(**{k: v for k, v in r.items() if k in names})
            for r in json.loads((ROOT / "docs" / "bench-run13.json").read_text())]
    judged = verdicts(rows)
    missed = [text for text, (_value, met) in judged.items() if met is False]
    assert missed == ["fuzzy checkpoint p99 inside <= 2x outside",
                      "read_by_key one at a time (read-key) >= 1x Redis HGET"]
    assert [text for text, (value, _met) in judged.items() if value is None] == \
        [t.text for t in (*TXN_TARGETS, *SPARK_TARGETS, *KV_TARGETS)]
