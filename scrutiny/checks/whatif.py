"""What would be were some bookies down: a ledger's coverage without them (what-if), and what one bookie or
rack going down alone would do to each ledger (the blast radius)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from scrutiny.categories import Category
from scrutiny.checks.answers import NO_LEDGER, BookieAnswer
from scrutiny.checks.coverage import CoverageResult, check_coverage
from scrutiny.metadata import (
    DEFAULT_RACK,
    LedgerMetadata,
)


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


WOULD_HAVE = {Category.NO_REPLICA_OF_AN_ENTRY: Category.WOULD_HAVE_NO_REPLICA_OF_AN_ENTRY,
              Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY: Category.WOULD_HAVE_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY,
              Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY: Category.WOULD_HAVE_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY}

