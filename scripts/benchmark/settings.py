"""The bench's settings: limits, units, system names and the run's ``Settings``."""

from __future__ import annotations

from dataclasses import dataclass

MB = 1_000_000
MIB = 1 << 20
KEY_BYTES = 16  # b"key-%012d"

START_TIMEOUT_S = 60.0      # a client process has this long to connect and line up
DRAIN_TIMEOUT_S = 15.0      # after its time is up, a client waits this long for answers
PREFILL_TIMEOUT_S = 600.0   # an untimed fill (prefill, recovery fill) must end by then
SERVE_TIMEOUT_S = 300.0     # a restarted server must serve the last record by then
RSS_INTERVAL_S = 0.5
DISK_SEQ_BYTES_MAX = 1 << 30  # the sequential-write probe stops after 1 GiB

SHARDNODE = "shardnode"
REDIS = "redis"
RABBITMQ = "rabbitmq"
FLOOR = "floor"
DISK = "disk"

# The checkpoint scenario: paced producers at CKPT_LOAD of the node's batched capacity (in
# batches of CKPT_BATCH records, so there are many acknowledgements to classify) while a
# client runs checkpoints back to back, CKPT_GAP_S apart.
CKPT_MODES = ("fuzzy", "blocking")
CKPT_BATCH = 100
CKPT_LOAD = 0.5
CKPT_GAP_S = 0.5
CKPT_SECONDS_PER = 4        # the timed run is this many times --seconds (full: 20 s) ...
CKPT_SECONDS_MIN = 2.0      # ... and at least this long (quick: this long)
CKPT_CAPACITY_S_MAX = 2.0   # the capacity probe runs min(--seconds, this)
CKPT_IN_FLIGHT_MAX = 1000   # a paced producer's requests in flight (a blocking checkpoint
                            # holds them); under the client Pipeline's own bound of 1 024
CKPT_LATE_S = 0.005         # a send this far behind its schedule counts as late
CKPT_GOAL = 2.0             # fuzzy: p99 inside at most this many times p99 outside
CKPT_TIMEOUT_MS = 120_000   # one checkpoint request
CKPT_BYTES = 1 << 40        # checkpoint_bytes of the scenario's nodes: no automatic checkpoint
INSIDE = "inside"
OUTSIDE = "outside"

# The txn scenario (issue 11): P producers, one transaction at a time each, of TXN_SIZES
# records (begin, one produce_batch, commit), against the same records produced without a
# transaction, and Redis MULTI / XADD x n / EXEC. Goals for transactions of TXN_GOAL_SIZE.
TXN = "txn"
TXN_SIZES = (100, 1)
TXN_GOAL_SIZE = 100
TXN_COST_MAX = 1.5          # a transaction's time per record at most this many times the batch's
TXN_OVER_REDIS_MIN = 2.0    # transactions/s at least this many times Redis MULTI/EXEC's
TXN_OPS = ("begin", "produce", "commit")  # a node transaction's round trips, timed apart


@dataclass(frozen=True, slots=True)
class Settings:
    scenarios: tuple[str, ...]
    producers: int = 4
    batch: int = 1000
    size: int = 100
    concurrency: int = 64
    seconds: float = 5.0
    repeat: int = 1
    read_records: int = 1_000_000
    keys: int = 200_000
    recovery_mb: int = 256
    peers: frozenset[str] = frozenset({REDIS, FLOOR, DISK})
    install: bool = True
    quick: bool = False

    def __post_init__(self) -> None:
        assert self.producers >= 1 and self.batch >= 1 and self.concurrency >= 1
        assert self.size >= KEY_BYTES, "values carry their key number: at least 16 bytes"
        assert self.seconds > 0 and self.repeat >= 1 and self.recovery_mb >= 1
        assert self.read_records >= self.batch and self.keys >= 1


QUICK = {"seconds": 0.5, "repeat": 1, "read_records": 20_000, "keys": 2_000, "recovery_mb": 4}
