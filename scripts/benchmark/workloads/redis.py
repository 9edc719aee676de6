"""Redis Streams client workloads (redis-py), run inside client processes: XADD pipelined
or concurrent or in MULTI/EXEC transactions, XRANGE, HSET/HGET for keyed records, and
GET, SET, WATCH/MULTI/EXEC for the kv scenario. ``redis`` is imported inside each
function: it comes with the ``bench`` extra, which the modules that only judge rows do not
need."""

from __future__ import annotations

import collections
import contextlib
import random
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from ..clients import Gate, Job, Payload, key_of, kv_key_numbers, start_clock, value_of
from ..measure import ClientResult
from ..settings import CAS, DRAIN_TIMEOUT_S, GET, PUT, READ_BY_KEY

if TYPE_CHECKING:
    import redis as redis_lib


def _redis_address(target: str) -> tuple[str, int]:
    host, port = target.rsplit(":", 1)
    return host, int(port)


@contextlib.contextmanager
def _connected(job: Job) -> Iterator[redis_lib.Redis]:
    """A connection to the job's Redis, answered a PING; closed on leaving."""
    import redis

    host, port = _redis_address(job.target)
    r = redis.Redis(host=host, port=port, socket_timeout=30)
    try:
        r.ping()
        yield r
    finally:
        r.close()


def _stream(job: Job) -> str:
    return f"{job.name}:{job.partition}"


def redis_produce(job: Job, gate: Gate) -> ClientResult:
    """XADD pipelined ``job.batch`` at a time into the job's stream (keyed records: one
    HSET of the batch into the hash ``job.name``)."""
    return _batches(job, gate, transaction=False)


def redis_transact(job: Job, gate: Gate) -> ClientResult:
    """Transactions of ``job.batch`` XADDs into the job's stream, one at a time: MULTI, the
    XADDs, EXEC, sent in one round trip (redis-py's pipeline with ``transaction=True``);
    EXEC is answered once the AOF is fsync'ed (``appendfsync always``)."""
    assert not job.keyed
    return _batches(job, gate, transaction=True)


def _batches(job: Job, gate: Gate, transaction: bool) -> ClientResult:
    """A batch of ``job.batch`` records at a time, one round trip each: a pipeline of XADDs
    (or one HSET of keyed records), in MULTI/EXEC with ``transaction``."""
    payload = Payload(job)
    res = ClientResult()
    with _connected(job) as r:
        gate.wait()
        budget = start_clock(job, res)
        stream = _stream(job)
        while n := budget.next_count(res.records, job.batch):
            keys, values = payload.batch(res.records, n)
            t0 = time.monotonic()
            pipe = r.pipeline(transaction=transaction)
            if keys is None:
                for v in values:
                    pipe.xadd(stream, {b"v": v})
            else:
                pipe.hset(job.name, mapping=dict(zip(keys, values, strict=True)))
            replies = pipe.execute()
            res.took(t0, time.monotonic(), n, n * job.size)
            if transaction and len(replies) != n:
                raise AssertionError(f"EXEC of {n} XADDs answered {len(replies)} replies")
            if keys is None:
                res.last = replies[-1].decode()
    return res


def redis_produce_single(job: Job, gate: Gate) -> ClientResult:
    """``job.concurrency`` concurrent XADDs of one record each (redis.asyncio)."""
    import asyncio

    import redis.asyncio as aredis

    host, port = _redis_address(job.target)
    value = random.Random(job.index).randbytes(job.size)
    res = ClientResult()
    stream = _stream(job)

    async def main() -> None:
        r = aredis.Redis(host=host, port=port, socket_timeout=30,
                         max_connections=job.concurrency)
        try:
            await r.ping()
            gate.wait()
            res.started = time.monotonic()
            deadline = res.started + job.seconds

            async def writer() -> None:
                while time.monotonic() < deadline:
                    t0 = time.monotonic()
                    await r.xadd(stream, {b"v": value})
                    res.took(t0, time.monotonic(), 1, job.size)

            await asyncio.wait_for(asyncio.gather(*(writer() for _ in range(job.concurrency))),
                                   timeout=job.seconds + DRAIN_TIMEOUT_S)
        finally:
            await r.aclose()

    asyncio.run(main())
    return res


def redis_read_tail(job: Job, gate: Gate) -> ClientResult:
    """XRANGE ``job.batch`` entries at a time from the start of the stream."""
    res = ClientResult()
    with _connected(job) as r:
        gate.wait()
        budget = start_clock(job, res)
        start = "-"
        while n := budget.next_count(res.records, job.batch):
            t0 = time.monotonic()
            entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                           r.xrange(_stream(job), min=start, max="+", count=n))
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if not entries:
                raise AssertionError(f"stream ended after {res.records} entries")
            res.records += len(entries)
            res.payload_bytes += sum(len(e[1][b"v"]) for e in entries)
            start = "(" + entries[-1][0].decode()
    return res


def redis_read_key(job: Job, gate: Gate) -> ClientResult:
    """Random HGETs on the hash ``job.name``: Redis' nearest equivalent of read_by_key."""
    rng = random.Random(job.seed * 1000 + job.index)
    res = ClientResult()
    with _connected(job) as r:
        gate.wait()
        budget = start_clock(job, res)
        while budget.next_count(res.records, 1):
            i = rng.randrange(job.keys)
            t0 = time.monotonic()
            value = r.hget(job.name, key_of(i))
            res.finished = time.monotonic()
            res.latencies_s.append(res.finished - t0)
            if value != value_of(i, job.size):
                res.errors += 1
            res.records += 1
            res.payload_bytes += job.size
    return res


KV_FILL_BATCH = 1000  # an untimed fill's SETs per pipelined round trip


def _kv_key(job: Job, i: int) -> bytes:
    """Key ``i`` of the kv scenario's namespace ``job.name``: the name is its prefix."""
    return job.name.encode() + b":" + key_of(i)


def redis_kv(job: Job, gate: Gate) -> ClientResult:
    """The kv scenario's work on Redis, as ``sn_kv`` on the node: ``get`` (GET), ``put``
    (SET, answered once the AOF is fsync'ed: ``appendfsync always``), ``read_by_key`` (HGET
    on the hash ``job.name``) on random keys — one at a time when ``job.concurrency`` is 1,
    else that many in flight on one connection (``_kv_many``); ``cas``:
    increments of a counter, each WATCH, GET, MULTI, SET, EXEC (redis-py's pipeline: WATCH
    and GET a round trip each, MULTI/SET/EXEC one more). A fill (``job.records_max``) SETs
    keys ``first..`` in pipelined batches of KV_FILL_BATCH."""
    if job.records_max:
        return _kv_fill(job, gate)
    if job.concurrency > 1:
        return _kv_many(job, gate)
    number = kv_key_numbers(job)
    res = ClientResult()
    with _connected(job) as r:
        if job.op == CAS:
            counter = job.name.encode() + b":counter-%d" % job.index
            r.set(counter, b"0")
        gate.wait()
        budget = start_clock(job, res)
        while budget.next_count(res.records, 1):
            if job.op == CAS:
                t0 = time.monotonic()
                _redis_increment(r, counter)
                res.took(t0, time.monotonic(), 1, 0)
                continue
            i = number(res.records)
            value = value_of(i, job.size)
            t0 = time.monotonic()
            if job.op == PUT:
                r.set(_kv_key(job, i), value)
                got: Any = value
            elif job.op == GET:
                got = r.get(_kv_key(job, i))
            else:
                assert job.op == READ_BY_KEY, job.op
                got = r.hget(job.name, key_of(i))
            res.took(t0, time.monotonic(), 1, job.size)
            if got != value:
                res.errors += 1
    return res


def _redis_increment(r: redis_lib.Redis, counter: bytes) -> None:
    """WATCH the counter, GET it, MULTI, SET it one higher, EXEC: one client alone, so EXEC
    never finds it changed."""
    with r.pipeline() as pipe:
        cast(Any, pipe).watch(counter)  # redis-py leaves watch untyped
        old = int(cast(bytes, pipe.get(counter)))
        pipe.multi()
        pipe.set(counter, b"%d" % (old + 1))
        pipe.execute()  # raises WatchError had another client changed it


def _kv_fill(job: Job, gate: Gate) -> ClientResult:
    res = ClientResult()
    with _connected(job) as r:
        gate.wait()
        budget = start_clock(job, res)
        while n := budget.next_count(res.records, KV_FILL_BATCH):
            t0 = time.monotonic()
            pipe = r.pipeline(transaction=False)
            for i in range(job.first + res.records, job.first + res.records + n):
                pipe.set(_kv_key(job, i), value_of(i, job.size))
            pipe.execute()
            res.took(t0, time.monotonic(), n, n * job.size)
    return res


def _kv_many(job: Job, gate: Gate) -> ClientResult:
    """``job.concurrency`` requests in flight on one connection, as the node's client keeps
    them on one socket: the first ``concurrency`` sent, then each answer read lets the next
    request go (redis-py's connection: its packer and its reply parser). redis.asyncio with
    a connection per request in flight (ingest-single's way) answered fewer GETs/s here than
    one GET at a time: the client, not Redis, set the pace."""
    assert job.op in (GET, PUT, READ_BY_KEY), job.op
    number = kv_key_numbers(job)
    res = ClientResult()

    def command(i: int) -> tuple[Any, ...]:
        if job.op == PUT:
            return ("SET", _kv_key(job, i), value_of(i, job.size))
        if job.op == GET:
            return ("GET", _kv_key(job, i))
        return ("HGET", job.name, key_of(i))

    with _connected(job) as r:
        conn: Any = r.connection_pool.get_connection()  # redis-py leaves its methods untyped
        try:
            gate.wait()
            budget = start_clock(job, res)
            sent: collections.deque[tuple[float, int]] = collections.deque()  # in send order
            issued = 0
            while True:
                now = time.monotonic()
                batch = []
                while len(sent) < job.concurrency and budget.next_count(issued, 1):
                    i = number(issued)
                    batch.append(command(i))
                    sent.append((now, i))
                    issued += 1
                if batch:
                    conn.send_packed_command(conn.pack_commands(batch))
                elif not sent:
                    break
                t0, i = sent.popleft()  # Redis answers in order
                got = conn.read_response()
                res.took(t0, time.monotonic(), 1, job.size)
                if job.op != PUT and got != value_of(i, job.size):
                    res.errors += 1
        finally:
            r.connection_pool.release(conn)
    return res
