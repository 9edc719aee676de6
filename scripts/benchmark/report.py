"""What a run prints and draws: a table per scenario (the checkpoint and txn scenarios'
their own), the targets table, and the ``--plot`` PNG."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from .measure import Row
from .settings import (
    AT_LEAST_ONCE,
    CKPT_BATCH,
    CKPT_GOAL,
    CKPT_LOAD,
    CLUSTER,
    DISK,
    EXACTLY_ONCE,
    INSIDE,
    KV,
    LARGE_VALUES,
    REDIS,
    ROUTED,
    SHARDNODE,
    SINK,
    SPARK,
    SPARK_CPU,
    SPARK_PARTITIONS,
    TXN,
    Settings,
)
from .targets import (
    KV_TARGETS,
    SPARK_TARGETS,
    TARGETS,
    TXN_TARGETS,
    Target,
    defaults_differ,
    spark_eo_cost,
    txn_cost,
)

console = Console()


def _runs(rows: list[Row]) -> str:
    """How a table's figures were taken: one run, or the median of several."""
    n = max((r.runs for r in rows), default=1)
    return "1 run" if n == 1 else f"median of {n} runs"


def _columns(t: Table, columns: Sequence[str], left: Sequence[str]) -> None:
    """Add ``columns`` to ``t``, right-aligned but for those in ``left``, never wrapped."""
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=True)


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio_text(r: Row) -> str:
    if r.shardnode_ratio is None:
        return ""
    if r.system == DISK:
        share = r.shardnode_ratio
        return f"{share:.0%} of disk MB/s" if share >= 0.1 else f"{share:.1%} of disk MB/s"
    return f"{r.shardnode_ratio:.2f}x"


def goal_met(inside: Row) -> bool | None:
    """Fuzzy mode's goal: p99 inside checkpoints at most CKPT_GOAL times p99 outside."""
    return None if inside.p99_ratio is None else inside.p99_ratio <= CKPT_GOAL


def goal_text(r: Row) -> str:
    if r.phase != INSIDE or r.mode != "fuzzy":
        return ""
    met = goal_met(r)
    return f"<={CKPT_GOAL:g}x " + ("?" if met is None else "met" if met else "MISSED")


def print_checkpoint_table(rows: list[Row], s: Settings) -> None:
    runs = _runs(rows)
    t = Table(title=f"checkpoint  ({s.size}-byte values in batches of {CKPT_BATCH}, "
                    f"{CKPT_LOAD:.0%} load, {runs}; goal: fuzzy p99 inside <= "
                    f"{CKPT_GOAL:g}x outside)", title_justify="left", box=box.SIMPLE_HEAD)
    _columns(t, ("mode", "phase", "requests", "msgs/s", "p50 ms", "p99 ms", "ckpts", "ckpt ms",
                 "in/out p99", "goal"), left=("mode", "phase", "goal"))
    for r in rows:
        t.add_row(r.mode or "", r.phase or "", _num(r.records / CKPT_BATCH),
                  _num(r.msgs_per_s), _num(r.p50_ms, 2),
                  _num(r.p99_ms, 2), _num(r.checkpoints), _num(r.checkpoint_ms, 1),
                  "" if r.p99_ratio is None else f"{r.p99_ratio:.2f}x", goal_text(r))
    (console if console.is_terminal else Console(width=110)).print(t)  # a file: don't crop
    console.print("  a request is inside when \\[send, ack] overlaps a checkpoint; msgs/s of a "
                  "phase: records acknowledged during it over its time; ckpt ms: mean "
                  "checkpoint duration (client's view); MB/s and RSS: --json", highlight=False)
    for r in rows:
        if r.phase != INSIDE:
            continue
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        console.print(f"  {r.mode}: {r.note}{errors}", highlight=False)
        if r.mode == "fuzzy":
            met = goal_met(r)
            verdict = ("[yellow]no figure[/yellow]" if met is None else
                       "[green]met[/green]" if met else "[red]MISSED[/red]")
            ratio = "-" if r.p99_ratio is None else f"{r.p99_ratio:.2f}x"
            console.print(f"  goal: fuzzy p99 inside <= {CKPT_GOAL:g}x p99 outside: {verdict} "
                          f"({ratio})")
    console.print()


def _shown(target: Target, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{target.unit}" if target.unit == "x" else f"{_num(value)}{target.unit}"


def _verdict(value: float | None, met: bool | None) -> str:
    """A target's verdict: not run, reported (a figure with no goal), met or missed."""
    return ("not run" if value is None else "reported" if met is None
            else "[green]met[/green]" if met else "[red]MISSED[/red]")


def print_targets(rows: list[Row], s: Settings) -> None:
    t = Table(title="targets (the issues' goals for this machine)", title_justify="left")
    for col in ("issue", "target", "measured", "verdict"):
        t.add_column(col, justify="right" if col in ("issue", "measured") else "left")
    for target in TARGETS:
        value, met = target.verdict(rows)
        t.add_row(str(target.issue), target.text, _shown(target, value), _verdict(value, met))
    console.print(t)
    differ = defaults_differ(s)
    if differ:
        console.print(f"  the targets are set for the default settings; this run changed "
                      f"{', '.join(differ)}, so its verdicts only indicate", highlight=False,
                      soft_wrap=True)
    console.print()


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_txn_table(rows: list[Row], s: Settings) -> None:
    runs = _runs(rows)
    t = Table(title=f"txn  ({s.size}-byte values, {s.producers} producers, one transaction or "
                    f"batch at a time each, {runs})", title_justify="left")
    _columns(t, ("system", "kind", "records", "txn/s", "msgs/s", "p50 ms", "p99 ms", "RSS MB",
                 "ratio"), left=("system", "kind"))
    ordered = sorted(rows, key=lambda r: (-(r.per_request or 0), r.system != SHARDNODE,
                                          r.txn is False))
    for r in ordered:
        size = r.per_request or 1
        kind = "txn" if r.txn else "no txn"
        if r.system == REDIS and r.txn:
            kind, ratio = "MULTI/EXEC", f"shardnode txn ÷ this {_x(r.shardnode_ratio)}"
        elif r.system == SHARDNODE and r.txn:
            ratio = f"cost {_x(txn_cost(size)(rows))} of no txn"
        else:
            ratio = ""
        t.add_row(r.system, kind, _num(r.per_request), _num(r.msgs_per_s / size),
                  _num(r.msgs_per_s), _num(r.p50_ms, 2), _num(r.p99_ms, 2), _num(r.rss_mb),
                  ratio)
    (console if console.is_terminal else Console(width=120)).print(t)  # a file: don't crop
    console.print("  p50/p99: per transaction (begin to durable commit), or per batch; cost: "
                  "time per record in transactions over that without", highlight=False)
    for r in ordered:
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        ops = ""
        if r.ops_ms:
            ops = "; per op p50/p99 ms: " + ", ".join(
                f"{op} {_num(p50, 2)}/{_num(p99, 2)}" for op, (p50, p99) in r.ops_ms.items())
        console.print(f"  {r.system} x{r.per_request}: {r.note}{ops}{errors}", highlight=False)
    _print_verdicts(TXN_TARGETS, rows)


def _print_verdicts(targets: Sequence[Target], rows: list[Row]) -> None:
    """A scenario's goals under its table: each one's figure and verdict."""
    for target in targets:
        value, met = target.verdict(rows)
        console.print(f"  {target.text}: {_shown(target, value)}, {_verdict(value, met)}",
                      highlight=False)
    console.print()


def print_kv_table(rows: list[Row], s: Settings) -> None:
    from .scenarios.kv import kinds

    runs = _runs(rows)
    t = Table(title=f"kv  ({s.size}-byte values, {s.keys:,} keys, one client process, {runs})",
                    title_justify="left")
    _columns(t, ("op", "in flight", "system", "ops/s", "p50 ms", "p99 ms", "RSS MB",
                 "shardnode ÷ this"), left=("op", "system"))
    order = {kind: i for i, kind in enumerate(kinds(s))}
    ordered = sorted(rows, key=lambda r: (order.get((r.op or "", r.in_flight or 0), len(order)),
                                          r.system != SHARDNODE))
    for r in ordered:
        t.add_row(r.op or "", str(r.in_flight or ""), r.system, _num(r.msgs_per_s),
                  _num(r.p50_ms, 3), _num(r.p99_ms, 3), _num(r.rss_mb), ratio_text(r))
    (console if console.is_terminal else Console(width=110)).print(t)  # a file: don't crop
    console.print("  ops/s: requests answered over the run's time (cas: increments, each a get "
                  "and a compare-and-set); p50/p99: per request (cas: per increment)",
                  highlight=False)
    for r in ordered:
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        console.print(f"  {r.system} {r.op} x{r.in_flight}: {r.note}{errors}", highlight=False)
    _print_verdicts(KV_TARGETS, rows)


def _cpu(r: Row) -> tuple[str, str]:
    """The run's CPU seconds per group of processes; all of them over the wall time."""
    if not r.cpu_s:
        return "-", "-"
    groups = "/".join(f"{r.cpu_s.get(g, 0.0):.1f}" for g in SPARK_CPU)
    return groups, f"{sum(r.cpu_s.get(g, 0.0) for g in SPARK_CPU) / r.seconds:.2f}"


def print_spark_table(rows: list[Row], s: Settings) -> None:
    runs = _runs(rows)
    t = Table(title=f"spark  ({s.spark_rows:,} rows of {s.size}-byte values, one SparkSession "
                    f"local[{SPARK_PARTITIONS}], {runs})", title_justify="left")
    _columns(t, ("", "system", "seconds", "rows/s", "backlog s", "RSS MB",
                 "CPU s " + "/".join(SPARK_CPU), "cores", "ratio"), left=("", "system"))
    ordered = sorted(rows, key=lambda r: (r.direction != SINK, r.system != SHARDNODE,
                                          r.guarantee != EXACTLY_ONCE))
    for r in ordered:
        if r.system == SHARDNODE and r.guarantee == EXACTLY_ONCE:
            ratio = f"cost {_x(spark_eo_cost(rows))}"
        elif r.system != SHARDNODE and r.shardnode_ratio is not None:
            ratio = f"shardnode ÷ this {_x(r.shardnode_ratio)}"
        else:
            ratio = ""
        system = r.system + (f" {r.guarantee}" if r.guarantee else "")
        backlog = "" if r.backlog_s is None else _num(r.backlog_s, 2)
        t.add_row(r.direction or "", system, _num(r.seconds, 2), _num(r.msgs_per_s), backlog,
                  _num(r.rss_mb), *_cpu(r), ratio)
    (console if console.is_terminal else Console(width=145)).print(t)  # a file: don't crop
    console.print("  rows/s: rows over the time of the write (save) or of the query (load, "
                  "count, sum of lengths), the node checkpointed before each; the sink's "
                  "ratios are exactly_once's, its cost is exactly_once's time per row over "
                  "at_least_once's; backlog: the node's checkpoint after the write, in which "
                  "its shard writers applied what they had not yet (untimed; CPU: --json "
                  "cpu_s.node_after); CPU: seconds used in the run by the node, Spark's JVM, "
                  "Spark's Python workers and the bench (driver, drain thread); cores: all of "
                  "it over the wall time; RSS: the node's; MB/s: --json",
                  highlight=False)
    for r in ordered:
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        what = f"{r.direction} {r.system}" + (f" {r.guarantee}" if r.guarantee else "")
        console.print(f"  {what}: {r.note}{errors}", highlight=False)
    _print_verdicts(SPARK_TARGETS, rows)


def print_cluster_table(rows: list[Row], s: Settings) -> None:
    runs = _runs(rows)
    t = Table(title=f"cluster  ({s.size}-byte values, {s.producers} producers, {runs})",
              title_justify="left")
    _columns(t, ("members", "kind", "routing", "msgs/s", "p50 ms", "p99 ms", "RSS MB",
                 "CPU s per member", "cores busy", "÷ 1 member", "÷ routed"),
             left=("kind", "routing"))

    def same(r: Row, nodes: int, routing: str) -> Row | None:
        return next((x for x in rows if x.per_request == r.per_request and x.nodes == nodes
                     and x.routing == routing), None)

    ordered = sorted(rows, key=lambda r: (-(r.per_request or 0), r.nodes or 0,
                                          r.routing != ROUTED))
    for r in ordered:
        one, routed = same(r, 1, ROUTED), same(r, r.nodes or 0, ROUTED)
        cpu = r.cpu_s or {}
        members = "/".join(f"{v:.1f}" for k, v in sorted(cpu.items()) if k.startswith("node-"))
        t.add_row(str(r.nodes), "batched" if (r.per_request or 1) > 1 else "single",
                  r.routing or "", _num(r.msgs_per_s), _num(r.p50_ms, 2), _num(r.p99_ms, 2),
                  _num(r.rss_mb), members or "-",
                  _num(cpu["machine"] / r.seconds, 2) if "machine" in cpu else "-",
                  _x(r.msgs_per_s / one.msgs_per_s) if one and one is not r else "",
                  _x(r.msgs_per_s / routed.msgs_per_s) if routed and routed is not r else "")
    (console if console.is_terminal else Console(width=140)).print(t)  # a file: don't crop
    console.print("  p50/p99: per batch, or per request; RSS: every member together; CPU: "
                  "seconds used in the run by each member's processes; cores busy: the machine's "
                  "busy CPU (clients included) over the run's time; "
                  "÷ 1 member: msgs/s over the one-member cluster's of the same kind; "
                  "÷ routed: forwarded over routed, same size", highlight=False)
    for r in ordered:
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        console.print(f"  {r.note}{errors}", highlight=False)


def print_large_values_table(rows: list[Row]) -> None:
    runs = _runs(rows)
    t = Table(title=f"{LARGE_VALUES}  ({runs})", title_justify="left")
    _columns(t, ("value", "kept in", "values", "ingest MB/s", "read MB/s", "SST MB", "blob MB",
                 "writers' RSS MB"), left=("kept in",))
    for r in sorted(rows, key=lambda r: (r.value_bytes or 0, r.way or "")):
        t.add_row(f"{(r.value_bytes or 0) / (1 << 20):g} MiB", r.way or "", str(r.records),
                  _num(r.mb_per_s, 1), _num(r.read_mb_per_s, 1), _num(r.sst_mb),
                  _num(r.blob_mb), _num(r.writer_rss_mb))
    (console if console.is_terminal else Console(width=120)).print(t)  # a file: don't crop
    console.print("  ingest: one value a request, one at a time, until the shard writer has "
                  "applied the last (a read by key of it answers); read: every value back by "
                  "offset from a restarted node (the shards, not the cache); SST/blob MB: the "
                  "shards' files after a clean stop (MB = 10^6 bytes); RSS: the two writer "
                  "processes together, the largest sampled in ingest and read", highlight=False)
    for r in rows:
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        console.print(f"  {r.note}{errors}", highlight=False)


def print_table(scenario: str, rows: list[Row], s: Settings) -> None:
    if scenario == LARGE_VALUES:
        print_large_values_table(rows)
        return
    if scenario == CLUSTER:
        print_cluster_table(rows, s)
        return
    if scenario == "checkpoint":
        print_checkpoint_table(rows, s)
        return
    if scenario == TXN:
        print_txn_table(rows, s)
        return
    if scenario == SPARK:
        print_spark_table(rows, s)
        return
    if scenario == KV:
        print_kv_table(rows, s)
        return
    runs = _runs(rows)
    t = Table(title=f"{scenario}  ({s.size}-byte values, {runs})", title_justify="left")
    _columns(t, ("system", "msgs/s", "MB/s", "p50 ms", "p99 ms", "RSS MB", "shardnode ÷ this"),
             left=("system",))
    for r in rows:
        t.add_row(r.system, _num(r.msgs_per_s), _num(r.mb_per_s, 1), _num(r.p50_ms, 2),
                  _num(r.p99_ms, 2), _num(r.rss_mb), ratio_text(r))
    console.print(t)
    for r in rows:
        errors = f" [red]{r.errors} errors[/red]" if r.errors else ""
        console.print(f"  {r.system}: {r.note}{errors}", highlight=False)
    console.print()


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def group_of(r: Row) -> str:
        """A bar group: per scenario; per mode and phase (checkpoint); per size and whether
        in transactions (txn: Redis' MULTI/EXEC beside the node's transactions); per
        direction (spark: the node's at-least-once sink a group of its own)."""
        if r.mode is not None:
            return f"{r.scenario}\n{r.mode} {r.phase}"
        if r.direction is not None:
            alone = "\nat_least_once" if r.guarantee == AT_LEAST_ONCE else ""
            return f"{r.scenario} {r.direction}{alone}"
        if r.per_request is not None:
            return f"{r.scenario} x{r.per_request}\n{'txn' if r.txn else 'no txn'}"
        if r.op is not None:
            return f"{r.scenario} {r.op}\nx{r.in_flight}"
        return r.scenario

    scenarios = list(dict.fromkeys(group_of(r) for r in rows))
    systems = list(dict.fromkeys(r.system for r in rows))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(11.0, 1.3 * len(scenarios)), 8))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs, tput, p50, p99 = [], [], [], []
        for j, scenario in enumerate(scenarios):
            row = next((r for r in rows if group_of(r) == scenario and r.system == system),
                       None)
            if row is None:
                continue
            xs.append(j + (i - (len(systems) - 1) / 2) * width)
            tput.append(row.msgs_per_s)
            p50.append(row.p50_ms or 0.0)
            p99.append(row.p99_ms or 0.0)
        color = f"C{i}"
        top.bar(xs, tput, width, label=system, color=color)
        bottom.bar(xs, p99, width, color=color, alpha=0.4)
        bottom.bar(xs, p50, width, color=color)
    for ax, label in ((top, "records/s (log)"), (bottom, "latency ms, p50 solid, p99 pale (log)")):
        ax.set_xticks(range(len(scenarios)), scenarios)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    top.legend(ncols=len(systems), fontsize=8)
    top.set_title(f"shardnode bench {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
                  f"{os.cpu_count()} CPUs (recovery: records replayed/s; checkpoint: "
                  f"acks/s in the phase)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
