"""How a shard writer's shards are set up: RocksDB's options under one memory budget for
all the shards of the process (``StoreMemory``), and how values over ``inline_bytes_max``
are kept (``LargeValues``): cut into chunks (``split_value``, ``join_chunks``) or in
RocksDB's blob files. ``actors/shard_store.py`` describes the chunks' column family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import rocksdict

from config import ShardsConfig, StorageConfig


def split_value(value: bytes, chunk_bytes: int) -> list[bytes]:
    """``value`` in chunks of ``chunk_bytes`` (the last one shorter; none for b"")."""
    assert chunk_bytes > 0
    return [value[i:i + chunk_bytes] for i in range(0, len(value), chunk_bytes)]


def chunk_count(length: int, chunk_bytes: int) -> int:
    return -(-length // chunk_bytes)


def join_chunks(chunks: Sequence[Any], length: int, chunk_bytes: int) -> bytes:
    """The value of ``length`` bytes whose chunks of ``chunk_bytes`` these are; raises
    ``ValueError`` when one is missing or of the wrong size (checked after the read, as
    ``split_value``'s were before the write)."""
    if len(chunks) != chunk_count(length, chunk_bytes):
        raise ValueError(f"a value of {length} bytes in chunks of {chunk_bytes} has "
                         f"{chunk_count(length, chunk_bytes)} chunks, not {len(chunks)}")
    for i, chunk in enumerate(chunks):
        want = min(chunk_bytes, length - i * chunk_bytes)
        if type(chunk) is not bytes or len(chunk) != want:
            got = "missing" if chunk is None else f"{len(chunk)} bytes"
            raise ValueError(f"chunk {i} of a value of {length} bytes: {got}, not {want} bytes")
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class LargeValues:
    """How the shards keep values over ``inline_bytes_max`` (``[storage]``)."""

    inline_bytes_max: int
    chunk_bytes: int
    blob_files: bool  # RocksDB's blob files instead of chunks

    @classmethod
    def of(cls, storage: StorageConfig) -> LargeValues:
        return cls(storage.inline_bytes_max, storage.chunk_bytes,
                   storage.large_values == "blob_files")


class StoreMemory:
    """What all the shards of one writer process share, so that memory stays bounded however
    many shards it holds: one memtable budget (RocksDB flushes early when it is reached,
    which is safe because a flush writes every column family together, applied LSN
    included) and one block cache; and how they keep large values."""

    def __init__(self, memtable_bytes_max: int, block_cache_bytes: int,
                 write_buffer_bytes: int, large: LargeValues) -> None:
        self.large = large
        self.write_buffers = rocksdict.WriteBufferManager(memtable_bytes_max, False)
        self.block_cache = rocksdict.Cache(block_cache_bytes)
        self.block_cache_bytes = block_cache_bytes
        self.write_buffer_bytes = write_buffer_bytes
        # The database options of every shard, one object: its statistics (the block
        # cache's hits and misses, for ``stats``) are shared by the shards as the cache is.
        # Statistics of their own would cost each shard about 0.5 MB (60 shards: 62 → 93 MB).
        self.db_options = self.options(write_buffer_bytes)
        self.db_options.enable_statistics()

    def cache_figures(self) -> tuple[int, int]:
        """The block cache's hits and misses since the process started, over its shards."""
        found = dict.fromkeys(("rocksdb.block.cache.hit", "rocksdb.block.cache.miss"), 0)
        for line in (self.db_options.get_statistics() or "").splitlines():
            name, _, rest = line.partition(" COUNT : ")
            if name in found and rest.strip().isdigit():
                found[name] = int(rest)
        return found["rocksdb.block.cache.hit"], found["rocksdb.block.cache.miss"]

    @classmethod
    def of(cls, shards: ShardsConfig, storage: StorageConfig) -> StoreMemory:
        """The budget ``[shards]`` of the configuration gives one writer process."""
        return cls(shards.memtable_bytes_max, shards.block_cache_bytes, shards.write_buffer_bytes,
                   LargeValues.of(storage))

    def records_options(self) -> rocksdict.Options:
        """The ``records`` column family's: with ``blob_files``, RocksDB keeps the values over
        ``inline_bytes_max`` in blob files beside the SSTs."""
        o = self.options(self.write_buffer_bytes)
        if self.large.blob_files:
            o.set_enable_blob_files(True)
            o.set_min_blob_size(self.large.inline_bytes_max + 1)
        return o

    def options(self, write_buffer_bytes: int) -> rocksdict.Options:
        o = rocksdict.Options(raw_mode=True)
        o.create_if_missing(True)
        o.create_missing_column_families(True)
        o.set_atomic_flush(True)  # automatic flushes write every column family together
        o.set_write_buffer_size(write_buffer_bytes)
        o.set_max_write_buffer_number(2)
        o.set_write_buffer_manager(self.write_buffers)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(self.block_cache)
        # Index and filter blocks otherwise live outside the cache and grow with the data.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        o.set_block_based_table_factory(table)
        return o
