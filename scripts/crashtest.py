"""scripts/crashtest: SIGKILL actors or the whole node at random moments and check the data.

Producers with idempotent retries write to a node; each trial lets them write, kills a
random actor (or the one named, or the whole node) at a random moment, waits for the node
to serve again, lets the producers finish the trial's batches, then checks that every
acknowledged record is present exactly once at its acknowledged offset, that offsets are
contiguous and that nothing appears that was never sent. It prints its seed, one line per
failed trial with how to replay it, and last ``N passed, N failed``.
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
from pathlib import Path

from node.client import NodeClient
from node.crashcheck import PIPELINED_IN_FLIGHT, CheckFailed, PipelinedProducer, Producer, check
from node.local import LocalNode
from wire.errors import NodeError

TOPIC = "crashtest"
PARTITIONS = 3
ROLES = ["log", "txn", "cache", "writer-0", "writer-1", "front"]
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


def run_trial(node: LocalNode, producers: list[Producer], trial_seed: int, kill: str,
              batches: int) -> str:
    """One trial; returns what was killed."""
    rng = random.Random(trial_seed)
    target = rng.choice([*ROLES, "node"]) if kill == "any" else kill
    for p in producers:
        p.allow(batches)
    if rng.random() < 0.5:
        # Kill inside a checkpoint, too: ask for one just before the kill.
        threading.Thread(target=request_checkpoint, args=(node,), daemon=True).start()
    # The random moment: some time after the producers resumed, while they write.
    threading.Event().wait(rng.uniform(0.0, 0.3))  # ok-sleep: choosing when to kill
    if target == "node":
        node.kill()
        node.start()
    else:
        pid = node.kill_actor(target)

        def restarted() -> bool:
            try:
                return node.actor_pid(target) != pid and serving(node)
            except (NodeError, KeyError):
                return False

        wait_until(f"{target} to restart", restarted, 60)
    wait_until("producers to finish the trial", lambda: all(p.idle() for p in producers), 180)
    for p in producers:
        if p.error is not None:
            raise CheckFailed(f"producer {p.tag} failed: {p.error!r}")
    with node.client() as c:
        check(c, TOPIC, PARTITIONS, [p.ledger for p in producers])
        checkpoints = c.status()["log"].get("checkpoints", 0)
    return f"{target} (checkpoints so far in this log manager: {checkpoints})"


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
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    print(f"crashtest seed {seed}, {args.trials} trials, kill {args.kill}", flush=True)
    rng = random.Random(seed)
    # A directory of our own, removed only when every trial passed: a failure keeps the
    # evidence (a TemporaryDirectory would delete it anyway once garbage-collected).
    base = args.data_dir or Path(tempfile.mkdtemp(prefix="crashtest-"))
    base.mkdir(parents=True, exist_ok=True)
    cfg = base / "crashtest.toml"
    cfg.write_text(CONFIG)
    node = LocalNode(base / "data", config=cfg, log_file=base / "node.log").start()
    with node.client() as c:
        c.create_topic(TOPIC, partitions=PARTITIONS)
    producers = [Producer(node.endpoint, TOPIC, f"p{i}", args.batch,
                          i if i < PARTITIONS - 1 else None, batches_max=0) for i in range(3)]
    # ... and one sending single-record requests, PIPELINED_IN_FLIGHT at once, to any partition.
    producers.append(PipelinedProducer(node.endpoint, TOPIC, "q", PIPELINED_IN_FLIGHT, None,
                                       batches_max=0))
    for p in producers:
        p.start()
    passed = failed = 0
    try:
        for t in range(args.trials):
            trial_seed = rng.getrandbits(32)
            t0 = time.monotonic()
            try:
                target = run_trial(node, producers, trial_seed, args.kill, args.batches)
                passed += 1
                print(f"trial {t}: killed {target}, ok ({time.monotonic() - t0:.1f} s)",
                      flush=True)
            except (CheckFailed, TimeoutError) as exc:
                failed += 1
                print(f"FAILED trial {t} (trial seed {trial_seed}): {exc}\n"
                      f"  replay: scripts/crashtest --trials {t + 1} --seed {seed} "
                      f"--kill {args.kill}   (node log: {node.log_file})", flush=True)
                break  # the producers' state is no longer trustworthy
    finally:
        for p in producers:
            p.stop()
        if node.proc is not None:
            node.stop()
    if not failed and args.data_dir is None:
        shutil.rmtree(base)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
