"""Key/value namespaces on a real node: every op, read-your-writes, compare-and-set under
contention from 8 processes, a linearizability check of concurrent histories, transactions,
bad input, and SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import pytest

from config import load_config
from node.client import NodeClient
from tests.conftest import module_node
from tests.linearizable import Call, check, linearizable
from wire.errors import BadRequest, NodeError, TransactionConflict, TransactionTimedOut
from wire.protocol import KV_KEY_BYTES_MAX

if TYPE_CHECKING:
    from node.local import LocalNode
    from tests.conftest import MakeNode

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "kv_worker.py"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    """One node for the tests that neither kill nor restart it (each its own namespaces)."""
    with module_node(tmp_path_factory, "kv") as n:
        yield n


def start_workers(endpoint: str, mode: str, n: int, count: int, *extra: str
                  ) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [subprocess.Popen([sys.executable, str(WORKER), mode, endpoint, str(seed), str(n),
                              *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
            for seed in range(1, count + 1)]


def workers(endpoint: str, mode: str, n: int, count: int) -> list[str]:
    """Run ``count`` worker processes at once; their outputs."""
    procs = start_workers(endpoint, mode, n, count)
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_every_op(node: LocalNode) -> None:
    with node.client() as c:
        assert c.kv_get("cfg", b"a") is None  # no namespace yet: nothing, and none created
        assert "cfg" not in c.kv_namespaces()
        c.kv_put("cfg", b"a", b"1")  # creates it
        assert "cfg" in c.kv_namespaces()
        assert c.kv_get("cfg", "a") == b"1"
        assert c.kv_cas("cfg", b"a", b"1", b"2") is True
        assert c.kv_cas("cfg", b"a", b"1", b"3") is False
        assert c.kv_get("cfg", b"a") == b"2"
        assert c.kv_cas("cfg", b"b", None, b"new") is True  # expected absent
        assert c.kv_cas("cfg", b"b", None, b"again") is False
        assert c.kv_cas("cfg", b"b", b"new", None) is True  # new None: delete
        assert c.kv_get("cfg", b"b") is None
        for i in range(12):
            c.kv_put("cfg", f"user/{i:02}", f"v{i}")
        c.kv_put("cfg", b"zzz", b"last")
        users = c.kv_scan("cfg", prefix=b"user/")
        assert users == [(f"user/{i:02}".encode(), f"v{i}".encode()) for i in range(12)]
        assert c.kv_scan("cfg", prefix=b"user/", start_after=b"user/09", limit=2) == [
            (b"user/10", b"v10"), (b"user/11", b"v11")]
        assert [k for k, _v in c.kv_scan("cfg")] == [b"a", *(k for k, _ in users), b"zzz"]
        # Pages: the node answers at most `limit` a request; the client pages on.
        reply = c.call("kv_scan", namespace="cfg", prefix=b"user/", limit=5)
        assert reply["more"] is True and len(msgpack.unpackb(reply["pairs"])) == 5
        c.kv_delete("cfg", b"a")
        c.kv_delete("cfg", b"a")  # absent already: the same answer
        assert c.kv_get("cfg", b"a") is None
        c.kv_delete("none-such", b"a")  # no namespace: nothing to do, none created
        assert "none-such" not in c.kv_namespaces()
        assert not [t.name for t in c.list_topics() if "cfg" in t.name]  # not a topic
        c.kv_drop("cfg")
        assert "cfg" not in c.kv_namespaces() and c.kv_get("cfg", b"zzz") is None
        c.kv_create("fresh")
        with pytest.raises(NodeError, match=r"^TOPIC_EXISTS: KV namespace 'fresh' exists$"):
            c.kv_create("fresh")  # named as its user named it, not as its topic
        with pytest.raises(NodeError, match="KV namespace 'cfg' does not exist"):
            c.kv_drop("cfg")


def test_a_get_from_another_client_sees_every_acknowledged_put(node: LocalNode) -> None:
    with node.client() as w, node.client() as r:
        for i in range(200):
            w.kv_put("ryw", b"k", str(i))
            assert r.kv_get("ryw", b"k") == str(i).encode()
        # Answered without a hop to the shard writer (the front door reports its figures
        # about once a second: poll for the report that counts them).
        deadline = time.monotonic() + 10
        while front_figures(r).get("kv_gets_cached", 0) < 200:
            assert time.monotonic() < deadline, front_figures(r)
            time.sleep(0.05)  # ok-sleep: polling the next figures report, under a deadline


def test_a_put_sent_again_after_a_transaction_changed_its_key_is_not_read_back(
        node: LocalNode) -> None:
    """A put whose answer was lost, sent again (same producer id and seq, as the client's
    retry) after a transaction wrote the key: answered as a duplicate with its first LSN,
    nothing logged. The value after it is the transaction's; the cache took the put's, and
    kv_get and kv_cas answered from a value that was not the durable one."""
    with node.client() as a, node.client() as b:
        put = dict(namespace="dup", key=b"k", value=b"A", producer_id=a.producer_id,
                   seq=a.next_seq())
        first = a.call("kv_put", **put)["lsn"]
        with b.transaction() as tx:
            tx.kv_put("dup", b"k", b"B")
        assert a.call("kv_put", **put)["lsn"] == first  # a duplicate: not logged again
        assert b.kv_scan("dup") == [(b"k", b"B")]
        assert b.kv_get("dup", b"k") == b"B"
        assert not b.kv_cas("dup", b"k", b"A", b"X")
        assert b.kv_get("dup", b"k") == b"B"


def test_a_scan_goes_on_past_a_page_cut_by_bytes(node: LocalNode) -> None:
    """Pages end at ``read_bytes_max`` (8 MiB) as well as at a count: a scan of 12 values of
    1 MiB reads all 12 (it stopped after the first page's 8, saying nothing)."""
    with node.client() as c:
        for i in range(12):
            c.kv_put("big", f"k{i:02d}", bytes([i]) * (1 << 20))
        keys = [k for k, _v in c.kv_scan("big")]
        assert keys == [f"k{i:02d}".encode() for i in range(12)]


def test_a_compare_and_set_in_an_xa_branch_is_refused_at_once(node: LocalNode) -> None:
    """The node takes compare-and-sets in local transactions only: in an XA branch it was
    refused at xa_end, after the branch's other writes; now at the call, and the branch goes
    on."""
    from wire.xid import Xid

    with node.client() as c:
        xid = Xid(1, b"xa-cas", b"b")
        tx = c.xa_start(xid)
        tx.kv_put("xacas", b"a", b"1")
        with pytest.raises(BadRequest, match="needs a local transaction"):
            tx.kv_cas("xacas", b"b", None, b"2")
        c.xa_end(xid)
        c.xa_prepare(xid)
        c.xa_commit(xid)
        assert c.kv_scan("xacas") == [(b"a", b"1")]


def front_figures(c: NodeClient) -> dict[str, Any]:
    front = next(a for a in c.status()["actors"] if a["role"] == "front")
    figures: dict[str, Any] = front["figures"]
    return figures


def test_values_come_back_from_the_shard_after_a_restart_and_a_kill(make_node: MakeNode,
                                                                    tmp_path: Path) -> None:
    n = make_node()
    with n.client() as c:
        for i in range(300):
            c.kv_put("keep", f"k{i}", f"v{i}")
        c.kv_delete("keep", b"k7")
        assert c.kv_cas("keep", b"k8", b"v8", b"eight")
    n.kill()  # SIGKILL of every process: the values are in the log, not yet in a checkpoint
    n.start()
    with n.client() as c:
        assert c.kv_get("keep", b"k7") is None
        assert c.kv_get("keep", b"k8") == b"eight"
        assert all(c.kv_get("keep", f"k{i}") == f"v{i}".encode() for i in range(9, 300))
        assert len(c.kv_scan("keep", limit=1000)) == 299
        # The front door alone: its cache is gone, the values are not.
        n.kill_actor("front")
        n.wait_ready()
    with n.client() as c:
        assert c.kv_get("keep", b"k299") == b"v299"
        assert c.kv_cas("keep", b"k299", b"v299", b"x") is True


def test_a_namespace_shard_whose_creation_a_kill_cut_short_is_made_again(
        make_node: MakeNode) -> None:
    """A kill while a namespace's shard was being created can leave RocksDB's files
    without the ``kv`` column family and nothing applied; the open told it a topic's
    shard, and the namespace's records failed its writer at every start (the node never
    came up again). Its creation, replayed from the log, makes it again as it should be."""
    from actors.shard_options import StoreMemory
    from actors.shard_store import ShardStore, shard_dir

    n = make_node()
    with n.client() as c:
        c.kv_put("cut", b"k", b"v")
    n.kill()  # before any checkpoint: the log holds the namespace's creation
    # The namespace's shard (the node's first topic: id 1, one partition) as such a kill
    # leaves it; one just after the put, before the writer applied the creation, left its
    # directory empty, or none.
    d = shard_dir(n.data_dir / "shards", 1, 0)
    shutil.rmtree(d, ignore_errors=True)
    cfg = load_config()
    ShardStore(d, 1, 0, StoreMemory.of(cfg.shards, cfg.storage), kv=False).close()
    n.start()
    with n.client() as c:
        assert c.kv_get("cut", b"k") == b"v"
        c.kv_put("cut", b"k2", b"v2")
        assert c.kv_scan("cut") == [(b"k", b"v"), (b"k2", b"v2")]


def test_cas_increments_from_8_processes_add_up(node: LocalNode) -> None:
    outs = workers(node.endpoint, "cas-inc", 40, 8)
    swapped = sum(json.loads(o)["swapped"] for o in outs)
    with node.client() as c:
        final = c.kv_get("inc", b"count")
    assert swapped > 0
    assert final == str(swapped).encode()


def test_concurrent_histories_are_linearizable(node: LocalNode) -> None:
    outs = workers(node.endpoint, "history", 60, 5)
    calls = []
    for out in outs:
        for start, end, key, kind, args, result in json.loads(out):
            args = tuple(None if a is None else bytes.fromhex(a) for a in args)
            if kind == "get":
                result = None if result is None else bytes.fromhex(result)
            calls.append(Call(start, end, bytes.fromhex(key), kind, args, result))
    assert len(calls) == 300
    assert sum(c.kind == "cas" and c.result for c in calls) > 0  # some CAS did swap
    assert check(calls) == []


def test_the_check_finds_a_history_that_is_not_linearizable() -> None:
    # Writes of 1 then 2, one after the other; a read after both sees 1: impossible.
    bad = [Call(0, 1, b"k", "put", (b"1",), None), Call(2, 3, b"k", "put", (b"2",), None),
           Call(4, 5, b"k", "get", (), b"1")]
    assert not linearizable(bad)
    # Overlapping with the second write, it may see either.
    assert linearizable([*bad[:2], Call(2.5, 5, b"k", "get", (), b"1")])
    # A CAS that says it swapped on a value the key never had.
    assert not linearizable([Call(0, 1, b"k", "cas", (b"x", b"y"), True)])
    assert check([*bad, Call(0, 1, b"j", "get", (), None)]) == [b"k"]


def test_transactions_make_key_writes_visible_at_the_commit(node: LocalNode) -> None:
    with node.client() as c, node.client() as r:
        c.kv_put("acct", b"a", b"100")
        c.kv_put("acct", b"b", b"0")
        assert r.kv_get("acct", b"a") == b"100"  # cached at the front door
        tx = c.transaction()
        tx.kv_put("acct", b"a", b"60")
        tx.kv_put("acct", b"b", b"40")
        tx.kv_delete("acct", b"gone")
        tx.kv_put("other", b"x", b"created in a transaction")
        tx.settle()
        assert (r.kv_get("acct", b"a"), r.kv_get("acct", b"b")) == (b"100", b"0")
        tx.commit()
        assert (r.kv_get("acct", b"a"), r.kv_get("acct", b"b")) == (b"60", b"40")
        assert r.kv_get("other", b"x") == b"created in a transaction"
        assert r.kv_cas("acct", b"a", b"60", b"61") is True  # decided on the committed value
        with pytest.raises(RuntimeError), c.transaction() as tx2:
            tx2.kv_put("acct", b"a", b"never")
            raise RuntimeError("abort")
        assert r.kv_get("acct", b"a") == b"61"


def test_bad_input_gets_a_clear_error_and_the_node_keeps_serving(node: LocalNode) -> None:
    with node.client() as c:
        with pytest.raises(BadRequest, match="key"):
            c.kv_put("bad", b"k" * (KV_KEY_BYTES_MAX + 1), b"v")
        with pytest.raises(NodeError, match="namespace"):
            c.kv_put("no spaces", b"k", b"v")
        with pytest.raises(BadRequest, match="bytes"):
            c.kv_put("bad", b"k", b"v" * (load_config().limits.value_bytes_max + 1))
        c.kv_put("bad", b"k", b"v")
        # A namespace's topic is not a topic: not written or read as one.
        with pytest.raises(NodeError, match="KV namespace"):
            c.produce("kv:bad", b"raw")
        with pytest.raises(NodeError, match="KV namespace"):
            c.read("kv:bad", 0, 0)
        assert c.kv_get("bad", b"k") == b"v"


def test_a_client_of_a_cluster_reaches_the_namespace_owner(tmp_path: Path) -> None:
    from node.local import LocalCluster

    with LocalCluster(tmp_path / "c", 2) as cluster:
        eps = cluster.endpoints
        with NodeClient(eps[0]) as one, NodeClient(eps[1]) as two, NodeClient(eps) as routed:
            for i in range(6):  # namespaces land on both members
                one.kv_put(f"ns{i}", b"k", f"v{i}")
            for i in range(6):
                assert two.kv_get(f"ns{i}", b"k") == f"v{i}".encode()  # forwarded, or own
                assert routed.kv_cas(f"ns{i}", b"k", f"v{i}", b"w") is True
                assert one.kv_get(f"ns{i}", b"k") == b"w"
            owners = {routed.owners(f"kv:ns{i}")[0] for i in range(6)}
            assert owners == {1, 2}


def kv_cli(node: LocalNode, *args: str, code: int = 0) -> str:
    out = subprocess.run([sys.executable, "-m", "node", "kv", *args, "--port", str(node.port)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == code, out.stderr
    return out.stdout + out.stderr


def test_the_cli(node: LocalNode) -> None:
    assert "set" in kv_cli(node, "put", "cli", "user/1", "ada")
    kv_cli(node, "put", "cli", "user/2", "grace")
    assert kv_cli(node, "get", "cli", "user/1").strip() == "ada"
    assert "absent" in kv_cli(node, "get", "cli", "nobody", code=3)
    assert "not swapped" in kv_cli(node, "cas", "cli", "user/1", "bob", "x", code=4)
    assert "swapped" in kv_cli(node, "cas", "cli", "user/1", "ada", "lovelace")
    assert "swapped" in kv_cli(node, "cas", "cli", "new", "-", "made")  # '-': absent
    scan = kv_cli(node, "scan", "cli", "--prefix", "user/")
    assert "lovelace" in scan and "grace" in scan and "made" not in scan
    # --hex: keys and values in hex ("user/1" is 757365722f31).
    assert kv_cli(node, "get", "cli", "757365722f31", "--hex").strip() == b"lovelace".hex()
    kv_cli(node, "delete", "cli", "user/2")
    assert "absent" in kv_cli(node, "get", "cli", "user/2", code=3)
    assert "cli" in kv_cli(node, "list").split()
    kv_cli(node, "drop", "cli")
    assert "cli" not in kv_cli(node, "list").split()


def test_compare_and_sets_in_a_transaction_commit_together_or_not_at_all(
        node: LocalNode) -> None:
    with node.client() as c, node.client() as other:
        c.kv_put("bank", b"alice", b"100")
        c.kv_put("bank", b"bob", b"0")
        # A transfer: both balances as they were read, or nothing.
        with c.transaction() as tx:
            tx.kv_cas("bank", b"alice", b"100", b"70")
            tx.kv_cas("bank", b"bob", b"0", b"30")
        assert (c.kv_get("bank", b"alice"), c.kv_get("bank", b"bob")) == (b"70", b"30")
        tx = c.transaction()
        tx.kv_cas("bank", b"alice", b"70", b"50")
        tx.kv_cas("bank", b"bob", b"30", b"50")
        tx.kv_put("bank", b"note", b"second transfer")
        tx.settle()
        other.kv_put("bank", b"bob", b"31")  # changed under it: the commit must fail
        with pytest.raises(TransactionConflict):
            tx.commit()
        assert (c.kv_get("bank", b"alice"), c.kv_get("bank", b"bob")) == (b"70", b"31")
        assert c.kv_get("bank", b"note") is None  # rolled back whole
        with c.transaction() as tx:  # expected absent, and a delete by compare-and-set
            tx.kv_cas("bank", b"carol", None, b"5")
            tx.kv_cas("bank", b"bob", b"31", None)
        assert (c.kv_get("bank", b"carol"), c.kv_get("bank", b"bob")) == (b"5", None)


def test_a_commit_sent_again_after_a_kill_is_told_of_its_conflict_and_of_a_timeout(
        make_node: MakeNode) -> None:
    """Why a transaction was rolled back is in the log: a commit sent again after the whole
    node was SIGKILLed and restarted (its first answer lost) is told what it was told
    before, TXN_CONFLICT for a compare-and-set that did not hold and TXN_TIMED_OUT for one
    open past its timeout, not that it was rolled back for no reason given."""
    n = make_node()
    with n.client() as c, n.client() as other:
        c.kv_put("acct", b"a", b"1")
        tx = c.transaction()
        tx.kv_cas("acct", b"a", b"1", b"2")
        tx.settle()
        other.kv_put("acct", b"a", b"9")  # changed under it
        with pytest.raises(TransactionConflict):
            tx.commit()
        late = c.transaction(timeout_ms=200)
        late.kv_put("acct", b"b", b"1")
        late.settle()
        deadline = time.monotonic() + 30
        while c.txn_list() and time.monotonic() < deadline:  # rolled back at its timeout
            time.sleep(0.02)  # ok-sleep: polling the node's list, under a deadline
        assert not c.txn_list()
        # The rollback the transaction manager sent is logged before its answer to the
        # checkpoint's handshake (one socket, in order): in the log when the kill comes,
        # not rolled back at the restart instead ("restart", TXN_ABORTED).
        c.checkpoint()
    n.kill()
    n.start()
    with n.client() as c:
        with pytest.raises(TransactionConflict):
            c.call("txn_commit", txn=tx.id, writes=tx.seq)
        with pytest.raises(TransactionTimedOut):
            c.call("txn_commit", txn=late.id, writes=late.seq)
        assert c.kv_get("acct", b"a") == b"9" and c.kv_get("acct", b"b") is None


def test_a_block_whose_compare_and_sets_a_restarted_front_door_lost_leaves_nothing_open(
        make_node: MakeNode) -> None:
    """Its commit is refused TXN_CONFLICT, the transaction left open ("roll it back"); the
    block took the conflict as final and left it open, holding a slot of [txn] open_max
    until its timeout."""
    n = make_node()
    with n.client() as c:
        c.kv_put("acc", b"a", b"1")
        with pytest.raises(TransactionConflict, match="not checked"), c.transaction() as tx:
            tx.kv_cas("acc", b"a", b"1", b"2")
            tx.settle()
            n.kill_actor("front")  # the conditions it held are gone
            n.wait_ready()  # the commit reaches the new one, which answers it at once
        assert c.txn_list() == [] and c.kv_get("acc", b"a") == b"1"


def test_no_acknowledged_compare_and_set_is_lost_to_a_sigkill(make_node: MakeNode) -> None:
    """8 processes increment a counter by compare-and-set; the node is killed under them.
    After the restart the counter holds every acknowledged increment, plus at most the ones
    whose answer the kill took (one a process at most)."""
    n = make_node()
    procs = start_workers(n.endpoint, "cas-inc", 100_000, 8, "2000")
    with n.client() as c:
        deadline = time.monotonic() + 60
        while int(c.kv_get("inc", b"count") or 0) < 200:  # well under way
            assert time.monotonic() < deadline
            time.sleep(0.01)  # ok-sleep: polling the counter, under a deadline
    n.kill()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    acked = sum(r["swapped"] for r in results)
    unknown = sum(r["unknown"] for r in results)
    n.start()
    with n.client() as c:
        final = int(c.kv_get("inc", b"count") or 0)
    assert acked >= 200
    assert acked <= final <= acked + unknown, (acked, unknown, final)


def test_a_checked_commit_that_timed_out_holds_its_keys_until_it_is_known_committed(
        make_node: MakeNode) -> None:
    """The commit of a transaction with a compare-and-set waits in a log manager stopped
    (SIGSTOP) past request_timeout_ms: its client is told TIMEOUT, and the front door keeps
    the key held, asking the transaction manager how the commit ended (``TxnAsk``, each
    second), until the log manager goes on; then the commit is applied, the key let go,
    and a compare-and-set on the committed value swaps. Across real processes."""
    node = make_node("[limits]\nrequest_timeout_ms = 1000\n")

    def front() -> dict[str, Any]:
        with node.client(timeout_ms=5000) as c:
            return next(a["figures"] for a in c.status()["actors"] if a["role"] == "front")

    def until(what: str, cond: Any, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)  # ok-sleep: poll interval, under a deadline

    with node.client() as c:
        c.kv_put("late", b"k", b"v0")
    log_pid = node.actor_pid("log")
    with node.client(timeout_ms=5000, retries=0) as c:
        tx = c.transaction()
        tx.kv_cas("late", b"k", b"v0", b"v1")
        tx.settle()
        os.kill(log_pid, signal.SIGSTOP)
        try:
            with pytest.raises(NodeError, match="TIMEOUT"):
                tx.commit()
            until("the front door to ask how the commit ended",
                  lambda: (f := front())["kv_late_commit"] == 1 and f["kv_late_asks"] >= 1)
        finally:
            os.kill(log_pid, signal.SIGCONT)
    until("the late commit to be let go", lambda: front()["kv_late_commit"] == 0)
    with node.client() as c:
        assert c.kv_get("late", b"k") == b"v1"
        assert c.kv_cas("late", b"k", b"v1", b"v2")
        assert c.kv_get("late", b"k") == b"v2"
    with node.client() as c:
        assert all(a["restarts"] == 0 for a in c.status()["actors"])
