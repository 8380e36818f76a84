"""A range's ledgers sorted and checked, from their metadata and the bookies' answers: pure (the checks
applied as BP-34 asks: a bookie is reported only when silent at two looks a delay apart and registered)."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

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
    check_checksums,
    check_coverage,
    check_deep,
    check_durability_policy,
    check_past_the_close,
    check_placement,
    coverage_without,
    healthy_coverage,
    held_exactly_their_shares,
    served_corrupt,
    without_corrupt,
)
from scrutiny.checks.sequences import LedgerSequences
from scrutiny.lostbookies import check_lost_bookie_recovery
from scrutiny.metadata import LedgerMetadata, LedgerState
from scrutiny.pulsar.owners import owner_from_custom_metadata
from scrutiny.runstats import Deep, Scan
from scrutiny.scan.context import Answers, DeepAnswers, Pass, RunContext
from scrutiny.scan.healthy import check_healthy
from scrutiny.scan.result import BlastTally, RangeResult
from scrutiny.store import LedgerRead

NOTHING: Mapping[Any, Any] = MappingProxyType({})  # a bookie not asked about any ledger; no answers


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
    """The ledgers each bookie is asked about, past the close too: every bookie the metadata names."""
    out: defaultdict[str, list[int]] = defaultdict(list)
    for md in ledgers:
        lid = md.ledger_id
        for b in md.bookies:
            out[b].append(lid)
    return dict(out)


def answers_for(md: LedgerMetadata, answers: Answers) -> dict[str, BookieAnswer]:
    """What each bookie of the ledger said about it."""
    lid = md.ledger_id
    return {b: ans for b in md.bookies if (ans := answers.get(b, NOTHING).get(lid)) is not None}


def classify(ctx: RunContext, mode: Pass, ledgers: Sequence[LedgerMetadata], answers: Answers,
             deep: DeepAnswers | None = None, marked: Sequence[LedgerMetadata] = (),
             grouped: bool = True) -> RangeResult:
    """The checks of every candidate ledger, from the bookies' answers. A bookie is reported only
    when it was silent at two looks a delay apart and is registered; its copies count as gone only
    when it was unregistered at every look; anything else gets another delayed look. The ledgers `marked`
    under-replicated are not checked; they count in the blast radius (`blast_radius_marked`). The healthy
    majority is checked a group at a time (`check_healthy`) unless `grouped` is False (the reference path)."""
    policy = ctx.settings.placement()
    grace_ms = int(ctx.settings.write_cache_grace_seconds * 1000)
    violations: list[Violation] = []
    faulty: dict[int, tuple[str, ...]] = {}
    limbo = residue = 0
    tally = BlastTally()
    deep_answers = deep or {}
    # A deep run counts a corrupt copy as none, and a what-if needs every answer: those look at each.
    columns = {b: a.columns() for b, a in answers.items() if isinstance(a, BookieAnswers)}
    healthy = (held_exactly_their_shares(ledgers, columns) if columns and deep is None and not ctx.without
               else [False] * len(ledgers))
    checked = not_due = 0
    rest: Iterable[int] = range(len(ledgers))
    if grouped and deep is None and not ctx.without and any(healthy):
        groups = check_healthy(ctx, mode, ledgers, healthy, tally)
        checked, rest = groups.checked, groups.rest
    unregistered: set[str] = set()
    messages: list[LedgerSequences] = []
    for i in rest:
        md, held = ledgers[i], healthy[i]
        found: list[Violation] = []
        if md.last_entry_id < 0:
            if deep is not None and md.state is LedgerState.CLOSED and (owner := owner_from_custom_metadata(
                    md.custom_metadata)) is not None and owner.kind == "topic":
                # a topic's ledger closed empty (an idle topic unloaded after a rollover): read whole, as it is
                messages.append(LedgerSequences.of(md.ledger_id, owner.name, md.last_entry_id, {}))
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
        if deep is not None and owner is not None and owner.kind == "topic":
            # entries on no bookie of their write set, every bookie having answered, are lost: the rest is
            # validated, so that deduplication's snapshot can say whose acknowledged messages they were
            lost = (settled and cov.violation is not None and cov.violation.category is Category.NO_REPLICA_OF_AN_ENTRY
                    and not (cov.unavailable or cov.invalid or cov.limbo))
            if (read := scrubbed(md, deep_answers)) or lost:
                messages.append(LedgerSequences.of(md.ledger_id, owner.name, md.last_entry_id, read, lost))
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
    stats = Scan(ledgers_with_limbo_copies=limbo, ledgers_with_residue_past_the_close=residue,
                 lost_bookie_ledgers_not_yet_due=not_due).nonzero()
    return RangeResult(counts={"checked": checked}, violations=tuple(violations), potentially_faulty=faulty,
                       stats={**stats, **deep_stats(deep)} if deep is not None else stats, blast=blast,
                       unregistered=frozenset(unregistered), messages=tuple(messages))


def scrubbed(md: LedgerMetadata, deep: DeepAnswers) -> dict[str, DeepAnswer]:
    """What the ledger's bookies said of its stored bytes (the deep scrub)."""
    return {b: deep[b][md.ledger_id] for b in md.bookies if md.ledger_id in deep.get(b, NOTHING)}


def deep_stats(deep: DeepAnswers) -> dict[str, int]:
    """What a deep run verified: ledgers with a copy verified, copies not verifiable, entries, bytes."""
    answers = [(lid, a) for per in deep.values() for lid, a in per.items()]
    read = [(lid, a, a.verified) for lid, a in answers if a.verified is not None]
    return Deep(deep_ledgers_verified=len({lid for lid, _, _ in read}),
                deep_entries_verified=sum(int(verified.size) for _, _, verified in read),
                deep_bytes_read=sum(a.bytes_read for _, a, _ in read),
                deep_entries_corrupt=sum(len(a.corrupt) for _, a, _ in read),
                deep_copies_unverified=len(answers) - len(read),
                deep_copies_digest_unchecked=sum(not a.digest_checked for _, a, _ in read)).nonzero()


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
        return NOTHING, healthy_coverage(md.write_quorum)
    lid = md.ledger_id
    per = answers_for(md, answers)
    if mode is Pass.FINAL:
        for b in ctx.lost_bookies & per.keys():
            if per[b].outcome is Outcome.UNAVAILABLE:
                per[b] = NO_LEDGER  # BP-34: a bookie gone from the cluster has lost its copies
    looks_held: dict[str, list[int]] = {}
    if deep:
        per = {b: without_corrupt(ans, deep.get(b, NOTHING).get(lid)) for b, ans in per.items()}
        read = scrubbed(md, deep)
        violations += check_deep(md, read)
        violations += check_checksums(md, read)
        looks_held = {b: served for b, a in read.items() if (served := served_corrupt(a))}
    cov = check_coverage(md, per, looks_held)
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
        # where each was asked: its agent's registered address (null: none registered, its default port)
        explicit, registered = ctx.settings.bookie_endpoints, ctx.agent_addresses
        agents = {b: explicit.get(b) or registered.get(b) for b in sorted(cov.unavailable)}
        violations.append(Violation(Category.BOOKIE_UNAVAILABLE, md.ledger_id, tuple(sorted(cov.unavailable)),
                                    {"reasons": reasons, "silence": silence, "agents": agents}, md.znode_version))
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

