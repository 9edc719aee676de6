"""An actor's process: what it is given at spawn, its set-up, and its exit code.

The supervisor spawns ``actor_main`` with an ``ActorContext``, the class to run and the
pipe that lets it start; the process (its imports done as it was spawned) sets up logging
and signals, asks the kernel to end it with its parent, waits to be let start (the actors
before it in start order are running then: ``node/supervision.py``), runs the actor's loop
and exits with a code that tells the supervisor why it stopped.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any, Protocol

from actors.base import Actor, ActorContext, RefuseToStart
from actors.roles import is_writer

log = logging.getLogger("shardnode")

# The supervisor's request to an actor to stop cleanly when its mailbox cannot carry one.
# Not SIGTERM: a SIGTERM to the whole process group (``timeout``, systemd's stop of a unit's
# processes, ``kill -- -PGID``) reached every actor at once, and they stopped in no order,
# before the supervisor's checkpoint at stop. An actor leaves SIGTERM to the supervisor,
# which stops the actors in order, while it lives; SIGTERM from the kernel when it died
# (``_die_with_parent``) stops the actor.
STOP_SIGNAL = signal.SIGUSR1
# Blocked in the supervisor around an actor's spawn, so that the new process starts with
# them blocked (a signal mask is inherited, across exec too) and takes one only once its
# handler is set: a SIGTERM to the process group while an actor started (a rest-for-one
# restart starts several) killed it before it could leave the signal to the supervisor.
STOP_SIGNALS = (signal.SIGTERM, STOP_SIGNAL)
# Blocked around the spawn too, and ignored by the actor before it unblocks them: the
# terminal's Ctrl-C and hangup reach every process of its group, and would kill an actor
# still starting with the default action.
IGNORED_SIGNALS = (signal.SIGINT, signal.SIGHUP)

# Exit codes an actor uses to tell the supervisor why it stopped.
EXIT_FAILED = 1  # an unexpected error: restart it
EXIT_REFUSED = 65  # it must not run on what it found (a corrupt log, a newer format): stop the node
EXIT_FSYNC_FAILED = 70  # the log's fsync failed: restart it, and recovery reads the disk

# How often an actor waiting to be let start checks that its supervisor is still there.
RELEASE_CHECK_S = 0.5


class ReleaseEnd(Protocol):
    """What an actor waits on until it may start: the read end of a one-way
    ``multiprocessing`` pipe, on which the supervisor writes once (``send_release``). Not an
    event: setting a ``multiprocessing.Event`` waits, with no bound, for every process
    waiting on it to wake, and one killed while it waited never does (the supervisor hung
    for good); and its named semaphores outlived a node killed whole."""

    def poll(self, timeout: float | None = 0.0) -> bool: ...

    def recv_bytes(self, maxlength: int | None = None) -> bytes: ...


def send_release(sender: Connection) -> bool:
    """Let the actor at the other end start: never blocks (one byte into an empty pipe).
    False when the actor is gone (its exit is news the supervisor hears apart)."""
    try:
        sender.send_bytes(b"1")
    except OSError:  # its reading end closed: the process exited
        return False
    return True


def configure_logging(role: str) -> None:
    level = os.environ.get("SHARDNODE_LOG", "INFO").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format=f"%(asctime)s %(levelname)s [{role}] %(message)s",
        stream=sys.stderr,
        force=True,
    )


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM when the parent exits (backed up by the ppid check)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass


# glibc's malloc, as actors use it: blocks this large or larger are mapped apart (each
# page faulted in on first touch, and unmapped when freed), and free memory past this much
# at the top of a heap is given back to the kernel (to fault in again when the heap grows).
# glibc's own bounds (128 KiB, raised to the largest such block freed so far; trimming at
# twice that) let an actor fault in the pages of its large requests again and again: the
# front door took 39 000-47 000 minor faults per million rows of the Spark sink's
# half-megabyte requests in some runs (in others glibc's bounds settled after the first
# million), and every page of requests growing in size (tests/test_lifecycle.py). A
# client's frame is at most 16 MiB ([limits] frame_bytes_max), so a rare one above the
# mapping bound is still mapped; the trim bound is what an idle actor may keep of its peak.
MALLOC_MMAP_THRESHOLD_BYTES = 4 << 20
MALLOC_TRIM_THRESHOLD_BYTES = 16 << 20
M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Set glibc's malloc thresholds for this process (above); False where the C library
    has no ``mallopt`` (not glibc), which leaves its own policy."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES)
                and mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES))


def wait_for_release(release: ReleaseEnd, supervisor: int) -> bool:
    """Wait until the supervisor lets this actor start; False if it is gone meanwhile."""
    while not release.poll(RELEASE_CHECK_S):
        if os.getppid() != supervisor:
            return False
    try:
        release.recv_bytes()
    except EOFError:  # every writing end closed: the supervisor is gone
        return False
    return True


def actor_main(ctx: ActorContext, actor_class: type[Actor],
               release: ReleaseEnd | None = None) -> None:
    """Entry point of every actor process (spawned by the supervisor). With ``release``, it
    starts the actor once the supervisor lets it (``wait_for_release``)."""
    configure_logging(ctx.role)
    _die_with_parent()
    keep_freed_memory()
    # The supervisor decides when we stop (a closed terminal's SIGHUP reaches every process).
    for signum in IGNORED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED_SIGNALS)  # blocked by the spawn
    if is_writer(ctx.role):
        # Before RocksDB starts its background threads, which inherit this priority: the
        # writers' work (applying, flushing) is off the acknowledgement path.
        nice = int(ctx.config["shards"]["writer_nice"])
        if nice:
            os.nice(nice)
    actor: Actor | None = None
    supervisor = ctx.parent_pid

    def on_stop_signal(signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM and os.getppid() == supervisor:
            log.info("%s: SIGTERM left to the supervisor, which stops the actors in order",
                     ctx.role)
            return
        why = "SIGTERM, the supervisor gone" if signum == signal.SIGTERM else "the supervisor's signal"
        if actor is not None:
            actor.stop(why)
        else:
            raise SystemExit(0)

    for signum in STOP_SIGNALS:
        signal.signal(signum, on_stop_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by the spawn
    if release is not None and not wait_for_release(release, supervisor):
        log.info("%s: the supervisor is gone before it let this actor start", ctx.role)
        sys.exit(0)
    code = 0
    try:
        actor = actor_class(ctx)
        try:
            actor.run()
        except BaseException:
            actor.crashed = True
            raise
        finally:
            actor.on_stop()
            actor.close()
    except RefuseToStart as exc:
        log.critical("%s refuses to start: %s", ctx.role, exc)
        code = EXIT_REFUSED
    except Exception:
        log.exception("actor %s failed", ctx.role)
        code = EXIT_FAILED
    sys.exit(code)
