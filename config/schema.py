"""The configuration schema and its loader.

The dataclasses say which keys exist and their types; ``defaults.toml`` says their values
(a test keeps the two in step). ``load_config`` overlays a user's TOML file and command-line
overrides on the defaults, rejects unknown keys and wrong types by name, and checks the
relations between values, saying why each one must hold.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from config.cluster import Member

CHECKPOINT_MODES = ("fuzzy", "blocking")
LARGE_VALUES = ("chunks", "blob_files")  # how a shard keeps values over storage.inline_bytes_max
CHUNK_BYTES_LIMIT = 64 * 1024 * 1024  # a chunk is one RocksDB value, written in one batch
GROUP_BYTES_LIMIT = 48 * 1024 * 1024  # a group travels between actors as one frame (wire.codec)
LOOPBACK_NAMES = ("localhost",)  # besides the loopback addresses (127.0.0.0/8, ::1)
# Actors report their figures, their heartbeat, about once a second (actors/base.py
# TICK_S; a test keeps the two in step). An actor silent for less than two reports may
# only be late: the supervisor would kill it, and each restart of it again, in a loop.
ACTOR_REPORT_INTERVAL_MS = 1000
HEARTBEAT_TIMEOUT_MS_MIN = 2 * ACTOR_REPORT_INTERVAL_MS


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the reason."""


@dataclass(frozen=True)
class NodeSection:
    host: str
    port: int
    data_dir: str
    writers: int


@dataclass(frozen=True)
class LimitsConfig:
    frame_bytes_max: int
    batch_records_max: int
    value_bytes_max: int
    read_records_max: int
    read_bytes_max: int
    shards_max: int
    partitions_max: int
    pending_requests_max: int
    request_timeout_ms: int
    mailbox_messages_max: int
    group_bytes_queued_max: int
    kv_cache_bytes_max: int


@dataclass(frozen=True)
class LogConfig:
    segment_bytes_max: int
    group_bytes_max: int
    group_requests_max: int
    group_wait_us_max: int
    producers_max: int
    producer_window_max: int
    producer_entries_max: int
    checkpoint_bytes: int
    checkpoint_mode: str
    checkpoint_timeout_ms: int
    snapshot_timeout_ms: int


@dataclass(frozen=True)
class TxnConfig:
    held_requests_max: int
    open_max: int
    records_max: int
    bytes_max: int
    timeout_ms: int
    timeout_ms_max: int
    outcomes_max: int


@dataclass(frozen=True)
class ShardsConfig:
    memtable_bytes_max: int
    block_cache_bytes: int
    write_buffer_bytes: int
    writer_nice: int
    held_bytes_max: int


@dataclass(frozen=True)
class StorageConfig:
    inline_bytes_max: int
    chunk_bytes: int
    large_values: str
    memory_bytes_max: int


@dataclass(frozen=True)
class CacheConfig:
    bytes_max: int


@dataclass(frozen=True)
class SupervisorConfig:
    restarts_max: int
    restart_window_s: int
    stop_timeout_ms: int
    heartbeat_timeout_ms: int


@dataclass(frozen=True)
class ClusterConfig:
    file: str
    node_id: int
    catalog_sync_ms: int
    forwards_max: int


@dataclass(frozen=True)
class SecurityConfig:
    curve_secret_key_file: str
    curve_allowed_keys_dir: str


@dataclass(frozen=True)
class NodeConfig:
    node: NodeSection
    limits: LimitsConfig
    log: LogConfig
    txn: TxnConfig
    shards: ShardsConfig
    storage: StorageConfig
    cache: CacheConfig
    supervisor: SupervisorConfig
    cluster: ClusterConfig
    security: SecurityConfig

    @functools.cached_property
    def data_path(self) -> Path:
        # Resolved once: a path walk of system calls, and the log manager asks at every
        # group commit (its crash seam); 6 % of its samples under transactions.
        return Path(self.node.data_dir).resolve()

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.node.host}:{self.node.port}"

    @property
    def members(self) -> tuple[Member, ...]:
        """The cluster's members (the cluster file's), or () for a single node."""
        from config.cluster import read_cluster

        return read_cluster(self.cluster.file) if self.cluster.file else ()

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


_SECTION_TYPES: dict[str, type] = {
    "node": NodeSection,
    "limits": LimitsConfig,
    "log": LogConfig,
    "txn": TxnConfig,
    "shards": ShardsConfig,
    "storage": StorageConfig,
    "cache": CacheConfig,
    "supervisor": SupervisorConfig,
    "cluster": ClusterConfig,
    "security": SecurityConfig,
}


def default_table() -> dict[str, dict[str, Any]]:
    """The parsed ``defaults.toml``."""
    text = resources.files("config").joinpath("defaults.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _overlay(base: dict[str, dict[str, Any]], top: dict[str, Any], where: str) -> None:
    for section, values in top.items():
        if section not in _SECTION_TYPES:
            raise ConfigError(f"{where}: unknown section [{section}]; known: {sorted(_SECTION_TYPES)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: [{section}] must be a table")
        for key, value in values.items():
            if key not in base[section]:
                raise ConfigError(
                    f"{where}: unknown key {section}.{key}; known: {sorted(base[section])}")
            base[section][key] = value


def _build(table: dict[str, dict[str, Any]]) -> NodeConfig:
    sections = {}
    for name, cls in _SECTION_TYPES.items():
        values = table[name]
        for f in dataclasses.fields(cls):
            want = {"int": int, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            value = values[f.name]
            if type(value) is not want:
                raise ConfigError(
                    f"{name}.{f.name} must be {want.__name__}, got {type(value).__name__} {value!r}")
        sections[name] = cls(**values)
    return NodeConfig(**sections)


# wait 0: no extra wait; nice 0: writers at normal priority; node id 0: a single node
_MAY_BE_ZERO = {"group_wait_us_max", "writer_nice", "node_id"}


def _positive(cfg: NodeConfig) -> None:
    for section in dataclasses.fields(cfg):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            value = getattr(getattr(cfg, section.name), f.name)
            if isinstance(value, int) and value <= 0 and f.name not in _MAY_BE_ZERO:
                raise ConfigError(f"{section.name}.{f.name} must be positive, got {value}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name or an interface (ZeroMQ takes both): not known to be loopback
        return False


def _check_host(host: str) -> None:
    """An IPv4 address or a name (or an interface): the front door's endpoint is
    ``tcp://HOST:PORT``, and its socket does not take IPv6."""
    try:
        ipv6 = ipaddress.ip_address(host.strip("[]")).version == 6
    except ValueError:
        ipv6 = False
    if ipv6:
        raise ConfigError(f"node.host = {host!r}: IPv6 addresses are not supported; use an "
                          f"IPv4 address (127.0.0.1 for this machine only) or a host name")
    if ":" in host:  # no name, IPv4 address or interface has one
        raise ConfigError(f"node.host = {host!r} is not a host: give an IPv4 address or a "
                          f"host name (the port is node.port)")


def _check_security(cfg: NodeConfig) -> None:
    """The files themselves are read at start (``actors/curve.py``): they may change
    between a load and a start."""
    sec, host = cfg.security, cfg.node.host
    if not sec.curve_secret_key_file and not is_loopback(host):
        raise ConfigError(
            f"node.host = {host!r}: listening on {host} requires CURVE: set "
            "security.curve_secret_key_file (the node's secret key) and "
            "security.curve_allowed_keys_dir (the clients' public keys); `shardnode keygen` "
            "makes the keys")
    if sec.curve_secret_key_file and not sec.curve_allowed_keys_dir:
        raise ConfigError("security.curve_allowed_keys_dir must be set when "
                          "security.curve_secret_key_file is: with CURVE on, only the clients "
                          "whose public keys are in that directory may connect")
    if sec.curve_allowed_keys_dir and not sec.curve_secret_key_file:
        raise ConfigError("security.curve_allowed_keys_dir is set but CURVE is off: set "
                          "security.curve_secret_key_file too, or clear it")


def validate(cfg: NodeConfig) -> None:
    """Check each value and the relations between them; raise ``ConfigError`` naming the key."""
    if not 1 <= cfg.node.port <= 65535:
        # Not 0 (any free port) either: clients and the CLI find a node by its port, and a
        # front door that restarts must bind the same one again.
        raise ConfigError(f"node.port must be 1-65535, got {cfg.node.port}")
    _check_host(cfg.node.host)
    if not cfg.node.data_dir:
        raise ConfigError('node.data_dir must not be empty: name a directory ("." for the '
                          'current one)')
    _positive(cfg)
    if cfg.supervisor.heartbeat_timeout_ms < HEARTBEAT_TIMEOUT_MS_MIN:
        raise ConfigError(f"supervisor.heartbeat_timeout_ms must be at least "
                          f"{HEARTBEAT_TIMEOUT_MS_MIN} (two of the reports actors send about "
                          f"every {ACTOR_REPORT_INTERVAL_MS} ms), got "
                          f"{cfg.supervisor.heartbeat_timeout_ms}: an actor silent for less "
                          f"may only be late, and would be killed and restarted in a loop")
    for section, name in (("log", "group_wait_us_max"), ("shards", "writer_nice"),
                          ("cluster", "node_id")):
        if getattr(getattr(cfg, section), name) < 0:
            raise ConfigError(f"{section}.{name} must not be negative")
    if cfg.shards.writer_nice > 19:
        raise ConfigError(f"shards.writer_nice must be 0-19, got {cfg.shards.writer_nice}")
    if cfg.node.writers > 64:
        raise ConfigError(f"node.writers must be at most 64, got {cfg.node.writers}")
    lim, log = cfg.limits, cfg.log
    if lim.value_bytes_max >= lim.frame_bytes_max:
        raise ConfigError("limits.value_bytes_max must be below limits.frame_bytes_max: "
                          "a record has to fit in a request")
    if lim.frame_bytes_max > log.group_bytes_max:
        raise ConfigError("limits.frame_bytes_max must not exceed log.group_bytes_max: "
                          "one request has to fit in one group commit")
    if log.group_bytes_max > GROUP_BYTES_LIMIT:
        raise ConfigError(f"log.group_bytes_max must be at most {GROUP_BYTES_LIMIT}: a group "
                          f"travels to the cache manager and writers as one internal message")
    if lim.read_bytes_max > GROUP_BYTES_LIMIT:
        raise ConfigError(f"limits.read_bytes_max must be at most {GROUP_BYTES_LIMIT}: a read's "
                          f"answer travels as one internal message")
    if lim.group_bytes_queued_max < log.group_bytes_max:
        raise ConfigError("limits.group_bytes_queued_max must be at least log.group_bytes_max: "
                          f"{lim.group_bytes_queued_max} < {log.group_bytes_max}")
    if log.group_bytes_max > log.segment_bytes_max:
        raise ConfigError("log.group_bytes_max must not exceed log.segment_bytes_max: "
                          "a group commit is written to one segment")
    if log.group_wait_us_max > 100_000:
        raise ConfigError("log.group_wait_us_max must be at most 100000 (0.1 s): "
                          "a longer window only adds latency")
    if lim.read_records_max > lim.batch_records_max * 100:
        raise ConfigError("limits.read_records_max is unreasonably large")
    if log.producer_entries_max < log.producer_window_max:
        raise ConfigError("log.producer_entries_max must hold at least one full window of "
                          f"log.producer_window_max: {log.producer_entries_max} < "
                          f"{log.producer_window_max}")
    if log.checkpoint_mode not in CHECKPOINT_MODES:
        raise ConfigError(f"log.checkpoint_mode must be one of {CHECKPOINT_MODES}, "
                          f"got {log.checkpoint_mode!r}")
    if log.checkpoint_bytes < log.group_bytes_max:
        raise ConfigError("log.checkpoint_bytes must be at least log.group_bytes_max: "
                          "otherwise every group commit would start a checkpoint")
    if cfg.shards.write_buffer_bytes * 2 > cfg.shards.memtable_bytes_max:
        raise ConfigError("shards.memtable_bytes_max must hold at least two of "
                          "shards.write_buffer_bytes: one memtable fills while another flushes")
    txn = cfg.txn
    if txn.timeout_ms > txn.timeout_ms_max:
        raise ConfigError(f"txn.timeout_ms must not exceed txn.timeout_ms_max: "
                          f"{txn.timeout_ms} > {txn.timeout_ms_max}")
    if txn.records_max < lim.batch_records_max:
        raise ConfigError("txn.records_max must hold at least one batch of "
                          f"limits.batch_records_max: {txn.records_max} < {lim.batch_records_max}")
    if txn.bytes_max < lim.frame_bytes_max:
        raise ConfigError("txn.bytes_max must hold at least one request of "
                          f"limits.frame_bytes_max: {txn.bytes_max} < {lim.frame_bytes_max}")
    if cfg.cache.bytes_max < lim.value_bytes_max:
        raise ConfigError("cache.bytes_max must hold at least one record of limits.value_bytes_max")
    _check_storage(cfg)
    _check_security(cfg)
    _validate_cluster(cfg)


def _check_storage(cfg: NodeConfig) -> None:
    st = cfg.storage
    if st.large_values not in LARGE_VALUES:
        raise ConfigError(f"storage.large_values must be one of {LARGE_VALUES}, "
                          f"got {st.large_values!r}")
    if st.chunk_bytes > CHUNK_BYTES_LIMIT:
        raise ConfigError(f"storage.chunk_bytes must be at most {CHUNK_BYTES_LIMIT}: "
                          f"got {st.chunk_bytes}")


def _validate_cluster(cfg: NodeConfig) -> None:
    cl = cfg.cluster
    if not cl.file:
        if cl.node_id:
            raise ConfigError("cluster.node_id is set but cluster.file is not")
        return
    me = {m.id: m for m in cfg.members}.get(cl.node_id)
    if me is None:
        raise ConfigError(f"cluster.node_id {cl.node_id} is not a member of {cl.file} "
                          f"(members: {[m.id for m in cfg.members]})")
    if (me.host, me.port) != (cfg.node.host, cfg.node.port):
        raise ConfigError(f"node {me.id} listens on {cfg.endpoint}, but the cluster file "
                          f"{cl.file} gives its endpoint as {me.endpoint}")


def load_config(path: str | Path | None = None,
                overrides: dict[str, dict[str, Any]] | None = None) -> NodeConfig:
    """Defaults, then the TOML file at ``path``, then ``overrides``; validated."""
    table = default_table()
    if path is not None:
        p = Path(path)
        try:
            user = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {p} is not UTF-8 text: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {p} cannot be read: {exc.strerror}") from None
        _overlay(table, user, str(p))
    if overrides:
        _overlay(table, overrides, "command line")
    cfg = _build(table)
    validate(cfg)
    return cfg


def from_dict(table: dict[str, dict[str, Any]]) -> NodeConfig:
    """Rebuild a config sent to a child process (already validated by the parent)."""
    return _build(table)
