"""`scrutiny` command line: scan, auditor, bookie-agent, rescan, demo."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from scrutiny.config import ConfigError, ScanSettings, build, read_config_file
from scrutiny.metadata import MetadataError
from scrutiny.report import Report
from scrutiny.zkstore import MetadataStoreUnavailable

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_ERROR = 0, 1, 2


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
    agent = BookieAgent(source, bind=args.bind or f"0.0.0.0:{DEFAULT_AGENT_PORT}", workers=args.workers).start()
    bind_host = (args.bind or "0.0.0.0").rsplit(":", 1)[0]
    address = args.advertise_address or f"{'127.0.0.1' if bind_host in ('0.0.0.0', '[::]') else bind_host}:{agent.port}"
    zk = None
    if args.metadata_service_uri:
        uri = parse_metadata_service_uri(args.metadata_service_uri)
        zk = KazooClient(hosts=uri.hosts, timeout=15)
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
    p.add_argument("--bookie-deadline", dest="bookie_deadline_seconds", type=float, metavar="SECONDS")
    p.add_argument("--zk-max-in-flight", type=int)
    p.add_argument("--log-level", default="WARNING")


def scan_settings(args: argparse.Namespace) -> ScanSettings:
    file_values = read_config_file(args.config) if args.config else {}
    flags = {k: getattr(args, k, None) for k in ScanSettings.__dataclass_fields__}
    flags["bookie_endpoints"] = dict(args.bookie_endpoint) if args.bookie_endpoint else None
    flags["racks"] = dict(args.rack) if args.rack else None
    flags["ledgers"] = tuple(args.ledger) if args.ledger else None
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scrutiny", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _scan_flags(sub.add_parser("scan", help="one scrutiny run, fsck-style, then exit"))
    _agent_parser(sub)
    demo = sub.add_parser("demo", help="a local cluster with known faults, agents and a scan")
    demo.add_argument("--metadata-service-uri", help="use this ZooKeeper instead of starting one")
    demo.add_argument("--ledgers", type=int, default=3000, help="healthy ledgers to write")
    demo.add_argument("--engine", choices=["spark", "local"], default="spark")
    demo.add_argument("--format", choices=["text", "json"], default="text")
    demo.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if getattr(args, "log_level", "INFO") != "DEBUG":
        # kazoo narrates every reconnection attempt; our own messages say what matters.
        logging.getLogger("kazoo").setLevel(logging.ERROR)
    from scrutiny.demo import run_demo

    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "scan": run_scan, "bookie-agent": run_bookie_agent, "demo": run_demo}
    try:
        return handlers[args.command](args)
    except (UsageError, ConfigError, MetadataError, MetadataStoreUnavailable) as exc:
        print(f"scrutiny {args.command}: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
