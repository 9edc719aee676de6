"""Unit tests of one shard in RocksDB (``actors.shard_store.ShardStore``), on ``tmp_path``.

Randomised tests print their seed; ``SHARDNODE_SEED=<seed>`` replays one.
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from actors import faults
from actors.shard_options import StoreMemory
from actors.shard_store import (
    BATCH_BYTES_MAX,
    CFS,
    FORMAT_VERSION,
    LEVELS,
    RUN_BYTES_MAX,
    RUN_HEAD,
    RUN_RECORDS_MAX,
    U64,
    OutOfRange,
    ShardStore,
    StoreFormatError,
    shard_dir,
)
from config import load_config
from wire.packer import pack
from wire.records import Record, pack_batch

TS = 1_700_000_000_000


class Model:
    """What the shard should hold, computed from the batches given to it."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []

    def add(self, records: Sequence[Record | bytes], batch_ts: int) -> None:
        for r in records:
            off = len(self.rows)
            if isinstance(r, bytes):
                self.rows.append([off, batch_ts, None, [], r])
            else:
                ts = batch_ts if r.timestamp is None else r.timestamp
                self.rows.append([off, ts, r.key, list(r.tags), r.value])

    def by_key(self, key: bytes) -> list[list[Any]]:
        hits = [row for row in self.rows if row[2] == key]
        return hits[-1:]

    def by_tag(self, tag: str, offset: int, max_records: int) -> list[list[Any]]:
        return [row for row in self.rows if tag in row[3] and row[0] >= offset][:max_records]

    def offset_for(self, ts: int) -> int | None:
        return next((row[0] for row in self.rows if row[1] >= ts), None)


@functools.cache
def memory() -> StoreMemory:
    """One budget for every store of this module, as one writer process has: the defaults'."""
    cfg = load_config()
    return StoreMemory.of(cfg.shards, cfg.storage)


class Shard:
    """A store plus its model, fed batch by batch with increasing LSNs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = ShardStore(path, 1, 0, memory())
        self.model = Model()
        self.lsn = 0

    def produce(self, records: Sequence[Record | bytes], batch_ts: int = TS,
                finish: bool = True) -> int:
        self.lsn += 2  # LSNs of a shard need not be contiguous (other shards take some)
        first = len(self.model.rows)
        n = self.store.apply_produce(self.lsn, first, len(records), batch_ts, pack_batch(records))
        assert n == len(records)
        if finish:
            self.store.finish(self.lsn)
        self.model.add(records, batch_ts)
        return self.lsn

    def reopen(self) -> None:
        self.store.flush()
        self.store.close()
        self.store = ShardStore(self.path, 1, 0, memory())


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[Shard]:
    s = Shard(shard_dir(tmp_path, 1, 0))
    yield s
    s.store.close()


def _norm(rows: list[Any]) -> list[Any]:
    return [[o, ts, k, list(tags), v] for o, ts, k, tags, v in rows]


# ---- writing and reading ----------------------------------------------------------------------


def test_a_new_store_is_empty(shard: Shard) -> None:
    st = shard.store
    assert (st.applied_lsn, st.next_offset, st.max_ts) == (0, 0, -1)  # -1: nothing indexed yet
    assert st.read(0, 10) == []
    assert st.read_by_key(b"k") == []
    assert st.read_by_tag("t", 0, 10) == []
    assert st.offset_for_timestamp(0) is None
    assert st.committed_offset("g") is None


def test_apply_then_read(shard: Shard) -> None:
    shard.produce([b"a", Record(b"b", key=b"kb", tags=("x",), timestamp=TS - 1)], batch_ts=TS)
    lsn = shard.produce([Record(b"c", tags=("x", "y")), b"", Record(b"e", key=b"")],
                        batch_ts=TS + 10)
    st = shard.store
    assert st.applied_lsn == lsn
    assert st.next_offset == 5
    rows = shard.model.rows
    assert _norm(st.read(0, 100)) == rows
    for offset in range(6):
        for max_records in (1, 2, 100):
            assert _norm(st.read(offset, max_records)) == rows[offset:offset + max_records]


def test_values_of_every_size_round_trip(shard: Shard) -> None:
    values = [b"", b"\x00", bytes(range(256)), b"v" * 100_000]
    shard.produce(list(values))
    assert [row[4] for row in shard.store.read(0, 10)] == values


def test_read_by_key_returns_the_latest_record_with_the_key(shard: Shard) -> None:
    shard.produce([Record(b"1", key=b"a"), Record(b"2", key=b"b"), Record(b"3", key=b"a")])
    shard.produce([b"no-key", Record(b"4", key=b"b"), Record(b"5", key=b"c")])
    shard.produce([Record(b"6", key=b"a", tags=("t",))])
    st = shard.store
    for key in (b"a", b"b", b"c", b"missing", b""):
        assert _norm(st.read_by_key(key)) == shard.model.by_key(key), key
    assert st.read_by_key(b"a")[0][4] == b"6"


def test_read_by_tag_from_an_offset(shard: Shard) -> None:
    seed = int(os.environ.get("SHARDNODE_SEED", random.randrange(2**32)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    tags = ["red", "re", "redd", "blue", "ü-tag"]  # prefixes of each other must not mix
    for _ in range(6):
        shard.produce([Record(f"v{rng.random()}".encode(),
                              tags=tuple(rng.sample(tags, rng.randint(0, 3))))
                       for _ in range(rng.randint(1, 8))])
    st = shard.store
    n = len(shard.model.rows)
    for tag in [*tags, "missing"]:
        for offset in (0, 1, n // 2, n - 1, n):
            for max_records in (1, 3, 1000):
                assert _norm(st.read_by_tag(tag, offset, max_records)) == \
                    shard.model.by_tag(tag, offset, max_records), (tag, offset, max_records)


def test_offset_for_timestamp_with_out_of_order_timestamps(shard: Shard) -> None:
    seed = int(os.environ.get("SHARDNODE_SEED", random.randrange(2**32)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    for b in range(8):
        batch_ts = TS + 1000 * b
        shard.produce([Record(b"v", timestamp=None if rng.random() < 0.3
                              else batch_ts + rng.randint(-5000, 5000))
                       for _ in range(rng.randint(1, 6))], batch_ts=batch_ts)
    stamps = sorted({row[1] for row in shard.model.rows})
    queries = {0, 1, stamps[0] - 1, stamps[-1], stamps[-1] + 1, TS + 10**9}
    for ts in stamps:
        queries |= {ts - 1, ts, ts + 1}
    for q in sorted(queries):
        assert shard.store.offset_for_timestamp(q) == shard.model.offset_for(q), q


def test_offset_for_timestamp_spelled_out(shard: Shard) -> None:
    shard.produce([Record(b"a", timestamp=100), Record(b"b", timestamp=300),
                   Record(b"c", timestamp=200), Record(b"d", timestamp=400),
                   Record(b"e", timestamp=250)])
    st = shard.store
    assert st.offset_for_timestamp(50) == 0
    assert st.offset_for_timestamp(100) == 0
    assert st.offset_for_timestamp(150) == 1  # 300 at offset 1 is the first >= 150
    assert st.offset_for_timestamp(250) == 1
    assert st.offset_for_timestamp(301) == 3
    assert st.offset_for_timestamp(401) is None


def test_offset_for_timestamp_with_timestamp_zero(shard: Shard) -> None:
    # Timestamp 0 is a valid timestamp (wire.records accepts any non-negative int).
    shard.produce([Record(b"a", timestamp=0), Record(b"b", timestamp=0)])
    assert shard.store.offset_for_timestamp(0) == 0
    shard.produce([Record(b"c", timestamp=5)])
    assert shard.store.offset_for_timestamp(0) == 0
    assert shard.store.offset_for_timestamp(1) == 2


def test_committed_offsets(shard: Shard) -> None:
    shard.produce([b"a", b"b", b"c"])
    st = shard.store
    st.apply_offset_commit(10, "g1", 2)
    st.apply_offset_commit(10, "g2", 1)
    st.finish(10)
    assert (st.committed_offset("g1"), st.committed_offset("g2")) == (2, 1)
    st.apply_offset_commit(11, "g1", 3)
    st.finish(11)
    assert st.committed_offset("g1") == 3
    assert st.committed_offset("g3") is None
    assert st.committed_offset("g") is None  # a prefix of a group is another group
    assert st.applied_lsn == 11


# ---- idempotence and order --------------------------------------------------------------------


def test_reapplying_an_applied_lsn_changes_nothing(shard: Shard) -> None:
    first_lsn = shard.produce([Record(b"a", key=b"k", tags=("t",), timestamp=TS)])
    last_lsn = shard.produce([b"b", b"c"], batch_ts=TS + 5)
    st = shard.store
    st.apply_offset_commit(last_lsn + 1, "g", 1)
    st.finish(last_lsn + 1)
    before = (st.applied_lsn, st.next_offset, st.max_ts, st.read(0, 100),
              st.read_by_key(b"k"), st.read_by_tag("t", 0, 10), st.committed_offset("g"))
    # Replay after a crash: the same records again, as the log holds them.
    assert st.apply_produce(first_lsn, 0, 1, TS, pack_batch([Record(b"X", key=b"k",
                                                                     tags=("t",),
                                                                     timestamp=TS + 99)])) == 0
    assert st.apply_produce(last_lsn, 1, 2, TS + 5, pack_batch([b"Y", b"Z"])) == 0
    st.apply_offset_commit(last_lsn + 1, "g", 0)
    st.finish(last_lsn + 1)
    st.finish(last_lsn)
    after = (st.applied_lsn, st.next_offset, st.max_ts, st.read(0, 100),
             st.read_by_key(b"k"), st.read_by_tag("t", 0, 10), st.committed_offset("g"))
    assert after == before


def test_a_gap_in_offsets_raises_and_applies_nothing(shard: Shard) -> None:
    shard.produce([b"a", b"b"])
    st = shard.store
    for first in (3, 1, 0):
        with pytest.raises(RuntimeError, match=f"offset {first}"):
            st.apply_produce(shard.lsn + 1, first, 1, TS, pack_batch([b"x"]))
    assert st.next_offset == 2
    assert _norm(st.read(0, 10)) == shard.model.rows
    shard.produce([b"c"])  # the right offset still works
    assert _norm(st.read(0, 10)) == shard.model.rows


# ---- durability ---------------------------------------------------------------------------------


def test_reopen_after_flush_and_close_keeps_everything(shard: Shard) -> None:
    shard.produce([Record(b"a", key=b"k1", tags=("t",), timestamp=TS + 50),
                   Record(b"b", key=b"k2", timestamp=TS + 20)])
    shard.produce([b"c", Record(b"d", key=b"k1", tags=("t", "u"))], batch_ts=TS + 30)
    st = shard.store
    st.apply_offset_commit(shard.lsn + 1, "grp", 3)
    st.finish(shard.lsn + 1)
    want = (st.applied_lsn, st.next_offset, st.max_ts)
    assert want == (shard.lsn + 1, 4, TS + 50)
    shard.reopen()
    st = shard.store
    assert (st.applied_lsn, st.next_offset, st.max_ts) == want
    m = shard.model
    assert _norm(st.read(0, 100)) == m.rows
    assert _norm(st.read_by_key(b"k1")) == m.by_key(b"k1")
    assert _norm(st.read_by_tag("t", 1, 10)) == m.by_tag("t", 1, 10)
    assert st.offset_for_timestamp(TS + 25) == m.offset_for(TS + 25)
    assert st.committed_offset("grp") == 3
    # And it carries on where it left off, with the running max timestamp kept.
    shard.produce([Record(b"e", timestamp=TS + 40), Record(b"f", timestamp=TS + 60)])
    assert st.offset_for_timestamp(TS + 55) == m.offset_for(TS + 55) == 5


def test_an_unfinished_batch_is_not_applied(shard: Shard) -> None:
    shard.produce([b"a"])
    st = shard.store
    applied = st.applied_lsn
    st.apply_produce(shard.lsn + 1, 1, 1, TS, pack_batch([b"lost"]))  # no finish
    shard.reopen()
    st = shard.store
    assert (st.applied_lsn, st.next_offset) == (applied, 1)
    assert [row[4] for row in st.read(0, 10)] == [b"a"]


def test_a_store_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    path = shard_dir(tmp_path, 3, 1)
    st = ShardStore(path, 3, 1, memory())
    st.apply_produce(1, 0, 1, TS, pack_batch([b"a"]))
    st.finish(1)
    st.cf["meta"][b"format"] = U64.pack(FORMAT_VERSION + 1)
    st.flush()
    st.close()
    for _ in range(2):  # the refused open closes the database: a second try says the same
        with pytest.raises(StoreFormatError) as info:
            ShardStore(path, 3, 1, memory())
        assert str(info.value).startswith(
            f"shard {path} has format {FORMAT_VERSION + 1}, newer than format "
            f"{FORMAT_VERSION} of this shardnode")


def test_a_store_older_than_any_format_read_is_refused_saying_no_upgrade_exists(
        tmp_path: Path) -> None:
    path = shard_dir(tmp_path, 3, 1)
    st = ShardStore(path, 3, 1, memory())
    st.finish(1)
    st.cf["meta"][b"format"] = U64.pack(0)
    st.flush()
    st.close()
    with pytest.raises(StoreFormatError) as info:
        ShardStore(path, 3, 1, memory())
    assert str(info.value).startswith(f"shard {path} has format 0, older than any this "
                                      f"shardnode reads (1, 2, 3, 4; it writes format {FORMAT_VERSION}): "
                                      f"no upgrade from format 0 exists yet")


def test_a_store_of_the_current_format_opens(tmp_path: Path) -> None:
    path = shard_dir(tmp_path, 3, 1)
    st = ShardStore(path, 3, 1, memory())
    st.apply_produce(1, 0, 1, TS, pack_batch([b"a"]))
    st.finish(1)
    stored = st.cf["meta"][b"format"]
    assert isinstance(stored, bytes)
    assert U64.unpack(stored)[0] == FORMAT_VERSION
    st.flush()
    st.close()
    st = ShardStore(path, 3, 1, memory())
    assert st.applied_lsn == 1
    st.destroy()
    assert not path.exists()


def test_parse_shard_dir_accepts_only_shard_names() -> None:
    from actors.shard_store import parse_shard_dir
    assert parse_shard_dir("t12-p3") == (12, 3)
    for name in ("t12-p3.deleted", "tx-p1", "t1-p", "other", "t1-p2-p3"):
        assert parse_shard_dir(name) is None


def test_destroy_leaves_nothing_behind(tmp_path: Path) -> None:
    from actors.shard_store import ShardStore
    store = ShardStore(tmp_path / "t1-p0", 1, 0, memory())
    store.finish(1)
    store.destroy()
    assert list(tmp_path.iterdir()) == []


def test_a_transaction_is_staged_invisibly_then_committed_or_dropped(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "s", 1, 0, memory())
    first = pack_batch([Record(b"a", b"k1", ("red",), None), b"b"])
    # Two writes held by the writer, then staged (its budget, or a checkpoint), one more held.
    assert store.hold(2) and store.hold(3)
    store.finish(3)
    assert store.held_lsn == 2
    store.stage([(77, 2, 0, TS, 2, first), (88, 3, 0, TS, 1, pack_batch([b"gone"]))])
    assert store.held_lsn == 0 and store.staged_count() == 2
    assert store.hold(4)
    assert store.held_lsn == 4
    assert store.read(0, 10) == [] and store.read_by_key(b"k1") == []
    store.apply_produce(5, 0, 1, TS, pack_batch([b"plain"]))
    store.finish(5)
    # Committed: what was staged, then the write held in memory (after it in the log).
    store.held_lsn = 0
    assert store.apply_commit(6, 77, 1, 4, held=[(4, 0, TS + 1, 1, pack_batch([b"c"])),
                                                 (4, 1, TS + 2, 1, pack_batch([b"d"]))]) == 4
    store.apply_rollback(7, 88)
    store.finish(7)
    assert [row[4] for row in store.read(0, 10)] == [b"plain", b"a", b"b", b"c", b"d"]
    assert store.read_by_key(b"k1")[0][0] == 1 and store.read_by_tag("red", 0, 5)[0][0] == 1
    assert store.staged_count() == 1  # 77's entries: deleted once a flush made its commit durable
    store.flush()
    assert store.staged_count() == 0 and store.next_offset == 5
    assert store.apply_commit(6, 77, 1, 4) == 0  # replayed: already applied
    assert not store.hold(7)  # applied: not held again
    store.hold(8)
    store.finish(8)
    store.stage([(99, 8, 0, TS, 1, pack_batch([b"x"]))])
    with pytest.raises(RuntimeError, match=r"2 records .* but 1 are staged"):
        store.apply_commit(9, 99, 5, 2)
    store.close()


# A child that opens the shard, commits or stages (its argument) and flushes it with the seam armed
# between the data column families and the meta: it exits as a SIGKILL would, there.
_CRASHING_FLUSH = """
import os
import sys
from actors import faults
from pathlib import Path
from actors.shard_options import StoreMemory
from actors.shard_store import ShardStore
from config import load_config
from wire.records import pack_batch
cfg = load_config()
store = ShardStore(Path(sys.argv[1]), 1, 0, StoreMemory.of(cfg.shards, cfg.storage))
if sys.argv[2] == "stage":  # the write held again after a restart, staged by a flush
    store.stage([(5, 2, 0, int(sys.argv[3]), 2, pack_batch([b"a", b"b"]))])
else:
    store.apply_commit(3, 5, 0, 2)
    store.finish(3)
if sys.argv[2] == "commit-flushed":  # every column family, as RocksDB's own flush does; then killed
    for cf in store.cf.values():
        cf.flush(True)
    os._exit(faults.EXIT_INJECTED)
store.flush()
raise SystemExit("the flush was not cut short")
"""


def _flush_cut_short(path: Path, step: str) -> None:
    env = {**os.environ, "SHARDNODE_FAULTS": "shard.before_meta_flush"}
    done = subprocess.run([sys.executable, "-c", _CRASHING_FLUSH, str(path), step, str(TS)],
                          env=env,
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == faults.EXIT_INJECTED, done.stderr


def test_a_commit_of_staged_writes_is_applied_again_after_a_flush_cut_before_its_meta(
        tmp_path: Path) -> None:
    """A flush makes the data column families durable one by one, then the meta: a crash
    between them leaves the shard at its older applied LSN, and the replay applies the
    commit again, which needs its staged entries (their deletion used to be flushed ahead
    of the meta, and the writer then refused to start)."""
    path = tmp_path / "s"
    store = ShardStore(path, 1, 0, memory())
    store.hold(2)
    store.finish(2)
    store.stage([(5, 2, 0, TS, 2, pack_batch([b"a", b"b"]))])
    store.close()  # durable: applied to LSN 2, the write staged
    _flush_cut_short(path, "commit")
    store = ShardStore(path, 1, 0, memory())
    assert store.applied_lsn == 2 and store.staged_count() == 1
    assert store.apply_commit(3, 5, 0, 2) == 2  # the replay
    store.finish(3)
    store.flush()
    assert [row[4] for row in store.read(0, 10)] == [b"a", b"b"] and store.staged_count() == 0
    store.close()


def test_a_write_both_staged_and_held_again_after_a_cut_flush_is_committed_once(
        tmp_path: Path) -> None:
    """A checkpoint's flush stages the writes held in memory; cut before its meta, the
    shard still says they are in the log from ``held_lsn`` on, so the restarted writer
    holds them again while ``staged`` has them too: the commit applies each write once."""
    path = tmp_path / "s"
    store = ShardStore(path, 1, 0, memory())
    assert store.hold(2)
    store.finish(2)
    store.close()  # durable: applied to LSN 2, the write at LSN 2 held (in the log)
    _flush_cut_short(path, "stage")
    store = ShardStore(path, 1, 0, memory())
    assert store.applied_lsn == 2 and store.held_from_lsn == 2 and store.staged_count() == 1
    held_again = [(2, 0, TS, 2, pack_batch([b"a", b"b"]))]
    assert store.apply_commit(3, 5, 0, 2, held=held_again) == 2
    store.finish(3)
    assert [row[4] for row in store.read(0, 10)] == [b"a", b"b"]
    store.close()


def test_a_commits_staged_entries_left_by_a_crash_after_its_meta_are_deleted_at_open(
        tmp_path: Path) -> None:
    """A commit whose meta reached the disk (a RocksDB flush of its own) before its staged
    entries were deleted: the mark in the meta says so, and the next open deletes them, so
    no later transaction of the same id finds them."""
    path = tmp_path / "s"
    store = ShardStore(path, 1, 0, memory())
    store.hold(2)
    store.finish(2)
    store.stage([(5, 2, 0, TS, 2, pack_batch([b"a", b"b"]))])
    store.close()
    _flush_cut_short(path, "commit-flushed")
    store = ShardStore(path, 1, 0, memory())
    assert store.applied_lsn == 3 and store.staged_count() == 0
    assert [row[4] for row in store.read(0, 10)] == [b"a", b"b"]
    store.hold(4)  # the same id again, much later: only its own write
    store.finish(4)
    store.stage([(5, 4, 0, TS, 1, pack_batch([b"c"]))])
    assert store.apply_commit(5, 5, 2, 1) == 1
    store.finish(5)
    store.flush()
    assert [row[4] for row in store.read(0, 10)] == [b"a", b"b", b"c"]
    assert store.staged_count() == 0
    store.close()


def test_held_lsn_is_kept_with_the_shard_and_read_back_at_open(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = ShardStore(path, 1, 0, memory())
    store.hold(5)
    store.hold(9)
    store.finish(9)
    store.flush()
    store.close()
    store = ShardStore(path, 1, 0, memory())
    assert (store.applied_lsn, store.held_lsn, store.held_from_lsn) == (9, 5, 5)
    store.stage([(1, 5, 0, TS, 1, pack_batch([b"a"])), (1, 9, 0, TS, 1, pack_batch([b"b"]))])
    store.flush()
    store.close()
    store = ShardStore(path, 1, 0, memory())
    assert (store.held_lsn, store.held_from_lsn, store.staged_count()) == (0, 0, 2)
    store.close()


def test_stats_sum_every_column_family_and_compact_moves_level_0_down(tmp_path: Path) -> None:
    st = ShardStore(shard_dir(tmp_path, 3, 1), 3, 1, memory())
    try:
        for lsn in range(1, 4):  # three flushes: three SST files in level 0 of each family
            st.apply_produce(lsn, (lsn - 1) * 50, 50, TS,
                             pack_batch([Record(b"v" * 100, key=f"k{i}".encode())
                                         for i in range(50)]))
            st.finish(lsn)
            st.flush()
        sst, levels, _pending, memtables, records = st.stats()
        assert sst == st.sst_bytes() > 0 and len(levels) == LEVELS and levels[0] >= 3
        assert memtables >= 0 and records == 150
        calls: list[int] = []
        before, after = st.compact(lambda: calls.append(1))
        assert before == sst and after > 0
        assert len(calls) >= len(CFS)  # told after each column family at least
        assert st.stats()[1][0] == 0  # level 0 emptied
        assert len(st.read(0, 1000)) == 150
    finally:
        st.close()


# ---- runs of bare values (format 4) ----------------------------------------------------------


def _entries(store: ShardStore) -> list[tuple[int, bool]]:
    """The ``records`` column family's entries: (offset, whether it is a run)."""
    it = store.cf["records"].iter()
    it.seek_to_first()
    out = []
    while it.valid():
        out.append((U64.unpack(it.key())[0], it.value()[:1] == RUN_HEAD))
        it.next()
    return out


def test_bare_values_are_kept_in_runs_cut_by_records_and_bytes(shard: Shard) -> None:
    small = [os.urandom(i % 200) for i in range(RUN_RECORDS_MAX * 2 + 10)]
    big = [os.urandom(40_000) for _ in range(60)]  # 2.4 MB: cut by RUN_BYTES_MAX
    shard.produce([b"only"])
    shard.produce(small)
    shard.produce(big)
    entries = _entries(shard.store)
    assert all(run for _off, run in entries)
    firsts = [off for off, _run in entries]
    assert firsts[:4] == [0, 1, 1 + RUN_RECORDS_MAX, 1 + 2 * RUN_RECORDS_MAX]
    per_big_run = RUN_BYTES_MAX // 40_000
    assert firsts[4:] == list(range(len(small) + 1, shard.store.next_offset, per_big_run))
    rows = shard.model.rows
    rng = random.Random(7)
    for offset in [0, 1, 2, RUN_RECORDS_MAX, RUN_RECORDS_MAX + 1, len(rows) - 1, len(rows),
                   *rng.sample(range(len(rows)), 30)]:
        n = rng.choice([1, 3, 1000, 5000])
        assert _norm(shard.store.read(offset, n)) == rows[offset:offset + n], (offset, n)
    assert shard.store.record_count == len(rows)
    shard.reopen()
    assert _norm(shard.store.read(0, 10_000)) == rows
    assert shard.store.stats()[4] == len(rows)


@pytest.mark.parametrize("longest", [255, 256], ids=["cut-from-the-batch", "packed-again"])
def test_runs_cut_from_a_batch_are_the_bytes_packing_them_gives(shard: Shard,
                                                                longest: int) -> None:
    """Values under 256 bytes are cut out of the batch as it came; one longer makes the
    runs packed again. Either way each run is ``[timestamp, [values]]`` as msgpack packs it."""
    rng = random.Random(longest)
    values = [rng.randbytes(rng.randrange(0, 256)) for _ in range(RUN_RECORDS_MAX * 3 + 5)]
    values[RUN_RECORDS_MAX + 7] = rng.randbytes(longest)
    shard.produce(values, batch_ts=TS + 5)
    it = shard.store.cf["records"].iter()
    it.seek_to_first()
    runs = []
    while it.valid():
        runs.append((U64.unpack(it.key())[0], it.value()))
        it.next()
    starts = list(range(0, len(values), RUN_RECORDS_MAX))
    assert [off for off, _raw in runs] == starts
    for off, raw in runs:
        assert raw == pack((TS + 5, values[off:off + RUN_RECORDS_MAX])), off
    assert shard.store.bytes == sum(map(len, values))
    assert _norm(shard.store.read(0, 10_000)) == shard.model.rows


def test_a_read_of_runs_stops_at_its_byte_limit(shard: Shard) -> None:
    shard.produce([b"a" * 100] * 50)
    st = shard.store
    assert [row[0] for row in st.read(10, 50, bytes_max=1000)] == list(range(10, 20))
    assert [row[0] for row in st.read(10, 50, bytes_max=50)] == [10]  # at least one


def test_batches_with_keys_tags_timestamps_or_large_values_are_not_runs(shard: Shard) -> None:
    inline = memory().large.inline_bytes_max
    shard.produce([b"a", Record(b"b", key=b"k")])
    shard.produce([b"c", Record(b"d", tags=("t",))])
    shard.produce([b"e", Record(b"f", timestamp=TS - 5)])
    shard.produce([b"g", b"h" * (inline + 1)])
    assert not any(run for _off, run in _entries(shard.store))
    assert _norm(shard.store.read(0, 100)) == shard.model.rows


def test_records_deleted_from_runs_are_gone_and_the_others_keep_their_offsets(
        shard: Shard) -> None:
    shard.produce([bytes([i]) * 10 for i in range(20)])
    shard.produce([Record(b"keyed", key=b"k")])
    st = shard.store
    for lsn, offset in enumerate((0, 5, 19, 20), start=100):
        assert st.apply_delete(lsn, offset, None)
        shard.model.rows[offset] = None  # type: ignore[call-overload]
        st.finish(lsn)
    assert not st.apply_delete(200, 5, None)  # already gone
    assert not st.apply_delete(201, 21, None)  # never written
    kept = [row for row in shard.model.rows if row is not None]
    assert _norm(st.read(0, 100)) == kept
    assert _norm(st.read(5, 2)) == kept[4:6]
    assert st.read_by_key(b"k") == []
    assert st.record_count == 17 and st.bytes == 17 * 10
    for offset in range(1, 20):  # every record of the run: nothing is left of it
        st.apply_delete(300 + offset, offset, None)
    st.finish(400)
    assert _entries(st) == [] and st.read(0, 100) == [] and st.record_count == 0


def test_retention_cuts_runs_from_the_front(shard: Shard) -> None:
    shard.produce([b"x" * 10] * 30, batch_ts=TS)
    shard.produce([b"y" * 10] * 30, batch_ts=TS + 1000)
    st = shard.store
    st.set_settings(shard.lsn + 1, {"retention_bytes": 400})  # 600 bytes held: 20 records go
    st.finish(shard.lsn + 1)
    assert st.retain(TS, records_max=12) == 12  # part of the first run, within the budget
    assert st.first_offset == 12 and _entries(st) == [(12, True), (30, True)]
    assert st.retain(TS, records_max=1000) == 8
    assert (st.first_offset, st.bytes, st.record_count) == (20, 400, 40)
    with pytest.raises(OutOfRange):
        st.read(19, 10)
    assert _norm(st.read(20, 100)) == shard.model.rows[20:]
    shard.reopen()
    st = shard.store
    assert (st.first_offset, st.bytes, st.record_count) == (20, 400, 40)
    st.set_settings(shard.lsn + 10, {"retention_ms": 500})
    st.finish(shard.lsn + 10)
    assert st.retain(TS + 1200, records_max=1000) == 10  # the rest of the older run, whole
    assert st.first_offset == 30 and _entries(st) == [(30, True)]
    assert _norm(st.read(30, 100)) == shard.model.rows[30:]


def test_a_committed_transaction_of_bare_values_is_kept_in_runs(tmp_path: Path) -> None:
    store = ShardStore(tmp_path / "s", 1, 0, memory())
    store.hold(2)
    store.finish(2)
    store.stage([(5, 2, 0, TS, 3, pack_batch([b"a", b"b", b"c"]))])
    assert store.apply_commit(3, 5, 0, 5, held=[(2, 1, TS, 2, pack_batch([b"d", b"e"]))]) == 5
    store.finish(3)
    assert _entries(store) == [(0, True), (3, True)]
    assert [row[4] for row in store.read(1, 10)] == [b"b", b"c", b"d", b"e"]
    store.close()


def test_runs_and_records_against_a_model(tmp_path: Path) -> None:
    """Random batches (bare, keyed, tagged, large), deletes, reads and reopens; every read
    checked against what the shard should hold."""
    seed = int(os.environ.get("SHARDNODE_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    rng = random.Random(seed)
    shard = Shard(shard_dir(tmp_path, 1, 0))
    inline = memory().large.inline_bytes_max
    try:
        for step in range(120):
            kind = rng.random()
            if kind < 0.45:
                n = rng.choice([1, 2, 50, 700, RUN_RECORDS_MAX + 3])
                shard.produce([rng.randbytes(rng.randrange(0, 300)) for _ in range(n)],
                              batch_ts=TS + step)
            elif kind < 0.6:
                kinds: list[Record | bytes] = [b"bare", Record(b"v", key=b"k%d" % rng.randrange(5)),
                                               Record(b"w", tags=("t",))]
                mixed = [rng.choice(kinds) for _ in range(5)]
                shard.produce(mixed, batch_ts=TS + step)
            elif kind < 0.65:
                shard.produce([b"s", rng.randbytes(inline + 1)], batch_ts=TS + step)
            elif kind < 0.85 and shard.model.rows:
                offset = rng.randrange(len(shard.model.rows) + 1)
                shard.lsn += 1
                present = offset < len(shard.model.rows) and shard.model.rows[offset] is not None
                assert shard.store.apply_delete(shard.lsn, offset, None) == present, offset
                shard.store.finish(shard.lsn)
                if present:
                    shard.model.rows[offset] = None  # type: ignore[call-overload]
            elif kind < 0.9:
                shard.reopen()
            kept = [row for row in shard.model.rows if row is not None]
            for _ in range(3):
                offset = rng.randrange(len(shard.model.rows) + 2)
                n = rng.choice([1, 7, 500, 5000])
                want = [row for row in kept if row[0] >= offset][:n]
                assert _norm(shard.store.read(offset, n)) == want, (step, offset, n)
            assert shard.store.record_count == len(kept)
    finally:
        shard.store.close()


def test_a_large_batch_is_written_in_parts_and_a_part_left_by_a_crash_is_redone(
        tmp_path: Path) -> None:
    """A batch past BATCH_BYTES_MAX is written in parts before its meta; a part that
    reached the disk without the meta (a crash) is written again the same way by the
    replay from the applied LSN."""
    path = tmp_path / "s"
    store = ShardStore(path, 1, 0, memory())
    keyed = [Record(os.urandom(1000), key=b"k%d" % i, tags=("t",)) for i in range(3000)]
    bare = [os.urandom(1000) for _ in range(3000)]
    store.apply_produce(1, 0, 1, TS, pack_batch([b"first"]))
    store.finish(1)
    store.apply_produce(2, 1, len(keyed), TS, pack_batch(keyed))  # 3 MB
    store.apply_produce(2, 1 + len(keyed), len(bare), TS, pack_batch(bare))  # 3 MB more
    assert store.batch_bytes < BATCH_BYTES_MAX  # a part was written: the batch started over
    assert len(store.read(0, 10_000)) > 1  # the part is in the database, without its meta
    store.batch = None  # the crash: the rest of the batch and the meta are lost...
    store.flush()  # ...but RocksDB had flushed the part
    store.close()
    store = ShardStore(path, 1, 0, memory())
    assert (store.applied_lsn, store.next_offset, store.record_count) == (1, 1, 1)
    assert store.apply_produce(2, 1, len(keyed), TS, pack_batch(keyed)) == len(keyed)
    store.apply_produce(2, 1 + len(keyed), len(bare), TS, pack_batch(bare))
    store.finish(2)
    rows = store.read(0, 10_000)
    assert [r[4] for r in rows] == [b"first", *(r.value for r in keyed), *bare]
    assert [r[0] for r in rows] == list(range(6001))
    assert store.read_by_key(b"k7")[0][0] == 8 and store.record_count == 6001
    assert [r[0] for r in store.read_by_tag("t", 2990, 20)] == list(range(2990, 3001))
    store.close()


def test_a_commit_of_staged_records_with_an_offset_commit_in_the_same_shard(
        tmp_path: Path) -> None:
    """A commit record can carry consumer offsets for a shard it also writes records to:
    both apply, and the staged entries it deletes stay until a flush has made the commit
    durable (a replay from before it needs them)."""
    store = ShardStore(tmp_path / "s", 1, 0, memory())
    store.hold(2)
    store.finish(2)
    store.stage([(5, 2, 0, TS, 2, pack_batch([b"a" * 3_000_000, b"b" * 3_000_000]))])
    assert store.apply_commit(3, 5, 0, 2) == 2
    store.apply_offset_commit(3, "billing", 7)
    store.finish(3)
    assert store.committed_offset("billing") == 7 and store.staged_count() == 1
    store.flush()
    assert store.staged_count() == 0
    assert [len(r[4]) for r in store.read(0, 10)] == [3_000_000, 3_000_000]
    store.close()


def _read_run_one_by_one(rows: list[Any], at: int, ts: int, values: list[bytes | None],
                         start: int, max_records: int, size: int,
                         bytes_max: int) -> tuple[int, bool]:
    """What ``ShardStore._read_run`` does, value by value (as the shard read runs before)."""
    for i in range(start, len(values)):
        value = values[i]
        if value is None:
            continue
        if len(rows) >= max_records or (rows and size + len(value) > bytes_max):
            return size, True
        size += len(value)
        rows.append((at + i, ts, None, (), value))
    return size, False


def test_a_runs_rows_are_read_as_one_by_one_within_every_bound() -> None:
    """A run's rows, made at C speed, are those a loop over its values makes: deleted values
    skipped, at most ``max_records`` in the read, none past ``bytes_max`` but at least one
    in all, whatever the rows read before them; seeded, 20 000 cases."""
    rng = random.Random(20261126)
    for _ in range(20_000):
        values = [None if rng.random() < 0.2 else b"x" * rng.randint(0, 9)
                  for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.5:
            values = [v if v is not None else b"" for v in values]  # no deleted ones
        max_records = rng.randint(1, 8)
        before = [(0, 0, None, (), b"y" * rng.randint(0, 20))
                  for _ in range(rng.randint(0, 3))][:max_records]
        args = (rng.randint(0, 100), 5, values, rng.randint(0, len(values) + 1), max_records,
                sum(len(r[4]) for r in before), rng.randint(0, 40))
        want: list[Any] = list(before)
        got: list[Any] = list(before)
        want_size, want_full = _read_run_one_by_one(want, *args)
        got_size, got_full = ShardStore._read_run(got, *args)
        assert (got, got_size) == (want, want_size), args
        # "Full" may differ only where the rows are full anyway: the read stops either way.
        assert got_full == want_full or len(got) >= max_records, args
