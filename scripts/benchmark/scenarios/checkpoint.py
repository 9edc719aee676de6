"""checkpoint: the node alone. Per checkpoint mode, a fresh node under paced producers at
half its batched capacity while a client runs checkpoints back to back; acknowledgement
latency of requests inside checkpoints against the others."""

from __future__ import annotations

import bisect
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..bench import Bench
from ..clients import run_clients
from ..measure import ClientResult, Row, median_row, ms, percentile
from ..peers.base import Server
from ..peers.node import NodeServer
from ..settings import (
    CKPT_BATCH,
    CKPT_GAP_S,
    CKPT_IN_FLIGHT_MAX,
    CKPT_LATE_S,
    CKPT_LOAD,
    CKPT_MODES,
    CKPT_SECONDS_MIN,
    CKPT_SECONDS_PER,
    CKPT_TIMEOUT_MS,
    INSIDE,
    MB,
    OUTSIDE,
    SHARDNODE,
)
from ..workloads.node import sn_checkpointer, sn_produce_paced


class Intervals:
    """Checkpoint intervals [start, end]: one runs at a time, so they are disjoint."""

    def __init__(self, spans: Sequence[tuple[float, float]]) -> None:
        self.spans = sorted(spans)
        self.ends = [end for _start, end in self.spans]

    def overlaps(self, start: float, end: float) -> bool:
        """Whether [start, end] shares a moment with any interval."""
        i = bisect.bisect_left(self.ends, start)  # the first interval not over before start
        return i < len(self.spans) and self.spans[i][0] <= end

    def covered_s(self, lo: float, hi: float) -> float:
        """Seconds of [lo, hi] inside some interval."""
        return sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in self.spans)


def checkpoint_rows(mode: str, producers: Sequence[ClientResult], checkpointer: ClientResult,
                    rss_mb: float | None, batch: int, size: int) -> tuple[Row, Row, float]:
    """The inside and outside rows of one timed run, and its overall msgs/s.

    A request is inside when [send, ack] overlaps a checkpoint's [start, end]; its latency
    counts there. A phase's msgs/s is the records acknowledged during that phase's time
    (ack inside a checkpoint interval, or not) over that time."""
    iv = Intervals(checkpointer.intervals)
    lo = min(r.started for r in producers)
    hi = max(max(r.finished for r in producers), lo + 1e-9)
    seconds = {INSIDE: iv.covered_s(lo, hi)}
    seconds[OUTSIDE] = hi - lo - seconds[INSIDE]
    latencies: dict[str, list[float]] = {INSIDE: [], OUTSIDE: []}
    acked = dict.fromkeys(latencies, 0)
    for r in producers:
        for sent, latency in zip(r.sends_s, r.latencies_s, strict=True):
            ack = sent + latency
            latencies[INSIDE if iv.overlaps(sent, ack) else OUTSIDE].append(latency)
            acked[INSIDE if iv.overlaps(ack, ack) else OUTSIDE] += 1
    durations = [end - start for start, end in checkpointer.intervals]
    mean_ms = statistics.fmean(durations) * 1000 if durations else None
    errors = sum(r.errors for r in producers) + checkpointer.errors
    rows = []
    for phase in (INSIDE, OUTSIDE):
        rate = acked[phase] * batch / seconds[phase] if seconds[phase] > 0 else 0.0
        rows.append(Row("checkpoint", SHARDNODE, rate, rate * size / MB,
                        ms(percentile(latencies[phase], 50)),
                        ms(percentile(latencies[phase], 99)), rss_mb,
                        len(latencies[phase]) * batch, seconds[phase], errors, mode=mode,
                        phase=phase, checkpoints=len(durations), checkpoint_ms=mean_ms))
    overall = sum(r.records for r in producers) / (hi - lo)
    return rows[0], rows[1], overall


def node_checkpoint_figures(node: NodeServer, expected: int) -> dict[str, Any]:
    """The node's own checkpoint figures, once its status counts ``expected`` checkpoints
    (actors report about once a second), or after a few seconds whatever it says."""
    deadline = time.monotonic() + 5.0
    with node.node.client(timeout_ms=5000) as c:
        while True:
            st = c.status()
            if st["log"].get("checkpoints", 0) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # poll until the log manager's next report
    flush = {a["role"]: a["figures"].get("last_flush_ms") for a in st["actors"]
             if a["role"].startswith("writer-")}
    return {**st["log"], "last_flush_ms": flush}


def checkpoint(b: Bench, server: Server) -> list[Row]:
    """Per mode, a fresh node: its batched capacity (measured once per bench run, or
    ingest-batched's when that ran with the same batch and value size), then paced producers
    at CKPT_LOAD of it while a client runs checkpoints CKPT_GAP_S apart; the acknowledgement
    latencies of requests inside checkpoints against the others."""
    assert server.system == SHARDNODE
    s = b.s
    seconds = max(CKPT_SECONDS_MIN, CKPT_SECONDS_PER * s.seconds)
    rows: list[Row] = []
    for mode in CKPT_MODES:
        node = b.checkpoint_node(mode)
        node.start()
        try:
            topic = "checkpoint"
            node.create_topic(topic, s.producers)
            capacity, how = b.checkpoint_capacity(node, topic)
            rate = CKPT_LOAD * capacity
            with node.node.client(timeout_ms=CKPT_TIMEOUT_MS) as c:
                c.checkpoint()  # the timed checkpoints flush only what the timed run wrote
            runs: list[tuple[Row, Row, float, int, int]] = []
            for _ in range(s.repeat):
                producers = [replace(b.job(p, node.target, topic, partition=p, seconds=seconds,
                                           rate=rate / s.producers),
                                     batch=CKPT_BATCH, concurrency=CKPT_IN_FLIGHT_MAX)
                             for p in range(s.producers)]
                checker = b.job(s.producers, node.target, topic, seconds=seconds,
                                gap_s=CKPT_GAP_S)
                results, rss = run_clients([sn_produce_paced] * s.producers + [sn_checkpointer],
                                           [*producers, checker], node.processes)
                inside, outside, overall = checkpoint_rows(mode, results[:-1], results[-1], rss,
                                                           CKPT_BATCH, s.size)
                # The raw figures, next to the node's log (kept with --keep or on failure).
                raw = {"intervals": results[-1].intervals,
                       "requests": [(t0, latency) for r in results[:-1]
                                    for t0, latency in zip(r.sends_s, r.latencies_s, strict=True)]}
                (node.node.log_file.parent / f"requests-{len(runs) + 1}.json").write_text(
                    json.dumps(raw))
                runs.append((inside, outside, overall, sum(r.late for r in results[:-1]),
                             sum(r.records for r in results[:-1]) // CKPT_BATCH))
            done = sum(r[0].checkpoints or 0 for r in runs)
            asked = 1 + done  # a fresh node: the first one above, then the timed ones
            node_figures = node_checkpoint_figures(node, asked)
        finally:
            node.stop()
        inside = median_row([r[0] for r in runs])
        outside = median_row([r[1] for r in runs])
        if inside.p99_ms is not None and outside.p99_ms:
            inside.p99_ratio = outside.p99_ratio = inside.p99_ms / outside.p99_ms
        overall = statistics.median(r[2] for r in runs)
        late = sum(r[3] for r in runs)
        requests = sum(r[4] for r in runs)
        extra = int(node_figures.get("checkpoints", 0)) - asked
        flush = ", ".join(f"{k} {v} ms" for k, v in node_figures["last_flush_ms"].items())
        note = (f"{overall:,.0f} msgs/s overall, target {rate:,.0f} ({CKPT_LOAD:.0%} of "
                f"{capacity:,.0f} msgs/s batched capacity, {how}); {s.producers} paced "
                f"producers, batches of {CKPT_BATCH} x {s.size} B, {seconds:g} s a run; "
                f"{late:,} of {requests:,} sends over {CKPT_LATE_S * 1000:g} ms late; "
                f"checkpoints {CKPT_GAP_S:g} s apart; node's own figures: last checkpoint "
                f"{node_figures.get('last_checkpoint_ms')} ms, last flush {flush}, "
                f"{node_figures.get('checkpoints_abandoned', 0)} abandoned")
        if extra:  # > 0: automatic ones fired; < 0: the log manager restarted (count reset)
            note += f"; the node counts {extra:+d} checkpoints beyond the {asked} asked for"
        for row in (inside, outside):
            row.note = note
        rows += [inside, outside]
    return rows
