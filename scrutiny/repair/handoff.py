"""The leader's hand-off to BookKeeper's autorecovery (`auditor.repair: mark`; `dry-run` lists what it would mark).

Each hand-off takes the current findings that autorecovery repairs once marked (`plan.candidates`), drops
those whose ledger is marked already, keeps what the limits allow, and looks at those ledgers again as any run
does (their metadata, the agents, the second look). Only a finding that look finds again is marked, with the
metadata version that look judged: the store writes the mark only if the ledger is still at that version and
still unmarked (one transaction), so a ledger deleted, re-replicated or marked meanwhile is never marked by us.
Nothing while re-replication is disabled. Every outcome goes to the journal: the log, `/api/v1/handoffs`, and
`handoffs.jsonl` beside the reports.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from scrutiny.checks import Violation
from scrutiny.checks.remedy import RepairContext
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.metadata import UnderreplicationMark
from scrutiny.repair.plan import (
    ALREADY_MARKED,
    CHANGED,
    DRY_RUN,
    MARKED,
    NOT_CONFIRMED,
    OFF,
    WOULD_MARK,
    Candidate,
    Handed,
    MarkBudget,
    candidates,
)
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import MetadataStore

log = logging.getLogger(__name__)
JOURNAL_KEPT = 1000
JOURNAL_FILE = "handoffs.jsonl"


class Handoff:
    def __init__(self, config: Callable[[], tuple[ScanSettings, AuditorSettings]],
                 findings: Callable[[], Iterable[Violation]], store: Callable[[], MetadataStore],
                 leading: Callable[[], bool], by: Callable[[], str], stopping: threading.Event | None = None) -> None:
        self.config, self.findings = config, findings  # the settings as reloaded; the current findings
        self.store, self.leading, self.by = store, leading, by
        self.budget = MarkBudget(0, 0)
        self._settings()
        self.journal: deque[Handed] = deque(maxlen=JOURNAL_KEPT)  # the newest last
        self.stopping = stopping or threading.Event()
        self._done: set[tuple[object, ...]] = set()  # handed off (or found marked), per metadata version
        self._unconfirmed: set[tuple[object, ...]] = set()  # journaled once; looked at again each hand-off
        self._lock = threading.Lock()

    def tick(self) -> None:
        """The leader's scheduler calls it every `repair_interval_seconds`."""
        try:
            self.run()
        except Exception as exc:  # the store away for a moment: the findings stay, the next hand-off tries again
            log.warning("hand-off failed (%s): trying again at the next", exc)

    def run(self) -> list[Handed]:
        """One hand-off; what it did."""
        self._settings()
        if self.mode == OFF:
            return []
        with self._lock:
            found = candidates(self.findings(), self._context())
            self._done &= {c.key for c in found}
            self._unconfirmed &= {c.key for c in found}
            waiting = [c for c in found if c.key not in self._done]
            if not waiting or not self.leading():
                return []
            store = self.store()
            if store.replication_disabled():
                log.info("hand-off: re-replication is disabled: marking none of %d ledgers", len(waiting))
                return []
            out = []
            marked = store.marked(c.ledger_id for c in waiting)
            for c in waiting:
                if c.ledger_id in marked:
                    out.append(self._note(c, ALREADY_MARKED))
            waiting = [c for c in waiting if c.ledger_id not in marked]
            allowed = self.budget.allowance(time.monotonic())
            if len(waiting) > allowed:
                log.info("hand-off: %d ledgers to mark, %d allowed now (repair_marks_per_run, "
                         "repair_marks_per_minute): the rest at the next hand-off", len(waiting), allowed)
            if waiting[:allowed]:
                out += self._confirm_and_mark(store, waiting[:allowed])
            return out

    def _confirm_and_mark(self, store: MetadataStore, chosen: list[Candidate]) -> list[Handed]:
        report = ScrutinyRun(self.scan, LocalEngine(), kind="handoff", sleep=self._pause,
                             store=store).execute(ledger_ids=[c.ledger_id for c in chosen])
        if not report.complete:
            log.info("hand-off: the look again did not complete (%s): trying at the next hand-off",
                     report.errors[:1])
            return []
        again = {(c.ledger_id, c.category): c for c in candidates(report.violations, self._context())}
        out = []
        for c in chosen:
            now = again.get((c.ledger_id, c.category))
            if now is None:
                if c.key not in self._unconfirmed:
                    self._unconfirmed.add(c.key)
                    out.append(self._note(c, NOT_CONFIRMED, report.run_id, done=False))
                continue
            if self.mode == DRY_RUN:
                out.append(self._note(now, WOULD_MARK, report.run_id))
                continue
            if not self.leading() or self.stopping.is_set():
                break
            self.budget.spent(time.monotonic())
            mark = UnderreplicationMark(now.ledger_id, now.replicas, int(time.time() * 1000))
            written = store.mark_underreplicated(mark, now.metadata_version)
            out.append(self._note(now, MARKED if written else CHANGED, report.run_id))
        return out

    def _note(self, c: Candidate, outcome: str, run_id: str = "", done: bool = True) -> Handed:
        if done:
            self._done.add(c.key)
        h = Handed(int(time.time() * 1000), self.by(), c, outcome, run_id)
        self.journal.append(h)
        log.log(logging.WARNING if outcome == MARKED else logging.INFO, "hand-off by %s: ledger %d (%s, missing "
                "replicas %s): %s; %s", h.by, c.ledger_id, c.category, ",".join(c.replicas), outcome, c.why)
        try:
            with self.file.open("a") as f:
                f.write(json.dumps(h.to_json()) + "\n")
        except OSError as exc:
            log.error("hand-off: cannot append to %s (%s); the journal is kept in memory", self.file, exc)
        return h

    def _settings(self) -> None:
        self.scan, settings = self.config()
        self.mode, self.file = settings.repair, Path(settings.reports_dir) / JOURNAL_FILE
        self.budget.per_run, self.budget.per_minute = settings.repair_marks_per_run, settings.repair_marks_per_minute

    def _context(self) -> RepairContext:
        return RepairContext(self.scan.auditor_ledger_verification_percentage, replication_disabled=False)

    def _pause(self, seconds: float) -> None:
        self.stopping.wait(seconds)

    def handed(self, since_ms: int = 0) -> list[Handed]:
        """The journal, the newest first."""
        return [h for h in reversed(self.journal) if h.at_ms > since_ms]
