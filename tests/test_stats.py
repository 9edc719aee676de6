"""``stats`` and ``compact`` on a real node: RocksDB's figures of each shard, from the shard
writers that own them, and a topic's shards compacted; the CLI's table and JSON."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from node import cli
from node.client import Record
from wire.errors import UnknownTopic
from wire.protocol import SHARD_STATS_ROW, WRITER_STATS_ROW

if TYPE_CHECKING:
    from tests.conftest import MakeNode


def test_stats_and_compact_answer_for_every_shard_of_the_node(
        make_node: MakeNode, capsys: pytest.CaptureFixture[str]) -> None:
    node = make_node()
    with node.client(timeout_ms=60_000) as c:
        c.create_topic("t", partitions=4)
        c.create_topic("other", partitions=1)
        for round_ in range(3):  # three flushes: three SST files in level 0 of `records`
            c.produce_batch("t", [Record(f"v{round_}-{i}".encode() * 20, key=f"k{i}".encode())
                                  for i in range(400)])
            c.checkpoint()
        st = c.stats()
        shards = {(r["topic"], r["partition"]): r for r in st["shards"]}
        assert sorted(shards) == [("other", 0), ("t", 0), ("t", 1), ("t", 2), ("t", 3)]
        assert all(set(r) == set(SHARD_STATS_ROW) for r in st["shards"])
        assert {r["writer"] for r in st["shards"]} <= {0, 1}
        for p in range(4):
            row = shards[("t", p)]
            assert row["sst_bytes"] > 0 and row["files_per_level"][0] >= 3
            assert len(row["files_per_level"]) == 7 and row["records"] > 0
        assert [w["writer"] for w in st["writers"]] == [0, 1]
        assert all(set(w) == set(WRITER_STATS_ROW) for w in st["writers"])
        assert sum(w["shards"] for w in st["writers"]) == 5

        compacted = c.compact("t")
        assert [(t, p) for t, p, _b, _a in compacted] == [("t", p) for p in range(4)]
        assert all(before > 0 and after > 0 for _t, _p, before, after in compacted)
        after = {(r["topic"], r["partition"]): r for r in c.stats()["shards"]}
        for p in range(4):  # everything of the topic's shards now in one level below 0
            assert after[("t", p)]["files_per_level"][0] == 0
            assert after[("t", p)]["records"] == shards[("t", p)]["records"]
        assert [r.value for r in c.read("t", 0, 0, max_records=1)]  # still readable
        with pytest.raises(UnknownTopic):
            c.compact("nope")

    port = ["--port", str(node.port)]
    assert cli.main(["stats", *port, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert len(printed["shards"]) == 5 and len(printed["writers"]) == 2
    assert cli.main(["stats", *port]) == 0
    table = capsys.readouterr().out
    assert "block cache" in table and "hit rate" in table and "other" in table
    assert cli.main(["compact", "other", *port]) == 0
    assert "compacted 1 shard(s) of other on this node" in capsys.readouterr().out
