"""The per-range work of a run, as a Spark executor does it for one range.

Three steps: read the range (its ledgers' metadata from the store, then every bookie's answer for the
ledgers worth checking), classify what was read with the pure checks, and return a `RangeResult`.
Results of many ranges merge into one (`RangeResult.merge`); only they travel back to the driver.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import gc
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from scrutiny.bookieclient import BookieClient
from scrutiny.categories import Category
from scrutiny.checks import (
    NO_LEDGER,
    WOULD_HAVE,
    BookieAnswer,
    BookieAnswers,
    CoverageResult,
    DeepAnswer,
    Outcome,
    PlacementPolicy,
    Violation,
    blast_radius,
    blast_radius_marked,
    check_coverage,
    check_deep,
    check_durability_policy,
    check_past_the_close,
    check_placement,
    coverage_without,
    healthy_coverage,
    held_exactly_their_shares,
    in_deep_slice,
    without_corrupt,
)
from scrutiny.config import ScanSettings
from scrutiny.errors import DataError, StoreError
from scrutiny.lostbookies import LostBookies, check_lost_bookie_recovery
from scrutiny.metadata import LedgerMetadata
from scrutiny.orphans import LedgerIds
from scrutiny.owners import Owner, owner_from_custom_metadata
from scrutiny.store import LedgerRange, LedgerRead, MetadataStore, open_store

LEDGER_COUNTERS = ("seen", "checked", "skipped_open", "skipped_empty", "skipped_underreplicated",
                   "deleted_during_run")

Answers = Mapping[str, Mapping[int, BookieAnswer]]  # bookie -> ledger -> what it said
DeepAnswers = Mapping[str, Mapping[int, DeepAnswer]]  # bookie -> ledger -> its deep scrub
_NOTHING: Mapping[Any, Any] = MappingProxyType({})  # a bookie not asked about any ledger; no answers


class Pass(enum.Enum):
    FIRST = "first"  # a bookie that does not answer makes the ledger potentially faulty
    FINAL = "final"  # a delayed re-check: silent at this look and the one before, and registered = BOOKIE_UNAVAILABLE


@dataclass(frozen=True, eq=False)
class Silences:
    """Ledger -> the bookies silent about it at a look. A lost rack silences millions of ledgers with
    a few distinct sets of bookies: sorted ids and an index into those sets (about 12 bytes a ledger
    in the driver, and as few in the closure each pass ships), not a dict of tuples (about 200)."""

    ledger_ids: np.ndarray  # int64, ascending
    which: np.ndarray  # int32: the index of each ledger's set in `bookies`
    bookies: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, silent: Mapping[int, tuple[str, ...]]) -> Silences:
        ids = np.fromiter(silent, np.int64, len(silent))
        sets: dict[tuple[str, ...], int] = {}
        which = np.fromiter((sets.setdefault(b, len(sets)) for b in silent.values()), np.int32, len(silent))
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], which[order], tuple(sets))

    def plus(self, more: Mapping[int, tuple[str, ...]]) -> Silences:
        """These silences and `more`; for a ledger in both, the one in `more`."""
        if not more:
            return self
        other = Silences.of(more)
        ids = np.concatenate([self.ledger_ids, other.ledger_ids])
        which = np.concatenate([self.which, other.which + len(self.bookies)])
        last = len(ids) - 1 - np.unique(ids[::-1], return_index=True)[1]  # each ledger's last, ascending
        return Silences(ids[last], which[last], self.bookies + other.bookies)

    def get(self, ledger_id: int) -> tuple[str, ...]:
        i = int(np.searchsorted(self.ledger_ids, ledger_id))
        return self.bookies[self.which[i]] if i < len(self.ledger_ids) and self.ledger_ids[i] == ledger_id else ()

    def silent(self) -> set[str]:
        """Every bookie silent about some ledger."""
        return {b for i in np.unique(self.which).tolist() for b in self.bookies[i]}

    def __len__(self) -> int:
        return len(self.ledger_ids)

    def __iter__(self) -> Iterator[int]:
        for i in range(0, len(self.ledger_ids), 10_000):  # never a million Python ints at once
            yield from self.ledger_ids[i:i + 10_000].tolist()


NO_SILENCES = Silences.of({})


@dataclass(frozen=True)
class RunContext:
    """Everything an executor needs, shipped once per job."""

    settings: ScanSettings
    locations: Mapping[str, str]
    marked: Mapping[int, tuple[str, ...]]  # ledgers marked under-replicated -> the bookies each mark names
    agent_addresses: Mapping[str, str]
    now_ms: int
    only_bookies: frozenset[str] = frozenset()  # scope: only ledgers whose ensembles contain one of these
    placement: bool = True
    without: frozenset[str] = frozenset()  # a what-if: these bookies down (their copies gone)
    blast_radius: bool = False  # count, per bookie and per rack, what would fall below AQ without it
    holdings: bool = False  # the reverse check: bring back every ledger id enumerated (the first pass)
    lost: LostBookies | None = None  # is anybody repairing the ledgers of bookies gone from the registrations?
    # FINAL passes only:
    lost_bookies: frozenset[str] = frozenset()  # unregistered at every look: their copies are gone
    registered: frozenset[str] = frozenset()  # registered now
    silent_before: Silences = NO_SILENCES  # per ledger, at the last look


@dataclass(frozen=True)
class Blast:
    """What one bookie (or rack) going down alone would do, and what depends on it."""

    below_aq: int = 0  # ledgers with some entry below its ack quorum (or without a copy)
    no_copy: int = 0  # ledgers with some entry without any copy
    topics_below_aq: frozenset[str] = frozenset()
    topics_no_copy: frozenset[str] = frozenset()
    ledgers: int = 0  # closed ledgers checked whose ensembles name it
    topics: frozenset[str] = frozenset()  # ... and their topics

    def plus(self, other: Blast) -> Blast:
        return Blast(self.below_aq + other.below_aq, self.no_copy + other.no_copy,
                     self.topics_below_aq | other.topics_below_aq, self.topics_no_copy | other.topics_no_copy,
                     self.ledgers + other.ledgers, self.topics | other.topics)

    def to_json(self) -> dict[str, int]:
        return {"ledgers_below_aq": self.below_aq, "ledgers_without_a_copy": self.no_copy,
                "topics_below_aq": len(self.topics_below_aq), "topics_without_a_copy": len(self.topics_no_copy),
                "ledgers": self.ledgers, "topics": len(self.topics)}


class BlastTally:
    """A range's blast radius as its ledgers are checked: per (scope, name), the ledgers (and topics) that depend
    on the bookie or rack, and those that would fall below their ack quorum, or lose every copy of an entry,
    were it alone down. Keys are counted once, at the end: cheaper than a Counter per key."""

    def __init__(self) -> None:
        self._depend: list[tuple[str, str]] = []
        self._below: list[tuple[str, str]] = []
        self._without: list[tuple[str, str]] = []
        self._topics: dict[str, dict[tuple[str, str], set[str]]] = {"depend": {}, "below": {}, "without": {}}

    def _topic(self, kind: str, key: tuple[str, str], owner: Owner | None) -> None:
        if owner is not None and owner.kind in ("topic", "cursor", "compacted-topic"):
            self._topics[kind].setdefault(key, set()).add(owner.name)

    def depends(self, md: LedgerMetadata, locations: Mapping[str, str], owner: Owner | None) -> None:
        for key in {("bookie", b) for b in md.bookies} | {("rack", locations[b]) for b in md.bookies
                                                          if b in locations}:
            self._depend.append(key)
            self._topic("depend", key, owner)

    def would_have(self, md: LedgerMetadata, least_copies: Mapping[tuple[str, str], int], owner: Owner | None) -> None:
        for key, left in least_copies.items():
            if left < md.ack_quorum:
                self._below.append(key)
                self._topic("below", key, owner)
                if left <= 0:
                    self._without.append(key)
                    self._topic("without", key, owner)

    def blast(self) -> dict[str, Blast]:
        below, without, depend = Counter(self._below), Counter(self._without), Counter(self._depend)
        topics = self._topics
        return {f"{scope}:{name}": Blast(below[scope, name], without[scope, name],
                                         frozenset(topics["below"].get((scope, name), ())),
                                         frozenset(topics["without"].get((scope, name), ())),
                                         depend[scope, name], frozenset(topics["depend"].get((scope, name), ())))
                for scope, name in depend.keys() | below.keys()}


@dataclass(frozen=True)
class RangeResult:
    """What one range (or many, merged) found. Only this travels back to the driver."""

    counts: Mapping[str, int] = field(default_factory=dict)
    violations: tuple[Violation, ...] = ()
    potentially_faulty: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    deleted: tuple[int, ...] = ()
    marked_in_scope: tuple[int, ...] = ()  # only for a one-bookie run
    errors: tuple[str, ...] = ()
    stats: Mapping[str, int] = field(default_factory=dict)  # keys with "peak" merge by max, others by sum
    # "bookie:<id>" / "rack:<name>" -> (ledgers below AQ, ledgers without a copy, their topics, ...) if it went down
    blast: Mapping[str, Blast] = field(default_factory=dict)
    enumerated: tuple[LedgerIds, ...] = ()  # the ledger ids of the ranges, when the run asked (`holdings`)
    unregistered: frozenset[str] = frozenset()  # bookies named by checked ledgers and registered at no look

    @staticmethod
    def merge(results: Iterable[RangeResult]) -> RangeResult:
        counts: Counter[str] = Counter()
        stats: Counter[str] = Counter()
        violations: list[Violation] = []
        faulty: dict[int, tuple[str, ...]] = {}
        deleted: list[int] = []
        marked: list[int] = []
        errors: list[str] = []
        blast: dict[str, Blast] = {}
        enumerated: list[LedgerIds] = []
        unregistered: set[str] = set()
        for r in results:
            enumerated += r.enumerated
            unregistered |= r.unregistered
            for key, b in r.blast.items():
                blast[key] = b.plus(blast[key]) if key in blast else b
            counts.update(r.counts)
            for k, v in r.stats.items():
                stats[k] = max(stats[k], v) if "peak" in k else stats[k] + v
            violations += r.violations
            faulty.update(r.potentially_faulty)
            deleted += r.deleted
            marked += r.marked_in_scope
            errors += r.errors
        return RangeResult(dict(counts), tuple(violations), faulty, tuple(deleted), tuple(marked), tuple(errors),
                           dict(stats), blast, tuple(enumerated), frozenset(unregistered))


# ---------------------------------------------------------------------------------------------
# Pure classification


@dataclass(frozen=True)
class Selection:
    """The ledgers of a range sorted into those to check and those counted and left alone."""

    candidates: tuple[LedgerMetadata, ...]
    counts: Mapping[str, int]
    violations: tuple[Violation, ...]
    deleted: tuple[int, ...]
    marked_in_scope: tuple[int, ...]
    marked: tuple[LedgerMetadata, ...] = ()  # closed, with entries, marked under-replicated: not checked


def select(ctx: RunContext, reads: Iterable[LedgerRead]) -> Selection:
    counts: Counter[str] = Counter()
    candidates: list[LedgerMetadata] = []
    violations: list[Violation] = []
    deleted: list[int] = []
    marked_in_scope: list[int] = []
    marked: list[LedgerMetadata] = []
    for read in reads:
        md = read.metadata
        if ctx.only_bookies and md is not None and not ctx.only_bookies & md.bookies:
            continue  # outside the scope of this run
        counts["seen"] += 1
        if ctx.only_bookies and read.ledger_id in ctx.marked:
            marked_in_scope.append(read.ledger_id)
        if read.deleted:
            counts["deleted_during_run"] += 1
            deleted.append(read.ledger_id)
        elif md is None:
            violations.append(Violation(Category.INVALID_METADATA, read.ledger_id, (),
                                        {"error": read.error or "unknown"}))
        elif not md.closed:
            counts["skipped_open"] += 1
            # The policy is in the metadata from creation: a topic writing with WQ 1 is named while it
            # writes, not hours later when Pulsar rolls the ledger (coverage stays closed-only, BP-34).
            if ctx.placement and not ctx.without and (weak := check_durability_policy(
                    md, ctx.settings.min_write_quorum, ctx.settings.min_ack_quorum)) is not None:
                violations.append(weak)
        elif md.last_entry_id < 0:
            counts["skipped_empty"] += 1
            if read.ledger_id not in ctx.marked:
                # Nothing to cover, but a writer may have gone on past an empty close: its bookies are
                # asked for the entries past the close alone.
                candidates.append(md)
        elif read.ledger_id in ctx.marked:
            counts["skipped_underreplicated"] += 1
            marked.append(md)
        else:
            candidates.append(md)
    return Selection(tuple(candidates), dict(counts), tuple(violations), tuple(deleted), tuple(marked_in_scope),
                     tuple(marked))


def by_bookie(ledgers: Iterable[LedgerMetadata], past_the_close: bool = False) -> dict[str, list[LedgerMetadata]]:
    """The ledgers each bookie is asked about: those whose non-empty segments name it; with
    `past_the_close`, every bookie the metadata names. A segment that starts past lastEntryId (an
    ensemble change behind adds in flight at the close) expects nothing, yet its bookies may hold the
    entries from lastEntryId + 1 that belong to it."""
    out: dict[str, list[LedgerMetadata]] = {}
    for md in ledgers:
        ranges = md.segment_ranges()
        every = past_the_close or len(ranges) == len(md.segments)
        for b in md.bookies if every else {b for seg, _, _ in ranges for b in seg.ensemble}:
            out.setdefault(b, []).append(md)
    return out


def wanted(ledgers: Iterable[LedgerMetadata]) -> dict[str, list[int]]:
    return {b: [md.ledger_id for md in mds] for b, mds in by_bookie(ledgers, past_the_close=True).items()}


def answers_for(md: LedgerMetadata, answers: Answers) -> dict[str, BookieAnswer]:
    """What each bookie of the ledger said about it."""
    lid = md.ledger_id
    return {b: ans for b in md.bookies if (ans := answers.get(b, _NOTHING).get(lid)) is not None}


def classify(ctx: RunContext, mode: Pass, ledgers: Sequence[LedgerMetadata], answers: Answers,
             deep: DeepAnswers | None = None, marked: Sequence[LedgerMetadata] = ()) -> RangeResult:
    """The checks of every candidate ledger, from the bookies' answers. A bookie is reported only
    when it was silent at two looks a delay apart and is registered; its copies count as gone only
    when it was unregistered at every look; anything else gets another delayed look. The ledgers `marked`
    under-replicated are not checked; they count in the blast radius (`blast_radius_marked`)."""
    policy = ctx.settings.placement()
    grace_ms = int(ctx.settings.write_cache_grace_seconds * 1000)
    violations: list[Violation] = []
    faulty: dict[int, tuple[str, ...]] = {}
    limbo = residue = 0
    tally = BlastTally()
    deep_answers = deep or {}
    # A deep run counts a corrupt copy as none, and a what-if needs every answer: those look at each.
    encoded = {b: a.encoded for b, a in answers.items() if isinstance(a, BookieAnswers)}
    healthy = (held_exactly_their_shares(ledgers, encoded) if encoded and deep is None and not ctx.without
               else [False] * len(ledgers))
    checked = not_due = 0
    unregistered: set[str] = set()
    for md, held in zip(ledgers, healthy, strict=True):
        found: list[Violation] = []
        if md.last_entry_id < 0:
            if not ctx.without:
                past = check_past_the_close(md, answers_for(md, answers))
                residue += past.residue
                if past.violation is not None:
                    violations.append(past.violation)  # its owner: the driver's, as for every unowned finding
            continue
        checked += 1
        per, cov = analyse(ctx, mode, md, answers, policy, grace_ms, found, faulty, deep_answers, held)
        settled = md.ledger_id not in faulty
        limbo += bool(mode is Pass.FINAL and settled and cov.limbo)
        if settled and not held and not ctx.without:
            past = check_past_the_close(md, per)
            residue += past.residue
            if past.violation is not None:
                found.append(past.violation)
        if settled and ctx.lost is not None and not ctx.without and (gone := ctx.lost.gone(md)):
            unregistered |= gone
            v = check_lost_bookie_recovery(md, per, held, gone, ctx.lost, ctx.now_ms)
            if v is not None:
                found.append(v)
            else:
                not_due += 1
        owner = owner_from_custom_metadata(md.custom_metadata)
        if found:
            violations += [dataclasses.replace(v, owner=owner) for v in found] if owner else found
        if ctx.blast_radius and mode is Pass.FIRST:  # once per ledger: the re-check's pass looks again
            tally.depends(md, ctx.locations, owner)
        # Only a ledger whose every bookie said what it holds (or that it holds nothing).
        if ctx.blast_radius and not (cov.unavailable or cov.invalid or cov.limbo) and md.ledger_id not in faulty:
            tally.would_have(md, blast_radius(md, per, ctx.locations, cov.least_copies), owner)
    for md in marked if ctx.blast_radius and mode is Pass.FIRST else ():
        owner = owner_from_custom_metadata(md.custom_metadata)
        tally.depends(md, ctx.locations, owner)
        tally.would_have(md, blast_radius_marked(md, ctx.marked.get(md.ledger_id, ()), ctx.locations), owner)
    blast = tally.blast()
    stats = {k: n for k, n in (("ledgers_with_limbo_copies", limbo),
                               ("ledgers_with_residue_past_the_close", residue),
                               ("lost_bookie_ledgers_not_yet_due", not_due)) if n}
    return RangeResult(counts={"checked": checked}, violations=tuple(violations), potentially_faulty=faulty,
                       stats={**stats, **deep_stats(deep)} if deep is not None else stats, blast=blast,
                       unregistered=frozenset(unregistered))


def deep_stats(deep: DeepAnswers) -> dict[str, int]:
    """What a deep run verified: ledgers with a copy verified, copies not verifiable, entries, bytes."""
    out: Counter[str] = Counter()
    verified: set[int] = set()
    for per in deep.values():
        for lid, a in per.items():
            if a.verified is None:
                out["deep_copies_unverified"] += 1
                continue
            verified.add(lid)
            out["deep_entries_verified"] += int(a.verified.size)
            out["deep_entries_corrupt"] += len(a.corrupt)
            out["deep_bytes_read"] += a.bytes_read
            out["deep_copies_digest_unchecked"] += not a.digest_checked
    out["deep_ledgers_verified"] = len(verified)
    return dict(out)


def analyse(ctx: RunContext, mode: Pass, md: LedgerMetadata, answers: Answers, policy: PlacementPolicy,
            grace_ms: int, violations: list[Violation], faulty: dict[int, tuple[str, ...]],
            deep: DeepAnswers | None = None, held: bool = False) -> tuple[Mapping[str, BookieAnswer], CoverageResult]:
    """One ledger's checks: its findings into `violations`, or the ledger into `faulty` for another look;
    returns what each bookie said (as the checks counted it) and its coverage. In a deep run a corrupt
    copy is no copy. `held`: every bookie is known to hold exactly its share (`held_exactly_their_shares`)."""
    if ctx.placement and not ctx.without:
        weak = check_durability_policy(md, ctx.settings.min_write_quorum, ctx.settings.min_ack_quorum)
        if weak is not None:
            violations.append(weak)
        v = check_placement(md, policy, ctx.locations)
        if v is not None:
            violations.append(v)
    if held:
        return _NOTHING, healthy_coverage(md.write_quorum)
    lid = md.ledger_id
    per = answers_for(md, answers)
    if mode is Pass.FINAL:
        for b in ctx.lost_bookies & per.keys():
            if per[b].outcome is Outcome.UNAVAILABLE:
                per[b] = NO_LEDGER  # BP-34: a bookie gone from the cluster has lost its copies
    if deep:
        per = {b: without_corrupt(ans, deep.get(b, _NOTHING).get(lid)) for b, ans in per.items()}
        violations += check_deep(md, {b: deep[b][lid] for b in md.bookies if lid in deep.get(b, _NOTHING)})
    cov = check_coverage(md, per)
    if cov.invalid:
        violations.append(Violation(Category.INVALID_BOOKIE_RESPONSE, md.ledger_id, tuple(sorted(cov.invalid)),
                                    {"answers": dict(cov.invalid)}, md.znode_version))
    if mode is Pass.FIRST:
        # a store without modification times (etcd) cannot tell how recent a close was: look again
        recent = grace_ms > 0 and (md.modified_ms < 0 or ctx.now_ms - md.modified_ms < grace_ms)
        if cov.unavailable or cov.limbo or (cov.violation is not None and recent):
            # Copies unknown (or perhaps still in the bookie's write cache): look again after the delay.
            faulty[md.ledger_id] = tuple(sorted(cov.unavailable))
            return per, cov
    else:
        before = set(ctx.silent_before.get(md.ledger_id))
        if any(b not in before or b not in ctx.registered for b in cov.unavailable):
            # Newly silent, or gone from the registrations only now: its own delayed look.
            faulty[md.ledger_id] = tuple(sorted(cov.unavailable))
            return per, cov
    if cov.unavailable:
        reasons = {b: per[b].reason for b in cov.unavailable if b in per}
        silence = {b: "slow" if b in per and per[b].slow else "down" for b in sorted(cov.unavailable)}
        violations.append(Violation(Category.BOOKIE_UNAVAILABLE, md.ledger_id, tuple(sorted(cov.unavailable)),
                                    {"reasons": reasons, "silence": silence}, md.znode_version))
    if cov.violation is not None:
        lost = sorted(ctx.lost_bookies & md.bookies)
        details = {**cov.violation.details, "lost_bookies": lost} if lost else cov.violation.details
        violations.append(dataclasses.replace(cov.violation, details=details))
    if ctx.without and not cov.unavailable:
        violations += what_if(md, per, ctx.without, cov.violation)
    return per, cov


def what_if(md: LedgerMetadata, per: Mapping[str, BookieAnswer], without: frozenset[str],
            today: Violation | None) -> list[Violation]:
    """Were the `without` bookies down: the ledger's would-be category. A ledger already unhealthy
    today keeps today's finding (reported above), marked `unsafe_without` when the what-if takes it
    below its ack quorum."""
    gone = without & md.bookies
    would = coverage_without(md, per, gone)
    if would.violation is None:
        return []
    details = {**would.violation.details, "without": sorted(gone)}
    if today is not None:
        if would.least_copies < md.ack_quorum:
            return [dataclasses.replace(today, details={**today.details, "unsafe_without": sorted(gone),
                                                        "would_have_least_copies": would.least_copies})]
        return []
    return [dataclasses.replace(would.violation, category=WOULD_HAVE[would.violation.category], details=details)]


# ---------------------------------------------------------------------------------------------
# The I/O around it, on an executor


# A range is tens of thousands of short-lived objects without cycles. CPython's default, a young
# collection every 700 allocations (and so a full one every 70,000), re-walks the whole range each
# time: about 15% of a scan's CPU for nothing collected (measured over 100k ledgers).
YOUNG_COLLECTION_THRESHOLD = 10_000


@dataclass
class _Resources:
    store: MetadataStore
    client: BookieClient
    users: int = 0
    retired: bool = False

    def close(self) -> None:
        self.client.close()
        self.store.close()


class ExecutorResources:
    """Metadata-store sessions and agent channels per executor process, reused by every task the process
    runs (Spark reuses its Python workers), one set per run settings and agents: a few at once, since runs of
    different settings can share a process (the auditor's continuous scrutiny beside a local full run). A
    set is closed once it is among the least recently used and no task uses it."""

    MOST = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sets: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], _Resources] = OrderedDict()

    def _acquire(self, ctx: RunContext) -> _Resources:
        key = (repr(ctx.settings), tuple(sorted(ctx.agent_addresses.items())))  # settings hold dicts: unhashable
        with self._lock:
            got = self._sets.get(key)
            if got is None:
                young, *older = gc.get_threshold()
                if 0 < young < YOUNG_COLLECTION_THRESHOLD:  # 0: collection switched off, leave it so
                    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *older)
                got = self._sets[key] = _Resources(open_store(ctx.settings),
                                                   BookieClient.from_settings(ctx.settings, ctx.agent_addresses))
            self._sets.move_to_end(key)
            got.users += 1
            while len(self._sets) > self.MOST:
                _, old = self._sets.popitem(last=False)
                old.retired = True
                if not old.users:
                    old.close()
            return got

    def _release(self, got: _Resources) -> None:
        with self._lock:
            got.users -= 1
            if got.retired and not got.users:
                got.close()

    @contextlib.contextmanager
    def use(self, ctx: RunContext) -> Iterator[tuple[MetadataStore, BookieClient]]:
        """The session and channels for this run's settings, kept open while the caller uses them."""
        got = self._acquire(ctx)
        try:
            yield got.store, got.client
        finally:
            self._release(got)

    def get(self, ctx: RunContext) -> tuple[MetadataStore, BookieClient]:
        """The same, for a caller that holds no task (tests, benches): open until retired or closed."""
        got = self._acquire(ctx)
        self._release(got)
        return got.store, got.client

    def close(self) -> None:
        with self._lock:
            sets, self._sets = list(self._sets.values()), OrderedDict()
        for got in sets:
            got.close()


EXECUTOR = ExecutorResources()
atexit.register(EXECUTOR.close)


def check_range(ctx: RunContext, rng: LedgerRange, mode: Pass = Pass.FIRST) -> RangeResult:
    """Read one range and check it. Never raises for one bad ledger; a range that cannot be read at
    all comes back with an error (the run is then incomplete)."""
    try:
        with EXECUTOR.use(ctx) as (store, client):
            reads_before, failed_before = store.reads, client.failed_calls
            ids = store.ledger_ids(rng)
            enumerated = (LedgerIds.of(np.array(ids, dtype=np.int64)),) if ctx.holdings and mode is Pass.FIRST else ()
            selection = select(ctx, store.read_ledgers(ids))
            s = ctx.settings
            deadline = s.recheck_deadline if mode is Pass.FINAL else s.bookie_deadline_seconds
            answers = client.fetch_many(wanted(selection.candidates), deadline) if selection.candidates else {}
            deep = client.verify_many(by_bookie([md for md in selection.candidates if md.last_entry_id >= 0
                                                 and in_deep_slice(md.ledger_id, s.deep_slices, s.deep_slice)]),
                                      s.deep_send_passwords) if s.deep else None
            checked = classify(ctx, mode, selection.candidates, answers, deep, selection.marked)
            io_stats = {"bookie_calls_failed": client.failed_calls - failed_before,
                        "store_reads": store.reads - reads_before, "store_peak_in_flight": store.peak_in_flight}
    except (StoreError, DataError) as exc:
        return RangeResult(errors=(f"range {rng.describe()}: {exc}",))
    return RangeResult.merge([
        RangeResult(selection.counts, selection.violations, deleted=selection.deleted,
                    marked_in_scope=selection.marked_in_scope, stats=io_stats, enumerated=enumerated),
        checked,
    ])
