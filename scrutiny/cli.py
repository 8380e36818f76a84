"""`scrutiny` command line: scan, auditor, bookie-agent, rescan, demo."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from scrutiny.auditor import AuditorSettings
from scrutiny.config import ConfigError, ScanSettings, build, read_config_file
from scrutiny.metadata import MetadataError
from scrutiny.report import EXIT_CLEAN, EXIT_INCOMPLETE, Report
from scrutiny.tls import channel_credentials, server_credentials, zk_client_args
from scrutiny.zkstore import MetadataStoreUnavailable


class UsageError(Exception):
    """Bad arguments or configuration: exit status 2 with a one-line reason."""


def _agent_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bookie-agent", help="serve scrutiny.v1.Bookie next to one bookie")
    p.add_argument("--bookie-id", required=True, help="the bookie this agent answers for (host:port)")
    p.add_argument("--bind", default=None, help="listen address (default 0.0.0.0:3191)")
    p.add_argument("--advertise-address", help="address registered in ZooKeeper (default: the bind address)")
    p.add_argument("--source", choices=["dbledgerstorage", "bridge", "synthetic"], required=True)
    p.add_argument("--ledger-dir", action="append", default=[],
                   help="dbledgerstorage: a ledger or index directory (repeatable; all are read)")
    p.add_argument("--scratch-dir", help="dbledgerstorage: where the read-only views are made")
    p.add_argument("--bookie-address", help="bridge: host:port of the stock bookie (v3 protocol)")
    p.add_argument("--synthetic-file", help="synthetic: the store file of this bookie")
    p.add_argument("--metadata-service-uri", help="register the agent in this cluster's ZooKeeper")
    p.add_argument("--zk-auth-file", help="ZooKeeper digest credentials (user:password) for the registration")
    p.add_argument("--tls-cert", help="serve over TLS with this certificate (PEM)")
    p.add_argument("--tls-key", help="... and its key")
    p.add_argument("--tls-client-ca", help="mutual TLS: callers need a certificate signed by this CA")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--log-level", default="INFO")


def run_bookie_agent(args: argparse.Namespace) -> int:
    from kazoo.client import KazooClient

    from scrutiny.agent import DEFAULT_AGENT_PORT, BookieAgent
    from scrutiny.entrysources import BookieBridgeSource, DbLedgerStorageSource, EntrySource, SyntheticStore
    from scrutiny.metadata import parse_metadata_service_uri

    source: EntrySource
    if args.source == "dbledgerstorage":
        if not args.ledger_dir:
            raise UsageError("--source dbledgerstorage needs at least one --ledger-dir")
        source = DbLedgerStorageSource(args.ledger_dir, args.scratch_dir)
    elif args.source == "bridge":
        host, _, port = (args.bookie_address or "").rpartition(":")
        if not host or not port.isdigit():
            raise UsageError("--source bridge needs --bookie-address host:port")
        source = BookieBridgeSource(host, int(port))
    else:
        if not args.synthetic_file:
            raise UsageError("--source synthetic needs --synthetic-file")
        source = SyntheticStore(args.synthetic_file)
    creds = server_credentials(args.tls_cert or "", args.tls_key or "", args.tls_client_ca or "")
    agent = BookieAgent(source, bind=args.bind or f"0.0.0.0:{DEFAULT_AGENT_PORT}", workers=args.workers,
                        credentials=creds).start()
    bind_host = (args.bind or "0.0.0.0").rsplit(":", 1)[0]
    address = args.advertise_address or f"{'127.0.0.1' if bind_host in ('0.0.0.0', '[::]') else bind_host}:{agent.port}"
    zk = None
    if args.metadata_service_uri:
        uri = parse_metadata_service_uri(args.metadata_service_uri)
        zk = KazooClient(hosts=uri.hosts, timeout=15, **zk_client_args(args.zk_auth_file or ""))
        zk.start(timeout=15)
        agent.register(zk, uri.scrutiny_path, args.bookie_id, address)

    def stop(signum: int, frame: FrameType | None) -> None:
        agent.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"bookie agent for {args.bookie_id} listening on port {agent.port} ({args.source})", flush=True)
    agent.wait()
    if zk is not None:
        zk.stop()
        zk.close()
    return EXIT_CLEAN


def _pairs(flag: str) -> Callable[[str], tuple[str, str]]:
    def parse(text: str) -> tuple[str, str]:
        key, sep, value = text.partition("=")
        if not sep or not key or not value:
            raise argparse.ArgumentTypeError(f"{flag} wants KEY=VALUE, got {text!r}")
        return key, value

    return parse


def _scan_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `scan` (and of `rescan`'s output); defaults live in ScanSettings, not here."""
    p.add_argument("--config", help="settings file (YAML, or TOML by extension); flags win")
    p.add_argument("--metadata-service-uri", help="e.g. zk+hierarchical://127.0.0.1:2181/ledgers")
    p.add_argument("--bookie-endpoint", action="append", type=_pairs("--bookie-endpoint"),
                   metavar="BOOKIE_ID=HOST:PORT", help="where a bookie's agent listens (repeatable)")
    p.add_argument("--agent-default-port", type=int, help="agent port on a bookie's host when nothing else says")
    p.add_argument("--placement-policy", choices=["rackaware", "zoneaware", "regionaware", "none"])
    p.add_argument("--min-racks-per-write-quorum", type=int)
    p.add_argument("--enforce-min-racks", action="store_true", default=None)
    p.add_argument("--min-zones-per-write-quorum", type=int)
    p.add_argument("--desired-zones-per-write-quorum", type=int)
    p.add_argument("--min-regions-for-durability", type=int)
    p.add_argument("--rack", action="append", type=_pairs("--rack"), metavar="BOOKIE_ID=/LOCATION")
    p.add_argument("--underreplicated-grace-period", type=int, metavar="SECONDS", help="0 = off")
    p.add_argument("--recheck-delay", type=float, metavar="SECONDS")
    p.add_argument("--write-cache-grace", dest="write_cache_grace_seconds", type=float, metavar="SECONDS",
                   help="re-check instead of report ledgers closed less than this ago (bookie write cache)")
    p.add_argument("--ledger", action="append", type=int, metavar="ID", help="scan only these (repeatable)")
    p.add_argument("--format", choices=["text", "json"])
    p.add_argument("--output", metavar="FILE")
    p.add_argument("--engine", choices=["spark", "local"])
    p.add_argument("--spark-master", help="default local[*]; spark://host:port for a cluster")
    p.add_argument("--spark-conf", action="append", type=_pairs("--spark-conf"), metavar="KEY=VALUE",
                   help="a Spark setting, e.g. spark.archives=scrutiny-venv.tar.gz#environment (repeatable)")
    p.add_argument("--bookie-deadline", dest="bookie_deadline_seconds", type=float, metavar="SECONDS")
    p.add_argument("--zk-max-in-flight", type=int)
    p.add_argument("--log-level", default="WARNING")


def scan_settings(args: argparse.Namespace) -> ScanSettings:
    file_values = read_config_file(args.config) if args.config else {}
    flags = {k: getattr(args, k, None) for k in ScanSettings.__dataclass_fields__}
    flags["bookie_endpoints"] = dict(args.bookie_endpoint) if args.bookie_endpoint else None
    flags["racks"] = dict(args.rack) if args.rack else None
    flags["ledgers"] = tuple(args.ledger) if args.ledger else None
    flags["spark_conf"] = dict(args.spark_conf) if args.spark_conf else None
    return build(ScanSettings, file_values, flags, where=args.config or "config").validate()


def _progress() -> Callable[[int, int], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        print(f"\rranges {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)

    return show


def emit(report: Report, fmt: str, output: str) -> None:
    text = report.dumps() + "\n" if fmt == "json" else report.render_text()
    if output:
        Path(output).write_text(text)
    else:
        sys.stdout.write(text)


def run_scan(args: argparse.Namespace) -> int:
    from scrutiny.run import ScrutinyRun, make_engine

    settings = scan_settings(args)
    engine = make_engine(settings)
    try:
        report = ScrutinyRun(settings, engine, progress=_progress()).execute()
    except MetadataStoreUnavailable as exc:
        raise UsageError(str(exc)) from None
    finally:
        stop_engine(engine)
    emit(report, settings.format, settings.output)
    if not report.complete:
        print(f"scrutiny scan: incomplete run: {report.errors[0]}", file=sys.stderr)
    return report.exit_status()


def stop_engine(engine: object) -> None:
    """Never leave a JVM (or, in-process, a ZooKeeper session) behind."""
    from scrutiny.run import close_worker_resources

    close_worker_resources()
    session = getattr(engine, "_session", None)
    if session is not None:
        session.stop()


def _auditor_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("auditor", help="the background daemon (leader election, schedules, RPC, StatsD)")
    p.add_argument("--config", help="settings file: scan keys at the top level, an `auditor` section")
    p.add_argument("--validate-config", action="store_true", help="check the settings and exit")
    p.add_argument("--metadata-service-uri")
    p.add_argument("--listen", help="RPC address (default 0.0.0.0:3192)")
    p.add_argument("--advertise-address", help="how the other auditors and clients reach this one")
    p.add_argument("--reports-dir")
    p.add_argument("--json-logs", action="store_true", default=None)
    p.add_argument("--log-level", default="INFO")


def auditor_settings(args: argparse.Namespace) -> tuple[ScanSettings, AuditorSettings]:
    file_values = read_config_file(args.config) if args.config else {}
    where = args.config or "config"
    scan = build(ScanSettings, file_values, {"metadata_service_uri": args.metadata_service_uri}, where=where)
    flags = {"listen": args.listen, "advertise_address": args.advertise_address, "reports_dir": args.reports_dir,
             "json_logs": args.json_logs}
    settings = build(AuditorSettings, file_values, flags, where=where, env_prefix="SCRUTINY_AUDITOR_",
                     section="auditor")
    return scan.validate(), settings.validate()


def run_auditor(args: argparse.Namespace) -> int:
    from scrutiny.auditor import Auditor

    scan, settings = auditor_settings(args)
    if args.validate_config:
        print(f"configuration OK: {scan.metadata_service_uri}, RPC on {settings.listen}")
        return EXIT_CLEAN
    configure_logging(args.log_level, settings.json_logs)
    auditor = Auditor(scan, settings, reload=lambda: auditor_settings(args)).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=auditor.stop).start())
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=auditor.stop).start())
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=auditor.reload).start())
    print(f"auditor RPC on port {auditor.port}", flush=True)
    while not auditor.stopping.wait(0.5):
        pass
    auditor.stop()
    stop_engine(auditor.engine)
    return EXIT_CLEAN


def _rescan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rescan", help="ask a running auditor for an on-demand run")
    p.add_argument("--auditor", default="127.0.0.1:3192", help="HOST:PORT of any auditor (standbys redirect)")
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--all", action="store_true", help="every ledger")
    scope.add_argument("--ledger", action="append", type=int, metavar="ID", help="these ledgers (repeatable)")
    scope.add_argument("--bookie", metavar="BOOKIE_ID", help="every ledger of this bookie (decommissioning)")
    p.add_argument("--no-wait", action="store_true", help="print the run id and return")
    p.add_argument("--wait-timeout", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--token-file", help="a bearer token for the auditor")
    p.add_argument("--tls-ca", help="the auditor serves TLS: verify it with this CA")
    p.add_argument("--tls-cert", help="mutual TLS: this client's certificate")
    p.add_argument("--tls-key", help="... and its key")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("--output", default="", metavar="FILE")
    p.add_argument("--log-level", default="WARNING")


def run_rescan(args: argparse.Namespace) -> int:
    import grpc

    from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc

    request = auditor_pb2.RescanRequest(wait=not args.no_wait, wait_timeout_seconds=args.wait_timeout)
    if args.all:
        request.all_ledgers = True
    elif args.ledger:
        request.ledgers.ledger_ids.extend(args.ledger)
    else:
        request.bookie_id = args.bookie
    metadata = []
    if args.token_file:
        try:
            metadata.append(("authorization", f"Bearer {Path(args.token_file).read_text().strip()}"))
        except OSError as exc:
            raise UsageError(f"cannot read --token-file: {exc.strerror}") from None
    address = args.auditor
    creds = channel_credentials(args.tls_ca or "", args.tls_cert or "", args.tls_key or "")
    for _ in range(2):  # a standby names the leader: ask it once
        with (grpc.secure_channel(address, creds) if creds else grpc.insecure_channel(address)) as channel:
            try:
                resp = auditor_pb2_grpc.AuditorStub(channel).Rescan(request, metadata=metadata)
                break
            except grpc.RpcError as exc:
                leader = dict(exc.trailing_metadata() or ()).get("leader-address")
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and leader and leader != address:
                    address = leader
                    continue
                raise UsageError(f"{exc.code().name}: {exc.details()}") from None
    else:
        raise UsageError("the auditors keep redirecting: no leader right now")
    if args.no_wait:
        print(f"run {resp.run_id} {'queued' if resp.queued else 'started'} on {address}")
        return EXIT_CLEAN
    report = Report.from_json(json.loads(resp.report_json))
    emit(report, args.format, args.output)
    return report.exit_status()


def configure_logging(level: str, json_lines: bool = False) -> None:
    from scrutiny.logsetup import configure

    configure(level, json_lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scrutiny", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _scan_flags(sub.add_parser("scan", help="one scrutiny run, fsck-style, then exit"))
    _agent_parser(sub)
    _auditor_parser(sub)
    _rescan_parser(sub)
    demo = sub.add_parser("demo", help="a local cluster with known faults, agents and a scan")
    demo.add_argument("--metadata-service-uri", help="use this ZooKeeper instead of starting one")
    demo.add_argument("--ledgers", type=int, default=3000, help="healthy ledgers to write")
    demo.add_argument("--engine", choices=["spark", "local"], default="spark")
    demo.add_argument("--format", choices=["text", "json"], default="text")
    demo.add_argument("--setup-only", action="store_true",
                      help="write the cluster and the bookies' store files, then exit (for docker/compose.yaml)")
    demo.add_argument("--stores-dir", help="with --setup-only: where the store files go")
    demo.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(getattr(args, "log_level", "INFO"))
    from scrutiny.demo import run_demo

    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "scan": run_scan, "bookie-agent": run_bookie_agent, "demo": run_demo, "auditor": run_auditor,
        "rescan": run_rescan}
    try:
        return handlers[args.command](args)
    except (UsageError, ConfigError, MetadataError, MetadataStoreUnavailable) as exc:
        print(f"scrutiny {args.command}: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
