"""The checks of a scrutiny run, as pure functions over plain data (no I/O).

- placement: does every write set of every segment ensemble follow the placement policy?
- coverage: does every entry of a closed ledger have its copies on its write set (round robin)?
- under-replication age: has a ledger been marked under-replicated for longer than the grace period?

Coverage works on residues: in a segment with ensemble size E, entry e = k*E + r sits on ensemble
positions (r + w) % E, w < WQ, whatever k is. A bookie's expected share and what it holds become, per
residue r, intervals of k; lost entries are interval differences, so checking a healthy ledger of
ten million entries costs what checking one of ten does.
"""

from __future__ import annotations

import enum
import functools
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from scrutiny.categories import Category
from scrutiny.codec import (
    EMPTY_ANSWER,
    Availability,
    CodecError,
    Intervals,
    Row,
    SequenceGroup,
    decode,
    groups_from_residues,
    groups_of,
    is_exact_encoding,
    runs_of,
    subtract,
)
from scrutiny.metadata import (
    DEFAULT_RACK,
    DEFAULT_REGION_LOCATION,
    DEFAULT_ZONE_LOCATION,
    LedgerMetadata,
    UnderreplicationMark,
)
from scrutiny.owners import UNKNOWN, Owner

MAX_DETAIL_RANGES = 50


@dataclass(frozen=True)
class Violation:
    category: Category
    ledger_id: int
    bookies: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)
    # The metadata znode version the finding was computed from (for the re-read before reporting).
    metadata_version: int = -1
    owner: Owner | None = None  # the Pulsar topic (cursor, ...) the ledger belongs to; None: not known yet

    def to_json(self) -> dict[str, Any]:
        return {"category": str(self.category), "ledger_id": self.ledger_id, "bookies": list(self.bookies),
                "details": dict(self.details), "owner": (self.owner or UNKNOWN).to_json()}


# ---------------------------------------------------------------------------------------------
# What a bookie said about a ledger


class Outcome(enum.StrEnum):
    ENTRIES = "entries"
    NO_LEDGER = "no_ledger"
    UNAVAILABLE = "unavailable"
    INVALID = "invalid"
    LIMBO = "limbo"  # BP-46: the bookie holds what it lists and cannot tell about the rest (unknown)


class BookieAnswer(NamedTuple):  # one per (bookie, ledger) of a scan: a tuple is the cheapest immutable record
    outcome: Outcome
    availability: Availability | None = None
    reason: str = ""
    slow: bool = False  # UNAVAILABLE: the call timed out at an agent that answers its health check


NO_LEDGER = BookieAnswer(Outcome.NO_LEDGER)


def listed(outcome: Outcome, bookie_id: str, ledger_id: int, encoded: bytes) -> BookieAnswer:
    """An answer that lists entries (BP-34 encoded), decoded; one that cannot be decoded is INVALID."""
    try:
        return BookieAnswer(outcome, decode(encoded or EMPTY_ANSWER))
    except CodecError as exc:
        return BookieAnswer(Outcome.INVALID, reason=f"bookie {bookie_id}, ledger {ledger_id}: {exc}")


class BookieAnswers(Mapping[int, BookieAnswer]):
    """What one bookie said about many ledgers. A list of entries is kept as the bookie encoded it and
    decoded only when looked at: most shares are healthy, and those are compared as bytes
    (`held_exactly_their_shares`). A ledger is in `encoded` or in `other`, never in both."""

    __slots__ = ("bookie_id", "encoded", "other")

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.encoded: dict[int, bytes] = {}  # ledger -> the entries it holds (EOK), as encoded
        self.other: dict[int, BookieAnswer] = {}  # ledger -> any other answer

    def __getitem__(self, ledger_id: int) -> BookieAnswer:
        answer = self.other.get(ledger_id)
        if answer is None:
            answer = listed(Outcome.ENTRIES, self.bookie_id, ledger_id, self.encoded[ledger_id])
        return answer

    def get(self, ledger_id: int, default: Any = None) -> Any:
        return self[ledger_id] if ledger_id in self.encoded or ledger_id in self.other else default

    def __contains__(self, ledger_id: object) -> bool:
        return ledger_id in self.encoded or ledger_id in self.other

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.encoded, self.other)

    def __len__(self) -> int:
        return len(self.encoded) + len(self.other)

    def merge(self, more: BookieAnswers) -> None:
        """Answers about other ledgers (another call's)."""
        self.encoded.update(more.encoded)
        self.other.update(more.other)


# ---------------------------------------------------------------------------------------------
# Placement


class PlacementResult(enum.IntEnum):
    FAIL = 0
    MEETS_SOFT = 1
    MEETS_STRICT = 2


@dataclass(frozen=True)
class PlacementPolicy:
    kind: str = "rackaware"  # rackaware | zoneaware | regionaware | none
    min_racks_per_write_quorum: int = 2
    enforce_min_racks: bool = False
    min_zones_per_write_quorum: int = 2
    desired_zones_per_write_quorum: int = 3
    min_regions_for_durability: int = 2

    KINDS = ("rackaware", "zoneaware", "regionaware", "none")


def write_sets(ensemble: Sequence[str], wq: int) -> list[tuple[str, ...]]:
    """The write set starting at every ensemble position (wrapping)."""
    e = len(ensemble)
    return [tuple(ensemble[(i + j) % e] for j in range(wq)) for i in range(e)]


def _rackaware(policy: PlacementPolicy, ensemble: Sequence[str], wq: int,
               locations: Mapping[str, str]) -> tuple[PlacementResult, str]:
    need = min(wq, policy.min_racks_per_write_quorum)
    where = []
    for b in ensemble:  # a plain loop: every segment of every ledger comes through here
        where.append(locations.get(b, DEFAULT_RACK))
    e = len(where)
    if len(set(where)) == e and not (policy.enforce_min_racks and DEFAULT_RACK in where):
        return PlacementResult.MEETS_STRICT, ""  # every write set spans WQ racks
    for i in range(e):
        racks = {where[(i + j) % e] for j in range(wq)}
        if len(racks) < need:
            return PlacementResult.FAIL, f"write set at position {i} spans {len(racks)} rack(s) {sorted(racks)}, " \
                                         f"needs {need}"
        if policy.enforce_min_racks and DEFAULT_RACK in racks:
            return PlacementResult.FAIL, f"write set at position {i} has a bookie on the default rack"
    return PlacementResult.MEETS_STRICT, ""


def _zoneaware(policy: PlacementPolicy, ensemble: Sequence[str], wq: int,
               locate: Callable[[str], str]) -> tuple[PlacementResult, str]:
    e = len(ensemble)
    if e % wq != 0:
        return PlacementResult.FAIL, f"ensemble size {e} is not a multiple of write quorum {wq}"
    if wq <= policy.min_zones_per_write_quorum:
        return PlacementResult.FAIL, f"write quorum {wq} is not above minNumZonesPerWriteQuorum " \
                                     f"{policy.min_zones_per_write_quorum}"
    where: dict[str, tuple[str, str]] = {}
    for b in ensemble:
        loc = locate(b)
        parts = loc.strip("/").split("/")
        if loc == DEFAULT_ZONE_LOCATION or len(parts) != 2 or not all(parts):
            return PlacementResult.FAIL, f"bookie {b} has no known /zone/upgradeDomain location ({loc})"
        where[b] = (parts[0], parts[1])
    result, reason = PlacementResult.MEETS_STRICT, ""
    desired = min(wq, policy.desired_zones_per_write_quorum)
    for i, ws in enumerate(write_sets(ensemble, wq)):
        zones: dict[str, set[str]] = {}
        count: dict[str, int] = {}
        for b in ws:
            z, ud = where[b]
            zones.setdefault(z, set()).add(ud)
            count[z] = count.get(z, 0) + 1
        if len(zones) < policy.min_zones_per_write_quorum:
            return PlacementResult.FAIL, f"write set at position {i} spans {len(zones)} zone(s), needs " \
                                         f"{policy.min_zones_per_write_quorum}"
        for z, uds in zones.items():
            if count[z] > 1 and len(uds) < 2:
                return PlacementResult.FAIL, f"write set at position {i} has {count[z]} bookies in zone {z} " \
                                             f"on one upgrade domain"
        if len(zones) < desired and result is PlacementResult.MEETS_STRICT:
            result, reason = PlacementResult.MEETS_SOFT, f"write set at position {i} spans {len(zones)} zone(s), " \
                                                         f"desired {desired}"
    return result, reason


def _regionaware(policy: PlacementPolicy, ensemble: Sequence[str], wq: int,
                 locate: Callable[[str], str]) -> tuple[PlacementResult, str]:
    need = min(wq, policy.min_regions_for_durability)
    result, reason = PlacementResult.MEETS_STRICT, ""
    for i, ws in enumerate(write_sets(ensemble, wq)):
        locs = [locate(b) for b in ws]
        regions = {loc.strip("/").split("/")[0] for loc in locs}
        if len(regions) < need:
            return PlacementResult.FAIL, f"write set at position {i} spans {len(regions)} region(s), needs {need}"
        if len(set(locs)) < len(locs) and result is PlacementResult.MEETS_STRICT:
            result, reason = PlacementResult.MEETS_SOFT, f"write set at position {i} has two bookies on one rack"
    return result, reason


def check_ensemble(policy: PlacementPolicy, ensemble: Sequence[str], wq: int,
                   locations: Mapping[str, str]) -> tuple[PlacementResult, str]:
    """One segment's ensemble against the policy: (result, why when not strict)."""
    if policy.kind == "none":
        return PlacementResult.MEETS_STRICT, ""
    if not ensemble:
        return PlacementResult.FAIL, "empty ensemble"
    if policy.kind == "rackaware":
        # Every ensemble member counts, writable or not (upstream's false FAIL); unmapped: default rack.
        return _rackaware(policy, ensemble, wq, locations)
    if policy.kind == "zoneaware":
        return _zoneaware(policy, ensemble, wq, lambda b: locations.get(b, DEFAULT_ZONE_LOCATION))
    if policy.kind == "regionaware":
        return _regionaware(policy, ensemble, wq, lambda b: locations.get(b, DEFAULT_REGION_LOCATION))
    raise ValueError(f"unknown placement policy {policy.kind!r}")


def check_durability_policy(md: LedgerMetadata, min_write_quorum: int, min_ack_quorum: int) -> Violation | None:
    """A ledger whose policy cannot survive the loss of one bookie, by design: a write quorum of one (that
    copy is the only one), or an ack quorum below the operator's minimum (an entry acknowledged on fewer
    copies). Kafka's replication factor and min.insync.replicas, in BookKeeper's words."""
    reasons = []
    if md.write_quorum < min_write_quorum:
        reasons.append(f"write quorum {md.write_quorum} < min_write_quorum {min_write_quorum}: "
                       + ("every entry has one copy" if md.write_quorum == 1 else "fewer copies than required"))
    if md.ack_quorum < min_ack_quorum:
        reasons.append(f"ack quorum {md.ack_quorum} < min_ack_quorum {min_ack_quorum}: an entry is acknowledged "
                       f"with {md.ack_quorum} cop{'y' if md.ack_quorum == 1 else 'ies'}")
    if not reasons:
        return None
    return Violation(Category.WEAK_DURABILITY_POLICY, md.ledger_id, (), {
        "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum, "ack_quorum": md.ack_quorum,
        "min_write_quorum": min_write_quorum, "min_ack_quorum": min_ack_quorum, "reasons": reasons},
        md.znode_version)


def check_placement(md: LedgerMetadata, policy: PlacementPolicy, locations: Mapping[str, str]) -> Violation | None:
    """Every segment of the ledger; a ledger with any FAIL is not adhering, else any MEETS_SOFT is soft."""
    worst = PlacementResult.MEETS_STRICT
    findings: list[dict[str, Any]] = []
    for seg in md.segments:
        result, reason = check_ensemble(policy, seg.ensemble, md.write_quorum, locations)
        if result is not PlacementResult.MEETS_STRICT:
            findings.append({"first_entry_id": seg.first_entry_id, "ensemble": list(seg.ensemble),
                             "result": result.name, "reason": reason})
            worst = min(worst, result)
    if worst is PlacementResult.MEETS_STRICT:
        return None
    category = (Category.PLACEMENT_POLICY_NOT_ADHERING if worst is PlacementResult.FAIL
                else Category.PLACEMENT_POLICY_SOFTLY_ADHERING)
    bookies = sorted({b for f in findings if f["result"] == worst.name for b in f["ensemble"]})
    return Violation(category, md.ledger_id, tuple(bookies),
                     {"policy": policy.kind, "segments": findings[:MAX_DETAIL_RANGES]}, md.znode_version)


# ---------------------------------------------------------------------------------------------
# Coverage (the replicas check)


@dataclass(frozen=True)
class CoverageResult:
    least_copies: int  # over every entry of the ledger, counting unknown bookies as holding theirs
    violation: Violation | None
    unavailable: frozenset[str]  # bookies whose copies are unknown (no answer)
    invalid: Mapping[str, str]  # bookie -> why its answer could not be used
    limbo: frozenset[str] = frozenset()  # bookies that do not know this ledger's state (copies unknown)


def _expected_k(r: int, e: int, lo: int, hi: int) -> tuple[int, int]:
    return -((r - lo) // e), (hi - r) // e


def _sweep(per_position: Sequence[Intervals]) -> list[tuple[int, int, frozenset[int]]]:
    """Elementary k-intervals, ascending, where a non-empty, constant set of the positions' intervals covers
    them (of entries each position misses, for coverage; holds, past the close)."""
    points = sorted({p for ivs in per_position for k0, k1 in ivs for p in (k0, k1 + 1)})
    cursor = [0] * len(per_position)
    out = []
    for a, b in itertools.pairwise(points):
        missing = set()
        for pos, ivs in enumerate(per_position):
            while cursor[pos] < len(ivs) and ivs[cursor[pos]][1] < a:
                cursor[pos] += 1
            if cursor[pos] < len(ivs) and ivs[cursor[pos]][0] <= a:
                missing.add(pos)
        if missing:
            out.append((a, b - 1, frozenset(missing)))
    return out


def _each_holds_its_share(md: LedgerMetadata, answers: Mapping[str, BookieAnswer]) -> bool:
    """Did every bookie answer with exactly its expected share, as the same groups (an agent encodes a
    healthy share so)? Then every entry has its WQ copies."""
    ranges = md.segment_ranges()
    if len(md.segments) == 1 and ranges:  # most ledgers: each position's share straight from its index
        seg, lo, hi = ranges[0]
        e, wq = md.ensemble_size, md.write_quorum
        shares: Iterable[tuple[str, Sequence[Row]]] = (
            (b, _share_rows(e, wq, pos, lo, hi)) for pos, b in enumerate(seg.ensemble))
    else:
        shares = ((b, expected_share(md, b)) for b in md.bookies)
    for b, share in shares:
        ans = answers.get(b)
        if ans is None or ans.outcome is not Outcome.ENTRIES or ans.availability is None \
                or not ans.availability.same_groups(share):
            return False
    return True


def held_exactly_their_shares(ledgers: Sequence[LedgerMetadata],
                              encoded: Mapping[str, Mapping[int, bytes]]) -> list[bool]:
    """Per ledger: did every bookie of this one-segment ledger answer with exactly the encoding of its
    expected share (as an agent encodes a healthy share)? Then every entry has its WQ copies. All the
    ledgers at once and as bytes, so that a healthy answer is never decoded. False is no verdict: the
    ledger is then checked alone (`check_coverage`)."""
    index: list[int] = []
    shapes: list[tuple[int, int, int, int]] = []  # (E, WQ, first entry, last entry)
    answers: list[bytes] = []  # per ensemble position of each of them
    for i, md in enumerate(ledgers):
        # (numpy's int64 would wrap on entry ids near 2**63: such a ledger is checked alone)
        if len(md.segments) == 1 and len(md.segments[0].ensemble) == md.ensemble_size and md.last_entry_id < 1 << 60:
            ranges = md.segment_ranges()
            if ranges:
                seg, lo, hi = ranges[0]
                lid = md.ledger_id
                for b in seg.ensemble:
                    answers.append(encoded.get(b, _NO_BYTES).get(lid, b""))
                index.append(i)
                shapes.append((md.ensemble_size, md.write_quorum, lo, hi))
    healthy = np.zeros(len(ledgers), dtype=bool)
    if index:
        e, wq, lo, hi = np.array(shapes, dtype=np.int64).T
        ledger = np.repeat(np.arange(len(index)), e)  # of each (ledger, position)
        pos = np.arange(ledger.size) - (np.cumsum(e) - e)[ledger]
        rows, counts = _share_columns(e[ledger], wq[ledger], pos, lo[ledger], hi[ledger])
        where = np.asarray(index)
        healthy[where] = True
        healthy[where[ledger[~is_exact_encoding(answers, rows, counts)]]] = False
    return healthy.tolist()


_NO_BYTES: Mapping[int, bytes] = MappingProxyType({})


@functools.cache
def healthy_coverage(wq: int) -> CoverageResult:
    """A healthy ledger's result: one immutable value shared by all of them."""
    return CoverageResult(wq, None, frozenset(), MappingProxyType({}))


def check_coverage(md: LedgerMetadata, answers: Mapping[str, BookieAnswer]) -> CoverageResult:
    """The replicas check of a closed ledger. A bookie without an entry in `answers`, or whose answer
    is unavailable, invalid or in limbo, is unknown: its copies are neither counted missing nor present."""
    e, wq, aq = md.ensemble_size, md.write_quorum, md.ack_quorum
    if _each_holds_its_share(md, answers):  # the common case, without the residue arithmetic
        return healthy_coverage(wq)
    least = wq
    unavailable: set[str] = set()
    limbo: set[str] = set()
    invalid: dict[str, str] = {}
    # (missing bookies, copies) -> per-residue k-intervals, per segment (for the details)
    findings: list[tuple[frozenset[str], int, list[Intervals]]] = []
    for seg, lo, hi in md.segment_ranges():
        missing: list[list[Intervals]] = []  # [position][residue]
        for pos, b in enumerate(seg.ensemble):
            ans = answers.get(b, BookieAnswer(Outcome.UNAVAILABLE, reason="not asked"))
            if ans.outcome is Outcome.UNAVAILABLE:
                unavailable.add(b)
            elif ans.outcome is Outcome.INVALID:
                invalid[b] = ans.reason
            elif ans.outcome is Outcome.LIMBO:
                limbo.add(b)
            if ans.outcome in (Outcome.UNAVAILABLE, Outcome.INVALID, Outcome.LIMBO):
                missing.append([[] for _ in range(e)])
                continue
            held = (ans.availability.residue_intervals(e, lo, hi) if ans.availability is not None
                    else [[] for _ in range(e)])
            missing.append([
                subtract([_expected_k(r, e, lo, hi)], held[r]) if (pos - r) % e < wq else []
                for r in range(e)
            ])
        by_kind: dict[tuple[frozenset[str], int], list[Intervals]] = {}
        for r in range(e):
            positions = [(r + w) % e for w in range(wq)]
            for k0, k1, gone in _sweep([missing[p][r] for p in positions]):
                copies = wq - len(gone)
                least = min(least, copies)
                who = frozenset(seg.ensemble[positions[i]] for i in gone)
                by_kind.setdefault((who, copies), [[] for _ in range(e)])[r].append((k0, k1))
        findings += [(who, copies, per_r) for (who, copies), per_r in by_kind.items()]
    violation = None
    category = coverage_category(least, aq, wq)
    if category is not None:
        ranges = []
        for who, copies, per_r in findings:
            for g in groups_from_residues([sorted(ivs) for ivs in per_r], e):
                ranges.append({"first_entry": g.first, "last_entry": g.end, "sequence_size": g.size,
                               "sequence_period": g.period, "entries": g.count, "copies": copies,
                               "missing_bookies": sorted(who)})
        ranges.sort(key=lambda d: (d["copies"], d["first_entry"]))
        bookies = sorted({b for who, _, _ in findings for b in who})
        details: dict[str, Any] = {"least_copies": least, "write_quorum": wq, "ack_quorum": aq,
                                   "ensemble_size": e, "under_covered": ranges[:MAX_DETAIL_RANGES]}
        if len(ranges) > MAX_DETAIL_RANGES:
            details["under_covered_truncated"] = len(ranges) - MAX_DETAIL_RANGES
        if unavailable or invalid or limbo:
            details["unknown_bookies"] = sorted(unavailable | set(invalid) | limbo)
        violation = Violation(category, md.ledger_id, tuple(bookies), details, md.znode_version)
    return CoverageResult(least, violation, frozenset(unavailable), invalid, frozenset(limbo))


@dataclass(frozen=True)
class PastTheClose:
    """What the bookies hold above a closed ledger's lastEntryId: the finding, if any, and whether
    some copy there is the residue of unacknowledged writes (counted, never reported)."""

    violation: Violation | None
    residue: bool


NOTHING_PAST_THE_CLOSE = PastTheClose(None, False)


def check_past_the_close(md: LedgerMetadata, answers: Mapping[str, BookieAnswer]) -> PastTheClose:
    """ENTRIES_PAST_THE_CLOSE: entries above lastEntryId that may have been acknowledged to a writer
    (apache/bookkeeper #4812). A writer acknowledges entries in order, each once it has AQ copies on its
    write set, so an entry past the close may have been acknowledged only if it and every entry from
    lastEntryId + 1 up to it have AQ copies on the write sets they would have had (those of the last
    segment starting at or before them). Those entries are reported; any other copy past the close is
    the residue of a close or a recovery with writes in flight (docs/entries-past-the-close.md). Only
    copies known from answers count: a silent bookie's are unknown."""
    last = md.last_entry_id
    top = max((a.availability.highest for a in answers.values() if a.availability is not None), default=-1)
    if top <= last:
        return NOTHING_PAST_THE_CLOSE
    wq, aq = md.write_quorum, md.ack_quorum
    segments = sorted(md.segments, key=lambda s: s.first_entry_id)
    end = last  # the last entry of the run from lastEntryId + 1 that has AQ copies everywhere
    least = wq
    holders: set[str] = set()
    ensemble: tuple[str, ...] = ()
    for i, seg in enumerate(segments):
        lo = max(seg.first_entry_id, end + 1)
        hi = top if i + 1 == len(segments) else min(top, segments[i + 1].first_entry_id - 1)
        if lo > hi or not seg.ensemble:
            continue
        if lo > end + 1:
            break
        e = len(seg.ensemble)
        held: list[list[Intervals]] = [a.availability.residue_intervals(e, lo, hi) if (a := answers.get(b)) is not None
                and a.availability is not None else [[] for _ in range(e)] for b in seg.ensemble]
        gap = hi + 1  # the first entry in [lo, hi] with fewer than AQ copies
        covered: list[tuple[int, int]] = []  # (first entry, copies) of the runs with AQ copies before each gap
        for r in range(e):
            k, k_hi = -((r - lo) // e), (hi - r) // e
            for k0, k1, holding in _sweep([held[(r + w) % e][r] for w in range(wq)]):
                copies = len(holding)
                if k0 > k or copies < aq:
                    break
                covered.append((k0 * e + r, copies))
                k = k1 + 1
            if k <= k_hi:
                gap = min(gap, k * e + r)
        least = min([least, *(copies for first, copies in covered if first < gap)])
        if gap > lo:
            ensemble = ensemble or seg.ensemble
            holders |= {b for p, b in enumerate(seg.ensemble)
                        if any(k0 * e + r < gap for r, ivs in enumerate(held[p]) for k0, _ in ivs[:1])}
            end = gap - 1
        if gap <= hi:
            break
    residue = top > end
    if end == last:
        return PastTheClose(None, residue)
    details = {"last_entry_id": last, "entries": [[last + 1, end]], "count": end - last, "least_copies": least,
               "ack_quorum": aq, "write_quorum": wq, "ensemble": list(ensemble), "highest_entry_held": top}
    return PastTheClose(Violation(Category.ENTRIES_PAST_THE_CLOSE, md.ledger_id, tuple(sorted(holders)), details,
                                  md.znode_version), residue)


def coverage_without(md: LedgerMetadata, answers: Mapping[str, BookieAnswer], gone: Collection[str]) -> CoverageResult:
    """The replicas check as it would be if the `gone` bookies had lost every copy (a what-if)."""
    return check_coverage(md, {**answers, **{b: NO_LEDGER for b in gone}})


def blast_radius(md: LedgerMetadata, answers: Mapping[str, BookieAnswer], locations: Mapping[str, str],
                 least_today: int) -> dict[tuple[str, str], int]:
    """(scope, name) -> the least copies of any entry if that bookie (scope "bookie") or that rack
    ("rack") alone went down; only for a ledger whose every bookie answered. A healthy ledger (every
    entry has its WQ copies, `least_today`) needs no set arithmetic: without the bookies G each entry
    keeps WQ minus the members of G in its write set."""
    wq = md.write_quorum
    if least_today >= wq:
        segments = md.segment_ranges()
        # Every segment holds entries, each at least a full turn of its ensemble: every write set occurs.
        if len(segments) == 1 == len(md.segments) and segments[0][2] - segments[0][1] >= md.ensemble_size - 1:
            return _full_turns_without(segments[0][0].ensemble, wq, locations)
        if len(segments) == len(md.segments) and all(hi - lo + 1 >= md.ensemble_size for _, lo, hi in segments):
            out: dict[tuple[str, str], int] = {}
            for seg, _, _ in segments:
                for key, copies in _full_turns_without(seg.ensemble, wq, locations).items():
                    out[key] = min(copies, out.get(key, copies))
            return out

        def left(gone: Collection[str]) -> int:
            return wq - most_in_a_write_set(md, set(gone))
    else:
        def left(gone: Collection[str]) -> int:
            return coverage_without(md, answers, gone).least_copies
    members: dict[str, list[str]] = {}
    for b in md.bookies:
        members.setdefault(locations.get(b, DEFAULT_RACK), []).append(b)
    out = {("bookie", b): left((b,)) for b in md.bookies}
    for rack, bookies in members.items():
        out["rack", rack] = left(bookies)
    return out


def _full_turns_without(ensemble: Sequence[str], wq: int, locations: Mapping[str, str]) -> dict[tuple[str, str], int]:
    """`blast_radius` of healthy entries that run through every write set of this ensemble: a bookie
    alone (or a rack of one) takes one copy; a rack of more takes the most it has in one write set."""
    left = wq - 1
    out: dict[tuple[str, str], int] = {}
    racks = []
    for b in ensemble:  # plain loops: this runs for nearly every ledger of a scan
        out["bookie", b] = left
        rack = locations.get(b, DEFAULT_RACK)
        out["rack", rack] = left
        racks.append(rack)
    e = len(ensemble)
    if len(set(racks)) < e:
        for rack in set(racks):
            out["rack", rack] = wq - max(sum(racks[(i + j) % e] == rack for j in range(wq)) for i in range(e))
    return out


def blast_radius_marked(md: LedgerMetadata, missing: Collection[str],
                        locations: Mapping[str, str]) -> dict[tuple[str, str], int]:
    """The blast radius of a ledger marked under-replicated, whose copies are not asked while it is marked:
    as if the bookies its mark names (those BookKeeper found without their copies) held none and the others
    held theirs."""
    gone = set(missing) & md.bookies
    wq = md.write_quorum
    members: dict[str, list[str]] = {}
    for b in md.bookies:
        members.setdefault(locations.get(b, DEFAULT_RACK), []).append(b)
    out = {("bookie", b): wq - most_in_a_write_set(md, gone | {b}) for b in md.bookies}
    for rack, bookies in members.items():
        out["rack", rack] = wq - most_in_a_write_set(md, gone | set(bookies))
    return out


def most_in_a_write_set(md: LedgerMetadata, gone: set[str]) -> int:
    """The most bookies of `gone` in the write set of any entry of the closed ledger."""
    e, wq = md.ensemble_size, md.write_quorum
    most = 0
    for seg, lo, hi in md.segment_ranges():
        starts = range(e) if hi - lo + 1 >= e else sorted({x % e for x in range(lo, hi + 1)})
        for i in starts:
            most = max(most, sum(1 for j in range(wq) if seg.ensemble[(i + j) % e] in gone))
    return most


def iso(ms: int) -> str:
    """A time as the report writes times (ISO-8601 UTC, milliseconds)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


WOULD_HAVE = {Category.NO_REPLICA_OF_AN_ENTRY: Category.WOULD_HAVE_NO_REPLICA_OF_AN_ENTRY,
              Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY: Category.WOULD_HAVE_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY,
              Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY: Category.WOULD_HAVE_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY}


def coverage_category(least: int, aq: int, wq: int) -> Category | None:
    if least <= 0:
        return Category.NO_REPLICA_OF_AN_ENTRY
    if least < aq:
        return Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY
    if least < wq:
        return Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY
    return None


def expected_share(md: LedgerMetadata, bookie_id: str) -> list[SequenceGroup]:
    """The groups a bookie must hold of a closed ledger, as a valid (merged) encoding: per segment a
    partial head run, the periodic body (period E, size WQ) and a partial tail run."""
    return [SequenceGroup._make(row) for seg, lo, hi in md.segment_ranges() if bookie_id in seg.ensemble
            for row in _share_rows(md.ensemble_size, md.write_quorum, seg.ensemble.index(bookie_id), lo, hi)]


def _share_rows(e: int, wq: int, pos: int, lo: int, hi: int) -> list[Row]:
    """The groups ensemble position `pos` must hold of entries [lo, hi], as (first, last, size, period)."""
    if wq >= e:
        return [(lo, lo, hi - lo + 1, 0)]
    out: list[Row] = []
    # Runs of this position start at entries congruent to pos - WQ + 1 (mod E).
    phase = (pos - wq + 1) % e
    first_start = lo + (phase - lo) % e  # the first full-or-tail run starting at or after lo
    head_end = first_start - e + wq - 1  # the run that began before lo may reach into the segment
    if head_end >= lo:
        out.append((lo, lo, min(head_end, hi) - lo + 1, 0))
    if first_start > hi:
        return out
    last_start = first_start + (hi - first_start) // e * e
    full_last = last_start if last_start + wq - 1 <= hi else last_start - e
    if full_last >= first_start:
        out.append((first_start, full_last, wq, e if full_last > first_start else 0))
    if full_last != last_start:
        out.append((last_start, last_start, hi - last_start + 1, 0))
    return out


def _share_columns(e: np.ndarray, wq: np.ndarray, pos: np.ndarray, lo: np.ndarray,
                   hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_share_rows` over arrays: (n, 3, 4) rows (the head, body and tail runs that exist, in that
    order, then zeros) and how many rows each has."""
    whole = wq >= e
    phase = (pos - wq + 1) % e
    first_start = lo + (phase - lo) % e
    head_end = first_start - e + wq - 1
    last_start = first_start + (hi - first_start) // e * e
    full_last = np.where(last_start + wq - 1 <= hi, last_start, last_start - e)
    reaches = ~whole & (first_start <= hi)
    parts = (  # (present, row) of the whole run, the head, the body and the tail
        (whole, (lo, lo, hi - lo + 1, 0)),
        (~whole & (head_end >= lo), (lo, lo, np.minimum(head_end, hi) - lo + 1, 0)),
        (reaches & (full_last >= first_start),
         (first_start, full_last, wq, np.where(full_last > first_start, e, 0))),
        (reaches & (full_last != last_start), (last_start, last_start, hi - last_start + 1, 0)),
    )
    rows = np.zeros((e.size, 3, 4), dtype=np.int64)
    counts = np.zeros(e.size, dtype=np.int64)
    for present, row in parts:
        at = np.flatnonzero(present)
        rows[at, counts[at]] = np.stack(np.broadcast_arrays(*row), axis=1)[at]
        counts[at] += 1
    return rows, counts


# ---------------------------------------------------------------------------------------------
# Under-replication marks


def check_underreplication_age(marks: Iterable[UnderreplicationMark], grace_seconds: int,
                               now_ms: int) -> list[Violation]:
    """Marks whose age in whole seconds is greater than the grace period (0 = off); marks of open
    ledgers count too; marks without ctime cannot be aged."""
    if grace_seconds <= 0:
        return []
    out = []
    for mark in marks:
        age = mark.age_seconds(now_ms)
        if age is not None and age > grace_seconds:
            details = {"marked_at_ms": mark.ctime, "age_seconds": age, "grace_period_seconds": grace_seconds}
            out.append(Violation(Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD, mark.ledger_id, mark.replicas,
                                 details))
    return out


# ---------------------------------------------------------------------------------------------
# Deep scrub: the stored bytes of the copies


@dataclass(frozen=True, slots=True)
class DeepAnswer:
    """One bookie's deep scrub of one ledger: the entries whose stored bytes verified (with a short
    hash of each payload), and those that failed; `verified` None when it could not be done."""

    verified: np.ndarray | None = None
    payload_hashes: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    corrupt: tuple[tuple[int, str, str], ...] = ()  # (entry id, reason, detail)
    bytes_read: int = 0
    digest_checked: bool = True
    reason: str = ""  # why not verified


def in_deep_slice(ledger_id: int, slices: int, slice_: int) -> bool:
    """Is the ledger in this slice of a deep pass? Ids mixed first: consecutive ledgers spread evenly."""
    return slices <= 1 or (((ledger_id * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> 32) % slices == slice_


def id_ranges(ids: np.ndarray, limit: int = MAX_DETAIL_RANGES) -> list[list[int]]:
    """Sorted unique ids as [first, last] runs (at most `limit`)."""
    starts, sizes = runs_of(ids)
    return [[int(s), int(s + n - 1)] for s, n in zip(starts[:limit], sizes[:limit], strict=True)]


def check_deep(md: LedgerMetadata, deep: Mapping[str, DeepAnswer]) -> list[Violation]:
    """CORRUPT_ENTRY: copies whose stored bytes are not the entry; DIVERGENT_COPIES: verified copies of
    one entry whose payloads differ (copies may differ in their header, never in their payload)."""
    out: list[Violation] = []
    corrupt = {b: a.corrupt for b, a in sorted(deep.items()) if a.corrupt}
    if corrupt:
        copies = {}
        for b, bad in corrupt.items():
            ids = np.array(sorted(e for e, _, _ in bad), dtype=np.int64)
            copies[b] = {"entries": id_ranges(ids), "count": len(bad),
                         "reasons": dict(Counter(r for _, r, _ in bad)), "example": f"entry {bad[0][0]}: {bad[0][2]}"}
        out.append(Violation(Category.CORRUPT_ENTRY, md.ledger_id, tuple(corrupt), {"copies": copies},
                             md.znode_version))
    held = [(b, a.verified, a.payload_hashes) for b, a in sorted(deep.items())
            if a.verified is not None and a.verified.size]
    if len(held) >= 2:
        ids = np.concatenate([v for _, v, _ in held])
        hashes = np.concatenate([h for _, _, h in held])
        who = np.repeat(np.arange(len(held)), [v.size for _, v, _ in held])
        order = np.lexsort((hashes, ids))
        ids, hashes, who = ids[order], hashes[order], who[order]
        same_entry = ids[1:] == ids[:-1]
        differ = same_entry & (hashes[1:] != hashes[:-1])
        if differ.any():
            bad_ids = np.unique(ids[1:][differ])
            first = int(bad_ids[0])
            at = ids == first
            by_hash: dict[str, list[str]] = {}
            for h, w in zip(hashes[at], who[at], strict=True):
                by_hash.setdefault(f"{int(h):016x}", []).append(held[int(w)][0])
            bookies = sorted({held[int(w)][0] for w in who[np.isin(ids, bad_ids)]})
            out.append(Violation(Category.DIVERGENT_COPIES, md.ledger_id, tuple(bookies),
                                 {"entries": id_ranges(bad_ids), "count": int(bad_ids.size),
                                  "first_entry_copies": by_hash}, md.znode_version))
    return out


def without_corrupt(answer: BookieAnswer, deep: DeepAnswer | None) -> BookieAnswer:
    """What a bookie holds once its corrupt copies are not counted (a deep run's coverage)."""
    if deep is None or not deep.corrupt or answer.availability is None:
        return answer
    held = answer.availability.entry_ids(limit=max(answer.availability.count, 1))
    left = np.setdiff1d(held, np.array([e for e, _, _ in deep.corrupt], dtype=np.int64))
    return answer._replace(availability=Availability.of(groups_of(left)))
