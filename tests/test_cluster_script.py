"""``scripts/cluster`` (node/cluster_ctl.py): a local cluster of real node processes on
``tmp_path``, driven through the command as a user runs it (each call its own process, so
the nodes outlive it as they do from a shell); and its decisions without processes.

Every cluster a test starts is brought down at teardown, failing the test if a process of
it is left; what ``down`` leaves is killed there.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from config.cluster import Member, cluster_text
from node.client import NodeClient
from node.cluster_ctl import (
    DEGRADED,
    DOWN,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    NOT_ANSWERING,
    UP,
    ClusterDir,
    UsageError,
    alive,
    contradiction,
    main,
    member_process,
    node_row,
    plan_members,
    runs_member,
    session_of,
    wait_gone,
)
from node.local import LocalNode, free_port
from wire.protocol import Topic

ROOT = Path(__file__).resolve().parent.parent
COMMAND_TIMEOUT_S = 90  # one call of the command: up waits for nodes at most 60 s
GONE_TIMEOUT_MS = 10_000


def free_base_port(nodes: int) -> int:
    """A port with the ``nodes - 1`` after it free too (each bound at once to check)."""
    for _ in range(100):
        base = free_port()
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + nodes):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {nodes} free consecutive ports found")


class Cluster:
    """The command on one data dir, and every node process it was seen to start."""

    def __init__(self, data_dir: Path) -> None:
        self.cdir = ClusterDir(data_dir.resolve())
        self.seen: list[psutil.Process] = []

    def run(self, *args: str, code: int = EXIT_OK) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "node.cluster_ctl", *args,
                              "--data-dir", str(self.cdir.root)],
                             cwd=ROOT, capture_output=True, text=True,
                             timeout=COMMAND_TIMEOUT_S)
        assert out.returncode == code, (f"{args}: exit {out.returncode}, expected {code}\n"
                                        f"{out.stdout}\n{out.stderr}")
        if args[0] in ("up", "start-node") and self.cdir.file.exists():
            self.seen += self.processes()
        return out

    def status(self) -> dict[int, dict[str, Any]]:
        rows = json.loads(self.run("status", "--json").stdout)["nodes"]
        return {row["id"]: row for row in rows}

    def states(self) -> dict[int, str]:
        return {n: row["state"] for n, row in self.status().items()}

    def pid(self, node_id: int) -> int:
        return int(self.cdir.pid_file(node_id).read_text())

    def processes(self, node_id: int | None = None) -> list[psutil.Process]:
        """Every process of the running members (or of one)."""
        found = []
        for m in self.cdir.members():
            proc = member_process(self.cdir, m.id)
            if proc is not None and node_id in (None, m.id):
                found += session_of(proc)
        return found

    def teardown(self) -> None:
        if not self.cdir.file.exists():
            return
        down = subprocess.run([sys.executable, "-m", "node.cluster_ctl", "down",
                               "--data-dir", str(self.cdir.root)],
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        left = wait_gone(self.seen, GONE_TIMEOUT_MS)
        for p in left:
            p.kill()
        assert down.returncode == EXIT_OK and not left, (
            f"down: exit {down.returncode}, left {[p.pid for p in left]}\n{down.stdout}\n"
            f"{down.stderr}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster")
    yield c
    c.teardown()


# ---- with processes -----------------------------------------------------------------------


def test_up_status_up_again_and_down(cluster: Cluster) -> None:
    base = free_base_port(2)
    up = cluster.run("up", "--nodes", "2", "--base-port", str(base))
    for port in (base, base + 1):
        assert f"tcp://127.0.0.1:{port}" in up.stdout, up.stdout
    st = cluster.status()
    assert {n: (row["state"], row["pid"], row["endpoint"]) for n, row in st.items()} == {
        1: (UP, cluster.pid(1), f"tcp://127.0.0.1:{base}"),
        2: (UP, cluster.pid(2), f"tcp://127.0.0.1:{base + 1}")}
    for row in st.values():
        assert row["rss_bytes"] > 0 and row["restarts"] == 0 and row["log_bytes"] >= 0
    assert (cluster.cdir.root / "node-1").is_dir() and cluster.cdir.log_file(2).exists()

    again = cluster.run("up")
    assert (f"already up: node 1 (pid {cluster.pid(1)}), node 2 (pid {cluster.pid(2)})"
            in again.stdout), again.stdout
    assert {n: row["pid"] for n, row in cluster.status().items()} == {
        n: row["pid"] for n, row in st.items()}

    procs = cluster.processes()
    assert len(procs) > 2  # supervisors and their actors
    down = cluster.run("down")
    assert "node 1: stopped" in down.stdout and "node 2: stopped" in down.stdout, down.stdout
    assert [p.pid for p in procs if alive(p)] == []
    assert not cluster.cdir.pid_file(1).exists() and not cluster.cdir.pid_file(2).exists()
    assert cluster.states() == {1: DOWN, 2: DOWN}
    assert "node 1: not running" in cluster.run("down").stdout


def test_kill_node_then_start_node_then_stop_node(cluster: Cluster) -> None:
    cluster.run("up", "--nodes", "2", "--base-port", str(free_base_port(2)))
    first_pid = cluster.pid(1)
    node1 = cluster.processes(1)
    cluster.run("kill-node", "1")
    assert [p.pid for p in node1 if alive(p)] == []  # the supervisor and every actor
    asked = time.monotonic()
    st = cluster.status()
    assert time.monotonic() - asked < 10  # a dead member is not waited for
    assert {n: row["state"] for n, row in st.items()} == {1: DOWN, 2: UP}
    assert st[1]["pid"] is None and st[2]["pid"] == cluster.pid(2)
    cluster.run("kill-node", "1", code=EXIT_FAILED)  # not running

    started = cluster.run("start-node", "1")
    assert "started" in started.stdout, started.stdout
    assert cluster.states() == {1: UP, 2: UP}
    assert cluster.pid(1) != first_pid

    node2 = cluster.processes(2)
    assert "node 2: stopped" in cluster.run("stop-node", "2").stdout
    assert [p.pid for p in node2 if alive(p)] == []
    assert not cluster.cdir.pid_file(2).exists()
    assert cluster.states() == {1: UP, 2: DOWN}


def test_up_after_every_node_is_killed_starts_them_and_they_recover(cluster: Cluster) -> None:
    cluster.run("up", "--nodes", "2", "--base-port", str(free_base_port(2)))
    endpoints = {m.id: m.endpoint for m in cluster.cdir.members()}
    written = []  # (endpoint, topic, partition, offset, value)
    placed: collections.Counter[int] = collections.Counter()
    for n, endpoint in endpoints.items():
        topic, value = f"t{n}", f"written through node {n}".encode()
        with NodeClient(endpoint, timeout_ms=10_000) as c:
            c.create_topic(topic, partitions=2)
            owners = next(Topic.from_row(row) for row in c.call("list_topics")["topics"]
                          if row[0] == topic).owners
        placed.update(owners)
        # A partition lives on its owner (on a node without owners, on that node).
        owner = endpoints[owners[0]] if owners else endpoint
        with NodeClient(owner, timeout_ms=10_000) as c:
            partition, offset = c.produce(topic, value, partition=0)
        written.append((owner, topic, partition, offset, value))

    assert sum(placed.values()) == 4  # every partition placed on a member; status counts them
    assert {n: row["partitions"] for n, row in cluster.status().items()} == {
        n: placed[n] for n in endpoints}

    procs = cluster.processes()
    for n in endpoints:  # a crash of every node: the pid files stay behind
        os.killpg(cluster.pid(n), signal.SIGKILL)
    assert [p.pid for p in wait_gone(procs, GONE_TIMEOUT_MS)] == []
    assert all(cluster.cdir.pid_file(n).exists() for n in endpoints)
    assert cluster.states() == {1: DOWN, 2: DOWN}

    up = cluster.run("up")
    assert up.stdout.count("stale pid file") == 2, up.stdout
    assert cluster.states() == {1: UP, 2: UP}
    for endpoint, topic, partition, offset, value in written:
        with NodeClient(endpoint, timeout_ms=10_000) as c:
            records = c.read(topic, partition, offset=offset, max_records=1)
        assert [(r.offset, r.value) for r in records] == [(offset, value)]


def test_a_node_that_does_not_come_up_shows_its_log_and_fails(cluster: Cluster) -> None:
    cluster.cdir.root.mkdir(parents=True)
    (cluster.cdir.root / "node-1").write_text("a file where the node's data dir goes")
    out = cluster.run("up", "--nodes", "1", "--base-port", str(free_base_port(1)),
                      code=EXIT_FAILED)
    assert "node 1 did not come up: exited with code" in out.stderr, out.stderr
    last_line = cluster.cdir.log_file(1).read_text().splitlines()[-1]
    assert last_line in out.stderr
    assert not cluster.cdir.pid_file(1).exists()
    assert cluster.states() == {1: DOWN}


def member_supervisors(cdir: ClusterDir) -> list[int]:
    """The pids of every process started as a member of the cluster in ``cdir`` (whatever
    its pid files say)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if any(runs_member(cmdline, cdir.file, m.id) for m in cdir.members()):
            found.append(p.pid)
    return found


def test_up_with_a_port_taken_starts_no_member(cluster: Cluster) -> None:
    """Member 2's port is taken: the cluster cannot come up, so no member is started (they
    were, and were left running), and no log is shown for the member never started."""
    base = free_base_port(3)
    with socket.create_server(("127.0.0.1", base + 1)):
        out = cluster.run("up", "--nodes", "3", "--base-port", str(base), code=EXIT_FAILED)
    assert (f"node 2 did not come up: port {base + 1} is in use by another process"
            in out.stderr), out.stderr
    assert "The end of" not in out.stderr, out.stderr
    assert member_supervisors(cluster.cdir) == []
    assert cluster.states() == {1: DOWN, 2: DOWN, 3: DOWN}
    assert not any(cluster.cdir.pid_file(n).exists() for n in (1, 2, 3))


def test_a_failed_up_stops_the_members_it_started(cluster: Cluster) -> None:
    """Member 2 starts and exits (its data dir is a file); member 1 came up: the failed up
    stops it again, cleanly, and shows member 2's log."""
    cluster.cdir.root.mkdir(parents=True)
    (cluster.cdir.root / "node-2").write_text("a file where the node's data dir goes")
    out = cluster.run("up", "--nodes", "2", "--base-port", str(free_base_port(2)),
                      code=EXIT_FAILED)
    assert "node 2 did not come up: exited with code 2" in out.stderr, out.stderr
    assert "is not a directory" in out.stderr, out.stderr  # the end of its log
    assert "stopping what this up started (node 1)" in out.stdout, out.stdout
    assert "node 1: stopped" in out.stdout, out.stdout
    assert member_supervisors(cluster.cdir) == []
    assert cluster.states() == {1: DOWN, 2: DOWN}
    assert not cluster.cdir.pid_file(1).exists()


def test_a_pid_file_naming_another_process_is_not_trusted(cluster: Cluster,
                                                          tmp_path: Path) -> None:
    cdir = cluster.cdir
    cdir.root.mkdir(parents=True)
    cdir.file.write_text(cluster_text(plan_members(2, free_base_port(2))))
    # Node 2's pid file names a process started like node 2 of another cluster.
    decoy = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "start",
                              "--cluster", str(tmp_path / "other.toml"), "--node-id", "2"],
                             stdin=subprocess.PIPE)
    try:
        cdir.pid_file(1).write_text(f"{os.getpid()}\n")  # this test: a recycled pid
        cdir.pid_file(2).write_text(f"{decoy.pid}\n")
        assert cluster.states() == {1: DOWN, 2: DOWN}
        assert "node 1: not running" in cluster.run("stop-node", "1").stdout
        cluster.run("kill-node", "2", code=EXIT_FAILED)
        assert decoy.poll() is None
    finally:
        assert decoy.stdin is not None
        decoy.stdin.close()
        decoy.wait(10)


def test_a_member_started_by_hand_is_shown_up_and_left_running(cluster: Cluster,
                                                               tmp_path: Path) -> None:
    """The README's ``shardnode start --cluster FILE --node-id N``: status showed the
    member down (only members with a pid file were asked), and stop-node, down and
    kill-node said it was not running."""
    cdir = cluster.cdir
    base = free_base_port(2)
    cdir.root.mkdir(parents=True)
    cdir.file.write_text(cluster_text(plan_members(2, base)))
    by_hand = LocalNode(cdir.root / "node-1", port=base, log_file=tmp_path / "by-hand.log",
                        extra_args=["--cluster", str(cdir.file), "--node-id", "1"]).start()
    try:
        assert by_hand.proc is not None
        pid = by_hand.proc.pid
        st = cluster.status()
        assert {n: (row["state"], row["pid"], row["started_elsewhere"])
                for n, row in st.items()} == {1: (UP, pid, True), 2: (DOWN, None, False)}
        assert st[1]["rss_bytes"] > 0
        table = cluster.run("status").stdout
        assert "│ up, not started here │" in table, table
        assert "not started here: not started by this script" in " ".join(table.split())
        for command in (["stop-node", "1"], ["kill-node", "1"], ["down"]):
            out = cluster.run(*command, code=EXIT_FAILED)
            assert (f"node 1: running (pid {pid}), not started by this script; not "
                    in out.stderr), out.stderr
            assert "node 1: not running" not in out.stdout + out.stderr
        assert "node 2: not running" in out.stdout, out.stdout  # down: the other member
        assert by_hand.proc.poll() is None  # left running, as said
    finally:
        by_hand.stop()
    assert cluster.states() == {1: DOWN, 2: DOWN}


def test_the_restarts_column_says_it_counts_actor_restarts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was "restarts", but adds up every actor's: one writer killed shows 3 (the actors
    after it restart too)."""
    cdir = ClusterDir(tmp_path / "cluster")
    cdir.root.mkdir()
    cdir.file.write_text(cluster_text(plan_members(1, free_base_port(1))))
    assert main(["status", "--data-dir", str(cdir.root)]) == EXIT_OK
    header = capsys.readouterr().out
    assert "actor restarts" in " ".join(header.split()), header


@pytest.mark.parametrize(("command", "where", "says"), [
    (["up"], "afile", "is not a directory"),
    (["status"], "afile", "is not a directory"),
    (["down"], "afile", "is not a directory"),
    (["up"], "afile/sub", "cannot make the data dir"),
    (["status"], "afile/sub", "cannot read the cluster file"),
])
def test_a_data_dir_that_cannot_be_one_is_said_in_a_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], where: str,
        says: str) -> None:
    """A regular file as --data-dir (or in its path) raised FileExistsError or
    NotADirectoryError with a traceback."""
    (tmp_path / "afile").write_text("not a directory")
    data_dir = tmp_path / where
    assert main([*command, "--data-dir", str(data_dir)]) == EXIT_USAGE
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1, out.err
    assert out.err.startswith(f"error: {'--data-dir ' if 'directory' in says else ''}"), out.err
    assert says in out.err and str(data_dir) in out.err, out.err
    assert (tmp_path / "afile").read_text() == "not a directory"


def test_options_against_the_cluster_file_are_usage_errors(cluster: Cluster) -> None:
    cluster.run("status", code=EXIT_USAGE)  # no cluster file yet
    cluster.run("up", "--nodes", "0", code=EXIT_USAGE)
    base = free_base_port(2)
    cluster.cdir.root.mkdir(parents=True)
    cluster.cdir.file.write_text(cluster_text(plan_members(2, base)))
    out = cluster.run("up", "--nodes", "3", code=EXIT_USAGE)
    assert "--nodes 3, but the cluster file lists 2 members" in out.stderr, out.stderr
    out = cluster.run("up", "--base-port", str(base + 1), code=EXIT_USAGE)
    assert f"--base-port {base + 1}" in out.stderr, out.stderr
    cluster.run("stop-node", "3", code=EXIT_USAGE)
    assert not cluster.cdir.pid_file(1).exists()  # nothing was started


# ---- without processes --------------------------------------------------------------------


@pytest.mark.parametrize("command", ["up", "start-node", "stop-node", "down", "status"])
def test_the_timeout_says_what_it_bounds_and_its_default(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    described = text.split("--timeout-ms TIMEOUT_MS ", 1)[1]
    assert re.match(r"[^()]* in ms[^()]* .*\(default \d+\)", described), described


def test_plan_members_are_consecutive_ports_from_the_base() -> None:
    assert plan_members(3, 7400) == (Member(1, "tcp://127.0.0.1:7400"),
                                     Member(2, "tcp://127.0.0.1:7401"),
                                     Member(3, "tcp://127.0.0.1:7402"))
    for nodes, base in ((0, 7400), (65, 7400), (2, 65535), (1, 0)):
        with pytest.raises(UsageError):
            plan_members(nodes, base)


def test_options_agree_with_a_file_only_when_they_describe_it() -> None:
    members = plan_members(2, 7400)
    assert contradiction(members, None, None) == ""
    assert contradiction(members, 2, 7400) == ""
    assert "--nodes 3" in contradiction(members, 3, None)
    assert "--base-port 7401" in contradiction(members, None, 7401)
    odd = (Member(1, "tcp://127.0.0.1:7400"), Member(2, "tcp://127.0.0.1:7500"))
    assert contradiction(odd, 2, None) == ""
    assert "7400, 7500" in contradiction(odd, None, 7400)


def test_a_member_is_known_by_its_cluster_file_and_node_id() -> None:
    f = Path("/srv/c/cluster.toml")
    cmd = ["/v/bin/python", "-m", "node", "start", "--cluster", str(f), "--node-id", "2"]
    assert runs_member(cmd, f, 2)
    assert not runs_member(cmd, f, 1)
    assert not runs_member(cmd, Path("/srv/d/cluster.toml"), 2)
    assert not runs_member(cmd[:-1], f, 2)  # --node-id without its value
    assert not runs_member(["/usr/bin/python3", "-m", "pytest"], f, 2)
    assert not runs_member([], f, 2)


def _answer(states: list[str], restarts: list[int]) -> dict[str, Any]:
    return {"pid": 10, "supervisor_rss_bytes": 1000, "log": {"log_bytes": 4096},
            "actors": [{"role": f"a{i}", "state": s, "rss_bytes": 100, "restarts": r}
                       for i, (s, r) in enumerate(zip(states, restarts, strict=True))]}


def test_a_status_row_from_the_pid_the_answer_and_the_owners() -> None:
    m = Member(2, "tcp://127.0.0.1:7401")
    owned = collections.Counter({1: 3, 2: 5})
    row = node_row(m, 10, _answer(["running", "running"], [0, 2]), owned)
    assert (row.state, row.pid, row.partitions, row.log_bytes, row.rss_bytes,
            row.restarts) == (UP, 10, 5, 4096, 1200, 2)
    assert node_row(m, 10, _answer(["running", "starting"], [0, 1]), owned).state == DEGRADED
    silent = node_row(m, 10, None, owned)
    assert (silent.state, silent.pid, silent.partitions, silent.rss_bytes) == (
        NOT_ANSWERING, 10, 5, None)
    down = node_row(m, None, None, None)
    assert (down.state, down.pid, down.partitions) == (DOWN, None, None)
    assert node_row(m, 10, _answer(["running"], [0]), collections.Counter()).partitions == 0
