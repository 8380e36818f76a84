"""`scrutiny bookie-agent`: the agent's settings (flags, file, environment), its entry source, its server and its
registration, wired together; the composition root of the agent's process."""

from __future__ import annotations

import argparse

from scrutiny.agent.server import BookieAgent
from scrutiny.config import AgentSettings, MetricsSettings, ScanSettings, build, read_config_file
from scrutiny.daemon import Signals
from scrutiny.entrysources.kinds import SOURCES, checked, open_source
from scrutiny.errors import ConfigError
from scrutiny.metadata import parse_host_port
from scrutiny.store import MetadataStore, open_store
from scrutiny.tls import server_credentials


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bookie-agent", help="serve scrutiny.v1.Bookie next to one bookie")
    p.add_argument("--config", help="settings file: the cluster at the top level, an `agent` section")
    p.add_argument("--bookie-id", help="the bookie this agent answers for (host:port)")
    p.add_argument("--bind", default=None, help="listen address (default 0.0.0.0:3191)")
    p.add_argument("--advertise-address", help="address registered in the metadata store (default: the bind address)")
    p.add_argument("--source", choices=list(SOURCES))
    p.add_argument("--ledger-dir", action="append", default=None, dest="ledger_dirs",
                   help="dbledgerstorage: a ledger directory (repeatable; all are read)")
    p.add_argument("--index-dir", action="append", default=None, dest="index_dirs",
                   help="dbledgerstorage: the bookie's index directory of each --ledger-dir, in order, when it sets "
                   "indexDirectories")
    p.add_argument("--scratch-dir", help="dbledgerstorage: where the read-only views are made")
    p.add_argument("--bookie-address", help="bridge: host:port of the stock bookie (v3 protocol)")
    p.add_argument("--synthetic-file", help="synthetic: the store file of this bookie")
    p.add_argument("--metadata-service-uri", help="register the agent in this cluster's metadata store")
    p.add_argument("--zk-auth-file", help="ZooKeeper digest credentials (user:password) for the registration")
    p.add_argument("--tls-cert", help="serve over TLS with this certificate (PEM)")
    p.add_argument("--tls-key", help="... and its key")
    p.add_argument("--tls-client-ca", help="mutual TLS: callers need a certificate signed by this CA")
    p.add_argument("--workers", type=int)
    p.add_argument("--deep-bytes-per-second", type=float,
                   help="deep scrub: entry-log bytes read per second, all calls together (default 32 MiB)")
    p.add_argument("--entries-per-second", type=float,
                   help="the CPU budget: index entries listed per second, all calls together (default 0: no limit)")
    p.add_argument("--metrics-listen", help="serve Prometheus' /metrics here, e.g. 0.0.0.0:9191 (not :8000)")
    p.add_argument("--watch-interval-seconds", type=float,
                   help="look at the bookie for changes this often (WatchHoldings; default 5; 0: never)")
    p.add_argument("--stop-grace-seconds", type=float,
                   help="after SIGTERM, calls still running get this long (default 5); a second signal: none")
    p.add_argument("--log-level", default="INFO")


def settings(args: argparse.Namespace) -> tuple[ScanSettings, AgentSettings, MetricsSettings]:
    file_values = read_config_file(args.config) if args.config else {}
    where = args.config or "config"
    cluster = build(ScanSettings, file_values, {"metadata_service_uri": args.metadata_service_uri,
                                                "zk_auth_file": args.zk_auth_file}, where=where)
    flags = {k: getattr(args, k, None) for k in AgentSettings.__dataclass_fields__}
    for dirs in ("ledger_dirs", "index_dirs"):
        flags[dirs] = tuple(getattr(args, dirs)) if getattr(args, dirs) else None
    metrics = build(MetricsSettings, file_values, {"listen": args.metrics_listen}, where=where, section="metrics")
    return cluster, checked(build(AgentSettings, file_values, flags, where=where, section="agent").validate()), \
        metrics.validate()


def run(args: argparse.Namespace) -> int:
    cluster, s, metrics = settings(args)
    source = open_source(s)
    creds = server_credentials(s.tls_cert, s.tls_key, s.tls_client_ca)
    signals = Signals()  # before it starts: a stop asked once it says it listens is a clean stop
    agent = BookieAgent(source, bind=s.bind, workers=s.workers, credentials=creds,
                        deep_bytes_per_second=s.deep_bytes_per_second, entries_per_second=s.entries_per_second,
                        unary_catch_up_seconds=s.unary_catch_up_seconds,
                        watch_interval_seconds=s.watch_interval_seconds).start()
    if metrics.listen:
        agent.serve_metrics(metrics.listen)
    bind_host, _ = parse_host_port(s.bind, "--bind", ConfigError)
    address = s.advertise_address or f"{'127.0.0.1' if bind_host in ('0.0.0.0', '[::]') else bind_host}:{agent.port}"
    store: MetadataStore | None = None
    if cluster.metadata_service_uri and s.register:
        store = open_store(cluster)  # the cluster's one policy: TLS, auth, timeouts
        agent.register(store, s.bookie_id, address)

    print(f"bookie agent for {s.bookie_id} listening on port {agent.port} ({s.source})", flush=True)
    return agent.serve_until_signalled(s.stop_grace_seconds, after=store.close if store is not None else None,
                                       signals=signals)
