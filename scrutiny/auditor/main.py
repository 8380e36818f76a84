"""`scrutiny auditor`: the auditor's settings (flags, file, environment; SIGHUP reads them all again) and its
life until a stop signal; the composition root of the auditor's process."""

from __future__ import annotations

import argparse

from scrutiny.auditor.daemon import Auditor, AuditorConfig
from scrutiny.config import AuditorSettings, MetricsSettings, ScanSettings, StatsdSettings, build, read_config_file
from scrutiny.console.web import AuditorWeb
from scrutiny.daemon import Signals, serve
from scrutiny.errors import EXIT_CLEAN
from scrutiny.logsetup import configure


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("auditor", help="the background daemon (leader election, schedules, RPC, StatsD)")
    p.add_argument("--config", help="settings file: scan keys at the top level, an `auditor` section")
    p.add_argument("--validate-config", action="store_true", help="check the settings and exit")
    p.add_argument("--metadata-service-uri")
    p.add_argument("--listen", help="RPC address (default 0.0.0.0:3192)")
    p.add_argument("--advertise-address", help="how the other auditors and clients reach this one")
    p.add_argument("--reports-dir")
    p.add_argument("--metrics-listen", help="serve Prometheus' /metrics here, e.g. 0.0.0.0:9192 (not :8000)")
    p.add_argument("--json-logs", action="store_true", default=None)
    p.add_argument("--log-level", default="INFO")


def settings(args: argparse.Namespace) -> AuditorConfig:
    """Every section the auditor uses, read whole (SIGHUP reads them all again)."""
    file_values = read_config_file(args.config) if args.config else {}
    where = args.config or "config"
    scan = build(ScanSettings, file_values, {"metadata_service_uri": args.metadata_service_uri}, where=where)
    flags = {"listen": args.listen, "advertise_address": args.advertise_address, "reports_dir": args.reports_dir,
             "json_logs": args.json_logs}
    settings = build(AuditorSettings, file_values, flags, where=where, section="auditor")
    statsd = build(StatsdSettings, file_values, {}, where=where, section="statsd")
    metrics = build(MetricsSettings, file_values, {"listen": args.metrics_listen}, where=where, section="metrics")
    return AuditorConfig(scan.validate(), settings.validate(), statsd.validate(), metrics.validate())


def run(args: argparse.Namespace) -> int:
    config = settings(args)
    if args.validate_config:
        print(f"configuration OK: {config.scan.metadata_service_uri}, RPC on {config.auditor.listen}")
        return EXIT_CLEAN
    configure(args.log_level, config.auditor.json_logs)
    signals = Signals(reloads=True)  # before the auditor's threads: the handlers belong to the main thread
    auditor = Auditor(*config, reload=lambda: settings(args), web=AuditorWeb).start()
    print(f"auditor RPC on port {auditor.port}", flush=True)
    serve(signals, auditor.reload, auditor.stopping)
    auditor.stop()
    return EXIT_CLEAN
