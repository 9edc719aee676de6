"""Large values (issue 14): values over ``[storage] inline_bytes_max`` kept in chunks of
``chunk_bytes`` in the shard's ``chunks`` column family, or in RocksDB's blob files.

A 10 MiB value goes through a real node by every read path, inside a transaction too, and
after a restart (from the shard, not the cache); records written with one chunk size still
read after the setting changes; a SIGKILL in the middle of large writes leaves every
acknowledged value whole and no value torn. The chunk split and join, and the reads' bound
in bytes, are tested on a store directly."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from actors.shard_options import LargeValues, StoreMemory, chunk_count, join_chunks, split_value
from actors.shard_store import CHUNK_KEY, ShardStore, shard_dir
from config import load_config
from node.local import LocalNode
from wire.errors import BadRequest, NodeError
from wire.records import Record, pack_batch

if TYPE_CHECKING:
    from tests.conftest import MakeNode

MIB = 1024 * 1024
BIG = 10 * MIB
TS = 1_700_000_000_000
SEED = 14


def value_of(n: int, seed: int) -> bytes:
    """``n`` bytes that differ by position and by seed, so that chunks out of order, from
    another value or cut short do not compare equal."""
    return random.Random(seed).randbytes(n)


def sealed(n: int, seed: int) -> bytes:
    """A value that carries its own digest (the first 32 bytes): a torn one is seen."""
    body = value_of(n - 32, seed)
    return hashlib.sha256(body).digest() + body


def whole(value: bytes) -> bool:
    return hashlib.sha256(value[32:]).digest() == value[:32]


def chunks_on_disk(data_dir: Path, topic_id: int = 1, partition: int = 0) -> int:
    """Chunks in a stopped node's shard."""
    cfg = load_config()
    st = ShardStore(shard_dir(data_dir / "shards", topic_id, partition), topic_id, partition,
                    StoreMemory.of(cfg.shards, cfg.storage))
    try:
        return sum(1 for _ in st.cf["chunks"].keys())  # noqa: SIM118 (an iterator of keys)
    finally:
        st.close()


# ---- through a node --------------------------------------------------------------------------


def test_a_10_mib_value_round_trips_by_every_read_path(make_node: MakeNode,
                                                       tmp_path: Path) -> None:
    node = make_node()
    big = value_of(BIG, SEED)
    in_txn = value_of(BIG, SEED + 1)
    with node.client(timeout_ms=60_000) as c:
        c.create_topic("big")
        c.produce("big", b"small", partition=0)
        assert c.produce("big", big, key=b"k", tags=["large"], partition=0) == (0, 1)
        with c.transaction() as t:
            t.produce("big", in_txn, key=b"t", tags=["large"], partition=0)
        c.produce("big", b"after", partition=0)

        def check() -> None:
            # A read stops before a record that would take it over read_bytes_max (8 MiB),
            # unless it is the read's first: one large value a read.
            assert [r.value for r in c.read("big", 0, 0, max_records=10)] == [b"small"]
            got = c.read("big", 0, 1, max_records=10)
            assert [(r.offset, r.value) for r in got] == [(1, big)]
            got = c.read("big", 0, 2, max_records=10)
            assert [(r.offset, r.value, r.key) for r in got] == [(2, in_txn, b"t")]
            assert [r.value for r in c.read("big", 0, 3)] == [b"after"]
            by_key = c.read_by_key("big", b"k", partition=0)
            assert by_key is not None and (by_key.offset, by_key.value) == (1, big)
            by_key = c.read_by_key("big", b"t", partition=0)
            assert by_key is not None and (by_key.offset, by_key.value) == (2, in_txn)
            tagged = c.read_by_tag("big", 0, "large")
            assert [(r.offset, r.value) for r in tagged] == [(1, big)]
            tagged = c.read_by_tag("big", 0, "large", offset=2)
            assert [(r.offset, r.value) for r in tagged] == [(2, in_txn)]

        check()  # by offset from the cache, the others from the shard
    node.stop()
    assert chunks_on_disk(node.data_dir) == 2 * BIG // MIB  # chunks of the defaults' 1 MiB
    node.start()
    with node.client(timeout_ms=60_000) as c:
        check()  # by offset from the shard too: the cache starts empty


def test_a_value_over_value_bytes_max_is_refused_and_the_node_serves_on(node: LocalNode) -> None:
    value_max = load_config().limits.value_bytes_max
    assert value_max >= BIG  # a 10 MiB value is accepted with the defaults
    with node.client(timeout_ms=60_000) as c:
        c.create_topic("t")
        with pytest.raises(BadRequest, match=f"over {value_max}"):
            c.produce("t", b"x" * (value_max + 1), partition=0)
        assert c.produce("t", b"x" * value_max, partition=0) == (0, 0)
        assert [len(r.value) for r in c.read("t", 0, 0)] == [value_max]


def test_records_written_with_another_chunk_size_read_as_before(make_node: MakeNode,
                                                                tmp_path: Path) -> None:
    data = tmp_path / "data"
    written: list[bytes] = []
    settings = [
        "",                                                             # 1 MiB chunks
        "[storage]\nchunk_bytes = 300007\ninline_bytes_max = 4096\n",   # not a divisor
        '[storage]\nlarge_values = "blob_files"\n',                     # no chunks at all
        "[storage]\nchunk_bytes = 65536\n",
    ]
    for i, setting in enumerate(settings):
        node = make_node(setting, data_dir=data)
        with node.client(timeout_ms=60_000) as c:
            if i == 0:
                c.create_topic("t")
            for j in range(2):
                v = value_of(3 * MIB + 1000 * i + j, SEED + 10 * i + j)
                c.produce("t", v, key=f"{i}-{j}".encode(), partition=0)
                written.append(v)
        node.stop()  # the next start reads every record from the shard
    node = make_node(settings[0], data_dir=data)
    with node.client(timeout_ms=60_000) as c:
        got: list[Record] = []
        while len(got) < len(written):
            more = c.read("t", 0, len(got), max_records=100)
            assert more, f"no record at offset {len(got)}"
            got += more
        assert [r.value for r in got] == written
        for i in range(len(settings)):
            r = c.read_by_key("t", f"{i}-1", partition=0)
            assert r is not None and r.value == written[2 * i + 1]


def test_sigkill_mid_ingest_of_large_values_keeps_every_acknowledged_one_whole(
        make_node: MakeNode) -> None:
    node = make_node("[storage]\nchunk_bytes = 262144\n")
    with node.client() as c:
        c.create_topic("t")
    acked: dict[int, bytes] = {}
    stop = threading.Event()
    failed: list[BaseException] = []

    def produce() -> None:
        rnd = random.Random(SEED)
        try:
            # A shorter timeout: after the kill, the request under way fails sooner (with 30 s
            # this test waited that long for its thread).
            with node.client(timeout_ms=10_000, retries=0) as c:
                i = 0
                while not stop.is_set():
                    v = sealed(rnd.randrange(MIB, BIG), SEED + i)
                    _p, offset = c.produce("t", v, key=b"k%d" % i, partition=0)
                    acked[offset] = v
                    i += 1
        except NodeError:
            pass  # the node was killed under it
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while len(acked) < 6:  # some in the shard, some only in the log
            assert thread.is_alive() and time.monotonic() < deadline, failed
            time.sleep(0.01)  # ok-sleep: poll interval, under a deadline
        node.kill()
    finally:
        stop.set()
        thread.join(60)
    assert not failed, failed
    node.start()
    with node.client(timeout_ms=60_000) as c:
        got: list[Record] = []
        while True:
            more = c.read("t", 0, len(got), max_records=100)
            if not more:
                break
            got += more
        assert all(whole(r.value) for r in got), "a value read back torn"
        assert [r.offset for r in got] == list(range(len(got)))
        assert len(got) >= len(acked)
        for offset, v in acked.items():
            assert got[offset].value == v, offset
            r = c.read_by_key("t", got[offset].key or b"", partition=0)
            assert r is not None and r.value == v


# ---- the store -------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [0, 1, 99, 100, 101, 1000, 12345])
@pytest.mark.parametrize("chunk_bytes", [1, 100, 4096])
def test_split_and_join_are_inverse(length: int, chunk_bytes: int) -> None:
    value = value_of(length, length)
    chunks = split_value(value, chunk_bytes)
    assert len(chunks) == chunk_count(length, chunk_bytes)
    assert all(len(c) == chunk_bytes for c in chunks[:-1])
    assert all(0 < len(c) <= chunk_bytes for c in chunks)
    assert join_chunks(chunks, length, chunk_bytes) == value


def test_join_refuses_missing_short_and_surplus_chunks() -> None:
    chunks: list[bytes | None] = list(split_value(b"a" * 250, 100))
    with pytest.raises(ValueError, match="has 3 chunks, not 2"):
        join_chunks(chunks[:2], 250, 100)
    with pytest.raises(ValueError, match="chunk 1 of a value of 250 bytes: missing"):
        join_chunks([chunks[0], None, chunks[2]], 250, 100)
    with pytest.raises(ValueError, match="chunk 2 of a value of 250 bytes: 49 bytes, not 50"):
        join_chunks([chunks[0], chunks[1], b"a" * 49], 250, 100)


def chunk_keys(st: ShardStore) -> list[bytes]:
    keys = list(st.cf["chunks"].keys())
    assert all(type(k) is bytes for k in keys)
    return keys  # type: ignore[return-value]  # raw mode: bytes (checked)


def store(path: Path, inline_bytes_max: int = 1000, chunk_bytes: int = 300,
          blob_files: bool = False) -> ShardStore:
    sh = load_config().shards
    mem = StoreMemory(sh.memtable_bytes_max, sh.block_cache_bytes, sh.write_buffer_bytes,
                      LargeValues(inline_bytes_max, chunk_bytes, blob_files))
    return ShardStore(path, 1, 0, mem)


def test_the_store_chunks_only_values_over_inline_bytes_max(tmp_path: Path) -> None:
    st = store(tmp_path / "s")
    values = [b"a" * 1000, b"b" * 1001, value_of(3000, 1)]
    st.apply_produce(1, 0, 3, TS, pack_batch([values[0], Record(values[1], b"k", ("t",)),
                                               values[2]]))
    st.finish(1)
    keys = [CHUNK_KEY.unpack(k) for k in chunk_keys(st)]
    assert keys == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4),
                    (2, 5), (2, 6), (2, 7), (2, 8), (2, 9)]
    assert [r[4] for r in st.read(0, 10)] == values
    assert st.read_by_key(b"k")[0][4] == values[1]
    assert st.read_by_tag("t", 0, 10)[0][4] == values[1]
    st.close()


def test_blob_files_keep_every_value_in_its_record(tmp_path: Path) -> None:
    st = store(tmp_path / "s", blob_files=True)
    values = [b"a" * 10, value_of(5000, 2)]
    st.apply_produce(1, 0, 2, TS, pack_batch(values))
    st.finish(1)
    st.flush()
    assert list(st.cf["chunks"].keys()) == []
    assert [r[4] for r in st.read(0, 10)] == values
    st.close()
    blobs = list((tmp_path / "s").glob("*.blob"))
    assert blobs, "the 5000-byte value went to a blob file"


def test_a_read_joins_no_value_past_its_bytes_max(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    st = store(tmp_path / "s")
    values = [value_of(4000, i) for i in range(5)]
    st.apply_produce(1, 0, 5, TS, pack_batch([Record(v, tags=("t",)) for v in values]))
    st.finish(1)
    joined: list[int] = []
    join = ShardStore._join

    def counting(self: ShardStore, offset: int, length: int, chunk_bytes: int) -> bytes:
        joined.append(offset)
        return join(self, offset, length, chunk_bytes)

    monkeypatch.setattr(ShardStore, "_join", counting)
    assert [r[0] for r in st.read(0, 10, bytes_max=9000)] == [0, 1]
    assert joined == [0, 1]
    joined.clear()
    assert [r[0] for r in st.read_by_tag("t", 1, 10, bytes_max=3999)] == [1]  # at least one
    assert joined == [1]
    st.close()


def test_a_chunk_missing_on_disk_fails_the_read_by_name(tmp_path: Path) -> None:
    st = store(tmp_path / "s")
    st.apply_produce(1, 0, 1, TS, pack_batch([value_of(2000, 3)]))
    st.finish(1)
    del st.cf["chunks"][CHUNK_KEY.pack(0, 4)]
    with pytest.raises(RuntimeError, match="offset 0: chunk 4 of a value of 2000 bytes: missing"):
        st.read(0, 1)
    st.close()


def test_deleting_a_records_chunks_leaves_its_neighbours(tmp_path: Path) -> None:
    st = store(tmp_path / "s")
    st.apply_produce(1, 0, 3, TS, pack_batch([value_of(2000, i) for i in range(3)]))
    st.finish(1)
    wb = st._wb()
    st._delete_chunks(wb, 1)
    st.finish(2)
    offsets = {CHUNK_KEY.unpack(k)[0] for k in chunk_keys(st)}
    assert offsets == {0, 2}
    st.close()


def test_a_format_1_shard_is_read_and_then_written_in_the_current_format(tmp_path: Path) -> None:
    from actors.shard_store import U64
    from wire import formats

    st = store(tmp_path / "s")
    st.apply_produce(1, 0, 1, TS, pack_batch([b"old"]))
    st.finish(1)
    st.cf["meta"][b"format"] = U64.pack(1)  # as a shardnode before large values left it
    st.flush()
    st.close()
    st = store(tmp_path / "s")
    assert [r[4] for r in st.read(0, 10)] == [b"old"]
    st.apply_produce(2, 1, 1, TS, pack_batch([value_of(2000, 4)]))
    st.finish(2)
    assert st.cf["meta"][b"format"] == U64.pack(formats.SHARD.current)
    assert [r[4] for r in st.read(0, 10)] == [b"old", value_of(2000, 4)]
    st.close()


def test_storage_settings_are_checked_by_name() -> None:
    from config import ConfigError

    with pytest.raises(ConfigError, match=r"storage\.large_values must be one of"):
        load_config(overrides={"storage": {"large_values": "blobs"}})
    with pytest.raises(ConfigError, match=r"storage\.chunk_bytes must be at most"):
        load_config(overrides={"storage": {"chunk_bytes": 1 << 30}})
    with pytest.raises(ConfigError, match=r"storage\.inline_bytes_max must be positive"):
        load_config(overrides={"storage": {"inline_bytes_max": 0}})
    cfg = load_config(overrides={"storage": {"large_values": "blob_files"}})
    assert LargeValues.of(cfg.storage).blob_files
