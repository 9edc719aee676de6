"""``scripts/cluster``: a local cluster on this machine, each member a ``shardnode start``
running in the background.

    scripts/cluster up [--nodes 3] [--base-port 7400]    start the members that are down,
                                                         wait until each answers (if one
                                                         does not, stop those it started)
    scripts/cluster status [--json]     node, endpoint, pid, state, partitions, log MB, RSS,
                                        actor restarts
    scripts/cluster stop-node N | kill-node N | start-node N
    scripts/cluster down                stop every member cleanly; nothing is left running

Every command takes ``--data-dir`` (default ``./var/cluster``), which holds:

    cluster.toml   the cluster file (config/cluster.py), written by the first ``up``
    node-N/        member N's data (``shardnode start --cluster``'s default)
    node-N.log     member N's output, appended to at each start
    node-N.pid     the pid of member N's supervisor while it runs

A member runs ``python -m node start --cluster FILE --node-id N`` in a session of its own,
stdin from /dev/null: it outlives the command that started it, and its supervisor leads the
process group its actors are in. A pid file is never trusted alone: its process must be
running ``--cluster FILE --node-id N``, so a recycled pid is never signalled. A pid file
whose process is gone (a crash) is stale: ``up`` starts that member again and the node
recovers from its log. A member with no such process is asked on its endpoint all the same:
one started by hand (``shardnode start --cluster FILE --node-id N``) is shown as up, not
started by this script, and ``stop-node``, ``kill-node`` and ``down`` leave it running and
say so.

``stop-node`` and ``down`` send SIGTERM (a clean stop: a checkpoint, then every actor
exits), wait, bounded, and SIGKILL what is left, saying so. ``kill-node`` is a crash:
SIGKILL to the member's whole process group at once.

Exit codes: 0 done; 1 failed (a member did not come up, had to be killed, is left running
by ``stop-node`` or ``down`` because this script did not start it, or is not running for
``kill-node``; a failed ``up`` or ``start-node`` leaves none of the members it started
running; a file of the data dir cannot be written); 2 usage (bad arguments, a ``--data-dir``
that is not a directory or cannot be made, no cluster file, a node id that is not a member,
``--nodes`` or ``--base-port`` differing from the cluster file).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgpack
import psutil
import zmq
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from config import ConfigError
from config.cluster import MEMBERS_MAX, Member, cluster_text, parse_members
from node.cli import stdout_closed
from node.client import NodeClient
from wire.errors import NodeError
from wire.protocol import Topic, request_map, unpack_replies

HOST = "127.0.0.1"
NODES_DEFAULT = 3
BASE_PORT_DEFAULT = 7400
DATA_DIR_DEFAULT = "./var/cluster"
# A clean stop is bounded inside the node too: its checkpoint by [log] checkpoint_timeout_ms
# (30 s), each actor's stop by [supervisor] stop_timeout_ms (15 s).
STOP_TIMEOUT_MS = 60_000
START_TIMEOUT_MS = 60_000  # until every member answers status with all its actors running
STATUS_TIMEOUT_MS = 1_000  # a member silent this long is shown as not answering
PROBE_TIMEOUT_MS = 1_000  # a connection to a member's port, to tell whether anything listens
KILL_WAIT_MS = 10_000  # after SIGKILL, until every process of the member is gone
ASK_EVERY_MS = 20  # a member not connected yet, or not ready, is asked again this often
RESEND_MS = 500  # a request unanswered this long is sent again (a dropped connection)
GONE_POLL_MS = 20  # how often a wait for processes to exit looks (they are not our children)
LOG_TAIL_LINES = 40
START_TIMEOUT_HELP = ("how long to wait, in ms, until each member answers with all its "
                      "actors running; if one does not, the command fails and stops the "
                      "members it started (default %(default)s)")
STOP_TIMEOUT_HELP = ("how long to wait, in ms, for a member to stop cleanly after SIGTERM "
                     "(a checkpoint first); then it is killed (default %(default)s)")
TABLE_WIDTH_PIPED = 120  # columns of a table printed to a pipe or a file

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# A member's state in ``status``.
UP = "up"  # it answers, every actor running
DEGRADED = "degraded"  # it answers, an actor is starting or being restarted
NOT_ANSWERING = "not answering"  # its process runs, no answer within the timeout
DOWN = "down"  # no process


def _console() -> Console:
    """Rich's console; as wide as the tables need when the output is not a terminal (rich
    would cut it at 80 columns)."""
    terminal = Console()
    return terminal if terminal.is_terminal else Console(width=TABLE_WIDTH_PIPED)


console = _console()
err_console = Console(stderr=True, soft_wrap=True)  # messages stay one line in logs


class UsageError(Exception):
    """The command cannot run as asked (exit 2): bad arguments, no cluster file, arguments
    contradicting the cluster file."""


@dataclass(frozen=True)
class ClusterDir:
    """Where a local cluster keeps its files (``root`` absolute)."""

    root: Path

    @property
    def file(self) -> Path:
        return self.root / "cluster.toml"

    def pid_file(self, node_id: int) -> Path:
        return self.root / f"node-{node_id}.pid"

    def log_file(self, node_id: int) -> Path:
        return self.root / f"node-{node_id}.log"

    def members(self) -> tuple[Member, ...]:
        """The cluster file's members; ``UsageError`` when there is none."""
        try:
            text = self.file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"no cluster in {self.root} (no cluster.toml): "
                             f"`scripts/cluster up` makes one") from None
        except OSError as exc:
            raise UsageError(f"cannot read the cluster file {self.file}: {exc.strerror} "
                             f"(--data-dir)") from None
        return parse_members(text, str(self.file))

    def member(self, node_id: int) -> Member:
        members = self.members()
        for m in members:
            if m.id == node_id:
                return m
        raise UsageError(f"node {node_id} is not a member of {self.file} "
                         f"(members: {', '.join(str(m.id) for m in members)})")


# ---- the cluster file (no I/O) --------------------------------------------------------------


def plan_members(nodes: int, base_port: int) -> tuple[Member, ...]:
    """Members 1..``nodes`` on ``HOST``, at consecutive ports from ``base_port``."""
    if not 1 <= nodes <= MEMBERS_MAX:
        raise UsageError(f"--nodes must be 1-{MEMBERS_MAX}, got {nodes}")
    if not 1 <= base_port <= 65535 - (nodes - 1):
        raise UsageError(f"--base-port {base_port} with {nodes} nodes: ports must be 1-65535")
    return tuple(Member(i, f"tcp://{HOST}:{base_port + i - 1}") for i in range(1, nodes + 1))


def contradiction(members: tuple[Member, ...], nodes: int | None,
                  base_port: int | None) -> str:
    """How ``--nodes`` and ``--base-port``, where given, differ from an existing cluster
    file's ``members``; "" when they agree."""
    if nodes is not None and nodes != len(members):
        return f"--nodes {nodes}, but the cluster file lists {len(members)} members"
    if base_port is not None:
        ports = [m.port for m in members]
        if ports != list(range(base_port, base_port + len(members))):
            return (f"--base-port {base_port}, but the cluster file's members listen on "
                    f"ports {', '.join(map(str, ports))}")
    return ""


def cluster_members(cdir: ClusterDir, nodes: int | None, base_port: int | None
                    ) -> tuple[Member, ...]:
    """The members of the cluster in ``cdir``: its file's, or those of a new file written
    from ``nodes`` and ``base_port``."""
    if cdir.file.exists():
        members = cdir.members()
        wrong = contradiction(members, nodes, base_port)
        if wrong:
            raise UsageError(f"{wrong} ({cdir.file}); leave the option out to use the file, "
                             f"or use another --data-dir")
        return members
    members = plan_members(NODES_DEFAULT if nodes is None else nodes,
                           BASE_PORT_DEFAULT if base_port is None else base_port)
    try:
        cdir.root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make the data dir {cdir.root}: {exc.strerror} "
                         f"(--data-dir)") from None
    _write_replacing(cdir.file, cluster_text(members))
    return members


def _write_replacing(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---- a member's processes -------------------------------------------------------------------


def runs_member(cmdline: list[str], cluster_file: Path, node_id: int) -> bool:
    """Whether a process with ``cmdline`` is member ``node_id`` of the cluster whose file is
    ``cluster_file``, as ``start_member`` starts it."""

    def value(flag: str) -> str | None:
        at = cmdline.index(flag) if flag in cmdline else -1
        return cmdline[at + 1] if 0 <= at < len(cmdline) - 1 else None

    return ("start" in cmdline and value("--cluster") == str(cluster_file)
            and value("--node-id") == str(node_id))


def member_process(cdir: ClusterDir, node_id: int) -> psutil.Process | None:
    """Member ``node_id``'s supervisor, when its pid file names a live process that is that
    member; None otherwise (no pid file, a dead process, a pid recycled by another)."""
    try:
        pid = int(cdir.pid_file(node_id).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc if runs_member(proc.cmdline(), cdir.file, node_id) else None
    except psutil.Error:
        return None


def session_of(leader: psutil.Process) -> list[psutil.Process]:
    """A member's processes: its supervisor and every process of the session it leads (the
    actors, multiprocessing's resource tracker)."""
    found = [leader]
    for p in psutil.process_iter():
        if p.pid == leader.pid:
            continue
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(p.pid) == leader.pid:
                found.append(p)
    return found


def alive(p: psutil.Process) -> bool:
    """Running, and not a zombie (one has exited; its new parent reaps it when it will)."""
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def wait_gone(procs: Iterable[psutil.Process], timeout_ms: int) -> list[psutil.Process]:
    """Wait until none of ``procs`` is alive, at most ``timeout_ms``; those still alive."""
    procs = list(procs)
    deadline = time.monotonic() + timeout_ms / 1000
    while (left := [p for p in procs if alive(p)]) and time.monotonic() < deadline:
        time.sleep(GONE_POLL_MS / 1000)  # not our children: nothing to wait on but polling
    return left


def kill_group(leader: psutil.Process, procs: list[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL a member's process group at once (a crash), then any other process of
    ``procs`` (its session); the ones still alive after ``KILL_WAIT_MS``."""
    if alive(leader):  # checked again just before: never a recycled pid's group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if alive(p):
                p.kill()
    return wait_gone(procs, KILL_WAIT_MS)


def start_member(cdir: ClusterDir, member: Member) -> subprocess.Popen[bytes]:
    """Start ``member`` in a session of its own, its output to its log file; write its pid
    file."""
    cmd = [sys.executable, "-m", "node", "start", "--cluster", str(cdir.file),
           "--node-id", str(member.id)]
    with open(cdir.log_file(member.id), "ab") as out:
        out.write(f"\n--- scripts/cluster {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                  f"{' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=cdir.root)
    _write_replacing(cdir.pid_file(member.id), f"{proc.pid}\n")
    return proc


def port_in_use(member: Member) -> bool:
    """Whether something listens on ``member``'s port already (a node there would fail)."""
    family = socket.AF_INET6 if ":" in member.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds
        try:
            s.bind((member.host, member.port))
        except OSError:
            return True
    return False


def port_open(member: Member) -> bool:
    """Whether something accepts a connection on ``member``'s port (refused at once when
    nothing listens there)."""
    try:
        with socket.create_connection((member.host, member.port), PROBE_TIMEOUT_MS / 1000):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---- asking members -------------------------------------------------------------------------


def ask_status(endpoints: dict[int, str], timeout_ms: int,
               accept: Callable[[int, dict[str, Any]], bool],
               gone: Callable[[int], bool] = lambda node_id: False) -> dict[int, dict[str, Any]]:
    """Ask each member (id → endpoint) for its status, all at once, until its answer is
    accepted, it is ``gone``, or ``timeout_ms`` has passed; the accepted answers.

    A request is sent only once the member's port is connected (``IMMEDIATE``): a member
    that is not listening yet is tried again every ``ASK_EVERY_MS``, not sent a pile. One
    answered but not accepted (not ready) is asked again after ``ASK_EVERY_MS``; one
    unanswered after ``RESEND_MS`` is asked again."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    socks: dict[int, zmq.Socket[bytes]] = {}
    poller = zmq.Poller()
    answers: dict[int, dict[str, Any]] = {}
    next_ask: dict[int, float] = {}
    ids = itertools.count(1)
    deadline = time.monotonic() + timeout_ms / 1000
    try:
        for node_id, endpoint in endpoints.items():
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.connect(endpoint)
            socks[node_id] = sock
            poller.register(sock, zmq.POLLIN)
            next_ask[node_id] = 0.0
        by_sock = {sock: node_id for node_id, sock in socks.items()}
        while True:
            now = time.monotonic()
            waiting = [n for n in socks if n not in answers and not gone(n)]
            if not waiting or now >= deadline:
                return answers
            for n in waiting:
                if now < next_ask[n]:
                    continue
                try:
                    socks[n].send(msgpack.packb(request_map("status", next(ids), {})),
                                  zmq.NOBLOCK)
                    next_ask[n] = now + RESEND_MS / 1000
                except zmq.Again:  # not connected yet
                    next_ask[n] = now + ASK_EVERY_MS / 1000
            wake = min([deadline, now + ASK_EVERY_MS / 1000, *(next_ask[n] for n in waiting)])
            for sock, _ in poller.poll(max(1, int((wake - now) * 1000))):
                n = by_sock[sock]
                for reply in unpack_replies(sock.recv()):
                    st = reply.get("status") if reply.get("ok") else None
                    if st is None or n in answers:
                        continue
                    if accept(n, st):
                        answers[n] = st
                    else:
                        next_ask[n] = time.monotonic() + ASK_EVERY_MS / 1000
    finally:
        for sock in socks.values():
            sock.close(0)


def ask_started_elsewhere(members: Iterable[Member], timeout_ms: int
                          ) -> dict[int, dict[str, Any]]:
    """The status answers of those of ``members`` (none a process of a pid file here) that
    answer on their endpoints: started by hand (``shardnode start --cluster FILE --node-id
    N``), not by this script. Only those whose port is open are asked: one that is down
    costs no wait."""
    listening = {m.id: m.endpoint for m in members if port_open(m)}
    return ask_status(listening, timeout_ms, accept=lambda n, st: True)


def all_running(st: dict[str, Any]) -> bool:
    return all(a["state"] == "running" for a in st["actors"])


def owned_partitions(endpoint: str, timeout_ms: int) -> collections.Counter[int] | None:
    """Partitions per member id, from the owners of every topic a member lists (the catalog
    member, the lowest id, sees every topic's placement); None if it does not answer. A
    topic without owners (a single node's) counts for no member."""
    try:
        with NodeClient(endpoint, timeout_ms=timeout_ms, retries=0) as c:
            rows = c.call("list_topics")["topics"]
    except NodeError:
        return None
    return collections.Counter(o for row in rows for o in Topic.from_row(row).owners)


# ---- status -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRow:
    """A member as ``status`` shows it (None: not known, the member not answering)."""

    id: int
    endpoint: str
    pid: int | None
    state: str
    partitions: int | None
    log_bytes: int | None
    rss_bytes: int | None  # supervisor and actors
    # Each actor's restarts since the node started, added up: the supervisor restarts the
    # actors started after one that died too (rest-for-one), so one death counts several.
    restarts: int | None
    started_elsewhere: bool = False  # it answers, but no pid file here names its process


def node_row(member: Member, pid: int | None, answer: dict[str, Any] | None,
             owned: collections.Counter[int] | None, started_elsewhere: bool = False
             ) -> NodeRow:
    """``member``'s row, from its pid (None: no process), its status answer (None: none)
    and the partitions per member (None: no member answered); ``started_elsewhere``: the
    answer came from a member this script did not start."""
    partitions = None if owned is None else owned[member.id]
    if pid is None or answer is None:
        return NodeRow(member.id, member.endpoint, pid, DOWN if pid is None else NOT_ANSWERING,
                       partitions, None, None, None)
    actors = answer["actors"]
    rss = answer.get("supervisor_rss_bytes") or 0
    rss += sum(a["rss_bytes"] or 0 for a in actors)
    return NodeRow(member.id, member.endpoint, pid, UP if all_running(answer) else DEGRADED,
                   partitions, answer["log"].get("log_bytes"), rss,
                   sum(int(a["restarts"]) for a in actors), started_elsewhere)


def cluster_status(cdir: ClusterDir, timeout_ms: int) -> list[NodeRow]:
    """Each member's row. Those whose pid file names their process are asked for their
    status; the others too when their port is open (started by hand, not by this script),
    all at once."""
    members = cdir.members()
    procs = {m.id: member_process(cdir, m.id) for m in members}
    pids = {n: p.pid for n, p in procs.items() if p is not None}
    endpoints = {m.id: m.endpoint for m in members if m.id in pids or port_open(m)}
    answers = ask_status(endpoints, timeout_ms,
                         accept=lambda n, st: n not in pids or st["pid"] == pids[n])
    asked = next((m for m in members if m.id in answers), None)
    owned = None if asked is None else owned_partitions(asked.endpoint, timeout_ms)
    rows = []
    for m in members:
        answer = answers.get(m.id)
        if m.id in pids or answer is None:
            rows.append(node_row(m, pids.get(m.id), answer, owned))
        else:
            rows.append(node_row(m, int(answer["pid"]), answer, owned, started_elsewhere=True))
    return rows


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


def _text(v: int | None) -> str:
    return "-" if v is None else str(v)


STATE_STYLE = {UP: "green", DEGRADED: "yellow", NOT_ANSWERING: "red", DOWN: "red"}
ELSEWHERE = "not started by this script"  # a member that answers with no pid file here
ELSEWHERE_SHORT = "not started here"  # the same in the status table, and its caption says it


def cmd_status(args: argparse.Namespace) -> int:
    cdir = _cluster_dir(args)
    rows = cluster_status(cdir, args.timeout_ms)
    if args.json:
        print(json.dumps({"cluster_file": str(cdir.file), "data_dir": str(cdir.root),
                          "nodes": [asdict(r) for r in rows]}, indent=2))
        return EXIT_OK
    caption = f"data, logs and pid files in {cdir.root}"
    if any(r.started_elsewhere for r in rows):
        caption += (f"\n{ELSEWHERE_SHORT}: {ELSEWHERE} (no pid file names its process): "
                    f"stop-node, kill-node and down leave it running")
    t = Table(title=f"cluster {cdir.file}", caption=caption)
    # Actor restarts: each actor's, added up (one death restarts the actors after it too).
    for col in ("node", "endpoint", "pid", "state", "partitions", "log MB", "RSS MB",
                "actor restarts"):
        t.add_column(col, justify="left" if col in ("endpoint", "state") else "right")
    for r in rows:
        elsewhere = f", {ELSEWHERE_SHORT}" if r.started_elsewhere else ""
        t.add_row(str(r.id), r.endpoint, _text(r.pid),
                  f"[{STATE_STYLE[r.state]}]{r.state}[/]{elsewhere}", _text(r.partitions),
                  _mb(r.log_bytes), _mb(r.rss_bytes), _text(r.restarts))
    console.print(t)
    return EXIT_OK


# ---- up, start-node -------------------------------------------------------------------------


def bring_up(cdir: ClusterDir, members: tuple[Member, ...], timeout_ms: int) -> int:
    """Start each of ``members`` that is not running, then wait until every one answers
    with all its actors running. Exit 1 if one does not come up, leaving none of those
    this call started running: when a member's port is taken none is started; one that
    started and did not come up is killed, and the others it started are stopped cleanly
    (``stop_members``). Members that were running already are left as they were. Each
    failed member's log tail is printed, if it was started and has one."""
    running = {m.id: member_process(cdir, m.id) for m in members}
    started: dict[int, subprocess.Popen[bytes]] = {}
    failed: dict[int, str] = {}
    notes: dict[int, str] = {}
    to_start = [m for m in members if running[m.id] is None]
    for m in members:
        if running[m.id] is not None:
            notes[m.id] = "already up"
        elif port_in_use(m):
            failed[m.id] = f"port {m.port} is in use by another process"
            cdir.pid_file(m.id).unlink(missing_ok=True)
    for m in to_start:
        if failed:  # a port is taken: the cluster cannot come up, so none is started
            notes.setdefault(m.id, "not started: a member's port is taken")
            continue
        if cdir.pid_file(m.id).exists():
            notes[m.id] = "started again (stale pid file: it recovers from its log)"
        started[m.id] = start_member(cdir, m)
        notes.setdefault(m.id, "started")
    already = [f"node {n} (pid {p.pid})" for n, p in running.items() if p is not None]
    if already:
        console.print(f"already up: {', '.join(already)}")
    pids = {n: p.pid for n, p in running.items() if p is not None}
    pids.update({n: p.pid for n, p in started.items()})

    def gone(n: int) -> bool:
        if n in started:
            return started[n].poll() is not None
        proc = running[n]
        return proc is None or not alive(proc)

    answers = ask_status({m.id: m.endpoint for m in members if m.id in pids}, timeout_ms,
                         accept=lambda n, st: st["pid"] == pids[n] and all_running(st),
                         gone=gone)
    for n in pids:
        if n in answers:
            continue
        if gone(n):
            code = started[n].poll() if n in started else None
            failed[n] = "exited" + ("" if code is None else f" with code {code}")
        else:
            failed[n] = f"did not answer within {timeout_ms} ms"
        if n in started:
            proc = started[n]
            if proc.poll() is None:  # our child, not reaped: its pid is no other's
                with contextlib.suppress(psutil.Error):  # not left half up
                    leader = psutil.Process(proc.pid)
                    kill_group(leader, session_of(leader))
                proc.wait(KILL_WAIT_MS / 1000)
                failed[n] += "; killed it (the next start recovers it)"
            # (one that exited took its actors with it: they end with their parent)
            cdir.pid_file(n).unlink(missing_ok=True)

    # A failed up leaves none of the members it started running (those up already stay).
    undo = tuple(m for m in members if m.id in started and m.id not in failed) if failed else ()
    stop_code = EXIT_OK
    if undo:
        names = ", ".join(f"node {m.id}" for m in undo)
        console.print(f"{'node' if len(failed) == 1 else 'nodes'} "
                      f"{', '.join(map(str, failed))} did not come up: stopping what this up "
                      f"started ({names})")
        stop_code = stop_members(cdir, undo, STOP_TIMEOUT_MS)
        for m in undo:
            notes[m.id] = "started, then stopped: the up failed"

    t = Table(title=f"cluster {cdir.file}", caption=f"data, logs and pid files in {cdir.root}")
    for col in ("node", "endpoint", "pid", ""):
        t.add_column(col, justify="right" if col in ("node", "pid") else "left")
    stopped = {m.id for m in undo}
    for m in members:
        what = f"[red]failed: {escape(failed[m.id])}[/]" if m.id in failed else notes[m.id]
        pid = "-" if m.id in failed or m.id in stopped or m.id not in pids else str(pids[m.id])
        t.add_row(str(m.id), m.endpoint, pid, what)
    console.print(t)
    for n, why in failed.items():
        tail = log_tail(cdir.log_file(n)) if n in started else ""
        err_console.print(f"[red]node {n} did not come up:[/red] {escape(why)}"
                          + (f". The end of {cdir.log_file(n)}:" if tail.strip() else ""))
        if tail.strip():
            err_console.print(escape(tail), highlight=False)
    return EXIT_FAILED if failed or stop_code != EXIT_OK else EXIT_OK


def cmd_up(args: argparse.Namespace) -> int:
    cdir = _cluster_dir(args)
    return bring_up(cdir, cluster_members(cdir, args.nodes, args.base_port), args.timeout_ms)


def cmd_start_node(args: argparse.Namespace) -> int:
    cdir = _cluster_dir(args)
    return bring_up(cdir, (cdir.member(args.node_id),), args.timeout_ms)


# ---- stop-node, kill-node, down -------------------------------------------------------------


def stop_members(cdir: ClusterDir, members: tuple[Member, ...], timeout_ms: int) -> int:
    """SIGTERM every running one of ``members`` at once and wait, at most ``timeout_ms``;
    SIGKILL the process group of any still running, and any process of theirs left. Pid
    files are removed. A member this script did not start (it answers on its endpoint, and
    no pid file names its process) is left running, and said to be. Exit 1 if one had to
    be killed, or a process or a member is left."""
    running = {m.id: p for m in members if (p := member_process(cdir, m.id)) is not None}
    elsewhere = ask_started_elsewhere((m for m in members if m.id not in running),
                                      STATUS_TIMEOUT_MS)
    sessions = {n: session_of(p) for n, p in running.items()}
    for p in running.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)
    slow = {p.pid for p in wait_gone(running.values(), timeout_ms)}
    killed, left = [], []
    for n, p in running.items():
        if p.pid in slow:
            killed.append(n)
            left += kill_group(p, sessions[n])
        else:  # its supervisor stops its actors before it exits: any left are killed
            stray = wait_gone(sessions[n], KILL_WAIT_MS)
            if stray:
                killed.append(n)
                left += kill_group(p, stray)
    for m in members:
        if m.id in elsewhere:
            err_console.print(f"[red]node {m.id}:[/red] {_elsewhere_note(elsewhere[m.id])}; "
                              f"not stopped: stop it where it was started (Ctrl-C, or kill "
                              f"-TERM {elsewhere[m.id]['pid']})")
        elif m.id not in running:
            console.print(f"node {m.id}: not running")
        elif m.id in killed:
            err_console.print(f"[red]node {m.id}:[/red] did not stop within {timeout_ms} ms "
                              f"(pid {running[m.id].pid}); killed it (SIGKILL): the next "
                              f"start recovers from its log")
        else:
            console.print(f"node {m.id}: stopped (pid {running[m.id].pid})")
        cdir.pid_file(m.id).unlink(missing_ok=True)
    if left:
        err_console.print(f"[red]processes left running:[/red] {[p.pid for p in left]}")
    return EXIT_FAILED if killed or left or elsewhere else EXIT_OK


def _elsewhere_note(answer: dict[str, Any]) -> str:
    return f"running (pid {answer['pid']}), {ELSEWHERE}"


def cmd_stop_node(args: argparse.Namespace) -> int:
    cdir = _cluster_dir(args)
    return stop_members(cdir, (cdir.member(args.node_id),), args.timeout_ms)


def cmd_down(args: argparse.Namespace) -> int:
    cdir = _cluster_dir(args)
    return stop_members(cdir, cdir.members(), args.timeout_ms)


def cmd_kill_node(args: argparse.Namespace) -> int:
    cdir = _cluster_dir(args)
    member = cdir.member(args.node_id)
    leader = member_process(cdir, member.id)
    if leader is None:
        elsewhere = ask_started_elsewhere((member,), STATUS_TIMEOUT_MS).get(member.id)
        if elsewhere is not None:
            err_console.print(f"[red]node {member.id}:[/red] {_elsewhere_note(elsewhere)}; "
                              f"not killed")
        else:
            err_console.print(f"[red]node {member.id} is not running[/red]")
        cdir.pid_file(member.id).unlink(missing_ok=True)
        return EXIT_FAILED
    procs = session_of(leader)
    left = kill_group(leader, procs)
    cdir.pid_file(member.id).unlink(missing_ok=True)
    if left:
        err_console.print(f"[red]node {member.id}: processes left after SIGKILL:[/red] "
                          f"{[p.pid for p in left]}")
        return EXIT_FAILED
    console.print(f"node {member.id}: killed (SIGKILL to its {len(procs)} processes); "
                  f"`start-node {member.id}` recovers it from its log")
    return EXIT_OK


# ---- the command ------------------------------------------------------------------------------


def _cluster_dir(args: argparse.Namespace) -> ClusterDir:
    root = Path(args.data_dir).resolve()
    if root.exists() and not root.is_dir():
        raise UsageError(f"--data-dir {root} is not a directory: give the cluster's directory "
                         f"(`up` makes a new one)")
    return ClusterDir(root)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=DATA_DIR_DEFAULT,
                        help="the cluster file, each member's data, log and pid file "
                             f"(default {DATA_DIR_DEFAULT})")
    p = argparse.ArgumentParser(prog="scripts/cluster",
                                description="a local cluster of shardnode members on this "
                                            "machine, running in the background")
    sub = p.add_subparsers(dest="command", required=True)

    text = "start every member that is down and wait until each answers; print their endpoints"
    s = sub.add_parser("up", parents=[common], help=text, description=text)
    s.add_argument("--nodes", type=int,
                   help=f"members of a new cluster (default {NODES_DEFAULT}); must match "
                        f"an existing cluster file")
    s.add_argument("--base-port", type=int,
                   help=f"member N listens on base + N - 1 (default {BASE_PORT_DEFAULT}); "
                        f"must match an existing cluster file")
    s.add_argument("--timeout-ms", type=int, default=START_TIMEOUT_MS,
                   help=START_TIMEOUT_HELP)
    s.set_defaults(func=cmd_up)

    text = "each member: pid, state, partitions owned, log MB, RSS, actor restarts"
    s = sub.add_parser("status", parents=[common], help=text, description=text)
    s.add_argument("--json", action="store_true", help="the same as JSON, for scripts")
    s.add_argument("--timeout-ms", type=int, default=STATUS_TIMEOUT_MS,
                   help="a member silent this long, in ms, is shown as not answering "
                        "(default %(default)s)")
    s.set_defaults(func=cmd_status)

    for name, func, timeout_ms, timeout_help, text in (
            ("start-node", cmd_start_node, START_TIMEOUT_MS, START_TIMEOUT_HELP,
             "start one member (as up does) and wait until it answers"),
            ("stop-node", cmd_stop_node, STOP_TIMEOUT_MS, STOP_TIMEOUT_HELP,
             "stop one member cleanly (SIGTERM; SIGKILL after the timeout)"),
            ("kill-node", cmd_kill_node, None, "",
             "SIGKILL one member's whole process group, as a crash")):
        s = sub.add_parser(name, parents=[common], help=text, description=text)
        s.add_argument("node_id", type=int, metavar="N", help="the member's node id (1 is "
                       "the first; `status` lists them)")
        if timeout_ms is not None:
            s.add_argument("--timeout-ms", type=int, default=timeout_ms, help=timeout_help)
        s.set_defaults(func=func)

    text = "stop every member cleanly (SIGTERM; SIGKILL after the timeout); nothing is left running"
    s = sub.add_parser("down", parents=[common], help=text, description=text)
    s.add_argument("--timeout-ms", type=int, default=STOP_TIMEOUT_MS, help=STOP_TIMEOUT_HELP)
    s.set_defaults(func=cmd_down)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "timeout_ms", 1) <= 0:
        err_console.print("[red]error:[/red] --timeout-ms must be positive")
        return EXIT_USAGE
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the exit
        return code
    except UsageError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        return EXIT_USAGE
    except ConfigError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        return EXIT_FAILED
    except BrokenPipeError:
        return stdout_closed()
    except OSError as exc:  # a file of the data dir that cannot be written (a full disk)
        where = f"{exc.filename}: " if exc.filename else ""
        err_console.print(f"[red]error:[/red] {escape(where + (exc.strerror or str(exc)))}")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
