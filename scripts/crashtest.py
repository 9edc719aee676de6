"""scripts/crashtest: SIGKILL actors or the whole node at random moments and check the data.

Producers with idempotent retries write to a node; each trial lets them write, kills a
random actor (or the one named, or the whole node) at a random moment, waits for the node
to serve again, lets the producers finish the trial's batches, then checks that every
acknowledged record is present exactly once at its acknowledged offset, that offsets are
contiguous and that nothing appears that was never sent. It prints its seed, one line per
failed trial with how to replay it, and last ``N passed, N failed``.

With ``--txn``, transactional producers run beside them (``node/txncheck.py``): local
transactions that commit or abort, XA branches that prepare and then commit or roll back,
some left prepared across kills; and a reader watches two partitions that every
transaction writes to. A trial's kill then lands at a random moment, just after a begin
is answered, just after a commit is sent, or between a prepare and its commit. After the
restart every prepared branch must be listed by ``xa_recover`` (and is resolved), every
committed transaction must be whole at its commit's offsets, every other one absent, no
transaction id given twice, and the reader must never have seen part of a transaction,
or one that did not commit.

With ``--kv``, key/value writers run beside them too (``node/kvcheck.py``), each owning its
keys in a namespace they share and in namespaces of its own, one created each trial (by
``kv_create`` or by a first put) and the oldest dropped beyond three: puts and deletes
retried until answered, puts sent once, compare-and-sets (some that cannot hold), and
local transactions of key writes (committed, conflicting, or rolled back). Each keeps a
model of what the node acknowledged; a trial's kill then also lands just after a
namespace's creation is sent (so inside the making of its shard) or just after a KV
transaction's commit is sent. After the restart every acknowledged write must be there
exactly (read by ``kv_scan`` and by ``kv_get``), a write whose answer was lost may have
left the old value or the new one and nothing else, a refused compare-and-set or a
rolled-back transaction nothing at all, and the namespaces must be those created and not
dropped. It may run with ``--txn``.

With ``--cluster`` (``--nodes N``, default 3) it runs a local cluster instead
(``LocalCluster``), on a topic whose partitions every member owns some of, with producers
whose clients are routed (each request to its partition's owner; a batch with no partition
split by key over the owners), and one that knows a single member, which splits and
forwards. Each trial kills a random member whole (then starts it again), or a random actor
inside a random member (its supervisor restarts it); the catalog member too. The check
reads each partition from its owner.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from node.client import NodeClient
from node.crashcheck import PIPELINED_IN_FLIGHT, CheckFailed, PipelinedProducer, Producer, check
from node.kvcheck import KvCounts, KvWriter, Step, check_kv
from node.local import LocalCluster, LocalNode, NodeFailed
from node.txncheck import (
    SRC_RECORDS,
    Reader,
    TxnCounts,
    TxnProducer,
    check_txns,
    resolve_in_doubt,
)
from wire.errors import NodeError

TOPIC = "crashtest"
PARTITIONS = 3
# --cluster: partitions of the topic, at least one per member (placement spreads them evenly).
CLUSTER_PARTITIONS_MIN = 6
ROLES = ["log", "txn", "cache", "writer-0", "writer-1", "front"]
# --txn: the transactions' topic (its partitions 0 and 1 are the reader's), and the topic
# whose offsets they commit for their consumer groups.
TXN_TOPIC = "crashtxn"
SRC_TOPIC = "crashsrc"
TXN_PRODUCERS = 3
# Where a --txn trial's kill lands, and how often: at a random moment; just after a begin
# is answered (at once: a start answered before it is durable could be lost); just after a
# commit is sent (0-5 ms later); between a prepare answered and the commit or rollback
# after it.
KILL_POINTS = {"moment": 4, "begin": 2, "commit": 3, "prepared": 3}
COMMIT_KILL_S_MAX = 0.005
# --kv: the namespace its writers share, and where a trial's kill lands: at a random moment;
# just after a namespace's creation is sent (0-15 ms later: the creation is answered in
# 2-6 ms, once logged, and its shard is made when a writer applies it, a few ms after);
# just after a KV transaction's commit is sent (0-5 ms later).
KV_NAMESPACE = "crashkv"
KV_WRITERS = 3
KV_KILL_POINTS = {"moment": 4, "create": 4, "kv-commit": 2}
CREATE_KILL_S_MAX = 0.015
POINT_WAIT_S = 15.0  # how long a trial waits for an armed producer to reach its kill point
# Small log limits, so that checkpoints (and segment rolls) happen every few batches and
# kills land inside them too.
CONFIG = """
[limits]
request_timeout_ms = 2000
frame_bytes_max = 1048576
value_bytes_max = 65536

[log]
segment_bytes_max = 1048576
group_bytes_max = 1048576
checkpoint_bytes = 1048576
checkpoint_timeout_ms = 5000

[supervisor]
restarts_max = 1000000   # the harness kills on purpose; never give up
restart_window_s = 1
"""


def wait_until(what: str, cond: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.02)  # poll interval


def serving(node: LocalNode) -> bool:
    try:
        with NodeClient(node.endpoint, timeout_ms=1000, retries=0) as c:
            return all(a["state"] == "running" for a in c.status()["actors"])
    except NodeError:
        return False


def request_checkpoint(node: LocalNode) -> None:
    with contextlib.suppress(NodeError), NodeClient(node.endpoint, timeout_ms=5000, retries=0) as c:
        c.checkpoint()


@dataclass
class TxnSide:
    """What --txn adds: transactional producers, the reader, and the plain producer that
    writes to the transactions' topic too."""

    producers: list[TxnProducer]
    reader: Reader
    plain: Producer
    txns: int  # transactions per producer per trial


@dataclass
class KvSide:
    """What --kv adds: the key/value writers."""

    writers: list[KvWriter]
    steps: int  # steps per writer per trial


def run_trial(node: LocalNode, producers: list[Producer], trial_seed: int, kill: str,
              batches: int, side: TxnSide | None = None, kv: KvSide | None = None) -> str:
    """One trial; returns what was killed."""
    rng = random.Random(trial_seed)
    target = rng.choice([*ROLES, "node"]) if kill == "any" else kill
    point = "moment"
    armed: TxnProducer | KvWriter | None = None
    points = {**(KILL_POINTS if side is not None else {}),
              **(KV_KILL_POINTS if kv is not None else {})}
    if points:
        point = rng.choices(list(points), list(points.values()))[0]
        if point in KV_KILL_POINTS and point != "moment":
            assert kv is not None
            armed = rng.choice(kv.writers)
        elif point != "moment":
            assert side is not None
            armed = rng.choice(side.producers)
        if armed is not None:
            fired = armed.arm(point)
    # The victim is found before the moment comes, so that the kill follows it at once.
    victim = None if target == "node" else psutil.Process(node.actor_pid(target))
    for p in producers:
        p.allow(batches)
    if side is not None:
        for tp in side.producers:
            tp.allow(side.txns)
    if kv is not None:
        for w in kv.writers:
            w.allow(kv.steps)
    if rng.random() < 0.5:
        # Kill inside a checkpoint, too: ask for one just before the kill.
        threading.Thread(target=request_checkpoint, args=(node,), daemon=True).start()
    how = "at a random moment"
    if armed is None:
        # The random moment: some time after the producers resumed, while they write.
        threading.Event().wait(rng.uniform(0.0, 0.3))  # ok-sleep: choosing when to kill
    elif not fired.wait(POINT_WAIT_S):
        how = f"(producer {armed.tag} never reached its kill point, {point})"
    elif point == "begin":
        how = "just after the begin of {} was answered"
    elif point == "commit":
        how = "just after the commit of {} was sent"
        threading.Event().wait(rng.uniform(0.0, COMMIT_KILL_S_MAX))  # ok-sleep: when to kill
    elif point == "kv-commit":
        how = "just after the commit of a KV transaction was sent ({})"
        threading.Event().wait(rng.uniform(0.0, COMMIT_KILL_S_MAX))  # ok-sleep: when to kill
    elif point == "create":
        how = "just after the creation of a namespace was sent ({})"
        threading.Event().wait(rng.uniform(0.0, CREATE_KILL_S_MAX))  # ok-sleep: when to kill
    else:
        how = "between the prepare and the end of {}"
    try:
        kill_and_restart(node, target, victim)
    finally:
        if armed is not None:
            armed.release()
    if (side is not None or kv is not None) and rng.random() < 0.5:
        # And a checkpoint after the restart: the branches left in doubt, and what open
        # transactions staged, then live on in the shards and the snapshot alone.
        threading.Thread(target=request_checkpoint, args=(node,), daemon=True).start()
    everyone = [*producers, *([] if side is None else side.producers),
                *([] if kv is None else kv.writers)]
    wait_until("producers to finish the trial", lambda: all(p.idle() for p in everyone), 180)
    for p in everyone:
        if p.error is not None:
            raise CheckFailed(f"producer {p.tag} failed: {p.error!r}{exited(node)}")
    with node.client() as c:
        check(c, TOPIC, PARTITIONS, [p.ledger for p in producers if p.topic == TOPIC])
        checkpoints = c.status()["log"].get("checkpoints", 0)
        txn_line = "" if side is None else check_side(c, side, rng)
        kv_line = "" if kv is None else check_kv_side(c, kv)
    if armed is not None and (t := armed.fired_in) is not None:
        # Said after the check, which may have resolved it (a branch left in doubt).
        how = how.format(str(t) if isinstance(t, Step)
                         else f"{t.tag} ({t.kind}; {t.fate.value}: {t.why})")
    return (f"{target} {how} (checkpoints so far in this log manager: {checkpoints})"
            f"{txn_line}{kv_line}")


def exited(node: LocalNode) -> str:
    """If the node exited (after serving again: an actor that failed at every start), how,
    from its log; else ""."""
    code = None if node.proc is None else node.proc.poll()
    if code is None:
        return ""
    return f"; the node exited with code {code}, its log ending:\n{node.log_tail(12)}"


def kill_and_restart(node: LocalNode, target: str, victim: psutil.Process | None) -> None:
    if victim is None:
        node.kill()
        node.start()
        return
    victim.kill()  # psutil checks that the pid is still this process

    def restarted() -> bool:
        try:
            return node.actor_pid(target) != victim.pid and serving(node)
        except (NodeError, KeyError):
            return False

    wait_until(f"{target} to restart", restarted, 60)


def check_side(c: NodeClient, side: TxnSide, rng: random.Random) -> str:
    """The transactions' checks, after a trial; a line about them for the trial's report."""
    listed, resolved = resolve_in_doubt(c, side.producers, rng)
    counts: TxnCounts = check_txns(c, TXN_TOPIC, PARTITIONS, side.producers,
                                   [side.plain.ledger], SRC_TOPIC,
                                   seen=side.reader.views.all_seen())
    if side.reader.error is not None:
        raise CheckFailed(f"the reader failed: {side.reader.error!r}")
    if side.reader.views.violations:
        raise CheckFailed(f"the reader saw {side.reader.views.violations[0]}")
    return (f"; {listed} branches in doubt listed, {resolved} resolved; so far "
            f"{counts.committed} transactions committed ({counts.lost_commits} commits or "
            f"rollbacks answered only on a retry), {counts.absent} absent, "
            f"{counts.in_doubt} in doubt; {sum(tp.lost[0] for tp in side.producers)} "
            f"attempts of their calls unanswered; {side.reader.rounds} reader rounds")


def check_kv_side(c: NodeClient, kv: KvSide) -> str:
    """The key/value checks, after a trial; a line about them for the trial's report."""
    keys = check_kv(c, [w.model for w in kv.writers])
    n = KvCounts()
    for w in kv.writers:
        n.add(w.counts)
    unsettled = sum(w.model.unsettled() for w in kv.writers)
    return (f"; KV so far: {n.acked} writes acknowledged ({n.retried} only on a retry), "
            f"{n.unanswered} unanswered, {n.swapped} compare-and-sets swapped and {n.refused} "
            f"refused, {n.committed} transactions committed and {n.rolled_back} rolled back, "
            f"{n.created} namespaces created and {n.dropped} dropped; {keys} keys checked, "
            f"{unsettled} of them allowed two values or more")


def start_kv_side(node: LocalNode, steps: int, rng: random.Random) -> KvSide:
    """Create the namespace the key/value writers share, and start them."""
    with node.client() as c:
        c.kv_create(KV_NAMESPACE)
    writers = [KvWriter(node.endpoint, f"k{i}", KV_NAMESPACE, rng.getrandbits(32))
               for i in range(KV_WRITERS)]
    for w in writers:
        w.start()
    return KvSide(writers, steps)


def start_txn_side(node: LocalNode, batch: int, txns: int, rng: random.Random) -> TxnSide:
    """Create the transactions' topics and start the transactional producers and the
    reader; the plain producer to the transactions' topic is returned to be started."""
    with node.client() as c:
        c.create_topic(TXN_TOPIC, partitions=PARTITIONS)
        c.create_topic(SRC_TOPIC, partitions=1)
        for first in range(0, SRC_RECORDS, 1024):
            c.produce_batch(SRC_TOPIC, [b"src-%d" % i for i in range(first, first + 1024)],
                            partition=0)
    txn_producers = [TxnProducer(node.endpoint, TXN_TOPIC, PARTITIONS, SRC_TOPIC, f"x{i}",
                                 rng.getrandbits(32)) for i in range(TXN_PRODUCERS)]
    reader = Reader(node.endpoint, TXN_TOPIC)
    for tp in txn_producers:
        tp.start()
    reader.start()
    plain = Producer(node.endpoint, TXN_TOPIC, "u", batch, None, batches_max=0)
    return TxnSide(txn_producers, reader, plain, txns)


@dataclass
class ClusterTally:
    """What the trials of --cluster killed: whole members and actors, by member; actors by
    role."""

    nodes: dict[int, int]
    actors: dict[int, int]
    roles: dict[str, int]

    def line(self) -> str:
        def by_member(counts: dict[int, int]) -> str:
            return ", ".join(f"node {m}: {n}" for m, n in sorted(counts.items()) if n)

        roles = ", ".join(f"{r} {n}" for r, n in sorted(self.roles.items()) if n)
        return (f"killed whole members {sum(self.nodes.values())} ({by_member(self.nodes)}), "
                f"actors {sum(self.actors.values())} ({by_member(self.actors)}; {roles})")


def run_cluster_trial(cluster: LocalCluster, producers: list[Producer], trial_seed: int,
                      kill: str, batches: int, partitions: int, tally: ClusterTally) -> str:
    """One --cluster trial: a random member, killed whole or one of its actors, while the
    producers write; returns what was killed."""
    rng = random.Random(trial_seed)
    member = rng.choice(sorted(cluster.nodes))
    node = cluster.nodes[member]
    target = rng.choice([*ROLES, "node"]) if kill == "any" else kill
    victim = None if target == "node" else psutil.Process(node.actor_pid(target))
    for p in producers:
        p.allow(batches)
    if rng.random() < 0.5:
        threading.Thread(target=request_checkpoint, args=(node,), daemon=True).start()
    threading.Event().wait(rng.uniform(0.0, 0.3))  # ok-sleep: choosing when to kill
    kill_and_restart(node, target, victim)
    if victim is None:
        tally.nodes[member] += 1
    else:
        tally.actors[member] += 1
        tally.roles[target] += 1
    wait_until("producers to finish the trial", lambda: all(p.idle() for p in producers), 180)
    for p in producers:
        if p.error is not None:
            raise CheckFailed(f"producer {p.tag} failed: {p.error!r}")
    with cluster.client(timeout_ms=5000, retries=5) as c:  # reads go to each owner
        acked = check(c, TOPIC, partitions, [p.ledger for p in producers])
    with node.client(timeout_ms=5000) as c:
        checkpoints = c.status()["log"].get("checkpoints", 0)
    what = f"node {member} (every process)" if victim is None else f"{target} of node {member}"
    return (f"{what} at a random moment (checkpoints so far in its log manager: "
            f"{checkpoints}); {acked} records acknowledged so far")


def cluster_producers(cluster: LocalCluster, batch: int, partitions: int) -> list[Producer]:
    """Create the topic on the cluster and make its producers: one per member to a
    partition it owns, one whose keyed batches the client splits over the owners, one
    sending single-record requests through a routed pipeline, all routed; and one that
    knows the last member only, which splits its keyed batches and forwards the parts."""
    endpoints = cluster.endpoints
    with cluster.client(timeout_ms=10_000) as c:
        c.create_topic(TOPIC, partitions=partitions)
        owners = c.owners(TOPIC)
    if set(owners) != set(cluster.nodes):
        raise SystemExit(f"the topic's partitions are placed on {sorted(set(owners))} only")
    # Each member is told to copy the topic before the creation is answered, but one that
    # could not be reached (just after the members start, their sockets to each other may
    # still be connecting, for up to ~0.2 s) copies it only in its next sync of the catalog:
    # the producers start once every member has it.
    wait_until(f"every member to know topic {TOPIC!r}",
               lambda: all(knows(n, TOPIC) for n in cluster.nodes.values()), 30)
    fixed = [owners.index(m) for m in sorted(cluster.nodes)]  # a partition of each member
    producers = [Producer(endpoints, TOPIC, f"p{p}", batch, p, batches_max=0) for p in fixed]
    producers.append(Producer(endpoints, TOPIC, "r", batch, None, batches_max=0, keyed=True))
    producers.append(PipelinedProducer(endpoints, TOPIC, "q", PIPELINED_IN_FLIGHT, None,
                                       batches_max=0))
    last = cluster.nodes[max(cluster.nodes)]
    producers.append(Producer(last.endpoint, TOPIC, "f", batch, None, batches_max=0,
                              keyed=True))
    return producers


def knows(node: LocalNode, topic: str) -> bool:
    """Whether ``node`` has ``topic`` in its own copy of the catalog."""
    try:
        with node.client(timeout_ms=1000, retries=0) as c:
            return any(row[0] == topic for row in c.call("list_topics")["topics"])
    except NodeError:
        return False


def run_trials(trials: int, rng: random.Random, trial: Callable[[int], str], replay: str,
               logs: str) -> tuple[int, int]:
    """Run the trials, a line each; stop at the first that fails. (passed, failed)."""
    passed = failed = 0
    for t in range(trials):
        trial_seed = rng.getrandbits(32)
        t0 = time.monotonic()
        try:
            target = trial(trial_seed)
            passed += 1
            print(f"trial {t}: killed {target}, ok ({time.monotonic() - t0:.1f} s)", flush=True)
        except (CheckFailed, TimeoutError, NodeError, NodeFailed) as exc:
            failed += 1
            print(f"FAILED trial {t} (trial seed {trial_seed}): {exc}\n"
                  f"  replay: {replay} --trials {t + 1}   ({logs})", flush=True)
            break  # the producers' state is no longer trustworthy
    return passed, failed


def main_cluster(args: argparse.Namespace, seed: int, base: Path, cfg: Path) -> int:
    rng = random.Random(seed)
    partitions = max(CLUSTER_PARTITIONS_MIN, args.nodes)
    cluster = LocalCluster(base / "cluster", args.nodes, config=cfg)
    t0 = time.monotonic()
    producers: list[Producer] = []
    tally = ClusterTally(dict.fromkeys(cluster.nodes, 0), dict.fromkeys(cluster.nodes, 0),
                         dict.fromkeys(ROLES, 0))
    try:
        cluster.start()
        producers = cluster_producers(cluster, args.batch, partitions)
        for p in producers:
            p.start()
        replay = (f"scripts/crashtest --cluster --nodes {args.nodes} --seed {seed} "
                  f"--kill {args.kill} --batches {args.batches} --batch {args.batch}")
        passed, failed = run_trials(
            args.trials, rng,
            lambda trial_seed: run_cluster_trial(cluster, producers, trial_seed, args.kill,
                                                 args.batches, partitions, tally),
            replay, f"member logs: {cluster.root}/node-*.log")
    finally:
        for p in producers:
            p.stop()
        cluster.stop()
    acked = sum(len(p.ledger.acked) for p in producers)
    resent = sum(p.resent for p in producers)
    print(f"{tally.line()}; {acked} records acknowledged; {resent} requests refused or "
          f"unanswered and sent again; {time.monotonic() - t0:.0f} s in all")
    if not failed and args.data_dir is None:
        shutil.rmtree(base)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/crashtest", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None, help="default: a random seed (printed)")
    ap.add_argument("--kill", default="any", choices=[*ROLES, "any", "node"],
                    help="what to SIGKILL in each trial")
    ap.add_argument("--batches", type=int, default=10, help="batches per producer per trial")
    ap.add_argument("--batch", type=int, default=20, help="records per batch")
    ap.add_argument("--data-dir", type=Path, default=None, help="default: a fresh temp dir")
    ap.add_argument("--txn", action="store_true",
                    help="add transactional producers and a reader (node/txncheck.py), and "
                         "kills during commits and between prepare and commit")
    ap.add_argument("--txns", type=int, default=8,
                    help="with --txn: transactions per transactional producer per trial")
    ap.add_argument("--kv", action="store_true",
                    help="add key/value writers (node/kvcheck.py): namespaces created and "
                         "dropped during the run, puts, deletes, compare-and-sets and KV "
                         "transactions checked against what was acknowledged; and kills just "
                         "after a namespace's creation or a KV commit is sent")
    ap.add_argument("--kv-steps", type=int, default=30,
                    help="with --kv: steps (writes, transactions) per writer per trial")
    ap.add_argument("--cluster", action="store_true",
                    help="run a local cluster, with routed producers, and kill a random "
                         "member or an actor of one")
    ap.add_argument("--nodes", type=int, default=3, help="with --cluster: members")
    args = ap.parse_args(argv)
    if args.cluster and args.txn:
        ap.error("--txn does not run with --cluster (a transaction stays on one member)")
    if args.cluster and args.kv:
        ap.error("--kv does not run with --cluster")
    if args.nodes < 2:
        ap.error("--nodes must be at least 2")
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    print(f"crashtest seed {seed}, {args.trials} trials, kill {args.kill}"
          f"{', with transactions' if args.txn else ''}"
          f"{', with key/value writers' if args.kv else ''}"
          f"{f', a cluster of {args.nodes} nodes' if args.cluster else ''}", flush=True)
    # A directory of our own, removed only when every trial passed: a failure keeps the
    # evidence (a TemporaryDirectory would delete it anyway once garbage-collected).
    base = args.data_dir or Path(tempfile.mkdtemp(prefix="crashtest-"))
    base.mkdir(parents=True, exist_ok=True)
    cfg = base / "crashtest.toml"
    cfg.write_text(CONFIG)
    if args.cluster:
        return main_cluster(args, seed, base, cfg)
    rng = random.Random(seed)
    node = LocalNode(base / "data", config=cfg, log_file=base / "node.log").start()
    with node.client() as c:
        c.create_topic(TOPIC, partitions=PARTITIONS)
    producers = [Producer(node.endpoint, TOPIC, f"p{i}", args.batch,
                          i if i < PARTITIONS - 1 else None, batches_max=0) for i in range(3)]
    # ... and one sending single-record requests, PIPELINED_IN_FLIGHT at once, to any partition.
    producers.append(PipelinedProducer(node.endpoint, TOPIC, "q", PIPELINED_IN_FLIGHT, None,
                                       batches_max=0))
    side = start_txn_side(node, args.batch, args.txns, rng) if args.txn else None
    kv = start_kv_side(node, args.kv_steps, rng) if args.kv else None
    if side is not None:
        producers.append(side.plain)
    for p in producers:
        p.start()
    replay = (f"scripts/crashtest --seed {seed} --kill {args.kill} --batches {args.batches} "
              f"--batch {args.batch}" + (f" --txn --txns {args.txns}" if args.txn else "")
              + (f" --kv --kv-steps {args.kv_steps}" if args.kv else ""))
    try:
        passed, failed = run_trials(
            args.trials, rng,
            lambda trial_seed: run_trial(node, producers, trial_seed, args.kill, args.batches,
                                         side, kv),
            replay, f"node log: {node.log_file}")
    finally:
        for p in [*producers, *([] if side is None else side.producers)]:
            p.stop()
        if side is not None:
            for tp in side.producers:
                tp.release()
            side.reader.stop()
        for w in [] if kv is None else kv.writers:
            w.stop()
            w.release()
        if node.proc is not None:
            node.stop()
    if not failed and args.data_dir is None:
        shutil.rmtree(base)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
