"""The supervisor: the node's main process. It starts the actors, watches them, restarts
the ones that die, answers ``status``, and stops them all cleanly.

Actors start in dependency order — log manager, transaction manager, cache manager, shard
writers, front door — each a spawned process. Restarts are rest-for-one: when an actor
dies, the actors after it in that order are stopped too, and all of them start again in
order (what they hold may depend on the one that died). More than ``restarts_max``
restarts within ``restart_window_s`` stop the node with the reason; an actor silent for
``heartbeat_timeout_ms`` is killed and restarted. A clean stop closes the front door, runs a
checkpoint (so the next start replays nothing), then stops the rest; whatever does not exit
in time is killed, so no process is left behind.

That policy is ``node/supervision.py``, a state machine with no I/O; this module is its
shell: the processes, the sockets, psutil, the start and the clean stop.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, assert_never

import psutil
import zmq

from actors.base import Actor, ActorContext, mailbox_address, send_frame, waiting_messages
from actors.cache_manager import CacheManager
from actors.curve import server_keys
from actors.durable import fsync_dir, write_atomic
from actors.front_door import FrontDoor
from actors.instructions import Release, Spawn, StopNode, Terminate
from actors.log_manager import LogManager
from actors.process import (
    IGNORED_SIGNALS,
    STOP_SIGNAL,
    STOP_SIGNALS,
    actor_main,
    send_release,
)
from actors.roles import (
    CACHE_MANAGER,
    FRONT_DOOR,
    LOG_MANAGER,
    SUPERVISOR,
    TRANSACTION_MANAGER,
    is_writer,
    writer_role,
)
from actors.shard_writer import ShardWriter
from actors.snapshot_files import MANIFEST
from actors.transaction_manager import TransactionManager
from config import NodeConfig
from node.supervision import Phase, Supervision, SupervisorInstruction
from wire import codec
from wire.messages import (
    Bundle,
    Checkpoint,
    Done,
    ErrorReply,
    FrontClosed,
    Stats,
    StatusReply,
    StatusRequest,
    Stop,
)

log = logging.getLogger("shardnode")

IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep room for "/writer-63.sock"


def actor_class(role: str) -> type[Actor]:
    """What runs in the process of ``role``."""
    if is_writer(role):
        return ShardWriter
    classes: dict[str, type[Actor]] = {
        LOG_MANAGER: LogManager,
        TRANSACTION_MANAGER: TransactionManager,
        CACHE_MANAGER: CacheManager,
        FRONT_DOOR: FrontDoor,
    }
    return classes[role]


class NodeStartError(RuntimeError):
    """The node could not start; the message says why."""


class DataDirError(NodeStartError):
    """The data dir cannot be one: a file is there, or it cannot be made or opened (the
    command line's to mend: the CLI exits 2)."""


def data_dir_error(data: Path, exc: OSError) -> DataDirError:
    """What is wrong with the data dir ``data``, from the ``OSError`` making or locking it
    raised."""
    try:
        if (data.exists() or data.is_symlink()) and not data.is_dir():
            return DataDirError(f"the data dir {data} is not a directory")
    except OSError:  # a directory above it may not be ours to look into
        pass
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(data) else ""
    return DataDirError(f"cannot use the data dir {data}: {exc.strerror or exc}{where}")


def start_shielded(proc: BaseProcess) -> None:
    """Start ``proc`` with the stop signals blocked, as it inherits them: it takes one only
    once it has set its handler and unblocked them (``actors.process.STOP_SIGNALS``)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS + IGNORED_SIGNALS)
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@dataclass
class Child:
    """An actor's process, as the shell holds it (the policy's view is ``Watched``)."""

    role: str
    process: BaseProcess | None = None
    release: Connection | None = None  # its release pipe's writing end (``send_release``)
    pid: int = 0
    figures: dict[str, Any] = field(default_factory=dict)
    ps: psutil.Process | None = None


def run_dir_for(data: Path) -> Path:
    """ipc sockets live here: under the data dir when the path is short enough, else in
    the temporary directory (``make_run_dir``)."""
    candidate = data / "run"
    if len(str(candidate)) + 20 <= IPC_PATH_MAX:
        return candidate
    digest = hashlib.sha1(str(data).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"shardnode-{digest}"


def make_run_dir(run_dir: Path, data: Path) -> None:
    """Make the directory of the node's ipc sockets, this user's alone. One in the
    temporary directory has a name anyone can work out: made by another user first, its
    sockets would be theirs to take over, so it must be this user's (and is made, or set,
    mode 0700: an older shardnode made it by the umask)."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if run_dir.parent == data:
        return
    st = run_dir.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise NodeStartError(
            f"the node's socket directory {run_dir} (its data dir's path is too long for "
            f"ipc sockets) is not a directory of this user's: remove it, or give the data "
            f"dir a shorter path")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(run_dir, 0o700)


def serving_there(sock_path: Path) -> bool:
    """Whether a live process listens on the ipc socket at ``sock_path`` (one left by a
    node that died refuses connections)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(sock_path))
    except OSError:
        return False
    finally:
        s.close()
    return True


class Supervisor:
    def __init__(self, cfg: NodeConfig, parent_pid: int | None = None) -> None:
        self.cfg = cfg
        # With a parent to watch (``start --exit-with-parent``), the node stops once that
        # process is gone, while it starts too.
        self.parent_pid = parent_pid
        self.data = cfg.data_path
        self.run_dir = run_dir_for(self.data)
        self.writers = [writer_role(i) for i in range(cfg.node.writers)]
        self.order = [LOG_MANAGER, TRANSACTION_MANAGER, CACHE_MANAGER, *self.writers, FRONT_DOOR]
        # Every actor but the front door: a checkpoint needs all of them.
        self.behind_front = [role for role in self.order if role != FRONT_DOOR]
        self.children = {role: Child(role) for role in self.order}
        sc = cfg.supervisor
        self.policy = Supervision(self.order, sc.restarts_max, sc.restart_window_s,
                                  heartbeat_s=sc.heartbeat_timeout_ms / 1000,
                                  restart_start_s=sc.stop_timeout_ms / 1000 * 4)
        self.spawn = multiprocessing.get_context("spawn")
        self.zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.mailbox: zmq.Socket[bytes] | None = None
        self.stopping = False
        self.stop_reason = ""
        self.failed = False
        self.checkpoint_done: Done | ErrorReply | None = None
        self.peers: dict[str, zmq.Socket[bytes]] = {}  # PUSH sockets to actors' mailboxes
        self.started_at = time.time()
        self._lock_fd = -1
        self._run_dir_ours = False  # its sockets are this node's (not another's, serving)

    # ---- start ------------------------------------------------------------------------

    def _lock(self) -> None:
        if (self.data / MANIFEST).is_file():
            # Started on, it would be written into (its log appended to, a lock, sockets),
            # and no longer be the copy it was.
            raise DataDirError(f"the data dir {self.data} is a snapshot export ({MANIFEST}): "
                               f"start a node from it into a new data dir instead "
                               f"(shardnode start --data-dir NEW --from-snapshot {self.data})")
        try:
            self.data.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.data / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise data_dir_error(self.data, exc) from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise NodeStartError(f"another node is using the data directory {self.data}") from None
        os.ftruncate(self._lock_fd, 0)
        os.write(self._lock_fd, f"{os.getpid()}\n".encode())

    def _check_writer_count(self) -> None:
        """Shards move between writers when ``node.writers`` changes. That is safe only
        after a clean stop (every shard durable, nothing to replay): a writer that did not
        see a topic's creation before a crash would otherwise never create its shards."""
        meta = self.data / "writers"
        meta.mkdir(parents=True, exist_ok=True)
        count_file, clean_file = meta / "count", meta / "clean-stop"
        want = self.cfg.node.writers
        if count_file.exists():
            had = int(count_file.read_text().strip() or want)
            if had != want and not clean_file.exists():
                raise NodeStartError(
                    f"node.writers changed from {had} to {want}, but the node did not stop "
                    f"cleanly last time: start it once with writers = {had} and stop it "
                    f"cleanly (Ctrl-C or SIGTERM), then change the count")
            if had != want:
                # Each writer's list of the shards it made (actors/shard_writer.py) is of
                # the old count's: a writer gone meanwhile did not see topics deleted.
                # Every writer lists what it finds at its next start.
                for listed in meta.glob("*.shards"):
                    listed.unlink()
        count_file.write_text(f"{want}\n")
        clean_file.unlink(missing_ok=True)
        fsync_dir(meta)

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start every actor and wait until they run. Raises ``ConfigError`` (before
        anything is locked, spawned or bound) when CURVE is on and its keys cannot be read
        or this libzmq must not be used, ``DataDirError`` (before anything is spawned) when
        the data dir cannot be one, ``NodeStartError`` when the node cannot start."""
        server_keys(self.cfg)
        self._lock()
        sock_path = self.run_dir / f"{SUPERVISOR}.sock"
        if serving_there(sock_path):
            # Its LOCK file was deleted (it looks like a leftover after a stop): taking
            # over its sockets would cut the running node off from its actors.
            raise NodeStartError(f"another node is serving the data directory {self.data} "
                                 f"(its supervisor answers on {sock_path}); was its LOCK "
                                 f"file deleted?")
        try:
            self._check_writer_count()
            make_run_dir(self.run_dir, self.data)
            sock_path.unlink(missing_ok=True)
        except OSError as exc:
            raise data_dir_error(self.data, exc) from None
        self.mailbox = self.zctx.socket(zmq.PULL)
        self.mailbox.setsockopt(zmq.LINGER, 0)
        self.mailbox.bind(mailbox_address(self.run_dir, SUPERVISOR))
        self._run_dir_ours = True
        # From here a signal stops the node cleanly, while it starts too (recovery may
        # take a while): SIGTERM ended the supervisor outright until it served.
        self._take_signals()
        self.perform(self.policy.start(time.monotonic(), ready_timeout_s))
        while not self.policy.up:
            self._watch_parent()
            if self.stopping:
                self.shutdown()
                raise NodeStartError(self.stop_reason)
            self.poll_mailbox(100)
            self.check_children()
        log.info("node up: %s, data in %s", self.cfg.endpoint, self.data)

    def _spawn(self, role: str) -> None:
        ctx = ActorContext(role, self.cfg.to_dict(), str(self.run_dir), os.getpid())
        waits, release = self.spawn.Pipe(duplex=False)
        proc = self.spawn.Process(target=actor_main, args=(ctx, actor_class(role), waits),
                                  name=f"shardnode-{role}")
        try:
            start_shielded(proc)
        except BaseException:
            release.close()
            raise
        finally:
            waits.close()  # the child's now: its exit closes the pipe's last reading end
        child = self.children[role]
        if child.release is not None:
            child.release.close()  # the last incarnation's
        child.process = proc
        child.release = release
        child.pid = proc.pid or 0
        self.policy.spawned(role, child.pid)
        try:
            child.ps = psutil.Process(child.pid)
            child.ps.cpu_percent(None)
        except psutil.Error:
            child.ps = None

    def perform(self, instructions: list[SupervisorInstruction]) -> None:
        for ins in instructions:
            match ins:
                case Spawn(role):
                    self._spawn(role)
                case Release(role):
                    release = self.children[role].release
                    assert release is not None, f"{role} released before it was spawned"
                    send_release(release)
                case Terminate(role, kill):
                    child = self.children[role]
                    if kill:
                        if child.process is not None and child.process.exitcode is None:
                            child.process.kill()
                            child.process.join(5)
                    else:
                        self._stop_child(child, signal_first=True)
                case StopNode(reason):
                    self.failed = True
                    self.request_stop(reason)
                case _:
                    assert_never(ins)

    # ---- watching ---------------------------------------------------------------------

    def poll_mailbox(self, timeout_ms: int) -> None:
        assert self.mailbox is not None
        if not self.mailbox.poll(timeout_ms, zmq.POLLIN):
            return
        for msg in waiting_messages(self.mailbox, 1000):
            self.on_message(msg)

    def on_message(self, msg: codec.Message) -> None:
        if isinstance(msg, Stats):
            child = self.children.get(msg.role)
            if child is not None and msg.pid == child.pid:  # not an earlier incarnation
                child.figures = msg.figures
                self.perform(self.policy.reported(msg.role, time.monotonic()))
        elif isinstance(msg, StatusRequest):
            if not self._tell(FRONT_DOOR, StatusReply(msg.corr, self.status())):
                log.warning("front door mailbox full; status reply dropped")
        elif isinstance(msg, (Done, ErrorReply)):
            self.checkpoint_done = msg
        elif isinstance(msg, Bundle):
            # Several messages of one burst (``Actor.send_many``): the front door's, when
            # clients asked for the status more than once in it.
            for frame in msg.frames:
                try:
                    self.on_message(codec.decode(frame))
                except codec.CodecError as exc:
                    log.error("dropped a frame that is not a message: %s", exc)
        else:
            log.warning("unexpected message %s", type(msg).__name__)

    def check_children(self) -> None:
        """Tell the policy the time (silent actors are killed), then every exit."""
        now = time.monotonic()
        self.perform(self.policy.tick(now))
        for role in self.order:
            proc = self.children[role].process
            if proc is not None and proc.exitcode is not None and self.policy.watches(role):
                self.perform(self.policy.exited(role, proc.exitcode, now))

    def _stop_child(self, child: Child, signal_first: bool) -> None:
        proc = child.process
        if proc is None or proc.exitcode is not None:
            return
        if signal_first and proc.pid is not None:
            os.kill(proc.pid, STOP_SIGNAL)  # the actor stops cleanly (not SIGTERM: see there)
        proc.join(self.cfg.supervisor.stop_timeout_ms / 1000)
        if proc.exitcode is None:
            log.error("%s did not stop within %d ms; killing it", child.role,
                      self.cfg.supervisor.stop_timeout_ms)
            proc.kill()
            proc.join(5)

    def request_stop(self, reason: str) -> None:
        self.policy.stop()
        if not self.stopping:
            self.stopping = True
            self.stop_reason = reason
            log.info("stopping the node: %s", reason)

    def _take_signals(self) -> None:
        """SIGTERM, SIGINT (Ctrl-C) and SIGHUP (the terminal of a node started in it
        closed) stop the node cleanly; SIGHUP not when ignored (``nohup``)."""
        def on_signal(signum: int, frame: Any) -> None:
            self.request_stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            signal.signal(signal.SIGHUP, on_signal)

    def serve_forever(self) -> None:
        """Watch the actors until a stop is requested (signal, too many restarts, or the
        parent it watches exiting)."""
        self._take_signals()
        while not self.stopping:
            self.poll_mailbox(100)
            self.check_children()
            self._watch_parent()
        self.shutdown()

    def _watch_parent(self) -> None:
        """Stop when the parent it watches is gone. (Its pid is read as the node's process
        starts, and watched during the start too: read when the node began to serve, a
        parent that exited while the node started went unnoticed, and the node served on
        with no one to stop it.)"""
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            self.request_stop("the process that started the node exited")

    # ---- status -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        actors = []
        for role in self.order:
            child = self.children[role]
            rss = cpu = None
            if child.ps is not None:
                try:
                    rss = child.ps.memory_info().rss
                    cpu = child.ps.cpu_percent(None)
                except psutil.Error:
                    pass
            alive = child.process is not None and child.process.exitcode is None
            watched = self.policy.actors[role]
            actors.append({
                "role": role,
                "pid": child.pid,
                "state": watched.phase.value if alive else "dead",
                "rss_bytes": rss,
                "cpu_percent": cpu,
                "mailbox": child.figures.get("mailbox", 0),
                "restarts": watched.restarts,
                "figures": child.figures,
            })
        me = psutil.Process()
        return {
            "endpoint": self.cfg.endpoint,
            "data_dir": str(self.data),
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "supervisor_rss_bytes": me.memory_info().rss,
            "actors": actors,
            "log": self.children[LOG_MANAGER].figures,
        }

    # ---- stop -------------------------------------------------------------------------

    def _tell(self, role: str, msg: codec.Message) -> bool:
        """Send to an actor's mailbox (a socket kept open, so nothing sent is dropped)."""
        sock = self.peers.get(role)
        if sock is None:
            sock = self.zctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 1000)
            sock.connect(mailbox_address(self.run_dir, role))
            self.peers[role] = sock
        try:
            send_frame(sock, codec.encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _alive(self, role: str) -> bool:
        proc = self.children[role].process
        return proc is not None and proc.exitcode is None

    def _running(self, role: str) -> bool:
        """Alive and started: not waiting to be let start, nor still starting (a stop
        during a restart finds those after the actor that died so)."""
        return self._alive(role) and self.policy.actors[role].phase is Phase.RUNNING

    def _checkpoint_before_stop(self) -> None:
        """Make the shards durable and truncate the log, so the next start replays nothing."""
        if not all(self._running(r) for r in self.behind_front) or self.mailbox is None:
            return
        self.checkpoint_done = None
        # The front door is stopped: a blocking checkpoint's gate must not wait for
        # transactions no client can end now.
        if not self._tell(TRANSACTION_MANAGER, FrontClosed()):
            log.warning("the transaction manager's mailbox is full: the checkpoint at stop "
                        "may wait for open transactions until it gives up")
        if not self._tell(LOG_MANAGER, Checkpoint(0, SUPERVISOR)):
            return
        deadline = time.monotonic() + self.cfg.log.checkpoint_timeout_ms / 1000
        while self.checkpoint_done is None and time.monotonic() < deadline:
            if not all(self._running(r) for r in self.behind_front):
                return
            self.poll_mailbox(100)
        if isinstance(self.checkpoint_done, Done):
            log.info("checkpoint at stop: shards durable to LSN %d", self.checkpoint_done.lsn)
            marker = self.data / "writers" / "clean-stop"
            write_atomic(marker, f"{self.checkpoint_done.lsn}\n".encode())
        else:
            log.warning("no checkpoint at stop (%s); the next start replays the log",
                        getattr(self.checkpoint_done, "text", "timed out"))

    def shutdown(self) -> None:
        self.policy.stop()
        try:
            # The front door first (no new requests), then the log manager after its
            # checkpoint, then the rest in start order.
            for role in [FRONT_DOOR, LOG_MANAGER, TRANSACTION_MANAGER, CACHE_MANAGER,
                         *self.writers]:
                if role == LOG_MANAGER:
                    self._checkpoint_before_stop()
                child = self.children[role]
                if not self._alive(role):
                    continue
                # One waiting to be let start reads no mailbox: the signal stops it.
                waiting = self.policy.actors[role].phase is Phase.WAITING
                sent = not waiting and self._tell(role, Stop(self.stop_reason or "stop"))
                self._stop_child(child, signal_first=not sent)
        finally:
            for child in self.children.values():
                if child.process is not None and child.process.exitcode is None:
                    child.process.kill()
                    child.process.join(5)
                if child.release is not None:
                    child.release.close()
                    child.release = None
            for sock in self.peers.values():
                sock.close(0)
            self.peers.clear()
            if self.mailbox is not None:
                self.mailbox.close(0)
            self.mailbox = None
            if self._run_dir_ours and self.run_dir.parent != self.data:
                shutil.rmtree(self.run_dir, ignore_errors=True)  # the temporary directory's
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            log.info("node stopped")
