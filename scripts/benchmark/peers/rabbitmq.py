"""RabbitMQ quorum queues as a peer: the peer users would most often pick instead of the
node for durable messages. Debian's ``rabbitmq-server`` (installed when missing, as root),
started by the bench as a node of its own: a unique node name, free loopback ports for
AMQP, distribution and its own epmd, and its data, logs, config and Erlang cookie under the
bench's directory; no plugins. A quorum queue confirms a message only once its write-ahead
log is fdatasync'ed, as the node acknowledges only what is on disk.

Stopping: SIGTERM to the server script, which stops the Erlang VM gracefully and waits for
it; then whatever process still carries this node's name in its environment is killed,
and last the epmd the bench started. Every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import psutil

from node.local import free_port

from ..settings import RABBITMQ, SERVE_TIMEOUT_S, Settings
from ..workloads.rabbitmq import rabbitmq_produce, rabbitmq_produce_single, rabbitmq_read_tail
from .base import ServerPeer, Workloads, dir_bytes, find_or_install

log = logging.getLogger(__name__)

# The package's own start script: /usr/sbin/rabbitmq-server switches to the rabbitmq user
# and its system-wide directories.
SERVER_SCRIPT = "/usr/lib/rabbitmq/bin/rabbitmq-server"
SCENARIOS = frozenset({"ingest-batched", "ingest-single", "read-tail"})
STOP_TIMEOUT_S = 60.0   # a graceful stop; then SIGKILL
EXIT_TIMEOUT_S = 10.0   # a killed or terminated helper process must be gone by then
POLL_S = 0.1            # poll interval while the server starts


class RabbitServer:
    """A RabbitMQ node of the bench's own; a topic's partitions are quorum queues."""

    system = RABBITMQ
    workloads = Workloads(rabbitmq_produce, rabbitmq_produce_single, rabbitmq_read_tail)
    note: Mapping[str, str] = MappingProxyType({
        "ingest-batched": "quorum queue per producer, confirms awaited a batch at a time",
        "ingest-single": "aio-pika, concurrent publishes each awaiting its confirm",
        "read-tail": "consume, one ack (multiple) per batch, two batches prefetched",
    })
    reads_consume = True

    def __init__(self, program: str, work_dir: Path, soft_limit: int) -> None:
        self.program = program
        self.dir = work_dir.resolve()  # the server runs in it: its paths must be absolute
        self.dir.mkdir(parents=True, exist_ok=True)
        ports: set[int] = set()
        while len(ports) < 3:  # AMQP, Erlang distribution, epmd: three different ones
            ports.add(free_port())
        self.port, self.dist_port, self.epmd_port = sorted(ports)
        self.nodename = f"shardnode-bench-{os.getpid()}-{self.port}@localhost"
        self.target = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        (self.dir / "rabbitmq.conf").write_text("log.console = false\nlog.file.level = info\n")
        # Confirms must not be throttled by the channel's bound on commands outstanding to a
        # quorum queue (default 32): a batched producer has a whole batch outstanding.
        (self.dir / "advanced.config").write_text(
            f"[{{rabbit, [{{quorum_commands_soft_limit, {soft_limit}}}]}}].\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")  # not the system's /etc one

    def env(self) -> dict[str, str]:
        d = self.dir
        return {
            **os.environ,
            "HOME": str(d),  # the Erlang cookie goes here
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            # distribution on the loopback only, and never an epmd of the VM's own making
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
                "-kernel inet_dist_use_interface {127,0,0,1} -start_epmd false",
        }

    def runs(self, scenario: str) -> bool:
        return scenario in SCENARIOS

    def start(self) -> None:
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        self.epmd = subprocess.Popen([epmd, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while not _listening(self.epmd_port):
            if self.epmd.poll() is not None:
                raise RuntimeError(f"epmd exited with {self.epmd.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"epmd not listening in {SERVE_TIMEOUT_S} s")
            time.sleep(POLL_S)
        startup_log = self.dir / "startup.log"
        with startup_log.open("wb") as out:
            self.proc = subprocess.Popen([self.program], env=self.env(), cwd=self.dir,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        t0 = time.monotonic()
        while not (_listening(self.port) and _amqp_answers(self.target)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited with {self.proc.returncode}; see "
                                   f"{startup_log} and {self.dir / 'log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"rabbitmq-server not answering in {SERVE_TIMEOUT_S} s")
            time.sleep(POLL_S)
        log.info("rabbitmq-server answering after %.1f s", time.monotonic() - t0)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()  # the script stops the VM gracefully and waits for it
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("rabbitmq-server not stopped in %s s: killing it", STOP_TIMEOUT_S)
        self.kill()

    def kill(self) -> None:
        """SIGKILL whatever is left: the server's process group, any process carrying this
        node's name (started by it in a session of its own), and the bench's epmd."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(EXIT_TIMEOUT_S)
            self.proc = None
        left = self._leftovers()
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        _, alive = psutil.wait_procs(left, timeout=EXIT_TIMEOUT_S)
        if alive:
            raise RuntimeError(f"rabbitmq processes still alive: {[p.pid for p in alive]}")
        if self.epmd is not None:
            self.epmd.terminate()
            try:
                self.epmd.wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.epmd.kill()
                self.epmd.wait(EXIT_TIMEOUT_S)
            self.epmd = None

    def _leftovers(self) -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if p.environ().get("RABBITMQ_NODENAME") == self.nodename:
                    found.append(p)
        return found

    def processes(self) -> list[psutil.Process]:
        found = []
        for proc in (self.proc, self.epmd):
            if proc is None:
                continue
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(proc.pid)
                found += [p, *p.children(recursive=True)]
        return found

    def create_topic(self, name: str, partitions: int) -> None:
        """One durable quorum queue per partition."""
        asyncio.run(_declare(self.target, [f"{name}:{p}" for p in range(partitions)]))

    def log_bytes(self) -> int:
        return dir_bytes(self.dir / "mnesia")

    def serves(self, name: str, lasts: dict[int, str]) -> bool:
        raise NotImplementedError("recovery is not run against rabbitmq")

    def recovery_note(self) -> str:
        return ""


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _amqp_answers(url: str) -> bool:
    """Whether the broker accepts a login (it opens its port before it is fully up)."""
    async def ping() -> None:
        import aio_pika

        connection = await aio_pika.connect(url, timeout=2)
        await connection.close()

    try:
        asyncio.run(ping())
    except Exception:  # refused, reset, not ready yet: aio-pika raises several kinds
        return False
    return True


async def _declare(url: str, queues: list[str]) -> None:
    import aio_pika

    connection = await aio_pika.connect(url, timeout=30)
    async with connection:
        channel = await connection.channel()
        for queue in queues:
            await channel.declare_queue(queue, durable=True, timeout=30,
                                        arguments={"x-queue-type": "quorum"})


def _locate() -> str | None:
    return SERVER_SCRIPT if os.access(SERVER_SCRIPT, os.X_OK) else None


def find(install: bool) -> str:
    """The server script of Debian's ``rabbitmq-server``, installed if missing and root."""
    return find_or_install("rabbitmq-server", "rabbitmq-server", _locate, install)


def make(program: str, work_dir: Path, settings: Settings) -> RabbitServer:
    # twice the most a channel has outstanding: a batch, or ingest-single's writers
    return RabbitServer(program, work_dir, 2 * max(settings.batch, settings.concurrency))


PEER = ServerPeer(RABBITMQ, "rabbitmq-server", find, make)
