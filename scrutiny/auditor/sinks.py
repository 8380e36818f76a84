"""Where the auditor's reports go. A sink is told of every finished run, every skipped one, and the
changes of leadership; a new destination (a metrics system, say) is one new class here."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import statsd

from scrutiny.auditor.lastrun import RunSummary
from scrutiny.categories import Category, bookkeeper_gauge
from scrutiny.report import Report
from scrutiny.runstats import Deep, Scan, Timings

log = logging.getLogger(__name__)


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
                timings = Timings.given(report.stats)
                for phase, ms in timings.phases().items() if timings is not None else ():
                    pipe.timing(f"run.{kind}.{phase}", ms)
                pipe.incr("ledgers.checked", report.ledgers.get("checked", 0))
                pipe.incr("bookie_calls.failed", Scan.of(report.stats).bookie_calls_failed)
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


class RunTallies(ReportSink):
    """What /metrics exports of the runs (`scrutiny.auditor.collector` reads it): the last complete
    whole-cluster run of each kind, run here or inherited, the counters of every run and skip, and this
    auditor's leadership. A standby keeps no run's gauges: the leader's are the truth."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t = Tallies()

    def published(self, run: FinishedRun) -> None:
        report = run.report
        with self._lock:
            t = self._t
            t.runs[(run.kind, "complete" if report.complete else "incomplete")] += 1
            t.checked += report.ledgers.get("checked", 0)
            t.calls_failed += Scan.of(report.stats).bookie_calls_failed
            t.deep_bytes += Deep.of(report.stats).deep_bytes_read
            t.reported.update(report.violations.counts())
            if report.complete and run.whole_cluster:
                t.last[run.kind] = run.summary

    def restored(self, summary: RunSummary) -> None:
        with self._lock:
            mine = self._t.last.get(summary.kind)
            if mine is None or mine.finished_ms < summary.finished_ms:
                self._t.last[summary.kind] = summary

    def skipped(self, kind: str, reason: str) -> None:
        with self._lock:
            self._t.skipped[(kind, reason)] += 1

    def leadership(self, leading: bool) -> None:
        with self._lock:
            t = self._t
            t.leading, t.leading_since = leading, time.time()
            t.leaderships += leading
            if not leading:  # a standby's gauges would be stale: the leader's are the truth
                t.last.clear()

    def snapshot(self) -> Tallies:
        """A copy to read without the lock (the summaries themselves are never changed)."""
        with self._lock:
            t = self._t
            return dataclasses.replace(t, last=dict(t.last), reported=Counter(t.reported), runs=Counter(t.runs),
                                       skipped=Counter(t.skipped))


@dataclass
class Tallies:
    leading: bool = False
    leading_since: float = field(default_factory=time.time)
    leaderships: int = 0
    last: dict[str, RunSummary] = field(default_factory=dict)  # kind -> its last complete whole-cluster run
    reported: Counter[Category] = field(default_factory=Counter)  # findings per category, every run
    runs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, outcome)
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, reason)
    checked: int = 0
    calls_failed: int = 0
    deep_bytes: int = 0

    def newest(self) -> list[RunSummary]:
        """The last runs, oldest first: where kinds look at the same category, the newer run wins."""
        return sorted(self.last.values(), key=lambda r: r.finished_ms)


def _bookkeeper_gauges(pipe: Any, counts: Mapping[Category, int]) -> None:
    """StatsD gauges under BookKeeper's auditor names, for the categories that have one."""
    for cat, n in counts.items():
        gauge = bookkeeper_gauge(cat)
        if gauge:
            pipe.gauge(f"auditor.{gauge}", n)
