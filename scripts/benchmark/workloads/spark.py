"""The bare ZeroMQ socket of the spark scenario: the ceiling of a Python data source's
write path, with nothing durable and nothing answered.

``BareZmqDataSource`` (format ``bench-zmq-push``) runs inside Spark's Python workers: each
task turns its Arrow batches into records as the shardnode sink does
(``node.spark.rows.requests_of``), packs them SPARK_FRAME_RECORDS to a frame with msgpack as
the sink packs a request, and PUSHes each frame, with its record count, to the endpoint
named by the option ``endpoint``. ``Drain`` runs in the bench: a PULL socket bound to a
free loopback port and a thread that counts the records of each frame it receives.

Spark's workers import this module by name (the data source is pickled by reference): they
inherit the bench's working directory, the repository root, where ``scripts`` is found.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import zmq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from node.spark.options import REQUEST_BYTES_MAX
from node.spark.rows import requests_of
from wire.packer import pack

from ..settings import (
    SPARK_DRAIN_POLL_MS,
    SPARK_FRAME_RECORDS,
    SPARK_LINGER_MS,
    SPARK_SEND_TIMEOUT_MS,
)

BARE_FORMAT = "bench-zmq-push"
COUNT_BYTES = 8  # a frame's first part: its record count, little-endian


class BareZmqDataSource(DataSource):
    """A write-only data source: rows PUSHed to a ZeroMQ socket, nothing kept."""

    @classmethod
    def name(cls) -> str:
        return BARE_FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        endpoint = self.options.get("endpoint")
        if not endpoint:
            raise ValueError(f"the {BARE_FORMAT} data source needs the option 'endpoint'")
        return BareWriter(endpoint)


@dataclass
class BareCommit(WriterCommitMessage):
    rows: int


class BareWriter(DataSourceArrowWriter):
    """Created on the driver, run by each task: one PUSH socket per task."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BareCommit:
        rows = 0
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.sndtimeo = SPARK_SEND_TIMEOUT_MS  # a send blocks (at the high-water mark) so long
        # The frames must arrive: closing waits up to SPARK_LINGER_MS for the queued ones
        # (the drain counts them; the bench fails the run if any is missing).
        sock.linger = SPARK_LINGER_MS
        try:
            sock.connect(self.endpoint)
            for batch in iterator:
                for _member, _topic, _partition, chunk in requests_of(
                        batch, "bare", SPARK_FRAME_RECORDS, REQUEST_BYTES_MAX):
                    blob = pack(chunk)  # as the sink packs
                    sock.send_multipart([len(chunk).to_bytes(COUNT_BYTES, "little"), blob])
                rows += batch.num_rows
        finally:
            sock.close()
            ctx.term()  # returns once the queued frames are sent, or the linger is over
        return BareCommit(rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to commit: the frames were delivered as they were sent."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: what was sent is counted, and the bench fails the run."""


class Drain:
    """The bench's PULL socket and the thread that drains it, counting records and bytes.
    The socket is made and bound here, used only by the thread, and closed after it ends."""

    def __init__(self) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.linger = 0
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.records = 0
        self.frames = 0
        self.payload_bytes = 0  # the packed frames' bytes
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zmq-drain", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(SPARK_DRAIN_POLL_MS, zmq.POLLIN):
                continue
            count, blob = self._sock.recv_multipart(copy=False)
            with self._changed:
                self.records += int.from_bytes(count.bytes, "little")
                self.frames += 1
                self.payload_bytes += len(blob)
                self._changed.notify_all()

    def wait_for(self, records: int, timeout_s: float) -> bool:
        """Whether ``records`` records in all have arrived within ``timeout_s``."""
        with self._changed:
            return self._changed.wait_for(lambda: self.records >= records, timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10 * SPARK_DRAIN_POLL_MS / 1000 + 5)
        if self._thread.is_alive():
            raise RuntimeError("the zmq drain thread did not stop")
        self._sock.close()
        self._ctx.term()
