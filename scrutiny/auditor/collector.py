"""What the auditor exports on /metrics, read when Prometheus scrapes: small prometheus_client collectors, each
over one concern and each with `describe()`, apart from the sinks that keep what they read and from the HTTP
server that serves them. BookKeeper's auditor gauges go under their Prometheus names (`auditor_<NAME>`),
scrutiny's own under `scrutiny_`. Gauges describe the last complete run that covered the whole cluster, updated
by continuous scrutiny's current state; a standby exports its leadership and no stale gauge. Labels are bounded:
categories, kinds, phases, outcomes, and bookie ids (as many as the cluster has bookies), never ledger ids."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily as Count
from prometheus_client.core import GaugeMetricFamily as Gauge
from prometheus_client.core import Metric

from scrutiny.auditor.continuous import Continuous
from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.lastrun import RunSummary
from scrutiny.auditor.metricfamily import FamiliesCollector, Family
from scrutiny.auditor.sinks import RunTallies, Tallies
from scrutiny.categories import REGISTRY, Category, Phase, bookkeeper_gauge, in_phase
from scrutiny.metricnames import PREFIX
from scrutiny.runstats import DeepPassPosition, Marks, PulsarRecordFigures, Timings
from scrutiny.store.facts import PARTS

# Found by following the hand-off's marks, never by a run: the leader exports them (0 when none) once it has a run.
FOLLOWED = tuple(in_phase(Phase.REPAIR))


def collectors(tallies: RunTallies, current: CurrentState | None = None,
               continuous: Continuous | None = None) -> list[FamiliesCollector]:
    """Every collector of the auditor's /metrics, to register."""
    return [LeadershipCollector(tallies), ViolationsCollector(tallies, current), UnavailableCollector(tallies),
            BlastRadiusCollector(tallies), OrphanCollector(tallies), LostBookieCollector(tallies),
            LeakCollector(tallies), ContinuousCollector(tallies, current, continuous), RunCountersCollector(tallies),
            DeepPassCollector(tallies), LastRunCollector(tallies)]


def newest(runs: list[RunSummary], which: Callable[[RunSummary], bool]) -> RunSummary | None:
    """The newest of the last runs (oldest first) that `which` accepts: where kinds overlap, the newer wins."""
    return next((r for r in reversed(runs) if which(r)), None)


def looked_at(category: Category) -> Callable[[RunSummary], bool]:
    return lambda run: run.looked_at(category)


class TalliesCollector(FamiliesCollector):
    """A collector of what the runs left in the tallies (`RunTallies`), read afresh at every scrape."""

    def __init__(self, tallies: RunTallies) -> None:
        self.tallies = tallies

    def newest_run(self, which: Callable[[RunSummary], bool]) -> RunSummary | None:
        return newest(self.tallies.snapshot().newest(), which)


class LeadershipCollector(TalliesCollector):
    LEADER = Family(Gauge, f"{PREFIX}leader", "1 while this auditor leads")
    LEADERSHIPS = Family(Count, f"{PREFIX}leaderships", "times this auditor became the leader (a lost session ends "
                         "a leadership)")
    HEAP = Family(Gauge, f"{PREFIX}python_allocated_blocks", "memory blocks the interpreter holds "
                  "(sys.getallocatedblocks): the Python heap, apart from native memory")
    families = (LEADER, LEADERSHIPS, HEAP)

    def collect(self) -> Iterator[Metric]:
        t = self.tallies.snapshot()
        yield self.LEADER.value(int(t.leading))
        yield self.LEADERSHIPS.value(t.leaderships)
        yield self.HEAP.value(sys.getallocatedblocks())


class ViolationsCollector(TalliesCollector):
    """Ledgers per category now (with BookKeeper's auditor gauges), and the under-replication marks."""

    VIOLATIONS = Family(Gauge, f"{PREFIX}violations", "ledgers per category now: the last complete run's, updated "
                        "by continuous scrutiny", ("category",))
    BOOKKEEPER = {c: Family(Gauge, f"auditor_{bookkeeper_gauge(c)}", f"BookKeeper's auditor gauge: {s.summary}")
                  for c, s in REGISTRY.items() if bookkeeper_gauge(c)}
    MARKS = Family(Gauge, f"{PREFIX}underreplicated_ledgers", "ledgers marked under-replicated now (a gauge, unlike "
                   "upstream's summary)")
    families = (VIOLATIONS, *BOOKKEEPER.values(), MARKS)

    def __init__(self, tallies: RunTallies, current: CurrentState | None) -> None:
        super().__init__(tallies)
        self.current = current

    def counts(self, t: Tallies) -> dict[Category, int]:
        """Every category some run looked at (0 is known there), each with its ledgers now; nothing before the
        leader's first run (or an inherited one): unknown, not 0."""
        runs = t.newest()
        looked: dict[Category, int] = {}
        for run in runs:
            looked |= run.counts
        if not t.leading:
            return looked
        counts = looked
        if self.current is not None and self.current.baseline_ms:
            # the current state: the last full run's findings, those found since, less those cleared
            counts = dict(self.current.counts())
        if not (runs or counts):
            return {}
        return {c: counts.get(c, 0) for c in sorted({*looked, *counts, *FOLLOWED})}

    def collect(self) -> Iterator[Metric]:
        t = self.tallies.snapshot()
        counts = self.counts(t)
        yield self.VIOLATIONS.of(((str(c),), n) for c, n in counts.items())
        for c, n in counts.items():
            if c in self.BOOKKEEPER:
                yield self.BOOKKEEPER[c].value(n)
        marked = newest(t.newest(), lambda r: Marks.given(r.stats) is not None)
        if marked is not None:
            yield self.MARKS.value(Marks.of(marked.stats).underreplicated_marks)


class UnavailableCollector(TalliesCollector):
    UNAVAILABLE = Family(Gauge, f"{PREFIX}bookie_unavailable_ledgers", "ledgers a silent, registered bookie left "
                         "unchecked, last full run (silence: slow, its agent answered its health check but not in "
                         "time; down, not even that)", ("bookie", "silence"))
    families = (UNAVAILABLE,)

    def collect(self) -> Iterator[Metric]:
        run = self.newest_run(looked_at(Category.BOOKIE_UNAVAILABLE))
        unavailable, slow = (run.unavailable, run.slow) if run is not None else ({}, ())
        yield self.UNAVAILABLE.of(((bookie, "slow" if bookie in slow else "down"), n)
                                  for bookie, n in sorted(unavailable.items()))


class BlastRadiusCollector(TalliesCollector):
    LEDGERS = Family(Gauge, f"{PREFIX}blast_radius_ledgers", "ledgers that would fall below AQ (impact below_aq) or "
                     "lose every copy of an entry (no_copy) were this bookie or rack alone down, last full run",
                     ("scope", "name", "impact"))
    TOPICS = Family(Gauge, f"{PREFIX}blast_radius_topics", "the same, in topics", ("scope", "name", "impact"))
    families = (LEDGERS, TOPICS)

    def collect(self) -> Iterator[Metric]:
        run = self.newest_run(lambda r: r.blast_radius is not None)
        blast = (run.blast_radius or {}) if run is not None else {}
        rows = [(scope.removesuffix("s"), name, f) for scope, per in sorted(blast.items())
                for name, f in sorted(per.items())]
        yield self.LEDGERS.of(sample for s, name, f in rows
                              for sample in (((s, name, "below_aq"), f.get("ledgers_below_aq", 0)),
                                             ((s, name, "no_copy"), f.get("ledgers_without_a_copy", 0))))
        yield self.TOPICS.of(sample for s, name, f in rows
                             for sample in (((s, name, "below_aq"), f.get("topics_below_aq", 0)),
                                            ((s, name, "no_copy"), f.get("topics_without_a_copy", 0))))


class OrphanCollector(TalliesCollector):
    """The disk orphans hold on each bookie (ORPHAN_LEDGER, last whole-cluster run)."""

    LEDGERS = Family(Gauge, f"{PREFIX}orphan_ledgers", "ledgers this bookie holds that the metadata has not had for "
                     "longer than the grace period, last full run", ("bookie",))
    ENTRIES = Family(Gauge, f"{PREFIX}orphan_entries", "their entries on this bookie", ("bookie",))
    BYTES = Family(Gauge, f"{PREFIX}orphan_bytes", "the bytes this bookie stores for them (DbLedgerStorage agents; a "
                   "lower bound where some are unknown)", ("bookie",))
    families = (LEDGERS, ENTRIES, BYTES)

    def collect(self) -> Iterator[Metric]:
        run = self.newest_run(looked_at(Category.ORPHAN_LEDGER))
        held = sorted(run.orphans.items()) if run is not None else []
        for family, key in ((self.LEDGERS, "ledgers"), (self.ENTRIES, "entries"), (self.BYTES, "bytes")):
            yield family.of(((bookie,), f.get(key, 0)) for bookie, f in held)


class LostBookieCollector(TalliesCollector):
    """The ledgers of each lost bookie that nobody marked (LOST_BOOKIE_RECOVERY_NOT_STARTED, last full run)."""

    LEDGERS = Family(Gauge, f"{PREFIX}lost_bookie_ledgers", "closed ledgers naming this bookie, gone from the "
                     "registrations past lostBookieRecoveryDelay and the grace, not marked under-replicated, last "
                     "full run", ("bookie",))
    BELOW_AQ = Family(Gauge, f"{PREFIX}lost_bookie_ledgers_below_aq", "those of them with some entry below its ack "
                      "quorum on the bookies still registered", ("bookie",))
    families = (LEDGERS, BELOW_AQ)

    def collect(self) -> Iterator[Metric]:
        run = self.newest_run(looked_at(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED))
        lost = sorted(run.lost.items()) if run is not None else []
        yield self.LEDGERS.of(((bookie,), f.get("ledgers", 0)) for bookie, f in lost)
        yield self.BELOW_AQ.of(((bookie,), f.get("below_aq", 0)) for bookie, f in lost)


class LeakCollector(TalliesCollector):
    LEDGERS = Family(Gauge, f"{PREFIX}leaked_ledgers", "ledgers Pulsar created that no topic, cursor, schema or "
                     "compaction names, older than the grace, last full run")
    BYTES = Family(Gauge, f"{PREFIX}leaked_bytes", "the bytes their bookies store for them (DbLedgerStorage agents; "
                   "a lower bound where some are unknown), last full run")
    families = (LEDGERS, BYTES)

    def collect(self) -> Iterator[Metric]:
        run = self.newest_run(lambda r: r.looked_at(Category.LEAKED_LEDGER)
                     and PulsarRecordFigures.given(r.stats) is not None)
        if run is not None:
            pulsar = PulsarRecordFigures.of(run.stats)
            yield self.LEDGERS.value(pulsar.pulsar_leaked_ledgers)
            yield self.BYTES.value(pulsar.pulsar_leaked_bytes)


class ContinuousCollector(TalliesCollector):
    """Continuous scrutiny on the leader: whether it watches, its feeds, its gaps, what it missed."""

    WATCHING = Family(Gauge, f"{PREFIX}continuous_watching", "1 while continuous scrutiny has seen every change "
                      "since watching_since (0: not watching)")
    FEEDS = Family(Gauge, f"{PREFIX}continuous_feeds", "change feeds followed, by state (up, down, unavailable: a "
                   "source or store that cannot watch)", ("kind", "state"))
    GAPS = Family(Count, f"{PREFIX}continuous_feed_gaps", "times a feed may have missed changes (each schedules a "
                  "full run)", ("kind",))
    PENDING = Family(Gauge, f"{PREFIX}continuous_pending", "ledgers and bookies waiting for continuous scrutiny's "
                     "look, or being looked at")
    DEGRADED = Family(Count, f"{PREFIX}continuous_degraded", "mass events looked at by a full run instead "
                      "(continuous_max_ledgers_per_second)")
    CHECKED = Family(Count, f"{PREFIX}continuous_ledgers_checked", "ledgers looked at by continuous scrutiny")
    MISSED = Family(Count, f"{PREFIX}continuous_missed", "findings of a full run that continuous scrutiny, watching "
                    "without a gap, should have made and did not")
    READS = Family(Count, f"{PREFIX}continuous_fact_reads", "the cluster's facts read from the store for continuous "
                   "scrutiny's looks, which keep them until the store's watch says they changed or may have (a gap, "
                   "a new leadership)", ("part",))
    families = (WATCHING, FEEDS, GAPS, PENDING, DEGRADED, CHECKED, MISSED, READS)

    def __init__(self, tallies: RunTallies, current: CurrentState | None, continuous: Continuous | None) -> None:
        super().__init__(tallies)
        self.current, self.continuous = current, continuous

    def collect(self) -> Iterator[Metric]:
        current, continuous = self.current, self.continuous
        if current is None or continuous is None or not self.tallies.snapshot().leading:
            return
        yield self.WATCHING.value(int(current.watching_since_ms > 0))
        states = Counter(("metadata" if f == "metadata" else "agent", st) for f, st in list(continuous.feeds.items()))
        yield self.FEEDS.of(sorted(states.items()))
        stats = continuous.stats
        yield self.GAPS.of(((kind,), stats[f"gaps.{kind}"]) for kind in ("metadata", "agent"))
        yield self.PENDING.value(continuous.pending())
        yield self.DEGRADED.value(stats["degraded"])
        yield self.CHECKED.value(stats["ledgers_checked"])
        yield self.MISSED.value(current.missed)
        yield self.READS.of(((part,), continuous.fact_reads[part]) for part in PARTS)


class RunCountersCollector(TalliesCollector):
    """What every run added up, whole cluster or not, since this auditor started."""

    REPORTED = Family(Count, f"{PREFIX}violations_reported", "findings reported, every run", ("category",))
    RUNS = Family(Count, f"{PREFIX}runs", "finished runs", ("kind", "outcome"))
    SKIPPED = Family(Count, f"{PREFIX}runs_skipped", "runs not started", ("kind", "reason"))
    CHECKED = Family(Count, f"{PREFIX}ledgers_checked", "ledgers checked")
    CALLS_FAILED = Family(Count, f"{PREFIX}bookie_calls_failed", "calls to bookie agents that failed")
    DEEP_BYTES = Family(Count, f"{PREFIX}deep_read_bytes", "entry-log bytes the agents read for deep scrubs")
    families = (REPORTED, RUNS, SKIPPED, CHECKED, CALLS_FAILED, DEEP_BYTES)

    def collect(self) -> Iterator[Metric]:
        t = self.tallies.snapshot()
        yield self.REPORTED.of(((str(c),), t.reported[c]) for c in REGISTRY)
        yield self.RUNS.of(sorted(t.runs.items()))
        yield self.SKIPPED.of(sorted(t.skipped.items()))
        yield self.CHECKED.value(t.checked)
        yield self.CALLS_FAILED.value(t.calls_failed)
        yield self.DEEP_BYTES.value(t.deep_bytes)


class DeepPassCollector(TalliesCollector):
    PROGRESS = Family(Gauge, f"{PREFIX}deep_pass_progress_ratio", "share of the current deep pass done")
    COMPLETED = Family(Gauge, f"{PREFIX}deep_passes_completed", "deep passes completed")
    DEBT = Family(Gauge, f"{PREFIX}deep_unverified_age_seconds", "debt: since the oldest deep verification of any "
                  "ledger (or since the pass began, for ledgers never verified)")
    families = (PROGRESS, COMPLETED, DEBT)

    def collect(self) -> Iterator[Metric]:
        run = self.newest_run(lambda r: DeepPassPosition.given(r.stats) is not None)
        if run is None:
            return
        at = DeepPassPosition.of(run.stats)
        yield self.PROGRESS.value(at.deep_pass_progress_permille / 1000)
        yield self.COMPLETED.value(at.deep_passes_completed)
        yield self.DEBT.value(time.time() - at.deep_oldest_verified_ms / 1000)


class LastRunCollector(TalliesCollector):
    DURATION = Family(Gauge, f"{PREFIX}last_run_duration_seconds", "last complete run", ("kind",))
    PHASES = Family(Gauge, f"{PREFIX}last_run_phase_seconds", "phases of the last complete run", ("kind", "phase"))
    AGE = Family(Gauge, f"{PREFIX}last_complete_run_age_seconds", "since the last complete run of the kind, "
                 "whichever auditor ran it (while leading: since leading, before the first)", ("kind",))
    families = (DURATION, PHASES, AGE)

    def collect(self) -> Iterator[Metric]:
        t = self.tallies.snapshot()
        runs = sorted(t.newest(), key=lambda r: r.kind)
        yield self.DURATION.of(((run.kind,), run.duration_ms / 1000) for run in runs)
        timed = [(run.kind, timings) for run in runs if (timings := Timings.given(run.stats)) is not None]
        yield self.PHASES.of(((kind, phase), ms / 1000) for kind, timings in timed
                             for phase, ms in timings.phases().items())
        now, finished = time.time(), {r.kind: r.finished_ms / 1000 for r in runs}
        kinds = sorted(set(finished) | {"full"}) if t.leading else []
        yield self.AGE.of(((kind,), now - finished.get(kind, t.leading_since)) for kind in kinds)
