"""`scrutiny` command line: scan, auditor, bookie-agent, rescan, demo."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import grpc
from tqdm import tqdm

from scrutiny.agent import main as agent_main
from scrutiny.auditor import main as auditor_main
from scrutiny.channels import channel
from scrutiny.config import (
    ScanSettings,
    build,
    read_config_file,
)
from scrutiny.errors import EXIT_CLEAN, ConfigError, ScrutinyError, one_line
from scrutiny.logsetup import configure
from scrutiny.lostbookies import SIGHTINGS as LOST_BOOKIE_SIGHTINGS
from scrutiny.orphans import SIGHTINGS as ORPHAN_SIGHTINGS
from scrutiny.orphans import Sightings
from scrutiny.report import Report
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import make_engine
from scrutiny.store import open_store
from scrutiny.times import iso
from scrutiny.tls import channel_credentials
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc


def _pairs(flag: str) -> Callable[[str], tuple[str, str]]:
    def parse(text: str) -> tuple[str, str]:
        key, sep, value = text.partition("=")
        if not sep or not key or not value:
            raise argparse.ArgumentTypeError(f"{flag} wants KEY=VALUE, got {text!r}")
        return key, value

    return parse


def _slice(text: str) -> tuple[int, int]:
    k, sep, n = text.partition("/")
    if not sep or not k.isdigit() or not n.isdigit() or not 0 <= int(k) < int(n):
        raise argparse.ArgumentTypeError(f"--deep-slice wants K/N with 0 <= K < N, got {text!r}")
    return int(k), int(n)


URI_FORMS = ("BookKeeper's metadataServiceUri: zk+hierarchical://zk1:2181;zk2:2181/ledgers (also flat, "
             "longhierarchical; zk:// reads the layout from LAYOUT), or Pulsar's metadata store (PIP-45): "
             "metadata-store:zk:zk1:2181,zk2:2181/chroot, metadata-store:etcd:http://e1:2379;http://e2:2379")


def _scan_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `scan` (and of `rescan`'s output); defaults live in ScanSettings, not here."""
    p.add_argument("--config", help="settings file (YAML, or TOML by extension); flags win")
    p.add_argument("--metadata-service-uri", help=URI_FORMS)
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
    p.add_argument("--orphan-grace-period", type=int, metavar="SECONDS",
                   help="ORPHAN_LEDGER once a ledger has been seen held and absent from the metadata this long "
                        "(the auditor's sightings; default 3600; 0: at once)")
    p.add_argument("--no-orphan-check", dest="orphan_check", action="store_false", default=None,
                   help="do not list what the bookies hold (the reverse check of whole-cluster runs)")
    p.add_argument("--pulsar-metadata-uri", metavar="URI",
                   help="Pulsar's metadata store (the brokers' metadataStoreUrl) where it is not BookKeeper's: "
                        "metadata-store:zk:host:port/chroot or metadata-store:etcd:http://host:2379")
    p.add_argument("--no-pulsar-check", dest="pulsar_check", action="store_false", default=None,
                   help="do not hold Pulsar's record (managed ledgers, cursors, schemas) against BookKeeper's")
    p.add_argument("--leaked-ledger-grace-period", type=int, metavar="SECONDS",
                   help="LEAKED_LEDGER once a ledger Pulsar created, named by nothing, is this old (default 3600)")
    p.add_argument("--auditor-ledger-verification-percentage", type=int, metavar="PERCENT",
                   help="the cluster's auditorLedgerVerificationPercentage (default 0): which losses its "
                        "autorecovery can see, as each finding's remedy says")
    p.add_argument("--lost-bookie-grace-period", type=int, metavar="SECONDS",
                   help="LOST_BOOKIE_RECOVERY_NOT_STARTED once a bookie has been seen unregistered for "
                        "lostBookieRecoveryDelay plus this long and its ledgers are not marked (default 300; "
                        "a bookie the auditor never saw gone is first seen now; 0 with a delay of 0: at once)")
    p.add_argument("--lost-bookie-recovery-delay", type=int, metavar="SECONDS",
                   help="BookKeeper's lostBookieRecoveryDelay where the store has none (default 0)")
    p.add_argument("--no-lost-bookie-check", dest="lost_bookie_check", action="store_false", default=None,
                   help="do not check that the ledgers of bookies gone from the registrations are marked")
    p.add_argument("--write-cache-grace", dest="write_cache_grace_seconds", type=float, metavar="SECONDS",
                   help="re-check instead of report ledgers closed less than this ago (bookie write cache)")
    p.add_argument("--ledger", action="append", type=int, metavar="ID", help="scan only these (repeatable)")
    p.add_argument("--topic", action="append", metavar="persistent://TENANT/NS/NAME",
                   help="scan only this Pulsar topic's ledgers: data, cursors, compacted (repeatable)")
    p.add_argument("--tenant", action="append", metavar="TENANT",
                   help="scan only the ledgers of this Pulsar tenant's topics, as --topic (repeatable)")
    p.add_argument("--namespace", action="append", metavar="TENANT/NS",
                   help="scan only the ledgers of this Pulsar namespace's topics, as --topic (repeatable)")
    p.add_argument("--deep", action="store_true", default=None,
                   help="deep scrub: the agents read every listed entry's bytes and verify size, ids and digest")
    p.add_argument("--deep-slice", type=_slice, metavar="K/N",
                   help="deep: verify only slice K of N of the ledgers (0 <= K < N)")
    p.add_argument("--format", choices=["text", "json"])
    p.add_argument("--output", metavar="FILE")
    p.add_argument("--engine", choices=["spark", "local"])
    p.add_argument("--spark-master", help="default local[*]; spark://host:port for a cluster")
    p.add_argument("--spark-conf", action="append", type=_pairs("--spark-conf"), metavar="KEY=VALUE",
                   help="a Spark setting, e.g. spark.archives=scrutiny-venv.tar.gz#environment (repeatable)")
    p.add_argument("--bookie-deadline", dest="bookie_deadline_seconds", type=float, metavar="SECONDS")
    p.add_argument("--bookie-recheck-deadline", dest="bookie_recheck_deadline_seconds", type=float,
                   metavar="SECONDS", help="the delayed look's deadline per agent call (default 3x --bookie-deadline)")
    p.add_argument("--zk-max-in-flight", type=int)
    p.add_argument("--log-level", default="WARNING")


def scan_settings(args: argparse.Namespace) -> ScanSettings:
    file_values = read_config_file(args.config) if args.config else {}
    flags = {k: getattr(args, k, None) for k in ScanSettings.__dataclass_fields__}
    flags["bookie_endpoints"] = dict(args.bookie_endpoint) if args.bookie_endpoint else None
    flags["racks"] = dict(args.rack) if args.rack else None
    flags["ledgers"] = tuple(args.ledger) if args.ledger else None
    for flag, key in (("topic", "topics"), ("tenant", "tenants"), ("namespace", "namespaces")):
        flags[key] = tuple(getattr(args, flag)) if getattr(args, flag, None) else None
    flags["spark_conf"] = dict(args.spark_conf) if args.spark_conf else None
    if getattr(args, "deep_slice", None):
        flags["deep_slice"], flags["deep_slices"] = args.deep_slice
    return build(ScanSettings, file_values, flags, where=args.config or "config").validate()


class ProgressBar:
    """Ledgers done, ledgers/s and the ETA on a terminal (tqdm, on stderr); the final summary unchanged."""

    def __init__(self) -> None:
        self.bar: tqdm[Any] | None = None
        self.started = time.monotonic()

    def __call__(self, done: int, total: int, ledgers: int) -> None:
        if self.bar is None:
            # A terminal that reports no size (0 x 0) would hide the bar: fall back to 100 x 20.
            size = shutil.get_terminal_size((100, 20))
            self.bar = tqdm(total=total, unit="range", file=sys.stderr, leave=False, ncols=size.columns,
                            nrows=size.lines or 20,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} ranges [{elapsed}<{remaining}{postfix}]")
        rate = ledgers / max(time.monotonic() - self.started, 1e-6)
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(f"{ledgers:,} ledgers, {rate:,.0f} ledgers/s")  # redraws
        if done >= total:
            self.bar.close()


def _progress() -> ProgressBar | None:
    return ProgressBar() if sys.stderr.isatty() else None  # quiet when not a terminal


def emit(report: Report, fmt: str, output: str) -> None:
    with open(output, "w") if output else contextlib.nullcontext(sys.stdout) as out:
        if fmt == "json":
            report.write_json(out)
        else:
            out.write(report.render_text())


def run_scan(args: argparse.Namespace) -> int:
    settings = scan_settings(args)
    engine = make_engine(settings)
    try:
        report = ScrutinyRun(settings, engine, progress=_progress()).execute()
    finally:
        engine.close()  # never leave a JVM (or a metadata-store session) behind
    emit(report, settings.format, settings.output)
    if not report.complete:
        print(f"scrutiny scan: incomplete run: {report.errors[0]}", file=sys.stderr)
    return report.exit_status()


def run_whatif(args: argparse.Namespace) -> int:
    """Were these bookies (racks) down: would any entry fall below its ack quorum?"""
    if not args.without and not args.without_rack:
        raise ConfigError("whatif needs at least one --without BOOKIE_ID or --without-rack /RACK")
    settings = scan_settings(args)
    engine = make_engine(settings)
    try:
        report = ScrutinyRun(settings, engine, progress=_progress()).execute(
            without=args.without or (), without_racks=args.without_rack or ())
    finally:
        engine.close()
    emit(report, settings.format, settings.output)
    status = report.whatif_exit_status()
    verdict = {0: "safe", 1: "UNSAFE: some entry would fall below its ack quorum",
               2: "cannot tell: some copies are unknown today, or the run is incomplete"}[status]
    print(f"scrutiny whatif: {verdict}", file=sys.stderr)
    return status


def run_sightings(args: argparse.Namespace) -> int:
    """The auditor's sightings as operators read them: the orphan candidates (kept compressed) and the lost
    bookies, each with when it was first seen."""
    file_values = read_config_file(args.config) if args.config else {}
    settings = build(ScanSettings, file_values, {"metadata_service_uri": args.metadata_service_uri},
                     where=args.config or "config")
    if not settings.metadata_service_uri:
        raise ConfigError("sightings needs --metadata-service-uri (or metadata_service_uri in --config)")
    with open_store(settings) as store:  # read strictly: an operator is told what is unreadable
        orphan_data, lost_data = (store.auditor_record(r.name) for r in (ORPHAN_SIGHTINGS, LOST_BOOKIE_SIGHTINGS))
    orphans = ORPHAN_SIGHTINGS.parse(orphan_data) if orphan_data else Sightings()
    lost = LOST_BOOKIE_SIGHTINGS.parse(lost_data) if lost_data else {}
    json.dump({"orphans": {b: {str(lid): iso(t) for lid, t in sorted(per.items())}
                           for b, per in sorted(orphans.first_seen.items())},
               "orphans_untracked": orphans.untracked,
               "lost_bookies": {b: iso(t) for b, t in sorted(lost.items())}}, sys.stdout, indent=1)
    print()
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
            raise ConfigError(f"cannot read --token-file: {exc.strerror}") from None
    address = args.auditor
    creds = channel_credentials(args.tls_ca or "", args.tls_cert or "", args.tls_key or "")
    for _ in range(2):  # a standby names the leader: ask it once
        with channel(address, creds) as ch:
            try:
                resp = auditor_pb2_grpc.AuditorStub(ch).Rescan(request, metadata=metadata)
                break
            except grpc.RpcError as exc:
                leader = dict(exc.trailing_metadata() or ()).get("leader-address")
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and leader and leader != address:
                    address = leader
                    continue
                raise RescanFailed(f"{exc.code().name}: {exc.details()}") from None
    else:
        raise RescanFailed("the auditors keep redirecting: no leader right now")
    if args.no_wait:
        print(f"run {resp.run_id} {'queued' if resp.queued else 'started'} on {address}")
        return EXIT_CLEAN
    report = Report.from_json(json.loads(resp.report_json))
    emit(report, args.format, args.output)
    return report.exit_status()


def installed_version() -> str:
    try:
        return version("scrutiny")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scrutiny", description=__doc__)
    parser.add_argument("--version", action="version", version=f"scrutiny {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _scan_flags(sub.add_parser("scan", help="one scrutiny run, fsck-style, then exit"))
    whatif = sub.add_parser("whatif", help="is it safe to take these bookies or racks down? (exit 0 safe, 1 unsafe)")
    _scan_flags(whatif)
    whatif.add_argument("--without", action="append", metavar="BOOKIE_ID", help="a bookie taken down (repeatable)")
    whatif.add_argument("--without-rack", action="append", metavar="/RACK", help="a rack taken down (repeatable)")
    agent_main.add_parser(sub)
    auditor_main.add_parser(sub)
    _rescan_parser(sub)
    sightings = sub.add_parser("sightings", help="what the auditor has seen and keeps in the store: orphan candidates "
                               "and bookies gone from the registrations, each since when (JSON)")
    sightings.add_argument("--config", help="settings file (for the store's TLS and credentials)")
    sightings.add_argument("--metadata-service-uri", help=URI_FORMS)
    demo = sub.add_parser("demo", help="a local cluster with known faults, agents and a scan")
    demo.add_argument("--metadata-service-uri", help="use this ZooKeeper instead of starting one")
    demo.add_argument("--ledgers", type=int, default=3000, help="healthy ledgers to write")
    demo.add_argument("--engine", choices=["spark", "local"], default="spark")
    demo.add_argument("--format", choices=["text", "json"], default="text")
    demo.add_argument("--setup-only", action="store_true",
                      help="write the cluster and the bookies' store files, then exit (for docker/compose.yaml)")
    demo.add_argument("--stores-dir", help="with --setup-only: where the store files go")
    demo.add_argument("--no-serve", action="store_true",
                      help="exit after the report (scripts); by default an auditor then serves the console "
                           "with the findings on a local port until Ctrl-C")
    demo.add_argument("--port", type=int, default=0, help="the console's port on 127.0.0.1 (default: any free one)")
    demo.add_argument("--real-bookkeeper", nargs="?", const="newest", metavar="VERSION",
                      help="on real bookies of this BookKeeper release (default: the newest `make peers` fetched), "
                           "written by BookKeeper's own client, with real faults")
    demo.add_argument("--log-level", default="WARNING")
    return parser


def run_demo(args: argparse.Namespace) -> int:
    from scrutiny.testing.demo import run_demo as demo  # the demo's cluster code, only for the demo

    return demo(args)


class RescanFailed(ScrutinyError):
    """The auditor refused or failed the Rescan call."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # the auditor logs each finding for the log pipeline; the commands a person runs print them once, as asked
    configure(getattr(args, "log_level", "INFO"), findings=args.command not in ("scan", "whatif", "demo"))
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "scan": run_scan, "whatif": run_whatif, "bookie-agent": agent_main.run, "demo": run_demo,
        "auditor": auditor_main.run, "rescan": run_rescan, "sightings": run_sightings}
    try:
        return handlers[args.command](args)
    except ScrutinyError as exc:
        print(f"scrutiny {args.command}: {one_line(exc)}", file=sys.stderr)
        return exc.exit_status


if __name__ == "__main__":
    sys.exit(main())
