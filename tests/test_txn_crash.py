"""Transactions under SIGKILL: ``scripts/crashtest --txn`` runs a few trials with real
processes (kills at random moments, just after a begin is answered, just after a commit
is sent, between prepare and commit), and every one passes; the check it makes catches
each kind of damage; and no transaction id is handed out twice across a crash."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from actors.faults import fired_dir
from node.client import NodeClient
from node.crashcheck import CheckFailed, Ledger
from node.local import LocalNode
from node.transaction import TxnPart
from node.txncheck import Fate, TxnLog, TxnProducer, Views, check_txns, tag_of
from wire.errors import NodeError, TransactionAborted
from wire.records import Record

if TYPE_CHECKING:
    from tests.conftest import MakeNode

ROOT = Path(__file__).resolve().parent.parent
# Its four trials kill: the log manager at a random moment, the transaction manager just
# after a commit is sent, the log manager just after a begin is answered, the whole node
# between a prepare and its commit.
SEED = 20261899


def test_txn_crashtest_trials(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "crashtest.py"), "--txn",
                          "--trials", "4", "--seed", str(SEED), "--data-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=170)
    text = out.stdout + out.stderr[-3000:]
    assert out.returncode == 0, text
    assert out.stdout.strip().splitlines()[-1] == "4 passed, 0 failed", text
    assert "just after the commit of" in out.stdout, text
    assert "just after the begin of" in out.stdout, text
    assert "between the prepare and the end of" in out.stdout, text
    listed = [int(n) for n in re.findall(r"; (\d+) branches in doubt listed", out.stdout)]
    assert len(listed) == 4 and sum(listed) > 0, text


def serving_with_a_new_log_manager(node: LocalNode, old_pid: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with NodeClient(node.endpoint, timeout_ms=1000, retries=0) as c:
                actors = c.status()["actors"]
            if all(a["state"] == "running" for a in actors) and all(
                    a["pid"] != old_pid for a in actors if a["role"] == "log"):
                return
        except NodeError:
            pass
        assert time.monotonic() < deadline, "the node did not come back"
        time.sleep(0.05)  # ok-sleep: poll interval, under a deadline


def test_no_client_holds_a_transaction_id_a_crash_can_lose(make_node: MakeNode,
                                                           tmp_path: Path) -> None:
    """The log manager dies just before writing the group that holds a transaction's start
    (the seam ``log.before_write``). Its client must not have been told the id: the next
    transaction manager hands out ids from above those in the log, so it would give the
    same one to another client, whose transaction the first client's calls would then
    change (a write taken for a retry and dropped, a commit of the other's work). When the
    new manager's ids start below the old one's (a coin toss each time) the id is the same,
    so this tries three times (without the fix, each of 6 runs failed)."""
    data = tmp_path / "data"
    marker = fired_dir(data) / "log.before_write"
    marker.parent.mkdir(parents=True)
    marker.touch()  # fired already: disarmed until the marker is removed
    node = make_node("[limits]\nrequest_timeout_ms = 2000\n[supervisor]\nrestarts_max = 100\n",
                     env={"SHARDNODE_FAULTS": "log.before_write"})
    with node.client() as c:
        c.create_topic("t")
        with c.transaction() as tx:  # the log holds an id of the first manager's
            tx.produce("t", b"first")
    for _attempt in range(3):
        old_pid = node.actor_pid("log")
        marker.unlink()  # armed: the next group commit is lost
        # Ids the node picks (a txn_begin without one; NodeClient.transaction picks its own).
        with NodeClient(node.endpoint, timeout_ms=2000, retries=0) as a:
            try:
                told: int | None = a.call("txn_begin")["txn"]
            except NodeError:
                told = None  # not answered: the start was never durable
        serving_with_a_new_log_manager(node, old_pid)
        with node.client() as b:
            other = b.call("txn_begin")["txn"]
            assert other != told, f"transaction id {told} was handed out twice"
            b.call("txn_abort", txn=other)


def test_a_transaction_of_one_request_whose_commit_a_crash_lost_is_rolled_back(
        make_node: MakeNode, tmp_path: Path) -> None:
    """The log manager makes a ``txn_once``'s start and write durable in a group of their
    own and dies before its commit (the seam ``log.once_split``). The transaction manager,
    restarted with it, rolls back the open transaction as it syncs (as it does every open
    one), the writers drop what they held of it, the client's retry is told it was rolled
    back, and a transaction after it takes the offsets it would have taken."""
    node = make_node("[limits]\nrequest_timeout_ms = 2000\n[supervisor]\nrestarts_max = 100\n",
                     env={"SHARDNODE_FAULTS": "log.once_split"})
    with node.client() as c:
        c.create_topic("t", partitions=2)
        old_pid = node.actor_pid("log")
        with (pytest.raises(TransactionAborted, match="restarted before its commit"),
              c.transaction() as tx):
            tx.produce_batch("t", [b"lost-0", b"lost-1"], partition=0)
            tx.produce("t", b"lost-2", partition=1)
        assert (fired_dir(tmp_path / "data") / "log.once_split").exists()
        serving_with_a_new_log_manager(node, old_pid)
        with c.transaction() as after:
            after.produce("t", b"kept", partition=0)
        assert after.result is not None and after.result.offsets == [[(0, 0)]]
        assert [r.value for r in c.read("t", 0, 0, 10)] == [b"kept"]
        assert c.read("t", 1, 0, 10) == []
        deadline = time.monotonic() + 30  # the figures are reported about once a second
        while next(a for a in c.status()["actors"]
                   if a["role"] == "log")["figures"]["txns_once"] != 1:  # "kept" (this one's)
            assert time.monotonic() < deadline, "the log manager never counted 'kept'"
            time.sleep(0.05)  # ok-sleep: poll interval, under a deadline


# ---- the check itself, on a node made of lists -------------------------------------------

TOPIC, SRC = "t", "src"


class FakeNode:
    """Serves ``read`` and ``committed_offset`` from lists and a dict, as the node would;
    ``check_txns`` reads through those only (hence the ``type: ignore[arg-type]``)."""

    def __init__(self, partitions: dict[int, list[bytes]],
                 groups: dict[str, int] | None = None) -> None:
        self.partitions = partitions
        self.groups = groups or {}

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[Record]:
        values = self.partitions.get(partition, [])[offset:offset + max_records]
        return [Record(v, offset=offset + i) for i, v in enumerate(values)]

    def committed_offset(self, group: str, topic: str, partition: int) -> int | None:
        return self.groups.get(group)


def producer(*txns: TxnLog) -> TxnProducer:
    tp = TxnProducer("tcp://127.0.0.1:1", TOPIC, 3, SRC, "x", seed=0)  # never started
    tp.txns = list(txns)
    tp.ledger.sent = {v for t in txns for _p, v in t.values}
    return tp


def txn(tag: str, fate: Fate, values: list[tuple[int, bytes]],
        parts: Sequence[tuple[int, int, int]] = (), lsn: int = 0,
        group_offset: int | None = None) -> TxnLog:
    t = TxnLog(tag, "commit", values=values, fate=fate, lsn=lsn, group_offset=group_offset)
    t.parts = [TxnPart(TOPIC, p, first, n) for p, first, n in parts]
    return t


A = txn("x.0", Fate.COMMITTED, [(0, b"T:x.0:0"), (1, b"T:x.0:1"), (1, b"T:x.0:2")],
        parts=[(0, 0, 1), (1, 0, 2)], lsn=10, group_offset=7)
B = txn("x.1", Fate.ABSENT, [(0, b"T:x.1:0"), (1, b"T:x.1:1")])


def run_check(stored: dict[int, list[bytes]], *txns: TxnLog, groups: dict[str, int] | None = None,
              seen: set[str] | None = None, plain: Ledger | None = None) -> None:
    check_txns(FakeNode(stored, groups), TOPIC, 3, [producer(*txns)],  # type: ignore[arg-type]
               [plain or Ledger()], SRC, seen=seen)


def test_check_accepts_whole_and_absent_transactions() -> None:
    run_check({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2"]}, A, B, groups={"g-x": 7},
              seen={"x.0"})


@pytest.mark.parametrize("stored, groups, seen, why", [
    ({0: [b"T:x.0:0"], 1: [b"T:x.0:1"]}, {"g-x": 7}, None, "is partial"),
    ({0: [b"T:x.0:0"], 1: [b"T:x.0:2", b"T:x.0:1"]}, {"g-x": 7}, None, "its commit placed it"),
    ({0: [b"T:x.0:0", b"T:x.1:0"], 1: [b"T:x.0:1", b"T:x.0:2"]}, {"g-x": 7}, None,
     "x.1 (commit, absent: ) is visible"),
    ({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2", b"T:x.0:1"]}, {"g-x": 7}, None,
     "stored twice"),
    ({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2"]}, {"g-x": 8}, None, "has offset 8"),
    ({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2"]}, {}, None, "has offset None"),
    ({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2"]}, {"g-x": 7}, {"x.1"}, "seen by the reader"),
    ({0: [b"T:x.0:0", b"T:zz:0"], 1: [b"T:x.0:1", b"T:x.0:2"]}, {"g-x": 7}, None, "never sent"),
])
def test_check_catches_every_kind_of_damage(stored: dict[int, list[bytes]],
                                            groups: dict[str, int], seen: set[str] | None,
                                            why: str) -> None:
    with pytest.raises(CheckFailed, match=re.escape(why)):
        run_check(stored, A, B, groups=groups, seen=seen)


def test_check_holds_a_commit_to_its_answer() -> None:
    # The commit answered a count in partition 1 that is not what was staged there.
    bad = txn("x.0", Fate.COMMITTED, A.values, parts=[(0, 0, 1), (1, 0, 3)], lsn=10)
    with pytest.raises(CheckFailed, match="staged 2 records in partition 1"):
        run_check({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2"]}, bad)
    # ... and the client's per-call offsets must be the parts' too.
    ok = txn("x.0", Fate.COMMITTED, A.values, parts=[(0, 0, 1), (1, 0, 2)], lsn=10)
    ok.client_offsets = [(0, 0), (1, 1), (1, 0)]
    with pytest.raises(CheckFailed, match="client's offsets"):
        run_check({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2"]}, ok)


def test_check_fails_an_id_handed_out_twice() -> None:
    again = txn("x.4", Fate.ABSENT, [(2, b"T:x.4:0")])
    again.txn_id = 41
    with pytest.raises(CheckFailed, match=re.escape("id 41 was handed out twice: to x.0 and")):
        run_check({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2"]},
                  dataclasses.replace(A, txn_id=41), again, groups={"g-x": 7})


def test_check_fails_a_transaction_never_ended() -> None:
    with pytest.raises(CheckFailed, match="never ended"):
        run_check({}, txn("x.2", Fate.OPEN, [(0, b"T:x.2:0")]))


def test_check_takes_the_latest_commit_for_a_group() -> None:
    older = txn("x.3", Fate.COMMITTED, [(2, b"T:x.3:0")], parts=[(2, 0, 1)], lsn=5,
                group_offset=3)
    run_check({0: [b"T:x.0:0"], 1: [b"T:x.0:1", b"T:x.0:2"], 2: [b"T:x.3:0"]}, older, A,
              groups={"g-x": 7})


def test_views_catch_a_partial_view() -> None:
    v = Views()
    v.saw(0, ["a", "b"])
    pending = v.only(0)
    v.saw(1, ["a"])  # partition 1 read to its end after: b is missing
    v.read_after(0, pending)
    assert len(v.violations) == 1 and "['b']" in v.violations[0]
    v.saw(1, ["b", "c"])  # c committed meanwhile: seen in 1 first is fine
    v.read_after(0, v.only(0))
    pending = v.only(1)
    v.saw(0, ["c"])
    v.read_after(1, pending)
    assert len(v.violations) == 1


def test_tag_of() -> None:
    assert tag_of(b"T:x0.12:3") == "x0.12"
    assert tag_of(b"u-3-4") is None
