"""A cluster's logic without nodes: placement, the cluster file, the front door of a member
forwarding, gathering and copying the catalog (no sockets), and a routed client against
sockets standing in for members."""

from __future__ import annotations

import collections
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from actors.cluster_state import PEER_PREFIX, catalog_changes
from actors.front_cluster import ClusterDoor
from actors.front_state import FrontDoorState
from actors.instructions import Produce, Reply, Request, ToPeer
from config import ConfigError, load_config
from config.cluster import Member, cluster_text, parse_members
from node.client import NodeClient
from wire.errors import ErrorCode
from wire.messages import Catalog, CreateTopic, DeleteTopic, Done, EndOffsets, OffsetsReply
from wire.placement import place
from wire.protocol import Topic

ID = b"client-1"
PEER = PEER_PREFIX + b"2"

# ---- placement ---------------------------------------------------------------------------


def test_placement_spreads_one_topic_evenly_and_is_stable() -> None:
    for partitions in (1, 2, 3, 6, 7, 64):
        owners = place("events", partitions, [1, 2, 3])
        counts = collections.Counter(owners)
        assert max(counts.values()) - min(counts.get(m, 0) for m in (1, 2, 3)) <= 1
        assert owners == place("events", partitions, [3, 1, 2])  # not the order given


def test_placement_of_one_partition_topics_spreads_over_members() -> None:
    counts = collections.Counter(place(f"topic-{i}", 1, [1, 2, 3])[0] for i in range(300))
    assert set(counts) == {1, 2, 3}
    assert min(counts.values()) >= 70  # 100 each, give or take the hash


def test_placement_moves_few_first_partitions_when_a_member_is_added() -> None:
    """Rendezvous: with a member added, a topic's first partition either stays where it was
    or moves to the new member, never between old ones."""
    names = [f"t{i}" for i in range(300)]
    before = {n: place(n, 1, [1, 2, 3])[0] for n in names}
    after = {n: place(n, 1, [1, 2, 3, 4])[0] for n in names}
    moved = [n for n in names if before[n] != after[n]]
    assert all(after[n] == 4 for n in moved)
    assert 40 <= len(moved) <= 110  # about a quarter


# ---- the cluster file --------------------------------------------------------------------


def test_the_cluster_file_round_trips_and_sorts_members() -> None:
    members = (Member(2, "tcp://127.0.0.1:7401"), Member(1, "tcp://127.0.0.1:7400", "a" * 40))
    assert parse_members(cluster_text(members), "x") == tuple(sorted(members, key=lambda m: m.id))


@pytest.mark.parametrize(("text", "says"), [
    ("", "lists no [[member]]"),
    ("[[member]]\nid = 1\n", "endpoint must be tcp://HOST:PORT"),
    ("[[member]]\nid = 0\nendpoint = 'tcp://h:1'\n", "id must be an integer 1-65535"),
    ("[[member]]\nid = 1\nendpoint = 'tcp://h:1'\n[[member]]\nid = 1\nendpoint = 'tcp://h:2'\n",
     "id 1 is listed twice"),
    ("[[member]]\nid = 1\nendpoint = 'tcp://h:1'\n[[member]]\nid = 2\nendpoint = 'tcp://h:1'\n",
     "endpoint tcp://h:1 is listed twice"),
    ("[[member]]\nid = 1\nendpoint = 'tcp://h:1'\ncolour = 'red'\n", "keys id, endpoint"),
    ("members = 3\n", "unknown keys"),
    ("[[member]\n", "not valid TOML"),
])
def test_a_bad_cluster_file_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as exc:
        parse_members(text, "cluster.toml")
    assert says in str(exc.value)


def test_a_node_must_be_a_member_at_its_endpoint(tmp_path: Path) -> None:
    f = tmp_path / "cluster.toml"
    f.write_text(cluster_text([Member(1, "tcp://127.0.0.1:7400")]))
    ok: dict[str, dict[str, Any]] = {"cluster": {"file": str(f), "node_id": 1},
                                     "node": {"port": 7400}}
    assert load_config(overrides=ok).members == (Member(1, "tcp://127.0.0.1:7400"),)
    with pytest.raises(ConfigError, match="not a member"):
        load_config(overrides={"cluster": {"file": str(f), "node_id": 2}})
    with pytest.raises(ConfigError, match="gives its endpoint as"):
        load_config(overrides={"cluster": {"file": str(f), "node_id": 1}, "node": {"port": 7411}})
    with pytest.raises(ConfigError, match=r"cluster\.file is not"):
        load_config(overrides={"cluster": {"node_id": 1}})


# ---- a member's front door ---------------------------------------------------------------

EVENTS = Topic("events", 6, 1, (1, 2, 3, 1, 2, 3))


def member(tmp_path: Path, me: int, topics: list[Topic] | None = None) -> FrontDoorState:
    f = tmp_path / "cluster.toml"
    f.write_text(cluster_text([Member(i, f"tcp://127.0.0.1:{7400 + i}") for i in (1, 2, 3)]))
    cfg = load_config(overrides={"cluster": {"file": str(f), "node_id": me},
                                 "node": {"port": 7400 + me}})
    s = FrontDoorState(cfg)
    s.catalog(Catalog(7, topics if topics is not None else [EVENTS], 7))
    return s


def cluster_of(s: FrontDoorState) -> ClusterDoor:
    """A member's part of the front door that forwards, gathers and copies the catalog."""
    assert s.cluster is not None
    return s.cluster


def frame(op: str, rid: int = 1, **fields: Any) -> list[bytes]:
    return [msgpack.packb({"op": op, "id": rid, **fields}, use_bin_type=True)]


def answer_of(out: Any) -> dict[str, Any]:
    """The reply map a client is sent."""
    assert isinstance(out, Reply)
    return unpack(out.frame)


def corr_of(out: Any) -> int:
    """The correlation id a request sent on waits under."""
    assert isinstance(out, ToPeer | Request | Produce)
    return out.corr


def test_stats_and_compact_are_answered_by_the_member_asked_for_its_own_shards(
        tmp_path: Path) -> None:
    s = member(tmp_path, 2)
    for op, fields in (("stats", {}), ("compact", {"topic": "events"})):
        outs = s.request(b"client", frame(op, 5, **fields), now=0.0)
        # Nothing forwarded: this member's shard writers, each once.
        assert [o.role for o in outs if isinstance(o, Request)] == ["writer-0", "writer-1"]
        assert len(outs) == 2


def read_req(rid: int, topic: str, partition: int, max_records: int) -> list[bytes]:
    """A client's read from offset 0."""
    return frame("read", rid, topic=topic, partition=partition, offset=0,
                 max_records=max_records)


def unpack(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return out


def test_a_read_of_another_members_partition_is_forwarded_and_its_answer_relayed(
        tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    (out,) = s.request(ID, read_req(5, "events", 1, 10), now=0.0)
    assert isinstance(out, ToPeer) and out.member == 2
    sent = unpack(out.frame)
    assert sent["op"] == "read" and sent["id"] == out.corr and sent["partition"] == 1
    (rep,) = s.peer_reply({"records": b"\x90", "id": out.corr, "ok": True})
    assert isinstance(rep, Reply) and rep.identity == ID
    assert unpack(rep.frame) == {"records": b"\x90", "id": 5, "ok": True}
    # its own partitions are served here
    (own,) = s.request(ID, read_req(6, "events", 3, 10), now=0.0)
    assert isinstance(own, Request)


def test_a_forwarded_request_is_never_forwarded_again(tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    (out,) = s.request(PEER, read_req(5, "events", 1, 10), now=0.0)
    assert isinstance(out, Reply)
    reply = unpack(out.frame)
    assert reply["code"] == ErrorCode.NOT_OWNER and "node 2 (tcp://127.0.0.1:7402)" in reply["error"]


def test_a_member_that_does_not_answer_in_time_is_named_unavailable(tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    s.request(ID, read_req(5, "events", 2, 1), 0.0)
    (rep,) = s.expire(now=60.0)
    assert isinstance(rep, Reply)
    reply = unpack(rep.frame)
    assert reply["code"] == ErrorCode.UNAVAILABLE and "node 3" in reply["error"]
    # a member that cannot be reached at all: the shell fails the request at once
    (out,) = s.request(ID, read_req(6, "events", 2, 1), 0.0)
    assert isinstance(out, ToPeer)
    (rep,) = s.fail([out.corr], ErrorCode.UNAVAILABLE, "node 3 is not reachable")
    assert isinstance(rep, Reply) and unpack(rep.frame)["code"] == ErrorCode.UNAVAILABLE


def keyed(n: int) -> list[list[Any]]:
    return [[f"v{i}".encode(), f"k{i}".encode(), [], None] for i in range(n)]


def test_a_batch_split_over_members_goes_to_each_and_the_answers_are_joined(
        tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    recs = keyed(12)
    assign = [zlib.crc32(r[1]) % 6 for r in recs]
    outs = s.request(ID, frame("produce", 9, topic="events", producer_id=5, seq=3,
                               records=msgpack.packb(recs)), now=0.0)
    local = [o for o in outs if isinstance(o, Produce)]
    remote = {o.member: o for o in outs if isinstance(o, ToPeer)}
    assert len(local) == 1 and set(remote) == {2, 3}
    _pid, _seq, parts = local[0].request
    assert {p for _t, p, _n, _b in parts} == {p for p in assign if EVENTS.owner(p) == 1}
    answers = []
    for m, o in remote.items():
        sent = unpack(o.frame)
        assert (sent["producer_id"], sent["seq"], "partition" in sent) == (5, 3, False)
        theirs = [r for r, p in zip(recs, assign, strict=True) if EVENTS.owner(p) == m]
        assert msgpack.unpackb(sent["records"]) == theirs
        placed = sorted({p for p in assign if EVENTS.owner(p) == m})
        rows = [[p, 100 * m, assign.count(p)] for p in placed]
        answers.append({"lsn": 40 + m, "parts": rows, "id": o.corr, "ok": True})
    assert s.peer_reply(answers[0]) == []
    mine = sorted({p for p in assign if EVENTS.owner(p) == 1})
    assert s.ack(local[0].corr, 12, [(p, 7, assign.count(p)) for p in mine]) == []
    (rep,) = s.peer_reply(answers[1])
    reply = answer_of(rep)
    assert reply["id"] == 9 and reply["ok"] and reply["assign"] == assign
    assert sorted(row[0] for row in reply["parts"]) == sorted(set(assign))
    assert reply["lsn"] == 43


def test_a_failed_part_fails_the_whole_batch(tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    outs = s.request(ID, frame("produce", 9, topic="events", producer_id=5, seq=3,
                               records=msgpack.packb(keyed(12))), now=0.0)
    (local,) = [o for o in outs if isinstance(o, Produce)]
    first, second = [o for o in outs if isinstance(o, ToPeer)]
    assert s.fail([first.corr], ErrorCode.UNAVAILABLE, "node gone") == []
    assert s.ack(local.corr, 1, []) == []
    (rep,) = s.peer_reply({"lsn": 1, "parts": [], "id": second.corr, "ok": True})
    reply = answer_of(rep)
    assert (reply["id"], reply["code"], reply["error"]) == (9, ErrorCode.UNAVAILABLE, "node gone")
    assert not s.pending


def test_end_offsets_are_gathered_from_every_owner(tmp_path: Path) -> None:
    s = member(tmp_path, 2)
    outs = s.request(ID, frame("end_offsets", 4, topic="events"), now=0.0)
    local = next(o for o in outs if isinstance(o, Request))
    assert isinstance(local.msg, EndOffsets)
    peers = {o.member: o for o in outs if isinstance(o, ToPeer)}
    assert set(peers) == {1, 3}
    assert s.answer(OffsetsReply(local.corr, 9, [0, 21, 0, 0, 24, 0])) == []
    assert s.peer_reply({"offsets": [10, 0, 0, 13, 0, 0], "id": peers[1].corr, "ok": True}) == []
    (rep,) = s.peer_reply({"offsets": [0, 0, 32, 0, 0, 35], "id": peers[3].corr, "ok": True})
    assert answer_of(rep) == {"offsets": [10, 21, 32, 13, 24, 35], "id": 4, "ok": True}


def test_the_catalog_member_places_a_new_topics_partitions(tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    (out,) = s.request(ID, frame("create_topic", 2, name="orders", partitions=5), now=0.0)
    assert isinstance(out, Request) and isinstance(out.msg, CreateTopic)
    assert tuple(out.msg.owners) == place("orders", 5, [1, 2, 3])


def test_a_member_forwards_a_creation_and_answers_once_it_copied_the_catalog(
        tmp_path: Path) -> None:
    s = member(tmp_path, 3)
    (fwd,) = s.request(ID, frame("create_topic", 2, name="orders", partitions=3), now=0.0)
    assert isinstance(fwd, ToPeer) and fwd.member == 1
    (pull,) = s.peer_reply({"lsn": 12, "id": fwd.corr, "ok": True})
    assert isinstance(pull, ToPeer) and unpack(pull.frame)["op"] == "list_topics"
    orders = Topic("orders", 3, 2, place("orders", 3, [1, 2, 3]))
    (copy,) = s.peer_reply({"topics": [list(EVENTS), list(orders)], "id": pull.corr, "ok": True})
    assert isinstance(copy, Request) and isinstance(copy.msg, CreateTopic)
    assert (copy.msg.topic_id, tuple(copy.msg.owners)) == (2, orders.owners)
    (rep,) = s.answer(Done(copy.corr, 13))
    assert answer_of(rep) == {"lsn": 12, "id": 2, "ok": True}
    assert s.topics["orders"] == orders  # routed by at once


def test_a_request_naming_an_unknown_topic_waits_for_a_copy_of_the_catalog(
        tmp_path: Path) -> None:
    s = member(tmp_path, 2)
    (pull,) = s.request(ID, read_req(3, "late", 0, 1), now=0.0)
    assert isinstance(pull, ToPeer) and pull.member == 1
    late = Topic("late", 1, 5, (2,))
    (copy,) = s.peer_reply({"topics": [list(EVENTS), list(late)], "id": pull.corr, "ok": True})
    (read,) = s.answer(Done(corr_of(copy), 20))
    assert isinstance(read, Request)  # served here: partition 0 is this member's
    # a topic the catalog does not have either is unknown, once asked
    (pull,) = s.request(ID, read_req(4, "never", 0, 1), now=0.0)
    (rep,) = s.peer_reply({"topics": [list(EVENTS), list(late)], "id": corr_of(pull), "ok": True})
    assert answer_of(rep)["code"] == ErrorCode.UNKNOWN_TOPIC


def test_an_unreachable_catalog_member_is_named(tmp_path: Path) -> None:
    s = member(tmp_path, 2)
    (pull,) = s.request(ID, read_req(3, "late", 0, 1), now=0.0)
    (rep,) = s.fail([corr_of(pull)], ErrorCode.UNAVAILABLE, "node 1 (tcp://x) is not reachable")
    reply = answer_of(rep)
    # Unknown here, but the topic may exist: answered so that the client tries again (just
    # after members start, their sockets to each other may still be connecting, and a
    # topic created then can miss a member), not UNKNOWN_TOPIC, which it would not.
    assert reply["code"] == ErrorCode.UNAVAILABLE and "node 1 (tcp://x)" in reply["error"]
    assert "'late' does not exist here" in reply["error"]
    # Asked again, with the catalog member reached this time: unknown for sure.
    (pull,) = s.request(ID, frame("read", 4, topic="late", partition=0, offset=0,
                                  max_records=1), now=0.0)
    (rep,) = s.peer_reply({"topics": [list(EVENTS)], "id": corr_of(pull), "ok": True})
    assert answer_of(rep)["code"] == ErrorCode.UNKNOWN_TOPIC
    (fwd,) = s.request(ID, frame("create_topic", 4, name="new", partitions=1), now=0.0)
    (rep,) = s.fail([corr_of(fwd)], ErrorCode.UNAVAILABLE, "node 1 (tcp://x) is not reachable")
    assert answer_of(rep)["code"] == ErrorCode.UNAVAILABLE


def test_a_transaction_across_members_is_refused_naming_them(tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    (rep,) = s.request(ID, frame("txn_produce", 2, txn=7, seq=0, topic="events", partition=1,
                                 records=msgpack.packb([b"a"])), now=0.0)
    reply = answer_of(rep)
    assert reply["code"] == ErrorCode.CROSS_NODE and "node 2" in reply["error"]
    (ok,) = s.request(ID, frame("txn_produce", 3, txn=7, seq=0, topic="events", partition=3,
                                records=msgpack.packb([b"a"])), now=0.0)
    assert isinstance(ok, Request)


def test_a_member_copies_deletions_and_recreations() -> None:
    local = {"a": Topic("a", 1, 1, (1,)), "b": Topic("b", 2, 2, (1, 2)),
             "c": Topic("c", 1, 3, (2,))}
    catalog = [Topic("a", 1, 1, (1,)), Topic("b", 3, 7, (1, 2, 3)), Topic("d", 1, 8, (3,))]
    deletes, creates = catalog_changes(local, catalog)
    assert [t.name for t in deletes] == ["b", "c"]
    assert [t.name for t in creates] == ["b", "d"]


def test_a_member_copying_the_catalog_deletes_first(tmp_path: Path) -> None:
    s = member(tmp_path, 2, [EVENTS, Topic("gone", 1, 4, (2,))])
    (pull,) = s.tick(now=100.0)
    outs = s.peer_reply({"topics": [list(EVENTS)], "id": corr_of(pull), "ok": True})
    assert [type(o.msg) for o in outs if isinstance(o, Request)] == [DeleteTopic]
    assert s.tick(now=100.5) == []  # not again before catalog_sync_ms


def test_the_catalog_member_answers_a_creation_once_the_members_were_told(
        tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    (out,) = s.request(ID, frame("create_topic", 2, name="orders", partitions=3), now=0.0)
    syncs = s.answer(Done(corr_of(out), 30))
    assert sorted(o.member for o in syncs if isinstance(o, ToPeer)) == [2, 3]
    assert all(unpack(o.frame)["op"] == "cluster_sync" for o in syncs if isinstance(o, ToPeer))
    first, second = syncs
    assert isinstance(first, ToPeer) and isinstance(second, ToPeer)
    assert s.fail([first.corr], ErrorCode.UNAVAILABLE, "down") == []  # copies at its start
    (rep,) = s.peer_reply({"node_id": second.member, "id": second.corr, "ok": True})
    assert answer_of(rep) == {"lsn": 30, "id": 2, "ok": True}


def test_a_member_told_to_sync_answers_once_it_copied(tmp_path: Path) -> None:
    s = member(tmp_path, 3)
    (pull,) = s.request(PEER_PREFIX + b"1", frame("cluster_sync", 8), now=0.0)
    assert isinstance(pull, ToPeer) and pull.member == 1
    (rep,) = s.peer_reply({"topics": [list(EVENTS)], "id": pull.corr, "ok": True})
    assert answer_of(rep) == {"node_id": 3, "id": 8, "ok": True}


def test_a_split_batch_with_a_silent_member_fails_naming_it(tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    outs = s.request(ID, frame("produce", 9, topic="events", producer_id=5, seq=3,
                               records=msgpack.packb(keyed(12))), now=0.0)
    (local,) = [o for o in outs if isinstance(o, Produce)]
    assert s.ack(local.corr, 1, []) == []
    (rep,) = s.expire(now=60.0)
    reply = answer_of(rep)
    assert reply["id"] == 9 and reply["code"] == ErrorCode.UNAVAILABLE
    assert "did not answer in time" in reply["error"] and "node " in reply["error"]
    assert not s.pending and cluster_of(s).forwards_open == 0


def test_forwarded_requests_are_bounded(tmp_path: Path) -> None:
    s = member(tmp_path, 1)
    cluster_of(s).forwards_max = 2
    read = {"topic": "events", "partition": 1, "offset": 0, "max_records": 1}
    first, second = (s.request(ID, frame("read", i, **read), now=0.0)[0] for i in (1, 2))
    assert isinstance(first, ToPeer) and isinstance(second, ToPeer)
    (busy,) = s.request(ID, frame("read", 3, **read), now=0.0)
    assert answer_of(busy)["code"] == ErrorCode.BUSY
    s.peer_reply({"records": b"\x90", "id": first.corr, "ok": True})
    (again,) = s.request(ID, frame("read", 4, **read), now=0.0)
    assert isinstance(again, ToPeer)


def test_a_transactional_batch_with_no_partition_is_judged_by_where_it_lands(
        tmp_path: Path) -> None:
    """Keyed records all in one of this member's partitions are served here, even when
    another member owns partition 0; keyless ones land where txn_produce's round robin puts
    them, and are refused if that is another member's."""
    s = member(tmp_path, 1)  # owns partitions 0 and 3 of EVENTS
    key = next(k for k in (b"k%d" % i for i in range(100)) if zlib.crc32(k) % 6 == 3)
    recs = msgpack.packb([[b"v", key, [], None], [b"w", key, [], None]])
    (ok,) = s.request(ID, frame("txn_produce", 2, txn=7, seq=0, topic="events", records=recs),
                      now=0.0)
    assert isinstance(ok, Request)
    s2 = member(tmp_path, 2)  # owns 1 and 4; keyless: (txn + seq) % 6 = 3, member 1's
    (refused,) = s2.request(ID, frame("txn_produce", 3, txn=3, seq=0, topic="events",
                                      records=msgpack.packb([b"a"])), now=0.0)
    assert answer_of(refused)["code"] == ErrorCode.CROSS_NODE
    (served,) = s2.request(ID, frame("txn_produce", 4, txn=4, seq=0, topic="events",
                                     records=msgpack.packb([b"a"])), now=0.0)
    assert isinstance(served, Request)  # (4 + 0) % 6 = 4: member 2's


def test_the_catalog_copy_is_not_counted_as_forwarded(tmp_path: Path) -> None:
    s = member(tmp_path, 2)
    (pull,) = s.tick(now=100.0)
    assert isinstance(pull, ToPeer) and cluster_of(s).forwarded == 0
    s.request(ID, read_req(5, "events", 0, 1), now=100.0)
    assert cluster_of(s).forwarded == 1


# ---- a routed client and a member that says it is not the owner ---------------------------


def test_a_routed_client_told_not_owner_learns_the_map_again_and_retries() -> None:
    """Two sockets stand in for members 1 and 2. The first map puts partition 0 on member 1,
    which answers NOT_OWNER (the partition is member 2's now); the client asks the catalog
    member for the map again, which puts it on member 2, and sends its retry there."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    fakes = [ctx.socket(zmq.ROUTER) for _ in range(2)]
    endpoints = [f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}" for s in fakes]
    seen: list[tuple[int, str]] = []

    def answer(member: int, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "cluster_map":
            return {"members": [[1, endpoints[0], ""], [2, endpoints[1], ""]], "node_id": member}
        if op == "list_topics":
            asked_before = sum(1 for _m, o in seen if o == "list_topics") > 1
            return {"topics": [["t", 1, 1, [2 if asked_before else 1]]]}
        if member == 1:
            return {"ok": False, "code": int(ErrorCode.NOT_OWNER),
                    "error": "partition 0 of 't' is owned by node 2"}
        return {"lsn": 5, "parts": [[0, 7, 1]]}

    result: list[Any] = []
    with NodeClient(endpoints, timeout_ms=2000, retries=0) as c:
        t = threading.Thread(target=lambda: result.append(c.produce("t", b"v", partition=0)),
                             daemon=True)
        t.start()
        poller = zmq.Poller()
        for s in fakes:
            poller.register(s, zmq.POLLIN)
        deadline = time.monotonic() + 10
        while t.is_alive() and time.monotonic() < deadline:
            for sock, _ev in poller.poll(100):
                member = fakes.index(sock) + 1
                identity, frame = sock.recv_multipart()
                req = msgpack.unpackb(frame, raw=False)
                seen.append((member, req["op"]))
                reply = {"ok": True, **answer(member, req), "id": req["id"]}
                sock.send_multipart([identity, msgpack.packb(reply, use_bin_type=True)])
        t.join(1)
    for s in fakes:
        s.close(0)
    assert result == [(0, 7)]
    assert seen == [(1, "cluster_map"), (1, "list_topics"), (1, "produce"),
                    (1, "list_topics"), (2, "produce")]


def test_a_batch_whose_records_all_land_here_is_split_once_and_logged(tmp_path: Path) -> None:
    s = member(tmp_path, 1)  # owns partitions 0 and 3 of EVENTS
    here = [k for k in (b"k%d" % i for i in range(200)) if zlib.crc32(k) % 6 in (0, 3)]
    keys = [next(k for k in here if zlib.crc32(k) % 6 == p) for p in (0, 3, 0, 3)]
    recs: list[list[Any]] = [[b"v", k, [], None] for k in keys]
    (out,) = s.request(ID, frame("produce", 9, topic="events", producer_id=5, seq=3,
                                 records=msgpack.packb(recs)), now=0.0)
    assert isinstance(out, Produce)
    assert sorted(p for _t, p, _n, _b in out.request[2]) == [0, 3]
    assign = [zlib.crc32(k) % 6 for k in keys]
    parts = [(p, 0, assign.count(p)) for p in sorted(set(assign))]
    (rep,) = s.ack(out.corr, 4, parts)
    reply = answer_of(rep)
    assert reply["id"] == 9 and reply["assign"] == assign == [0, 3, 0, 3]


def test_a_split_batch_refused_busy_gives_back_the_forward_it_took(tmp_path: Path) -> None:
    """A batch split over two other members takes a forward for each; refused BUSY at the
    second (the bound), the first's place is given back with its wait. It stayed taken,
    and the member refused every forward after it, BUSY, for good."""
    s = member(tmp_path, 1)
    cluster_of(s).forwards_max = 1
    records = msgpack.packb([r for r in keyed(60) if zlib.crc32(r[1]) % 6 in (1, 2)])
    (busy,) = s.request(ID, frame("produce", 9, topic="events", producer_id=5, seq=3,
                                  records=records), now=0.0)
    assert answer_of(busy)["code"] == ErrorCode.BUSY
    assert not s.pending and cluster_of(s).forwards_open == 0
    read = {"topic": "events", "partition": 1, "offset": 0, "max_records": 1}
    (forwarded,) = s.request(ID, frame("read", 10, **read), now=0.0)
    assert isinstance(forwarded, ToPeer)


def test_a_member_checks_what_a_request_names_before_it_forwards_it(tmp_path: Path) -> None:
    """A request is checked on the member it reaches as on a single node, before anything
    is looked up or forwarded: a transaction's write to a partition that does not exist
    (answered INTERNAL), a produce whose partition is nil, which the table allows (by key;
    INTERNAL), a value over ``value_bytes_max`` to a namespace not known here (answered
    "not swapped", or the namespace was created for it), a name no namespace could have
    (answered as a namespace found empty; on the catalog member the creation it asked for
    was refused, and every write to the name after it waited for good)."""
    for me in (1, 2):
        s = member(tmp_path, me)
        bad_partition = [
            frame("txn_commit_offset", 1, txn=7, seq=0, group="g", topic="events", partition=6,
                  offset=1),
            frame("txn_produce", 2, txn=7, seq=1, topic="events", partition=9,
                  records=msgpack.packb([b"v"])),
        ]
        for request in bad_partition:
            (rep,) = s.request(ID, request, now=0.0)
            assert answer_of(rep)["code"] == ErrorCode.UNKNOWN_PARTITION
        by_key = msgpack.packb(keyed(1))
        for op, fields in (("produce", {"producer_id": 5, "seq": 1}),
                           ("txn_produce", {"txn": 7, "seq": 2})):
            (out,) = s.request(ID, frame(op, 3, topic="events", partition=None, records=by_key,
                                         **fields), now=0.0)
            # On its way, or refused for what it is (a transaction's write to a partition
            # of another member: CROSS_NODE), never INTERNAL.
            assert not isinstance(out, Reply) or answer_of(out)["code"] == ErrorCode.CROSS_NODE
        big = b"x" * (s.lim.value_bytes_max + 1)
        writes: list[tuple[str, dict[str, Any]]] = [
            ("kv_cas", {"expected": b"a", "new": big}), ("kv_put", {"value": big}),
            ("txn_kv", {"value": big, "txn": 7, "seq": 3})]
        for op, fields in writes:
            (rep,) = s.request(ID, frame(op, 4, namespace="new", key=b"k", **fields), now=0.0)
            assert answer_of(rep)["code"] == ErrorCode.BAD_REQUEST, op
        named: list[tuple[str, dict[str, Any]]] = [
            ("kv_get", {"key": b"k"}), ("kv_scan", {}), ("kv_delete", {"key": b"k"}),
            ("kv_put", {"key": b"k", "value": b"v"}), ("kv_put", {"key": b"k", "value": b"v"})]
        for op, fields in named:
            (rep,) = s.request(ID, frame(op, 5, namespace="bad ns!", **fields), now=0.0)
            assert answer_of(rep)["code"] == ErrorCode.INVALID_NAME, op


def test_the_catalogs_own_traffic_is_never_refused_for_want_of_room(tmp_path: Path) -> None:
    """With every forward a member may have open taken by clients' requests, a change of
    the catalog still asks the others to copy it, and a member still copies the catalog:
    refused BUSY, each raised out of the front door's handling of an answer, which ended
    the actor (and a copy left half begun stranded the requests parked for it)."""
    catalog = member(tmp_path, 1)
    cluster_of(catalog).forwards_max = 1
    (held,) = catalog.request(ID, read_req(5, "events", 1, 1), now=0.0)
    assert isinstance(held, ToPeer)
    (create,) = catalog.request(ID, frame("create_topic", 6, name="orders", partitions=3),
                                now=0.0)
    assert isinstance(create, Request)
    syncs = catalog.answer(Done(create.corr, 12))
    assert sorted(o.member for o in syncs if isinstance(o, ToPeer)) == [2, 3]
    (rep,) = [r for sync in syncs for r in catalog.peer_reply(
        {"node_id": corr_of(sync), "id": corr_of(sync), "ok": True})]
    assert answer_of(rep) == {"lsn": 12, "id": 6, "ok": True}

    other = member(tmp_path, 2)
    cluster_of(other).forwards_max = 1
    (held,) = other.request(ID, read_req(5, "events", 0, 1), now=0.0)
    assert isinstance(held, ToPeer)
    (pull,) = other.request(ID, read_req(7, "late", 0, 1), now=0.0)  # parked: a copy
    assert isinstance(pull, ToPeer) and unpack(pull.frame)["op"] == "list_topics"
    late = Topic("late", 1, 5, (2,))
    (copy,) = other.peer_reply({"topics": [list(EVENTS), list(late)], "id": pull.corr,
                                "ok": True})
    (read,) = other.answer(Done(corr_of(copy), 20))
    assert isinstance(read, Request)  # the parked read, served here


def test_correlation_ids_start_where_the_shell_says() -> None:
    """A restarted front door starts its ids elsewhere (``actors/front_door.py``: at random
    in 2**62): answers the actors still had for the one before must match none of its."""
    s = FrontDoorState(load_config(), first_corr=1 << 61)
    s.catalog(Catalog(7, [EVENTS], 7))
    (out,) = s.request(ID, read_req(5, "events", 0, 1), now=0.0)
    assert corr_of(out) == 1 << 61
    assert s.answer(Done(1, 3)) == []  # an id of the front door before: nobody's


def test_a_transactions_write_naming_its_partition_is_checked_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a transaction's write lands is told by the partition it names: its batch is
    unpacked and checked once, when it is sent on, not also to see where it lands (the
    exactly-once Spark sink's writes paid twice on a member)."""
    s = member(tmp_path, 1)
    splits: list[tuple[Any, ...]] = []
    split = s.split

    def counted(*args: Any) -> Any:
        splits.append(args)
        return split(*args)

    monkeypatch.setattr(s, "split", counted)
    (out,) = s.request(ID, frame("txn_produce", 1, txn=7, seq=0, topic="events", partition=0,
                                 records=msgpack.packb([b"v"])), now=0.0)
    assert isinstance(out, Request) and len(splits) == 1
    (away,) = s.request(ID, frame("txn_produce", 2, txn=7, seq=1, topic="events", partition=1,
                                  records=msgpack.packb([b"v"])), now=0.0)
    assert answer_of(away)["code"] == ErrorCode.CROSS_NODE and len(splits) == 1


def test_a_stopping_member_answers_what_waits_for_a_copy_of_the_catalog(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests parked for a copy of the catalog are answered UNAVAILABLE when the front
    door stops (the copy's failure routed them again, into waits nobody answered), and
    those waiting for a copy are bounded (BUSY past the bound)."""
    from actors import front_cluster

    monkeypatch.setattr(front_cluster, "PARKED_MAX", 1)
    s = member(tmp_path, 2)
    (pull,) = s.request(ID, read_req(3, "late", 0, 1), now=0.0)
    assert isinstance(pull, ToPeer)
    assert s.request(ID, frame("cluster_sync", 4), now=0.0) == []
    (busy,) = s.request(ID, frame("cluster_sync", 5), now=0.0)
    assert answer_of(busy)["code"] == ErrorCode.BUSY
    outs = s.stop()
    assert sorted((answer_of(o)["id"], answer_of(o)["code"]) for o in outs) == [
        (3, ErrorCode.UNAVAILABLE), (4, ErrorCode.UNAVAILABLE)]
    assert not s.pending


def test_creations_answered_while_the_copies_wait_past_their_bound_are_answered_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A creation the catalog member made waits for this member's copy of the catalog
    before it is answered, but only up to the bound of those that wait (cluster_sync's):
    past it the answer goes at once, and the table does not grow."""
    from actors import front_cluster

    monkeypatch.setattr(front_cluster, "PARKED_MAX", 1)
    s = member(tmp_path, 3)
    (one,) = s.request(ID, frame("create_topic", 2, name="a", partitions=1), now=0.0)
    (two,) = s.request(ID, frame("create_topic", 3, name="b", partitions=1), now=0.0)
    (pull,) = s.peer_reply({"lsn": 12, "id": corr_of(one), "ok": True})
    assert isinstance(pull, ToPeer) and unpack(pull.frame)["op"] == "list_topics"
    (rep,) = s.peer_reply({"lsn": 13, "id": corr_of(two), "ok": True})
    assert answer_of(rep) == {"lsn": 13, "id": 3, "ok": True}
    assert len(cluster_of(s).after_pull) == 1
