"""Fixtures: a whole node on ``tmp_path`` with real processes, sockets and RocksDB.

Every node a test starts is stopped at teardown, and the stop fails the test if any of
the node's processes is left behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
import zmq

from node.local import LocalNode
from wire.protocol import unpack_replies


class MakeNode(Protocol):
    """The type of the ``make_node`` fixture (tests import it under ``TYPE_CHECKING``)."""

    def __call__(self, config_text: str | None = None, data_dir: Path | None = None,
                 env: dict[str, str] | None = None, **node_kw: Any) -> LocalNode: ...


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[MakeNode]:
    """A factory: ``make_node(config_text=None)`` starts a node on ``tmp_path/data``;
    other keywords go to ``LocalNode`` (a CURVE node's client keys)."""
    started: list[LocalNode] = []

    def make(config_text: str | None = None, data_dir: Path | None = None,
             env: dict[str, str] | None = None, **node_kw: Any) -> LocalNode:
        cfg = None
        if config_text is not None:
            cfg = tmp_path / f"node-{len(started)}.toml"
            cfg.write_text(config_text)
        n = LocalNode(data_dir or tmp_path / "data", config=cfg,
                      log_file=tmp_path / f"node-{len(started)}.log", env=env, **node_kw)
        n.start()
        started.append(n)
        return n

    yield make
    errors = []
    for n in started:
        if n.proc is not None:
            try:
                n.stop()
            except Exception as exc:  # report every node's failure, not just the first
                errors.append(str(exc))
    assert not errors, errors


@pytest.fixture
def node(make_node: MakeNode) -> LocalNode:
    return make_node()


@contextlib.contextmanager
def module_node(tmp_path_factory: pytest.TempPathFactory, name: str,
                config_text: str | None = None) -> Iterator[LocalNode]:
    """A node one test module shares (a module-scoped fixture yields from it): started on a
    fresh directory with ``config_text`` as its config, stopped when the module is done."""
    base = tmp_path_factory.mktemp(name)
    cfg = None
    if config_text is not None:
        cfg = base / "node.toml"
        cfg.write_text(config_text)
    n = LocalNode(base / "data", config=cfg, log_file=base / "node.log").start()
    try:
        yield n
    finally:
        n.stop()


def silent_router() -> tuple[zmq.Socket[bytes], str]:
    """A ROUTER on a random port that stands in for a node: it takes requests (the ZeroMQ
    handshake succeeds) and answers what the test has it answer."""
    router: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    return router, f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"


def request_of(router: zmq.Socket[bytes]) -> tuple[bytes, dict[str, Any]]:
    """The next request ``router`` takes (within 10 s), and who sent it."""
    assert router.poll(10_000, zmq.POLLIN), "the pipeline's request never came"
    peer, frame = router.recv_multipart()
    (request,) = unpack_replies(frame)  # requests frame as replies do
    return peer, request
