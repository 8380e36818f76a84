"""Where the auditor's reports go. A sink is told of every finished run, every skipped one, and the
changes of leadership; a new destination (a metrics system, say) is one new class here."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import statsd
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from scrutiny.categories import REGISTRY, Category, spec
from scrutiny.prometheus import PREFIX, MetricsEndpoint
from scrutiny.report import Report

log = logging.getLogger(__name__)

PHASES = ("first_pass_ms", "recheck_ms", "verify_ms")  # the stats that time a run's phases


@dataclass(frozen=True)
class FinishedRun:
    kind: str
    report: Report
    duration_ms: int
    categories: tuple[Category, ...]  # those the run looked at
    whole_cluster: bool = True  # every ledger (or every mark), not a rescan of some


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


class PrometheusSink(ReportSink):
    """/metrics: BookKeeper's auditor gauges under its Prometheus names (`auditor_<NAME>`), and
    scrutiny's own under `scrutiny_`. Gauges describe the last complete run that covered the whole
    cluster; a standby exports its leadership and no stale gauge. Labels are bounded: categories,
    kinds, phases, outcomes, and bookie ids (as many as the cluster has bookies), never ledger ids."""

    def __init__(self, listen: str) -> None:
        self.listen = listen
        self._lock = threading.Lock()
        self.leading = False
        self._leading_since = time.time()
        self._violations: dict[Category, int] = {}
        self._underreplicated: int | None = None
        self._last: dict[str, FinishedRun] = {}  # kind -> last complete run
        self._finished_at: dict[str, float] = {}
        self._unavailable: Counter[str] = Counter()  # bookie -> ledgers it left unchecked (last full run)
        self._blast: dict[str, dict[str, dict[str, int]]] = {}  # the last full run's blast radius
        self._reported: Counter[str] = Counter()
        self._runs: Counter[tuple[str, str]] = Counter()
        self._skipped: Counter[tuple[str, str]] = Counter()
        self._checked = 0
        self._calls_failed = 0
        self._deep_bytes = 0
        self._deep_pass: dict[str, int] = {}  # where the deep pass stands (the last deep run's cursor)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.endpoint = MetricsEndpoint(listen, self.registry)

    def published(self, run: FinishedRun) -> None:
        report = run.report
        with self._lock:
            self._runs[(run.kind, "complete" if report.complete else "incomplete")] += 1
            self._checked += report.ledgers.get("checked", 0)
            self._calls_failed += report.stats.get("bookie_calls_failed", 0)
            self._deep_bytes += report.stats.get("deep_bytes_read", 0)
            if "deep_pass_slices" in report.stats:
                self._deep_pass = {k: v for k, v in report.stats.items() if k.startswith("deep_pass")
                                   or k in ("deep_passes_completed", "deep_oldest_verified_ms")}
            for v in report.violations:
                self._reported[str(v.category)] += 1
            if not (report.complete and run.whole_cluster):
                return
            counts = report.counts
            self._violations.update({c: counts[str(c)] for c in run.categories})
            if "underreplicated_marks" in report.stats:
                self._underreplicated = report.stats["underreplicated_marks"]
            if Category.BOOKIE_UNAVAILABLE in run.categories:
                self._unavailable = Counter(b for v in report.violations if v.category is Category.BOOKIE_UNAVAILABLE
                                            for b in v.bookies)
            if report.blast_radius is not None:
                self._blast = report.blast_radius
            self._last[run.kind] = run
            self._finished_at[run.kind] = time.time()

    def skipped(self, kind: str, reason: str) -> None:
        with self._lock:
            self._skipped[(kind, reason)] += 1

    def leadership(self, leading: bool) -> None:
        with self._lock:
            self.leading = leading
            self._leading_since = time.time()
            if not leading:  # a standby's gauges would be stale: the leader's are the truth
                self._violations.clear()
                self._underreplicated = None
                self._last.clear()
                self._finished_at.clear()
                self._unavailable.clear()
                self._blast = {}
                self._deep_pass = {}

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield GaugeMetricFamily(f"{PREFIX}leader", "1 while this auditor leads", value=int(self.leading))
            violations = GaugeMetricFamily(f"{PREFIX}violations", "ledgers per category, last complete run",
                                           labels=["category"])
            for cat, n in self._violations.items():
                violations.add_metric([str(cat)], n)
                gauge = spec(cat).bookkeeper_gauge
                if gauge:
                    yield GaugeMetricFamily(f"auditor_{gauge}", f"BookKeeper's auditor gauge: {spec(cat).summary}",
                                            value=n)
            yield violations
            if self._underreplicated is not None:
                yield GaugeMetricFamily(f"{PREFIX}underreplicated_ledgers",
                                        "ledgers marked under-replicated now (a gauge, unlike upstream's summary)",
                                        value=self._underreplicated)
            unavailable = GaugeMetricFamily(f"{PREFIX}bookie_unavailable_ledgers",
                                            "ledgers a silent, registered bookie left unchecked, last full run",
                                            labels=["bookie"])
            for bookie, n in sorted(self._unavailable.items()):
                unavailable.add_metric([bookie], n)
            yield unavailable
            blast = GaugeMetricFamily(f"{PREFIX}blast_radius_ledgers",
                                      "ledgers that would fall below AQ (impact below_aq) or lose every copy of an "
                                      "entry (no_copy) were this bookie or rack alone down, last full run",
                                      labels=["scope", "name", "impact"])
            topics = GaugeMetricFamily(f"{PREFIX}blast_radius_topics", "the same, in topics",
                                       labels=["scope", "name", "impact"])
            for scope, per in sorted(self._blast.items()):
                for name, f in sorted(per.items()):
                    s = scope.removesuffix("s")
                    blast.add_metric([s, name, "below_aq"], f["ledgers_below_aq"])
                    blast.add_metric([s, name, "no_copy"], f["ledgers_without_a_copy"])
                    topics.add_metric([s, name, "below_aq"], f["topics_below_aq"])
                    topics.add_metric([s, name, "no_copy"], f["topics_without_a_copy"])
            yield blast
            yield topics
            reported = CounterMetricFamily(f"{PREFIX}violations_reported", "findings reported, every run",
                                           labels=["category"])
            for cat in REGISTRY:
                reported.add_metric([str(cat)], self._reported[str(cat)])
            yield reported
            runs = CounterMetricFamily(f"{PREFIX}runs", "finished runs", labels=["kind", "outcome"])
            for (kind, outcome), n in sorted(self._runs.items()):
                runs.add_metric([kind, outcome], n)
            yield runs
            skipped = CounterMetricFamily(f"{PREFIX}runs_skipped", "runs not started", labels=["kind", "reason"])
            for (kind, reason), n in sorted(self._skipped.items()):
                skipped.add_metric([kind, reason], n)
            yield skipped
            yield CounterMetricFamily(f"{PREFIX}ledgers_checked", "ledgers checked", value=self._checked)
            yield CounterMetricFamily(f"{PREFIX}bookie_calls_failed", "calls to bookie agents that failed",
                                      value=self._calls_failed)
            yield CounterMetricFamily(f"{PREFIX}deep_read_bytes", "entry-log bytes the agents read for deep scrubs",
                                      value=self._deep_bytes)
            if self._deep_pass:
                d = self._deep_pass
                yield GaugeMetricFamily(f"{PREFIX}deep_pass_progress_ratio", "share of the current deep pass done",
                                        value=d["deep_pass_progress_permille"] / 1000)
                yield GaugeMetricFamily(f"{PREFIX}deep_passes_completed", "deep passes completed",
                                        value=d["deep_passes_completed"])
                yield GaugeMetricFamily(f"{PREFIX}deep_unverified_age_seconds",
                                        "debt: since the oldest deep verification of any ledger (or since the pass "
                                        "began, for ledgers never verified)",
                                        value=time.time() - d["deep_oldest_verified_ms"] / 1000)
            duration = GaugeMetricFamily(f"{PREFIX}last_run_duration_seconds", "last complete run", labels=["kind"])
            phases = GaugeMetricFamily(f"{PREFIX}last_run_phase_seconds", "phases of the last complete run",
                                       labels=["kind", "phase"])
            age = GaugeMetricFamily(f"{PREFIX}last_complete_run_age_seconds",
                                    "since the last complete run of the kind (while leading: since leading, "
                                    "before the first)", labels=["kind"])
            now = time.time()
            for kind, run in sorted(self._last.items()):
                duration.add_metric([kind], run.duration_ms / 1000)
                for phase in PHASES:
                    if phase in run.report.stats:
                        phases.add_metric([kind, phase.removesuffix("_ms")], run.report.stats[phase] / 1000)
            if self.leading:
                for kind in sorted(set(self._finished_at) | {"full"}):
                    age.add_metric([kind], now - self._finished_at.get(kind, self._leading_since))
            yield duration
            yield phases
            yield age

    def close(self) -> None:
        self.endpoint.close()
