"""RabbitMQ quorum-queue client workloads (aio-pika), run inside client processes: publish
with publisher confirms (a batch outstanding, or one message from each of many writers)
and consume with acknowledgements. A quorum queue confirms a message once its log is
fdatasync'ed. ``aio_pika`` is imported inside each function: it comes with the ``bench``
extra, which the modules that only judge rows do not need.

A topic's partition ``p`` is the quorum queue ``f"{topic}:{p}"``, declared by the server
(``RabbitServer.create_topic``) before the clients start.
"""

from __future__ import annotations

import asyncio
import random
import time

from ..clients import Gate, Job, Payload, start_clock
from ..measure import ClientResult
from ..settings import DRAIN_TIMEOUT_S

CONNECT_TIMEOUT_S = 30.0
CONFIRM_TIMEOUT_S = 30.0  # a batch's confirms, or one delivery, must come within this


def queue_of(job: Job) -> str:
    return f"{job.name}:{job.partition}"


def rabbitmq_produce(job: Job, gate: Gate) -> ClientResult:
    """Publishes into the job's queue ``job.batch`` messages at a time with publisher
    confirms: the whole batch goes out, then the producer waits for all its confirms (as a
    Redis pipeline waits for its replies). Latency: per batch."""
    import aio_pika

    assert not job.keyed, "a queue has no keyed records"
    queue = queue_of(job)
    messages = [aio_pika.Message(v, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                for v in Payload(job).values]
    res = ClientResult()

    async def main() -> None:
        connection = await aio_pika.connect(job.target, timeout=CONNECT_TIMEOUT_S)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = channel.default_exchange
            await asyncio.to_thread(gate.wait)
            budget = start_clock(job, res)
            while n := budget.next_count(res.records, job.batch):
                t0 = time.monotonic()
                await asyncio.wait_for(
                    asyncio.gather(*(exchange.publish(m, queue) for m in messages[:n])),
                    timeout=CONFIRM_TIMEOUT_S)
                res.took(t0, time.monotonic(), n, n * job.size)

    asyncio.run(main())
    return res


def rabbitmq_produce_single(job: Job, gate: Gate) -> ClientResult:
    """``job.concurrency`` concurrent writers on one channel, each publishing one message and
    waiting for its confirm, again and again. Latency: per message."""
    import aio_pika

    queue = queue_of(job)
    message = aio_pika.Message(random.Random(job.index).randbytes(job.size),
                               delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    res = ClientResult()

    async def main() -> None:
        connection = await aio_pika.connect(job.target, timeout=CONNECT_TIMEOUT_S)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = channel.default_exchange
            await asyncio.to_thread(gate.wait)
            res.started = time.monotonic()
            deadline = res.started + job.seconds

            async def writer() -> None:
                while time.monotonic() < deadline:
                    t0 = time.monotonic()
                    await exchange.publish(message, queue, timeout=CONFIRM_TIMEOUT_S)
                    res.took(t0, time.monotonic(), 1, job.size)

            await asyncio.wait_for(asyncio.gather(*(writer() for _ in range(job.concurrency))),
                                   timeout=job.seconds + DRAIN_TIMEOUT_S)

    asyncio.run(main())
    return res


def rabbitmq_read_tail(job: Job, gate: Gate) -> ClientResult:
    """Consumes ``job.records_max`` messages from the job's queue in batches of
    ``job.batch``, acknowledging each batch at once (``multiple``), with twice a batch
    prefetched so deliveries do not wait for the acknowledgement. Latency: per batch. The
    acknowledged messages leave the queue."""
    import aio_pika

    res = ClientResult()

    async def main() -> None:
        connection = await aio_pika.connect(job.target, timeout=CONNECT_TIMEOUT_S)
        async with connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=2 * job.batch)
            queue = await channel.get_queue(queue_of(job))
            await asyncio.to_thread(gate.wait)
            budget = start_clock(job, res)
            async with queue.iterator(timeout=CONFIRM_TIMEOUT_S) as deliveries:
                while n := budget.next_count(res.records, job.batch):
                    t0 = time.monotonic()
                    for got in range(n):
                        try:
                            message = await anext(deliveries)
                        except TimeoutError:
                            raise AssertionError(f"queue ended after {res.records + got} "
                                                 f"messages") from None
                        res.payload_bytes += len(message.body)
                    await message.ack(multiple=True)
                    res.finished = time.monotonic()
                    res.latencies_s.append(res.finished - t0)
                    res.records += n

    asyncio.run(main())
    return res
