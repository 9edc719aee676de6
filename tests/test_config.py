"""Unit tests of the configuration: defaults and schema in step, loading, validation."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest

from config import ConfigError, NodeConfig, load_config
from config.schema import (
    _MAY_BE_ZERO,
    ACTOR_REPORT_INTERVAL_MS,
    HEARTBEAT_TIMEOUT_MS_MIN,
    default_table,
    validate,
)

DEFAULTS_FILE = Path(__file__).resolve().parent.parent / "config" / "defaults.toml"


def defaults_text_table() -> dict[str, dict[str, Any]]:
    """``defaults.toml`` read straight from the source tree, not through the loader."""
    return tomllib.loads(DEFAULTS_FILE.read_text(encoding="utf-8"))


def schema() -> dict[str, dict[str, type]]:
    """Section → key → type, from the dataclasses alone."""
    out = {}
    sections = typing.get_type_hints(NodeConfig)
    for f in dataclasses.fields(NodeConfig):
        cls = sections[f.name]
        hints = typing.get_type_hints(cls)
        out[f.name] = {g.name: hints[g.name] for g in dataclasses.fields(cls)}
    return out


def write(tmp_path: Path, text: str, name: str = "node.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _with(cfg: NodeConfig, section: str, **values: Any) -> NodeConfig:
    changed = dataclasses.replace(getattr(cfg, section), **values)
    return dataclasses.replace(cfg, **{section: changed})


# ---- defaults and schema in step -------------------------------------------------------


def test_every_default_has_a_schema_field_and_every_field_a_default() -> None:
    defaults = defaults_text_table()
    fields = schema()
    assert set(defaults) == set(fields), "sections differ between defaults.toml and schema.py"
    for section in fields:
        in_defaults = set(defaults[section])
        in_schema = set(fields[section])
        assert in_defaults - in_schema == set(), f"[{section}] keys with no schema field"
        assert in_schema - in_defaults == set(), f"[{section}] schema fields with no default"


def test_every_default_has_the_type_its_field_declares() -> None:
    defaults = defaults_text_table()
    for section, keys in schema().items():
        for key, tp in keys.items():
            assert type(defaults[section][key]) is tp, f"{section}.{key}"


def test_the_packaged_defaults_are_the_source_file() -> None:
    assert default_table() == defaults_text_table()


def test_the_defaults_load_and_validate() -> None:
    cfg = load_config()
    defaults = defaults_text_table()
    assert cfg.to_dict() == defaults
    validate(cfg)  # does not raise


def test_what_clients_take_for_the_default_frame_limit_is_the_default() -> None:
    from wire.protocol import NODE_FRAME_BYTES_MAX_DEFAULT  # a client's hint, without config

    assert load_config().limits.frame_bytes_max == NODE_FRAME_BYTES_MAX_DEFAULT


def test_defaults_listen_on_loopback() -> None:
    assert load_config().node.host == "127.0.0.1"


# ---- loading a file ------------------------------------------------------------------------


def test_a_file_overrides_values_and_keeps_the_other_defaults(tmp_path: Path) -> None:
    defaults = defaults_text_table()
    new_port = defaults["node"]["port"] + 11
    new_writers = defaults["node"]["writers"] + 1
    new_bytes = defaults["cache"]["bytes_max"] * 2
    path = write(tmp_path, f"""
[node]
port = {new_port}
writers = {new_writers}
data_dir = "{tmp_path / 'data'}"

[cache]
bytes_max = {new_bytes}
""")
    cfg = load_config(path)
    assert cfg.node.port == new_port
    assert cfg.node.writers == new_writers
    assert cfg.node.data_dir == str(tmp_path / "data")
    assert cfg.cache.bytes_max == new_bytes
    assert cfg.node.host == defaults["node"]["host"]
    assert cfg.log.segment_bytes_max == defaults["log"]["segment_bytes_max"]
    assert cfg.data_path == (tmp_path / "data").resolve()
    assert cfg.endpoint == f"tcp://{defaults['node']['host']}:{new_port}"


def test_overrides_apply_after_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[node]\nport = 8001\nwriters = 3\n")
    cfg = load_config(path, overrides={"node": {"port": 8002}})
    assert (cfg.node.port, cfg.node.writers) == (8002, 3)


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")).to_dict() == defaults_text_table()


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.node.port = 1  # type: ignore[misc]  # assigning a frozen field, on purpose


# ---- errors that name the key ------------------------------------------------------------


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return str(info.value)


def test_an_unknown_section_is_named(tmp_path: Path) -> None:
    msg = _error(tmp_path, "[nodes]\nport = 1\n")
    assert "[nodes]" in msg and "unknown section" in msg
    assert "node.toml" in msg  # says which file


def test_an_unknown_key_is_named(tmp_path: Path) -> None:
    msg = _error(tmp_path, "[log]\nsegment_bytes = 1000\n")
    assert "log.segment_bytes" in msg and "unknown key" in msg


def test_a_section_that_is_not_a_table_is_named(tmp_path: Path) -> None:
    msg = _error(tmp_path, "cache = 5\n")
    assert "[cache]" in msg


def test_unknown_keys_in_overrides_are_named() -> None:
    with pytest.raises(ConfigError, match=r"cache\.size"):
        load_config(overrides={"cache": {"size": 1}})
    with pytest.raises(ConfigError, match=r"\[caches\]"):
        load_config(overrides={"caches": {"bytes_max": 1}})


def _wrong_type_for(tp: type) -> list[Any]:
    if tp is int:
        return ['"10"', "1.5", "true", "[1]"]
    if tp is str:
        return ["5", "true", '["x"]']
    raise AssertionError(tp)


@pytest.mark.parametrize(
    ("section", "key"),
    [(s, k) for s, keys in schema().items() for k in keys],
)
def test_a_wrong_type_is_named(tmp_path: Path, section: str, key: str) -> None:
    tp = schema()[section][key]
    for wrong in _wrong_type_for(tp):
        msg = _error(tmp_path, f"[{section}]\n{key} = {wrong}\n")
        assert f"{section}.{key}" in msg, wrong
        assert tp.__name__ in msg


@pytest.mark.parametrize(
    ("section", "key"),
    [(s, k) for s, keys in schema().items() for k, tp in keys.items()
     if tp is int and k not in _MAY_BE_ZERO and k != "port"],  # port: its range, below
)
def test_a_non_positive_value_is_named(tmp_path: Path, section: str, key: str) -> None:
    for bad in (0, -1):
        msg = _error(tmp_path, f"[{section}]\n{key} = {bad}\n")
        assert f"{section}.{key}" in msg
        assert "positive" in msg


@pytest.mark.parametrize("port", [-1, 0, 65536, 100000])
def test_a_port_out_of_range_is_named(tmp_path: Path, port: int) -> None:
    """0 too: a front door that restarts must bind its port again, where clients find it."""
    msg = _error(tmp_path, f"[node]\nport = {port}\n")
    assert f"node.port must be 1-65535, got {port}" in msg


@pytest.mark.parametrize("port", [1, 65535])
def test_ports_in_range_are_accepted(tmp_path: Path, port: int) -> None:
    assert load_config(write(tmp_path, f"[node]\nport = {port}\n")).node.port == port


@pytest.mark.parametrize("host", ["::1", "[::1]", "fe80::1", "::ffff:127.0.0.1"])
def test_an_ipv6_host_is_refused(tmp_path: Path, host: str) -> None:
    """It passed, and the front door then failed to bind with a ZMQError traceback."""
    msg = _error(tmp_path, f'[node]\nhost = "{host}"\n')
    assert f"node.host = {host!r}: IPv6 addresses are not supported" in msg, msg
    assert "use an IPv4 address" in msg and "or a host name" in msg, msg


def test_a_host_with_a_port_in_it_is_refused(tmp_path: Path) -> None:
    msg = _error(tmp_path, '[node]\nhost = "localhost:7400"\n')
    assert "node.host = 'localhost:7400' is not a host" in msg and "node.port" in msg, msg


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost"])
def test_ipv4_hosts_and_names_are_accepted(tmp_path: Path, host: str) -> None:
    assert load_config(write(tmp_path, f'[node]\nhost = "{host}"\n')).node.host == host


def test_an_empty_data_dir_is_refused(tmp_path: Path) -> None:
    """It was taken as the current directory."""
    msg = _error(tmp_path, '[node]\ndata_dir = ""\n')
    assert "node.data_dir must not be empty" in msg, msg
    with pytest.raises(ConfigError, match=r"node\.data_dir"):
        load_config(overrides={"node": {"data_dir": ""}})  # `start --data-dir ""`


@pytest.mark.parametrize("timeout_ms", [1, HEARTBEAT_TIMEOUT_MS_MIN - 1])
def test_a_heartbeat_timeout_shorter_than_two_reports_is_refused(
        tmp_path: Path, timeout_ms: int) -> None:
    """1 ms was accepted, and the supervisor killed its actors in a loop."""
    msg = _error(tmp_path, f"[supervisor]\nheartbeat_timeout_ms = {timeout_ms}\n")
    assert (f"supervisor.heartbeat_timeout_ms must be at least {HEARTBEAT_TIMEOUT_MS_MIN}"
            in msg and f"got {timeout_ms}" in msg), msg


def test_the_heartbeat_bound_is_two_of_the_actors_reports() -> None:
    from actors.base import TICK_S  # how often an actor reports (its heartbeat)

    assert ACTOR_REPORT_INTERVAL_MS == TICK_S * 1000
    assert HEARTBEAT_TIMEOUT_MS_MIN == 2 * ACTOR_REPORT_INTERVAL_MS
    ok = load_config(overrides={"supervisor": {"heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS_MIN}})
    assert ok.supervisor.heartbeat_timeout_ms == HEARTBEAT_TIMEOUT_MS_MIN


# Each relation check in config.schema.validate: a config that breaks only that relation,
# built from the defaults, and the keys its message must name.
def _relations() -> list[tuple[str, dict[str, dict[str, int]], list[str]]]:
    d = defaults_text_table()
    lim, log = d["limits"], d["log"]
    return [
        ("writers-max", {"node": {"writers": 65}}, ["node.writers"]),
        ("value-fits-frame",
         {"limits": {"value_bytes_max": lim["frame_bytes_max"]}},
         ["limits.value_bytes_max", "limits.frame_bytes_max"]),
        ("frame-fits-group",
         {"limits": {"frame_bytes_max": log["group_bytes_max"] + 1}},
         ["limits.frame_bytes_max", "log.group_bytes_max"]),
        ("queue-holds-a-group",
         {"limits": {"group_bytes_queued_max": log["group_bytes_max"] - 1}},
         ["limits.group_bytes_queued_max", "log.group_bytes_max"]),
        ("group-fits-segment",
         {"log": {"segment_bytes_max": log["group_bytes_max"] - 1}},
         ["log.group_bytes_max", "log.segment_bytes_max"]),
        ("group-wait-max", {"log": {"group_wait_us_max": 100_001}}, ["log.group_wait_us_max"]),
        ("entries-hold-a-window",
         {"log": {"producer_entries_max": log["producer_window_max"] - 1}},
         ["log.producer_entries_max", "log.producer_window_max"]),
        ("read-records-max",
         {"limits": {"read_records_max": lim["batch_records_max"] * 100 + 1}},
         ["limits.read_records_max"]),
        ("cache-holds-a-value",
         {"cache": {"bytes_max": lim["value_bytes_max"] - 1}},
         ["cache.bytes_max", "limits.value_bytes_max"]),
    ]


RELATIONS = _relations()


@pytest.mark.parametrize(("name", "overrides", "keys"), RELATIONS, ids=[r[0] for r in RELATIONS])
def test_each_relation_is_checked_and_names_its_keys(
        tmp_path: Path, name: str, overrides: dict[str, dict[str, int]], keys: list[str]) -> None:
    text = "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in vals.items())
                   for s, vals in overrides.items())
    msg = _error(tmp_path, text)
    for key in keys:
        assert key in msg, (name, msg)


@pytest.mark.parametrize(("name", "overrides", "keys"), RELATIONS, ids=[r[0] for r in RELATIONS])
def test_validate_checks_each_relation_on_a_built_config(
        name: str, overrides: dict[str, dict[str, int]], keys: list[str]) -> None:
    cfg = load_config()
    for section, values in overrides.items():
        cfg = _with(cfg, section, **values)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert keys[0] in str(info.value)


def test_values_at_the_edge_of_each_relation_are_accepted() -> None:
    d = defaults_text_table()
    lim = d["limits"]
    ok = load_config(overrides={
        "node": {"writers": 64},
        "limits": {"value_bytes_max": lim["frame_bytes_max"] - 1,
                   "read_records_max": lim["batch_records_max"] * 100,
                   "group_bytes_queued_max": lim["frame_bytes_max"]},
        "log": {"group_bytes_max": lim["frame_bytes_max"],
                "segment_bytes_max": lim["frame_bytes_max"],
                "group_wait_us_max": 100_000},
        "cache": {"bytes_max": lim["frame_bytes_max"] - 1},
    })
    assert ok.log.group_bytes_max == ok.log.segment_bytes_max == ok.limits.frame_bytes_max
    assert ok.limits.group_bytes_queued_max == ok.log.group_bytes_max
    assert ok.cache.bytes_max == ok.limits.value_bytes_max


# ---- files that cannot be read -----------------------------------------------------------


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)


@pytest.mark.parametrize("text",
                         ["[node\nport = 1\n", "port = = 2\n", "[node]\nport = 1\nport = 2\n"],
                         ids=["unclosed-section", "double-equals", "duplicate-key"])
def test_invalid_toml_says_so(tmp_path: Path, text: str) -> None:
    msg = _error(tmp_path, text)
    assert "not valid TOML" in msg
    assert "node.toml" in msg


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    p = tmp_path / "latin1.toml"
    p.write_bytes('[node]\nhost = "h\xf4te"\n'.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert str(p) in str(info.value)


@pytest.mark.parametrize("key", sorted(_MAY_BE_ZERO))
def test_keys_that_may_be_zero_still_refuse_negatives(tmp_path: Path, key: str) -> None:
    section = {"port": "node", "group_wait_us_max": "log", "writer_nice": "shards",
               "node_id": "cluster"}[key]
    load_config(overrides={section: {key: 0}})
    assert key in _error(tmp_path, f"[{section}]\n{key} = -1\n")
