"""Where the auditor's reports go. A sink is told of every finished run, every skipped one, and the
changes of leadership; a new destination (a metrics system, say) is one new class here."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import statsd
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from scrutiny.auditor.lastrun import RunSummary
from scrutiny.categories import CATEGORY_NAMES, REGISTRY, Category, spec
from scrutiny.prometheus import PREFIX, HttpsFiles, MetricsEndpoint
from scrutiny.report import Report
from scrutiny.store.facts import PARTS

if TYPE_CHECKING:
    from scrutiny.auditor.continuous import Continuous
    from scrutiny.auditor.currentstate import CurrentState

log = logging.getLogger(__name__)

PHASES = ("first_pass_ms", "recheck_ms", "verify_ms")  # the stats that time a run's phases


@dataclass(frozen=True)
class FinishedRun:
    kind: str
    report: Report
    duration_ms: int
    categories: tuple[Category, ...]  # those the run looked at
    whole_cluster: bool = True  # every ledger (or every mark), not a rescan of some
    finished_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    ran_by: str = ""  # the auditor that ran it

    @functools.cached_property
    def summary(self) -> RunSummary:
        """What outlives the run (computed once, for every sink and the store)."""
        return RunSummary.of(self.kind, self.report, self.finished_ms, self.duration_ms, self.categories, self.ran_by)


class ReportSink:
    def published(self, run: FinishedRun) -> None:
        pass

    def restored(self, summary: RunSummary) -> None:
        """The last complete run of a kind, as an earlier leader recorded it: this auditor just took over."""

    def skipped(self, kind: str, reason: str) -> None:
        pass

    def leadership(self, leading: bool) -> None:
        pass

    def close(self) -> None:
        pass

    def destination(self) -> str:
        """Where this sink sends reports, for the log line an operator reads at start."""
        return type(self).__name__


class ReportFiles(ReportSink):
    """`<reports_dir>/<kind>/<started>-<run id>.json`, written atomically, the newest `keep` kept. A run
    inherited from an earlier leader is written as its summary (`summary_only`) unless its report is here."""

    def __init__(self, directory: str, keep: int) -> None:
        self.directory, self.keep = Path(directory), keep

    def destination(self) -> str:
        return f"reports to {self.directory.resolve()} (the newest {self.keep} of each kind)"

    def published(self, run: FinishedRun) -> None:
        self._write(run.kind, run.report.started_at, run.report.run_id, run.report.write_json, replace=True)

    def restored(self, summary: RunSummary) -> None:
        self._write(summary.kind, summary.started_at, summary.run_id,
                    lambda out: json.dump(summary.report_json(), out, indent=2), replace=False)

    def _write(self, kind: str, started_at: str, run_id: str, write: Callable[[TextIO], None],
               replace: bool) -> None:
        folder = self.directory / kind
        name = f"{started_at.replace(':', '')}-{run_id}.json"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not replace and (folder / name).exists():
                return
            tmp = folder / f".{name}.tmp"
            with tmp.open("w") as out:  # a finding at a time: the report is never one string
                write(out)
            os.replace(tmp, folder / name)
            for old in sorted(folder.glob("*.json"))[:-self.keep]:
                old.unlink()
        except OSError as exc:
            log.error("could not write the report of run %s: %s", run_id, exc)


class StatsdSink(ReportSink):
    """The contract's StatsD names: counters per category, gauges under BookKeeper's auditor names,
    timers, ledgers checked, failed bookie calls, runs by kind and outcome."""

    def __init__(self, host: str, port: int = 8125, prefix: str = "scrutiny") -> None:
        self.client = statsd.StatsClient(host, port, prefix=prefix)
        self.where = f"StatsD to {host}:{port} (prefix {prefix})"

    def destination(self) -> str:
        return self.where

    def published(self, run: FinishedRun) -> None:
        report, kind = run.report, run.kind
        try:
            # A pipeline packs several metrics per datagram: fewer packets to drop under load.
            with self.client.pipeline() as pipe:
                for cat, n in run.summary.counts.items():  # the categories the run looked at
                    pipe.incr(f"violations.{cat}", n)
                _bookkeeper_gauges(pipe, run.summary.counts)
                pipe.timing(f"run.{kind}.duration", run.duration_ms)
                for phase in PHASES:
                    if phase in report.stats:
                        pipe.timing(f"run.{kind}.{phase.removesuffix('_ms')}", report.stats[phase])
                pipe.incr("ledgers.checked", report.ledgers.get("checked", 0))
                pipe.incr("bookie_calls.failed", report.stats.get("bookie_calls_failed", 0))
                pipe.incr(f"runs.{kind}.{'complete' if report.complete else 'incomplete'}")
        except OSError as exc:
            log.warning("StatsD: %s", exc)

    def restored(self, summary: RunSummary) -> None:
        try:
            with self.client.pipeline() as pipe:
                _bookkeeper_gauges(pipe, summary.counts)
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

    def __init__(self, listen: str, https: HttpsFiles | None = None) -> None:
        self.listen = listen
        self._lock = threading.Lock()
        self.leading = False
        self._leading_since = time.time()
        self._leaderships = 0
        self._last: dict[str, RunSummary] = {}  # kind -> its last complete whole-cluster run, here or inherited
        self._reported: Counter[str] = Counter()
        self._runs: Counter[tuple[str, str]] = Counter()
        self._skipped: Counter[tuple[str, str]] = Counter()
        self._checked = 0
        self._calls_failed = 0
        self._deep_bytes = 0
        self.current: CurrentState | None = None  # the leader's current state (continuous scrutiny)
        self.continuous: Continuous | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.endpoint = MetricsEndpoint(listen, self.registry, https=https)

    def destination(self) -> str:
        return f"/metrics on {self.listen}, port {self.endpoint.port} ({self.endpoint.scheme}; the console at /)"

    def published(self, run: FinishedRun) -> None:
        report = run.report
        with self._lock:
            self._runs[(run.kind, "complete" if report.complete else "incomplete")] += 1
            self._checked += report.ledgers.get("checked", 0)
            self._calls_failed += report.stats.get("bookie_calls_failed", 0)
            self._deep_bytes += report.stats.get("deep_bytes_read", 0)
            self._reported.update({str(c): n for c, n in report.violations.counts().items()})
            if report.complete and run.whole_cluster:
                self._last[run.kind] = run.summary

    def restored(self, summary: RunSummary) -> None:
        with self._lock:
            mine = self._last.get(summary.kind)
            if mine is None or mine.finished_ms < summary.finished_ms:
                self._last[summary.kind] = summary

    def skipped(self, kind: str, reason: str) -> None:
        with self._lock:
            self._skipped[(kind, reason)] += 1

    def leadership(self, leading: bool) -> None:
        with self._lock:
            self.leading = leading
            self._leading_since = time.time()
            self._leaderships += leading
            if not leading:  # a standby's gauges would be stale: the leader's are the truth
                self._last.clear()

    def _newest(self) -> list[RunSummary]:
        """The last runs, oldest first: where kinds look at the same category, the newer run wins."""
        return sorted(self._last.values(), key=lambda r: r.finished_ms)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            runs = self._newest()
            counts: dict[str, int] = {}
            underreplicated: int | None = None
            unavailable: dict[str, int] = {}
            slow: tuple[str, ...] = ()
            blast: dict[str, dict[str, dict[str, int]]] = {}
            orphans: dict[str, dict[str, int]] = {}
            lost: dict[str, dict[str, int]] = {}
            deep_pass: dict[str, int] = {}
            for run in runs:
                if run.looked_at(Category.ORPHAN_LEDGER):
                    orphans = run.orphans
                if run.looked_at(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED):
                    lost = run.lost
                counts.update(run.counts)
                underreplicated = run.stats.get("underreplicated_marks", underreplicated)
                if run.looked_at(Category.BOOKIE_UNAVAILABLE):
                    unavailable, slow = run.unavailable, run.slow
                if run.blast_radius is not None:
                    blast = run.blast_radius
                if "deep_pass_slices" in run.stats:
                    deep_pass = run.stats
            yield GaugeMetricFamily(f"{PREFIX}leader", "1 while this auditor leads", value=int(self.leading))
            yield CounterMetricFamily(f"{PREFIX}leaderships", "times this auditor became the leader (a lost "
                                      "session ends a leadership)", value=self._leaderships)
            yield GaugeMetricFamily(f"{PREFIX}python_allocated_blocks",
                                    "memory blocks the interpreter holds (sys.getallocatedblocks): the Python heap, "
                                    "apart from native memory", value=sys.getallocatedblocks())
            if self.leading and self.current is not None and self.current.baseline_ms:
                # the current state: the last full run's findings, those found since, less those cleared
                now = self.current.counts()
                counts = {cat: now.get(cat, 0) for cat in counts}
            violations = GaugeMetricFamily(f"{PREFIX}violations", "ledgers per category now: the last complete "
                                           "run's, updated by continuous scrutiny", labels=["category"])
            for cat, n in counts.items():
                violations.add_metric([cat], n)
                gauge = _bookkeeper_gauge(cat)
                if gauge:
                    yield GaugeMetricFamily(f"auditor_{gauge}",
                                            f"BookKeeper's auditor gauge: {spec(Category(cat)).summary}", value=n)
            yield violations
            if underreplicated is not None:
                yield GaugeMetricFamily(f"{PREFIX}underreplicated_ledgers",
                                        "ledgers marked under-replicated now (a gauge, unlike upstream's summary)",
                                        value=underreplicated)
            unavailable_family = GaugeMetricFamily(f"{PREFIX}bookie_unavailable_ledgers",
                                                   "ledgers a silent, registered bookie left unchecked, last full run "
                                                   "(silence: slow, its agent answered its health check but not "
                                                   "in time; down, not even that)", labels=["bookie", "silence"])
            for bookie, n in sorted(unavailable.items()):
                unavailable_family.add_metric([bookie, "slow" if bookie in slow else "down"], n)
            yield unavailable_family
            yield from _blast_families(blast)
            yield from _orphan_families(orphans)
            yield from _lost_families(lost)
            if self.leading:
                yield from _continuous_families(self.current, self.continuous)
            reported = CounterMetricFamily(f"{PREFIX}violations_reported", "findings reported, every run",
                                           labels=["category"])
            for cat in REGISTRY:
                reported.add_metric([str(cat)], self._reported[str(cat)])
            yield reported
            finished = CounterMetricFamily(f"{PREFIX}runs", "finished runs", labels=["kind", "outcome"])
            for (kind, outcome), n in sorted(self._runs.items()):
                finished.add_metric([kind, outcome], n)
            yield finished
            skipped = CounterMetricFamily(f"{PREFIX}runs_skipped", "runs not started", labels=["kind", "reason"])
            for (kind, reason), n in sorted(self._skipped.items()):
                skipped.add_metric([kind, reason], n)
            yield skipped
            yield CounterMetricFamily(f"{PREFIX}ledgers_checked", "ledgers checked", value=self._checked)
            yield CounterMetricFamily(f"{PREFIX}bookie_calls_failed", "calls to bookie agents that failed",
                                      value=self._calls_failed)
            yield CounterMetricFamily(f"{PREFIX}deep_read_bytes", "entry-log bytes the agents read for deep scrubs",
                                      value=self._deep_bytes)
            if deep_pass:
                yield GaugeMetricFamily(f"{PREFIX}deep_pass_progress_ratio", "share of the current deep pass done",
                                        value=deep_pass["deep_pass_progress_permille"] / 1000)
                yield GaugeMetricFamily(f"{PREFIX}deep_passes_completed", "deep passes completed",
                                        value=deep_pass["deep_passes_completed"])
                yield GaugeMetricFamily(f"{PREFIX}deep_unverified_age_seconds",
                                        "debt: since the oldest deep verification of any ledger (or since the pass "
                                        "began, for ledgers never verified)",
                                        value=time.time() - deep_pass["deep_oldest_verified_ms"] / 1000)
            yield from self._run_families(runs)

    def _run_families(self, runs: list[RunSummary]) -> Iterator[Metric]:
        duration = GaugeMetricFamily(f"{PREFIX}last_run_duration_seconds", "last complete run", labels=["kind"])
        phases = GaugeMetricFamily(f"{PREFIX}last_run_phase_seconds", "phases of the last complete run",
                                   labels=["kind", "phase"])
        age = GaugeMetricFamily(f"{PREFIX}last_complete_run_age_seconds",
                                "since the last complete run of the kind, whichever auditor ran it (while leading: "
                                "since leading, before the first)", labels=["kind"])
        now = time.time()
        finished = {r.kind: r.finished_ms / 1000 for r in runs}
        for run in sorted(runs, key=lambda r: r.kind):
            duration.add_metric([run.kind], run.duration_ms / 1000)
            for phase in PHASES:
                if phase in run.stats:
                    phases.add_metric([run.kind, phase.removesuffix("_ms")], run.stats[phase] / 1000)
        if self.leading:
            for kind in sorted(set(finished) | {"full"}):
                age.add_metric([kind], now - finished.get(kind, self._leading_since))
        yield duration
        yield phases
        yield age

    def close(self) -> None:
        self.endpoint.close()


def _blast_families(blast: dict[str, dict[str, dict[str, int]]]) -> Iterator[Metric]:
    ledgers = GaugeMetricFamily(f"{PREFIX}blast_radius_ledgers",
                                "ledgers that would fall below AQ (impact below_aq) or lose every copy of an "
                                "entry (no_copy) were this bookie or rack alone down, last full run",
                                labels=["scope", "name", "impact"])
    topics = GaugeMetricFamily(f"{PREFIX}blast_radius_topics", "the same, in topics",
                               labels=["scope", "name", "impact"])
    for scope, per in sorted(blast.items()):
        for name, f in sorted(per.items()):
            s = scope.removesuffix("s")
            ledgers.add_metric([s, name, "below_aq"], f.get("ledgers_below_aq", 0))
            ledgers.add_metric([s, name, "no_copy"], f.get("ledgers_without_a_copy", 0))
            topics.add_metric([s, name, "below_aq"], f.get("topics_below_aq", 0))
            topics.add_metric([s, name, "no_copy"], f.get("topics_without_a_copy", 0))
    yield ledgers
    yield topics


def _orphan_families(orphans: dict[str, dict[str, int]]) -> Iterator[Metric]:
    """The disk orphans hold on each bookie (ORPHAN_LEDGER, last whole-cluster run)."""
    ledgers = GaugeMetricFamily(f"{PREFIX}orphan_ledgers", "ledgers this bookie holds that the metadata has not "
                                "had for longer than the grace period, last full run", labels=["bookie"])
    entries = GaugeMetricFamily(f"{PREFIX}orphan_entries", "their entries on this bookie", labels=["bookie"])
    stored = GaugeMetricFamily(f"{PREFIX}orphan_bytes", "the bytes this bookie stores for them (DbLedgerStorage "
                               "agents; a lower bound where some are unknown)", labels=["bookie"])
    for bookie, f in sorted(orphans.items()):
        ledgers.add_metric([bookie], f.get("ledgers", 0))
        entries.add_metric([bookie], f.get("entries", 0))
        stored.add_metric([bookie], f.get("bytes", 0))
    yield ledgers
    yield entries
    yield stored


def _lost_families(lost: dict[str, dict[str, int]]) -> Iterator[Metric]:
    """The ledgers of each lost bookie that nobody marked (LOST_BOOKIE_RECOVERY_NOT_STARTED, last full run)."""
    ledgers = GaugeMetricFamily(f"{PREFIX}lost_bookie_ledgers", "closed ledgers naming this bookie, gone from the "
                                "registrations past lostBookieRecoveryDelay and the grace, not marked "
                                "under-replicated, last full run", labels=["bookie"])
    below = GaugeMetricFamily(f"{PREFIX}lost_bookie_ledgers_below_aq", "those of them with some entry below its ack "
                              "quorum on the bookies still registered", labels=["bookie"])
    for bookie, f in sorted(lost.items()):
        ledgers.add_metric([bookie], f.get("ledgers", 0))
        below.add_metric([bookie], f.get("below_aq", 0))
    yield ledgers
    yield below


def _continuous_families(current: CurrentState | None, continuous: Continuous | None) -> Iterator[Metric]:
    """Continuous scrutiny on the leader: whether it watches, its feeds, its gaps, what it missed."""
    if current is None or continuous is None:
        return
    yield GaugeMetricFamily(f"{PREFIX}continuous_watching", "1 while continuous scrutiny has seen every change "
                            "since watching_since (0: not watching)", value=int(current.watching_since_ms > 0))
    feeds = GaugeMetricFamily(f"{PREFIX}continuous_feeds", "change feeds followed, by state (up, down, "
                              "unavailable: a source or store that cannot watch)", labels=["kind", "state"])
    states = Counter(("metadata" if f == "metadata" else "agent", st) for f, st in list(continuous.feeds.items()))
    for (kind, st), n in sorted(states.items()):
        feeds.add_metric([kind, st], n)
    yield feeds
    stats = continuous.stats
    gaps = CounterMetricFamily(f"{PREFIX}continuous_feed_gaps", "times a feed may have missed changes (each "
                               "schedules a full run)", labels=["kind"])
    for kind in ("metadata", "agent"):
        gaps.add_metric([kind], stats[f"gaps.{kind}"])
    yield gaps
    yield GaugeMetricFamily(f"{PREFIX}continuous_pending", "ledgers and bookies waiting for continuous "
                            "scrutiny's look, or being looked at", value=continuous.pending())
    yield CounterMetricFamily(f"{PREFIX}continuous_degraded", "mass events looked at by a full run instead "
                              "(continuous_max_ledgers_per_second)", value=stats["degraded"])
    yield CounterMetricFamily(f"{PREFIX}continuous_ledgers_checked", "ledgers looked at by continuous scrutiny",
                              value=stats["ledgers_checked"])
    yield CounterMetricFamily(f"{PREFIX}continuous_missed", "findings of a full run that continuous scrutiny, "
                              "watching without a gap, should have made and did not", value=current.missed)
    reads = CounterMetricFamily(f"{PREFIX}continuous_fact_reads", "the cluster's facts read from the store for "
                                "continuous scrutiny's looks, which keep them until the store's watch says they "
                                "changed or may have (a gap, a new leadership)", labels=["part"])
    for part in PARTS:
        reads.add_metric([part], continuous.fact_reads[part])
    yield reads


def _bookkeeper_gauge(category: str) -> str:
    return spec(Category(category)).bookkeeper_gauge if category in CATEGORY_NAMES else ""


def _bookkeeper_gauges(pipe: Any, counts: Mapping[str, int]) -> None:
    """StatsD gauges under BookKeeper's auditor names, for the categories that have one."""
    for cat, n in counts.items():
        gauge = _bookkeeper_gauge(cat)
        if gauge:
            pipe.gauge(f"auditor.{gauge}", n)
