"""Retention by age and by size, and alter-topic, on a real node: enforced in the background
by the shard writers, reads below the earliest kept offset answered OFFSET_OUT_OF_RANGE."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from node.client import NodeClient, Record
from wire.errors import BadRequest, NodeError, OffsetOutOfRange, UnknownTopic

ROOT = Path(__file__).resolve().parent.parent

if TYPE_CHECKING:
    from node.local import LocalNode
    from tests.conftest import MakeNode


def earliest(c: NodeClient, topic: str, partition: int = 0) -> int:
    """The earliest offset the partition keeps (0 if nothing was deleted)."""
    try:
        c.read(topic, partition, 0, 1)
    except OffsetOutOfRange as exc:
        return exc.earliest
    return 0


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)  # ok-sleep: polling for the background pass, under a deadline


def test_consume_starts_from_the_oldest_record_kept(make_node: MakeNode) -> None:
    """``shardnode consume`` began at offset 0 by default, refused (OFFSET_OUT_OF_RANGE)
    once retention had deleted the oldest records."""
    n = make_node()
    with n.client() as c:
        c.create_topic("kept", retention_bytes=1_000)
        c.produce_batch("kept", [b"x" * 100] * 30, partition=0)
        wait_for("retention by size", lambda: earliest(c, "kept") == 20)
    out = subprocess.run([sys.executable, "-m", "node", "consume", "kept", "--port",
                          str(n.port)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert [ln.split()[0] for ln in out.stdout.splitlines()] == [str(o) for o in range(20, 30)]
    given = subprocess.run([sys.executable, "-m", "node", "consume", "kept", "--from", "3",
                            "--port", str(n.port)], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
    assert given.returncode == 1 and "earliest: 20" in given.stderr  # asked for: told


def test_retention_by_size_and_by_age_and_altered(make_node: MakeNode) -> None:
    n = make_node()
    with n.client() as c:
        c.create_topic("sized", retention_bytes=10_000)
        c.produce_batch("sized", [b"x" * 100] * 300, partition=0)  # 30 000 bytes
        # The writer deletes the oldest in the background, down to 10 000 bytes: 100 records.
        wait_for("retention by size", lambda: earliest(c, "sized") == 200)
        with pytest.raises(OffsetOutOfRange) as info:
            c.read("sized", 0, 5)
        assert info.value.earliest == 200
        kept = c.read("sized", 0, 200, 1000)
        assert [r.offset for r in kept] == list(range(200, 300))  # offsets unchanged
        assert c.end_offsets("sized") == [300]
        with pytest.raises(OffsetOutOfRange):
            c.read_by_tag("sized", 0, "none", offset=3)  # an offset said: below what is kept
        # By default from the oldest kept (it raised OffsetOutOfRange for offset 0).
        c.produce("sized", b"t", tags=["mark"], partition=0)
        assert [r.offset for r in c.read_by_tag("sized", 0, "mark")] == [300]

        now = int(time.time() * 1000)
        c.create_topic("aged")
        c.produce_batch("aged", [Record(b"old", timestamp=now - 3_600_000)] * 5
                        + [Record(b"new", timestamp=now)] * 5, partition=0)
        assert earliest(c, "aged") == 0  # no retention yet
        c.alter_topic("aged", retention_ms=60_000)
        assert [t.retention_ms for t in c.list_topics() if t.name == "aged"] == [60_000]
        wait_for("retention by age", lambda: earliest(c, "aged") == 5)
        assert [r.value for r in c.read("aged", 0, 5)] == [b"new"] * 5
        c.alter_topic("aged", retention_ms=0)  # off again: what is left stays
        c.produce("aged", b"after", partition=0)
        with pytest.raises(BadRequest):
            c.alter_topic("aged", retention_ms=-1)
        with pytest.raises(UnknownTopic):
            c.alter_topic("none-such", retention_ms=1)
        c.create_topic("fast", storage="memory")
        with pytest.raises(NodeError, match="memory topic has no retention"):
            c.alter_topic("fast", retention_ms=1)
    n.kill()  # the settings survive a SIGKILL; what retention deleted since the last flush
    n.start()  # comes back, and is deleted again
    with n.client() as c:
        wait_for("retention after a SIGKILL", lambda: earliest(c, "sized") >= 200)
        assert [t.retention_bytes for t in c.list_topics() if t.name == "sized"] == [10_000]
        assert len(c.read("aged", 0, 5, 1000)) == 6
        c.produce_batch("sized", [b"y" * 100] * 100, partition=0)
        wait_for("retention after a restart", lambda: earliest(c, "sized") >= 300)


def test_the_cli_alters_a_topic(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("cli-ret")
    out = subprocess.run([sys.executable, "-m", "node", "alter-topic", "cli-ret",
                          "--retention-bytes", "5000", "--port", str(node.port)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    topics = subprocess.run([sys.executable, "-m", "node", "topics", "--port", str(node.port)],
                            capture_output=True, text=True, timeout=60).stdout
    assert "5000 bytes" in topics
