"""A checkpoint's file work, off the log manager's commit path: write the state snapshot
to a slot, then delete the segments below the checkpoint (``actors/wal.py`` does both)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import zmq

from actors import faults
from actors.wal import delete_segments_upto, write_snapshot
from wire import logrecord

R = TypeVar("R")


class ThreadJob(Generic[R]):
    """File work of an actor on a thread of its own, one job at a time: the thread leaves
    its result and wakes the actor's loop through an inproc socket (``wake``, which the
    loop polls); the loop then calls ``collect``."""

    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], name: str) -> None:
        self.name = name
        address = f"inproc://{name}-{id(self)}"
        self.wake = zctx.socket(zmq.PAIR)
        self.wake.setsockopt(zmq.LINGER, 0)
        self.wake.bind(address)
        self._ping = zctx.socket(zmq.PAIR)  # used by the job's thread only
        self._ping.setsockopt(zmq.LINGER, 0)
        self._ping.connect(address)
        self.thread: threading.Thread | None = None
        self.result: R | None = None
        self.failure: BaseException | None = None

    @property
    def busy(self) -> bool:
        return self.thread is not None

    def _start(self, run: Callable[..., R], *args: Any) -> None:
        if self.thread is not None:
            raise RuntimeError(f"a {self.name} job is already running")
        self.result, self.failure = None, None
        self.thread = threading.Thread(target=self._main, args=(run, *args), name=self.name,
                                       daemon=True)
        self.thread.start()

    def _main(self, run: Callable[..., R], *args: Any) -> None:
        try:
            self.result = run(*args)
        except BaseException as exc:  # raised again by ``collect``, in the actor
            self.failure = exc
        self._ping.send(b"")

    def collect(self, timeout_s: float = 0.0) -> R | None:
        """The finished job's result, waiting up to ``timeout_s`` for it; None if none.
        Raises what the job raised that it did not turn into a result (the actor fails and
        is restarted: without the wake, nothing would ever have collected it, and the
        checkpoints or exports waiting for it would have waited for good)."""
        if self.thread is None:
            return None
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            return None
        self.thread = None
        while self.wake.poll(0, zmq.POLLIN):
            self.wake.recv()
        if self.failure is not None:
            raise RuntimeError(f"the {self.name} job failed: {self.failure!r}") from self.failure
        return self.result

    def close(self) -> None:
        self.wake.close(0)
        self._ping.close(0)


@dataclasses.dataclass(frozen=True, slots=True)
class TruncateResult:
    ckpt_id: int
    upto: int
    deleted: int
    error: str


class Truncator(ThreadJob[TruncateResult]):
    """A checkpoint's file work, on a thread of its own.

    Done inline, building the snapshot and the file system calls stalled every
    acknowledgement for 10-26 ms per checkpoint. Now the commit thread only copies the
    state (the producers' windows hold packed entries, so a copy is one dict copy per
    producer), and a thread encodes it (about 1 ms for ten thousand window entries), writes
    it to a snapshot slot, deletes the segments, and wakes the actor's loop through an
    inproc socket; the loop then calls ``collect``. One job at a time (the coordinator
    starts no checkpoint while one is truncating)."""

    def __init__(self, zctx: zmq.Context[zmq.Socket[bytes]], log_dir: Path, data_dir: Path) -> None:
        super().__init__(zctx, "truncate")
        self.log_dir = log_dir
        self.data_dir = data_dir
        self.next_slot = 0  # the snapshot slot not holding the newest snapshot

    def after_recovery(self, newest_slot: int | None) -> None:
        """Recovery loaded the snapshot of ``newest_slot`` (None: none): write the other."""
        self.next_slot = 0 if newest_slot is None else 1 - newest_slot

    def start(self, ckpt_id: int, upto: int, snapshot: dict[str, Any]) -> None:
        """Write ``snapshot`` (taken when the state was exactly what is durable), then
        delete the segments holding only LSNs ≤ ``upto``."""
        if self.thread is not None:
            raise RuntimeError("a truncate job is already running")
        slot, self.next_slot = self.next_slot, 1 - self.next_slot
        self._start(self._run, ckpt_id, upto, snapshot, slot)

    def _run(self, ckpt_id: int, upto: int, snapshot: dict[str, Any], slot: int
             ) -> TruncateResult:
        deleted, error = 0, ""
        try:
            write_snapshot(self.log_dir, slot, logrecord.encode_snapshot(snapshot))
        except OSError as exc:
            # Nothing is lost: no segment is deleted, and the other slot still holds the
            # newest valid snapshot. The next checkpoint writes this slot again, so that a
            # crash during that write cannot spoil the only good one.
            self.next_slot = slot
            error = f"writing snapshot slot {slot} failed: {exc}"
        if not error:
            faults.crash_point("checkpoint.after_snapshot", self.data_dir)
            try:
                deleted = delete_segments_upto(self.log_dir, upto)
            except OSError as exc:
                error = f"deleting segments failed: {exc}"  # the next checkpoint retries
            faults.crash_point("checkpoint.after_truncate", self.data_dir)
        return TruncateResult(ckpt_id, upto, deleted, error)
