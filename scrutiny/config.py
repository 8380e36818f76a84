"""Settings of every component, from one config file (YAML or TOML), environment and flags.

The file's top level holds the cluster and scan settings (every command reads them); each other
component has its own section: `auditor`, `statsd`, `agent`. An unknown section or key is refused with
a message naming it. Precedence: flags, then environment variables (`SCRUTINY_<KEY>` for the top level,
`SCRUTINY_<SECTION>_<KEY>` in a section), then the file, then defaults.
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
from scrutiny.errors import ConfigError, MetadataError
from scrutiny.metadata import parse_host_port, parse_metadata_service_uri
from scrutiny.pulsar.scope import is_scope

DEFAULT_AGENT_PORT = 3191
DEFAULT_AUDITOR_PORT = 3192


@dataclass(frozen=True)
class ClusterSettings:
    """Where the cluster's metadata lives and how to reach it (one policy for every component)."""

    metadata_service_uri: str = ""
    zk_max_in_flight: int = 256
    zk_multi_read: str = "auto"  # ZooKeeper 3.6+ read-only multi: auto (probe once) | on | off
    zk_session_timeout: float = 30.0
    zk_connect_timeout: float = 15.0
    zk_retry_deadline: float = 60.0  # how long a read retries across connection loss before giving up
    zk_auth_file: str = ""  # "user:password" for ZooKeeper digest authentication
    zk_tls_ca: str = ""  # ZooKeeper client TLS (3.5+ secureClientPort)
    zk_tls_cert: str = ""
    zk_tls_key: str = ""
    # Pulsar's metadata store on etcd (metadata-store:etcd:http://host:2379,...)
    etcd_timeout: float = 10.0  # seconds one request may take before it is retried (on the next endpoint)
    etcd_retry_deadline: float = 60.0
    etcd_connect_timeout: float = 15.0  # seconds to reach some endpoint at the start (a scan, a daemon's attempt)
    etcd_lease_ttl: int = 30  # seconds: the lease (etcd's session) of the agents' keys and the election
    etcd_auth_file: str = ""  # "user:password" for etcd's authentication
    etcd_tls_ca: str = ""  # etcd client TLS (an https:// endpoint, or these)
    etcd_tls_cert: str = ""
    etcd_tls_key: str = ""


@dataclass(frozen=True)
class ScanSettings(ClusterSettings):
    # bookie agents
    bookie_endpoints: dict[str, str] = field(default_factory=dict)
    agent_default_port: int = DEFAULT_AGENT_PORT
    bookie_deadline_seconds: float = 30.0
    # The delayed look's deadline: an overloaded agent gets longer before it counts as silent (0: 3x the first).
    bookie_recheck_deadline_seconds: float = 0.0
    bookie_ledgers_per_call: int = 1000
    bookie_calls_per_bookie: int = 2
    bookie_streaming: bool = True
    bookie_max_message_bytes: int = 64 * 1024 * 1024
    bookie_tls_ca: str = ""  # verify the agents' certificates (TLS); empty: plaintext
    bookie_tls_cert: str = ""  # this client's certificate, for agents that require mutual TLS
    bookie_tls_key: str = ""
    # durability policy: a ledger below these is WEAK_DURABILITY_POLICY (Kafka: replication factor, min ISR)
    min_write_quorum: int = 2
    min_ack_quorum: int = 2
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
    blast_radius: bool = True  # full runs: per bookie and rack, what would fall below AQ were it down
    # the reverse check (whole-cluster runs): ledgers the bookies hold that the metadata does not have
    orphan_check: bool = True
    orphan_grace_period: int = 3600  # seconds seen held and absent before ORPHAN_LEDGER (> gcWaitTime)
    # Pulsar's record (managed ledgers, cursors, schemas) against BookKeeper's, whole-cluster and topic runs
    pulsar_check: bool = True
    pulsar_metadata_uri: str = ""  # Pulsar's metadata store (brokers' metadataStoreUrl) where it is not BookKeeper's
    leaked_ledger_grace_period: int = 3600  # seconds a Pulsar ledger is unnamed (by ctime) before LEAKED_LEDGER
    # BookKeeper's auditorLedgerVerificationPercentage, as the cluster runs with it: which losses its
    # autorecovery can see (each finding's remedy says)
    auditor_ledger_verification_percentage: int = 0
    # a bookie gone from the registrations: its ledgers must be marked under-replicated after this long
    lost_bookie_check: bool = True
    lost_bookie_recovery_delay: int = 0  # BookKeeper's lostBookieRecoveryDelay, where the store keeps none
    lost_bookie_grace_period: int = 300  # beyond it: BookKeeper's auditor indexes every ledger, then marks
    # deep scrub: the stored bytes read and verified by the agents (DbLedgerStorage)
    deep: bool = False
    deep_slices: int = 1  # a deep pass in this many slices of the ledgers; a run verifies one
    deep_slice: int = 0  # which slice this run verifies (0 .. deep_slices - 1)
    deep_ledgers_per_call: int = 20
    deep_deadline_seconds: float = 900.0  # one deep call reads at the agent's byte-rate limit
    deep_send_passwords: bool = False  # HMAC ledgers: send their passwords (agents over TLS only)
    # scope and output
    ledgers: tuple[int, ...] = ()
    topics: tuple[str, ...] = ()  # Pulsar topics (persistent://tenant/ns/name): their data, cursor, compacted ledgers
    tenants: tuple[str, ...] = ()  # Pulsar tenants: every topic of theirs, as `topics`
    namespaces: tuple[str, ...] = ()  # Pulsar namespaces (tenant/ns): every topic of theirs, as `topics`
    format: str = "text"
    output: str = ""
    # engine
    engine: str = "spark"
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = field(default_factory=dict)  # e.g. spark.archives for a packed venv

    def placement(self) -> PlacementPolicy:
        return PlacementPolicy(self.placement_policy, self.min_racks_per_write_quorum, self.enforce_min_racks,
                               self.min_zones_per_write_quorum, self.desired_zones_per_write_quorum,
                               self.min_regions_for_durability)

    @property
    def recheck_deadline(self) -> float:
        """Seconds a delayed look gives each agent call."""
        return self.bookie_recheck_deadline_seconds or 3 * self.bookie_deadline_seconds

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
            (self.orphan_grace_period >= 0, "orphan_grace_period", "0 or more seconds"),
            (self.leaked_ledger_grace_period >= 0, "leaked_ledger_grace_period", "0 or more seconds"),
            (0 <= self.auditor_ledger_verification_percentage <= 100, "auditor_ledger_verification_percentage",
             "0 .. 100, as BookKeeper's auditorLedgerVerificationPercentage"),
            (self.lost_bookie_recovery_delay >= 0, "lost_bookie_recovery_delay", "0 or more seconds"),
            (self.lost_bookie_grace_period >= 0, "lost_bookie_grace_period", "0 or more seconds"),
            (self.bookie_deadline_seconds > 0, "bookie_deadline_seconds", "more than 0"),
            (self.bookie_recheck_deadline_seconds == 0 or self.bookie_recheck_deadline_seconds
             >= self.bookie_deadline_seconds, "bookie_recheck_deadline_seconds",
             "0 (three times bookie_deadline_seconds) or at least bookie_deadline_seconds"),
            (0 < self.bookie_ledgers_per_call <= 100_000, "bookie_ledgers_per_call", "1..100000"),
            (self.bookie_calls_per_bookie >= 1, "bookie_calls_per_bookie", "at least 1"),
            (self.min_write_quorum >= 1, "min_write_quorum", "at least 1 (1: no ledger is too weak)"),
            (self.min_ack_quorum >= 1, "min_ack_quorum", "at least 1 (1: no ledger is too weak)"),
            (self.zk_max_in_flight >= 1, "zk_max_in_flight", "at least 1"),
            (self.zk_multi_read in ("auto", "on", "off"), "zk_multi_read", "auto, on or off"),
            (self.etcd_timeout > 0, "etcd_timeout", "more than 0 seconds"),
            (self.etcd_connect_timeout > 0, "etcd_connect_timeout", "more than 0 seconds"),
            (self.etcd_lease_ttl >= 2, "etcd_lease_ttl", "at least 2 seconds"),
            (self.deep_slices >= 1, "deep_slices", "at least 1"),
            (0 <= self.deep_slice < self.deep_slices, "deep_slice", f"0 .. {self.deep_slices - 1} (deep_slices - 1)"),
            (0 < self.deep_ledgers_per_call <= 10_000, "deep_ledgers_per_call", "1..10000"),
            (self.deep_deadline_seconds > 0, "deep_deadline_seconds", "positive seconds"),
            (not self.deep_send_passwords or bool(self.bookie_tls_ca), "deep_send_passwords",
             "only with TLS to the agents (bookie_tls_ca)"),
            (self.verify_rounds >= 1, "verify_rounds", "at least 1"),
            (all(i >= 0 for i in self.ledgers), "ledgers", "non-negative ledger ids"),
            (all(t.startswith("persistent://") for t in self.topics), "topics", "persistent://tenant/namespace/name"),
            (all(is_scope(t, "tenant") for t in self.tenants), "tenants", "a tenant's name (no /)"),
            (all(is_scope(n, "namespace") for n in self.namespaces), "namespaces", "tenant/namespace"),
        ]
        for ok, key, want in checks:
            if not ok:
                raise ConfigError(f"{key}: {getattr(self, key)!r} is not valid; expected {want}")
        if self.pulsar_metadata_uri:
            try:
                parse_metadata_service_uri(self.pulsar_metadata_uri)
            except MetadataError as exc:
                raise ConfigError(f"pulsar_metadata_uri: {exc}") from None
        for bookie, address in self.bookie_endpoints.items():
            if not bookie:
                raise ConfigError(f"bookie_endpoints: {bookie}={address} is not BOOKIE_ID=HOST:PORT")
            parse_host_port(address, f"bookie_endpoints: {bookie}", ConfigError)
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
            item = typing.get_args(hint)[0]
            return tuple(_coerce(key, item, v, where) for v in value)
    except (TypeError, ValueError) as exc:
        quote = " (YAML reads off, on, yes and no unquoted as booleans: quote it)" if isinstance(value, bool) else ""
        raise ConfigError(f"{where}: key {key!r}: {value!r} is not a valid {_describe(hint)} ({exc}){quote}") \
            from None
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


@dataclass(frozen=True)
class AuditorSettings:
    """The `auditor` section."""

    listen: str = f"0.0.0.0:{DEFAULT_AUDITOR_PORT}"
    advertise_address: str = ""  # how other instances and clients reach this one (default: listen)
    full_interval_seconds: float = 86400.0  # 0 = no periodic full run
    underreplication_interval_seconds: float = 900.0  # 0 = no periodic age check
    deep_interval_seconds: float = 0.0  # 0 = no deep scrub; else a deep run (one slice of a pass) this often
    deep_pass_days: float = 7.0  # every ledger's stored bytes verified once in this many days
    run_when_replication_disabled: bool = False
    reports_dir: str = "/var/lib/scrutiny/reports"
    reports_keep: int = 50  # per kind
    election_path: str = ""  # default: <scrutiny path>/auditor/election
    max_rescan_ledgers: int = 10_000
    max_queued_runs: int = 8
    rescan_wait_seconds: float = 3600.0  # the longest a Rescan call waits for its report
    shutdown_grace_seconds: float = 30.0
    json_logs: bool = False
    token_file: str = ""  # a bearer token for Rescan (and GetStatus with status_requires_auth)
    tls_cert: str = ""  # serve the RPC over TLS
    tls_key: str = ""
    tls_client_ca: str = ""  # mutual TLS: clients need a certificate from this CA; such a client may Rescan
    insecure_open_rescan: bool = False  # let anyone who reaches the port Rescan (test setups only)
    status_requires_auth: bool = False
    # continuous scrutiny (the leader): the agents' and the store's change feeds, checked in batches
    continuous: bool = True
    continuous_batch_seconds: float = 10.0  # at most one look at what the feeds named this often (at once when idle)
    continuous_max_ledgers_per_second: float = 2000.0  # beyond it (a rack lost): a full run instead
    # with the deep scrub on: a look at a topic also scrubs its ledgers closed since its messages' checkpoint
    continuous_validate_messages: bool = True
    # the hand-off to BookKeeper's autorecovery (`scrutiny.repair`): off, dry-run (list what it would mark), mark
    repair: str = "off"
    repair_interval_seconds: float = 10.0  # a hand-off of the current findings this often (the leader)
    repair_marks_per_run: int = 20
    repair_marks_per_minute: int = 60
    repair_deadline_seconds: float = 600.0  # a mark it wrote still there this long is noted (and followed on)

    def validate(self) -> AuditorSettings:
        parse_host_port(self.listen, "auditor.listen", ConfigError)
        if self.continuous_batch_seconds <= 0 or self.continuous_max_ledgers_per_second <= 0:
            raise ConfigError("auditor.continuous_batch_seconds and continuous_max_ledgers_per_second: more than 0")
        for key in ("full_interval_seconds", "underreplication_interval_seconds", "deep_interval_seconds",
                    "shutdown_grace_seconds"):
            if getattr(self, key) < 0:
                raise ConfigError(f"auditor.{key}: must not be negative")
        if self.repair not in ("off", "dry-run", "mark"):
            raise ConfigError(f"auditor.repair: {self.repair!r}: off, dry-run or mark")
        if self.repair_interval_seconds <= 0 or self.repair_deadline_seconds <= 0:
            raise ConfigError("auditor.repair_interval_seconds and repair_deadline_seconds: more than 0")
        for key in ("reports_keep", "max_rescan_ledgers", "max_queued_runs", "repair_marks_per_run",
                    "repair_marks_per_minute"):
            if getattr(self, key) < 1:
                raise ConfigError(f"auditor.{key}: must be at least 1")
        if self.deep_interval_seconds and not 0 < self.deep_interval_seconds <= self.deep_pass_days * 86400:
            raise ConfigError("auditor.deep_pass_days: must be positive and at least one deep_interval_seconds")
        if self.token_file and not Path(self.token_file).is_file():
            raise ConfigError(f"auditor.token_file: {self.token_file} is not a readable file")
        if not (self.token_file or self.tls_client_ca or self.insecure_open_rescan):
            raise ConfigError("auditor: Rescan needs authentication: set token_file or tls_client_ca "
                              "(or insecure_open_rescan: true, for a test setup)")
        return self


@dataclass(frozen=True)
class StatsdSettings:
    """The `statsd` section: where the auditor sends its counters, gauges and timers."""

    host: str = ""  # empty: no StatsD
    port: int = 8125
    prefix: str = "scrutiny"

    def validate(self) -> StatsdSettings:
        if not 0 < self.port < 65536:
            raise ConfigError(f"statsd.port: {self.port} is not a port")
        return self


@dataclass(frozen=True)
class MetricsSettings:
    """The `metrics` section: where this process (auditor or agent) serves Prometheus' /metrics."""

    listen: str = ""  # e.g. 0.0.0.0:9192 on an auditor, 0.0.0.0:9191 beside a bookie; empty: off (never :8000)

    def validate(self) -> MetricsSettings:
        if self.listen:
            _, port = parse_host_port(self.listen, "metrics.listen", ConfigError)
            if port == 8000:
                raise ConfigError("metrics.listen: port 8000 is BookKeeper's own Prometheus port on a bookie")
        return self


@dataclass(frozen=True)
class AgentSettings:
    """The `agent` section: one bookie agent (`scrutiny bookie-agent`)."""

    bookie_id: str = ""  # the bookie this agent answers for (host:port)
    source: str = ""  # dbledgerstorage | bridge | synthetic
    bind: str = f"0.0.0.0:{DEFAULT_AGENT_PORT}"
    advertise_address: str = ""  # registered in the metadata store (default: the bind address)
    register: bool = True  # register in the metadata store when metadata_service_uri is set
    ledger_dirs: tuple[str, ...] = ()  # dbledgerstorage: every ledger directory (its entry logs, and its indexes)
    index_dirs: tuple[str, ...] = ()  # dbledgerstorage: the bookie's indexDirectories, one per ledger directory
    scratch_dir: str = ""  # dbledgerstorage: where the read-only views are made
    bookie_address: str = ""  # bridge: host:port of the stock bookie (v3 protocol)
    synthetic_file: str = ""  # synthetic: this bookie's store file
    workers: int = 8
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    deep_bytes_per_second: float = 32 * 1024 * 1024  # deep scrub: entry-log bytes read per second, all calls
    entries_per_second: float = 0  # the CPU budget: index entries listed per second, all calls (0: none)
    index_cache_bytes: int = 32 * 1024 * 1024  # dbledgerstorage: the agent's block cache, every index together
    unary_catch_up_seconds: float = 0.2  # BP-34's one-ledger call catches up with the bookie at most this often
    stop_grace_seconds: float = 5.0  # after SIGTERM, calls still running get this long (a second signal: none)
    watch_interval_seconds: float = 5.0  # look at the bookie for changes this often (WatchHoldings; 0: never)

    def validate(self) -> AgentSettings:
        """What every agent's settings must say; what its source needs is its kind's to say
        (`scrutiny.entrysources.kinds`)."""
        if not self.bookie_id:
            raise ConfigError("agent.bookie_id is required (the bookie's id, host:port)")
        parse_host_port(self.bind, "agent.bind", ConfigError)
        if self.index_dirs and len(self.index_dirs) != len(self.ledger_dirs):
            raise ConfigError(f"agent.index_dirs: {len(self.index_dirs)} for {len(self.ledger_dirs)} ledger "
                              "directories (the bookie pairs indexDirectories with ledgerDirectories, one to one, "
                              "in order)")
        if self.workers < 1:
            raise ConfigError("agent.workers: must be at least 1")
        if self.deep_bytes_per_second <= 0:
            raise ConfigError("agent.deep_bytes_per_second: must be positive (bytes per second)")
        if self.watch_interval_seconds < 0:
            raise ConfigError("agent.watch_interval_seconds: 0 (never) or more seconds")
        if not 0 <= self.stop_grace_seconds <= 300:
            raise ConfigError("agent.stop_grace_seconds: 0 .. 300 (seconds)")
        if self.index_cache_bytes < 1 << 20:
            raise ConfigError("agent.index_cache_bytes: at least 1 MiB (1048576)")
        if self.entries_per_second < 0:
            raise ConfigError("agent.entries_per_second: must not be negative (0: no limit)")
        if self.unary_catch_up_seconds < 0:
            raise ConfigError("agent.unary_catch_up_seconds: must not be negative (0: at every call)")
        return self


# The sections of the one config file, each a component's settings; the top level is ScanSettings.
SECTIONS: dict[str, type] = {"auditor": AuditorSettings, "statsd": StatsdSettings, "metrics": MetricsSettings,
                             "agent": AgentSettings}


def build(cls: type[S], file_values: Mapping[str, Any], flag_values: Mapping[str, Any],
          where: str = "config", env: Mapping[str, str] | None = None, section: str | None = None) -> S:
    """Settings of dataclass `cls` from a config mapping, environment and flags (flags win)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    source = file_values.get(section, {}) if section else file_values
    if source is None:
        source = {}
    if not isinstance(source, Mapping):
        raise ConfigError(f"{where}: section {section!r} must be a mapping")
    label = f"{section}." if section else ""
    for raw_key, value in source.items():
        if section is None and raw_key in SECTIONS:
            continue
        key = str(raw_key).replace("-", "_")
        if key not in names:
            if section is None and isinstance(value, Mapping):
                raise ConfigError(f"{where}: unknown section {raw_key!r} (sections: {', '.join(SECTIONS)})")
            raise ConfigError(f"{where}: unknown key {label + str(raw_key)!r}")
        values[key] = _coerce(key, hints[key], value, where)
    env_prefix = f"SCRUTINY_{section.upper()}_" if section else "SCRUTINY_"
    for key in names:
        env_value = (env if env is not None else os.environ).get(env_prefix + key.upper())
        if env_value is not None:
            values[key] = _coerce(key, hints[key], env_value, f"environment {env_prefix + key.upper()}")
    for key, value in flag_values.items():
        if value is not None:
            values[key] = _coerce(key, hints[key], value, "command line")
    return cls(**values)
