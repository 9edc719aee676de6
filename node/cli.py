"""The ``shardnode`` command: run a node, look at it, and use it from a shell.

    shardnode start [--config FILE] [--data-dir DIR] [--port N] [--cluster FILE --node-id N]
                    [--from-snapshot DIR]
    shardnode status [--port N]
    shardnode checkpoint [--port N]
    shardnode stats [--json]           (RocksDB's figures of each shard on this node)
    shardnode compact TOPIC            (compact the topic's shards on this node)
    shardnode snapshot export DIR      (a point-in-time copy of this node, taken while it serves)
    shardnode start --data-dir NEW --from-snapshot DIR   (a new node from that copy)
    shardnode create-topic NAME [--partitions N] [--storage rocksdb|memory] [--retention-ms N]
                               [--retention-bytes N]
    shardnode alter-topic NAME [--retention-ms N] [--retention-bytes N]
    shardnode topics
    shardnode delete-topic NAME
    shardnode produce TOPIC VALUE... [--key K] [--partition P]
    shardnode consume TOPIC [--partition P] [--from OFFSET] [--max-records N] [--follow]
    shardnode offsets TOPIC [--group G]...   (end offsets; each group's offset and lag)
    shardnode txn list [--json]
    shardnode txn commit XID          (a prepared XA branch, as `txn list` prints its xid)
    shardnode txn rollback XID|ID     (a branch, or a local transaction by its id)
    shardnode keygen DIR [--name NAME]   (a CURVE key pair: DIR/NAME.key, DIR/NAME.pub)

The commands that talk to a node take ``--server-key FILE --client-key FILE`` when the
node has CURVE on: its public key file, and this client's secret key file.

Exit codes: 0 done, 1 the node refused or did not answer (or could not start), 2 usage (the
command's usage line, then ``shardnode COMMAND: error: ...``, as argparse prints its own),
3 ``kv get``: absent, 4 ``kv cas``: not swapped. What the node or the user wrote is printed
as it is, never read as rich markup.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from config import ConfigError, load_config
from wire.errors import NodeError, OffsetOutOfRange, Unavailable
from wire.protocol import COMPACT_TIMEOUT_MS, DEFAULT_PORT

if TYPE_CHECKING:
    from node.client import NodeClient

# How long `snapshot export` waits by default: the node's own bound
# (log.snapshot_timeout_ms, 10 minutes by default) and a little more.
SNAPSHOT_CLIENT_TIMEOUT_MS = 620_000
# `consume` asks for this many records a read (the node caps a read at read_records_max).
READ_PAGE_RECORDS = 1000
# How long the CLI waits for a TCP connection to the node's port, to tell "nothing listens
# there" at once rather than after every retry of a request (the client's timeout otherwise).
PROBE_TIMEOUT_S_MAX = 5.0
TABLE_WIDTH_MAX = 10_000  # a table's natural width is measured within this
# A request that is safe to repeat (wire.protocol.OPS) is sent again this many times after
# a timeout, as NodeClient does by default; the commands whose requests take long (status,
# checkpoint, stats, compact, snapshot export) send theirs once.
CLIENT_RETRIES = 5

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # errors stay one line in logs


def _endpoint(args: argparse.Namespace) -> str:
    return f"tcp://{args.host}:{args.port}"


class CommandError(Exception):
    """A command that cannot run as given; the message says why (a usage error, exit 2)."""


def _cells(*texts: str) -> list[Text]:
    """Table cells shown as they are: a key ``[k]`` stays ``[k]``, never rich markup."""
    return [Text(text) for text in texts]


def _note(message: str) -> None:
    """A line for the person at the terminal, on stderr (stdout stays data), as it is."""
    err_console.print(message, markup=False, highlight=False)


def _error(prog: str, message: str) -> None:
    """``PROG: error: MESSAGE`` on stderr, as argparse prints its own errors."""
    err_console.print(f"[red]{escape(prog)}: error:[/red] {escape(message)}", highlight=False)


def _print_whole(table: Table) -> None:
    """Print ``table`` with no cell cut or wrapped, wider than the terminal (or a pipe's 80
    columns) if it must be: its cells are values to paste into another command."""
    options = console.options.update_width(TABLE_WIDTH_MAX)
    width = Measurement.get(console, options, table).maximum
    (console if width <= console.width else Console(width=width)).print(table)


def _check_listening(host: str, port: int, timeout_s: float) -> None:
    """Fail at once when the host's name does not resolve, or nothing listens on the node's
    port (connection refused), rather than after every retry of the request (and blaming
    the node). Anything else (a host that does not answer) is left to the client and its
    timeout."""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
            pass
    except socket.gaierror as exc:
        raise Unavailable(f"cannot find the host {host} ({exc.strerror}): is its name "
                          f"right? (--host)") from None
    except ConnectionRefusedError:
        raise Unavailable(f"nothing is listening on {host}:{port} (connection refused): "
                          f"is a node running on tcp://{host}:{port}? (--host, --port)"
                          ) from None
    except OSError:
        pass


def _positive_int(text: str) -> int:
    """An argument that is a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _client(args: argparse.Namespace, endpoints: list[str] | None = None,
            **kw: Any) -> NodeClient:
    """A client of the node the command names (or of ``endpoints``, a cluster's members),
    with its CURVE keys when given, and the command's retries (``client_args``). Raises
    ``Unavailable`` at once when the host's name does not resolve or nothing listens on
    the node's port."""
    from actors.curve import KeyFileError
    from node.client import NodeClient, read_keypair, read_public_key

    if (args.server_key is None) != (args.client_key is None):
        raise CommandError("CURVE needs both --server-key (the node's .pub file) and "
                           "--client-key (this client's .key file)")
    if args.server_key is not None:
        try:
            kw.update(server_public_key=read_public_key(args.server_key),
                      client_keys=read_keypair(args.client_key))
        except KeyFileError as exc:
            raise CommandError(str(exc)) from None
    _check_listening(args.host, args.port, min(args.timeout_ms / 1000, PROBE_TIMEOUT_S_MAX))
    return NodeClient(endpoints or _endpoint(args), timeout_ms=args.timeout_ms,
                      retries=args.retries, **kw)


def _cluster_client(args: argparse.Namespace) -> NodeClient:
    """A client of every member of the cluster the node named belongs to (learnt from its
    map), for the commands that must see them all: a branch in doubt may live on any."""
    with _client(args) as c:
        members = c.members()
    if len(members) < 2:
        return _client(args)
    # The member named first: --server-key is its key (a routed client gives its first
    # endpoint the key it was given, and learns the others' from the map).
    named = _endpoint(args)
    return _client(args, [named, *(members[m] for m in sorted(members)
                                   if members[m] != named)])


def cmd_keygen(args: argparse.Namespace) -> int:
    import zmq

    from actors.curve import PUBLIC_SUFFIX, SECRET_SUFFIX
    from actors.durable import fsync_dir

    name = args.name
    if not name or name.startswith(".") or "/" in name or os.sep in name:
        raise CommandError(f"--name {name!r} must be a plain file name")
    directory = Path(args.dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret_file = directory / (name + SECRET_SUFFIX)
    public_file = directory / (name + PUBLIC_SUFFIX)
    there = [str(p) for p in (secret_file, public_file) if os.path.lexists(p)]
    if there:
        raise CommandError(f"not overwriting {' and '.join(there)}: a key pair named "
                           f"{name!r} exists; remove it first or choose another --name")
    public, secret = zmq.curve_keypair()
    # Created 0600 (O_EXCL: never over a file that appeared since, nor through a link),
    # so the secret is never readable by others, not even before a chmod.
    for path, key, mode in ((secret_file, secret, 0o600), (public_file, public, 0o644)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)  # exactly this mode, whatever the umask
            os.write(fd, key + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(directory)
    print(f"secret key: {secret_file} (mode 0600: keep it private)")
    print(f"public key: {public_file}")
    print(public.decode())
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    from actors.process import configure_logging
    from node.supervisor import DataDirError, NodeStartError, Supervisor

    overrides: dict[str, dict[str, Any]] = {"node": {}}
    if args.data_dir is not None:
        overrides["node"]["data_dir"] = args.data_dir
    if args.port is not None:
        overrides["node"]["port"] = args.port
    try:
        if (args.cluster is None) != (args.node_id is None):
            raise ConfigError("--cluster and --node-id go together")
        if args.cluster is not None:
            overrides["cluster"] = _member_overrides(args.cluster, args.node_id, overrides["node"])
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        err_console.print(f"[red]config error:[/red] {escape(str(exc))}")
        return 2
    # Told here, before any actor starts; a port taken after this check still fails the
    # front door's bind, and the start with it.
    from node.local import port_in_use

    if port_in_use(cfg.node.host, cfg.node.port):
        err_console.print(f"[red]cannot start:[/red] port {cfg.node.port} is in use on "
                          f"{escape(cfg.node.host)} (another node?): choose another with --port",
                          highlight=False)
        return 1
    if args.from_snapshot is not None:
        from actors.snapshot_files import ExportRefused, start_from_export

        try:
            manifest = start_from_export(Path(args.from_snapshot), cfg.data_path)
        except ExportRefused as exc:
            err_console.print(f"[red]cannot start from the snapshot:[/red] {escape(str(exc))}")
            return 2
        print(f"data dir {cfg.data_path} made from the snapshot {args.from_snapshot} "
              f"(LSN {manifest['lsn']}, {len(manifest['shards'])} shards)", flush=True)
    configure_logging("supervisor")
    sup = Supervisor(cfg, parent_pid=args.started_by if args.exit_with_parent else None)
    try:
        sup.start()
    except ConfigError as exc:
        err_console.print(f"[red]config error:[/red] {escape(str(exc))}")
        return 2
    except DataDirError as exc:  # --data-dir (or [node] data_dir) names no directory
        raise CommandError(str(exc)) from None
    except NodeStartError as exc:
        err_console.print(f"[red]cannot start:[/red] {escape(str(exc))}")
        return 1
    print(f"shardnode listening on {cfg.endpoint} (data in {cfg.data_path}); Ctrl-C stops it",
          flush=True)
    sup.serve_forever()
    if sup.failed:
        err_console.print(f"[red]node stopped:[/red] {escape(str(sup.stop_reason))}")
        return 1
    return 0


def _member_overrides(path: str, node_id: int, node: dict[str, Any]) -> dict[str, Any]:
    """The config of member ``node_id`` of the cluster file at ``path``: its host and port
    (from its endpoint) into ``node``; the ``[cluster]`` keys returned. The data dir is
    ``node-N`` beside the cluster file unless one is given."""
    from pathlib import Path

    from config.cluster import read_cluster

    file = str(Path(path).resolve())
    member = {m.id: m for m in read_cluster(file)}.get(node_id)
    if member is None:
        raise ConfigError(f"node id {node_id} is not a member of {file}")
    if "port" in node and node["port"] != member.port:
        raise ConfigError(f"--port {node['port']} differs from node {node_id}'s endpoint "
                          f"{member.endpoint} in {file}")
    node["host"], node["port"] = member.host, member.port
    node.setdefault("data_dir", str(Path(file).parent / f"node-{node_id}"))
    return {"file": file, "node_id": node_id}


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as c:
        st = c.status()
    if args.json:
        print(json.dumps(st, indent=2, default=str))
        return 0
    console.print(f"[bold]shardnode[/bold] {escape(str(st['endpoint']))}  pid {st['pid']}  "
                  f"up {st['uptime_s']:.0f} s  data {escape(str(st['data_dir']))}")
    t = Table(title="actors")
    for col in ("role", "pid", "state", "RSS MB", "CPU %", "mailbox", "restarts"):
        t.add_column(col, justify="right" if col not in ("role", "state") else "left")
    for a in st["actors"]:
        cpu = "-" if a["cpu_percent"] is None else f"{a['cpu_percent']:.0f}"
        t.add_row(*_cells(a["role"], str(a["pid"]), a["state"], _mb(a["rss_bytes"]), cpu,
                          str(a["mailbox"]), str(a["restarts"])))
    console.print(t)
    lg = st["log"]
    cache: dict[str, Any] = next(
        (a.get("figures", {}) for a in st["actors"] if a["role"] == "cache"), {})
    txn: dict[str, Any] = next(
        (a.get("figures", {}) for a in st["actors"] if a["role"] == "txn"), {})
    reported_at = lg.get("reported_at")
    age = "" if reported_at is None else f" (figures {max(0.0, time.time() - reported_at):.1f} s old)"
    lt = Table(title=f"log manager{age}")
    lt.add_column("figure")
    lt.add_column("value", justify="right")
    for label, value in (
        ("log MB", _mb(lg.get("log_bytes"))),
        ("fsyncs/s", lg.get("fsyncs_per_s")),
        ("records/fsync", lg.get("records_per_fsync")),
        ("last LSN", lg.get("last_lsn")),
        ("topics", lg.get("topics")),
        ("recovery ms", lg.get("recovery_ms")),
        ("replayed MB", _mb(lg.get("replayed_bytes"))),
        ("checkpoints (abandoned)",
         f"{lg.get('checkpoints', '-')} ({lg.get('checkpoints_abandoned', '-')})"),
        ("checkpoint phase", lg.get("checkpoint_phase")),
        ("last checkpoint ms", lg.get("last_checkpoint_ms")),
        ("snapshot exports (failed)",
         f"{lg.get('exports', '-')} ({lg.get('exports_failed', '-')})"),
        ("snapshot export phase", lg.get("export_phase")),
        # The data path's byte bound: groups queued, and those left for receivers to read
        # back from the log because their queue was full.
        ("queued for the cache MB", _mb(lg.get("cache_queued_bytes"))),
        ("queued for the writers MB", _mb(cache.get("writer_queued_bytes"))),
        ("groups read back from the log",
         lg.get("groups_not_sent", 0) + cache.get("groups_not_sent", 0)),
        ("transactions open / prepared (shardnode txn list)",
         f"{txn.get('txn_open', '-')} / {txn.get('txn_prepared', '-')}"),
    ):
        lt.add_row(*_cells(label, "-" if value is None else str(value)))
    console.print(lt)
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    with _client(args) as c:
        lsn = c.checkpoint()
    print(f"checkpoint done: shards durable to LSN {lsn}; older log segments deleted")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with _client(args) as c:
        st = c.stats()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    t = Table(title=f"shards: {len(st['shards'])} (RocksDB's figures, every column family)")
    for col in ("topic", "partition", "writer", "SST MB", "files L0..L6", "pending compaction MB",
                "memtables MB", "records (est.)"):
        t.add_column(col, justify="left" if col in ("topic", "files L0..L6") else "right")
    for r in st["shards"]:
        t.add_row(*_cells(str(r["topic"]), str(r["partition"]), str(r["writer"]),
                          _mb(r["sst_bytes"]), " ".join(str(n) for n in r["files_per_level"]),
                          _mb(r["pending_compaction_bytes"]), _mb(r["memtable_bytes"]),
                          str(r["records"])))
    _print_whole(t)  # topic names whole, in a pipe too (rich cuts it at 80 columns)
    wt = Table(title="block cache, shared by each writer's shards")
    for col in ("writer", "shards", "used MB", "capacity MB", "hit rate"):
        wt.add_column(col, justify="right")
    for w in st["writers"]:
        lookups = w["cache_hits"] + w["cache_misses"]
        rate = "-" if not lookups else f"{100 * w['cache_hits'] / lookups:.1f} %"
        wt.add_row(str(w["writer"]), str(w["shards"]), _mb(w["cache_bytes"]),
                   _mb(w["cache_capacity"]), rate)
    _print_whole(wt)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    with _client(args) as c:
        rows = c.compact(args.topic)
    for topic, partition, before, after in rows:
        print(f"{topic}/{partition}: {_mb(before)} MB → {_mb(after)} MB")
    print(f"compacted {len(rows)} shard(s) of {args.topic} on this node")
    return 0


def cmd_snapshot_export(args: argparse.Namespace) -> int:
    directory = str(Path(args.dir).resolve())  # the node resolves nothing: it may run elsewhere
    t0 = time.monotonic()
    with _client(args) as c:
        done = c.snapshot_export(directory)
    t = Table(title=f"snapshot exported to {escape(directory)}")
    for col in ("LSN", "shards", "MB", "seconds"):
        t.add_column(col, justify="right")
    t.add_row(str(done["lsn"]), str(done["shards"]), _mb(done["bytes"]),
              f"{time.monotonic() - t0:.1f}")
    console.print(t)
    print(f"start a node from it: shardnode start --data-dir NEW --from-snapshot {directory}")
    return 0


def retention_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--retention-ms", type=int, default=None,
                   help="delete records older than this many ms (0: keep them)")
    s.add_argument("--retention-bytes", type=int, default=None,
                   help="delete a partition's oldest records past this many bytes (0: no bound)")


def cmd_alter_topic(args: argparse.Namespace) -> int:
    if args.retention_ms is None and args.retention_bytes is None:
        raise CommandError("say what to change: --retention-ms and/or --retention-bytes")
    with _client(args) as c:
        lsn = c.alter_topic(args.name, args.retention_ms, args.retention_bytes)
    print(f"topic {args.name} altered (LSN {lsn})")
    return 0


def cmd_create_topic(args: argparse.Namespace) -> int:
    with _client(args) as c:
        c.create_topic(args.name, args.partitions, args.storage, args.retention_ms,
                       args.retention_bytes)
    print(f"created topic {args.name} with {args.partitions} partition(s)")
    return 0


def cmd_delete_topic(args: argparse.Namespace) -> int:
    with _client(args) as c:
        c.delete_topic(args.name)
    print(f"deleted topic {args.name}")
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    with _client(args) as c:
        topics = c.list_topics()
    if not topics:
        print("no topics (shardnode create-topic NAME makes one)")
        return 0
    t = Table(title=f"topics: {len(topics)}")
    t.add_column("name")
    t.add_column("partitions", justify="right")
    t.add_column("storage")
    t.add_column("retention")
    for topic in topics:
        kept = [f"{topic.retention_ms} ms"] if topic.retention_ms else []
        kept += [f"{topic.retention_bytes} bytes"] if topic.retention_bytes else []
        t.add_row(*_cells(topic.name, str(topic.partitions), topic.storage,
                          ", ".join(kept) or "-"))
    console.print(t)
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from node.client import Record

    with _client(args) as c:
        key = None if args.key is None else args.key.encode()
        recs = [Record(v.encode(), key, tuple(args.tag)) for v in args.values]
        for (p, off), value in zip(c.produce_batch(args.topic, recs, args.partition), args.values, strict=False):
            print(f"{args.topic}/{p}@{off} {value}")
    return 0


def _show(value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.hex()


def cmd_consume(args: argparse.Namespace) -> int:
    """Print the partition's records from ``--from`` on, at most ``--max-records`` in all;
    then stop, or with ``--follow`` wait for more."""
    if args.max_records is not None and args.max_records < 1:
        raise CommandError(f"--max-records {args.max_records}: give 1 or more (or leave it "
                           f"out: no limit)")
    if args.poll_ms < 1:
        raise CommandError(f"--poll-ms {args.poll_ms}: give 1 or more")
    offset, left, printed = args.offset, args.max_records, 0
    if offset is not None and offset < 0:
        raise CommandError(f"--from {offset}: give an offset of 0 or more")
    with _client(args) as c:
        if offset is None:  # the oldest record the partition keeps (retention may be past 0)
            try:
                c.read(args.topic, args.partition, 0, 1)
                offset = 0
            except OffsetOutOfRange as exc:
                offset = exc.earliest
        while left is None or left > 0:
            page = READ_PAGE_RECORDS if left is None else min(left, READ_PAGE_RECORDS)
            recs = c.read(args.topic, args.partition, offset, page)
            for r in recs:
                key = "" if r.key is None else f" key={_show(r.key)}"
                tags = f" tags={','.join(r.tags)}" if r.tags else ""
                print(f"{r.offset} ts={r.timestamp}{key}{tags} {_show(r.value)}", flush=True)
            if recs:
                offset = recs[-1].offset + 1  # type: ignore[operator]
                printed += len(recs)
                left = None if left is None else left - len(recs)
                continue
            if not args.follow:
                break
            time.sleep(args.poll_ms / 1000)  # --follow: wait for new records
    if not printed:
        _note(f"no records in {args.topic}/{args.partition} from offset {offset}")
    return 0


def cmd_offsets(args: argparse.Namespace) -> int:
    from wire.protocol import check_name

    for group in args.group:  # a group no commit could have made: say so, not "-"
        check_name("group", group)
    with _client(args) as c:
        ends = c.end_offsets(args.topic)
        groups = {g: [c.committed_offset(g, args.topic, p) for p in range(len(ends))]
                  for g in args.group}
    # Not a count of records: retention and deletes remove records below the end offsets.
    t = Table(title=f"{escape(args.topic)}: end offsets")
    t.add_column("partition", justify="right")
    t.add_column("end offset", justify="right")
    for g in groups:
        t.add_column(f"{escape(g)}: offset", justify="right")
        t.add_column("lag", justify="right")
    for p, end in enumerate(ends):
        row = [str(p), str(end)]
        for committed in groups.values():
            at = committed[p]
            row += ["-", str(end)] if at is None else [str(at), str(end - at)]
        t.add_row(*_cells(*row))
    console.print(t)
    return 0


# The arguments of the `kv` commands that are keys or values (hex with --hex), each by its
# dest and the name its usage line gives it; `cas` takes '-' for absent in the last two.
KV_BYTES_ARGS = {"key": "key", "value": "value", "prefix": "--prefix",
                 "start_after": "--start-after", "expected": "expected", "new": "new"}
KV_ABSENT_ARGS = ("expected", "new")


def _value_arg(text: str | None, hex_: bool, what: str, dash_absent: bool = False
               ) -> bytes | None:
    """A value given on the command line as ``what`` (``key``, ``--prefix``, ...): text,
    or hex with ``--hex``; with ``dash_absent``, ``-`` for none (a compare-and-set's)."""
    if text is None or (dash_absent and text == "-"):
        return None
    if not hex_:
        return text.encode()
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise CommandError(f"{what} {text!r} is not hex: with --hex, keys and values are "
                           f"given in hex ({text!r} is {text.encode().hex()})") from None


def cmd_kv(args: argparse.Namespace) -> int:
    """``shardnode kv get|put|delete|scan|cas|list|drop``."""
    ns, hex_ = getattr(args, "namespace", ""), getattr(args, "hex", False)
    given = {dest: _value_arg(getattr(args, dest, None), hex_, shown,  # before connecting
                              dest in KV_ABSENT_ARGS)
             for dest, shown in KV_BYTES_ARGS.items()}
    key = given["key"]
    with _client(args) as c:
        match args.kv_command:
            case "get":
                assert key is not None
                value = c.kv_get(ns, key)
                if value is None:
                    _note(f"{_show(key)}: absent")
                    return 3
                print(value.hex() if hex_ else _show(value))
            case "put":
                assert key is not None
                lsn = c.kv_put(ns, key, given["value"] or b"")
                print(f"{ns}/{_show(key)} set (LSN {lsn})")
            case "delete":
                assert key is not None
                lsn = c.kv_delete(ns, key)
                print(f"{ns}/{_show(key)} deleted (LSN {lsn})")
            case "cas":
                assert key is not None
                swapped = c.kv_cas(ns, key, given["expected"], given["new"])
                print("swapped" if swapped else "not swapped: the value was not the expected one")
                return 0 if swapped else 4
            case "scan":
                pairs = c.kv_scan(ns, given["prefix"] or b"", given["start_after"], args.limit)
                t = Table(title=f"{escape(ns)}: {len(pairs)} keys")
                t.add_column("key")
                t.add_column("value")
                for k, v in pairs:
                    t.add_row(*_cells(k.hex() if hex_ else _show(k),
                                      v.hex() if hex_ else _show(v)))
                console.print(t)
            case "list":
                names = c.kv_namespaces()
                for name in names:
                    print(name)
                if not names:
                    _note("no namespaces (a namespace is made by its first write)")
            case "drop":
                c.kv_drop(ns)
                print(f"namespace {ns} deleted")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """``shardnode delete TOPIC (--key K | --offset N --partition P)``."""
    if args.key is None and args.partition is None:
        raise CommandError("--offset needs --partition")
    # The node answers a deletion of a record that is not there as any other (it changes
    # nothing); the shell looks first, to say so (exit 3, as ``kv get`` of an absent key).
    with _client(args) as c:
        if args.key is not None:
            if c.read_by_key(args.topic, args.key, args.partition) is None:
                _note(f"no record of {args.topic} with key {args.key}: nothing deleted")
                return 3
            lsn = c.delete_by_key(args.topic, args.key, args.partition)
            print(f"deleted the latest record of {args.topic} with key {args.key} (LSN {lsn})")
        else:
            where = f"{args.topic}/{args.partition}@{args.offset}"
            try:
                found = c.read(args.topic, args.partition, args.offset, max_records=1)
            except OffsetOutOfRange:
                found = []  # below the earliest kept
            if not found or found[0].offset != args.offset:
                _note(f"no record at {where} (deleted, or not written): nothing deleted")
                return 3
            lsn = c.delete_by_offset(args.topic, args.partition, args.offset)
            print(f"deleted {where} (LSN {lsn})")
    return 0


def cmd_txn_list(args: argparse.Namespace) -> int:
    with _cluster_client(args) as c:
        txns = c.txn_list()
        members = len(c.members()) if c.routed else 0
    if args.json:  # a list of objects, named as NodeClient.txn_list's TxnInfo fields
        print(json.dumps([dataclasses.asdict(x) for x in txns], indent=2))
        return 0
    where = f" on {members} members" if members else ""
    t = Table(title=f"transactions open or prepared{where}: {len(txns)}")
    columns = [("id", "right"), ("xid", "left"), ("state", "left"), ("age s", "right"),
               ("records", "right"), ("MB", "right"), ("partitions", "right")]
    for name, justify in columns + ([("member", "right")] if members else []):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for x in txns:
        t.add_row(*_cells(str(x.txn), x.xid or "-", x.state, f"{x.age_ms / 1000:.1f}",
                          str(x.records), _mb(x.bytes), str(x.partitions),
                          *([str(x.member)] if members else [])))
    _print_whole(t)  # the id and the xid whole: `txn commit` and `txn rollback` take them
    return 0


def cmd_txn_commit(args: argparse.Namespace) -> int:
    from wire.xid import parse

    xid = parse(args.xid)
    with _cluster_client(args) as c:
        res = c.xa_commit(xid)
    where = ", ".join(f"{p.topic}/{p.partition} {p.first_offset}..{p.first_offset + p.record_count - 1}"
                      for p in res.parts) or "no records"
    print(f"committed {xid} at LSN {res.lsn}: {where}")
    return 0


def cmd_txn_rollback(args: argparse.Namespace) -> int:
    from wire.xid import parse

    with _cluster_client(args) as c:
        if args.txn.isdigit():
            c.txn_abort(int(args.txn))
        else:
            c.xa_rollback(parse(args.txn))
    print(f"rolled back {args.txn}")
    return 0


def runs(sp: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int],
         **defaults: Any) -> None:
    """The command ``sp`` runs ``func``; ``main`` prints its usage with a ``CommandError``."""
    sp.set_defaults(func=func, command_parser=sp, **defaults)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardnode", description="a storage node for messages "
                                "and key/value state")
    sub = p.add_subparsers(dest="command", required=True)

    def command(subs: Any, name: str, text: str, description: str | None = None
                ) -> argparse.ArgumentParser:
        """A command; its ``--help`` opens with ``description``, or with ``text``, its line
        in the list of commands."""
        made: argparse.ArgumentParser = subs.add_parser(name, help=text,
                                                        description=description or text)
        return made

    def client_args(sp: argparse.ArgumentParser, retries: int = CLIENT_RETRIES) -> None:
        sp.add_argument("--host", default="127.0.0.1",
                        help="the node's host or address (default %(default)s)")
        sp.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="the node's client port (default %(default)s)")
        # A command's own default (set_defaults below) is the one its help shows.
        if retries:
            tries = (f"a request that is safe to repeat is sent again after a timeout, up "
                     f"to {retries + 1} attempts in all (one that is not, once); a failed "
                     f"CURVE handshake is reported at once, not retried")
        else:
            tries = "the request is sent once"
        sp.add_argument("--timeout-ms", type=_positive_int, default=10_000,
                        help=f"how long to wait for each answer, in ms (default "
                             f"%(default)s); {tries}")
        sp.set_defaults(retries=retries)
        sp.add_argument("--server-key", metavar="FILE",
                        help="the node's public key file (CURVE on)")
        sp.add_argument("--client-key", metavar="FILE",
                        help="this client's secret key file (CURVE on)")

    s = command(sub, "start", "run a node in the foreground",
                "run a node in the foreground: its actors start, it listens on --port, and "
                "Ctrl-C or SIGTERM stops it cleanly (a checkpoint, then every actor exits); "
                "after a crash it recovers from its log. Exit 1 if it cannot start, 2 for a "
                "bad config or data dir")
    s.add_argument("--config", help="TOML file overriding config/defaults.toml")
    s.add_argument("--data-dir", help="where the log and shards live (default ./var)")
    s.add_argument("--port", type=int, help=f"client port (default {DEFAULT_PORT})")
    s.add_argument("--cluster", metavar="FILE",
                   help="run as a member of the cluster this file lists (scripts/cluster writes "
                        "it); the member's endpoint gives host and port")
    s.add_argument("--node-id", type=int, help="this node's id in the cluster file")
    s.add_argument("--from-snapshot", metavar="DIR",
                   help="fill the new (absent or empty) data dir from a snapshot export first "
                        "(`shardnode snapshot export`), then start")
    s.add_argument("--exit-with-parent", action="store_true",
                   help="stop cleanly when the process that started the node exits "
                        "(for harnesses: tests, benchmarks)")
    runs(s, cmd_start)

    s = command(sub, "status", "the node's actors and log figures")
    client_args(s, retries=0)
    s.add_argument("--json", action="store_true", help="print the raw status as JSON")
    runs(s, cmd_status)

    s = command(sub, "checkpoint", "flush the shards and truncate the log now")
    client_args(s, retries=0)
    runs(s, cmd_checkpoint, timeout_ms=120_000)

    s = command(sub, "stats", "RocksDB's figures of each shard on this node")
    client_args(s, retries=0)
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    runs(s, cmd_stats)

    s = command(sub, "compact", "compact every shard of a topic on this node (RocksDB)")
    client_args(s, retries=0)
    s.add_argument("topic", help="the topic whose shards to compact")
    runs(s, cmd_compact, timeout_ms=COMPACT_TIMEOUT_MS + 10_000)

    s = command(sub, "snapshot", "snapshots of this node: export")
    snap = s.add_subparsers(dest="snapshot_command", required=True)
    t = command(snap, "export", "a point-in-time copy of this node (in a cluster: of "
                "this member only) into DIR, taken while it serves")
    client_args(t, retries=0)
    t.add_argument("dir", metavar="DIR", help="a new or empty directory outside the data dir")
    runs(t, cmd_snapshot_export, timeout_ms=SNAPSHOT_CLIENT_TIMEOUT_MS)

    s = command(sub, "create-topic", "create a topic")
    client_args(s)
    s.add_argument("name", help="the new topic's name")
    s.add_argument("--partitions", type=int, default=1,
                   help="the topic's partitions (default %(default)s)")
    s.add_argument("--storage", choices=("rocksdb", "memory"), default=None,
                   help="memory: records kept in memory within storage.memory_bytes_max, "
                   "acknowledged without a log write, gone when the node restarts")
    retention_args(s)
    runs(s, cmd_create_topic)

    s = command(sub, "alter-topic", "change a topic's retention")
    client_args(s)
    s.add_argument("name", help="the topic to change")
    retention_args(s)
    runs(s, cmd_alter_topic)

    s = command(sub, "delete-topic", "delete a topic and its records")
    client_args(s)
    s.add_argument("name", help="the topic to delete")
    runs(s, cmd_delete_topic)

    s = command(sub, "topics", "list topics")
    client_args(s)
    runs(s, cmd_topics)

    s = command(sub, "produce", "write records (one per VALUE)")
    client_args(s)
    s.add_argument("topic", help="the topic to write to")
    s.add_argument("values", nargs="+", metavar="VALUE",
                   help="a record's value, as text; one record per VALUE, in order")
    s.add_argument("--key", help="every record's key; it picks the partition, crc32(key) %% "
                   "partitions, unless --partition is given (default: no key)")
    s.add_argument("--tag", action="append", default=[],
                   help="a tag on every record; may be repeated (default: none)")
    s.add_argument("--partition", type=int, help="write to this partition (default: by the "
                   "key, round-robin without one)")
    runs(s, cmd_produce)

    s = command(sub, "consume", "print records of a partition")
    client_args(s)
    s.add_argument("topic", help="the topic to read")
    s.add_argument("--partition", type=int, default=0,
                   help="the partition to read (default %(default)s)")
    s.add_argument("--from", dest="offset", type=int, default=None, metavar="OFFSET",
                   help="the first offset to print (default: the oldest the partition "
                        "keeps, 0 until retention deletes records)")
    s.add_argument("--max-records", type=int, default=None, metavar="N",
                   help="stop after printing N records in all, with --follow too "
                        "(default: no limit)")
    s.add_argument("--follow", action="store_true",
                   help="at the end, keep waiting for new records and print them")
    s.add_argument("--poll-ms", type=int, default=200,
                   help="with --follow: how often to ask for new records, in ms "
                        "(default %(default)s)")
    runs(s, cmd_consume)

    s = command(sub, "offsets", "a topic's end offsets, and how far groups have read")
    client_args(s)
    s.add_argument("topic", help="the topic whose offsets to show")
    s.add_argument("--group", action="append", default=[],
                   help="a consumer group (a Spark source's groupId); may be repeated")
    runs(s, cmd_offsets)

    s = command(sub, "delete", "delete a record: the latest with a key, or the one at "
                "an offset (the offsets of the others do not move); exit 3: no such record")
    client_args(s)
    s.add_argument("topic", help="the record's topic")
    which = s.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="the latest record with this key (in its own partition "
                       "unless --partition names one)")
    which.add_argument("--offset", type=int, help="the record at this offset (with --partition)")
    s.add_argument("--partition", type=int, help="the record's partition (needed with "
                   "--offset; with --key, default: the key's own)")
    runs(s, cmd_delete)

    s = command(sub, "kv", "key/value namespaces: get, put, delete, scan, cas, list, drop")
    kv = s.add_subparsers(dest="kv_command", required=True)
    for name, what in (("get", "a key's value (exit 3: absent)"), ("put", "set a key"),
                       ("delete", "delete a key"),
                       ("cas", "compare and set (exit 4: not swapped); '-' for absent"),
                       ("scan", "keys and values in key order"), ("list", "the namespaces"),
                       ("drop", "delete a namespace and its keys")):
        t = command(kv, name, what)
        client_args(t)
        if name != "list":
            t.add_argument("namespace", help="the namespace (made by its first write)")
        if name in ("get", "put", "delete", "cas"):
            t.add_argument("key", help="the key (text; hex with --hex)")
        if name == "put":
            t.add_argument("value", help="its new value (text; hex with --hex)")
        if name == "cas":
            t.add_argument("expected", help="the value the key must have ('-': absent)")
            t.add_argument("new", help="the value to set ('-': delete the key)")
        if name == "scan":
            t.add_argument("--prefix", help="only keys starting with this")
            t.add_argument("--start-after", help="only keys after this one")
            t.add_argument("--limit", type=_positive_int, default=1000,
                           help="at most this many (default %(default)s)")
        if name != "list":
            t.add_argument("--hex", action="store_true", help="keys and values in hex")
        runs(t, cmd_kv)

    s = command(sub, "txn", "transactions open or in doubt: list, commit, roll back")
    txn = s.add_subparsers(dest="txn_command", required=True)
    t = command(txn, "list", "open and prepared transactions")
    client_args(t)
    t.add_argument("--json", action="store_true",
                   help="print them as JSON: a list of objects")
    runs(t, cmd_txn_list)
    t = command(txn, "commit", "commit a prepared XA branch")
    client_args(t)
    t.add_argument("xid", help="format_id:global_hex:branch_hex, as `txn list` prints it")
    runs(t, cmd_txn_commit)
    t = command(txn, "rollback", "roll back an XA branch or a local transaction")
    client_args(t)
    t.add_argument("txn", metavar="XID|ID", help="an xid as `txn list` prints it, or a "
                   "local transaction's id")
    runs(t, cmd_txn_rollback)

    s = command(sub, "keygen", "write a CURVE key pair: DIR/NAME.key (secret, mode "
                "0600) and DIR/NAME.pub (public)")
    s.add_argument("dir", metavar="DIR", help="where to write them (made, mode 0700, if "
                   "absent)")
    s.add_argument("--name", default="node", help="the files' name (default: node)")
    runs(s, cmd_keygen)
    return p


EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a command SIGPIPE ended


def stdout_closed() -> int:
    """The reader of stdout went away (``| head``): say nothing more, as Unix tools do.
    Python would print a traceback for the pipe, and another for the flush at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    started_by = os.getppid()  # first: `start --exit-with-parent` watches this process
    args = build_parser().parse_args(argv)
    args.started_by = started_by
    logging.basicConfig(level=logging.WARNING)
    command: argparse.ArgumentParser = args.command_parser
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the exit
        return code
    except NodeError as exc:
        _error(command.prog, str(exc))
        return 1
    except CommandError as exc:
        command.print_usage(sys.stderr)
        _error(command.prog, str(exc))
        return 2
    except BrokenPipeError:
        return stdout_closed()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
