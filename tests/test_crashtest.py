"""scripts/crashtest runs 7 trials of random SIGKILLs under load, one on each target, and
every one passes; with --cluster, 5 trials on a cluster of two nodes."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from node.crashcheck import CheckFailed, Ledger, check
from wire.records import Record

ROOT = Path(__file__).resolve().parent.parent


def test_crashtest_kills_each_target_once_and_every_trial_passes(tmp_path: Path) -> None:
    # Seed 20261183 kills each of the six actors and the whole node once, in 7 trials (the
    # fewest that reach every target; 20 random trials only promised 4 of the 7), 6 of them
    # with a checkpoint asked for just before the kill. The long random runs are
    # scripts/crashtest's own (CRASHTEST.md), not the suite's.
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "crashtest.py"), "--trials", "7",
                          "--seed", "20261183", "--data-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert last == "7 passed, 0 failed", out.stdout[-3000:]
    killed = re.findall(r"killed (\S+) at a random moment", out.stdout)
    assert killed == ["log", "writer-0", "cache", "txn", "front", "node", "writer-1"], out.stdout


def test_crashtest_cluster_five_trials(tmp_path: Path) -> None:
    # Seed 20261206 kills each member whole once (member 1 holds the catalog) and actors
    # of both: writer-0 and log of member 2, cache of member 1.
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "crashtest.py"), "--cluster",
                          "--nodes", "2", "--trials", "5", "--seed", "20261206",
                          "--data-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert last == "5 passed, 0 failed", out.stdout[-3000:]
    killed = re.findall(r"killed (.+?) at a random moment", out.stdout)
    assert killed == ["writer-0 of node 2", "node 1 (every process)", "log of node 2",
                      "cache of node 1", "node 2 (every process)"], out.stdout
    assert ("killed whole members 2 (node 1: 1, node 2: 1), actors 3 (node 1: 1, node 2: 2; "
            "cache 1, log 1, writer-0 1)") in out.stdout


class FakeNode:
    """Serves ``read`` from lists, as the node would. ``check`` takes a ``NodeClient`` and
    reads through ``read`` only, so the calls below pass this fake on purpose (the
    ``type: ignore[arg-type]`` there)."""

    def __init__(self, partitions: dict[int, list[bytes]]) -> None:
        self.partitions = partitions

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[Record]:
        values = self.partitions.get(partition, [])[offset:offset + max_records]
        return [Record(v, offset=offset + i) for i, v in enumerate(values)]


def ledger(acked: dict[bytes, tuple[int, int]], extra_sent: Iterable[bytes] = ()) -> Ledger:
    return Ledger(sent=set(acked) | set(extra_sent), acked=dict(acked))


@pytest.mark.parametrize("stored, why", [
    ({0: [b"a"], 1: []}, "found at None"),                   # an acknowledged record is lost
    ({0: [b"a", b"b", b"a"], 1: []}, "stored twice"),        # duplicated
    ({0: [b"b", b"a"], 1: []}, "found at (0, 1)"),           # at another offset
    ({0: [b"a", b"b", b"zz"], 1: []}, "never sent"),         # appeared from nowhere
])
def test_check_catches_every_kind_of_damage(stored: dict[int, list[bytes]], why: str) -> None:
    led = ledger({b"a": (0, 0), b"b": (0, 1)})
    with pytest.raises(CheckFailed, match=re.escape(why)):
        check(FakeNode(stored), "t", 2, [led])  # type: ignore[arg-type]


def test_check_accepts_unacknowledged_but_sent_records() -> None:
    led = ledger({b"a": (0, 0)}, extra_sent={b"maybe"})
    assert check(FakeNode({0: [b"a", b"maybe"], 1: []}), "t", 2, [led]) == 1  # type: ignore[arg-type]
