"""The driver of one scrutiny run.

It enumerates ledger ranges and hands them to an engine for the first pass; then it does BP-34's steps
upstream never built: ledgers whose bookies did not answer are re-checked after a delay, and before
reporting every fact a finding rests on is read again (`scrutiny.scan.confirm`); then the reverse check,
Pulsar's record, the marks' age (each mark reported for its age read again) and the owners.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping

from scrutiny.checks import Violation, check_underreplication_age
from scrutiny.checks.remedy import RepairContext
from scrutiny.config import ScanSettings
from scrutiny.findings import Findings
from scrutiny.logsetup import FINDINGS
from scrutiny.lostbookies import SIGHTINGS as LOST_BOOKIE_SIGHTINGS
from scrutiny.lostbookies import LostBookies
from scrutiny.metadata import UnderreplicationMark
from scrutiny.pulsar.ledgers import BookKeeperLedgers
from scrutiny.pulsar.owners import UNKNOWN, owner_from_custom_metadata
from scrutiny.pulsar.scope import Scope
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.report import Report
from scrutiny.runstats import (
    EVERY_RUN,
    MARKS_CHECK,
    Deep,
    Holdings,
    Marks,
    Messages,
    PulsarRecordFigures,
    RunFigures,
    Scan,
    Timings,
)
from scrutiny.scan.confirm import ON_ANSWERS, Confirmation
from scrutiny.scan.context import LEDGER_COUNTERS, NO_SILENCES, Pass, RunContext, Silences
from scrutiny.scan.engines import Engine, Progress, make_engine
from scrutiny.scan.holdings import HoldingsPhase
from scrutiny.scan.messages import MessagesPhase, unvalidated
from scrutiny.scan.pending import PendingRun
from scrutiny.scan.result import Blast
from scrutiny.scan.topics import TopicsPhase, pulsar_store
from scrutiny.store import LedgerRange, MetadataStore, MetadataStoreUnavailable, open_store
from scrutiny.store.facts import ClusterFacts
from scrutiny.times import iso, now_ms

log = logging.getLogger(__name__)
findings_log = logging.getLogger(FINDINGS)

LOGGED_FINDINGS = 100  # a line each, worst first; a lost rack's million findings are in the report only


class ScrutinyRun:
    def __init__(self, settings: ScanSettings, engine: Engine | None = None, progress: Progress | None = None,
                 sleep: Callable[[float], None] = time.sleep, run_id: str | None = None, kind: str = "scan",
                 record_sightings: bool = False, store: MetadataStore | None = None,
                 facts: Callable[[], ClusterFacts] | None = None, checkpoints: bool = False,
                 topics_read: Callable[[PulsarRecord], None] | None = None) -> None:
        self.settings = settings.validate()
        self.store = store  # a connected store the caller keeps open (continuous scrutiny's batches); else its own
        self.facts = facts  # the facts the run starts on (continuous scrutiny's, kept between changes); else read
        self.record_sightings = record_sightings  # the auditor keeps the orphan sightings from run to run
        # the leader's runs: each topic's messages are validated on from its checkpoint, which they keep; a topic
        # run (continuous scrutiny's) also scrubs the topic's ledgers closed since, and validates them
        self.checkpoints = checkpoints
        self.topics_read = topics_read  # a topic run's records, as it read them to list their ledgers
        self.kind = kind  # named in every log line of the run: the auditor runs several kinds
        self.engine, self.progress, self.sleep = engine or make_engine(settings), progress, sleep
        self.run_id = run_id or uuid.uuid4().hex[:12]

    def execute(self, ledger_ids: Iterable[int] | None = None, only_bookies: Collection[str] = (),
                without: Collection[str] = (), without_racks: Collection[str] = ()) -> Report:
        """One run: every ledger, or the given ones, or those of some bookies; or a what-if: the ledgers
        of the bookies (and racks) `without`, as they would be were those down. Raises
        MetadataStoreUnavailable when the store cannot be reached at the start."""
        pending = self.start(ledger_ids, only_bookies, without, without_racks)
        if pending.faulty:
            self.sleep(self.settings.recheck_delay)
        return self.finish(pending)

    def look(self, pending: PendingRun, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
             first_look: bool = True, progress: Progress | None = None) -> Silences:
        """One pass, each range's result absorbed as it arrives (never a whole pass's findings in
        memory); the ledgers it left potentially faulty."""
        faulty = NO_SILENCES
        batch: dict[int, tuple[str, ...]] = {}
        for result in self.engine.map_ranges(ctx, ranges, mode, progress):
            pending.absorb(result, first_look)
            batch.update(result.potentially_faulty)
            if len(batch) >= 100_000:
                faulty, batch = faulty.plus(batch), {}
        return faulty.plus(batch)

    def start(self, ledger_ids: Iterable[int] | None = None, only_bookies: Collection[str] = (),
              without: Collection[str] = (), without_racks: Collection[str] = ()) -> PendingRun:
        """The first pass. The caller waits `recheck_delay` when the result has potentially faulty
        ledgers (the daemon schedules `finish` as a one-off job), then calls `finish`."""
        s = self.settings
        started = now_ms()
        store = self.store or open_store(s)
        try:
            wanted = list(ledger_ids) if ledger_ids is not None else list(s.ledgers)
            # a run over a few ledgers (not some bookies', nor a topic's yet to be listed) reads only their marks
            under = (*s.tenants, *s.namespaces)
            topic_run = bool(s.topics or under) and ledger_ids is None
            few = bool(wanted) and not (only_bookies or without or without_racks or topic_run)
            marks, problems = store.marks_of(wanted) if few else store.underreplication_marks()
            locations = dict(s.racks)
            racks_from_store = not locations and (s.placement_policy != "none" or bool(without_racks)
                                                  or s.blast_radius)
            if racks_from_store:
                locations, rack_problems = store.racks(s.racks_znode)
                problems += rack_problems
            facts = self.facts() if self.facts is not None else ClusterFacts.read(store)
            gone = frozenset(without) | {b for b, r in locations.items() if r in set(without_racks)}
            if (without or without_racks) and not gone:
                problems.append(f"what-if: no bookie is on the racks {sorted(without_racks)}")
            only = frozenset(only_bookies) | gone
            scoped = bool(wanted)
            whole = not (scoped or only or s.topics or under)
            lost = lost_bookies(facts, s) if s.lost_bookie_check and not gone else None
            blast = whole and s.blast_radius  # a marked ledger counts there as if its mark's bookies held nothing
            marked = {lid: m.replicas for lid, m in marks.items()} if blast else dict.fromkeys(marks, ())
            topics = s.topics
            held = False
            closed_since: frozenset[int] = frozenset()
            if topic_run or (s.pulsar_check and whole):
                with pulsar_store(store, s) as pulsar:
                    held = s.pulsar_check and pulsar.pulsar_present()
                    if topic_run:
                        record = PulsarRecord.decode(pulsar.pulsar_records(s.topics, under=under))
                        if self.topics_read is not None:
                            self.topics_read(record)
                        problems += record.problems
                        # a tenant's or namespace's topics as they are now
                        topics = tuple(dict.fromkeys((*s.topics, *sorted(t.topic for t in record.topics.values()))))
                        for scope in (*(Scope("tenant", t) for t in s.tenants),
                                      *(Scope("namespace", n) for n in s.namespaces)):
                            if not any(scope.holds(t) for t in topics):  # a typo, or empty
                                log.warning("%s run %s: no Pulsar topic under %r", self.kind, self.run_id, scope.name)
                        wanted += sorted(lid for t in topics for lid in record.topic_ledgers(t))
                        scoped = True
                        if self.checkpoints and held:
                            closed_since = unvalidated(store, record, topics)
            ctx = RunContext(s, locations, marked, facts.agent_addresses, started, only, without=gone,
                             blast_radius=blast, holdings=whole and s.orphan_check, lost=lost, pulsar=held,
                             scrub=closed_since)
            pending = PendingRun(store, started, ctx, marks, set(wanted) if scoped else None, facts.registered,
                                 racks_from_store, pulsar_topics=None if whole else topics,
                                 replication_disabled=facts.replication_disabled)
            pending.errors += problems
            pending.stats.add(Marks(underreplicated_marks=len(marks)))
            ranges = store.ranges_of(wanted) if scoped else store.ledger_ranges()
            log.info("%s run %s: %d ranges to check", self.kind, self.run_id, len(ranges))
            t0 = time.monotonic()
            pending.faulty = self.look(pending, ctx, ranges, Pass.FIRST, progress=self.progress)
            pending.stats.add(Timings(first_pass_ms=int((time.monotonic() - t0) * 1000)))
            if only:
                pending.scope = set(pending.marked_in_scope)
            return pending
        except BaseException:
            if store is not self.store:
                store.close()
            raise

    def finish(self, pending: PendingRun) -> Report:
        """Re-check the potentially faulty ledgers, re-read before reporting, the reverse check, Pulsar's record,
        age the marks, attach the owners, report. Once the store is found unavailable the steps after it are
        not tried (each would wait its retry deadline again); the report is incomplete either way."""
        steps: tuple[tuple[str, Callable[[PendingRun], None]], ...] = (
            ("re-check and re-read before reporting", self._recheck_and_verify),
            ("the reverse check (what the bookies hold)", self._holdings),
            ("holding Pulsar's record against BookKeeper's", self._topics),
            ("validating each topic's messages in order", self._messages),
            ("the lost bookies' sightings", self._lost_bookies),
            ("re-reading the under-replication marks before reporting", self._age_marks),
            ("reading the ledgers' owners", lambda p: attach_owners(p, self.settings)))
        unavailable = False
        try:
            for what, step in steps:
                if unavailable:
                    pending.errors.append(f"{what}: not tried, the metadata store is unavailable")
                    continue
                try:
                    step(pending)
                except MetadataStoreUnavailable as exc:
                    # Findings that could not be re-read are not presented as a complete report.
                    pending.errors.append(f"{what}: {exc}")
                    unavailable = True
        finally:
            if pending.store is not self.store:
                pending.store.close()
        report = Report(
            run_id=self.run_id, started_at=iso(pending.started_ms), finished_at=iso(now_ms()),
            complete=not pending.errors, ledgers={k: pending.counts[k] for k in LEDGER_COUNTERS},
            violations=pending.findings, errors=pending.errors,
            stats=pending.stats.report(EVERY_RUN + ((Deep,) if self.settings.deep else ())
                                       + ((Messages,) if self.settings.deep and pending.ctx.pulsar else ())
                                       + ((Holdings,) if pending.ctx.holdings else ())
                                       + ((PulsarRecordFigures,) if pending.ctx.pulsar else ())),
            blast_radius=blast_radius_json(pending.blast) if pending.ctx.blast_radius else None,
            repair=RepairContext(self.settings.auditor_ledger_verification_percentage, pending.replication_disabled),
            unsettled=frozenset(pending.unsettled),
        )
        total, worst = report.violations.worst(LOGGED_FINDINGS)
        for v in worst:
            findings_log.warning("violation %s", json.dumps({"run_id": self.run_id, **v.to_json()}, sort_keys=True))
        if total > len(worst):
            findings_log.warning("run %s: %d more findings, in the report only", self.run_id, total - len(worst))
        log.info("%s run %s counts %s", self.kind, self.run_id, json.dumps(report.counts, sort_keys=True))
        return report

    def _recheck_and_verify(self, pending: PendingRun) -> None:
        confirmation = Confirmation(self)
        t0 = time.monotonic()
        confirmation.recheck(pending, pending.faulty)
        pending.stats.add(Timings(recheck_ms=int((time.monotonic() - t0) * 1000)))
        t0 = time.monotonic()
        confirmation.reread(pending)
        pending.stats.add(Timings(verify_ms=int((time.monotonic() - t0) * 1000)))

    def _lost_bookies(self, pending: PendingRun) -> None:
        pending.stats.add(Scan(lost_bookies=len(pending.unregistered)))
        if self.record_sightings:
            record_lost_bookies(pending, self.run_id)

    def _age_marks(self, pending: PendingRun) -> None:
        aged = [m for lid, m in pending.marks.items() if pending.scope is None or lid in pending.scope]
        pending.findings.add(aged_marks(pending.store, aged, self.settings.underreplicated_grace_period,
                                        pending.stats))

    def _holdings(self, pending: PendingRun) -> None:
        """The reverse check: what the bookies hold beyond the metadata (`scrutiny.scan.holdings`)."""
        if not pending.ctx.holdings:
            return
        phase = HoldingsPhase(self.settings, pending.store, self.run_id, self.record_sightings)
        blast = pending.blast if pending.ctx.blast_radius else None
        pending.findings.add(phase.run(pending.enumerated, pending.stats, blast, pending.ctx.locations))

    def _topics(self, pending: PendingRun) -> None:
        """Pulsar's record held against BookKeeper's ledgers as the first pass saw them (`scrutiny.scan.topics`)."""
        if not pending.ctx.pulsar:
            return
        phase = TopicsPhase(self.settings, pending.store, self.run_id, self.record_sightings, self.sleep)
        found, problems = phase.run(BookKeeperLedgers.merge(pending.bookkeeper), pending.pulsar_topics, pending.stats)
        pending.bookkeeper.clear()
        pending.findings.add(found)
        pending.errors += problems

    def _messages(self, pending: PendingRun) -> None:
        """A deep run: each topic's producers' sequence ids through its ledgers (`scrutiny.scan.messages`)."""
        if not pending.ctx.pulsar or not pending.messages:
            return
        phase = MessagesPhase(self.settings, pending.store, self.run_id, self.checkpoints, self.sleep)
        pending.findings.add(phase.run(pending.messages, pending.stats))
        pending.messages.clear()

def attach_owners(pending: PendingRun, settings: ScanSettings) -> None:
    """Pulsar's record, read once and only when needed: for findings on ledgers without Pulsar's keys in
    their metadata (older Pulsar), and to drop coverage findings on ledgers offloaded to tiered storage
    with `bookkeeperDeleted` (no longer BookKeeper's)."""
    findings, store = pending.findings, pending.store
    for chunk in findings.ledger_chunks(unowned=True):  # findings on marks
        owners = ((r.ledger_id, owner_from_custom_metadata(r.metadata.custom_metadata))
                  for r in store.read_ledgers([lid for lid, _, _ in chunk]) if r.metadata is not None)
        findings.set_owners({lid: o for lid, o in owners if o is not None})
    lacking = findings.any_unowned()
    topics = findings.topics(ON_ANSWERS)
    if not lacking and not topics:
        return
    # Every topic's record when some finding has no owner yet; else only the topics concerned.
    with pulsar_store(store, settings) as pulsar:
        record = PulsarRecord.decode(pulsar.pulsar_records(None if lacking else sorted(topics)))
    pending.errors += record.problems
    pending.stats.add(Scan(dropped_offloaded=findings.drop(record.offloaded, only=ON_ANSWERS)))
    named = record.owners()
    for chunk in findings.ledger_chunks(unowned=True):
        findings.set_owners({lid: named.get(lid, UNKNOWN) for lid, _, _ in chunk})


def lost_bookies(facts: ClusterFacts, settings: ScanSettings) -> LostBookies:
    """What the lost-bookie check needs, as the run starts (`scrutiny.lostbookies`)."""
    delay = facts.recovery_delay
    return LostBookies(facts.registered, facts.lost_bookie_sightings,
                       settings.lost_bookie_recovery_delay if delay is None else delay,
                       settings.lost_bookie_grace_period, facts.replication_disabled)


def record_lost_bookies(pending: PendingRun, run_id: str) -> None:
    """The auditor keeps, from whole-cluster run to run, when each bookie named by some ledger was first
    seen gone; a bookie registered again, or named by no ledger any more, is forgotten."""
    lost = pending.ctx.lost
    if lost is None or pending.scope is not None or pending.ctx.only_bookies:
        return
    seen = {b: lost.first_seen.get(b, pending.started_ms) for b in pending.unregistered}
    if seen == dict(lost.first_seen):
        return
    try:
        LOST_BOOKIE_SIGHTINGS.write(pending.store, seen)
    except Exception as exc:  # the next run sees them gone from then: later, never early
        log.warning("run %s: could not record the lost-bookie sightings: %s", run_id, exc)


def blast_radius_json(blast: Mapping[str, Blast]) -> dict[str, dict[str, dict[str, int]]]:
    """{"bookies": {id: figures}, "racks": {name: figures}}, worst first."""
    out: dict[str, dict[str, dict[str, int]]] = {"bookies": {}, "racks": {}}
    for key, b in sorted(blast.items(), key=lambda kb: (-kb[1].no_copy, -kb[1].below_aq, kb[0])):
        scope, name = key.split(":", 1)
        out["bookies" if scope == "bookie" else "racks"][name] = b.to_json()
    return out


def aged_marks(store: MetadataStore, marks: Iterable[UnderreplicationMark], grace_seconds: int,
               stats: RunFigures) -> list[Violation]:
    """Marks older than the grace period, each read again now: a mark removed meanwhile (a replication
    worker repaired the ledger) is no finding, one re-created is aged from its new ctime."""
    out = []
    for v in check_underreplication_age(marks, grace_seconds, now_ms()):
        mark = store.underreplication_mark(v.ledger_id)
        if mark is None:
            stats.add(Marks(marks_gone_before_reporting=1))
            continue
        out += check_underreplication_age([mark], grace_seconds, now_ms())
    return out


def check_marks(settings: ScanSettings, run_id: str | None = None) -> Report:
    """The cheap periodic job: only the age of the under-replication marks."""
    started = now_ms()
    stats = RunFigures()
    with open_store(settings) as store:
        marks, problems = store.underreplication_marks()
        stats.add(Marks(underreplicated_marks=len(marks)))
        found = aged_marks(store, marks.values(), settings.underreplicated_grace_period, stats)
        repair = RepairContext(settings.auditor_ledger_verification_percentage, store.replication_disabled())
    report = Report(run_id=run_id or uuid.uuid4().hex[:12], started_at=iso(started), finished_at=iso(now_ms()),
                    complete=not problems, ledgers={k: 0 for k in LEDGER_COUNTERS} | {"seen": len(marks)},
                    violations=Findings(found), errors=problems,
                    stats=stats.report(MARKS_CHECK), repair=repair)
    log.info("underreplication run %s counts %s", report.run_id, json.dumps(report.counts, sort_keys=True))
    return report
