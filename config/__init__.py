"""Typed configuration: frozen dataclasses, defaults in ``defaults.toml``, validation."""

from config.schema import (
    CacheConfig,
    ConfigError,
    LimitsConfig,
    LogConfig,
    NodeConfig,
    NodeSection,
    SecurityConfig,
    ShardsConfig,
    StorageConfig,
    SupervisorConfig,
    TxnConfig,
    load_config,
)

__all__ = [
    "CacheConfig",
    "ConfigError",
    "LimitsConfig",
    "LogConfig",
    "NodeConfig",
    "NodeSection",
    "SecurityConfig",
    "ShardsConfig",
    "StorageConfig",
    "SupervisorConfig",
    "TxnConfig",
    "load_config",
]
