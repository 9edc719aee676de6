"""shardnode in one minute: start a node on ./var/demo, write 100 000 records in batches of
1000, read every one back and check its value and offset, show the figures, stop the node.

    scripts/demo [--port 7400] [--records 100000] [--batch 1000] [--size 100]

Exits non-zero if any record read back differs from what was written.
"""

from __future__ import annotations

import argparse
import math
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from node.client import NodeClient
from node.local import LocalNode

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "demo"
MISMATCHES_SHOWN_MAX = 10

console = Console()


def value_of(i: int, size: int) -> bytes:
    """Record ``i``'s value: its number, then filler, ``size`` bytes in all."""
    return (b"record %012d " % i).ljust(size, b".")[:size]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass(slots=True)
class Phase:
    """One pass over the records: how long it took and each request's latency."""

    records: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console)


def write(c: NodeClient, records: int, batch: int, size: int, mismatches: list[str]) -> Phase:
    phase = Phase()
    with progress_bar() as bar:
        task = bar.add_task("write", total=records, rate="")
        t_start = time.monotonic()
        for first in range(0, records, batch):
            n = min(batch, records - first)
            values = [value_of(i, size) for i in range(first, first + n)]
            t0 = time.monotonic()
            offsets = c.produce_batch(TOPIC, values, partition=0)
            phase.latencies_s.append(time.monotonic() - t0)
            expected = [(0, i) for i in range(first, first + n)]
            if offsets != expected:
                mismatches.append(f"batch at {first}: acknowledged offsets {offsets[:1]}…"
                                  f"{offsets[-1:]}, expected {expected[:1]}…{expected[-1:]}")
            phase.records += n
            phase.seconds = time.monotonic() - t_start
            bar.update(task, completed=phase.records, rate=f"{phase.per_s:,.0f} msgs/s")
    return phase


def read_back(c: NodeClient, records: int, batch: int, size: int,
              mismatches: list[str]) -> Phase:
    phase = Phase()
    with progress_bar() as bar:
        task = bar.add_task("read ", total=records, rate="")
        t_start = time.monotonic()
        while phase.records < records:
            t0 = time.monotonic()
            got = c.read(TOPIC, 0, phase.records, min(batch, records - phase.records))
            phase.latencies_s.append(time.monotonic() - t0)
            if not got:
                mismatches.append(f"read at offset {phase.records} returned nothing: "
                                  f"{records - phase.records} records missing")
                break
            for i, record in enumerate(got, start=phase.records):
                if record.offset != i or record.value != value_of(i, size):
                    mismatches.append(f"offset {i}: read offset {record.offset} value "
                                      f"{record.value[:24]!r}…, "
                                      f"expected {value_of(i, size)[:24]!r}…")
            phase.records += len(got)
            phase.seconds = time.monotonic() - t_start
            bar.update(task, completed=phase.records, rate=f"{phase.per_s:,.0f} msgs/s")
    return phase


def summary(w: Phase, r: Phase, size: int, batch: int) -> Table:
    t = Table(title=f"shardnode demo: {w.records:,} records of {size} bytes, "
                    f"batches of {batch}", title_justify="left")
    for col in ("", "records", "msgs/s", "MB/s", "p50 ms / batch", "p99 ms / batch"):
        t.add_column(col, justify="left" if not col else "right")
    for name, phase in (("write (acked durable)", w), ("read back, checked", r)):
        t.add_row(name, f"{phase.records:,}", f"{phase.per_s:,.0f}",
                  f"{phase.per_s * size / 1e6:.1f}",
                  f"{percentile(phase.latencies_s, 50) * 1000:.2f}",
                  f"{percentile(phase.latencies_s, 99) * 1000:.2f}")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=7400, help="client port (default 7400)")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--size", type=int, default=100, help="value bytes (at least 20)")
    p.add_argument("--data-dir", type=Path, default=ROOT / "var" / "demo")
    a = p.parse_args(argv)
    if a.size < 20 or a.batch < 1 or a.records < 1:
        p.error("need --size >= 20, --batch >= 1 and --records >= 1")
    if not port_is_free(a.port):
        console.print(f"[red]port {a.port} is in use[/red] (another node?): pass --port N")
        return 2
    shutil.rmtree(a.data_dir, ignore_errors=True)
    log_file = a.data_dir.parent / "demo-node.log"
    log_file.unlink(missing_ok=True)
    node = LocalNode(a.data_dir, port=a.port, log_file=log_file)
    console.print(f"starting a node on {node.endpoint}, data in {a.data_dir}")
    mismatches: list[str] = []
    node.start()
    try:
        with node.client() as c:
            c.create_topic(TOPIC, partitions=1)
            w = write(c, a.records, a.batch, a.size, mismatches)
            r = read_back(c, a.records, a.batch, a.size, mismatches)
    finally:
        node.stop()
    console.print(summary(w, r, a.size, a.batch))
    if mismatches:
        console.print(f"[red]FAILED: {len(mismatches)} mismatch(es)[/red]")
        for m in mismatches[:MISMATCHES_SHOWN_MAX]:
            console.print(f"  {m}", highlight=False)
        return 1
    console.print(f"[green]OK[/green]: all {r.records:,} records read back with the values "
                  f"and offsets written; node stopped, log in {node.log_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
