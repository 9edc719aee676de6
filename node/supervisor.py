"""The supervisor: the node's main process. It starts the actors, watches them, restarts
the ones that die, answers ``status``, and stops them all cleanly.

Actors start in dependency order — log manager, cache manager, shard writers, front door —
each a spawned process. A dead actor is restarted on its own (its peers reconnect to its
mailbox by themselves); more than ``restarts_max`` restarts within ``restart_window_s``
stop the node with the reason. An actor silent for ``heartbeat_timeout_ms`` is killed and
restarted. Stopping goes front door first (no new work), then the log manager (its queue
is committed and synced), then the rest; whatever does not exit in time is killed, so no
process is left behind.
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import logging
import multiprocessing
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psutil
import zmq

from actors.base import (
    CACHE_MANAGER,
    EXIT_REFUSED,
    FRONT_DOOR,
    LOG_MANAGER,
    SUPERVISOR,
    ActorContext,
    actor_main,
    mailbox_address,
    writer_role,
)
from config import NodeConfig
from wire import codec
from wire.messages import Stats, StatusReply, StatusRequest, Stop

log = logging.getLogger("shardnode")

IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep room for "/writer-63.sock"


class NodeStartError(RuntimeError):
    """The node could not start; the message says why."""


@dataclass
class Child:
    role: str
    process: BaseProcess | None = None
    pid: int = 0
    state: str = "starting"
    restarts: int = 0
    last_report: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    ps: psutil.Process | None = None


def run_dir_for(data: Path) -> Path:
    """ipc sockets live here: under the data dir when the path is short enough."""
    candidate = data / "run"
    if len(str(candidate)) + 20 <= IPC_PATH_MAX:
        return candidate
    digest = hashlib.sha1(str(data).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"shardnode-{digest}"


class Supervisor:
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.data = cfg.data_path
        self.run_dir = run_dir_for(self.data)
        roles = [LOG_MANAGER, CACHE_MANAGER] + [writer_role(i) for i in range(cfg.node.writers)]
        self.order = [*roles, FRONT_DOOR]
        self.children = {role: Child(role) for role in self.order}
        self.spawn = multiprocessing.get_context("spawn")
        self.zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.mailbox: zmq.Socket[bytes] | None = None
        self.front: zmq.Socket[bytes] | None = None
        self.restart_times: collections.deque[float] = collections.deque()
        self.stopping = False
        self.stop_reason = ""
        self.failed = False
        self.started_at = time.time()
        self._lock_fd = -1

    # ---- start ------------------------------------------------------------------------

    def _lock(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.data / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise NodeStartError(f"another node is using the data directory {self.data}") from None
        os.ftruncate(self._lock_fd, 0)
        os.write(self._lock_fd, f"{os.getpid()}\n".encode())

    def start(self, ready_timeout_s: float = 60.0) -> None:
        self._lock()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.mailbox = self.zctx.socket(zmq.PULL)
        self.mailbox.setsockopt(zmq.LINGER, 0)
        sock_path = self.run_dir / f"{SUPERVISOR}.sock"
        if sock_path.exists():
            sock_path.unlink()
        self.mailbox.bind(mailbox_address(self.run_dir, SUPERVISOR))
        self.front = self.zctx.socket(zmq.PUSH)
        self.front.setsockopt(zmq.LINGER, 0)
        self.front.setsockopt(zmq.SNDHWM, 1000)
        self.front.connect(mailbox_address(self.run_dir, FRONT_DOOR))
        for role in self.order:
            self._spawn(role)
            self._wait_ready([role], ready_timeout_s)
        log.info("node up: %s, data in %s", self.cfg.endpoint, self.data)

    def _spawn(self, role: str) -> None:
        ctx = ActorContext(role, self.cfg.to_dict(), str(self.run_dir), os.getpid())
        proc = self.spawn.Process(target=actor_main, args=(ctx,), name=f"shardnode-{role}")
        proc.start()
        child = self.children[role]
        child.process = proc
        child.pid = proc.pid or 0
        child.state = "starting"
        child.last_report = time.monotonic()
        try:
            child.ps = psutil.Process(child.pid)
            child.ps.cpu_percent(None)
        except psutil.Error:
            child.ps = None

    def _wait_ready(self, roles: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(self.children[r].state != "running" for r in roles):
            for r in roles:
                proc = self.children[r].process
                if proc is not None and proc.exitcode is not None:
                    self.shutdown()
                    why = ("refused to start" if proc.exitcode == EXIT_REFUSED
                           else f"exited with code {proc.exitcode} while starting")
                    raise NodeStartError(f"the {r} actor {why}; its log above says why")
            if time.monotonic() > deadline:
                self.shutdown()
                raise NodeStartError(f"actors {roles} did not start within {timeout_s:.0f} s")
            self.poll_mailbox(100)

    # ---- watching ---------------------------------------------------------------------

    def poll_mailbox(self, timeout_ms: int) -> None:
        assert self.mailbox is not None
        if not self.mailbox.poll(timeout_ms, zmq.POLLIN):
            return
        for _ in range(1000):
            try:
                frame = self.mailbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = codec.decode(frame)
            except codec.CodecError as exc:
                log.error("supervisor dropped a bad frame: %s", exc)
                continue
            if isinstance(msg, Stats):
                child = self.children.get(msg.role)
                if child is not None and msg.pid == child.pid:
                    child.figures = msg.figures
                    child.last_report = time.monotonic()
                    if child.state == "starting":
                        child.state = "running"
            elif isinstance(msg, StatusRequest):
                self._send_front(StatusReply(msg.corr, self.status()))

    def _send_front(self, msg: codec.Message) -> None:
        assert self.front is not None
        try:
            self.front.send(codec.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            log.warning("front door mailbox full; status reply dropped")

    def check_children(self) -> None:
        now = time.monotonic()
        silent_s = self.cfg.supervisor.heartbeat_timeout_ms / 1000
        for role in self.order:
            child = self.children[role]
            proc = child.process
            if proc is None:
                continue
            if proc.exitcode is None and child.state == "running" and now - child.last_report > silent_s:
                log.error("%s (pid %d) silent for %.0f s; killing it", role, child.pid, silent_s)
                proc.kill()
                proc.join(5)
            if proc.exitcode is not None:
                if proc.exitcode == EXIT_REFUSED:
                    self.failed = True
                    self.request_stop(f"{role} refused to run; its log above says why")
                    return
                self._restart(child, proc.exitcode)
                if self.stopping:
                    return

    def _restart(self, child: Child, exitcode: int) -> None:
        now = time.monotonic()
        window = self.cfg.supervisor.restart_window_s
        while self.restart_times and now - self.restart_times[0] > window:
            self.restart_times.popleft()
        if len(self.restart_times) >= self.cfg.supervisor.restarts_max:
            self.failed = True
            self.request_stop(f"{len(self.restart_times) + 1} actor restarts within {window} s "
                              f"(last: {child.role} exited with code {exitcode}); giving up")
            return
        self.restart_times.append(now)
        child.restarts += 1
        log.warning("%s (pid %d) exited with code %s; restarting it (restart %d)",
                    child.role, child.pid, exitcode, child.restarts)
        self._spawn(child.role)

    def request_stop(self, reason: str) -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_reason = reason
            log.info("stopping the node: %s", reason)

    def serve_forever(self) -> None:
        """Watch the actors until a stop is requested (signal, or too many restarts)."""
        def on_signal(signum: int, frame: Any) -> None:
            self.request_stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        while not self.stopping:
            self.poll_mailbox(100)
            self.check_children()
        self.shutdown()

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
            actors.append({
                "role": role,
                "pid": child.pid,
                "state": child.state if alive else "dead",
                "rss_bytes": rss,
                "cpu_percent": cpu,
                "mailbox": child.figures.get("mailbox", 0),
                "restarts": child.restarts,
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

    def shutdown(self) -> None:
        timeout_s = self.cfg.supervisor.stop_timeout_ms / 1000
        try:
            for role in [FRONT_DOOR, LOG_MANAGER, CACHE_MANAGER, *self.order[2:-1]]:
                child = self.children[role]
                proc = child.process
                if proc is None or proc.exitcode is not None:
                    continue
                sock = self.zctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(mailbox_address(self.run_dir, role))
                try:
                    sock.send(codec.encode(Stop(self.stop_reason or "stop")), zmq.NOBLOCK)
                except zmq.Again:
                    proc.terminate()
                proc.join(timeout_s)
                sock.close(0)
                if proc.exitcode is None:
                    log.error("%s did not stop within %.0f s; killing it", role, timeout_s)
                    proc.kill()
                    proc.join(5)
                child.state = "stopped"
        finally:
            for child in self.children.values():
                if child.process is not None and child.process.exitcode is None:
                    child.process.kill()
                    child.process.join(5)
            if self.mailbox is not None:
                self.mailbox.close(0)
            if self.front is not None:
                self.front.close(0)
            self.mailbox = self.front = None
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            log.info("node stopped")
