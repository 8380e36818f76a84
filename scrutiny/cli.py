"""`scrutiny` command line: scan, auditor, bookie-agent, rescan, demo."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scrutiny", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _agent_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {"bookie-agent": run_bookie_agent}
    try:
        return handlers[args.command](args)
    except UsageError as exc:
        print(f"scrutiny {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
