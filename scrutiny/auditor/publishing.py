"""Where the auditor's runs go. A finished run goes to every sink and into the current state (a whole-cluster
run replaces it); while this auditor leads, what the next leader inherits goes to the store (the run's
summary, the history, the cadence, the deep pass's cursor). On election, what an earlier leader left (its
last complete runs) is exported at once, with its true age: a failover never clears an alert on data still
at risk. Skips and changes of leadership go to every sink too."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

from scrutiny.auditor import history
from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.deeprecord import record_deep_run
from scrutiny.auditor.lastrun import RunSummary, bequeath, inherit
from scrutiny.auditor.leadership import PeriodicRuns
from scrutiny.auditor.runkinds import DEEP, KIND_CATEGORIES, PERIODIC, WHOLE_CLUSTER_KINDS
from scrutiny.auditor.runqueue import Ticket
from scrutiny.auditor.sinks import FinishedRun, ReportSink
from scrutiny.config import AuditorSettings
from scrutiny.report import Report
from scrutiny.store import MetadataStore
from scrutiny.times import now_ms

log = logging.getLogger(__name__)


class Leading(NamedTuple):
    """What a leader writes a finished run to: its store, under its settings, and its periodic runs' cadence."""

    store: MetadataStore
    settings: AuditorSettings
    periodic: PeriodicRuns


class Publisher:
    def __init__(self, current: CurrentState) -> None:
        self.current = current
        self.sinks: list[ReportSink] = []  # the auditor's, as configured now (a reload replaces them)
        self.inherited: dict[str, RunSummary] = {}  # kind -> the last complete run, as an earlier leader left it

    def _each(self, tell: str, *args: object) -> None:
        for sink in self.sinks:
            try:
                getattr(sink, tell)(*args)
            except Exception:  # one sink failing never keeps a run from the others
                log.exception("report sink %s failed", type(sink).__name__)

    def published(self, ticket: Ticket, report: Report, ran_by: str, leading: Leading | None) -> None:
        ticket.finished_ms = now_ms()
        if ticket.kind == DEEP and report.complete and leading is not None:
            record_deep_run(leading.store, leading.settings, ticket, report)
        run = FinishedRun(ticket.kind, report, ticket.finished_ms - ticket.started_ms, KIND_CATEGORIES[ticket.kind],
                          whole_cluster=ticket.whole_cluster, finished_ms=ticket.finished_ms, ran_by=ran_by)
        self._each("published", run)
        if ticket.judged_every_ledger(report):
            missed = self.current.full_run(report.violations, ticket.started_ms, ticket.finished_ms, ticket.kind,
                                           report.repair, KIND_CATEGORIES[ticket.kind],
                                           judges_continuous=ticket.kind != DEEP, unsettled=report.unsettled)
            if missed:
                log.warning("run %s: %d findings continuous scrutiny should have made", ticket.run_id, missed)
        elif report.complete and run.whole_cluster:  # the marks' age: every mark was looked at
            self.current.replaced(report.violations, ticket.finished_ms, ticket.kind, KIND_CATEGORIES[ticket.kind])
        if leading is None or not report.complete:
            return
        if run.whole_cluster:
            self.inherited.pop(ticket.kind, None)
            bequeath(leading.store, run.summary)
            history.record(leading.store, history.point_of(ticket.kind, report, ticket.finished_ms, run.duration_ms))
        if ticket.kind in PERIODIC:
            leading.periodic.record(ticket.kind, ticket.started_ms)

    def elected(self, store: MetadataStore, own_last: Mapping[str, int]) -> None:
        """This auditor leads now: every sink is told, and the last complete run of each kind, whichever auditor
        ran it (unless this one ran a newer one: `own_last`, kind -> finished ms), is exported at once."""
        self._each("leadership", True)
        for summary in inherit(store, WHOLE_CLUSTER_KINDS, own_last):
            self.inherited[summary.kind] = summary
            self._each("restored", summary)

    def deposed(self) -> None:
        self.inherited.clear()
        self._each("leadership", False)

    def skipped(self, kind: str, reason: str) -> None:
        self._each("skipped", kind, reason)
