"""The ``shardnode`` command as a user meets it: usage errors in argparse's format, data
printed as it is (never read as rich markup), limits that hold, whole ids, short waits for
a node that is not there, and the README's examples run as written.

Most tests call ``cli.main`` in this process (its output captured); those that could hang
without their fix, or need a terminal width, run ``python -m node`` with a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node import cli
from node.client import Record
from node.local import LocalNode, free_port, port_in_use
from wire.xid import Xid

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``shardnode ARGS`` in this process: its exit code, stdout and stderr."""
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def shell(node: LocalNode, *args: str, columns: int = 80,
          timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m node ARGS --port PORT`` with stdout a pipe ``columns`` wide."""
    return subprocess.run([sys.executable, "-m", "node", *args, "--port", str(node.port)],
                          capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                          env={**os.environ, "COLUMNS": str(columns)})


def option_help(command: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The help text of ``option`` in ``shardnode COMMAND --help``, joined on one line."""
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    start = re.search(rf"^  {re.escape(option)}\b", text, re.MULTILINE)
    assert start is not None, f"{option} is not in the help of {command}:\n{text}"
    block = [text[start.start():].splitlines()[0]]
    for line in text[start.start():].splitlines()[1:]:
        if not line.startswith(" " * 5):  # the next option, or the end
            break
        block.append(line)
    return " ".join(" ".join(block).split())


# ---- without a node ------------------------------------------------------------------


@pytest.mark.parametrize(("command", "option"), [
    (["topics"], "--host"), (["topics"], "--port"), (["topics"], "--timeout-ms"),
    (["create-topic"], "--partitions"), (["produce"], "--key"), (["produce"], "--tag"),
    (["consume"], "--from"), (["consume"], "--max-records"), (["consume"], "--poll-ms"),
    (["kv", "scan"], "--limit"),
])
def test_options_say_what_they_do_and_their_default(
        command: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = option_help(command, option, capsys)
    assert "default" in text and len(text.split()) > 5, text


def test_a_commands_own_timeout_is_the_default_its_help_shows(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert "(default 120000)" in option_help(["checkpoint"], "--timeout-ms", capsys)
    assert "(default 10000)" in option_help(["topics"], "--timeout-ms", capsys)


def test_every_command_says_what_it_does_and_every_argument_has_help(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``shardnode COMMAND --help`` opens with what the command does, and every argument,
    positional ones too (``topic``, ``name``, ``VALUE``), says what it is."""
    missing = []

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if command and not parser.description:
            missing.append(f"{command}: no description")
        for action in parser._actions:
            if not action.help and not isinstance(action, argparse._SubParsersAction):
                missing.append(f"{command} {action.metavar or action.dest}: no help")
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, f"{command} {name}".strip())

    walk(cli.build_parser(), "")
    assert missing == []
    with pytest.raises(SystemExit):
        cli.main(["start", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "run a node in the foreground: its actors start" in text, text


def test_the_timeout_help_says_how_many_attempts_are_made(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert "up to 6 attempts in all" in option_help(["topics"], "--timeout-ms", capsys)
    assert "sent once" in option_help(["status"], "--timeout-ms", capsys)


def test_max_records_is_documented_as_a_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert "stop after printing N records in all" in option_help(
        ["consume"], "--max-records", capsys)


def test_a_usage_error_prints_the_usage_and_error_as_argparse_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "delete", "events", "--offset", "0",
                         "--port", str(free_port()))  # refused before any node is asked
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("usage: shardnode delete ")
    assert lines[-1] == "shardnode delete: error: --offset needs --partition"


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_a_scan_limit_below_one_is_refused(limit: str, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    """It was accepted, and the scan printed nothing."""
    with pytest.raises(SystemExit) as done:
        cli.main(["kv", "scan", "ns", "--limit", limit, "--port", str(free_port())])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --limit: must be at least 1, not {limit}" in err, err


@pytest.mark.parametrize(("args", "named"), [
    (["get", "config", "user/1"], "key 'user/1'"),
    (["put", "config", "00", "v!"], "value 'v!'"),
    (["cas", "config", "00", "zz", "-"], "expected 'zz'"),
    (["cas", "config", "00", "-", "0"], "new '0'"),  # an odd number of digits
    (["scan", "config", "--prefix", "user/"], "--prefix 'user/'"),
    (["scan", "config", "--start-after", "x"], "--start-after 'x'"),
])
def test_hex_that_is_not_hex_is_a_usage_error(args: list[str], named: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run(capsys, "kv", *args, "--hex", "--port", str(free_port()))
    assert code == 2, err
    assert f"shardnode kv {args[0]}: error: {named} is not hex" in err, err
    assert "usage: shardnode kv" in err and "Traceback" not in err
    text = named.split(" ", 1)[1].strip("'")  # what was given, shown in hex: not an example
    assert f"('{text}' is {text.encode().hex()})" in " ".join(err.split()), err


def test_nothing_listening_is_said_at_once_with_a_hint(
        capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    t0 = time.monotonic()
    code, _out, err = run(capsys, "topics", "--port", str(port))  # --timeout-ms 10000
    waited_s = time.monotonic() - t0
    assert code == 1
    assert f"nothing is listening on 127.0.0.1:{port}" in err, err
    assert f"is a node running on tcp://127.0.0.1:{port}?" in err, err
    assert waited_s < 5, f"{waited_s:.1f} s: not at once (each retry waits 10 s)"


def test_a_host_whose_name_does_not_resolve_is_named_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    """It waited for every attempt (61 s with the default timeout), then blamed the node."""
    t0 = time.monotonic()
    code, _out, err = run(capsys, "topics", "--host", "nosuch.invalid", "--port", "7630",
                          "--timeout-ms", "2000")
    waited_s = time.monotonic() - t0
    assert code == 1
    assert err.startswith("shardnode topics: error: "), err
    assert "cannot find the host nosuch.invalid (" in err and "(--host)" in err, err
    assert "Traceback" not in err
    # Not each of 6 attempts of 2 s (a slow resolver may take seconds of its own).
    assert waited_s < 10, f"{waited_s:.1f} s: not at once"


def test_a_config_error_shows_the_names_in_brackets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[nodee]\nport = 7401\n")
    code, _out, err = run(capsys, "start", "--config", str(config),
                          "--data-dir", str(tmp_path / "data"))
    assert code == 2
    assert "unknown section [nodee]" in err and "'node'" in err, err


def test_start_on_a_port_in_use_says_so_before_starting_anything(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "node", "start", "--data-dir",
                              str(tmp_path / "data"), "--port", str(port)],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1, out.stderr
    assert f"port {port} is in use" in out.stderr, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert not (tmp_path / "data").exists()  # no actor started


def test_start_on_a_data_dir_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a data dir")
    out = subprocess.run([sys.executable, "-m", "node", "start", "--data-dir", str(a_file),
                          "--port", str(free_port())],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "COLUMNS": "500"})
    assert out.returncode == 2, out.stderr
    assert "usage: shardnode start" in out.stderr, out.stderr
    assert (f"shardnode start: error: the data dir {a_file} is not a directory"
            in out.stderr), out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert a_file.read_text() == "not a data dir"


def test_a_port_left_by_a_closed_listener_is_free() -> None:
    """The check binds as ZeroMQ does (SO_REUSEADDR): a port whose listener closed, with a
    connection of it in TIME_WAIT, does not stop a node from starting again."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        assert port_in_use("127.0.0.1", port)
        accepted.close()  # the server's side closes first: TIME_WAIT on the port
        client.close()
    assert not port_in_use("127.0.0.1", port)


# ---- with a node ---------------------------------------------------------------------


def test_keys_values_and_names_are_printed_as_written(
        node: LocalNode, capsys: pytest.CaptureFixture[str]) -> None:
    port = ["--port", str(node.port)]
    assert run(capsys, "kv", "put", "brk", "[k]", "[red]v", *port)[0] == 0
    code, out, _err = run(capsys, "kv", "scan", "brk", *port)
    assert code == 0 and "│ [k] │ [red]v │" in out, out
    code, out, err = run(capsys, "kv", "get", "brk", "[nokey]", *port)
    assert (code, out, err) == (3, "", "[nokey]: absent\n")
    # '-' is absent only where `cas` takes it; elsewhere a key or value like any other.
    assert run(capsys, "kv", "put", "brk", "-", "-", *port)[0] == 0
    assert run(capsys, "kv", "get", "brk", "-", *port)[:2] == (0, "-\n")
    code, _out, err = run(capsys, "produce", "[bold]missing[/bold]", "x", *port)
    assert code == 1
    assert "shardnode produce: error: " in err and "[bold]missing[/bold]" in err, err


def test_a_delete_of_a_record_that_is_not_there_says_so(
        node: LocalNode, capsys: pytest.CaptureFixture[str]) -> None:
    """It printed "deleted" for a key no record had, and for an offset deleted before."""
    port = ["--port", str(node.port)]
    assert run(capsys, "create-topic", "dl", "--partitions", "1", *port)[0] == 0
    assert run(capsys, "produce", "dl", "a", "b", "--key", "k", *port)[0] == 0
    code, out, _err = run(capsys, "delete", "dl", "--offset", "0", "--partition", "0", *port)
    assert code == 0 and out.startswith("deleted dl/0@0 (LSN "), out
    for where in ("0", "7"):  # deleted before, never written
        assert run(capsys, "delete", "dl", "--offset", where, "--partition", "0", *port) == (
            3, "", f"no record at dl/0@{where} (deleted, or not written): nothing deleted\n")
    assert run(capsys, "delete", "dl", "--key", "nokey", *port) == (
        3, "", "no record of dl with key nokey: nothing deleted\n")
    code, out, _err = run(capsys, "delete", "dl", "--key", "k", *port)
    assert code == 0 and out.startswith("deleted the latest record of dl with key k"), out
    assert run(capsys, "delete", "dl", "--key", "k", *port)[0] == 3  # none answers the key now


def test_empty_results_say_so(node: LocalNode, capsys: pytest.CaptureFixture[str]) -> None:
    port = ["--port", str(node.port)]
    assert run(capsys, "topics", *port) == (0, "no topics (shardnode create-topic NAME "
                                                "makes one)\n", "")
    assert run(capsys, "kv", "list", *port) == (0, "", "no namespaces (a namespace is made "
                                                       "by its first write)\n")
    assert run(capsys, "create-topic", "t", "--partitions", "2", *port)[0] == 0
    assert run(capsys, "consume", "t", "--partition", "1", "--from", "0", *port) == (
        0, "", "no records in t/1 from offset 0\n")


def test_consume_stops_after_max_records_in_all(
        node: LocalNode, capsys: pytest.CaptureFixture[str]) -> None:
    total = 2 * cli.READ_PAGE_RECORDS + 500  # more than one read's worth
    with node.client() as c:
        c.create_topic("many", partitions=2)
        for first in range(0, total, 1000):
            c.produce_batch("many", [Record(f"v{i}".encode())
                                     for i in range(first, min(total, first + 1000))],
                            partition=1)
    port = ["--port", str(node.port)]
    for limit in (2, cli.READ_PAGE_RECORDS + 7):
        code, out, _err = run(capsys, "consume", "many", "--partition", "1",
                              "--max-records", str(limit), *port)
        assert code == 0
        assert [ln.split()[0] for ln in out.splitlines()] == [str(o) for o in range(limit)]
    code, out, _err = run(capsys, "consume", "many", "--partition", "1", "--from", "10", *port)
    assert len(out.splitlines()) == total - 10  # no limit: every record from --from on
    code, _out, err = run(capsys, "consume", "many", "--max-records", "0", *port)
    assert code == 2 and "--max-records 0: give 1 or more" in err
    # --follow stops too once it has printed as many (a subprocess: it would wait forever).
    follow = shell(node, "consume", "many", "--partition", "1", "--from", str(total - 3),
                   "--follow", "--max-records", "2")
    assert follow.returncode == 0, follow.stderr
    assert [ln.split()[0] for ln in follow.stdout.splitlines()] == [str(total - 3),
                                                                    str(total - 2)]


def test_txn_list_prints_ids_whole_and_as_json(node: LocalNode) -> None:
    xid = Xid(1, b"an order id long enough to need more than 80 columns", b"branch-a")
    with node.client() as c:
        c.create_topic("out")
        branch = c.xa_start(xid)
        branch.produce("out", b"v")
        c.xa_end(xid)
        c.xa_prepare(xid)
        [txn] = c.txn_list()
    listed = shell(node, "txn", "list", columns=80)  # a pipe: rich's 80 columns
    assert listed.returncode == 0, listed.stderr
    assert str(xid) in listed.stdout and str(txn.txn) in listed.stdout, listed.stdout
    as_json = shell(node, "txn", "list", "--json")
    assert as_json.returncode == 0, as_json.stderr
    [row] = json.loads(as_json.stdout)
    assert row == {"txn": txn.txn, "xid": str(xid), "state": "prepared",
                   "age_ms": row["age_ms"], "records": 1, "bytes": txn.bytes,
                   "partitions": 1, "member": 0}
    committed = shell(node, "txn", "commit", row["xid"])  # pasted back as printed
    assert committed.returncode == 0, committed.stderr
    assert f"committed {xid}" in committed.stdout


def test_stats_prints_topic_names_whole_in_a_pipe(node: LocalNode) -> None:
    """A pipe's 80 columns cut the table, and the topic names in it."""
    topic = "orders-from-the-eu-west-warehouse-" + "x" * 40
    with node.client() as c:
        c.create_topic(topic)
    stats = shell(node, "stats", columns=80)
    assert stats.returncode == 0, stats.stderr
    assert topic in stats.stdout, stats.stdout


def test_offsets_are_titled_end_offsets_not_a_count_of_records(
        node: LocalNode, capsys: pytest.CaptureFixture[str]) -> None:
    """The title summed the end offsets as "N records": wrong once a record is deleted."""
    with node.client() as c:
        c.create_topic("od")
        c.produce_batch("od", [b"a", b"b", b"c"], partition=0)
        c.delete_by_offset("od", 0, 1)
    code, out, _err = run(capsys, "offsets", "od", "--port", str(node.port))
    assert code == 0
    assert out.splitlines()[0].strip() == "od: end offsets", out
    assert "records" not in out, out
    assert re.search(r"│\s+0 │\s+3 │", out), out


def readme_section(heading: str) -> str:
    text = README.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_the_readmes_shell_example_consumes_what_it_produced(node: LocalNode) -> None:
    """The README's create-topic, produce and consume lines, as written: the consume line's
    partition is the one the produce line's key goes to. With --max-records 2 the --follow
    stops once both records are printed (and would wait forever on another partition)."""
    lines = {}
    for line in readme_section("From a shell:").splitlines():
        if not line.startswith("    shardnode "):
            continue
        words = shlex.split(line.split("#")[0])
        if words[:2] in (["shardnode", "create-topic"], ["shardnode", "produce"],
                         ["shardnode", "consume"]) and words[1] not in lines:
            lines[words[1]] = words[1:]
    assert set(lines) == {"create-topic", "produce", "consume"}, lines
    assert "--follow" in lines["consume"]
    for command in ("create-topic", "produce"):
        done = shell(node, *lines[command])
        assert done.returncode == 0, done.stderr
    consumed = shell(node, *lines["consume"], "--max-records", "2", timeout_s=30)
    assert consumed.returncode == 0, consumed.stderr
    assert [ln.split()[-1] for ln in consumed.stdout.splitlines()] == ["hello", "world"]


def test_the_readmes_transaction_example_runs_on_a_new_node(node: LocalNode) -> None:
    block = re.search(r"```python\n(.*?)```", readme_section("## Transactions and XA"), re.S)
    assert block is not None
    exec(compile(block.group(1).replace("127.0.0.1:7400", f"127.0.0.1:{node.port}"),
                 "README.md", "exec"), {})
    with node.client() as c:
        assert c.committed_offset("billing", "in", 0) == c.end_offsets("in")[0] > 0
        assert c.xa_recover() == []


def test_offsets_of_a_group_no_commit_could_name_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    """It showed "-" for every partition, as for a group that committed nothing yet."""
    code, _out, err = run(capsys, "offsets", "events", "--group", "bad/name", "--port", "1")
    assert code == 1 and "group 'bad/name' is not valid" in err


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path: Path) -> None:
    """``shardnode ... | head``: the pipe closed under the command's output printed two
    tracebacks (the write, then the flush at exit)."""
    code = ("import os, sys\n"
            "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
            "from node.cli import main\n"
            f"sys.exit(main(['keygen', {str(tmp_path / 'keys')!r}]))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered stdout
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env=env)
    assert out.returncode == 141, out.stderr
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
