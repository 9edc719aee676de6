"""A node started on damaged data: it recovers with every acknowledged record exactly once,
or refuses to start naming the damaged file."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from actors import wal
from node.local import LocalNode, NodeFailed
from node.supervisor import run_dir_for
from tests.test_crash import wait_until
from wire.errors import NodeError

if TYPE_CHECKING:
    from tests.conftest import MakeNode

SMALL_SEGMENTS = """
[limits]
frame_bytes_max = 262144
value_bytes_max = 65536
[log]
segment_bytes_max = 262144
group_bytes_max = 262144
"""


def fill(node: LocalNode, n: int = 300, partitions: int = 2) -> list[list[bytes]]:
    """``n`` records of 1 kB per partition of topic ``t``; the values, by partition."""
    values = [[f"p{p}-{i}-".encode() + b"x" * 1000 for i in range(n)] for p in range(partitions)]
    with node.client() as c:
        c.create_topic("t", partitions=partitions)
        for p, vals in enumerate(values):
            for i in range(0, n, 50):
                c.produce_batch("t", vals[i:i + 50], partition=p)
    return values


def read_all(node: LocalNode, partition: int) -> list[bytes]:
    """Every record of ``t``/``partition`` up to its end offset, read in order."""
    out: list[bytes] = []
    with node.client() as c:
        end = c.end_offsets("t")[partition]
        while len(out) < end:
            recs = c.read("t", partition, len(out))
            if not recs:
                break
            out.extend(r.value for r in recs)
    return out


def start_or_refusal(data_dir: Path, log_file: Path) -> tuple[LocalNode | None, str]:
    """Start a node on ``data_dir``: the running node, or None and its log if it failed."""
    n = LocalNode(data_dir, log_file=log_file)
    try:
        n.start(timeout_s=60)
    except NodeFailed:
        assert n.proc is not None
        n.proc.wait(30)
        return None, log_file.read_text()
    return n, ""


def refusal(data_dir: Path, log_file: Path, what: str) -> tuple[str, str]:
    """The one line a node started on ``data_dir`` refuses to start with, and its whole
    log; the test fails if it started (``what``: on what)."""
    n, text = start_or_refusal(data_dir, log_file)
    if n is not None:
        n.stop()
        pytest.fail(f"started {what}")
    (line,) = [ln for ln in text.splitlines() if "refuses to start" in ln]
    return line, text


def shard_dir(data_dir: Path, name: str) -> Path:
    path = data_dir / "shards" / name
    assert path.is_dir(), sorted(p.name for p in (data_dir / "shards").iterdir())
    return path


# ---- good behaviour ---------------------------------------------------------------------


def test_a_stale_lock_leftover_sockets_and_a_garbage_clean_stop_marker_are_harmless(
        make_node: MakeNode) -> None:
    node = make_node()
    values = fill(node, n=50)
    node.kill()
    (node.data_dir / "LOCK").write_text("999999\n")  # a pid that holds no lock
    (node.data_dir / "writers" / "clean-stop").write_bytes(b"\x00garbage\xff")
    # Under the data dir, or in the temporary dir when that path is too long for ipc.
    run_dir = run_dir_for(node.data_dir.resolve())
    assert any(run_dir.glob("*.sock")), f"a kill leaves the sockets behind in {run_dir}"
    node2 = make_node(data_dir=node.data_dir)
    assert [read_all(node2, p) for p in range(2)] == values


def test_a_deleted_middle_segment_refuses_to_start_naming_the_gap(make_node: MakeNode,
                                                                   tmp_path: Path) -> None:
    node = make_node(SMALL_SEGMENTS)
    fill(node)
    node.kill()  # the records stay in the segments
    segs = wal.list_segments(node.data_dir / "log")
    assert len(segs) >= 3, segs
    gone = segs[1][1]
    gone.unlink()
    line, text = refusal(node.data_dir, tmp_path / "refused.log", "with a segment missing")
    assert f"log segment {segs[2][1]} is corrupt at byte" in line
    assert f"follows {segs[1][0] - 1}: records are missing" in line
    assert text.count("refuses to start") == 1


def test_a_log_whose_snapshots_were_deleted_says_records_are_missing_not_a_segment_is_corrupt(
        make_node: MakeNode, tmp_path: Path) -> None:
    """After a clean stop the log is a snapshot and a segment of just its header: with the
    snapshots deleted, the refusal called that segment corrupt at byte 0 and advised moving
    it aside (which started the node on no log at all)."""
    node = make_node()
    fill(node, n=50)
    node.stop()
    log_dir = node.data_dir / "log"
    for snap in log_dir.glob("*.snap"):
        snap.unlink()
    (first, segment), = wal.list_segments(log_dir)
    line, _text = refusal(node.data_dir, tmp_path / "after.log", "without its snapshots")
    assert (f"the log's first segment {segment} starts at LSN {first}, and there is no "
            f"snapshot") in line, line
    assert "move it aside" not in line


# ---- damage ----------------------------------------------------------------------------


def test_a_corrupt_sst_is_an_error_not_missing_records(make_node: MakeNode,
                                                      tmp_path: Path) -> None:
    node = make_node()
    values = fill(node)
    node.stop()  # the shards are flushed to SSTs
    ssts = sorted(shard_dir(node.data_dir, "t1-p0").glob("*.sst"), key=lambda p: p.stat().st_size)
    data = bytearray(ssts[-1].read_bytes())
    at = len(data) // 3
    data[at:at + 256] = b"\xa5" * 256
    ssts[-1].write_bytes(bytes(data))
    n, _text = start_or_refusal(node.data_dir, tmp_path / "after.log")
    if n is None:
        return  # refusing is acceptable
    try:
        try:
            got = read_all(n, 0)
        except NodeError as exc:  # an error naming the damage (reads stopped short, silently)
            assert "t1-p0 is damaged" in str(exc), exc
            return
        assert got == values[0], f"{len(values[0]) - len(got)} records silently missing"
    finally:
        n.stop()


def test_a_deleted_shard_dir_refuses_to_start_naming_it(make_node: MakeNode,
                                                        tmp_path: Path) -> None:
    """Started without it, the node took writes for the partition, acknowledged them, and
    its writer dropped them ('no shard here; skipped')."""
    node = make_node()
    fill(node, n=50)
    node.stop()
    gone = shard_dir(node.data_dir, "t1-p0")
    shutil.rmtree(gone)
    line, text = refusal(node.data_dir, tmp_path / "after.log",
                         "without a shard its writer made")
    assert f"shard(s) missing: {gone}." in line, line
    assert "Traceback" not in text, text[-1500:]


@pytest.mark.parametrize("how", ["deleted", "moved aside"])
def test_a_log_gone_with_shards_that_applied_it_refuses_to_start(
        make_node: MakeNode, tmp_path: Path, how: str) -> None:
    """The log's files deleted, or its snapshots deleted and then its segment moved aside
    (as a refusal naming that segment advised): started anyway, the node began its LSNs
    again at 1, a topic made again reused an old shard, and its acknowledged records were
    taken as applied already, and lost."""
    node = make_node()
    fill(node, n=50)
    node.stop()
    log_dir = node.data_dir / "log"
    if how == "deleted":
        shutil.rmtree(log_dir)
    else:
        for snap in log_dir.glob("*.snap"):
            snap.unlink()
        aside = tmp_path / "aside"
        aside.mkdir()
        for _first, path in wal.list_segments(log_dir):
            path.rename(aside / path.name)
    n, text = start_or_refusal(node.data_dir, tmp_path / "after.log")
    if n is not None:
        n.stop()
        pytest.fail("started without its log")
    lines = [ln for ln in text.splitlines() if "refuses to start" in ln]
    assert lines and all(f"the log in {log_dir} ends at LSN 0, but this writer's shards have "
                         f"applied it to LSN" in ln for ln in lines), lines
    assert "Traceback" not in text, text[-1500:]


def test_a_topic_deleted_by_a_writer_killed_before_it_saved_the_change_starts(
        make_node: MakeNode) -> None:
    """The kill lands after the shard's directory is gone and before the writer's shards
    file says so: the delete, replayed from the log, takes it off the list."""
    node = make_node()
    fill(node, n=5)
    with node.client() as c:
        c.create_topic("u", partitions=2)
        c.produce("u", b"kept", partition=1)
    node.stop()
    writers = node.data_dir / "writers"
    before = {f: f.read_bytes() for f in writers.glob("*")}
    node2 = make_node(data_dir=node.data_dir)
    with node2.client() as c:
        c.delete_topic("t")
    wait_until("the writers to apply the delete",
               lambda: not list((node2.data_dir / "shards").glob("t1-p*")))
    node2.kill()
    for f, data in before.items():  # as the writers' files were before the delete
        f.write_bytes(data)
    node3 = make_node(data_dir=node.data_dir)
    with node3.client() as c:
        assert [r.value for r in c.read("u", 1, 0)] == [b"kept"]
        assert "t" not in [t.name for t in c.list_topics()]


def test_a_corrupt_snapshot_the_log_needs_is_named_as_one_without_advice_to_move_it_aside(
        make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node(SMALL_SEGMENTS)
    fill(node)
    node.stop()  # a clean stop checkpoints: the segments before it are deleted
    first_lsn = wal.list_segments(node.data_dir / "log")[0][0]
    assert first_lsn > 1, "the log was not truncated: it does not need the snapshot"
    log_dir = node.data_dir / "log"
    _snap, slot = wal.load_snapshot(log_dir)
    assert slot is not None
    path = log_dir / wal.SNAPSHOT_SLOTS[slot]
    data = bytearray(path.read_bytes())
    data[10:42] = b"\xa5" * 32
    path.write_bytes(bytes(data))
    line, _text = refusal(node.data_dir, tmp_path / "refused.log", "on a corrupt snapshot")
    assert f"snapshot {path} is corrupt" in line, line
    assert f"segments start at LSN {first_lsn}" in line, line
    assert f"log segment {path}" not in line, line
    assert "valid records follow" not in line, line
    assert "move it aside" not in line, line


def test_a_first_snapshot_cut_short_by_a_kill_is_rebuilt_from_the_log(
        make_node: MakeNode) -> None:
    """A kill between the first snapshot file's creation and its fdatasync leaves it
    empty; nothing was truncated yet, so the node starts from the segments."""
    node = make_node()
    values = fill(node, n=20)
    node.kill()
    log_dir = node.data_dir / "log"
    assert wal.list_segments(log_dir)[0][0] == 1
    for name in wal.SNAPSHOT_SLOTS:  # as before the first checkpoint, if one ran
        (log_dir / name).unlink(missing_ok=True)
    (log_dir / wal.SNAPSHOT_SLOTS[0]).write_bytes(b"")
    node2 = make_node(data_dir=node.data_dir)
    assert [read_all(node2, p) for p in range(2)] == values
    node2.stop()  # its checkpoint writes the snapshot again
    assert wal.load_snapshot(log_dir)[0] is not None


def test_a_shard_with_a_corrupt_current_file_refuses_to_start_naming_it(
        make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node()
    fill(node, n=20)
    node.stop()
    shard = shard_dir(node.data_dir, "t1-p0")
    (shard / "CURRENT").write_bytes(b"garbage\n")
    line, text = refusal(node.data_dir, tmp_path / "refused.log",
                         "on a shard with a corrupt CURRENT")
    assert "Traceback" not in text, text[-1500:]
    assert str(shard) in line, line


def test_a_log_file_that_cannot_be_read_refuses_to_start_naming_the_error(
        make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node()
    fill(node, n=5)
    node.stop()
    log_dir = node.data_dir / "log"
    last = wal.list_segments(log_dir)[-1][0]
    (log_dir / wal.segment_name(last + 1_000_000)).mkdir()  # read as a segment: EISDIR
    line, text = refusal(node.data_dir, tmp_path / "refused.log", "on a log it could not read")
    assert f"recovering the log in {log_dir} failed: [Errno 21] Is a directory" in line, line
    assert "Traceback" not in text, text[-1500:]
