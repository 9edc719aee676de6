"""The goals the issues set for this machine, at the bench's default settings, judged on the
rows of a run: met, missed or not run (or, for a figure shown beside them, reported)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .measure import Row
from .settings import (
    AT_LEAST_ONCE,
    BARE_ZMQ,
    CAS,
    CKPT_GOAL,
    EXACTLY_ONCE,
    GET,
    KV,
    KV_CAS_OVER_REDIS_MIN,
    KV_MANY_OVER_REDIS_MIN,
    KV_ONE_OVER_REDIS_MIN,
    KV_PUT_OVER_REDIS_MIN,
    PARQUET,
    PUT,
    READ_BY_KEY,
    REDIS,
    SHARDNODE,
    SINK,
    SOURCE,
    SPARK,
    SPARK_EO_COST_MAX,
    SPARK_OF_BARE_MIN,
    SPARK_OVER_PARQUET_MIN,
    SPARK_SINK_MIN,
    TXN,
    TXN_COST_MAX,
    TXN_GOAL_SIZE,
    TXN_OVER_REDIS_MIN,
    Settings,
)


def _shardnode_row(rows: Sequence[Row], scenario: str, phase: str | None = None) -> Row | None:
    return next((r for r in rows if r.scenario == scenario and r.system == SHARDNODE
                 and (phase is None or (r.mode, r.phase) == ("fuzzy", phase))), None)


def _figure(scenario: str, name: str, phase: str | None = None
            ) -> Callable[[Sequence[Row]], float | None]:
    def measure(rows: Sequence[Row]) -> float | None:
        row = _shardnode_row(rows, scenario, phase)
        return None if row is None else getattr(row, name)
    return measure


def _over_redis(scenario: str) -> Callable[[Sequence[Row]], float | None]:
    def measure(rows: Sequence[Row]) -> float | None:
        row = next((r for r in rows if r.scenario == scenario and r.system == REDIS), None)
        return None if row is None else row.shardnode_ratio
    return measure


def txn_row(rows: Sequence[Row], system: str, size: int, in_txn: bool = True) -> Row | None:
    """The txn scenario's row of ``system``: transactions of ``size`` records, or (the node)
    the same records without one."""
    return next((r for r in rows if r.scenario == TXN and r.system == system
                 and r.per_request == size and r.txn is in_txn), None)


def txn_cost(size: int) -> Callable[[Sequence[Row]], float | None]:
    """The node's time per record in transactions of ``size`` over its time per record in
    batches of ``size`` without one: plain records/s ÷ transactions' records/s."""
    def measure(rows: Sequence[Row]) -> float | None:
        txn, plain = txn_row(rows, SHARDNODE, size), txn_row(rows, SHARDNODE, size, False)
        if txn is None or plain is None or not txn.msgs_per_s:
            return None
        return plain.msgs_per_s / txn.msgs_per_s
    return measure


def txn_over_redis(size: int) -> Callable[[Sequence[Row]], float | None]:
    """The node's transactions/s over Redis MULTI/EXEC's, both of ``size`` records."""
    def measure(rows: Sequence[Row]) -> float | None:
        row = txn_row(rows, REDIS, size)
        return None if row is None else row.shardnode_ratio
    return measure


def kv_row(rows: Sequence[Row], system: str, op: str, in_flight: int | None) -> Row | None:
    """The kv scenario's row of ``system`` doing ``op`` with ``in_flight`` requests in
    flight (None: more than one, the run's --concurrency)."""
    return next((r for r in rows if r.scenario == KV and r.system == system and r.op == op
                 and r.in_flight is not None
                 and (r.in_flight == in_flight if in_flight else r.in_flight > 1)), None)


def kv_over_redis(op: str, in_flight: int | None) -> Callable[[Sequence[Row]], float | None]:
    """The node's ops/s over Redis' equivalent's, both doing ``op`` with as many in flight
    (None: --concurrency)."""
    def measure(rows: Sequence[Row]) -> float | None:
        row = kv_row(rows, REDIS, op, in_flight)
        return None if row is None else row.shardnode_ratio
    return measure


def spark_row(rows: Sequence[Row], system: str, direction: str,
              guarantee: str | None = None) -> Row | None:
    """The spark scenario's row of ``system`` in ``direction`` (the node's sink: of
    ``guarantee``)."""
    return next((r for r in rows if r.scenario == SPARK and r.system == system
                 and r.direction == direction and r.guarantee == guarantee), None)


def spark_rate(guarantee: str) -> Callable[[Sequence[Row]], float | None]:
    """The node's sink's rows/s with ``guarantee``."""
    def measure(rows: Sequence[Row]) -> float | None:
        row = spark_row(rows, SHARDNODE, SINK, guarantee)
        return None if row is None else row.msgs_per_s
    return measure


def spark_over(system: str, direction: str) -> Callable[[Sequence[Row]], float | None]:
    """The node's rows/s over ``system``'s in ``direction`` (the sink: exactly_once's)."""
    def measure(rows: Sequence[Row]) -> float | None:
        row = spark_row(rows, system, direction)
        return None if row is None else row.shardnode_ratio
    return measure


def spark_eo_cost(rows: Sequence[Row]) -> float | None:
    """The sink's time per row exactly once over at least once: at_least_once's rows/s ÷
    exactly_once's."""
    eo, alo = (spark_row(rows, SHARDNODE, SINK, g) for g in (EXACTLY_ONCE, AT_LEAST_ONCE))
    if eo is None or alo is None or not eo.msgs_per_s:
        return None
    return alo.msgs_per_s / eo.msgs_per_s


def spark_eo_cost_applied(rows: Sequence[Row]) -> float | None:
    """As ``spark_eo_cost``, each write's time with the writers' backlog after it (the
    checkpoint that applied it): time per row until the shards hold the rows."""
    eo, alo = (spark_row(rows, SHARDNODE, SINK, g) for g in (EXACTLY_ONCE, AT_LEAST_ONCE))
    if eo is None or alo is None or eo.backlog_s is None or alo.backlog_s is None:
        return None
    per_row = [(r.seconds + (r.backlog_s or 0.0)) / r.records for r in (eo, alo)]
    return per_row[0] / per_row[1] if per_row[1] else None


def _rss_peak(rows: Sequence[Row]) -> float | None:
    # One node's: the cluster scenario's RSS is every member's together.
    peaks = [r.rss_mb for r in rows if r.system == SHARDNODE and r.rss_mb is not None
             and r.nodes is None]
    return max(peaks) if peaks else None


@dataclass(frozen=True)
class Target:
    """A goal an issue set for this machine, at the bench's default settings; with neither
    bound, a figure reported beside the goals (its verdict is None, as if not run)."""

    issue: int
    text: str
    measure: Callable[[Sequence[Row]], float | None]  # None: not measured in this run
    at_least: float | None = None
    at_most: float | None = None
    unit: str = ""

    @property
    def reported_only(self) -> bool:
        return self.at_least is None and self.at_most is None

    def verdict(self, rows: Sequence[Row]) -> tuple[float | None, bool | None]:
        value = self.measure(rows)
        if value is None or self.reported_only:
            return value, None
        return value, ((self.at_least is None or value >= self.at_least)
                       and (self.at_most is None or value <= self.at_most))


# Issue 11's; the txn table prints them under itself too.
TXN_TARGETS = (
    Target(11, f"txn of {TXN_GOAL_SIZE} costs <= {TXN_COST_MAX:g}x the same batch without one",
           txn_cost(TXN_GOAL_SIZE), at_most=TXN_COST_MAX, unit="x"),
    Target(11, f"txn/s (of {TXN_GOAL_SIZE}) >= {TXN_OVER_REDIS_MIN:g}x Redis MULTI/EXEC",
           txn_over_redis(TXN_GOAL_SIZE), at_least=TXN_OVER_REDIS_MIN, unit="x"),
    Target(11, "txn of 1 costs, over a produce of 1 (no goal)", txn_cost(1), unit="x"),
    Target(11, "txn/s (of 1) over Redis MULTI/EXEC (no goal)", txn_over_redis(1), unit="x"),
)

# Issue 12's, judged on the sink's default guarantee, exactly_once; the spark table prints
# them under itself too.
SPARK_TARGETS = (
    Target(12, "spark sink >= 500 000 rows/s", spark_rate(EXACTLY_ONCE), at_least=SPARK_SINK_MIN, unit="/s"),
    Target(12, f"spark sink >= {SPARK_OVER_PARQUET_MIN:g}x Spark's Parquet sink",
           spark_over(PARQUET, SINK), at_least=SPARK_OVER_PARQUET_MIN, unit="x"),
    Target(12, f"spark sink >= {SPARK_OF_BARE_MIN:g}x a bare ZeroMQ socket",
           spark_over(BARE_ZMQ, SINK), at_least=SPARK_OF_BARE_MIN, unit="x"),
    Target(12, f"spark exactly_once costs <= {SPARK_EO_COST_MAX:g}x at_least_once",
           spark_eo_cost, at_most=SPARK_EO_COST_MAX, unit="x"),
    Target(12, "spark exactly_once cost with the writers' backlog (no goal)",
           spark_eo_cost_applied, unit="x"),
    Target(12, "spark sink at_least_once rows/s (no goal)", spark_rate(AT_LEAST_ONCE),
           unit="/s"),
    Target(12, "spark source over Spark's Parquet reader (no goal)",
           spark_over(PARQUET, SOURCE), unit="x"),
)

# Issue 14's, judged on the kv scenario's rows; its table prints them under itself too.
# (read_by_key one at a time is the read-key scenario's row: in TARGETS below.)
KV_TARGETS = (
    Target(14, f"kv_get one at a time >= {KV_ONE_OVER_REDIS_MIN:g}x Redis GET",
           kv_over_redis(GET, 1), at_least=KV_ONE_OVER_REDIS_MIN, unit="x"),
    Target(14, f"kv_get 64 in flight >= {KV_MANY_OVER_REDIS_MIN:g}x Redis GET",
           kv_over_redis(GET, None), at_least=KV_MANY_OVER_REDIS_MIN, unit="x"),
    Target(14, f"read_by_key 64 in flight >= {KV_MANY_OVER_REDIS_MIN:g}x Redis HGET",
           kv_over_redis(READ_BY_KEY, None), at_least=KV_MANY_OVER_REDIS_MIN, unit="x"),
    Target(14, f"kv_put 64 in flight >= {KV_PUT_OVER_REDIS_MIN:g}x Redis SET (AOF always)",
           kv_over_redis(PUT, None), at_least=KV_PUT_OVER_REDIS_MIN, unit="x"),
    Target(14, f"kv_cas >= {KV_CAS_OVER_REDIS_MIN:g}x Redis WATCH/MULTI/EXEC",
           kv_over_redis(CAS, 1), at_least=KV_CAS_OVER_REDIS_MIN, unit="x"),
    Target(14, "kv_put one at a time over Redis SET (no goal)", kv_over_redis(PUT, 1),
           unit="x"),
)


TARGETS = (
    Target(2, "ingest-batched >= 200 000 records/s", _figure("ingest-batched", "msgs_per_s"),
           at_least=200_000, unit="/s"),
    Target(2, "ingest-single >= 20 000 records/s", _figure("ingest-single", "msgs_per_s"),
           at_least=20_000, unit="/s"),
    Target(3, "ingest-batched >= 3x Redis Streams", _over_redis("ingest-batched"),
           at_least=3.0, unit="x"),
    Target(3, "ingest-batched >= 300 000 records/s", _figure("ingest-batched", "msgs_per_s"),
           at_least=300_000, unit="/s"),
    Target(3, "ingest-single >= 1x Redis Streams", _over_redis("ingest-single"),
           at_least=1.0, unit="x"),
    Target(3, "node RSS <= 400 MB in every scenario", _rss_peak, at_most=400, unit=" MB"),
    Target(3, "recovery >= 100 MB/s", _figure("recovery", "mb_per_s"), at_least=100,
           unit=" MB/s"),
    Target(4, f"fuzzy checkpoint p99 inside <= {CKPT_GOAL:g}x outside",
           _figure("checkpoint", "p99_ratio", phase="inside"), at_most=CKPT_GOAL, unit="x"),
    *TXN_TARGETS,
    *SPARK_TARGETS,
    Target(14, f"read_by_key one at a time (read-key) >= {KV_ONE_OVER_REDIS_MIN:g}x Redis HGET",
           _over_redis("read-key"), at_least=KV_ONE_OVER_REDIS_MIN, unit="x"),
    *KV_TARGETS,
)

def defaults_differ(s: Settings) -> list[str]:
    """The settings of this run that differ from those the targets are set for."""
    base = Settings(s.scenarios)
    return [name for name in ("producers", "batch", "size", "concurrency", "seconds",
                              "read_records", "keys", "recovery_mb", "spark_rows", "quick")
            if getattr(s, name) != getattr(base, name)]
