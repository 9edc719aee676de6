"""Client processes: a ``Job`` each, lined up at a ``Gate``, started together, reporting
one ``ClientResult`` through a queue (``run_clients``). Every wait has a timeout."""

from __future__ import annotations

import multiprocessing as mp
import queue
import random
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from .measure import ClientResult, RssSampler
from .settings import DRAIN_TIMEOUT_S, PREFILL_TIMEOUT_S, START_TIMEOUT_S


def key_of(i: int) -> bytes:
    return b"key-%012d" % i


def value_of(i: int, size: int) -> bytes:
    """A keyed record's value: its key number, padded; a read checks it against the key."""
    return (b"%016d" % i).ljust(size, b"v")


def kv_key_numbers(job: Job) -> Callable[[int], int]:
    """The key number of a client's ``n``-th request: an untimed fill (``records_max``)
    writes ``first``, ``first + 1``, ...; a timed run draws from ``job.keys`` at random."""
    if job.records_max:
        return lambda n: job.first + n
    rng = random.Random(job.seed * 1000 + job.index)
    return lambda _n: rng.randrange(job.keys)


@dataclass(frozen=True, slots=True)
class Job:
    """One client's work. ``seconds`` or ``records_max`` (or both) bound it."""

    index: int
    target: str             # node endpoint, redis "host:port", AMQP URL, or a directory
    name: str               # topic (redis: stream prefix, or hash for keyed records)
    partition: int = 0
    batch: int = 1000
    size: int = 100
    seconds: float = 0.0
    records_max: int = 0
    keyed: bool = False     # keyed records numbered from ``first``, partitioned by key
    first: int = 0
    keys: int = 0           # read-key: the key space to draw from
    concurrency: int = 1
    seed: int = 0
    rate: float = 0.0       # paced producer: records per second
    gap_s: float = 0.0      # checkpointer: pause after each checkpoint
    op: str = ""            # kv: get | put | cas | read_by_key (settings.GET, ...)

    def __post_init__(self) -> None:
        assert self.seconds > 0 or self.records_max > 0, "a job needs a bound"


class Budget:
    """How long a client goes on: until its time is up or it has done ``records_max``."""

    def __init__(self, job: Job) -> None:
        limit_s = job.seconds if job.seconds > 0 else PREFILL_TIMEOUT_S
        self.deadline = time.monotonic() + limit_s
        self.records_max = job.records_max

    def next_count(self, done: int, batch: int) -> int:
        """Records for the next request; 0 when the client is done."""
        if time.monotonic() >= self.deadline:
            return 0
        if self.records_max:
            return max(0, min(batch, self.records_max - done))
        return batch



def start_clock(job: Job, res: ClientResult) -> Budget:
    """The go signal came: start the client's clock, and its budget."""
    budget = Budget(job)
    res.started = time.monotonic()
    return budget

class Payload:
    """The records of one client: ``batch`` fixed random values, or keyed records."""

    def __init__(self, job: Job) -> None:
        self.job = job
        rng = random.Random(job.seed * 1000 + job.index)
        self.values = [] if job.keyed else [rng.randbytes(job.size) for _ in range(job.batch)]

    def batch(self, done: int, n: int) -> tuple[list[bytes] | None, list[bytes]]:
        """(keys or None, values) of the ``n`` records after the first ``done``."""
        if not self.job.keyed:
            return None, self.values if n == len(self.values) else self.values[:n]
        numbers = range(self.job.first + done, self.job.first + done + n)
        return [key_of(i) for i in numbers], [value_of(i, self.job.size) for i in numbers]


@dataclass(frozen=True, slots=True)
class Ready:
    index: int


@dataclass(frozen=True, slots=True)
class Finished:
    index: int
    result: ClientResult


@dataclass(frozen=True, slots=True)
class Failed:
    index: int
    error: str


class Gate:
    """A client's side of the start line: say it is ready, then wait for the start."""

    def __init__(self, index: int, reports: Any, go: Any) -> None:
        self.index, self.reports, self.go = index, reports, go

    def wait(self) -> None:
        self.reports.put(Ready(self.index))
        if not self.go.wait(START_TIMEOUT_S):
            raise TimeoutError(f"client {self.index}: no start signal in {START_TIMEOUT_S} s")


ClientFn = Callable[[Job, Gate], ClientResult]


def _client_main(fn: ClientFn, job: Job, reports: Any, go: Any) -> None:
    try:
        reports.put(Finished(job.index, fn(job, Gate(job.index, reports, go))))
    except BaseException:  # whatever it was, the parent must hear of it
        reports.put(Failed(job.index, traceback.format_exc()))


class ClientsFailed(RuntimeError):
    """A client process failed, died or did not finish in time."""


def run_clients(fn: ClientFn | Sequence[ClientFn], jobs: Sequence[Job],
                rss_of: Callable[[], list[psutil.Process]] | None = None,
                timeout_s: float | None = None) -> tuple[list[ClientResult], float | None]:
    """Run ``fn`` once per job (or ``fn[i]`` for job ``i``), each in its own process, all
    starting together.

    Returns the results in job order and the largest RSS (MB) of ``rss_of()`` — or of the
    client processes themselves when it is None — seen while they ran.
    """
    fns = list(fn) if isinstance(fn, Sequence) else [fn] * len(jobs)
    assert len(fns) == len(jobs)
    what = "+".join(dict.fromkeys(f.__name__ for f in fns))
    ctx = mp.get_context("spawn")
    reports = ctx.Queue()
    go = ctx.Event()
    procs = [ctx.Process(target=_client_main, args=(f, job, reports, go), daemon=True,
                         name=f"{f.__name__}-{job.index}") for f, job in zip(fns, jobs, strict=True)]
    if timeout_s is None:
        longest = max(j.seconds for j in jobs)
        timeout_s = longest + DRAIN_TIMEOUT_S + 30 if longest > 0 else PREFILL_TIMEOUT_S
    results: dict[int, ClientResult] = {}
    ready: set[int] = set()

    def collect(until: Callable[[], bool], deadline: float, stage: str) -> None:
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientsFailed(f"{what}: clients not {stage} in time")
            try:
                msg = reports.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise ClientsFailed(f"client processes died: {dead}") from None
                continue
            if isinstance(msg, Failed):
                raise ClientsFailed(f"client {msg.index} of {what} failed:\n{msg.error}")
            if isinstance(msg, Ready):
                ready.add(msg.index)
            elif isinstance(msg, Finished):
                results[msg.index] = msg.result

    try:
        for p in procs:
            p.start()
        collect(lambda: len(ready) == len(jobs), time.monotonic() + START_TIMEOUT_S, "ready")
        live = [psutil.Process(p.pid) for p in procs if p.pid is not None]
        with RssSampler(rss_of or (lambda: live)) as rss:
            go.set()
            collect(lambda: len(results) == len(jobs), time.monotonic() + timeout_s, "finished")
    finally:
        finished = len(results) == len(jobs)
        for p in procs:
            p.join(timeout=5 if finished else 0)  # after a failure, end the others at once
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        reports.close()
    return [results[j.index] for j in jobs], rss.max_mb
