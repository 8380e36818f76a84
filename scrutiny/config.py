"""Settings of a scrutiny run, from a config file (YAML or TOML), environment and flags.

Precedence: flags, then environment variables (`SCRUTINY_<KEY>`), then the file, then defaults.
Every bad key or value is refused with a message that names it.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from scrutiny.checks import PlacementPolicy


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ScanSettings:
    metadata_service_uri: str = ""
    # bookie agents
    bookie_endpoints: dict[str, str] = field(default_factory=dict)
    agent_default_port: int = 3191
    bookie_deadline_seconds: float = 30.0
    bookie_ledgers_per_call: int = 1000
    bookie_calls_per_bookie: int = 2
    bookie_streaming: bool = True
    bookie_max_message_bytes: int = 64 * 1024 * 1024
    bookie_tls_ca: str = ""  # verify the agents' certificates (TLS); empty: plaintext
    bookie_tls_cert: str = ""  # this client's certificate, for agents that require mutual TLS
    bookie_tls_key: str = ""
    # placement (BookKeeper's names in the README)
    placement_policy: str = "rackaware"
    min_racks_per_write_quorum: int = 2
    enforce_min_racks: bool = False
    min_zones_per_write_quorum: int = 2
    desired_zones_per_write_quorum: int = 3
    min_regions_for_durability: int = 2
    racks: dict[str, str] = field(default_factory=dict)
    racks_znode: str = ""  # default: `bookies` beside the ledgers root (Pulsar's /bookies)
    # under-replication and re-checks
    underreplicated_grace_period: int = 0
    recheck_delay: float = 10.0
    write_cache_grace_seconds: float = 0.0
    verify_rounds: int = 3
    # scope and output
    ledgers: tuple[int, ...] = ()
    format: str = "text"
    output: str = ""
    # engine
    engine: str = "spark"
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = field(default_factory=dict)  # e.g. spark.archives for a packed venv
    zk_max_in_flight: int = 256
    zk_session_timeout: float = 30.0
    zk_connect_timeout: float = 15.0
    zk_retry_deadline: float = 60.0  # how long a read retries across connection loss before giving up
    zk_auth_file: str = ""  # "user:password" for ZooKeeper digest authentication
    zk_tls_ca: str = ""  # ZooKeeper client TLS (3.5+ secureClientPort)
    zk_tls_cert: str = ""
    zk_tls_key: str = ""

    def placement(self) -> PlacementPolicy:
        return PlacementPolicy(self.placement_policy, self.min_racks_per_write_quorum, self.enforce_min_racks,
                               self.min_zones_per_write_quorum, self.desired_zones_per_write_quorum,
                               self.min_regions_for_durability)

    def validate(self) -> ScanSettings:
        if not self.metadata_service_uri:
            raise ConfigError("metadata_service_uri is required (e.g. zk+hierarchical://127.0.0.1:2181/ledgers)")
        checks = [
            (self.placement_policy in PlacementPolicy.KINDS, "placement_policy",
             f"one of {', '.join(PlacementPolicy.KINDS)}"),
            (self.format in ("text", "json"), "format", "text or json"),
            (self.engine in ("spark", "local"), "engine", "spark or local"),
            (self.min_racks_per_write_quorum >= 1, "min_racks_per_write_quorum", "at least 1"),
            (self.underreplicated_grace_period >= 0, "underreplicated_grace_period", "0 (off) or more seconds"),
            (self.recheck_delay >= 0, "recheck_delay", "0 or more seconds"),
            (self.bookie_deadline_seconds > 0, "bookie_deadline_seconds", "more than 0"),
            (0 < self.bookie_ledgers_per_call <= 100_000, "bookie_ledgers_per_call", "1..100000"),
            (self.bookie_calls_per_bookie >= 1, "bookie_calls_per_bookie", "at least 1"),
            (self.zk_max_in_flight >= 1, "zk_max_in_flight", "at least 1"),
            (self.verify_rounds >= 1, "verify_rounds", "at least 1"),
            (all(i >= 0 for i in self.ledgers), "ledgers", "non-negative ledger ids"),
        ]
        for ok, key, want in checks:
            if not ok:
                raise ConfigError(f"{key}: {getattr(self, key)!r} is not valid; expected {want}")
        for bookie, address in self.bookie_endpoints.items():
            host, _, port = address.rpartition(":")
            if not bookie or not host or not port.isdigit():
                raise ConfigError(f"bookie_endpoints: {bookie}={address} is not BOOKIE_ID=HOST:PORT")
        for bookie, rack in self.racks.items():
            if not bookie or not rack.startswith("/"):
                raise ConfigError(f"racks: {bookie}={rack} is not BOOKIE_ID=/LOCATION")
        return self


S = TypeVar("S")


def _coerce(key: str, hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    try:
        if hint is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if not isinstance(value, bool):
                raise TypeError(type(value).__name__)
            return value
        if hint is int:
            if isinstance(value, bool | float):
                raise TypeError(type(value).__name__)
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise TypeError("bool")
            return float(value)
        if hint is str:
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise TypeError(type(value).__name__)
            return str(value)
        if origin is dict:
            if isinstance(value, str):
                value = dict(item.split("=", 1) for item in value.split(",") if item)
            if not isinstance(value, Mapping):
                raise TypeError(type(value).__name__)
            return {str(k): str(v) for k, v in value.items()}
        if origin is tuple:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v]
            if not isinstance(value, list | tuple):
                raise TypeError(type(value).__name__)
            return tuple(_coerce(key, int, v, where) for v in value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: key {key!r}: {value!r} is not a valid {_describe(hint)} ({exc})") from None
    raise ConfigError(f"{where}: key {key!r} has an unsupported type")


def _describe(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    if isinstance(hint, types.GenericAlias):
        return str(hint)
    return repr(hint)


def read_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        doc = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        what = " ".join(str(exc).split())  # one line: operators grep stderr
        raise ConfigError(f"config file {p} is not valid {'TOML' if p.suffix == '.toml' else 'YAML'}: {what}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {p}: expected a mapping of keys, got {type(doc).__name__}")
    return doc


# Sections of the one config file that belong to other commands (the scan reads the top level).
SECTIONS = ("auditor", "agent", "statsd")


def build(cls: type[S], file_values: Mapping[str, Any], flag_values: Mapping[str, Any],
          where: str = "config", env: Mapping[str, str] | None = None, env_prefix: str = "SCRUTINY_",
          section: str | None = None) -> S:
    """Settings of dataclass `cls` from a config mapping, environment and flags (flags win)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    source = file_values.get(section, {}) if section else file_values
    if section and not isinstance(source, Mapping):
        raise ConfigError(f"{where}: section {section!r} must be a mapping")
    for raw_key, value in source.items():
        if section is None and raw_key in SECTIONS:
            continue
        key = str(raw_key).replace("-", "_")
        if key not in names:
            raise ConfigError(f"{where}: unknown key {raw_key!r}")
        values[key] = _coerce(key, hints[key], value, where)
    for key in names:
        env_value = (env if env is not None else os.environ).get(env_prefix + key.upper())
        if env_value is not None:
            values[key] = _coerce(key, hints[key], env_value, f"environment {env_prefix + key.upper()}")
    for key, value in flag_values.items():
        if value is not None:
            values[key] = _coerce(key, hints[key], value, "command line")
    return cls(**values)
