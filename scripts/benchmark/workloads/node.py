"""shardnode's client workloads, run inside client processes: produce (batched, single,
paced, in transactions), read (tail, by key), key/value (get, put, CAS; one at a time or
many in flight) and the checkpointer of the checkpoint scenario."""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import time
from collections.abc import Iterator
from typing import Any

import zmq

from node.client import NodeClient, NodeError, Pipeline, Record
from wire.packer import pack
from wire.protocol import request_map, unpack_replies
from wire.records import pack_batch, unpack_read

from ..clients import (
    Budget,
    Gate,
    Job,
    Payload,
    key_of,
    kv_key_numbers,
    start_clock,
    value_of,
)
from ..measure import ClientResult
from ..settings import (
    CAS,
    CKPT_LATE_S,
    CKPT_TIMEOUT_MS,
    DRAIN_TIMEOUT_S,
    GET,
    PUT,
    READ_BY_KEY,
    TXN_OPS,
)


@contextlib.contextmanager
def started(job: Job, gate: Gate, res: ClientResult) -> Iterator[tuple[NodeClient, Budget]]:
    """A client of the node that knows the topic's partitions, and, once the go signal came,
    the client's started clock and budget. A target of several endpoints, comma-separated,
    is a cluster: the client routes each request to its partition's owner."""
    target = job.target.split(",") if "," in job.target else job.target
    with NodeClient(target, timeout_ms=30_000) as c:
        c.partitions(job.name)
        if isinstance(target, list):
            c.owners(job.name)  # the map, before the clock starts
        gate.wait()
        yield c, start_clock(job, res)


def sn_produce(job: Job, gate: Gate) -> ClientResult:
    """Batches of ``job.batch`` records, one produce request at a time, each acknowledged
    once durable. Unkeyed records go to ``job.partition``; keyed ones by key hash."""
    payload = Payload(job)
    res = ClientResult()
    with started(job, gate, res) as (c, budget):
        while n := budget.next_count(res.records, job.batch):
            keys, values = payload.batch(res.records, n)
            records: list[Record] | list[bytes] = values if keys is None else \
                [Record(v, k) for k, v in zip(keys, values, strict=True)]
            t0 = time.monotonic()
            offsets = c.produce_batch(job.name, records, None if job.keyed else job.partition)
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if len(offsets) != n:
                raise AssertionError(f"{n} records produced, {len(offsets)} offsets answered")
            res.records += n
            res.payload_bytes += n * job.size
            res.last = str(offsets[-1][1])
    return res


def sn_transact(job: Job, gate: Gate) -> ClientResult:
    """Transactions of ``job.batch`` records to ``job.partition``, one at a time: begin, one
    produce_batch and commit, through the client's ``Transaction``, which queues the first
    two and sends the whole transaction as one ``txn_once`` request at the commit
    (answered once durable). Latency: per transaction, and per call in ``ops_s``
    (TXN_OPS: begin, produce, commit)."""
    assert not job.keyed
    payload = Payload(job)
    res = ClientResult()
    begin, produce, commit = (res.ops_s.setdefault(op, []) for op in TXN_OPS)
    with started(job, gate, res) as (c, budget):
        while n := budget.next_count(res.records, job.batch):
            _keys, values = payload.batch(res.records, n)
            t0 = time.monotonic()
            tx = c.transaction()
            t1 = time.monotonic()
            tx.produce_batch(job.name, values, job.partition)
            t2 = time.monotonic()
            result = tx.commit()
            t3 = time.monotonic()
            begin.append(t1 - t0)
            produce.append(t2 - t1)
            commit.append(t3 - t2)
            committed = sum(part.record_count for part in result.parts)
            if committed != n or [p for p, _ in result.offsets[0]] != [job.partition] * n:
                raise AssertionError(f"{n} records to partition {job.partition} committed as "
                                     f"{result.parts}")
            res.took(t0, t3, n, n * job.size)
            res.last = str(result.offsets[0][-1][1])
    return res


def take_answers(pipe: Pipeline, sent: dict[int, float], res: ClientResult, wait_ms: int,
                 records: int, size: int, keep_sends: bool = False) -> None:
    """Collect what ``pipe`` answers within ``wait_ms`` for the requests in ``sent`` (request
    id → send time), each of ``records`` records of ``size`` bytes: count them and their
    latency (and send time, with ``keep_sends``), or one error per failed request."""
    for rid, out in pipe.poll(wait_ms):
        t = time.monotonic()
        t0 = sent.pop(rid)
        if isinstance(out, NodeError):
            res.errors += 1
            continue
        res.records += records
        res.payload_bytes += records * size
        if keep_sends:
            res.sends_s.append(t0)
        res.latencies_s.append(t - t0)
        res.finished = t


def sn_produce_single(job: Job, gate: Gate) -> ClientResult:
    """Single-record produce requests, ``job.concurrency`` of them in flight at once (on a
    cluster, comma-separated endpoints: a routed pipeline, each to its partition's owner)."""
    value = random.Random(job.index).randbytes(job.size)
    blob = pack_batch([value])
    res = ClientResult()
    sent: dict[int, float] = {}
    target = job.target.split(",") if "," in job.target else job.target
    with NodeClient(target, timeout_ms=30_000) as c:
        c.partitions(job.name)
        if isinstance(target, list):
            c.owners(job.name)  # the map, before the clock starts
        pipe = c.pipeline()
        gate.wait()
        res.started = time.monotonic()
        deadline = res.started + job.seconds
        while True:
            now = time.monotonic()
            if now < deadline:
                while len(sent) < job.concurrency:
                    sent[pipe.submit(job.name, [value], job.partition, blob=blob)] = now
            elif not sent or now > deadline + DRAIN_TIMEOUT_S:
                break
            take_answers(pipe, sent, res, 100, records=1, size=job.size)
        res.errors += len(sent)  # never answered within the drain time
    return res


def sn_read_tail(job: Job, gate: Gate) -> ClientResult:
    """Read a partition from offset 0 to ``job.records_max`` in reads of ``job.batch``."""
    res = ClientResult()
    with NodeClient(job.target, timeout_ms=30_000) as c:
        gate.wait()
        budget = start_clock(job, res)
        while n := budget.next_count(res.records, job.batch):
            t0 = time.monotonic()
            records = c.read(job.name, job.partition, res.records, n)
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if not records or records[0].offset != res.records or \
                    records[-1].offset != res.records + len(records) - 1:
                raise AssertionError(f"read at offset {res.records}: got offsets "
                                     f"{[r.offset for r in records[:1] + records[-1:]]}")
            res.records += len(records)
            res.payload_bytes += sum(len(r.value) for r in records)
    return res


def sn_read_key(job: Job, gate: Gate) -> ClientResult:
    """Random ``read_by_key`` calls, one at a time, each checked against its key."""
    rng = random.Random(job.seed * 1000 + job.index)
    res = ClientResult()
    with started(job, gate, res) as (c, budget):
        while budget.next_count(res.records, 1):
            i = rng.randrange(job.keys)
            t0 = time.monotonic()
            record = c.read_by_key(job.name, key_of(i))
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if record is None or record.value != value_of(i, job.size):
                res.errors += 1
            res.records += 1
            res.payload_bytes += job.size
    return res


def sn_produce_paced(job: Job, gate: Gate) -> ClientResult:
    """Open loop: a batch of ``job.batch`` records to ``job.partition`` every
    ``batch / rate`` seconds on a monotonic schedule (send k is due at start + k·interval),
    whether or not earlier ones were answered (at most ``job.concurrency`` in flight), so a
    stalled acknowledgement never postpones the sends behind it. Records (send, ack) per
    request in ``sends_s`` and ``latencies_s``."""
    values = Payload(job).values
    blob = pack_batch(values)
    interval = job.batch / job.rate
    res = ClientResult()
    sent: dict[int, float] = {}
    with NodeClient(job.target, timeout_ms=30_000) as c:
        c.partitions(job.name)
        pipe = c.pipeline()
        gate.wait()
        res.started = time.monotonic()
        end = res.started + job.seconds
        first = res.started + interval * random.Random(job.index).random()  # stagger clients
        k = 0
        while True:
            now = time.monotonic()
            due = first + k * interval
            if due < end:
                if now >= due and len(sent) < job.concurrency:
                    sent[pipe.submit(job.name, values, job.partition, blob=blob)] = now
                    if now - due > CKPT_LATE_S:
                        res.late += 1
                    k += 1
                    continue
                wait_ms = 1 if now >= due else math.ceil((due - now) * 1000)
            elif not sent or now > end + DRAIN_TIMEOUT_S:
                break
            else:
                wait_ms = 100
            take_answers(pipe, sent, res, wait_ms, records=job.batch, size=job.size,
                         keep_sends=True)
        res.errors += len(sent)  # never answered within the drain time
    return res


def sn_checkpointer(job: Job, gate: Gate) -> ClientResult:
    """Checkpoints back to back for ``job.seconds``: one waits ``job.gap_s`` after the start
    and after each checkpoint ends; records each one's [start, end] in ``intervals``."""
    res = ClientResult()
    with NodeClient(job.target, timeout_ms=CKPT_TIMEOUT_MS, retries=0) as c:
        gate.wait()
        res.started = time.monotonic()
        end = res.started + job.seconds
        next_start = res.started + job.gap_s  # the producers run alone first
        while next_start < end:
            time.sleep(max(0.0, next_start - time.monotonic()))  # until a deadline: no drift
            t0 = time.monotonic()
            try:
                c.checkpoint()
            except NodeError:  # abandoned or timed out: it still ran over this interval
                res.errors += 1
            t1 = time.monotonic()
            res.intervals.append((t0, t1))
            next_start = t1 + job.gap_s
        res.finished = time.monotonic()
    return res


# ---- key/value: the kv scenario (scenarios/kv.py) ------------------------------------

KV_COUNTER = b"counter"  # the key the CAS rows increment (one per client: ``counter-<i>``)
# Request ids of the kv workload's raw frames: far above the client's own, so a late
# answer to one of the client's calls is never taken for one of these.
KV_FIRST_ID = 1 << 40


def sn_kv(job: Job, gate: Gate) -> ClientResult:
    """The kv scenario's work on the node, ``job.op`` on random keys of ``job.keys`` (a fill:
    puts of keys ``first..`` in order): ``get`` (kv_get of namespace ``job.name``), ``put``
    (kv_put of the key's value, answered once durable), ``read_by_key`` (of the keyed topic
    ``job.name``) — one call at a time when ``job.concurrency`` is 1, else that many requests
    in flight on the client's socket; ``cas``: increments of a counter, one at a time, each a
    kv_get and a kv_cas from the value read to the next. Every value read is checked against
    its key: a wrong one counts as an error."""
    res = ClientResult()
    with NodeClient(job.target, timeout_ms=30_000) as c:
        if job.op == READ_BY_KEY:
            c.partitions(job.name)  # the key → partition map, before the clock starts
        if job.op == CAS:
            c.kv_put(job.name, _counter(job), b"0")
        gate.wait()
        budget = start_clock(job, res)
        if job.op == CAS:
            _sn_cas(c, job, budget, res)
        elif job.concurrency == 1:
            _sn_kv_one(c, job, budget, res)
        else:
            _sn_kv_many(c, job, budget, res)
    return res


def _counter(job: Job) -> bytes:
    return KV_COUNTER + b"-%d" % job.index


def _sn_kv_one(c: NodeClient, job: Job, budget: Budget, res: ClientResult) -> None:
    number = kv_key_numbers(job)
    while budget.next_count(res.records, 1):
        i = number(res.records)
        key, value = key_of(i), value_of(i, job.size)
        t0 = time.monotonic()
        got: bytes | None = value
        if job.op == PUT:
            c.kv_put(job.name, key, value)
        elif job.op == GET:
            got = c.kv_get(job.name, key)
        else:
            record = c.read_by_key(job.name, key)
            got = None if record is None else record.value
        res.took(t0, time.monotonic(), 1, job.size)
        if got != value:
            res.errors += 1


def _sn_cas(c: NodeClient, job: Job, budget: Budget, res: ClientResult) -> None:
    counter = _counter(job)
    while budget.next_count(res.records, 1):
        t0 = time.monotonic()
        old = c.kv_get(job.name, counter)
        if old is None or not c.kv_cas(job.name, counter, old, b"%d" % (int(old) + 1)):
            raise AssertionError(f"CAS on {counter!r} from {old!r} failed: one client alone "
                                 f"increments it")
        res.took(t0, time.monotonic(), 1, len(old))


def _sn_kv_many(c: NodeClient, job: Job, budget: Budget, res: ClientResult) -> None:
    """``job.concurrency`` requests in flight, as raw request maps on the client's socket
    (the client's ``Pipeline`` carries produce requests only): each round sends what
    answers freed up as one frame, then reads the answers."""
    number = kv_key_numbers(job)
    ids = itertools.count(KV_FIRST_ID)
    sent: dict[int, tuple[float, int]] = {}  # request id → (send time, key number)
    issued = 0
    sock = c.sock
    while True:
        now = time.monotonic()
        frames = []
        while len(sent) < job.concurrency and budget.next_count(issued, 1):
            i = number(issued)
            rid = next(ids)
            op, fields = _kv_request(c, job, i)
            frames.append(pack(request_map(op, rid, fields, id_first=True)))
            sent[rid] = (now, i)
            issued += 1
        if frames:
            sock.send(b"".join(frames))
        elif not sent or now > budget.deadline + DRAIN_TIMEOUT_S:
            break
        if not sock.poll(100, zmq.POLLIN):
            continue
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            t = time.monotonic()
            for reply in unpack_replies(frame):
                answered = reply.get("id")
                if type(answered) is not int or answered not in sent:
                    continue  # a late answer to the client's own call
                t0, i = sent.pop(answered)
                if not reply.get("ok") or (job.op != PUT and
                                           _read_value(job, reply) != value_of(i, job.size)):
                    res.errors += 1
                    continue
                res.took(t0, t, 1, job.size)
    res.errors += len(sent)  # never answered within the drain time


def _kv_request(c: NodeClient, job: Job, i: int) -> tuple[str, dict[str, Any]]:
    key = key_of(i)
    if job.op == GET:
        return "kv_get", {"namespace": job.name, "key": key}
    if job.op == PUT:
        return "kv_put", {"namespace": job.name, "key": key, "value": value_of(i, job.size),
                          "producer_id": c.producer_id, "seq": c.next_seq()}
    assert job.op == READ_BY_KEY, job.op
    return "read_by_key", {"topic": job.name, "partition": c.key_partition(job.name, key),
                           "key": key}


def _read_value(job: Job, reply: dict[str, Any]) -> bytes | None:
    """The value the answer to a get or a read_by_key carries."""
    if job.op == GET:
        value: bytes | None = reply.get("value")
        return value
    rows = unpack_read(reply["records"])
    return rows[0].value if rows else None
