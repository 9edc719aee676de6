"""Typed dispatch: an actor answers a message it does not handle and goes on (it used to
raise in the log manager, and the restart took every actor after it down too); a burst of
write requests is admitted in the order its requests came."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import msgpack
import pytest
import zmq

from actors.base import ActorContext, mailbox_address
from actors.cache_manager import CacheManager
from actors.roles import (
    CACHE_MANAGER,
    FRONT_DOOR,
    LOG_MANAGER,
    TRANSACTION_MANAGER,
    writer_role,
)
from config import load_config
from node.local import LocalNode
from node.supervisor import run_dir_for
from wire import codec
from wire.errors import ErrorCode
from wire.messages import ErrorReply, Stats, StatusRequest
from wire.protocol import unpack_replies

if TYPE_CHECKING:
    from tests.conftest import MakeNode

WAIT_S = 20.0


@pytest.fixture
def front_mailbox(tmp_path: Path) -> Iterator[tuple[Path, zmq.Socket[bytes]]]:
    """A run directory with the front door's mailbox bound in it, by the test."""
    run_dir = run_dir_for(tmp_path / "data")
    run_dir.mkdir(parents=True, exist_ok=True)
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(mailbox_address(run_dir, FRONT_DOOR))
    yield run_dir, sock
    sock.close(0)


def test_an_actor_answers_a_request_it_does_not_handle_with_an_error_naming_it(
        front_mailbox: tuple[Path, zmq.Socket[bytes]]) -> None:
    run_dir, front = front_mailbox
    cache = CacheManager(ActorContext(CACHE_MANAGER, load_config().to_dict(), str(run_dir), 0))
    try:
        cache.handle_frame(codec.encode(StatusRequest(77)))  # the supervisor's, not its own
        cache.handle_frame(codec.encode(Stats("someone", 1, {})))  # no corr: nobody to answer
        assert front.poll(5000, zmq.POLLIN), "no answer reached the front door"
        reply = codec.decode(front.recv())
        assert reply == ErrorReply(77, ErrorCode.INTERNAL,
                                   "actor 'cache' does not handle StatusRequest")
        assert not front.poll(100, zmq.POLLIN), "a message without a corr was answered"
        assert cache.unexpected_messages == 2
    finally:
        cache.close()


def _status(node: LocalNode) -> dict[str, Any]:
    with node.client() as c:
        return c.status()


def _figures(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["role"]: a["figures"] for a in status["actors"]}


def test_unexpected_messages_do_not_restart_an_actor_and_the_node_keeps_serving(
        make_node: MakeNode) -> None:
    node: LocalNode = make_node('[log]\ncheckpoint_mode = "blocking"\n')  # every actor in play
    with node.client() as c:
        c.create_topic("t")
        c.produce("t", b"before")
    roles = [LOG_MANAGER, TRANSACTION_MANAGER, CACHE_MANAGER, FRONT_DOOR, writer_role(0)]
    pids = {a["role"]: a["pid"] for a in _status(node)["actors"]}
    run_dir = run_dir_for(node.data_dir)
    for role in roles:
        push: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, int(WAIT_S * 1000))  # close waits until they are sent
        push.setsockopt(zmq.SNDTIMEO, int(WAIT_S * 1000))
        push.connect(mailbox_address(run_dir, role))
        # One that carries a correlation id (answered with an error), one that does not.
        push.send(codec.encode(StatusRequest(10**9)))
        push.send(codec.encode(Stats("test", 0, {})))
        push.close()
    deadline = time.monotonic() + WAIT_S
    while True:  # each actor reports its figures about once a second
        status = _status(node)
        seen = {role: _figures(status)[role].get("unexpected_messages") for role in roles}
        if all(n == 2 for n in seen.values()):
            break
        assert time.monotonic() < deadline, f"unexpected messages counted: {seen}"
        time.sleep(0.1)  # ok-sleep: the poll interval of a loop with a deadline
    assert [(a["role"], a["restarts"]) for a in status["actors"] if a["restarts"]] == []
    assert {a["role"]: a["pid"] for a in status["actors"]} == pids
    log_text = node.log_file.read_text(errors="replace")
    for role in roles:
        assert f"actor '{role}' does not handle StatusRequest" in log_text, role
    with node.client() as c:
        assert c.produce("t", b"after") == (0, 1)
        assert [r.value for r in c.read("t", 0, 0)] == [b"before", b"after"]


def _ask_frame(node: LocalNode, requests: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Send ``requests`` in one frame (one burst at the front door); their replies by id."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(node.endpoint)
    try:
        sock.send(b"".join(msgpack.packb(r, use_bin_type=True) for r in requests))
        got: dict[int, dict[str, Any]] = {}
        while len(got) < len(requests):
            assert sock.poll(int(WAIT_S * 1000), zmq.POLLIN), f"replies so far: {got}"
            got.update((r["id"], r) for r in unpack_replies(sock.recv()))
        return got
    finally:
        sock.close(0)


@pytest.mark.parametrize("mode", ["fuzzy", "blocking"])
def test_writes_of_one_burst_are_admitted_in_the_order_they_came(make_node: MakeNode,
                                                                 mode: str) -> None:
    """Produce requests and other writes travel apart in a burst (``Writes``); the log
    manager still admits them in request order, with or without the transaction manager."""
    node: LocalNode = make_node(f'[log]\ncheckpoint_mode = "{mode}"\n')
    with node.client() as c:
        c.create_topic("t")
        c.create_topic("gone")

    def produce(rid: int, topic: str, n: int) -> dict[str, Any]:
        return {"op": "produce", "id": rid, "topic": topic, "partition": 0, "producer_id": 5,
                "seq": rid, "records": msgpack.packb([b"v"] * n)}

    def commit(rid: int, offset: int) -> dict[str, Any]:
        return {"op": "commit_offset", "id": rid, "group": "g", "topic": "t", "partition": 0,
                "offset": offset}

    got = _ask_frame(node, [
        commit(1, 1),  # before any record: past the end
        produce(2, "t", 2),
        commit(3, 2),  # after two: the end, accepted
        produce(4, "gone", 1),
        {"op": "delete_topic", "id": 5, "name": "gone"},
        produce(6, "gone", 1),  # the front door still knew it; the log manager does not
        commit(7, 3),  # past the end again
        produce(8, "t", 1),
    ])
    assert {rid: r["ok"] for rid, r in got.items()} == {
        1: False, 2: True, 3: True, 4: True, 5: True, 6: False, 7: False, 8: True}
    assert got[6]["code"] == ErrorCode.UNKNOWN_TOPIC
    assert got[2]["parts"] == [[0, 0, 2]] and got[8]["parts"] == [[0, 2, 1]]
    with node.client() as c:
        assert c.committed_offset("g", "t", 0) == 2


class _Frames:
    """A client socket as the front door's burst reads it: frames ready, one at a time."""

    def __init__(self, frames: list[list[bytes]]) -> None:
        self.frames = frames
        self.read = 0

    def getsockopt(self, option: int) -> int:
        return zmq.POLLIN if self.read < len(self.frames) else 0

    def recv_multipart(self, flags: int, copy: bool) -> list[zmq.Frame]:
        self.read += 1
        return [zmq.Frame(f) for f in self.frames[self.read - 1]]


def test_a_burst_of_client_requests_ends_once_it_holds_a_group_commits_bytes() -> None:
    """What a burst reads waits in the front door until the burst ends: it ends at
    ``log.group_bytes_max`` bytes (and the frame that passes them), not only at
    ``CLIENT_BURST_MAX`` requests (60 produces of 12 MiB once held 1.1 GB there). Each
    request read reports to the supervisor if a tick passed (a burst may be slow)."""
    from actors.front_door import FrontDoor

    frame = b"x" * (1 << 20)
    router = _Frames([[b"client", frame]] * 40)
    door = FrontDoor.__new__(FrontDoor)  # the burst alone: no sockets, no actors
    door.router = router  # type: ignore[assignment]
    door.member_keys = None  # CURVE off: no routing id to check
    door.cfg = load_config(overrides={"log": {"group_bytes_max": 10 << 20},
                                      "limits": {"frame_bytes_max": 2 << 20,
                                                 "value_bytes_max": 1 << 20}})
    handled: list[int] = []

    def request(who: bytes, parts: list[bytes], now: float, refused: str) -> list[Any]:
        handled.append(len(parts[0]))
        return []

    door.state = SimpleNamespace(requests=0, request=request)  # type: ignore[assignment]
    door.perform = lambda outs: None  # type: ignore[method-assign]
    door.flush_outbox = door.flush_replies = lambda: None  # type: ignore[method-assign]
    alive: list[int] = []
    door.keep_alive = lambda: alive.append(1)  # type: ignore[method-assign]
    door.on_socket(router)  # type: ignore[arg-type]
    assert len(handled) == 10 and router.read == 10
    assert len(alive) == 10
    door.on_socket(router)  # type: ignore[arg-type]
    assert router.read == 20  # the next burst goes on where it stopped
