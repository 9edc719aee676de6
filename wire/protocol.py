"""The client protocol: msgpack maps over ZeroMQ, one or more per frame, and its one table.

A request is ``{"op": str, "id": int, ...fields}``; the client picks ``id`` and the reply
carries it back, so many requests can be in flight on one DEALER socket. A reply is
``{...fields, "id": int, "ok": true}`` or ``{"id": int, "ok": false, "code": int,
"error": str}``.

A frame carries one map, or several concatenated (as Redis pipelines commands on one
stream): at most ``REQUESTS_PER_FRAME_MAX`` requests from a client, and as many replies as
the node had ready for that client at once, up to ``REPLY_FRAME_BYTES_MAX`` (a larger reply
travels alone). Each request is still answered by its own reply; the frame only saves a
ZeroMQ message per request on both ends.

``OPS`` is the whole protocol: each op once, with its request fields (types, whether
required, bounds) and its reply fields. The front door's checks (``check_request``), the
client's requests (``request_map``) and retries (``Op.retry``), and the protocol's section
of docs/ARCHITECTURE.md (``describe``; ``python -m wire.protocol`` prints it) all come from
it. A new op is one entry here plus its handler (the front door's route and the actor that
answers it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from wire.errors import BadRequest, ErrorCode, NodeError
from wire.packer import pack, pack_map
from wire.records import KEY_BYTES_MAX, TAG_BYTES_MAX, bounds, over_bounds

DEFAULT_PORT = 7400
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
NAME_LEN_MAX = 200  # topic and group names (NAME_RE says the same)
OFFSET_MAX = 2**63 - 1
# ``[limits] frame_bytes_max``'s default (config/defaults.toml; a test holds the two
# together), for a client's messages: a node answers FRAME_TOO_LARGE to a frame up to twice
# its limit, and drops a larger one.
NODE_FRAME_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
REQUESTS_PER_FRAME_MAX = 1024  # a client's Pipeline keeps at most this many in flight
# What one request may decode to: its maps' and arrays' items in all, and in one array or
# map (``wire.records.bounds``). The largest the table allows, a txn_once of
# TXN_ONCE_WRITES_MAX writes, holds about 450 in all, 64 in one array, 8 in one map.
REQUEST_ITEMS_MAX = 4096
REQUEST_ARRAY_LEN_MAX = 256
REQUEST_MAP_LEN_MAX = 64
REPLY_FRAME_BYTES_MAX = 262144  # replies are joined into one frame up to this size
# How long the node lets ``compact`` take (RocksDB rewrites the topic's SST files); a client
# waits a little longer, so that it hears the node's TIMEOUT rather than its own.
COMPACT_TIMEOUT_MS = 600_000
# Key/value: a namespace is a one-partition topic of the catalog named ``KV_PREFIX`` + its
# name (``kv_topic``); topic names cannot contain ':', so the two never collide.
KV_PREFIX = "kv:"
KV_KEY_BYTES_MAX = 1024
# A snapshot export's directory: an absolute path of at most this many characters.
EXPORT_DIR_LEN_MAX = 4096


# ---- rows that replies carry ---------------------------------------------------------


class Topic(NamedTuple):
    """A topic, as ``list_topics`` answers it and as every table of topics in the node holds
    it (the log manager's catalog, the front door's and cache manager's copies)."""

    name: str
    partitions: int
    topic_id: int
    # The member id owning each partition, in partition order (``wire.placement``); empty on
    # a single node, where this node owns them all.
    owners: tuple[int, ...] = ()
    # What was set at its creation, by name, only those not at their defaults (TOPIC_SETTINGS):
    # ``storage`` ("rocksdb", or "memory": records kept by the front door, never logged).
    settings: dict[str, Any] = {}  # noqa: RUF012 (a NamedTuple default, never changed in place)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Topic:
        """A topic from its msgpack array (where ``owners`` comes back as a list)."""
        name, partitions, topic_id, *rest = row
        return cls(name, partitions, topic_id, tuple(rest[0]) if rest else (),
                   dict(rest[1]) if len(rest) > 1 else {})

    @property
    def storage(self) -> str:
        return str(self.settings.get("storage", "rocksdb"))

    def owner(self, partition: int) -> int:
        """The member id owning ``partition``; 0 on a single node."""
        return self.owners[partition] if self.owners else 0



# A topic's settings, their defaults and the values they may take (None: any).
TOPIC_SETTINGS: dict[str, tuple[Any, tuple[Any, ...] | None]] = {
    "storage": ("rocksdb", ("rocksdb", "memory")),
    "retention_ms": (0, None),  # delete records older than this (0: keep them)
    "retention_bytes": (0, None),  # ... and the oldest past this many bytes a partition
}
ALTERABLE_SETTINGS = ("retention_ms", "retention_bytes")  # alter_topic changes these


def topic_settings(given: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a new topic that differ from their defaults, checked; raises
    ``BadRequest`` naming one that is unknown or out of its range."""
    out = {}
    for name, value in given.items():
        known = TOPIC_SETTINGS.get(name)
        if known is None:
            raise BadRequest(f"unknown topic setting {name!r}; known: {sorted(TOPIC_SETTINGS)}")
        default, allowed = known
        if allowed is None and (type(value) is not int or not 0 <= value <= OFFSET_MAX):
            raise BadRequest(f"topic setting {name!r} must be an integer ≥ 0, got {value!r}")
        if allowed is not None and value not in allowed:
            raise BadRequest(f"topic setting {name!r} must be one of {list(allowed)}, got "
                             f"{value!r}")
        if value != default:
            out[name] = value
    return out


class Placed(NamedTuple):
    """Where a produce's records landed in one partition: a row of its reply's ``parts``."""

    partition: int
    first_offset: int
    record_count: int


# ---- the table -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """A field of a request or a reply: its name, the msgpack types it may have, and bounds.

    ``non_negative``: an integer in 0..``OFFSET_MAX``. ``len_max``: a str or bin of at most
    this length (0: not bounded here). ``row``: the layout of each element of an array
    field whose elements are arrays."""

    name: str
    types: tuple[type, ...]
    doc: str
    required: bool = True
    non_negative: bool = False
    len_max: int = 0
    row: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Op:
    """A client op: its request fields and its reply fields (besides ``op``, ``id``, ``ok``).

    ``retry``: the client may send it again after BUSY, TIMEOUT or UNAVAILABLE (doing it
    twice does what doing it once does: produce is de-duplicated by producer id and
    sequence number)."""

    name: str
    doc: str
    request: tuple[Field, ...]
    reply: tuple[Field, ...]
    retry: bool = True


_INT = (int,)
_STR = (str,)
_BIN = (bytes,)
_ARRAY = (list,)

TOPIC = Field("topic", _STR, "topic name", len_max=NAME_LEN_MAX)
PARTITION = Field("partition", _INT, "partition, 0 .. partitions - 1", non_negative=True)
KEY_PARTITION = Field("partition", _INT, "partition; absent: the key's own, by the topic's "
                      "partition count now (as `produce` places a key)", required=False,
                      non_negative=True)
OFFSET = Field("offset", _INT, "offset in the partition", non_negative=True)
MAX_RECORDS = Field("max_records", _INT, "at most this many records (the node caps it at "
                    "`read_records_max`)", non_negative=True)
GROUP = Field("group", _STR, "consumer group name", len_max=NAME_LEN_MAX)
NAME = Field("name", _STR, "topic name", len_max=NAME_LEN_MAX)

RETENTION_MS = Field("retention_ms", _INT, "delete records older than this many ms, by their "
                     "timestamps (0: keep them)", required=False, non_negative=True)
RETENTION_BYTES = Field("retention_bytes", _INT, "delete a partition's oldest records past "
                        "this many bytes of values and keys (0: no bound)", required=False,
                        non_negative=True)
NODE_ID = Field("node_id", _INT, "the answering member's id (0: a single node)")
LSN = Field("lsn", _INT, "the LSN that made it durable")
RECORDS_READ = Field("records", _BIN, "packed array of `[offset, timestamp_ms, key, tags, "
                     "value]`, in offset order")
VALUE = Field("value", (int, type(None)), "the offset, or nil for none")

TXN = Field("txn", _INT, "the transaction's id, as `txn_begin` or `xa_start` answered it",
            non_negative=True)
TXN_SEQ = Field("seq", _INT, "the transaction's writes numbered from 0: a retry with the same "
                "one is answered as the first attempt was, and not staged twice", non_negative=True)
TIMEOUT_MS = Field("timeout_ms", _INT, "roll the transaction back if it is not committed, "
                   "ended or prepared within this many ms (default and maximum: `[txn]`)",
                   required=False, non_negative=True)
XID = Field("xid", _ARRAY, "an XA transaction id: format id, global id and branch id "
            "(each id ≤ 64 bytes)", row=("format_id", "global_id", "branch_id"))
TXN_RECORDS = Field("records", _INT, "the records staged in the transaction so far")
TXN_PARTS = Field("parts", _ARRAY, "where the records landed, one row per partition, "
                  "offsets contiguous in each", row=("topic", "partition", "first_offset",
                                                     "record_count"))
LOGGED = Field("lsn", _INT, "the LSN of the durable record")
CHOSEN_TXN = Field("txn", _INT, "an id the client picked for the transaction, so it can send "
                   "its writes and commit without waiting for this answer (absent: the node "
                   "picks); a retry with the same id is answered again", required=False,
                   non_negative=True)
OWNER = Field("owner", _INT, "the client's own id (the node's client sends its producer id), "
              "given at the begin: while the transaction is active, only a step with the "
              "same owner ends (`xa_end`) or commits (`txn_commit`) it, as XA associates a "
              "branch with its thread of control (absent or 0: not checked)", required=False,
              non_negative=True)
WRITES = Field("writes", _INT, "how many writes (`txn_produce`, `txn_commit_offset`) the "
               "client sent: if the node staged another number, it refuses, and the "
               "transaction stays open", required=False, non_negative=True)

TXN_ONCE_WRITES_MAX = 64  # writes in one txn_once request
TXN_ONCE_OPS = frozenset({"txn_produce", "txn_commit_offset"})  # what its writes may be

NAMESPACE = Field("namespace", _STR, "KV namespace name (as topic names are spelled)",
                  len_max=NAME_LEN_MAX)
KV_KEY = Field("key", _BIN, "the key (≤ 1 KiB)", len_max=KV_KEY_BYTES_MAX)
KV_PRODUCER = Field("producer_id", _INT, "the client's producer id: with `seq`, a retry is "
                    "answered as the first attempt was (absent: not de-duplicated)",
                    required=False, non_negative=True)
KV_SEQ = Field("seq", _INT, "the producer's sequence number (with `producer_id`)",
               required=False, non_negative=True)

SHARD_STATS_ROW = ("topic", "partition", "writer", "sst_bytes", "files_per_level",
                   "pending_compaction_bytes", "memtable_bytes", "records")
WRITER_STATS_ROW = ("writer", "shards", "cache_bytes", "cache_capacity", "cache_hits",
                    "cache_misses")

OPS: dict[str, Op] = {op.name: op for op in (
    Op("produce", "append a batch of records; answered once it is durable",
       request=(TOPIC,
                Field("producer_id", _INT, "the producer's id", non_negative=True),
                Field("seq", _INT, "the producer's sequence number: a retry with the same "
                      "one is answered with the first attempt's offsets", non_negative=True),
                Field("records", _BIN, "packed array of records: each a `value` bin or "
                      "`[value, key, tags, timestamp_ms]` (wire/records.py; a key of at most "
                      "4096 bytes, at most 64 tags of at most 1024 bytes, a timestamp of 0 "
                      "to 253402300799999 ms, 9999-12-31, or nil: the node's time)"),
                Field("partition", (int, type(None)), "partition; absent or nil: by key "
                      "hash, keyless records round-robin", required=False, non_negative=True)),
       reply=(LSN,
              Field("parts", _ARRAY, "where the records landed, one row per partition",
                    row=Placed._fields),
              Field("assign", _ARRAY, "the partition of each record, in batch order, when "
                    "the batch was split by key", required=False))),
    Op("create_topic", "create a topic", retry=False,
       request=(NAME, Field("partitions", _INT, "1 .. 1024 partitions"),
                Field("storage", _STR, "`rocksdb` (the default: logged, durable) or `memory` "
                      "(kept by the front door within `storage.memory_bytes_max`, answered "
                      "without a log write, empty after a restart)", required=False),
                RETENTION_MS, RETENTION_BYTES),
       reply=(LSN,)),
    Op("alter_topic", "change a topic's retention; the shard writers apply it in the background",
       request=(NAME, RETENTION_MS, RETENTION_BYTES),
       reply=(LSN,)),
    Op("delete_topic", "delete a topic and its partitions", retry=False,
       request=(NAME,),
       reply=(LSN,)),
    Op("list_topics", "every topic, sorted by name",
       request=(),
       reply=(Field("topics", _ARRAY, "one row per topic", row=Topic._fields),)),
    Op("cluster_map", "the cluster's members and which one answered (empty on a single "
       "node); topics and their owners come from `list_topics`",
       request=(),
       reply=(Field("members", _ARRAY, "one row per member, by id (public_key: its CURVE "
                    "key, Z85, or empty)", row=("id", "endpoint", "public_key")),
              NODE_ID)),
    Op("cluster_sync", "between members of a cluster: copy the catalog member's topics now; "
       "answered once they are copied (the catalog member asks after each creation and "
       "deletion)",
       request=(),
       reply=(NODE_ID,)),
    Op("end_offsets", "the next offset of each partition: every record below it is durable, "
       "and a read sent after this answer sees it",
       request=(TOPIC,),
       reply=(Field("offsets", _ARRAY, "the next offset of each partition, in partition "
                    "order"),)),
    Op("read", "records from an offset on (from the cache when it has them)",
       request=(TOPIC, PARTITION, OFFSET, MAX_RECORDS),
       reply=(RECORDS_READ,)),
    Op("read_by_key", "the latest record with a key",
       request=(TOPIC, KEY_PARTITION, Field("key", _BIN, "record key", len_max=KEY_BYTES_MAX)),
       reply=(RECORDS_READ,)),
    Op("read_by_tag", "records carrying a tag, from an offset on",
       request=(TOPIC, PARTITION, Field("tag", _STR, "record tag", len_max=TAG_BYTES_MAX),
                OFFSET, MAX_RECORDS),
       reply=(RECORDS_READ,)),
    Op("offset_for_timestamp", "the first offset whose record's timestamp is at or after one",
       request=(TOPIC, PARTITION,
                Field("timestamp", _INT, "milliseconds since the epoch", non_negative=True)),
       reply=(VALUE,)),
    Op("delete_by_key", "delete the latest record with a key (the one `read_by_key` answers): "
       "gone from every read and index, the offsets of the others unchanged; older records "
       "with the key stay",
       request=(TOPIC, KEY_PARTITION, Field("key", _BIN, "record key", len_max=KEY_BYTES_MAX)),
       reply=(LSN,)),
    Op("delete_by_offset", "delete the record at an offset: gone from every read and index, "
       "the offsets of the others unchanged",
       request=(TOPIC, PARTITION, OFFSET),
       reply=(LSN,)),
    Op("commit_offset", "record a consumer group's offset in a partition",
       request=(GROUP, TOPIC, PARTITION, OFFSET),
       reply=(LSN,)),
    Op("committed_offset", "a consumer group's committed offset in a partition",
       request=(GROUP, TOPIC, PARTITION),
       reply=(VALUE,)),
    Op("status", "the node's figures, actor by actor",
       request=(),
       reply=(Field("status", (dict,), "the figures (see `shardnode status`)"),)),
    Op("checkpoint", "run a checkpoint now",
       request=(),
       reply=(Field("lsn", _INT, "the LSN up to which every shard is durable"),)),
    Op("stats", "RocksDB's figures of every shard on this node (in a cluster: the member "
       "asked), from the shard writers that own them",
       request=(),
       reply=(Field("shards", _ARRAY, "one row per shard, by topic and partition: SST bytes, "
                    "SST files at levels 0..6, estimated bytes compaction has still to "
                    "rewrite, memtable bytes, estimated records",
                    row=SHARD_STATS_ROW),
              Field("writers", _ARRAY, "one row per shard writer: its block cache, shared by "
                    "its shards (bytes used, capacity, hits and misses since it started)",
                    row=WRITER_STATS_ROW))),
    Op("compact", "compact every shard of a topic on this node (in a cluster: the member "
       "asked): RocksDB's compact_range over every column family; answered when done",
       request=(TOPIC,),
       reply=(Field("shards", _ARRAY, "one row per shard compacted: its SST bytes before "
                    "and after", row=("topic", "partition", "bytes_before", "bytes_after")),)),
    # ---- key/value (node/client.py: kv_*; actors/kv_state.py: the front door's part) ----
    Op("kv_create", "create a KV namespace (the first write to one creates it too)",
       retry=False, request=(NAMESPACE,),
       reply=(LSN,)),
    Op("kv_drop", "delete a KV namespace and every key in it", retry=False,
       request=(NAMESPACE,),
       reply=(LSN,)),
    Op("kv_put", "set a key's value; answered once it is durable, and every read sent after "
       "the answer sees it",
       request=(NAMESPACE, KV_KEY, Field("value", _BIN, "the value (≤ `value_bytes_max`)"),
                KV_PRODUCER, KV_SEQ),
       reply=(LSN,)),
    Op("kv_get", "a key's value",
       request=(NAMESPACE, KV_KEY),
       reply=(Field("value", (bytes, type(None)), "the value, or nil when the key is absent"),)),
    Op("kv_delete", "delete a key (absent already: nothing changes, and it is answered the same)",
       request=(NAMESPACE, KV_KEY, KV_PRODUCER, KV_SEQ),
       reply=(LSN,)),
    Op("kv_scan", "keys and values in key order",
       request=(NAMESPACE,
                Field("prefix", _BIN, "only keys starting with this", required=False,
                      len_max=KV_KEY_BYTES_MAX),
                Field("start_after", _BIN, "only keys after this one (to page on)",
                      required=False, len_max=KV_KEY_BYTES_MAX),
                Field("limit", _INT, "at most this many pairs (the node caps it at "
                      "`read_records_max`)", required=False, non_negative=True)),
       reply=(Field("pairs", _BIN, "packed array of `[key, value]`, in key order"),
              Field("more", (bool,), "the scan stopped at a limit: page on after the last "
                    "key"))),
    Op("kv_cas", "compare and set: set a key to `new` only if its value is `expected`; "
       "linearizable (after a lost answer, read the key)",
       retry=False,
       request=(NAMESPACE, KV_KEY,
                Field("expected", (bytes, type(None)), "the value the key must have; nil: "
                      "the key must be absent"),
                Field("new", (bytes, type(None)), "the value to set; nil: delete the key")),
       reply=(Field("swapped", (bool,), "whether the key had `expected` and now has `new`"),
              Field("lsn", _INT, "the LSN that made the new value durable (0: not swapped)"),
              Field("value", (bytes, type(None)), "when not swapped: the value the key had "
                    "(nil: absent)", required=False))),
    Op("snapshot_export", "a point-in-time copy of this node (in a cluster: the member "
       "asked) into a directory, taken while it serves: every shard (RocksDB checkpoints), "
       "the catalog, consumer offsets, producers' sequence numbers and transactions, as of "
       "one LSN; answered when whole", retry=False,
       request=(Field("dir", _STR, "absolute path of the directory to write: absent or "
                      "empty, outside the node's data dir", len_max=EXPORT_DIR_LEN_MAX),),
       reply=(Field("lsn", _INT, "the export's LSN: it holds every record durable at or "
                    "below it, and none above"),
              Field("shards", _INT, "how many shards it holds"),
              Field("bytes", _INT, "the bytes of its files"),
              Field("elapsed_ms", _INT, "how long the export took"))),
    # ---- transactions (node/transaction.py is the client's side) ----
    Op("txn_begin", "begin a local transaction",
       request=(TIMEOUT_MS, CHOSEN_TXN, OWNER),
       reply=(TXN,)),
    Op("txn_produce", "stage a batch of records in a transaction: logged now, invisible and "
       "without offsets until the commit",
       request=(TXN, TXN_SEQ, TOPIC,
                Field("records", _BIN, "packed array of records, as `produce` takes them"),
                Field("partition", (int, type(None)), "partition; absent or nil: by key "
                      "hash, keyless records round-robin", required=False, non_negative=True)),
       reply=(TXN_RECORDS,
              Field("parts", _ARRAY, "how many records went to each partition",
                    row=("partition", "record_count")),
              Field("assign", _ARRAY, "the partition of each record, in batch order, when "
                    "the batch was split by key", required=False))),
    Op("txn_commit_offset", "stage a consumer group's offset in a transaction: committed "
       "with its records (read-process-write exactly once)",
       request=(TXN, TXN_SEQ, GROUP, TOPIC, PARTITION, OFFSET),
       reply=(TXN_RECORDS,)),
    Op("txn_kv", "stage a key's new value (or its deletion) in a transaction: invisible "
       "until the commit, when all of the transaction's writes become visible together",
       request=(TXN, TXN_SEQ, NAMESPACE, KV_KEY,
                Field("value", (bytes, type(None)), "the new value; nil: delete the key"),
                Field("expected", (bytes, type(None)), "a compare-and-set: the value the key "
                      "must have at the commit (nil: absent), or the commit fails "
                      "(TXN_CONFLICT) and the transaction is rolled back (local transactions "
                      "only)", required=False)),
       reply=(TXN_RECORDS,)),
    Op("txn_commit", "commit a transaction: answered once its commit record is durable; "
       "a retry answers the same",
       request=(TXN, WRITES, OWNER),
       reply=(LOGGED, TXN_PARTS)),
    Op("txn_once", "a whole local transaction in one request: begin, its writes and commit, "
       "logged together and answered once the commit is durable (what a `txn_begin`, its "
       "writes and a `txn_commit` do, in one message at every hop); a retry answers the same",
       request=(Field("txn", _INT, "an id the client picked for the transaction: a retry with "
                      "the same one is answered with the first outcome", non_negative=True),
                Field("writes", _ARRAY, f"1 to {TXN_ONCE_WRITES_MAX} writes in order, each a "
                      "map of a `txn_produce` or `txn_commit_offset` request's fields with its "
                      "`op`, without `id`, `txn` and `seq`")),
       reply=(LOGGED, TXN_PARTS,
              Field("produced", _ARRAY, "each `txn_produce` write's `parts` and `assign` (nil "
                    "unless split by key), as `txn_produce` answers them",
                    row=("parts", "assign")))),
    Op("txn_abort", "roll a transaction back: nothing of it is ever visible",
       request=(TXN,),
       reply=(LOGGED,)),
    Op("xa_start", "begin an XA transaction branch",
       request=(XID, TIMEOUT_MS, CHOSEN_TXN, OWNER),
       reply=(TXN,)),
    Op("xa_end", "end the branch's work: it may be prepared or committed in one phase next",
       retry=False, request=(XID, WRITES, OWNER),
       reply=(TXN,)),
    Op("xa_prepare", "prepare the branch: durable and in doubt until commit or rollback; "
       "it never times out", retry=False,
       request=(XID,),
       reply=(LOGGED,)),
    Op("xa_commit", "commit the branch (prepared, or ended with `one_phase`); a retry "
       "answers the same",
       request=(XID, Field("one_phase", (bool,), "commit an ended branch without preparing it",
                           required=False)),
       reply=(LOGGED, TXN_PARTS)),
    Op("xa_rollback", "roll the branch back",
       request=(XID,),
       reply=(LOGGED,)),
    Op("xa_recover", "the prepared branches, in doubt",
       request=(),
       reply=(Field("xids", _ARRAY, "one row per prepared branch",
                    row=("format_id", "global_id", "branch_id")),)),
    Op("txn_list", "the open and prepared transactions",
       request=(),
       reply=(Field("txns", _ARRAY, "one row per transaction",
                    row=("txn", "xid", "state", "age_ms", "records", "bytes", "partitions")),)),
)}

# The table unrolled per op once, so that checking a request is one pass over its fields:
# (name, accepted types, required, must not be negative), and the fields bounded in length.
_CHECKS = {name: tuple((f.name, f.types, f.required, f.non_negative) for f in op.request)
           for name, op in OPS.items()}
_BOUNDED = {name: tuple((f.name, f.len_max) for f in op.request if f.len_max)
            for name, op in OPS.items()}
_NAMES = {name: frozenset(f.name for f in op.request) for name, op in OPS.items()}


def _orders(op: Op) -> frozenset[tuple[str, ...]]:
    """Every order of keys a complete request of ``op`` can have: the table's, with or without
    each optional field."""
    orders: list[tuple[str, ...]] = [()]
    for f in op.request:
        orders = [(*o, f.name) for o in orders] + ([] if f.required else orders)
    return frozenset(orders)


_ORDERS = {name: _orders(op) for name, op in OPS.items()}


# ---- the front door's side -----------------------------------------------------------


def parse_request(frame: bytes, frame_bytes_max: int) -> tuple[int, str, dict[str, Any]]:
    """Decode and check a frame of exactly one request; return ``(id, op, fields)``.

    Raises ``NodeError`` with the request id (when it could be read) in ``.request_id``.
    """
    first, *rest = parse_requests(frame, frame_bytes_max, requests_max=1)
    if isinstance(first, NodeError):
        raise first
    if rest:  # anything after the one request ends the frame with an error
        err = rest[0]
        assert isinstance(err, NodeError)
        raise err
    return first


def parse_requests(frame: bytes | memoryview, frame_bytes_max: int,
                   requests_max: int = REQUESTS_PER_FRAME_MAX,
                   ) -> list[tuple[int, str, dict[str, Any]] | NodeError]:
    """Decode and check every request of a frame, in order: each one parsed, or the error
    to answer it with. Bytes that do not decode end the frame with one error."""
    if len(frame) > frame_bytes_max:
        text = (f"a request frame of {len(frame)} bytes is over [limits] frame_bytes_max = "
                f"{frame_bytes_max}: send fewer or smaller records a request")
        return [_error(rid, ErrorCode.FRAME_TOO_LARGE, text)
                for rid in request_ids(frame, requests_max)]
    if not frame:
        return [_error(0, ErrorCode.BAD_REQUEST, "request is not msgpack: the frame is empty")]
    bound, left = bounds(REQUEST_ITEMS_MAX, REQUEST_ARRAY_LEN_MAX, REQUEST_MAP_LEN_MAX)
    try:  # most frames carry one request: one call, without an Unpacker's set-up
        one = msgpack.unpackb(frame, raw=False, strict_map_key=False, **bound)
    except msgpack.ExtraData:
        pass  # several: read them one by one below
    except Exception as exc:
        if over_bounds(exc):
            return [_items_over(0)]
        # not msgpack: the reading below says where and why
    else:
        try:
            return [check_request(one)]
        except NodeError as exc:
            return [exc]
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(frame),
                                **bound)
    unpacker.feed(frame)
    out: list[tuple[int, str, dict[str, Any]] | NodeError] = []
    end = 0  # where the last whole request ended (``tell`` runs on into a partial one)
    try:
        left[0] = REQUEST_ITEMS_MAX
        for req in unpacker:
            end = unpacker.tell()
            if len(out) >= requests_max:
                rid = req.get("id") if type(req) is dict else None
                out.append(_error(rid if type(rid) is int else 0, ErrorCode.BAD_REQUEST,
                                  f"a frame carries at most {requests_max} requests; "
                                  f"this one and the rest of the frame were not read"))
                return out
            try:
                out.append(check_request(req))
            except NodeError as exc:
                out.append(exc)
            left[0] = REQUEST_ITEMS_MAX  # each request has the bound to itself
    except Exception as exc:
        if over_bounds(exc):
            out.append(_items_over(len(out)))
            return out
        why = str(exc) or type(exc).__name__
        out.append(_error(0, ErrorCode.BAD_REQUEST, f"request is not msgpack: {why}"))
        return out
    if end != len(frame):
        out.append(_error(0, ErrorCode.BAD_REQUEST, "request is not msgpack: the frame ends "
                          "inside a message"))
    return out


def _items_over(read: int) -> NodeError:
    """The answer to a request that decodes to more than any request holds: it ends the
    frame (its id is not read)."""
    return _error(0, ErrorCode.BAD_REQUEST,
                  f"request {read + 1} of the frame decodes to more than any request holds "
                  f"(at most {REQUEST_ITEMS_MAX} map and array items, {REQUEST_ARRAY_LEN_MAX} "
                  f"in one array, {REQUEST_MAP_LEN_MAX} in one map); it and the rest of the "
                  f"frame were not read")


def check_request(req: Any) -> tuple[int, str, dict[str, Any]]:
    """Check one decoded request against ``OPS``; return ``(id, op, fields)``, or raise the
    ``NodeError`` naming the first field that is wrong."""
    if type(req) is not dict:
        raise _error(0, ErrorCode.BAD_REQUEST, "request must be a msgpack map")
    rid = req.get("id")
    if type(rid) is not int:
        raise _error(0, ErrorCode.BAD_REQUEST, "request needs an integer 'id'")
    op = req.get("op")
    checks = _CHECKS.get(op) if type(op) is str else None
    if checks is None or not isinstance(op, str):
        raise _error(rid, ErrorCode.UNKNOWN_OP, f"unknown op {op!r}; known: {sorted(OPS)}")
    present = 2  # "op" and "id"
    for name, types, required, non_negative in checks:
        if name not in req:
            if required:
                raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: missing field '{name}'")
            continue
        present += 1
        value = req[name]
        if type(value) not in types:
            raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: field '{name}' must be "
                         f"{_type_names(types, ' or ')}, got {type(value).__name__}")
        if non_negative and type(value) is int and not 0 <= value <= OFFSET_MAX:
            raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: field '{name}' is out of range")
    if len(req) != present:
        extra = set(req) - _NAMES[op] - {"op", "id"}
        raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: unknown fields {sorted(map(repr, extra))}")
    for name, limit in _BOUNDED[op]:
        value = req.get(name)
        if isinstance(value, (str, bytes)) and len(value) > limit:
            raise _error(rid, ErrorCode.BAD_REQUEST, f"{op}: field '{name}' is longer than {limit}")
    return rid, op, req


def check_once_writes(rid: int, txn: int, writes: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """The writes of a ``txn_once`` request, each checked as the request it stands for (its
    ``txn`` and ``seq``, its place, filled in): ``[(op, fields), ...]``; or raise the
    ``NodeError`` naming the first write that is wrong."""
    if not 1 <= len(writes) <= TXN_ONCE_WRITES_MAX:
        raise _error(rid, ErrorCode.BAD_REQUEST, f"txn_once: {len(writes)} writes; it takes 1 "
                     f"to {TXN_ONCE_WRITES_MAX} (a larger transaction: txn_begin, its writes, "
                     f"txn_commit)")
    out = []
    for seq, write in enumerate(writes):
        op = write.get("op") if type(write) is dict else None
        if op not in TXN_ONCE_OPS:
            raise _error(rid, ErrorCode.BAD_REQUEST, f"txn_once: write {seq} must be a map with "
                         f"'op' one of {sorted(TXN_ONCE_OPS)}")
        if "id" in write or "txn" in write or "seq" in write:
            raise _error(rid, ErrorCode.BAD_REQUEST, f"txn_once: write {seq} must not carry "
                         f"'id', 'txn' or 'seq' (the request's id and txn, and its place, are "
                         f"theirs)")
        try:
            _rid, _op, fields = check_request({**write, "id": rid, "txn": txn, "seq": seq})
        except NodeError as exc:
            raise _error(rid, exc.code, f"txn_once: write {seq}: {exc.message}") from None
        out.append((op, fields))
    return out


def _type_names(types: tuple[type, ...], sep: str) -> str:
    return sep.join("nil" if t is type(None) else t.__name__ for t in types)


def request_ids(frame: bytes | memoryview, requests_max: int) -> list[int]:
    """The ids of the requests of a frame that is not decoded (one over the size limit),
    so that each is answered under its own id: every map's keys are read, and every value
    but the id's is skipped, not decoded. ``[0]`` when none is found (not msgpack, or no
    id): a client waiting for its id would otherwise hear nothing and send it again."""
    small = REQUEST_MAP_LEN_MAX  # a key, or an id, decodes to no more (``skip`` is not bound)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(frame),
                                max_str_len=small, max_bin_len=small, max_ext_len=small,
                                max_array_len=small, max_map_len=small)
    unpacker.feed(frame)
    ids: list[int] = []
    try:
        while len(ids) < requests_max and unpacker.tell() < len(frame):
            rid = 0
            for _ in range(min(unpacker.read_map_header(), REQUEST_MAP_LEN_MAX)):
                if unpacker.unpack() == "id":
                    got = unpacker.unpack()
                    rid = got if type(got) is int else 0
                else:
                    unpacker.skip()
            ids.append(rid)
    except Exception:  # not a map, not msgpack, cut short: what was read so far
        pass
    return [rid for rid in ids if rid] or [0]


def _error(rid: int, code: ErrorCode, text: str) -> NodeError:
    err = NodeError(text, code)
    err.request_id = rid  # type: ignore[attr-defined]
    return err


def kv_topic(namespace: str) -> str:
    """The catalog name of a KV namespace's topic."""
    return KV_PREFIX + namespace


def check_name(what: str, name: str) -> None:
    if not NAME_RE.match(name):
        raise BadRequest(
            f"{what} {name!r} is not valid: 1-200 characters of letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit", ErrorCode.INVALID_NAME)


def ok(rid: int, **fields: Any) -> bytes:
    """A reply: ``fields`` (in the order the table lists them), then ``id`` and ``ok``."""
    fields["id"] = rid
    fields["ok"] = True
    return pack_map(fields)


def error(rid: int, code: int, text: str) -> bytes:
    return pack({"id": rid, "ok": False, "code": int(code), "error": text})


def join_frames(frames: list[bytes], bytes_max: int = REPLY_FRAME_BYTES_MAX) -> list[bytes]:
    """Concatenate encoded maps into as few frames as keep each under ``bytes_max``
    (a map larger than that travels alone)."""
    if len(frames) == 1:
        return frames
    out: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for f in frames:
        if run and size + len(f) > bytes_max:
            out.append(b"".join(run))
            run, size = [], 0
        run.append(f)
        size += len(f)
    if run:
        out.append(b"".join(run))
    return out


# ---- the client's side ---------------------------------------------------------------


def request_map(op: str, rid: int, fields: Mapping[str, Any],
                id_first: bool = False) -> dict[str, Any]:
    """The request map of ``op`` with ``fields``, their keys in the table's order, then
    ``op`` and ``id``; or ``op`` and ``id`` first with ``id_first`` (the Pipeline's order:
    both are kept as they were, and so are the bytes on the wire). Raises ``NodeError`` for
    an unknown op, or a field that is unknown or missing, as the node would; values are the
    node's to check."""
    orders = _ORDERS.get(op)
    if orders is None:
        raise NodeError(f"unknown op {op!r}; known: {sorted(OPS)}", ErrorCode.UNKNOWN_OP)
    if tuple(fields) not in orders:  # not in the table's order, or not the op's fields
        extra = fields.keys() - _NAMES[op]
        if extra:
            raise BadRequest(f"{op}: unknown fields {sorted(map(repr, extra))}")
        for f in OPS[op].request:
            if f.required and f.name not in fields:
                raise BadRequest(f"{op}: missing field '{f.name}'")
        fields = {f.name: fields[f.name] for f in OPS[op].request if f.name in fields}
    return {"op": op, "id": rid, **fields} if id_first else {**fields, "op": op, "id": rid}


def pack_request(op: str, rid: int, fields: Mapping[str, Any]) -> bytes:
    """``request_map`` packed. A field msgpack cannot carry (an integer outside -2**63 ..
    2**64 - 1, an object of a type it does not know) raises ``BadRequest`` naming it, as
    the node refuses a field out of its range, not msgpack's own error."""
    try:
        return pack_map(request_map(op, rid, fields))
    except (OverflowError, TypeError, ValueError):
        for name, value in fields.items():
            try:
                pack(value)
            except (OverflowError, TypeError, ValueError) as exc:
                raise BadRequest(f"{op}: field {name!r} cannot be sent ({exc}): "
                                 f"{_shown(value)}") from None
        raise


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_reply(op: str, reply: Mapping[str, Any]) -> None:
    """Raise ``NodeError`` (INTERNAL) if a successful reply to ``op`` lacks a field the
    table says it carries."""
    missing = [f.name for f in OPS[op].reply if f.required and f.name not in reply]
    if missing:
        raise NodeError(f"the reply to {op} lacks {missing}", ErrorCode.INTERNAL)


def unpack_replies(frame: bytes) -> list[dict[str, Any]]:
    """Every reply map of a frame (the node may join several into one). A frame that does
    not decode, ends inside a message, or holds anything but maps was not written by a node
    (a wrong peer, or a protocol bug): ``ValueError``, naming what is wrong, and none of
    the frame's replies is to be trusted."""
    try:  # most frames carry one reply: one call, without an Unpacker's set-up
        one = msgpack.unpackb(frame, raw=False)
    except msgpack.ExtraData:
        pass
    except ValueError as exc:
        raise ValueError(f"reply frame does not decode: {exc}") from None
    else:
        if type(one) is not dict:
            raise _not_a_reply(one, 0)
        return [one]
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(frame) or 1)
    unpacker.feed(frame)
    replies = []
    end = 0
    for reply in unpacker:
        if type(reply) is not dict:
            raise _not_a_reply(reply, end)
        end = unpacker.tell()
        replies.append(reply)
    if end != len(frame):
        raise ValueError("reply frame ends inside a message")
    return replies


def _not_a_reply(value: object, at: int) -> ValueError:
    return ValueError(f"reply frame holds {value!r:.60} ({type(value).__name__}) at byte "
                      f"{at}: not a reply map")


# ---- the docs ------------------------------------------------------------------------

_MSGPACK_NAMES = {int: "int", str: "str", bytes: "bin", type(None): "nil", list: "array",
                  dict: "map", bool: "bool"}


def describe_field(f: Field) -> str:
    """A field's name, msgpack type and bounds, as the protocol's table shows them."""
    kind = (f"[[{', '.join(f.row)}], ...]" if f.row
            else " or ".join(_MSGPACK_NAMES[t] for t in f.types))
    text = f"`{f.name}`{'' if f.required else '?'} {kind}"
    if f.non_negative:
        text += " ≥ 0"
    if f.len_max:
        text += f" of ≤ {f.len_max} {'chars' if f.types == (str,) else 'bytes'}"
    return text


def describe() -> str:
    """The protocol's table in markdown, as docs/ARCHITECTURE.md carries it: every op with
    its request and reply fields (``?``: optional), then what each field means."""
    lines = ["| op | request fields | reply fields | does |", "| --- | --- | --- | --- |"]
    meanings: dict[str, list[tuple[str, list[str]]]] = {}  # name → [(meaning, ops)]
    for op in OPS.values():
        request = "; ".join(describe_field(f) for f in op.request) or "—"
        reply = "; ".join(describe_field(f) for f in op.reply)
        does = op.doc + ("" if op.retry else " (the client does not retry it)")
        lines.append(f"| `{op.name}` | {request} | {reply} | {does} |")
        for side, fields in (("request", op.request), ("reply", op.reply)):
            for f in fields:
                seen = meanings.setdefault(f"{f.name}` ({side}", [])
                for doc, ops in seen:
                    if doc == f.doc:
                        ops.append(op.name)
                        break
                else:
                    seen.append((f.doc, [op.name]))
    lines.append("")
    for key, docs in meanings.items():
        for doc, ops in docs:
            where = f", {', '.join(ops)}" if len(docs) > 1 else ""
            lines.append(f"- `{key}{where}): {doc}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(describe(), end="")
