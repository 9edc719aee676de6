"""``scripts/demo`` end to end, small: a node, Spark's write through the ``shardnode`` sink
and read back through its source, and the check that every row arrived once. Also the
check's verdicts on counts that are wrong, so that it can be seen to fail."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest
from pyspark.sql.streaming.query import StreamingQuery

from node.local import free_port
from scripts.demo import MARKER, Check, DataDirRefused, follow, prepare_data_dir

ROOT = Path(__file__).resolve().parent.parent
ROWS = 20_000
BATCH_ROWS = 10_000  # 2 micro-batches in each query
NODES = 2  # the fewest that make a cluster (partitions on more than one member, checked below)


@pytest.mark.timeout(90)  # 37 s on 2 cores kept busy by other jobs: mostly Spark starting
def test_demo_writes_every_row_and_reads_each_back_once(tmp_path: Path) -> None:
    """Run from another directory with a relative ``--data-dir``, as a user would: the data
    dir is in the directory it was run in (the script sets up .venv in the repository)."""
    proc = subprocess.run(
        [str(ROOT / "scripts" / "demo"), "--rows", str(ROWS), "--batch-rows", str(BATCH_ROWS),
         "--nodes", str(NODES), "--port", str(free_port(NODES)), "--data-dir", "demo"],
        cwd=tmp_path, capture_output=True, text=True, timeout=85,
        env={**os.environ, "COLUMNS": "200"})  # the summary's rows on one line each
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed:\n{out[-4000:]}\n{proc.stderr[-4000:]}"
    assert (tmp_path / "demo" / MARKER).is_file() and (tmp_path / "demo" / "cluster").is_dir()
    assert os.listdir(tmp_path) == ["demo"]  # nothing else written where it was run
    assert f"OK: each of the {ROWS:,} rows read back exactly once" in out, out
    owners = re.search(r"partitions on members \[([\d, ]+)\]", out.replace("\n", " "))
    assert owners is not None and len(set(owners.group(1).split(", "))) > 1, out  # a cluster
    for query in ("write → shardnode", "read ← shardnode"):
        line = next((ln for ln in out.splitlines() if query in ln), None)
        assert line is not None, f"no summary line for {query!r}:\n{out}"
        rows, per_s, batches, warm_per_s, seconds = re.findall(r"[\d,.]+", line)
        assert (rows, batches) == (f"{ROWS:,}", str(ROWS // BATCH_ROWS)), line
        assert float(per_s.replace(",", "")) > 0 and float(warm_per_s.replace(",", "")) > 0
        assert float(seconds) > 0, line


def test_the_demo_refuses_a_data_dir_it_did_not_make_and_leaves_it_be(tmp_path: Path) -> None:
    """A relative ``--data-dir`` is the one in the directory the demo is run in; holding a
    user's file, it is refused before anything starts (the demo's ports are held too: it
    checks the data dir first) and its files are left as they were."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "important.txt").write_text("keep me")
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        proc = subprocess.run(
            [str(ROOT / "scripts" / "demo"), "--nodes", "1", "--port", str(port),
             "--data-dir", "precious"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
            env={**os.environ, "COLUMNS": "500"})  # the message on one line
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert (f"--data-dir {precious} is not empty and the demo did not make it (there is no "
            f"{MARKER} in it): not wiping it") in proc.stdout, proc.stdout
    assert (precious / "important.txt").read_text() == "keep me"
    assert os.listdir(precious) == ["important.txt"]
    assert not (ROOT / "precious").exists()


def test_the_data_dir_is_made_taken_when_empty_and_wiped_only_when_the_demos(
        tmp_path: Path) -> None:
    new = tmp_path / "a" / "new"
    prepare_data_dir(new)  # made, with its parents, and marked
    assert os.listdir(new) == [MARKER]
    (new / "cluster").mkdir()
    (new / "cluster" / "node-1.log").write_text("a run's log")
    (new / "log4j2.properties").write_text("")
    prepare_data_dir(new)  # the demo's own: emptied, still marked
    assert os.listdir(new) == [MARKER]

    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_data_dir(empty)  # nothing to lose: taken, and marked
    assert os.listdir(empty) == [MARKER]

    theirs = tmp_path / "theirs"
    (theirs / "sub").mkdir(parents=True)
    (theirs / "sub" / "important.txt").write_text("keep me")
    with pytest.raises(DataDirRefused, match="not empty and the demo did not make it"):
        prepare_data_dir(theirs)
    assert (theirs / "sub" / "important.txt").read_text() == "keep me"
    assert os.listdir(theirs) == ["sub"]

    a_file = tmp_path / "file"
    a_file.write_text("keep me")
    with pytest.raises(DataDirRefused, match="is not a directory"):
        prepare_data_dir(a_file)
    assert a_file.read_text() == "keep me"


class EndedQuery:
    """A streaming query that has ended: all ``follow`` asks of one."""

    name = "write"

    def awaitTermination(self, timeout: float) -> bool:  # PySpark's name
        return True


def test_the_bar_shows_the_seconds_the_summary_counts(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """The bar's time runs from the step's start (before its query starts), as the
    summary's does: not from when the bar appeared, nor only until the rows were there."""
    seconds = follow(cast(StreamingQuery, EndedQuery()), "write", lambda: 10, 10,
                     t0=time.monotonic() - 5.0)  # the step began 5 s ago
    assert seconds >= 5.0
    bar = capsys.readouterr().out
    assert f"10/10 2 rows/s {seconds:.1f} s" in bar, bar


def test_check_passes_each_row_once() -> None:
    assert Check(count=10, distinct=10, low=0, high=9, bad=0).failures(10) == []


@pytest.mark.parametrize(("check", "says"), [
    (Check(count=9, distinct=9, low=0, high=9, bad=0), "9 rows read back, 10 written"),
    (Check(count=10, distinct=9, low=0, high=9, bad=0), "10 rows read back carry 9 distinct numbers"),
    (Check(count=10, distinct=10, low=1, high=10, bad=0), "row numbers 1..10, expected 0..9"),
    (Check(count=10, distinct=10, low=0, high=9, bad=2), "2 rows with a key, value or"),
    (Check(count=0, distinct=0, low=None, high=None, bad=0), "row numbers None..None"),
])
def test_check_fails_a_row_missing_twice_or_changed(check: Check, says: str) -> None:
    failures = check.failures(10)
    assert any(says in f for f in failures), failures


def test_the_scripts_say_so_when_java_is_missing(tmp_path: Path) -> None:
    """``scripts/_venv.sh`` with the spark extra, on a PATH without java and no JAVA_HOME:
    a clear message and exit 3, before anything starts. (A copy of the script, in a tree
    whose .venv is already installed, so nothing is installed here.)"""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "_venv.sh"
    script.write_text((ROOT / "scripts" / "_venv.sh").read_text())
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    (tmp_path / "pyproject.toml").write_bytes(pyproject)
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    (tmp_path / ".venv" / ".installed-test-spark").write_text(
        hashlib.sha1(pyproject).hexdigest() + "\n")
    tools = tmp_path / "bin"  # what the script needs, and no java
    tools.mkdir()
    for tool in ("dirname", "sha1sum", "cut", "cat"):
        found = shutil.which(tool)
        assert found is not None, tool
        (tools / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tools)
    bash = shutil.which("bash")
    assert bash is not None
    proc = subprocess.run([bash, "-c", f"source {script} test,spark; echo started"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "Spark needs Java 17 or newer" in proc.stderr
    assert "started" not in proc.stdout
    env["JAVA_HOME"] = "/opt/some-jdk"  # a JDK named by JAVA_HOME is taken as there
    proc = subprocess.run([bash, "-c", f"source {script} test,spark; echo $PYSPARK_PYTHON"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / ".venv" / "bin" / "python")
