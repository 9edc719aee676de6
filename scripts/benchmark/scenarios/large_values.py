"""large-values (issue 14): values of 1 MiB and 10 MiB written and read back through a real
node that keeps them in chunks (``[storage] large_values = "chunks"``) against one that
leaves them to RocksDB's blob files (``"blob_files"``). Run only when named.

Each (way, size) is a fresh node on a data directory of its own, and each run of it:

- ingest: one client writes ``LARGE_TOTAL_BYTES`` of values of the size (one value a
  request, one request at a time) to a fresh topic of one partition, and the time runs until
  a read by key of the last value answers: reads by key go to the shard writer, which holds
  them until it has applied what was acknowledged, so the time covers the writer's RocksDB
  writes too, not only the log's fsyncs;
- the node is stopped cleanly (the shards flushed), the SST and blob files under its shards
  counted (the topic's only: each run deletes its topic at its end), and started again, so
  that its cache is empty;
- read: the client reads the partition back from offset 0 (every read from the shard
  writer; a read answers at most ``read_bytes_max``, so one 10 MiB value a read), and
  checks each value's length.

The writer processes' RSS (all of them together; the node has two), and the whole node's,
are sampled throughout both. Values are random bytes (RocksDB's compression gains nothing on them), each made
distinct by its first 8 bytes.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import psutil

from node.client import NodeClient

from ..bench import Bench, Runs
from ..measure import Row, RssSampler
from ..peers.base import Server
from ..peers.node import NodeServer
from ..settings import (
    LARGE_QUICK_BYTES,
    LARGE_SIZES,
    LARGE_TOTAL_BYTES,
    LARGE_VALUES,
    LARGE_WAYS,
    MB,
    MIB,
    SHARDNODE,
)

TIMEOUT_MS = 120_000  # one request of a 10 MiB value, on a busy machine


def large_values(b: Bench, server: Server) -> list[Runs]:
    """One ``Runs`` per (way, size); only the node runs this scenario."""
    return [_runs(b, way, size) for size in LARGE_SIZES for way in LARGE_WAYS]


def _runs(b: Bench, way: str, size: int) -> Runs:
    total = LARGE_QUICK_BYTES if b.s.quick else LARGE_TOTAL_BYTES
    count = max(2, total // size)
    work = b.work / f"{SHARDNODE}-{b.name(f'large-{way}-{size // MIB}mib')}"
    work.mkdir(parents=True, exist_ok=True)
    config = work / "node.toml"
    config.write_text(f'[storage]\nlarge_values = "{way}"\n')
    node = NodeServer(work, config)
    base = os.urandom(size)

    def value(i: int) -> bytes:
        return struct.pack(">Q", i) + base[8:]

    def run() -> Row:
        if node.node.proc is None:
            node.start()
            b.after_scenario(f"stopping the large-values node ({way}, {size} bytes)", node.stop)
        topic = b.name(LARGE_VALUES)
        with NodeClient(node.target, timeout_ms=TIMEOUT_MS) as c:
            c.create_topic(topic, 1)
            with RssSampler(writers(node)) as ingest_rss, \
                    RssSampler(node.processes) as node_ingest_rss:
                t0 = time.monotonic()
                for i in range(count):
                    c.produce(topic, value(i), key=b"k%d" % i, partition=0)
                last = c.read_by_key(topic, b"k%d" % (count - 1), partition=0)
                ingest_s = time.monotonic() - t0
            assert last is not None and last.value == value(count - 1)
        node.stop()
        sst, blob = files_bytes(node.node.data_dir / "shards", ".sst"), \
            files_bytes(node.node.data_dir / "shards", ".blob")
        node.start()
        with NodeClient(node.target, timeout_ms=TIMEOUT_MS) as c, \
                RssSampler(writers(node)) as read_rss, RssSampler(node.processes) as node_read_rss:
            t0 = time.monotonic()
            offset = 0
            while offset < count:
                got = c.read(topic, 0, offset, max_records=count)
                assert got, f"no record at offset {offset}"
                for r in got:
                    assert len(r.value) == size and r.value[:8] == struct.pack(">Q", r.offset)
                offset += len(got)
            read_s = time.monotonic() - t0
            c.delete_topic(topic)  # the next run's files are its own
        written = count * size
        node_rss = max(node_ingest_rss.max_mb or 0.0, node_read_rss.max_mb or 0.0)
        row = Row(LARGE_VALUES, SHARDNODE, count / ingest_s, written / MB / ingest_s, None,
                  None, node_rss, count, ingest_s,
                  note=f"{way}, {count} values of {size // MIB} MiB ({written / MB:.0f} MB): "
                       f"ingest {ingest_s:.2f} s, read {read_s:.2f} s; "
                       f"SST {sst / MB:.0f} MB, blob files {blob / MB:.0f} MB; "
                       f"node RSS {node_rss:.0f} MB")
        row.way, row.value_bytes = way, size
        row.read_mb_per_s = written / MB / read_s
        row.sst_mb, row.blob_mb = sst / MB, blob / MB
        row.writer_rss_mb = max(ingest_rss.max_mb or 0.0, read_rss.max_mb or 0.0)
        return row

    return Runs(run, label=f"{way}, {size // MIB} MiB values")


def writers(node: NodeServer) -> Callable[[], list[psutil.Process]]:
    """The node's shard writer processes, as the node names them (asked once)."""
    with node.node.client(timeout_ms=5000) as c:
        pids = [a["pid"] for a in c.status()["actors"] if a["role"].startswith("writer-")]
    procs = []
    for pid in pids:
        with suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    return lambda: procs


def files_bytes(path: Path, suffix: str) -> int:
    total = 0
    for f in path.rglob(f"*{suffix}"):
        with suppress(FileNotFoundError):
            total += f.stat().st_size
    return total
