"""Deleting records by key and by offset, on a real node: gone from every read and index,
offsets of the others unchanged, across a restart and a SIGKILL."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from node.client import Record
from wire.errors import BadRequest, NodeError, UnknownPartition

if TYPE_CHECKING:
    from node.local import LocalNode
    from tests.conftest import MakeNode


def values(node: LocalNode, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    with node.client() as c:
        return [(r.offset or 0, r.value) for r in c.read(topic, partition, 0, 1000)]


def test_deleted_records_are_gone_from_every_read_and_index(make_node: MakeNode) -> None:
    n = make_node()
    with n.client() as c:
        c.create_topic("t")
        c.produce_batch("t", [Record(b"v%d" % i, key=b"k%d" % (i % 3), tags=("red",),
                                     timestamp=1000 + i) for i in range(9)], partition=0)
        assert [v for _o, v in values(n, "t")][:3] == [b"v0", b"v1", b"v2"]  # cached now
        assert c.read_by_key("t", b"k2", partition=0).value == b"v8"  # type: ignore[union-attr]
        c.delete_by_offset("t", 0, 4)
        c.delete_by_key("t", b"k2", partition=0)  # the latest with k2: offset 8
        left = values(n, "t")
        assert [o for o, _v in left] == [0, 1, 2, 3, 5, 6, 7]  # the others keep their offsets
        assert c.read_by_key("t", b"k2", partition=0) is None  # its latest is gone
        assert c.read_by_key("t", b"k1", partition=0).value == b"v7"  # type: ignore[union-attr]
        assert [r.offset for r in c.read_by_tag("t", 0, "red")] == [0, 1, 2, 3, 5, 6, 7]
        assert c.read("t", 0, 4, 1)[0].offset == 5  # a read from a deleted offset goes on
        c.delete_by_offset("t", 0, 4)  # again: nothing left to delete, the same answer
        c.delete_by_key("t", b"k2", partition=0)
        with pytest.raises(BadRequest, match="never"):
            c.delete_by_offset("t", 0, 99)
        with pytest.raises(UnknownPartition):
            c.delete_by_offset("t", 3, 0)
        c.create_topic("m", storage="memory")
        with pytest.raises(NodeError, match="memory topic"):
            c.delete_by_offset("m", 0, 0)
        c.produce("t", b"after", partition=0)
    n.kill()  # the deletions are in the log, not yet in a checkpoint
    n.start()
    assert [o for o, _v in values(n, "t")] == [0, 1, 2, 3, 5, 6, 7, 9]
    with n.client() as c:
        assert c.read_by_key("t", b"k2", partition=0) is None
        c.checkpoint()
    n.stop()
    n.start()
    assert [o for o, _v in values(n, "t")] == [0, 1, 2, 3, 5, 6, 7, 9]


def test_a_cached_read_by_key_is_dropped_by_a_delete(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("rbk")
        c.produce("rbk", b"old", key=b"k", partition=0)
        c.produce("rbk", b"new", key=b"k", partition=0)
        for _ in range(3):  # from the writer, then from the front door's cache
            assert c.read_by_key("rbk", b"k", partition=0).value == b"new"  # type: ignore[union-attr]
        c.delete_by_key("rbk", b"k", partition=0)
        assert c.read_by_key("rbk", b"k", partition=0) is None


def test_the_cli_deletes(node: LocalNode) -> None:
    with node.client() as c:
        c.create_topic("cli-del")
        c.produce_batch("cli-del", [b"a", b"b"], partition=0)
    out = subprocess.run([sys.executable, "-m", "node", "delete", "cli-del", "--offset", "0",
                          "--partition", "0", "--port", str(node.port)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "deleted cli-del/0@0" in out.stdout
    assert [o for o, _v in values(node, "cli-del")] == [1]
