"""The bench's peers: which run by default and which only when named, and a missing one is
skipped with its reason, never installed when --no-install says so."""

from __future__ import annotations

import pytest

from scripts.benchmark.__main__ import parse_args
from scripts.benchmark.peers import NAMES, SERVER_PEERS
from scripts.benchmark.peers.base import Unavailable, find_or_install


def test_rabbitmq_runs_only_when_named() -> None:
    assert set(NAMES) == {"redis", "rabbitmq", "floor", "disk"}
    assert parse_args([])[0].peers == {"redis", "floor", "disk"}
    assert parse_args(["--quick"])[0].peers == {"redis", "floor", "disk"}
    assert parse_args(["--quick", "--peers", "rabbitmq"])[0].peers == {"rabbitmq"}
    assert parse_args(["--peers", "redis,rabbitmq"])[0].peers == {"redis", "rabbitmq"}
    assert parse_args(["--peers", "none"])[0].peers == frozenset()


def test_an_unknown_peer_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--peers", "redis,kafka"])


def test_a_missing_program_is_unavailable_with_its_reason_when_install_is_off() -> None:
    def nowhere() -> str | None:
        return None

    with pytest.raises(Unavailable, match=r"no-such-server is not installed \(and --no-install\)"):
        find_or_install("no-such-server", "no-such-package", nowhere, install=False)


def test_server_peers_name_their_program() -> None:
    assert {p.system: p.program for p in SERVER_PEERS.values()} == {
        "redis": "redis-server", "rabbitmq": "rabbitmq-server"}
