"""The format versions of the files a node keeps, and the one check made of each at start.

Four things on disk carry a version, each where it is read first:

    log segment   a header at the start of each ``<first LSN>.log`` (``wire/logrecord.py``);
                  format 1, segments without a header, is still read
    snapshot      the ``format`` of the log manager's snapshot (``checkpoint-N.snap``),
                  which holds the catalog; format 2 (before transactions) is still read
    shard         ``format`` in a shard's ``meta`` column family (``actors/shard_store.py``)
    export        ``format`` in a snapshot export's manifest (``actors/snapshot_files.py``),
                  checked by ``shardnode start --from-snapshot``

The catalog has no file of its own: its topics are the snapshot's ``topics`` and the log's
``TOPIC_CREATE`` / ``TOPIC_DELETE`` records after it, so its format is the snapshot's format
together with the segments'. A version this node does not read stops the start with
``FormatRefused``, which names the file, the version found and this node's: a newer one was
written by a newer shardnode, and an older one has no upgrade yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class FormatRefused(Exception):
    """A file of a format this node does not read: the node refuses to start on it."""

    def __init__(self, fmt: Format, path: Path, found: object) -> None:
        self.path = path
        self.found = found
        self.current = fmt.current
        reads = ", ".join(str(v) for v in fmt.reads)
        if isinstance(found, int) and found > fmt.current:
            why = (f"has format {found}, newer than format {fmt.current} of this shardnode "
                   f"(which reads {reads}): it was written by a newer shardnode; run that "
                   f"version on this data dir")
        elif isinstance(found, int):
            why = (f"has format {found}, older than any this shardnode reads ({reads}; it "
                   f"writes format {fmt.current}): no upgrade from format {found} exists yet")
        else:
            why = (f"has no format version this shardnode reads (found {found!r}; it reads "
                   f"{reads} and writes format {fmt.current})")
        super().__init__(f"{fmt.what} {path} {why}")


@dataclass(frozen=True, slots=True)
class Format:
    """What a kind of file is called, the version this node writes and those it reads."""

    what: str
    current: int
    reads: tuple[int, ...]

    def __post_init__(self) -> None:
        assert self.current in self.reads and self.current == max(self.reads)

    def check(self, path: Path, found: object) -> None:
        """Raise ``FormatRefused`` unless ``found`` is a version this node reads."""
        if type(found) is not int or found not in self.reads:
            raise FormatRefused(self, path, found)


# 3: a ROLLBACK record says why (``[txn, shards, reason]``, wire/logrecord.py). 2 (still
# read: its rollbacks have no reason): a header with the version at the start of each
# segment. 1: no header (still read). A node appends to a segment of its own format only: it
# starts a new one after a segment of an older format.
LOG_SEGMENT = Format("log segment", 3, (1, 2, 3))
# 4: a rolled back transaction's outcome says why (``txn_outcomes`` rows end with the
# reason). 3 (still read): with the transactions' ledger. 2 (still read: no transactions):
# each window a map seq → the packed [lsn, parts]. 1 is no longer read.
SNAPSHOT = Format("snapshot", 4, (2, 3, 4))
# 4: runs of bare values in ``records`` (``[timestamp_ms, [value, ...]]`` at a run's first
# offset) and the count of records kept in ``meta``. 3 (still read: it has no runs): KV
# namespaces' shards (a ``kv`` column family, their records key writes). 2 (still read):
# large values in chunks (the ``chunks`` column family; records ending with
# ``[length, chunk_bytes]``). 1 (still read: it has no chunked records): the column
# families of actors/shard_store.py, ``staged`` included. A shard of an older format is
# written as format 4 from its first change on.
SHARD = Format("shard", 4, (1, 2, 3, 4))
# 1: a snapshot export's manifest (``actors/snapshot_files.py``): L, shards, files.
EXPORT = Format("snapshot export", 1, (1,))
