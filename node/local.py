"""Run a node as a child process group on this machine: for tests, the demo, the benchmark
and the crash test.

``LocalNode`` starts ``python -m node start`` in a new session, waits until it answers
``status``, and can stop it cleanly (SIGTERM), kill one actor, or kill the whole node
(SIGKILL to every process of it at once). ``stop`` checks that no process is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import psutil
import zmq

from actors.curve import curve_client
from node.client import NodeClient
from wire.protocol import unpack_replies

READY_POLL_MS = 20  # how often wait_ready asks a starting node for its status


# Ports handed out for nodes are taken below the kernel's ephemeral range, which outgoing
# connections take their local ports from: a port the kernel picked for ``bind(0)`` was
# closed again and could be any connection's local port by the time a node bound it
# (a test's demo found its port in use, on a machine running other tests' nodes).
PORTS_LOW = 20_000
PORT_PICKS_MAX = 200


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket holds ``host:port``: bound as ZeroMQ binds (SO_REUSEADDR, so
    a port left in TIME_WAIT by a node that stopped is free), then closed. Only EADDRINUSE
    counts; any other failure is left to the front door's own bind."""
    bind_host = "" if host == "*" else host.strip("[]")
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def free_port(span: int = 1) -> int:
    """A port ``p`` on 127.0.0.1 such that ``p`` .. ``p + span - 1`` are free, taken at
    random below the ephemeral range (a port the kernel picks for ``bind(0)`` after a few
    tries, when that range starts too low to leave room)."""
    high = _ephemeral_low() - span
    pick = random.SystemRandom()
    for _ in range(PORT_PICKS_MAX if high > PORTS_LOW else 0):
        port = pick.randrange(PORTS_LOW, high)
        if all(not port_in_use("127.0.0.1", port + i) for i in range(span)):
            return port
    for _ in range(PORT_PICKS_MAX):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + span <= 65536 and all(not port_in_use("127.0.0.1", port + i) for i in range(span)):
            return port
    raise RuntimeError(f"no {span} free ports in a row found on 127.0.0.1")


class NodeFailed(RuntimeError):
    """The node process exited or did not come up; carries the tail of its output."""


class LocalNode:
    def __init__(self, data_dir: Path, port: int | None = None, config: Path | None = None,
                 log_file: Path | None = None, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, server_public_key: bytes | None = None,
                 client_keys: tuple[bytes, bytes] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.config = config
        self.log_file = log_file or (self.data_dir.parent / f"node-{self.port}.log")
        self.extra_args = extra_args or []
        self.env = env  # added to this process's environment (fault seams in tests)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        # A node with CURVE on (``[security]`` in its config): the keys its clients use.
        self.server_public_key = server_public_key
        self.client_keys = client_keys

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def client(self, **kw: Any) -> NodeClient:
        kw.setdefault("server_public_key", self.server_public_key)
        kw.setdefault("client_keys", self.client_keys)
        return NodeClient(self.endpoint, **kw)

    def start(self, timeout_s: float = 60.0) -> LocalNode:
        self.start_process()
        self.wait_ready(timeout_s)
        return self

    def start_process(self) -> None:
        """Start the node's process; ``wait_ready`` waits until it serves."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "node", "start", "--data-dir", str(self.data_dir),
               "--port", str(self.port), "--exit-with-parent"]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        cmd += self.extra_args
        self._log = open(self.log_file, "ab")  # noqa: SIM115 - open while the node runs
        env = None if self.env is None else {**os.environ, **self.env}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)

    def wait_ready(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Ask ``status`` every ``READY_POLL_MS`` until every actor runs; raise with the
        node's log if it died. Any answer counts, however late: waiting on each request
        with a timeout rounded the start-up time up to that timeout (by half a second).
        Requests are only sent once the front door listens (``IMMEDIATE``), so a node that
        takes long to recover is not met by a pile of them, nor can a full queue block."""
        deadline = time.monotonic() + timeout_s
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        if self.server_public_key is not None and self.client_keys is not None:
            curve_client(sock, self.server_public_key, *self.client_keys)
        sock.connect(self.endpoint)
        ids = itertools.count(1)
        try:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise NodeFailed(f"node exited with {self.proc.returncode}:\n{self.log_tail()}")
                asked = time.monotonic()
                with contextlib.suppress(zmq.Again):  # not connected yet: ask next time
                    sock.send(msgpack.packb({"op": "status", "id": next(ids)}), zmq.NOBLOCK)
                while (left_ms := READY_POLL_MS - (time.monotonic() - asked) * 1000) > 0:
                    if not sock.poll(int(left_ms) + 1, zmq.POLLIN):
                        break
                    for reply in unpack_replies(sock.recv()):
                        st = reply.get("status") if reply.get("ok") else None
                        if st is None:
                            continue
                        mine = self.proc is None or st["pid"] == self.proc.pid  # not another node's port
                        if mine and all(a["state"] == "running" for a in st["actors"]):
                            return dict(st)
                if time.monotonic() > deadline:
                    raise NodeFailed(f"node not ready in {timeout_s} s:\n{self.log_tail()}")
        finally:
            sock.close(0)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def processes(self) -> list[psutil.Process]:
        """The supervisor and every process in its session."""
        if self.proc is None:
            return []
        found = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getsid(p.pid) == self.proc.pid:
                    found.append(p)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return found

    def actor_pid(self, role: str) -> int:
        with self.client(timeout_ms=2000) as c:
            for a in c.status()["actors"]:
                if a["role"] == role:
                    return int(a["pid"])
        raise KeyError(role)

    def kill_actor(self, role: str) -> int:
        pid = self.actor_pid(role)
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill(self) -> None:
        """SIGKILL the whole node at once (supervisor and every actor)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._wait_gone(10)
        self._close_log()

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code. Raises if any process is left behind."""
        if self.proc is None:
            return 0
        members = self.processes()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise NodeFailed(f"node did not stop within {timeout_s} s:\n{self.log_tail()}") from None
        left = [p for p in members if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        self._wait_gone(10)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        self._close_log()
        if left:
            raise NodeFailed(f"processes left behind after stop: {[p.pid for p in left]}")
        return code

    def _wait_gone(self, timeout_s: float) -> None:
        """Wait until no process of the node's session runs. A zombie has exited: it only
        waits for its new parent to reap it, which some init processes do a second or more
        later."""
        deadline = time.monotonic() + timeout_s
        while any(_running(p) for p in self.processes()) and time.monotonic() < deadline:
            time.sleep(0.02)  # poll until the session's processes are gone

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        self.proc = None if self.proc is None or self.proc.poll() is not None else self.proc

    def __enter__(self) -> LocalNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()


class LocalCluster:
    """A cluster of ``LocalNode`` members on this machine: a cluster file listing ``n``
    members on free ports (or ``base_port`` and on), member ``i`` (1..n) with its data in
    ``root/node-i``."""

    def __init__(self, root: Path, n: int, config: Path | None = None,
                 env: dict[str, str] | None = None, base_port: int | None = None) -> None:
        from config.cluster import Member, cluster_text

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.file = self.root / "cluster.toml"
        first = free_port(span=n) if base_port is None else base_port
        ports = [first + i for i in range(n)]
        members = [Member(i + 1, f"tcp://127.0.0.1:{port}") for i, port in enumerate(ports)]
        self.file.write_text(cluster_text(members))
        self.nodes = {
            m.id: LocalNode(self.root / f"node-{m.id}", port=m.port, config=config,
                            log_file=self.root / f"node-{m.id}.log", env=env,
                            extra_args=["--cluster", str(self.file), "--node-id", str(m.id)])
            for m in members}

    @property
    def endpoints(self) -> list[str]:
        return [n.endpoint for n in self.nodes.values()]

    def client(self, **kw: Any) -> NodeClient:
        """A client routed by the cluster's map."""
        return NodeClient(self.endpoints, **kw)

    def forwarded(self, timeout_s: float = 10.0) -> int:
        """Clients' requests the members forwarded to each other, in all: their front doors'
        figures, as reported after this call began (an actor reports about once a second)."""
        since = time.time()
        total = 0
        for node in self.nodes.values():
            deadline = time.monotonic() + timeout_s
            with node.client(timeout_ms=int(timeout_s * 1000)) as c:
                while True:
                    front = next(a for a in c.status()["actors"] if a["role"] == "front")
                    if float(front["figures"].get("reported_at", 0)) > since:
                        break
                    if time.monotonic() > deadline:
                        raise NodeFailed(f"{node.endpoint} reported no figures in {timeout_s} s")
                    time.sleep(0.05)  # poll until the front door's next report
            total += int(front["figures"]["forwarded"])
        return total

    def start(self, timeout_s: float = 90.0) -> LocalCluster:
        """Start every member at once, then wait until each is ready."""
        for node in self.nodes.values():
            node.start_process()
        for node in self.nodes.values():
            node.wait_ready(timeout_s)
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.proc is not None:
                node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _running(p: psutil.Process) -> bool:
    try:
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False

