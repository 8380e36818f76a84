"""Where the auditor's reports go. A sink is told of every finished run, every skipped one, and the
changes of leadership; a new destination (a metrics system, say) is one new class here."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import statsd

from scrutiny.categories import Category, spec
from scrutiny.report import Report

log = logging.getLogger(__name__)

PHASES = ("first_pass_ms", "recheck_ms", "verify_ms")  # the stats that time a run's phases


@dataclass(frozen=True)
class FinishedRun:
    kind: str
    report: Report
    duration_ms: int
    categories: tuple[Category, ...]  # those the run looked at


class ReportSink:
    def published(self, run: FinishedRun) -> None:
        pass

    def skipped(self, kind: str, reason: str) -> None:
        pass

    def leadership(self, leading: bool) -> None:
        pass

    def close(self) -> None:
        pass


class ReportFiles(ReportSink):
    """`<reports_dir>/<kind>/<started>-<run id>.json`, written atomically, the newest `keep` kept."""

    def __init__(self, directory: str, keep: int) -> None:
        self.directory, self.keep = Path(directory), keep

    def published(self, run: FinishedRun) -> None:
        folder = self.directory / run.kind
        report = run.report
        try:
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{report.started_at.replace(':', '')}-{report.run_id}.json"
            tmp = folder / f".{name}.tmp"
            tmp.write_text(report.dumps())
            os.replace(tmp, folder / name)
            for old in sorted(folder.glob("*.json"))[:-self.keep]:
                old.unlink()
        except OSError as exc:
            log.error("could not write the report of run %s: %s", report.run_id, exc)


class StatsdSink(ReportSink):
    """The contract's StatsD names: counters per category, gauges under BookKeeper's auditor names,
    timers, ledgers checked, failed bookie calls, runs by kind and outcome."""

    def __init__(self, host: str, port: int = 8125, prefix: str = "scrutiny") -> None:
        self.client = statsd.StatsClient(host, port, prefix=prefix)

    def published(self, run: FinishedRun) -> None:
        counts, report, kind = run.report.counts, run.report, run.kind
        try:
            # A pipeline packs several metrics per datagram: fewer packets to drop under load.
            with self.client.pipeline() as pipe:
                for cat in run.categories:
                    pipe.incr(f"violations.{cat}", counts[str(cat)])
                    gauge = spec(cat).bookkeeper_gauge
                    if gauge:
                        pipe.gauge(f"auditor.{gauge}", counts[str(cat)])
                pipe.timing(f"run.{kind}.duration", run.duration_ms)
                for phase in PHASES:
                    if phase in report.stats:
                        pipe.timing(f"run.{kind}.{phase.removesuffix('_ms')}", report.stats[phase])
                pipe.incr("ledgers.checked", report.ledgers.get("checked", 0))
                pipe.incr("bookie_calls.failed", report.stats.get("bookie_calls_failed", 0))
                pipe.incr(f"runs.{kind}.{'complete' if report.complete else 'incomplete'}")
        except OSError as exc:
            log.warning("StatsD: %s", exc)

    def skipped(self, kind: str, reason: str) -> None:
        try:
            self.client.incr(f"runs.{kind}.skipped.{reason}")
        except OSError as exc:
            log.warning("StatsD: %s", exc)

    def close(self) -> None:
        self.client.close()
