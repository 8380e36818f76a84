"""What the auditor exports on /metrics, read when Prometheus scrapes (a prometheus_client collector, apart
from the sinks that keep what it reads and from the HTTP server that serves it): BookKeeper's auditor
gauges under their Prometheus names (`auditor_<NAME>`), and scrutiny's own under `scrutiny_`. Gauges
describe the last complete run that covered the whole cluster, updated by continuous scrutiny's current
state; a standby exports its leadership and no stale gauge. Labels are bounded: categories, kinds,
phases, outcomes, and bookie ids (as many as the cluster has bookies), never ledger ids."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from scrutiny.auditor.continuous import Continuous
from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.lastrun import RunSummary
from scrutiny.auditor.sinks import PHASES, RunTallies, Tallies
from scrutiny.categories import REGISTRY, Category, Phase, bookkeeper_gauge, in_phase, spec
from scrutiny.metricnames import PREFIX
from scrutiny.store.facts import PARTS

# Found by following the hand-off's marks, never by a run: the leader exports them (0 when none) once it has a run.
FOLLOWED = tuple(str(c) for c in in_phase(Phase.REPAIR))


class AuditorCollector:
    def __init__(self, tallies: RunTallies, current: CurrentState | None = None,
                 continuous: Continuous | None = None) -> None:
        self.tallies, self.current, self.continuous = tallies, current, continuous

    def collect(self) -> Iterator[Metric]:
        t = self.tallies.snapshot()
        runs = t.newest()
        counts: dict[str, int] = {}
        looked: set[str] = set()  # the categories some run looked at: 0 is known there
        underreplicated: int | None = None
        unavailable: dict[str, int] = {}
        slow: tuple[str, ...] = ()
        blast: dict[str, dict[str, dict[str, int]]] = {}
        orphans: dict[str, dict[str, int]] = {}
        lost: dict[str, dict[str, int]] = {}
        deep_pass: dict[str, int] = {}
        leaked: dict[str, int] | None = None
        for run in runs:
            if run.looked_at(Category.LEAKED_LEDGER) and "pulsar_leaked_ledgers" in run.stats:
                leaked = run.stats
            if run.looked_at(Category.ORPHAN_LEDGER):
                orphans = run.orphans
            if run.looked_at(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED):
                lost = run.lost
            counts.update(run.counts)
            looked.update(run.counts)
            underreplicated = run.stats.get("underreplicated_marks", underreplicated)
            if run.looked_at(Category.BOOKIE_UNAVAILABLE):
                unavailable, slow = run.unavailable, run.slow
            if run.blast_radius is not None:
                blast = run.blast_radius
            if "deep_pass_slices" in run.stats:
                deep_pass = run.stats
        yield GaugeMetricFamily(f"{PREFIX}leader", "1 while this auditor leads", value=int(t.leading))
        yield CounterMetricFamily(f"{PREFIX}leaderships", "times this auditor became the leader (a lost "
                                  "session ends a leadership)", value=t.leaderships)
        yield GaugeMetricFamily(f"{PREFIX}python_allocated_blocks",
                                "memory blocks the interpreter holds (sys.getallocatedblocks): the Python heap, "
                                "apart from native memory", value=sys.getallocatedblocks())
        if t.leading and self.current is not None and self.current.baseline_ms:
            # the current state: the last full run's findings, those found since, less those cleared
            counts = dict(self.current.counts())
        if t.leading and (runs or counts):  # nothing before its first run (or an inherited one): unknown, not 0
            counts = {cat: counts.get(cat, 0) for cat in sorted({*looked, *counts, *FOLLOWED})}
        violations = GaugeMetricFamily(f"{PREFIX}violations", "ledgers per category now: the last complete "
                                       "run's, updated by continuous scrutiny", labels=["category"])
        for cat, n in counts.items():
            violations.add_metric([cat], n)
            gauge = bookkeeper_gauge(cat)
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
        if leaked is not None:
            yield GaugeMetricFamily(f"{PREFIX}leaked_ledgers", "ledgers Pulsar created that no topic, cursor, schema "
                                    "or compaction names, older than the grace, last full run",
                                    value=leaked["pulsar_leaked_ledgers"])
            yield GaugeMetricFamily(f"{PREFIX}leaked_bytes", "the bytes their bookies store for them (DbLedgerStorage "
                                    "agents; a lower bound where some are unknown), last full run",
                                    value=leaked.get("pulsar_leaked_bytes", 0))
        if t.leading:
            yield from _continuous_families(self.current, self.continuous)
        reported = CounterMetricFamily(f"{PREFIX}violations_reported", "findings reported, every run",
                                       labels=["category"])
        for cat in REGISTRY:
            reported.add_metric([str(cat)], t.reported[str(cat)])
        yield reported
        finished = CounterMetricFamily(f"{PREFIX}runs", "finished runs", labels=["kind", "outcome"])
        for (kind, outcome), n in sorted(t.runs.items()):
            finished.add_metric([kind, outcome], n)
        yield finished
        skipped = CounterMetricFamily(f"{PREFIX}runs_skipped", "runs not started", labels=["kind", "reason"])
        for (kind, reason), n in sorted(t.skipped.items()):
            skipped.add_metric([kind, reason], n)
        yield skipped
        yield CounterMetricFamily(f"{PREFIX}ledgers_checked", "ledgers checked", value=t.checked)
        yield CounterMetricFamily(f"{PREFIX}bookie_calls_failed", "calls to bookie agents that failed",
                                  value=t.calls_failed)
        yield CounterMetricFamily(f"{PREFIX}deep_read_bytes", "entry-log bytes the agents read for deep scrubs",
                                  value=t.deep_bytes)
        if deep_pass:
            yield GaugeMetricFamily(f"{PREFIX}deep_pass_progress_ratio", "share of the current deep pass done",
                                    value=deep_pass["deep_pass_progress_permille"] / 1000)
            yield GaugeMetricFamily(f"{PREFIX}deep_passes_completed", "deep passes completed",
                                    value=deep_pass["deep_passes_completed"])
            yield GaugeMetricFamily(f"{PREFIX}deep_unverified_age_seconds",
                                    "debt: since the oldest deep verification of any ledger (or since the pass "
                                    "began, for ledgers never verified)",
                                    value=time.time() - deep_pass["deep_oldest_verified_ms"] / 1000)
        yield from _run_families(runs, t)


def _run_families(runs: list[RunSummary], t: Tallies) -> Iterator[Metric]:
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
    if t.leading:
        for kind in sorted(set(finished) | {"full"}):
            age.add_metric([kind], now - finished.get(kind, t.leading_since))
    yield duration
    yield phases
    yield age





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


