"""What a run prints and draws: a table per scenario (the checkpoint scenario's its own),
the targets table, and the ``--plot`` PNG."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from .measure import Row
from .settings import CKPT_BATCH, CKPT_GOAL, CKPT_LOAD, DISK, INSIDE, Settings
from .targets import TARGETS, defaults_differ

console = Console()


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
    n = max((r.runs for r in rows), default=1)
    runs = "1 run" if n == 1 else f"median of {n} runs"
    t = Table(title=f"checkpoint  ({s.size}-byte values in batches of {CKPT_BATCH}, "
                    f"{CKPT_LOAD:.0%} load, {runs}; goal: fuzzy p99 inside <= "
                    f"{CKPT_GOAL:g}x outside)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("mode", "phase", "requests", "msgs/s", "p50 ms", "p99 ms", "ckpts", "ckpt ms",
                "in/out p99", "goal"):
        left = col in ("mode", "phase", "goal")
        t.add_column(col, justify="left" if left else "right", no_wrap=True)
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


def print_targets(rows: list[Row], s: Settings) -> None:
    t = Table(title="targets (the issues' goals for this machine)", title_justify="left")
    for col in ("issue", "target", "measured", "verdict"):
        t.add_column(col, justify="right" if col in ("issue", "measured") else "left")
    for target in TARGETS:
        value, met = target.verdict(rows)
        shown = "-" if value is None else (f"{value:.2f}{target.unit}" if target.unit == "x"
                                           else f"{_num(value)}{target.unit}")
        verdict = ("not run" if met is None else "[green]met[/green]" if met
                   else "[red]MISSED[/red]")
        t.add_row(str(target.issue), target.text, shown, verdict)
    console.print(t)
    differ = defaults_differ(s)
    if differ:
        console.print(f"  the targets are set for the default settings; this run changed "
                      f"{', '.join(differ)}, so its verdicts only indicate", highlight=False,
                      soft_wrap=True)
    console.print()


def print_table(scenario: str, rows: list[Row], s: Settings) -> None:
    if scenario == "checkpoint":
        print_checkpoint_table(rows, s)
        return
    n = max((r.runs for r in rows), default=1)
    runs = "1 run" if n == 1 else f"median of {n} runs"
    t = Table(title=f"{scenario}  ({s.size}-byte values, {runs})", title_justify="left")
    for col in ("system", "msgs/s", "MB/s", "p50 ms", "p99 ms", "RSS MB", "shardnode ÷ this"):
        t.add_column(col, justify="left" if col == "system" else "right", no_wrap=True)
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

    def group_of(r: Row) -> str:  # the checkpoint scenario has a bar group per mode and phase
        return r.scenario if r.mode is None else f"{r.scenario}\n{r.mode} {r.phase}"

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
