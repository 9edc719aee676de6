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

# The spark scenario (issue 12): one SparkSession, local[SPARK_PARTITIONS], writes the same
# cached DataFrame of --spark-rows values of --size bytes (SPARK_PARTITIONS partitions, so a
# task per core) through the shardnode sink (both guarantees), to Parquet files and to a
# bare ZeroMQ PULL socket; then reads the topic back through the source against the Parquet
# files. Runs only when named: it needs Java, and Spark's JVM takes about 1 GB and 10-30 s
# to start (not counted).
SPARK = "spark"
CLUSTER = "cluster"
LARGE_VALUES = "large-values"
LARGE_WAYS = ("chunks", "blob_files")  # [storage] large_values of the scenario's two nodes
LARGE_SIZES = (1 << 20, 10 << 20)      # value bytes: 1 MiB and 10 MiB
LARGE_TOTAL_BYTES = 200 << 20          # written by each run of each (way, size): 200 MiB
LARGE_QUICK_BYTES = 10 << 20           # ... with --quick (one 10 MiB value; ten of 1 MiB)
# The kv scenario (issue 14): K keys prefilled (untimed), then gets, puts and CAS one at a
# time, and gets, puts and read_by_key with --concurrency in flight, beside Redis GET, SET,
# WATCH/GET/MULTI/SET/EXEC and HGET (``appendfsync always``). Runs only when named: 12 timed
# runs of --seconds and an untimed prefill (about 2 min with Redis here).
KV = "kv"
STORAGE = "storage"  # memory topics against RocksDB topics, the node only (run when named)
GET = "get"
PUT = "put"
CAS = "cas"
READ_BY_KEY = "read_by_key"
KV_ONE_OVER_REDIS_MIN = 1.0   # goals: kv_get and read_by_key one at a time over Redis', ...
KV_MANY_OVER_REDIS_MIN = 1.5  # ... with --concurrency in flight, ...
KV_PUT_OVER_REDIS_MIN = 2.0   # ... kv_put in flight over SET with AOF always, ...
KV_CAS_OVER_REDIS_MIN = 1.0   # ... and kv_cas over WATCH/MULTI/EXEC
KV_PREFILL_IN_FLIGHT = 256    # the untimed prefill's puts in flight
CLUSTER_SIZES = (1, 2, 3)   # members of the clusters the cluster scenario starts
ROUTED = "routed"           # cluster: each request to its partition's owner
FORWARDED = "forwarded"     # cluster: every request to member 1, which forwards the rest
PARQUET = "parquet"
BARE_ZMQ = "zmq-pull"       # a bare ZeroMQ PULL socket: a Python data source, nothing durable
SINK = "sink"
SOURCE = "source"
EXACTLY_ONCE = "exactly_once"    # node/spark/options.py's names of the sink's guarantees
AT_LEAST_ONCE = "at_least_once"
SPARK_CPU = ("node", "jvm", "py", "bench")  # a run's CPU: the node, Spark's JVM and Python
                                            # workers, the bench (driver, drain thread)
SPARK_PARTITIONS = 2        # local[2] on this 2-CPU machine; the topics have as many
SPARK_WARMUP_ROWS = 100_000  # each system writes (and reads) this many first, untimed: a
                             # first read of 10 000 left the next read of 1 000 000 at half speed
SPARK_FRAME_RECORDS = 5000  # the bare socket's records per frame: the sink's
                            # maxRecordsPerRequest default, so both pack alike
SPARK_RUN_TIMEOUT_S = 600.0  # one write or read; past it the bench cancels Spark's jobs
SPARK_SEND_TIMEOUT_MS = 30_000  # a bare socket task's frame must be queued within this
SPARK_LINGER_MS = 30_000    # ... and its queued frames delivered within this at close
SPARK_DRAIN_POLL_MS = 100   # the drain thread looks for its stop signal this often
SPARK_SINK_MIN = 500_000    # goals: sink rows/s, ...
SPARK_OVER_PARQUET_MIN = 1.0  # ... over Parquet's, ...
SPARK_OF_BARE_MIN = 0.5     # ... over the bare socket's, ...
SPARK_EO_COST_MAX = 1.3     # ... and exactly_once's time per row over at_least_once's


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
    spark_rows: int = 1_000_000
    peers: frozenset[str] = frozenset({REDIS, FLOOR, DISK})
    install: bool = True
    quick: bool = False

    def __post_init__(self) -> None:
        assert self.producers >= 1 and self.batch >= 1 and self.concurrency >= 1
        assert self.size >= KEY_BYTES, "values carry their key number: at least 16 bytes"
        assert self.seconds > 0 and self.repeat >= 1 and self.recovery_mb >= 1
        assert self.read_records >= self.batch and self.keys >= 1
        assert self.spark_rows >= SPARK_PARTITIONS


QUICK = {"seconds": 0.5, "repeat": 1, "read_records": 20_000, "keys": 2_000, "recovery_mb": 4,
         "spark_rows": 20_000}
