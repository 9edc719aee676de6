"""How messages travel to a mailbox (``actors.base.send_frame`` / ``receive_frame``): a
large frame after an empty marker part, received as a view of ZeroMQ's buffer without a
copy; a small one as bytes; in the order they were sent, over a real ipc socket."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from actors.base import BULK_FRAME_BYTES_MIN, receive_frame, send_frame, waiting_messages
from wire import codec
from wire.messages import LogGroup, Stats

WAIT_MS = 5000


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"ipc://{tmp_path}/mailbox.sock")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"ipc://{tmp_path}/mailbox.sock")
    yield push, pull
    push.close(0)
    pull.close(0)
    ctx.term()


def _next(pull: zmq.Socket[bytes]) -> bytes | memoryview:
    assert pull.poll(WAIT_MS), "nothing arrived"
    return receive_frame(pull, zmq.NOBLOCK)


def test_large_frames_arrive_as_views_and_small_ones_as_bytes_in_order(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    push, pull = pair
    large = os.urandom(BULK_FRAME_BYTES_MIN)
    frames: list[bytes | memoryview] = [
        b"small", large, memoryview(os.urandom(3 * BULK_FRAME_BYTES_MIN)),
              b"x" * (BULK_FRAME_BYTES_MIN - 1), large]
    for frame in frames:
        send_frame(push, frame)
    got = [_next(pull) for _ in frames]
    assert [bytes(g) for g in got] == [bytes(f) for f in frames]
    assert [type(g) for g in got] == [bytes, memoryview, memoryview, bytes, memoryview]
    assert not pull.poll(0)  # no marker part left behind


def test_an_empty_frame_alone_is_received_as_it_is(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    """Not a marker (no part follows): handed on as it came, for the decoder to refuse,
    and the next message is read whole."""
    push, pull = pair
    push.send(b"")
    send_frame(push, b"after")
    assert _next(pull) == b""
    assert _next(pull) == b"after"


def test_waiting_messages_decodes_large_messages_sent_in_two_parts(
        pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    push, pull = pair
    group = LogGroup(1, 9, os.urandom(2 * BULK_FRAME_BYTES_MIN))
    send_frame(push, codec.encode(group))
    send_frame(push, codec.encode(Stats("test", 1, {})))
    assert pull.poll(WAIT_MS)
    msgs: list[codec.Message] = []
    for _ in range(50):  # the second may still be on its way: a bounded wait for each
        msgs.extend(waiting_messages(pull, 10))
        if len(msgs) == 2 or not pull.poll(WAIT_MS):
            break
    assert msgs == [group, Stats("test", 1, {})]
