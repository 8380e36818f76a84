"""The leader's hand-off to BookKeeper's autorecovery (`auditor.repair: mark`; `dry-run` lists what it would mark).

Each hand-off takes the current findings that autorecovery repairs once marked (`plan.candidates`), drops
those whose ledger is marked already, keeps what the limits allow, and looks at those ledgers again as any run
does (their metadata, the agents, the second look). Only a finding that look finds again is marked, with the
metadata version that look judged: the store writes the mark only if the ledger is still at that version and
still unmarked (one transaction), so a ledger deleted, re-replicated or marked meanwhile is never marked by us.
Nothing while re-replication is disabled. Each mark written is then followed to its end (`followup`): once a
worker removes it, the ledger is looked at again, and the repair is verified or the loss reported. Every
outcome goes to the journal: the log, `/api/v1/handoffs`, and `handoffs.jsonl` beside the reports.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from scrutiny.checks import Violation
from scrutiny.checks.remedy import RepairContext
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.errors import Fenced
from scrutiny.metadata import UnderreplicationMark
from scrutiny.repair.followup import Followed, unrepaired
from scrutiny.repair.kept import HANDOFF_RECORD, GivenUp, Kept
from scrutiny.repair.plan import (
    ALREADY_MARKED,
    CHANGED,
    DELETED,
    DRY_RUN,
    FENCED,
    MARK,
    MARKED,
    NOT_AGAIN,
    NOT_CONFIRMED,
    OFF,
    OVERDUE,
    REPAIRED,
    UNREPAIRED,
    WOULD_MARK,
    Candidate,
    Handed,
    MarkBudget,
    candidates,
)
from scrutiny.report import Report
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import Fence, MetadataStore

log = logging.getLogger(__name__)
JOURNAL_KEPT = 1000
JOURNAL_FILE = "handoffs.jsonl"


class Leader(Protocol):
    """What the hand-off needs of the process that leads (the auditor; the soak)."""

    stopping: threading.Event

    def settings(self) -> tuple[ScanSettings, AuditorSettings]:
        """As reloaded."""

    def findings(self) -> Iterable[Violation]:
        """The current findings."""

    def store(self) -> MetadataStore: ...

    def leading(self) -> bool: ...

    def fence(self) -> Fence | None:
        """Its own election node while it leads: each mark is written only while it stands."""

    def name(self) -> str:
        """Who hands off, in the journal."""

    def looked_again(self, ledger_ids: list[int], found: list[Violation]) -> None:
        """What a look at these ledgers found, into the current findings."""


class Handoff:
    """The leader's: the scheduler calls `tick`; the console lists `handed`."""

    def __init__(self, leader: Leader) -> None:
        self.leader = leader
        self.budget = MarkBudget(0, 0)
        self._settings()
        self.journal: deque[Handed] = deque(maxlen=JOURNAL_KEPT)  # the newest last
        self.followed: dict[int, Followed] = {}  # the marks it follows, until each comes to its end
        self.given_up: dict[int, GivenUp] = {}  # never marked again at that metadata version
        self._loaded = False  # what the leaders kept, read since this process leads
        self._done: set[tuple[object, ...]] = set()  # handed off (or found marked), per metadata version
        self._unconfirmed: set[tuple[object, ...]] = set()  # journaled once; looked at again each hand-off
        self._seen: dict[int, Candidate] = {}  # the candidates at the last hand-off
        self._lock = threading.Lock()

    def tick(self) -> None:
        """The leader's scheduler calls it every `repair_interval_seconds`."""
        try:
            self.run()
        except Exception as exc:  # the store away for a moment: the findings stay, the next hand-off tries again
            log.warning("hand-off failed (%s): trying again at the next", exc)

    def run(self) -> list[Handed]:
        """One hand-off: the marks it follows followed, then the current findings handed off; what it did."""
        self._settings()
        if self.mode == OFF:
            return []
        with self._lock:
            if not self.leader.leading():
                self._loaded = False  # the next leader goes on from the record: read it again if this one leads
                return []
            if not self._loaded:
                self._load()
            kept = self._kept()
            try:
                return self._run()
            finally:
                if self._kept() != kept:
                    self._save()

    def _run(self) -> list[Handed]:
        out = self._follow() if self.followed else []
        found = candidates(self.leader.findings(), self._context())
        self._restore_given_up(found)
        found = [c for c in found if not self._given_up(c)]
        # runs drop the finding of a ledger being repaired: one gone since the last hand-off may be marked
        seen, self._seen = self._seen, {c.ledger_id: c for c in found}
        vanished = [c for lid, c in seen.items() if lid not in self._seen and lid not in self.followed]
        self._done &= {c.key for c in found}
        self._unconfirmed &= {c.key for c in found}
        waiting = [c for c in found if c.key not in self._done and c.ledger_id not in self.followed]
        if not (waiting or vanished) or not self.leader.leading():
            return out
        store = self.leader.store()
        if store.replication_disabled():
            log.info("hand-off: re-replication is disabled: marking none of %d ledgers", len(waiting))
            return out
        marked = store.marked(c.ledger_id for c in [*waiting, *vanished])
        if marked:
            out += self._marked_already([c for c in [*waiting, *vanished] if c.ledger_id in marked], store)
        waiting = [c for c in waiting if c.ledger_id not in marked]
        allowed = self.budget.allowance(time.monotonic())
        if len(waiting) > allowed:
            log.info("hand-off: %d ledgers to mark, %d allowed now (repair_marks_per_run, "
                     "repair_marks_per_minute): the rest at the next hand-off", len(waiting), allowed)
        if waiting[:allowed]:
            out += self._confirm_and_mark(store, waiting[:allowed])
        return out

    def _load(self) -> None:
        """What the leaders kept: the marks to follow, the ledgers not to mark again (a new leader goes on)."""
        kept = HANDOFF_RECORD.read(self.leader.store())
        self.followed, self.given_up = dict(kept.followed), dict(kept.given_up)
        self._done.clear()
        self._unconfirmed.clear()
        self._loaded = True
        if self.followed or self.given_up:
            log.info("hand-off: following %d marks the leaders kept; %d ledgers not to be marked again",
                     len(self.followed), len(self.given_up))

    def _kept(self) -> Kept:
        return Kept(dict(self.followed), dict(self.given_up))

    def _save(self) -> None:
        try:
            HANDOFF_RECORD.write(self.leader.store(), self._kept())
        except Exception as exc:  # written again at the next change; until then a new leader would not know
            log.warning("hand-off: could not keep what it follows in the leaders' record: %s", exc)

    def _given_up(self, c: Candidate) -> bool:
        """A ledger a worker unmarked without repair, still at that metadata version: noted once, never marked."""
        g = self.given_up.get(c.ledger_id)
        if g is None or g.metadata_version != c.metadata_version:
            return False
        if c.key not in self._done:
            self._note(c, NOT_AGAIN)
        return True

    def _restore_given_up(self, found: list[Candidate]) -> None:
        """The finding that says why a ledger is not marked again stands, under this leader too, while its loss
        does (a new leader's runs find the loss, not that a worker gave it up)."""
        back = [g.finding for c in found if (g := self.given_up.get(c.ledger_id)) is not None
                and g.metadata_version == c.metadata_version]
        if back:
            self.leader.looked_again([], back)

    def _marked_already(self, found: list[Candidate], store: MetadataStore) -> list[Handed]:
        """Findings BookKeeper's own Auditor marked (or an operator): followed to their end as well (seconds
        from the mark's ctime)."""
        now_ms = int(time.time() * 1000)
        marks, _ = store.marks_of(c.ledger_id for c in found)
        for c in found:
            if self.mode == MARK:
                mark = marks.get(c.ledger_id)
                self.followed[c.ledger_id] = Followed(c, mark.ctime if mark and mark.ctime else now_ms)
        return [self._note(c, ALREADY_MARKED) for c in found]

    def _look(self, store: MetadataStore, ledger_ids: list[int]) -> Report | None:
        """A run over these ledgers, as any run looks (None: it did not complete; the next hand-off tries again)."""
        report = ScrutinyRun(self.scan, LocalEngine(), kind="handoff", sleep=self._pause,
                             store=store).execute(ledger_ids=ledger_ids)
        if not report.complete:
            log.info("hand-off: a look did not complete (%s): trying at the next hand-off", report.errors[:1])
            return None
        return report

    def _confirm_and_mark(self, store: MetadataStore, chosen: list[Candidate]) -> list[Handed]:
        report = self._look(store, [c.ledger_id for c in chosen])
        if report is None:
            return []
        # found again: the ledger still has a finding autorecovery repairs (the look's own, which the mark names)
        again = {c.ledger_id: c for c in candidates(report.violations, self._context())}
        out = []
        for c in chosen:
            now = again.get(c.ledger_id)
            if now is None:
                if c.key not in self._unconfirmed:
                    self._unconfirmed.add(c.key)
                    out.append(self._note(c, NOT_CONFIRMED, report.run_id, done=False))
                continue
            if self.mode == DRY_RUN:
                out.append(self._note(now, WOULD_MARK, report.run_id))
                continue
            fence = self.leader.fence()
            if not self.leader.leading() or fence is None or self.leader.stopping.is_set():
                break
            self.budget.spent(time.monotonic())
            mark = UnderreplicationMark(now.ledger_id, now.replicas, int(time.time() * 1000))
            try:
                written = store.mark_underreplicated(mark, now.metadata_version, fence)
            except Fenced as exc:  # deposed, whatever this process still believes: nothing more from it
                log.warning("hand-off: %s", exc)
                out.append(self._note(now, FENCED, report.run_id, done=False))
                break
            out.append(self._note(now, MARKED if written else CHANGED, report.run_id))
            if written:
                self.followed[now.ledger_id] = Followed(now, mark.ctime or 0)
                self.given_up.pop(now.ledger_id, None)  # of another metadata version
                # kept at once: a leader that dies before the hand-off ends leaves no mark unfollowed (a new
                # leader's runs drop a marked ledger's finding: it would not adopt the mark)
                self._save()
        return out

    def _follow(self) -> list[Handed]:
        """Each mark it wrote: still there past the deadline (noted once), or gone, and then repaired, deleted,
        or unmarked without repair (a finding, into the current state)."""
        store = self.leader.store()
        now_ms, out = int(time.time() * 1000), []
        still = store.marked(list(self.followed))
        for lid in still:
            f = self.followed[lid]
            if not f.overdue_noted and now_ms - f.marked_ms > self.deadline_s * 1000:
                self.followed[lid] = dataclasses.replace(f, overdue_noted=True)
                out.append(self._note(f.candidate, OVERDUE, seconds=(now_ms - f.marked_ms) / 1000))
        ended = sorted(set(self.followed) - still)
        if not ended:
            return out
        gone = {r.ledger_id for r in store.read_ledgers(ended) if r.deleted}
        alive = [lid for lid in ended if lid not in gone]
        report = self._look(store, alive) if alive else None
        if alive and report is None:
            return out  # the look did not complete: the next hand-off follows them
        remarked = store.marked(alive) if alive else set()  # the look dropped what is being repaired again
        unrepaired_found = []
        for lid in [x for x in ended if x not in remarked]:
            f = self.followed.pop(lid)
            seconds = (now_ms - f.marked_ms) / 1000
            v = None if report is None or lid in gone else unrepaired(f, report.violations, now_ms, self._context())
            if v is not None:
                unrepaired_found.append(v)
                self.given_up[lid] = GivenUp(f.candidate.metadata_version, now_ms, v)
            outcome = DELETED if lid in gone else UNREPAIRED if v is not None else REPAIRED
            out.append(self._note(f.candidate, outcome, report.run_id if report else "", seconds=seconds))
        if report is not None:
            self.leader.looked_again([x for x in alive if x not in remarked], [*report.violations, *unrepaired_found])
        return out

    def _note(self, c: Candidate, outcome: str, run_id: str = "", done: bool = True,
              seconds: float | None = None) -> Handed:
        if done:
            self._done.add(c.key)
        h = Handed(int(time.time() * 1000), self.leader.name(), c, outcome, run_id, seconds)
        self.journal.append(h)
        log.log(logging.WARNING if outcome in (MARKED, UNREPAIRED, OVERDUE) else logging.INFO,
                "hand-off by %s: ledger %d (%s, missing replicas %s): %s%s; %s", h.by, c.ledger_id, c.category,
                ",".join(c.replicas), outcome, f" after {seconds:.1f} s" if seconds is not None else "", c.why)
        try:
            with self.file.open("a") as f:
                f.write(json.dumps(h.to_json()) + "\n")
        except OSError as exc:
            log.error("hand-off: cannot append to %s (%s); the journal is kept in memory", self.file, exc)
        return h

    def _settings(self) -> None:
        self.scan, settings = self.leader.settings()
        self.mode, self.file = settings.repair, Path(settings.reports_dir) / JOURNAL_FILE
        self.deadline_s = settings.repair_deadline_seconds
        self.budget.per_run, self.budget.per_minute = settings.repair_marks_per_run, settings.repair_marks_per_minute

    def _context(self) -> RepairContext:
        return RepairContext(self.scan.auditor_ledger_verification_percentage, replication_disabled=False)

    def _pause(self, seconds: float) -> None:
        self.leader.stopping.wait(seconds)

    def handed(self, since_ms: int = 0) -> list[Handed]:
        """The journal, the newest first."""
        return [h for h in reversed(self.journal) if h.at_ms > since_ms]
