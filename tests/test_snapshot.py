"""Snapshot exports: ``snapshot_export`` on a node that keeps serving, and a new node started
from it (``shardnode start --from-snapshot``), with real processes and RocksDB on tmp_path;
the export's coordinator (``actors/snapshot.py``) without processes; bad inputs."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from actors.instructions import AskShards, CopyLog, Send
from actors.snapshot import ExportPhase, SnapshotCoordinator
from actors.snapshot_files import (
    MANIFEST,
    RELEASE_SHARDS_SUFFIX,
    RELEASE_SUFFIX,
    ExportRefused,
    export_segments,
    start_from_export,
)
from actors.wal import segment_name
from node import cli
from node.client import NodeClient
from node.local import LocalNode, free_port
from wire.errors import BadRequest, Busy, ErrorCode
from wire.messages import ErrorReply, Exported
from wire.records import pack_batch
from wire.xid import Xid

if TYPE_CHECKING:
    from tests.conftest import MakeNode

# Small segments and checkpoints, so that an export spans several segments and checkpoints
# run (and must not delete what the export copies) while it is taken.
SMALL_LOG = """
[log]
segment_bytes_max = 65536
group_bytes_max = 65536
checkpoint_bytes = 131072
checkpoint_timeout_ms = 10000

[limits]
frame_bytes_max = 65536
value_bytes_max = 16384
"""
PARTITIONS = 3
PRODUCERS = 2
AFTER_EXPORT = 30  # requests each producer sends once the export is answered
REQUESTS_MAX = 5000  # and at most this many in all, each
VALUE_BYTES = 1000  # so that the log rolls and checkpoints run during the test


def until(what: str, cond: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # ok-sleep: poll interval, under a deadline


class Producer(threading.Thread):
    """Produces one record a request, each with a value of its own, to the partitions in
    turn, and records every acknowledgement: (LSN, partition, offset) by value."""

    def __init__(self, endpoint: str, name: str, export_done: threading.Event) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.tag, self.export_done = endpoint, name, export_done
        self.acked: dict[bytes, tuple[int, int, int]] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with NodeClient(self.endpoint, timeout_ms=30_000) as c:
                after = 0
                for i in range(REQUESTS_MAX):
                    if self.export_done.is_set():
                        after += 1
                        if after > AFTER_EXPORT:
                            return
                    value = f"{self.tag}-{i}-".encode().ljust(VALUE_BYTES, b".")
                    reply = c.call("produce", topic="t", producer_id=c.producer_id, seq=i,
                                   records=pack_batch([value]), partition=i % PARTITIONS)
                    (partition, first, _count), = reply["parts"]
                    self.acked[value] = (reply["lsn"], partition, first)
        except BaseException as exc:  # reported by the test
            self.error = exc


def read_all(c: NodeClient, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    for p in range(partitions):
        rows: list[tuple[int, bytes]] = []
        while True:
            got = c.read(topic, p, len(rows), max_records=1000)
            if not got:
                break
            rows += [(r.offset or 0, r.value) for r in got]
        out[p] = rows
    return out


def test_an_export_taken_under_load_holds_exactly_the_records_durable_at_its_lsn(
        make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node(SMALL_LOG)
    xid = Xid(3, b"in-doubt", b"b1")
    dedup = NodeClient(node.endpoint, timeout_ms=30_000)
    with node.client(timeout_ms=60_000) as c:
        c.create_topic("t", partitions=PARTITIONS)
        c.create_topic("other", partitions=1)
        before = {s: dedup.produce_batch("other", [f"d{s}".encode()]) for s in range(5)}
        c.commit_offset("readers", "other", 0, 3)
        c.kv_put("settings", b"mode", b"fast")  # a KV namespace: its own shard
        c.kv_put("settings", b"gone", b"x")
        c.kv_delete("settings", b"gone")
        branch = c.xa_start(xid)
        branch.produce_batch("other", [b"x1", b"x2"], partition=0)
        c.xa_end(xid)
        c.xa_prepare(xid)
        # An export copies the shards as the writers have applied them (the log after):
        # wait for the writers to have made every shard, so that the count below is exact
        # (under load, niced, they can be seconds behind the acknowledgements).
        until("the writers to make every shard",
              lambda: len(list((node.data_dir / "shards").iterdir())) == PARTITIONS + 2)

        done = threading.Event()
        producers = [Producer(node.endpoint, f"p{n}", done) for n in range(PRODUCERS)]
        for p in producers:
            p.start()
        until("the producers to write", lambda: all(len(p.acked) > 50 for p in producers))
        snap = tmp_path / "snap"
        exported = c.snapshot_export(str(snap))
        done.set()
        for p in producers:
            p.join(60)
            assert not p.is_alive() and p.error is None, p.error
        lsn = exported["lsn"]
        assert exported["shards"] == PARTITIONS + 2 and exported["bytes"] > 0
        acked = {v: a for p in producers for v, a in p.acked.items()}
        inside = {v: (part, off) for v, (a_lsn, part, off) in acked.items() if a_lsn <= lsn}
        outside = {v for v, (a_lsn, _p, _o) in acked.items() if a_lsn > lsn}
        assert inside and outside, "the export must fall while the producers write"
        # The node goes on serving after the export.
        assert c.produce("t", b"later", partition=0)[1] > 0
        manifest = json.loads((snap / MANIFEST).read_text())
        assert manifest["lsn"] == lsn and len(manifest["shards"]) == PARTITIONS + 2
        until("the log manager's figures", lambda: c.status()["log"]["exports"] == 1)

    # Started with three shard writers where the exporting node had two: shards change
    # writers, and each writer replays the copied log from the start.
    three = tmp_path / "three-writers.toml"
    three.write_text("[node]\nwriters = 3\n")
    new = LocalNode(tmp_path / "new", log_file=tmp_path / "new.log", config=three,
                    extra_args=["--from-snapshot", str(snap)]).start()
    try:
        with new.client(timeout_ms=30_000) as c:
            assert sorted(t.name for t in c.list_topics()) == ["other", "t"]
            found = read_all(c, "t", PARTITIONS)
            values = [v for rows in found.values() for _o, v in rows]
            assert len(values) == len(set(values)), "a record twice"
            for part, rows in found.items():  # offsets contiguous from 0, as acknowledged
                assert [o for o, _v in rows] == list(range(len(rows)))
                assert {v: (part, o) for o, v in rows} == {
                    v: a for v, a in inside.items() if a[0] == part}
            assert not outside & set(values)
            # The other topic: its records, the group's offset, the branch in doubt.
            assert [v for _o, v in read_all(c, "other", 1)[0]] == [
                f"d{s}".encode() for s in range(5)]
            assert c.committed_offset("readers", "other", 0) == 3
            assert c.kv_namespaces() == ["settings"]
            assert c.kv_scan("settings") == [(b"mode", b"fast")]
            assert c.xa_recover() == [xid]
            # A retry of a sequence number acknowledged before the export is answered with
            # its first offsets and written once.
            retry = NodeClient(new.endpoint, producer_id=dedup.producer_id, timeout_ms=30_000)
            with retry:
                assert retry.produce_batch("other", [b"d2"], seq=2) == before[2]
            assert c.end_offsets("other") == [5]
            committed = c.xa_commit(xid)
            assert [(t, p, n) for t, p, _f, n in committed.parts] == [("other", 0, 2)]
            assert [v for _o, v in read_all(c, "other", 1)[0]][5:] == [b"x1", b"x2"]
            c.produce("t", b"on the new node", partition=1)  # it serves writes too
    finally:
        new.stop()
        dedup.close()


def test_bad_exports_and_snapshots_are_refused_with_clear_errors(
        make_node: MakeNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = make_node()
    with node.client(timeout_ms=60_000) as c:
        c.create_topic("t", partitions=2)
        c.produce_batch("t", [b"a", b"b"], partition=0)
        with pytest.raises(BadRequest, match="absolute"):
            c.snapshot_export("relative/dir")
        full = tmp_path / "full"
        full.mkdir()
        (full / "something").write_text("x")
        with pytest.raises(BadRequest, match="not empty"):
            c.snapshot_export(str(full))
        with pytest.raises(BadRequest, match="outside the node's data dir"):
            c.snapshot_export(str(node.data_dir / "inside"))
        until("the log manager's figures",
              lambda: c.status()["log"]["exports_failed"] == 2)  # the relative one: at the door
        assert c.read("t", 0, 0)  # the node serves on

    # The CLI: a table with the LSN; then the export is whole.
    snap = tmp_path / "snap"
    assert cli.main(["snapshot", "export", str(snap), "--port", str(node.port)]) == 0
    out = capsys.readouterr().out
    assert "snapshot exported" in out and "--from-snapshot" in out
    assert start_from_export(snap, tmp_path / "fresh")["lsn"] > 0
    # SST files are hard-linked (one file system here), everything else copied.
    ssts = list((tmp_path / "fresh" / "shards").rglob("*.sst"))
    fresh = tmp_path / "fresh"
    assert ssts and all(p.stat().st_ino == (snap / p.relative_to(fresh)).stat().st_ino
                        for p in ssts)
    slot = Path("log", "checkpoint-0.snap")  # overwritten in place by the new node
    assert (fresh / slot).read_bytes() == (snap / slot).read_bytes()
    assert (fresh / slot).stat().st_ino != (snap / slot).stat().st_ino

    def refused(src: Path, data: Path, match: str) -> None:
        with pytest.raises(ExportRefused, match=match):
            start_from_export(src, data)
        code = cli.main(["start", "--data-dir", str(data), "--from-snapshot", str(src),
                         "--port", str(free_port())])  # a free one: `start` checks it first
        assert code == 2
        assert match.split()[0] in capsys.readouterr().err

    refused(snap, tmp_path / "fresh", "exists and is not empty")  # the data dir filled above
    # Started on the export itself, the node wrote into it (a lock, its log, its snapshots).
    before = sorted(p.relative_to(snap) for p in snap.rglob("*"))
    assert cli.main(["start", "--data-dir", str(snap), "--port", str(free_port())]) == 2
    assert "is a snapshot export" in capsys.readouterr().err
    assert sorted(p.relative_to(snap) for p in snap.rglob("*")) == before
    refused(tmp_path / "nowhere", tmp_path / "d1", "does not exist")
    partial = tmp_path / "partial"
    shutil.copytree(snap, partial)
    (partial / MANIFEST).unlink()
    refused(partial, tmp_path / "d2", "has no MANIFEST.json")
    damaged = tmp_path / "damaged"
    shutil.copytree(snap, damaged)
    shutil.rmtree(next((damaged / "shards").iterdir()))
    refused(damaged, tmp_path / "d3", "incomplete")
    newer = tmp_path / "newer"
    shutil.copytree(snap, newer)
    manifest = json.loads((newer / MANIFEST).read_text())
    manifest["format"] = 99
    (newer / MANIFEST).write_text(json.dumps(manifest))
    refused(newer, tmp_path / "d4", "newer")
    assert not any(p.exists() for p in (tmp_path / f"d{n}" for n in range(1, 5)))


def test_one_export_at_a_time_and_checkpoints_keep_the_segments_it_copies(
        make_node: MakeNode, tmp_path: Path) -> None:
    """Two test seams hold the export: ``export.hold_shards`` the writers' answers (their
    checkpoints taken), so that records are written after the shards' LSN and before the
    export's; then ``export.hold_copy`` the log manager's copy. Meanwhile a second export
    is answered BUSY, and a checkpoint past the export's LSN, which would delete every
    segment the export copies, deletes none."""
    node = make_node(SMALL_LOG, env={"SHARDNODE_FAULTS": "export.hold_shards,export.hold_copy"})
    first = tmp_path / "first"
    value = b"v" * VALUE_BYTES
    with node.client(timeout_ms=60_000) as c:
        c.create_topic("t", partitions=2)
        before = [c.produce("t", value, partition=n % 2) for n in range(100)]
        result: dict[str, int] = {}
        failure: list[BaseException] = []

        def export() -> None:
            try:
                with node.client(timeout_ms=60_000) as own:
                    result.update(own.snapshot_export(str(first)))
            except BaseException as exc:  # reported below
                failure.append(exc)

        taking = threading.Thread(target=export, daemon=True)
        taking.start()
        until("the writers' checkpoints", lambda: len(list((first / "shards").glob("*"))) == 2)
        # Acknowledged after the shards' checkpoints, before the export's LSN: from the log.
        during = [c.produce("t", value, partition=n % 2) for n in range(150)]
        first.with_name(first.name + RELEASE_SHARDS_SUFFIX).touch()
        until("the export to reach its copy",
              lambda: c.status()["log"]["export_phase"] == "copying")
        with pytest.raises(Busy, match="one runs at a time"):
            c.snapshot_export(str(tmp_path / "second"))
        after = [c.produce("t", value, partition=n % 2) for n in range(150)]
        c.checkpoint()  # every shard durable past the export's LSN: it could delete them all
        first.with_name(first.name + RELEASE_SUFFIX).touch()
        taking.join(60)
        assert not taking.is_alive() and not failure, failure
        assert not (tmp_path / "second").exists()
        assert result["shards"] == 2
        copied = sorted(p.name for p in (first / "log").glob("*.log"))
        assert len(copied) > 2, "the export must copy segments for the test to mean anything"

    new = LocalNode(tmp_path / "new", log_file=tmp_path / "new.log",
                    extra_args=["--from-snapshot", str(first)]).start()
    try:
        with new.client(timeout_ms=30_000) as c:
            found = read_all(c, "t", 2)
            held = {(p, o) for p, rows in found.items() for o, _v in rows}
            assert sorted(held) == sorted(before + during) and not held & set(after)
            assert c.produce("t", b"next", partition=0) == (0, len(found[0]))
    finally:
        new.stop()


# ---- the coordinator, without processes ------------------------------------------------


def test_the_coordinator_waits_for_every_writer_and_takes_the_lowest_lsn() -> None:
    co = SnapshotCoordinator(("writer-0", "writer-1"), timeout_s=10)
    assert co.start(7, "/snap", now=0.0) == [AskShards(1, "/snap")]
    assert co.pins_log
    busy, = co.start(8, "/other", now=1.0)
    assert isinstance(busy, Send) and isinstance(busy.msg, ErrorReply)
    assert busy.msg.corr == 8 and busy.msg.code == ErrorCode.BUSY and "/snap" in busy.msg.text
    assert co.checkpointed(1, "writer-1", 40, 2, 100, "") == []
    assert co.checkpointed(0, "writer-0", 99, 1, 1, "") == []  # another export's: ignored
    assert co.checkpointed(1, "writer-0", 35, 1, 50, "") == [CopyLog(1, "/snap", 35, 10.0)]
    assert co.phase is ExportPhase.COPYING and co.tick(now=11.0) == []  # the copy times out
    done, = co.copied(1, lsn=42, size=30, now=2.5)
    assert isinstance(done, Send)
    assert done.msg == Exported(7, 42, 3, 180, 2500)
    assert not co.pins_log and (co.done, co.failed) == (1, 0)


def test_an_export_fails_on_a_writer_error_or_a_timeout_and_the_next_one_runs() -> None:
    co = SnapshotCoordinator(("writer-0",), timeout_s=10)
    co.start(1, "/a", now=0.0)
    failed, = co.checkpointed(1, "writer-0", 0, 0, 0, "disk full")
    assert isinstance(failed, Send) and isinstance(failed.msg, ErrorReply)
    assert failed.msg.code == ErrorCode.INTERNAL and "disk full" in failed.msg.text
    assert "partial" in failed.msg.text and not co.pins_log
    co.start(2, "/b", now=100.0)
    assert co.tick(now=105.0) == []
    timed_out, = co.tick(now=110.5)
    assert isinstance(timed_out, Send) and isinstance(timed_out.msg, ErrorReply)
    assert timed_out.msg.code == ErrorCode.TIMEOUT and "writer-0" in timed_out.msg.text
    assert co.checkpointed(2, "writer-0", 5, 1, 1, "") == []  # too late: ignored
    co.start(3, "/c", now=200.0)
    refused, = co.failed_to_start(3, ErrorCode.BAD_REQUEST, "not empty")
    assert isinstance(refused, Send) and isinstance(refused.msg, ErrorReply)
    assert refused.msg.code == ErrorCode.BAD_REQUEST and "partial" not in refused.msg.text
    assert (co.done, co.failed) == (0, 3) and not co.pins_log


def test_an_export_copies_the_segments_holding_lsns_after_the_lowest_shard(
        tmp_path: Path) -> None:
    for first in (1, 100, 200, 301):
        (tmp_path / segment_name(first)).write_bytes(b"")
    live = tmp_path / segment_name(301)  # rolled past L = 300
    names = [p.name for p in export_segments(tmp_path, 150, 300, live)]
    assert names == [segment_name(100), segment_name(200)]
    assert [p.name for p in export_segments(tmp_path, 199, 300, live)] == [segment_name(200)]
    assert export_segments(tmp_path, 300, 300, live) == []  # every shard has it all
