"""A local cluster of three real nodes: placement, routing, forwarding, the catalog member,
transactions on one node and XA across two, and a node lost and recovered.

One cluster serves the module (starting three nodes takes a while on two cores); the tests
that stop or kill a member bring it back before they end.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.roles import key_partition
from actors.shard_store import parse_shard_dir
from node.client import NodeClient, Pipeline
from node.crashcheck import read_partition
from node.local import LocalCluster
from wire.errors import (
    CrossNode,
    NodeError,
    TopicExists,
    Unavailable,
    UnknownTopic,
    XAERDupid,
    XAERNota,
)
from wire.placement import place
from wire.records import Record
from wire.xid import Xid

ROOT = Path(__file__).resolve().parent.parent

WAIT_S = 20.0  # bound on every poll below


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), 3) as cl:
        yield cl


def routed(cl: LocalCluster, timeout_ms: int = 5000, retries: int = 5) -> NodeClient:
    return NodeClient(cl.endpoints, timeout_ms=timeout_ms, retries=retries)


def one(cl: LocalCluster, member: int, timeout_ms: int = 5000, retries: int = 5) -> NodeClient:
    return NodeClient(cl.nodes[member].endpoint, timeout_ms=timeout_ms, retries=retries)


def keyed(prefix: str, n: int) -> list[Record]:
    return [Record(f"{prefix}-{i}".encode(), f"key-{i}".encode()) for i in range(n)]


def shard_dirs(cl: LocalCluster, member: int) -> set[str]:
    return {d.name for d in (cl.nodes[member].data_dir / "shards").iterdir()}


def shards_of(cl: LocalCluster, member: int, topic_id: int) -> set[tuple[int, int]]:
    """The shards of a topic whose directories are on ``member``."""
    shards = {parse_shard_dir(d) for d in shard_dirs(cl, member)}
    return {s for s in shards if s and s[0] == topic_id}


def test_partitions_are_placed_evenly_and_only_their_owner_keeps_them(
        cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        assert c.members() == {m: n.endpoint for m, n in cluster.nodes.items()}
        c.create_topic("placed", partitions=6)
        owners = c.owners("placed")
    assert owners == place("placed", 6, [1, 2, 3])
    assert collections.Counter(owners) == {1: 2, 2: 2, 3: 2}
    for member in (1, 2, 3):
        with one(cluster, member) as m:  # every member routes by the catalog's placement
            m.produce("placed", b"x", key=b"k")
            (row,) = [r for r in m.call("list_topics")["topics"] if r[0] == "placed"]
        topic_id = row[2]
        assert tuple(row[3]) == owners
        mine = {(topic_id, p) for p, o in enumerate(owners) if o == member}

        # The writers make a shard's directory as they apply the topic's creation, which
        # reaches them after the acknowledgement: wait for it, then the owner only has them.
        deadline = time.monotonic() + WAIT_S
        while (here := shards_of(cluster, member, topic_id)) != mine \
                and time.monotonic() < deadline:
            time.sleep(0.05)  # ok-sleep: polling the writers' shard directories
        assert here == mine  # on the owner only


def test_a_routed_client_sends_each_record_to_its_partitions_owner(cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        c.create_topic("routed", partitions=6)
        recs = keyed("r", 300)
        placed = c.produce_batch("routed", recs)
        for rec, (p, _off) in zip(recs, placed, strict=True):
            assert rec.key is not None and p == c.key_partition("routed", rec.key)
        by_partition: dict[int, list[bytes]] = collections.defaultdict(list)
        for rec, (p, off) in zip(recs, placed, strict=True):
            assert off == len(by_partition[p])
            by_partition[p].append(rec.value)
        owners = c.owners("routed")
        for p in range(6):
            with one(cluster, owners[p]) as owner:  # the owner has them, in order
                assert read_partition(owner, "routed", p) == by_partition[p]
        assert c.end_offsets("routed") == [len(by_partition[p]) for p in range(6)]
        forwarded_before = cluster.forwarded()
        c.produce_batch("routed", keyed("again", 30))
        assert cluster.forwarded() == forwarded_before  # sent to owners: nothing forwarded


def test_a_client_that_knows_one_member_is_served_by_forwarding(cluster: LocalCluster) -> None:
    before = cluster.forwarded()
    with one(cluster, 3) as c3, one(cluster, 2) as c2, routed(cluster) as rc:
        c3.create_topic("one-door", partitions=6)  # forwarded to the catalog member
        recs = keyed("o", 120)
        placed = c2.produce_batch("one-door", recs)  # split over three members by node 2
        assert placed == [(rc.key_partition("one-door", r.key or b""), off)
                          for r, (_p, off) in zip(recs, placed, strict=True)]
        got = {p: read_partition(c3, "one-door", p) for p in range(6)}  # reads forwarded
        assert sorted(v for vs in got.values() for v in vs) == sorted(r.value for r in recs)
        assert got == {p: read_partition(rc, "one-door", p) for p in range(6)}
        assert c2.end_offsets("one-door") == rc.end_offsets("one-door")
        # a retry of the same split batch (same sequence number) writes nothing twice
        fields = {"topic": "one-door", "producer_id": 77, "seq": 0,
                  "records": msgpack_batch(recs[:20])}
        first = c2.call("produce", **fields)
        again = c2.call("produce", **fields)
        assert first["parts"] == again["parts"] and first["assign"] == again["assign"]
        assert sum(rc.end_offsets("one-door")) == 140
    assert cluster.forwarded() > before + 6  # the reads of 6 partitions through member 3 alone


def msgpack_batch(recs: list[Record]) -> bytes:
    from wire.records import pack_batch

    return pack_batch(recs)


def test_a_topic_created_through_one_member_is_usable_through_another_at_once(
        cluster: LocalCluster) -> None:
    with one(cluster, 3) as c3, one(cluster, 2) as c2:
        c3.create_topic("fresh", partitions=3)
        c2.produce("fresh", b"first", key=b"k")  # member 2 learns it when asked
        with pytest.raises(TopicExists):
            c2.create_topic("fresh", partitions=3)
        c2.delete_topic("fresh")
        with pytest.raises(UnknownTopic):
            c2.produce("fresh", b"gone", key=b"k")
        deadline = time.monotonic() + WAIT_S  # member 3 copies the deletion in its next sync
        while "fresh" in [t.name for t in c3.list_topics()]:
            assert time.monotonic() < deadline, "member 3 still lists a deleted topic"
            time.sleep(0.05)  # ok-sleep: polling the member's copy of the catalog


def test_alter_topic_through_any_member_reaches_every_partitions_owner(
        cluster: LocalCluster) -> None:
    from wire.errors import OffsetOutOfRange

    with one(cluster, 3) as c3, one(cluster, 2) as c2, routed(cluster) as rc:
        c3.create_topic("ret", partitions=3)
        for p in range(3):
            rc.produce_batch("ret", [b"z" * 100] * 40, partition=p)
        c2.alter_topic("ret", retention_bytes=600)  # forwarded to the catalog member
        assert next(t for t in c2.list_topics() if t.name == "ret").retention_bytes == 600
        for p in range(3):  # each owner's writer applies it
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    rc.read("ret", p, 0, 1)
                except OffsetOutOfRange as exc:
                    assert 0 < exc.earliest < 40
                    break
                assert time.monotonic() < deadline, f"partition {p} kept everything"
                time.sleep(0.05)  # ok-sleep: polling for retention, bounded by WAIT_S


def test_a_transaction_stays_on_one_member(cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        c.create_topic("txn-one", partitions=6)
        owners = c.owners("txn-one")
        home = c.members()[1]
        mine = owners.index(1)
        away = next(p for p, o in enumerate(owners) if o != 1)
        with NodeClient(home, timeout_ms=5000) as h:
            with h.transaction() as tx:
                tx.produce("txn-one", b"local", partition=mine)
            assert [r.value for r in h.read("txn-one", mine, 0)] == [b"local"]
            tx = h.transaction()
            tx.produce("txn-one", b"elsewhere", partition=away)
            with pytest.raises(CrossNode, match=f"node {owners[away]}"):
                tx.commit()


def test_xa_across_two_members_survives_a_crash_between_the_commits(
        cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        c.create_topic("xa-two", partitions=6)
        owners = c.owners("xa-two")
        p1, p2 = owners.index(1), owners.index(2)
    xid1 = Xid(7, b"order-1", b"node-1")
    xid2 = Xid(7, b"order-1", b"node-2")
    with one(cluster, 1) as n1, one(cluster, 2) as n2:
        t1 = n1.xa_start(xid1)
        t1.produce("xa-two", b"debit", partition=p1)
        n1.xa_end(xid1)
        t2 = n2.xa_start(xid2)
        t2.produce("xa-two", b"credit", partition=p2)
        n2.xa_end(xid2)
        n1.xa_prepare(xid1)
        n2.xa_prepare(xid2)
        n1.xa_commit(xid1)
    cluster.nodes[2].kill()  # the coordinator's second commit never arrived
    cluster.nodes[2].start()
    with one(cluster, 2) as n2, one(cluster, 1) as n1:
        assert xid2 in n2.xa_recover()  # in doubt, until the coordinator resolves it
        assert n2.read("xa-two", p2, 0) == []
        n2.xa_commit(xid2)
        assert [r.value for r in n2.read("xa-two", p2, 0)] == [b"credit"]
        assert [r.value for r in n1.read("xa-two", p1, 0)] == [b"debit"]


def far_topic(cl: LocalCluster, c: NodeClient, name: str) -> tuple[tuple[int, ...], int]:
    """Create ``name`` (6 partitions) and wait until every member knows it (a member just
    restarted may copy it late); its owners, and the highest member id among them: not the
    first endpoint's member."""
    c.create_topic(name, partitions=6)
    known_everywhere(cl, name)
    owners = c.owners(name)
    return owners, max(owners)


def test_a_routed_clients_transaction_lives_on_its_first_writes_member(
        cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        owners, far = far_topic(cluster, c, "txn-routed")
        mine = [p for p, o in enumerate(owners) if o == far]
        other = next(p for p, o in enumerate(owners) if o != far)
        with c.transaction() as tx:
            for p in mine:
                tx.produce("txn-routed", f"v{p}".encode(), partition=p)
            tx.commit_offset("g", "txn-routed", mine[0], 0)
        assert tx.result is not None
        assert [p for p, _off in (o for call in tx.result.offsets for o in call)] == mine
        for p in mine:
            assert [r.value for r in c.read("txn-routed", p, 0)] == [f"v{p}".encode()]
        # A key's partition decides too, and a write elsewhere is refused by that member.
        key = next(f"k{i}".encode() for i in range(100)
                   if owners[key_partition(f"k{i}".encode(), len(owners))] == far)
        tx = c.transaction()
        tx.produce("txn-routed", b"keyed", key=key)
        tx.produce("txn-routed", b"elsewhere", partition=other)
        with pytest.raises(CrossNode, match=f"not on node {far}"):
            tx.commit()


def test_a_routed_transaction_read_first_or_making_a_namespace_still_finds_its_member(
        cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        owners, far = far_topic(cluster, c, "txn-read-first")
        p = owners.index(far)
        c.produce("txn-read-first", b"in", partition=p)
        tx = c.transaction()
        seen = c.read("txn-read-first", p, 0)  # a call before the first write ties it nowhere
        tx.produce("txn-read-first", b"out", partition=p)
        tx.commit()
        assert [r.value for r in seen] == [b"in"]
        # Read on to the end: one read may stop where the member's cache ends (its copy of
        # b"in" is cached, the transaction's record is read from the shard).
        assert read_partition(c, "txn-read-first", p) == [b"in", b"out"]
        with c.transaction() as kv_tx:  # its first write creates the namespace
            kv_tx.kv_put("fresh-ns", b"k", b"v")
        assert c.kv_get("fresh-ns", b"k") == b"v"


def test_a_routed_clients_xa_branch_lives_on_the_member_it_names(
        cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        owners, far = far_topic(cluster, c, "xa-routed")
        p = owners.index(far)
        xid = Xid(9, b"routed", b"far")
        tx = c.xa_start(xid, member=far)
        tx.produce("xa-routed", b"staged", partition=p)
        c.xa_end(xid)
        c.xa_prepare(xid)
        assert xid in c.xa_recover()  # asked of every member
    with routed(cluster) as again:  # a coordinator that restarted: it finds the branch
        again.xa_commit(xid)
        assert xid not in again.xa_recover()
        assert [r.value for r in again.read("xa-routed", p, 0)] == [b"staged"]
        with pytest.raises(ValueError, match="member 9 is not one of"):
            again.xa_start(Xid(9, b"routed", b"nowhere"), member=9)
        twice = Xid(9, b"routed", b"twice")
        held = again.xa_start(twice, member=far)
        with pytest.raises(XAERDupid):  # the same xid on another member: refused here
            again.xa_start(twice, member=min(owners))
        again.xa_end(twice)
        again.xa_rollback(twice)
        assert held.finished


def test_the_txn_commands_given_one_member_see_and_resolve_every_members(
        cluster: LocalCluster) -> None:
    """An operator names one member (``--port``); the branches in doubt may be on any. The
    commands listed only that member's and answered XAER_NOTA for the others'."""
    def shardnode(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "node", *args, "--port",
                              str(cluster.nodes[2].port)], capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        return out.stdout

    with routed(cluster) as c:  # open throughout: its close rolls back its open transaction
        owners, _far = far_topic(cluster, c, "txn-cli")
        others = sorted(set(owners) - {1})
        xids = [Xid(11, b"cli", f"m{m}".encode()) for m in others]
        for m, xid in zip(others, xids, strict=True):
            branch = c.xa_start(xid, member=m)
            branch.produce("txn-cli", b"staged", partition=owners.index(m))
            c.xa_end(xid)
            c.xa_prepare(xid)
        local = c.transaction()
        local.produce("txn-cli", b"open", partition=owners.index(others[-1]))
        local.settle()

        rows = json.loads(shardnode("txn", "list", "--json"))
        assert sorted((r["xid"], r["member"]) for r in rows if r["xid"]) == sorted(
            (str(x), m) for m, x in zip(others, xids, strict=True))
        assert [(r["txn"], r["member"]) for r in rows if not r["xid"]] == [
            (local.id, others[-1])]
        assert "member" in shardnode("txn", "list")
        assert f"committed {xids[0]}" in shardnode("txn", "commit", str(xids[0]))
        shardnode("txn", "rollback", str(xids[1]))
        shardnode("txn", "rollback", str(local.id))
        assert json.loads(shardnode("txn", "list", "--json")) == []
    with routed(cluster) as c:
        p = owners.index(others[0])
        assert [r.value for r in c.read("txn-cli", p, 0)] == [b"staged"]


def test_an_xa_call_by_xid_looks_past_a_member_that_does_not_answer() -> None:
    """A branch begun by another client is looked for on every member; one that does not
    answer may hold it, so it is passed over, and said, never taken for XAER_NOTA."""
    c = NodeClient(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"])
    c._members = {1: "tcp://127.0.0.1:1", 2: "tcp://127.0.0.1:2", 3: "tcp://127.0.0.1:3"}
    answers: dict[str, Exception | dict[str, object]] = {
        "tcp://127.0.0.1:1": Unavailable("node 1 is not reachable"),
        "tcp://127.0.0.1:2": {"lsn": 7, "parts": []},
        "tcp://127.0.0.1:3": XAERNota("unknown xid")}
    asked: list[str] = []

    def call_on(sock: object, op: str, fields: dict[str, object]) -> dict[str, object]:
        endpoint = next(e for e, s in c._socks.items() if s is sock)
        asked.append(endpoint)
        answer = answers[endpoint]
        if isinstance(answer, Exception):
            raise answer
        return answer
    c._call_on = call_on  # type: ignore[method-assign]
    try:
        assert c.xa_commit(Xid(1, b"g", b"b")).lsn == 7
        assert asked == ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]
        answers["tcp://127.0.0.1:2"] = XAERNota("unknown xid")
        with pytest.raises(Unavailable, match="not found on the members that answered"):
            c.xa_rollback(Xid(1, b"g", b"b"))
        answers["tcp://127.0.0.1:1"] = XAERNota("unknown xid")
        with pytest.raises(XAERNota):
            c.xa_rollback(Xid(1, b"g", b"b"))
    finally:
        c.close()


def test_while_the_catalog_member_is_down_topics_stay_usable_but_fixed(
        cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        c.create_topic("steady", partitions=6)
        owners = c.owners("steady")
    cluster.nodes[1].stop()
    try:
        with one(cluster, 2, retries=1) as c2:
            with pytest.raises(Unavailable, match="node 1"):
                c2.create_topic("refused", partitions=1)
            with pytest.raises(Unavailable, match="node 1"):
                c2.delete_topic("steady")
            for p, o in enumerate(owners):
                if o == 1:
                    continue
                c2.produce("steady", b"still", partition=p)
                assert [r.value for r in c2.read("steady", p, 0)] == [b"still"]
    finally:
        cluster.nodes[1].start()


def test_a_member_killed_under_load_is_named_and_loses_nothing(cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        c.create_topic("load", partitions=6)
        owners = c.owners("load")
    acked: dict[int, list[bytes]] = collections.defaultdict(list)
    with routed(cluster, timeout_ms=3000, retries=2) as c:
        for i in range(60):
            p = i % 6
            c.produce("load", f"before-{i}".encode(), partition=p)
            acked[p].append(f"before-{i}".encode())
        cluster.nodes[3].kill()
        lost = [p for p, o in enumerate(owners) if o == 3]
        for p in range(6):
            t0 = time.monotonic()
            if p in lost:
                with pytest.raises(Unavailable, match="node 3"):
                    c.produce("load", b"refused", partition=p)
                assert time.monotonic() - t0 < 3 * 3.0  # within the request's bounds, no hang
            else:
                c.produce("load", f"during-{p}".encode(), partition=p)
                acked[p].append(f"during-{p}".encode())
    # forwarded by a member that knows the owner is down: named too
    with one(cluster, 1, timeout_ms=3000, retries=0) as c1, pytest.raises(NodeError,
                                                                          match="node 3"):
        c1.read("load", lost[0], 0)
    cluster.nodes[3].start()
    with routed(cluster) as c:
        for p in range(6):
            assert read_partition(c, "load", p) == acked[p]


def answers(pipe: Pipeline, count: int) -> dict[int, list[tuple[int, int]] | NodeError]:
    """The answers to ``count`` requests of ``pipe``, by request id (within ``WAIT_S``)."""
    got: dict[int, list[tuple[int, int]] | NodeError] = {}
    deadline = time.monotonic() + WAIT_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"{count - len(got)} requests never answered"
        got.update(pipe.poll(100))
    return got


def known_everywhere(cl: LocalCluster, topic: str) -> None:
    """Wait until every member has ``topic`` in its copy of the catalog. The creation is
    answered once every member was told to copy it, but a member the catalog member could
    not reach (just after a member started, sockets between members may still be
    connecting) copies it only in its next sync, and until then answers UNAVAILABLE if it
    cannot ask the catalog either (a pipeline does not retry)."""
    deadline = time.monotonic() + WAIT_S
    for member in cl.nodes:
        with one(cl, member) as m:
            while topic not in [row[0] for row in m.call("list_topics")["topics"]]:
                assert time.monotonic() < deadline, f"member {member} never copied {topic!r}"
                time.sleep(0.05)  # ok-sleep: polling the member's copy of the catalog


def test_a_routed_pipeline_sends_each_request_to_its_owner(cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        c.create_topic("piped", partitions=6)
        known_everywhere(cluster, "piped")
        before = cluster.forwarded()
        pipe = c.pipeline()
        sent: dict[int, tuple[bytes, int]] = {}  # id → value, the partition expected
        for seq in range(30):  # keyless: the request's round-robin pick, by producer id and seq
            v = f"rr-{seq}".encode()
            sent[pipe.submit("piped", [v], seq=seq)] = (v, (c.producer_id + seq) % 6)
        for seq, rec in enumerate(keyed("k", 30), start=30):  # keyed: the key's partition
            assert rec.key is not None
            sent[pipe.submit("piped", [rec], seq=seq)] = (rec.value,
                                                          c.key_partition("piped", rec.key))
        for p in range(6):
            sent[pipe.submit("piped", [b"named-%d" % p], partition=p, seq=60 + p)] = (
                b"named-%d" % p, p)
        got = answers(pipe, len(sent))
        assert cluster.forwarded() == before  # each went to its owner: nothing forwarded
        stored: dict[int, dict[int, bytes]] = collections.defaultdict(dict)  # p → offset → v
        for rid, (value, partition) in sent.items():
            out = got[rid]
            assert not isinstance(out, NodeError), out
            ((p, off),) = out
            assert p == partition
            stored[p][off] = value
        for p in range(6):  # every record at the offset it was answered with
            assert read_partition(c, "piped", p) == [stored[p][o] for o in range(len(stored[p]))]


def test_a_routed_pipeline_answers_unavailable_for_a_member_down(cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        c.create_topic("piped-down", partitions=6)
        owners = c.owners("piped-down")
        known_everywhere(cluster, "piped-down")
    producer_id = 4242
    cluster.nodes[3].kill()
    try:
        with NodeClient(cluster.endpoints, timeout_ms=3000, producer_id=producer_id) as c:
            pipe = c.pipeline()
            ids = {pipe.submit("piped-down", [b"v%d" % p], partition=p, seq=p): p
                   for p in range(6)}
            got = answers(pipe, 6)
            for rid, p in ids.items():
                if owners[p] == 3:
                    assert isinstance(got[rid], Unavailable), got[rid]
                    assert "node 3" in str(got[rid])
                else:
                    assert got[rid] == [(p, 0)]
    finally:
        cluster.nodes[3].start()
    with NodeClient(cluster.endpoints, timeout_ms=3000, producer_id=producer_id) as c:
        # The same producer sends them all again, under their numbers: none is written twice.
        assert send_until_ok(c, "piped-down", {p: b"v%d" % p for p in range(6)}) == {
            p: (p, 0) for p in range(6)}
        for p in range(6):
            assert read_partition(c, "piped-down", p) == [b"v%d" % p]


def send_until_ok(c: NodeClient, topic: str, values: dict[int, bytes]
                  ) -> dict[int, tuple[int, int]]:
    """Send each partition's value to it through a pipeline, under the partition's number
    as its sequence number, and again while it is answered UNAVAILABLE (a member just
    started answers so until its front door has the catalog); where each landed."""
    placed: dict[int, tuple[int, int]] = {}
    deadline = time.monotonic() + WAIT_S
    while len(placed) < len(values):
        assert time.monotonic() < deadline, f"partitions {set(values) - set(placed)} refused"
        pipe = c.pipeline()
        ids = {pipe.submit(topic, [v], partition=p, seq=p): p
               for p, v in values.items() if p not in placed}
        for rid, out in answers(pipe, len(ids)).items():
            if isinstance(out, Unavailable):
                time.sleep(0.02)  # ok-sleep: polling a member that is starting
                continue
            assert not isinstance(out, NodeError), out
            placed[ids[rid]] = out[0]
    return placed


def test_a_routed_batch_retried_under_its_sequence_number_is_written_once(
        cluster: LocalCluster) -> None:
    with routed(cluster) as c:
        c.create_topic("retried", partitions=6)
        known_everywhere(cluster, "retried")
        recs = keyed("again", 60)
        first = c.produce_batch("retried", recs, seq=5)
        assert len({c.owners("retried")[p] for p, _off in first}) == 3  # split over all three
        assert c.produce_batch("retried", recs, seq=5) == first
        assert sum(c.end_offsets("retried")) == 60


def test_a_snapshot_export_on_a_member_copies_that_member_only(
        cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    import json

    from actors.snapshot_files import MANIFEST

    with routed(cluster) as c:
        c.create_topic("exported", partitions=6)
        owners = c.owners("exported")
        c.produce_batch("exported", keyed("e", 60))
    snap = tmp_path_factory.mktemp("member-export") / "snap"
    with one(cluster, 2, timeout_ms=60_000) as m:
        topic_id = next(r[2] for r in m.call("list_topics")["topics"] if r[0] == "exported")
        # An export copies the shards as the writers have applied them, the log after; they
        # make a shard's directory as they apply its topic's creation, after the produce's
        # acknowledgement: wait for this member's, so that the export has them as shards.
        mine = {(topic_id, p) for p, o in enumerate(owners) if o == 2}
        deadline = time.monotonic() + WAIT_S
        while shards_of(cluster, 2, topic_id) != mine and time.monotonic() < deadline:
            time.sleep(0.05)  # ok-sleep: polling the writers' shard directories
        done = m.snapshot_export(str(snap))
    manifest = json.loads((snap / MANIFEST).read_text())
    assert manifest["node_id"] == 2 and manifest["lsn"] == done["lsn"]
    assert set(manifest["shards"]) == shard_dirs(cluster, 2)  # this member's, every topic
    exported = {parse_shard_dir(d) for d in manifest["shards"]}
    assert {s for s in exported if s and s[0] == topic_id} == {
        (topic_id, p) for p, o in enumerate(owners) if o == 2}
