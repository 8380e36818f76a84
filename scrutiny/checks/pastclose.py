"""Entries past the close: copies above a closed ledger's lastEntryId on AQ or more bookies of their write
set (what a writer that went on after recovery closed the ledger could have been acknowledged for)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scrutiny.categories import Category
from scrutiny.checks.answers import BookieAnswer
from scrutiny.checks.shares import sweep
from scrutiny.checks.violation import Violation
from scrutiny.codec import (
    Intervals,
)
from scrutiny.metadata import (
    LedgerMetadata,
)


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
            for k0, k1, holding in sweep([held[(r + w) % e][r] for w in range(wq)]):
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

