"""The options of the ``shardnode`` data source, read and checked once, on the driver.

Spark hands a data source its options as strings (``.option("maxRecordsPerRequest",
"2000")``), case-insensitively. Each reader and writer turns them into one of the frozen
records below before any task runs, so a bad option fails the query at its start with a
message naming the option, not a task later with a ``ValueError``. An option neither the
sink (``SINK_OPTIONS``) nor the source (``SOURCE_OPTIONS``) takes is refused, so that a
misspelled one is not silently ignored; Spark's own (``SPARK_OPTIONS``) pass.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from config.cluster import MEMBERS_MAX
from node.client import endpoint_problem
from wire.protocol import NAME_LEN_MAX

EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE)

# A sink id is part of every XA global id the sink writes (``node/spark/sink.py``): with
# ``/<batch id>`` after it, it must fit the XA limit of 64 bytes.
SINK_ID_BYTES_MAX = 40
# The node takes at most ``[limits] batch_records_max`` (10 000 by default) records and
# ``frame_bytes_max`` (16 MiB) bytes per request, and ``[txn] records_max`` (1 000 000) and
# ``bytes_max`` (256 MiB) per transaction.
RECORDS_PER_REQUEST_MAX = 10_000
REQUEST_BYTES_MAX = 15 << 20  # under the frame limit, with room for the request's fields
TXN_RECORDS_MAX = 1_000_000
TXN_BYTES_MAX = 256 << 20


# The options each side takes, as README.md's tables list them (a test keeps them in step).
SINK_OPTIONS = ("endpoint", "topic", "deliveryGuarantee", "sinkId", "maxRecordsPerRequest",
                "maxBytesPerRequest", "requestsInFlight", "maxRecordsPerTransaction",
                "maxBytesPerTransaction", "transactionTimeoutMs", "requestTimeoutMs")
SOURCE_OPTIONS = ("endpoint", "topic", "startingOffsets", "endingOffsets",
                  "maxRecordsPerTrigger", "maxRecordsPerPartition", "maxRecordsPerRead",
                  "groupId", "failOnDataLoss", "requestTimeoutMs")
# What Spark itself puts among a data source's options (PySpark 4): the path given to
# ``save``, ``load`` or ``start`` (``paths``: several given to ``load``), and a streaming
# query's ``checkpointLocation`` and ``queryName``. Names starting ``__`` are Spark's
# internal ones (``__partition_columns``, ``__clustering_columns``): passed too.
SPARK_OPTIONS = ("path", "paths", "checkpointLocation", "queryName")
_NAMES = frozenset(SINK_OPTIONS + SOURCE_OPTIONS)


class OptionError(ValueError):
    """An option of the ``shardnode`` data source is missing or wrong."""


def check_known(options: Mapping[str, str], side: str, known: tuple[str, ...],
                other: tuple[str, ...]) -> None:
    """Refuse the options the ``side`` (``sink`` or ``source``) does not take,
    case-insensitively (Spark hands the names over in lower case), each with the one meant
    when it is close, or saying that it is the other side's."""
    by_lower = {name.lower(): name for name in (*known, *SPARK_OPTIONS)}
    others = {name.lower() for name in other}
    unknown = sorted(k for k in options if k.lower() not in by_lower and not k.startswith("__"))
    if not unknown:
        return
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.8)
        if key.lower() in others:
            named.append(f"{key!r} (a {'source' if side == 'sink' else 'sink'} option)")
        elif close:
            named.append(f"{key!r} (did you mean {by_lower[close[0]]!r}?)")
        else:
            named.append(repr(key))
    raise OptionError(f"the shardnode {side} does not take option{'s' * (len(named) > 1)} "
                      f"{', '.join(named)}; it takes {', '.join(known)} (in any case)")


def _get(options: Mapping[str, str], name: str) -> str | None:
    assert name in _NAMES, f"option {name!r} is missing from SINK_OPTIONS or SOURCE_OPTIONS"
    # Spark's options are a case-insensitive dict; a plain dict (tests, the demo) is not.
    value = options.get(name)
    if value is None:
        value = options.get(name.lower())
    return value


def _int(options: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = _get(options, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, got {text!r}") from None
    if not low <= value <= high:
        raise OptionError(f"option {name!r} must be in {low}..{high}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise OptionError(f"option {name!r} must be true or false, got {text!r}")
    return text.lower() == "true"


def endpoints_of(options: Mapping[str, str]) -> tuple[str, ...]:
    """The option ``endpoint``: a node, or a cluster's members, comma-separated. One member
    of a cluster is enough (the clients learn the others from it, ``node/spark/nodes.py``);
    naming more lets them start from another when one is down."""
    text = _get(options, "endpoint")
    if not text:
        raise OptionError("option 'endpoint' is required (e.g. tcp://127.0.0.1:7400, or a "
                          "cluster's members, comma-separated)")
    endpoints = tuple(dict.fromkeys(e.strip() for e in text.split(",") if e.strip()))
    if not endpoints:
        raise OptionError(f"option 'endpoint' names no endpoint: {text!r}")
    if len(endpoints) > MEMBERS_MAX:
        raise OptionError(f"option 'endpoint' names {len(endpoints)} endpoints; a cluster has "
                          f"at most {MEMBERS_MAX} members")
    for e in endpoints:
        problem = endpoint_problem(e)
        if problem:
            raise OptionError(f"option 'endpoint': {e!r}: {problem}")
    return endpoints


def _topic(options: Mapping[str, str], required: bool) -> str | None:
    topic = _get(options, "topic")
    if topic is None and required:
        raise OptionError("option 'topic' is required")
    if topic is not None and not 0 < len(topic) <= NAME_LEN_MAX:
        raise OptionError(f"option 'topic' must be 1..{NAME_LEN_MAX} characters")
    return topic


@dataclass(frozen=True, slots=True)
class SinkOptions:
    endpoints: tuple[str, ...]  # a node, or members of a cluster
    topic: str | None  # None: each row's ``topic`` column names it
    guarantee: str
    sink_id: str | None  # None: the streaming query's id
    records_per_request_max: int
    request_bytes_max: int
    requests_in_flight_max: int
    records_per_txn_max: int
    txn_bytes_max: int
    txn_timeout_ms: int
    request_timeout_ms: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        check_known(options, "sink", SINK_OPTIONS, SOURCE_OPTIONS)
        guarantee = (_get(options, "deliveryGuarantee") or EXACTLY_ONCE).lower()
        if guarantee not in GUARANTEES:
            raise OptionError(f"option 'deliveryGuarantee' must be one of {GUARANTEES}, "
                              f"got {guarantee!r}")
        sink_id = _get(options, "sinkId")
        if sink_id is not None and not (0 < len(sink_id.encode()) <= SINK_ID_BYTES_MAX
                                        and "/" not in sink_id):
            raise OptionError(f"option 'sinkId' must be 1..{SINK_ID_BYTES_MAX} bytes without "
                              f"'/', got {sink_id!r}")
        opts = cls(
            endpoints=endpoints_of(options),
            topic=_topic(options, required=False),
            guarantee=guarantee,
            sink_id=sink_id,
            records_per_request_max=_int(options, "maxRecordsPerRequest", 5000, 1,
                                         RECORDS_PER_REQUEST_MAX),
            request_bytes_max=_int(options, "maxBytesPerRequest", 4 << 20, 1 << 16,
                                   REQUEST_BYTES_MAX),
            requests_in_flight_max=_int(options, "requestsInFlight", 16, 1, 1024),
            # A task with more stages them in several branches, all committed by the same
            # decision.
            records_per_txn_max=_int(options, "maxRecordsPerTransaction", 500_000, 1,
                                     TXN_RECORDS_MAX),
            txn_bytes_max=_int(options, "maxBytesPerTransaction", 128 << 20, 1 << 16,
                               TXN_BYTES_MAX),
            # How long a task's branch may stay unprepared before the node rolls it back
            # (a task that died mid-write); prepared branches never time out. A task
            # prepares a branch and begins another at half of it. At most the node's
            # ``[txn] timeout_ms_max``.
            txn_timeout_ms=_int(options, "transactionTimeoutMs", 300_000, 1000, 600_000),
            request_timeout_ms=_int(options, "requestTimeoutMs", 30_000, 100, 600_000),
        )
        if opts.records_per_txn_max < opts.records_per_request_max:
            raise OptionError("option 'maxRecordsPerTransaction' must be at least "
                              "'maxRecordsPerRequest'")
        if opts.txn_bytes_max < opts.request_bytes_max:
            raise OptionError("option 'maxBytesPerTransaction' must be at least "
                              "'maxBytesPerRequest'")
        return opts


def parse_offsets(text: str, name: str) -> dict[int, int] | str:
    """``earliest``, ``latest`` (in any case), or JSON ``{"partition": offset}``."""
    if text.strip().lower() in ("earliest", "latest"):
        return text.strip().lower()
    try:
        raw: Any = json.loads(text)
    except ValueError:
        raise OptionError(f"option {name!r} must be 'earliest', 'latest' or JSON like "
                          f'{{"0": 42}}, got {text!r}') from None
    if not isinstance(raw, dict):
        raise OptionError(f"option {name!r} must be a JSON object of partition: offset")
    out: dict[int, int] = {}
    for key, value in raw.items():
        try:
            partition = int(key)
        except ValueError:
            raise OptionError(f"option {name!r}: partition {key!r} is not an integer") from None
        if type(value) is not int:
            raise OptionError(f"option {name!r}: partition {key}'s offset must be an "
                              f"integer, not {value!r}")
        if value < 0 or partition < 0:
            raise OptionError(f"option {name!r}: partition {key} must map to an offset ≥ 0")
        out[partition] = value
    return out


# What a streaming read does with them (commit its progress as a consumer group's offsets;
# bound a micro-batch) a batch read has no place for.
STREAM_ONLY_OPTIONS = ("groupId", "maxRecordsPerTrigger")


@dataclass(frozen=True, slots=True)
class SourceOptions:
    endpoints: tuple[str, ...]  # a node, or members of a cluster
    topic: str
    starting: dict[int, int] | str
    ending: dict[int, int] | str
    records_per_trigger_max: int  # 0: no bound
    records_per_split_max: int
    records_per_read_max: int
    group_id: str | None
    request_timeout_ms: int
    fail_on_data_loss: bool  # records retention deleted before they were read fail the query

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool = False) -> SourceOptions:
        """``streaming``: for ``readStream``, which reads on as records come (no
        ``endingOffsets``)."""
        check_known(options, "source", SOURCE_OPTIONS, SINK_OPTIONS)
        if streaming and _get(options, "endingOffsets") is not None:
            raise OptionError("option 'endingOffsets' is for batch reads (spark.read); a "
                              "stream reads on as records come (stop it, or use "
                              "trigger(availableNow=True) to read what there is)")
        for name in () if streaming else STREAM_ONLY_OPTIONS:
            if _get(options, name) is not None:
                # Taken and ignored, a batch read looked as if it committed its progress.
                raise OptionError(f"option {name!r} is for streaming reads (readStream); a "
                                  f"batch read (spark.read) reads startingOffsets to "
                                  f"endingOffsets and commits nothing")
        topic = _topic(options, required=True)
        assert topic is not None
        group_id = _get(options, "groupId")
        if group_id is not None and not 0 < len(group_id) <= NAME_LEN_MAX:
            raise OptionError(f"option 'groupId' must be 1..{NAME_LEN_MAX} characters")
        ending = parse_offsets(_get(options, "endingOffsets") or "latest", "endingOffsets")
        if ending == "earliest":
            raise OptionError("option 'endingOffsets' must be 'latest' or JSON offsets")
        return cls(
            endpoints=endpoints_of(options),
            topic=topic,
            starting=parse_offsets(_get(options, "startingOffsets") or "earliest",
                                   "startingOffsets"),
            ending=ending,
            records_per_trigger_max=_int(options, "maxRecordsPerTrigger", 0, 0, 2**62),
            records_per_split_max=_int(options, "maxRecordsPerPartition", 200_000, 1, 2**62),
            records_per_read_max=_int(options, "maxRecordsPerRead", 5000, 1, 10_000),
            group_id=group_id,
            request_timeout_ms=_int(options, "requestTimeoutMs", 30_000, 100, 600_000),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        )
