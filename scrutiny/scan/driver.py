"""The driver of one scrutiny run.

It enumerates ledger ranges and hands them to an engine for the first pass; then it does BP-34's steps
upstream never built: ledgers whose bookies did not answer are re-checked after a delay, and before
reporting, ledgers now marked under-replicated are dropped and ledgers whose metadata changed meanwhile
are analysed again. Which findings each step touches comes from the category registry (the facts a
finding rests on), never from a list of categories here.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from scrutiny.categories import Category, Fact, resting_on
from scrutiny.checks import Violation, check_underreplication_age
from scrutiny.config import ScanSettings
from scrutiny.metadata import UnderreplicationMark
from scrutiny.report import Report
from scrutiny.scan.engines import Engine, Progress, make_engine
from scrutiny.scan.work import LEDGER_COUNTERS, Pass, RangeResult, RunContext
from scrutiny.store import LedgerRange, MetadataStore, MetadataStoreUnavailable, open_store

log = logging.getLogger(__name__)

_RECHECKED = resting_on(Fact.ANSWERS)  # a delayed re-check recomputes these
_ON_METADATA = resting_on(Fact.METADATA)  # re-read before reporting: the metadata must be unchanged


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class PendingRun:
    """A run between its first pass and its end (the delayed re-check). Its findings change only
    through `absorb` and `drop`."""

    store: MetadataStore
    started_ms: int
    ctx: RunContext
    marks: dict[int, UnderreplicationMark]
    scope: set[int] | None = None
    counts: Counter[str] = field(default_factory=lambda: Counter({k: 0 for k in LEDGER_COUNTERS}))
    violations: dict[tuple[Category, int], Violation] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    faulty: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def absorb(self, result: RangeResult, first_look: bool = True) -> None:
        """A pass's result. Ledgers looked at again were counted at their first look: only their
        deletions count again."""
        if first_look:
            self.counts.update(result.counts)
        else:
            self.counts["deleted_during_run"] += result.counts.get("deleted_during_run", 0)
        for k, v in result.stats.items():
            self.stats[k] = max(self.stats[k], v) if "peak" in k else self.stats[k] + v
        for found in result.violations:
            self.violations[(found.category, found.ledger_id)] = found
        for lid in result.deleted:
            self.drop(lid)
        self.errors += result.errors

    def drop(self, ledger_id: int, only: Iterable[Category] | None = None) -> None:
        wanted = set(only) if only is not None else None
        for key in [k for k in self.violations if k[1] == ledger_id and (wanted is None or k[0] in wanted)]:
            del self.violations[key]


class ScrutinyRun:
    def __init__(self, settings: ScanSettings, engine: Engine | None = None, progress: Progress | None = None,
                 sleep: Callable[[float], None] = time.sleep, run_id: str | None = None) -> None:
        self.settings = settings.validate()
        self.engine = engine or make_engine(settings)
        self.progress = progress
        self.sleep = sleep
        self.run_id = run_id or uuid.uuid4().hex[:12]

    def execute(self, ledger_ids: Iterable[int] | None = None, only_bookie: str = "") -> Report:
        """One run: every ledger, or the given ones, or those of one bookie. Raises
        MetadataStoreUnavailable when the store cannot be reached at the start."""
        pending = self.start(ledger_ids, only_bookie)
        if pending.faulty:
            self.sleep(self.settings.recheck_delay)
        return self.finish(pending)

    def _pass(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
              progress: Progress | None = None) -> RangeResult:
        return RangeResult.merge(self.engine.map_ranges(ctx, ranges, mode, progress))

    def start(self, ledger_ids: Iterable[int] | None = None, only_bookie: str = "") -> PendingRun:
        """The first pass. The caller waits `recheck_delay` when the result has potentially faulty
        ledgers (the daemon schedules `finish` as a one-off job), then calls `finish`."""
        s = self.settings
        started = now_ms()
        store = open_store(s)
        try:
            marks, problems = store.underreplication_marks()
            locations = dict(s.racks)
            if not locations and s.placement_policy != "none":
                locations, rack_problems = store.racks(s.racks_znode)
                problems += rack_problems
            addresses = {**store.agent_addresses(), **s.bookie_endpoints}
            ctx = RunContext(s, locations, frozenset(marks), addresses, started, only_bookie)
            wanted = list(ledger_ids) if ledger_ids is not None else list(s.ledgers)
            pending = PendingRun(store, started, ctx, marks, set(wanted) if wanted else None)
            pending.errors += problems
            ranges = store.ranges_of(wanted) if wanted else store.ledger_ranges()
            log.info("run %s: %d ranges to check", self.run_id, len(ranges))
            t0 = time.monotonic()
            first = self._pass(ctx, ranges, Pass.FIRST, self.progress)
            pending.absorb(first)
            pending.faulty = dict(first.potentially_faulty)
            pending.stats["first_pass_ms"] = int((time.monotonic() - t0) * 1000)
            if only_bookie:
                pending.scope = set(first.marked_in_scope)
            return pending
        except BaseException:
            store.close()
            raise

    def finish(self, pending: PendingRun) -> Report:
        """Re-check the potentially faulty ledgers, re-read before reporting, age the marks, report."""
        try:
            t0 = time.monotonic()
            self._recheck(pending, pending.faulty)
            pending.stats["recheck_ms"] = int((time.monotonic() - t0) * 1000)
            t0 = time.monotonic()
            self._verify(pending)
            pending.stats["verify_ms"] = int((time.monotonic() - t0) * 1000)
        except MetadataStoreUnavailable as exc:
            # Findings that could not be re-read are not presented as a complete report.
            pending.errors.append(f"re-check and re-read before reporting: {exc}")
        try:
            aged = [m for lid, m in pending.marks.items() if pending.scope is None or lid in pending.scope]
            for v in check_underreplication_age(aged, self.settings.underreplicated_grace_period, now_ms()):
                pending.violations[(v.category, v.ledger_id)] = v
        finally:
            pending.store.close()
        report = Report(
            run_id=self.run_id, started_at=iso(pending.started_ms), finished_at=iso(now_ms()),
            complete=not pending.errors, ledgers={k: pending.counts[k] for k in LEDGER_COUNTERS},
            violations=sorted(pending.violations.values(), key=lambda v: (v.category, v.ledger_id)),
            errors=pending.errors, stats=dict(pending.stats),
        )
        for v in report.violations:
            log.warning("violation %s", json.dumps({"run_id": self.run_id, **v.to_json()}, sort_keys=True))
        log.info("run %s counts %s", self.run_id, json.dumps(report.counts, sort_keys=True))
        return report

    def _recheck(self, pending: PendingRun, faulty: Mapping[int, tuple[str, ...]]) -> None:
        """BP-34: ledgers whose bookies did not answer are checked again after a delay; a bookie still
        silent and still registered is reported, one no longer registered has lost its copies."""
        if not faulty:
            return
        store, ctx = pending.store, pending.ctx
        pending.stats["potentially_faulty"] += len(faulty)
        log.info("run %s: re-checking %d potentially faulty ledgers", self.run_id, len(faulty))
        regs = store.registrations()
        silent = {b for bookies in faulty.values() for b in bookies}
        lost = frozenset(b for b in silent if not regs.registered(b))
        # An agent that came back may listen elsewhere now: read the registrations again.
        addresses = {**store.agent_addresses(), **self.settings.bookie_endpoints}
        again = RunContext(ctx.settings, ctx.locations, ctx.marked, addresses, now_ms(), ctx.only_bookie, lost,
                           placement=False)
        for lid in faulty:
            pending.drop(lid, only=_RECHECKED)
        pending.absorb(self._pass(again, store.ranges_of(faulty), Pass.FINAL), first_look=False)

    def _verify(self, pending: PendingRun) -> None:
        """BP-34: before reporting, drop ledgers now marked under-replicated, and redo the analysis of
        ledgers whose metadata changed (znode version) since it was read."""
        store = pending.store
        for _ in range(self.settings.verify_rounds):
            suspects = {lid: v.metadata_version for (cat, lid), v in pending.violations.items()
                        if cat in _ON_METADATA}
            if not suspects:
                return
            changed = []
            for read in store.read_ledgers(sorted(suspects)):
                lid = read.ledger_id
                if read.deleted:
                    pending.drop(lid)
                    pending.counts["deleted_during_run"] += 1
                elif store.underreplication_mark(lid) is not None:
                    pending.drop(lid)
                    pending.stats["dropped_marked_during_run"] += 1
                elif read.metadata is not None and read.metadata.znode_version != suspects[lid]:
                    changed.append(lid)  # includes metadata that was unreadable and now reads
            if not changed:
                return
            pending.stats["reanalyzed_after_metadata_change"] += len(changed)
            log.info("run %s: metadata of %d ledgers changed during the run; analysing them again",
                     self.run_id, len(changed))
            for lid in changed:
                pending.drop(lid)
            again = self._pass(pending.ctx, store.ranges_of(changed), Pass.FIRST)
            pending.absorb(again, first_look=False)
            if again.potentially_faulty:
                self.sleep(self.settings.recheck_delay)
            self._recheck(pending, again.potentially_faulty)
        pending.errors.append(f"metadata kept changing for some ledgers after {self.settings.verify_rounds} re-reads")


def check_marks(settings: ScanSettings, run_id: str | None = None) -> Report:
    """The cheap periodic job: only the age of the under-replication marks."""
    started = now_ms()
    with open_store(settings) as store:
        marks, problems = store.underreplication_marks()
    found = check_underreplication_age(marks.values(), settings.underreplicated_grace_period, now_ms())
    return Report(run_id=run_id or uuid.uuid4().hex[:12], started_at=iso(started), finished_at=iso(now_ms()),
                  complete=not problems, ledgers={k: 0 for k in LEDGER_COUNTERS} | {"seen": len(marks)},
                  violations=sorted(found, key=lambda v: v.ledger_id), errors=problems,
                  stats={"underreplicated_marks": len(marks)})
