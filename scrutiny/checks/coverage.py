"""Coverage: does every entry of a closed ledger have its copies on its write set? The least copies of any
entry classifies the ledger (no copy, below AQ, below WQ)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from scrutiny.categories import Category
from scrutiny.checks.answers import BookieAnswer, Outcome
from scrutiny.checks.shares import (
    expected_k,
    expected_share,
    in_intervals,
    share_columns,
    share_rows,
    share_spans,
    spans_rows,
    stored_ends,
    sweep,
)
from scrutiny.checks.violation import MAX_DETAIL_RANGES, Violation
from scrutiny.codec import (
    Intervals,
    Row,
    groups_from_residues,
    is_exact_encoding,
    leading_words,
    subtract,
)
from scrutiny.listedcolumns import Listed
from scrutiny.metadata import (
    LedgerMetadata,
)
from scrutiny.metadata.columns import PlainLedgers


@dataclass(frozen=True)
class CoverageResult:
    least_copies: int  # over every entry of the ledger, counting unknown bookies as holding theirs
    violation: Violation | None
    unavailable: frozenset[str]  # bookies whose copies are unknown (no answer)
    invalid: Mapping[str, str]  # bookie -> why its answer could not be used
    limbo: frozenset[str] = frozenset()  # bookies that do not know this ledger's state (copies unknown)


def each_holds_its_share(md: LedgerMetadata, answers: Mapping[str, BookieAnswer]) -> bool:
    """Did every bookie answer with exactly its expected share, as the same groups (an agent encodes a
    healthy share so)? Then every entry has its WQ copies."""
    ranges = md.segment_ranges()
    if len(md.segments) == 1 and ranges:  # most ledgers: each position's share straight from its index
        seg, lo, hi = ranges[0]
        e, wq = md.ensemble_size, md.write_quorum
        shares: Iterable[tuple[str, Sequence[Row]]] = (
            (b, share_rows(e, wq, pos, lo, hi)) for pos, b in enumerate(seg.ensemble))
    else:
        shares = ((b, expected_share(md, b)) for b in md.bookies)
    for b, share in shares:
        ans = answers.get(b)
        if ans is None or ans.outcome is not Outcome.ENTRIES or ans.availability is None \
                or not ans.availability.same_groups(share):
            return False
    return True


def held_exactly_their_shares(ledgers: Sequence[LedgerMetadata], columns: Mapping[str, Listed]) -> list[bool]:
    """Per ledger: did every bookie of this ledger answer with exactly the encoding of its expected share (as an
    agent encodes a healthy share)? Then every entry has its WQ copies. `columns`: each bookie's lists of entries,
    laid out as `joined` lays them out. All the ledgers at once and as words, so that a healthy answer is never
    decoded, nor even cut out of its columns. False is no verdict: the ledger is then checked alone
    (`check_coverage`)."""
    index: list[int] = []
    ledger_ids: list[int] = []
    shapes: list[tuple[int, int, int, int]] = []  # (E, WQ, first entry, last entry)
    ensembles: list[tuple[str, ...]] = []
    # of a ledger whose ensemble changed, a bookie that kept one position: (index, E, WQ, position, first, last)
    spans: list[tuple[int, int, int, int, int, int]] = []
    changed: list[tuple[int, list[Row]]] = []  # ... and one that did not: (index, its share)
    span_of: list[tuple[int, str]] = []  # (ledger, bookie) of each span
    changed_of: list[tuple[int, str]] = []  # ... and of each of those
    for i, md in enumerate(ledgers):
        ranges = md.segment_ranges()
        # (numpy's int64 would wrap on entry ids near 2**63: such a ledger is checked alone)
        if not ranges or md.last_entry_id >= 1 << 60:
            continue
        lid, e = md.ledger_id, md.ensemble_size
        if len(md.segments) == 1:  # most ledgers
            seg, lo, hi = ranges[0]
            if len(seg.ensemble) == e:
                ensembles.append(seg.ensemble)
                index.append(i)
                ledger_ids.append(lid)
                shapes.append((e, md.write_quorum, lo, hi))
        elif all(len(seg.ensemble) == e for seg in md.segments):
            for b in md.bookies:  # each bookie's share across the segments, as its agent encodes it
                kept = share_spans(md, b)
                if len(kept) == 1:  # one round robin (most bookies, a replaced one and its replacement too)
                    spans.append((i, e, md.write_quorum, *kept[0]))
                    span_of.append((lid, b))
                else:  # regrouped
                    changed.append((i, spans_rows(e, md.write_quorum, kept)))
                    changed_of.append((lid, b))
    healthy = np.zeros(len(ledgers), dtype=bool)
    short = []  # of the ledgers some bookie of which answered other than its share
    if index or spans:
        sizes, quorums, firsts, lasts = np.array(shapes, dtype=np.int64).reshape(-1, 4).T
        ledger = np.repeat(np.arange(len(index)), sizes)  # of each (ledger, position)
        pos = np.arange(ledger.size) - (np.cumsum(sizes) - sizes)[ledger]
        by_position = (np.asarray(index, dtype=np.int64)[ledger], sizes[ledger], quorums[ledger], pos, firsts[ledger],
                       lasts[ledger])
        where, *position = (np.concatenate(both) for both in zip(
            by_position, np.array(spans, dtype=np.int64).reshape(-1, 6).T, strict=True))
        rows, counts = share_columns(*position)
        healthy[where] = True
        # each position of each ledger, then each span
        leading, answered = _leading_words(columns, np.concatenate([
            np.repeat(np.asarray(ledger_ids, dtype=np.int64), sizes),
            np.fromiter((lid for lid, _ in span_of), np.int64, len(span_of))]),
            [*itertools.chain.from_iterable(ensembles), *(b for _, b in span_of)], rows.shape[1])
        short.append(where[~is_exact_encoding(leading, answered, rows, counts)])
    if changed:
        most = max(len(share) for _, share in changed)
        rows = np.zeros((len(changed), most, 4), dtype=np.int64)
        for j, (_, share) in enumerate(changed):
            if share:
                rows[j, :len(share)] = share
        counts = np.fromiter((len(share) for _, share in changed), np.int64, len(changed))
        where = np.fromiter((i for i, _ in changed), np.int64, len(changed))
        healthy[where] = True
        leading, answered = _leading_words(columns, np.fromiter((lid for lid, _ in changed_of), np.int64, len(changed)),
                                           [b for _, b in changed_of], most)
        short.append(where[~is_exact_encoding(leading, answered, rows, counts)])
    for ledgers_short in short:  # after every ledger's True: a changed ledger's bookies may be in both
        healthy[ledgers_short] = False
    return healthy.tolist()


def held_plain(plain: PlainLedgers, columns: Mapping[str, Listed]) -> np.ndarray:
    """`held_exactly_their_shares` of plain ledgers (`scrutiny.metadata.columns`), from their columns: one segment
    from entry 0, each ensemble position's share."""
    sizes = plain.ensemble_size
    ledger = np.repeat(np.arange(len(plain)), sizes)  # of each (ledger, position)
    pos = np.arange(ledger.size) - (np.cumsum(sizes) - sizes)[ledger]
    rows, counts = share_columns(sizes[ledger], plain.write_quorum[ledger], pos, np.zeros_like(pos),
                                 plain.last_entry_id[ledger])
    names = {b: n for n, b in enumerate(columns)}
    column_of = np.fromiter((names.get(b, len(names)) for b in plain.bookies), np.int64, len(plain.bookies))
    leading, answered = _leading_words_at(columns, plain.ledger_ids[ledger], column_of[plain.members[ledger, pos]],
                                          rows.shape[1])
    held = np.ones(len(plain), dtype=bool)
    held[ledger[~is_exact_encoding(leading, answered, rows, counts)]] = False
    return held


def _leading_words(columns: Mapping[str, Listed], ledger_ids: np.ndarray, bookies: Sequence[str], k: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The `leading_words` (k groups) and size (-1: none) of the answer of each (ledger, bookie), read where it
    lies in its bookie's columns."""
    names = {b: n for n, b in enumerate(columns)}
    return _leading_words_at(columns, ledger_ids, np.fromiter(map(names.get, bookies, itertools.repeat(len(names))),
                                                              np.int64, len(bookies)), k)


def _leading_words_at(columns: Mapping[str, Listed], ledger_ids: np.ndarray, of: np.ndarray, k: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The same, each pair's bookie named by its place in `columns` (len(columns): it did not answer); a bookie's
    pairs are looked up together."""
    small = np.int16 if len(columns) < 1 << 15 else np.int32  # (numpy sorts 16-bit ints stably by radix)
    of = of.astype(small)
    order = np.argsort(of, kind="stable")
    bounds = np.searchsorted(of[order], np.arange(len(columns) + 1)).tolist()
    leading = np.zeros((of.size, 1 + 3 * k), dtype=np.uint64)
    sizes = np.full(of.size, -1, dtype=np.int64)
    for n, listed in enumerate(columns.values()):
        asked, ids = order[bounds[n]:bounds[n + 1]], listed.ledger_ids
        if asked.size and ids.size:
            wanted = ledger_ids[asked]
            at = np.minimum(np.searchsorted(ids, wanted), ids.size - 1)
            found = ids[at] == wanted
            at, asked = at[found], asked[found]
            leading[asked] = leading_words(listed.data, listed.starts[at], k)
            sizes[asked] = listed.sizes[at]
    return leading, sizes


NO_ENTRIES: Mapping[str, Collection[int]] = MappingProxyType({})


@functools.cache
def healthy_coverage(wq: int) -> CoverageResult:
    """A healthy ledger's result: one immutable value shared by all of them."""
    return CoverageResult(wq, None, frozenset(), MappingProxyType({}))


def check_coverage(md: LedgerMetadata, answers: Mapping[str, BookieAnswer],
                   looks_held: Mapping[str, Collection[int]] = NO_ENTRIES) -> CoverageResult:
    """The replicas check of a closed ledger. A bookie without an entry in `answers`, or whose answer
    is unavailable, invalid or in limbo, is unknown: its copies are neither counted missing nor present.
    `looks_held`: per bookie, entries not counted as copies that BookKeeper's checker would read back all the
    same (a deep run's copies whose digest fails: the bookie serves them)."""
    e, wq, aq = md.ensemble_size, md.write_quorum, md.ack_quorum
    if each_holds_its_share(md, answers):  # the common case, without the residue arithmetic
        return healthy_coverage(wq)
    least = wq
    unavailable: set[str] = set()
    limbo: set[str] = set()
    invalid: dict[str, str] = {}
    # (missing bookies, copies) -> per-residue k-intervals, per segment (for the details)
    findings: list[tuple[frozenset[str], int, list[Intervals]]] = []
    shares_lacking: list[dict[str, Any]] = []  # per bookie and fragment: what BookKeeper's checker would see
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
                subtract([expected_k(r, e, lo, hi)], held[r]) if (pos - r) % e < wq else []
                for r in range(e)
            ])
        shares_lacking += lacking_shares(seg.ensemble, missing, e, wq, lo, hi, looks_held)
        by_kind: dict[tuple[frozenset[str], int], list[Intervals]] = {}
        for r in range(e):
            positions = [(r + w) % e for w in range(wq)]
            for k0, k1, gone in sweep([missing[p][r] for p in positions]):
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
        details["shares_lacking"] = shares_lacking[:MAX_DETAIL_RANGES]
        if unavailable or invalid or limbo:
            details["unknown_bookies"] = sorted(unavailable | set(invalid) | limbo)
        violation = Violation(category, md.ledger_id, tuple(bookies), details, md.znode_version)
    return CoverageResult(least, violation, frozenset(unavailable), invalid, frozenset(limbo))


def lacking_shares(ensemble: Sequence[str], missing: list[list[Intervals]], e: int, wq: int, lo: int,
                   hi: int, looks_held: Mapping[str, Collection[int]] = NO_ENTRIES) -> list[dict[str, Any]]:
    """Each bookie of a fragment (entries lo..hi) that lacks some of its share: how many entries, and whether
    it lacks the first or the last one it should store, the only two BookKeeper's `LedgerChecker` reads at
    its default verification percentage (0); and how many of those it lacks the checker would read back all
    the same (`looks_held`: never a lacking end)."""
    out = []
    for pos, b in enumerate(ensemble):
        lacking = sum(k1 - k0 + 1 for ivs in missing[pos] for k0, k1 in ivs)
        ends = stored_ends(e, wq, pos, lo, hi)
        if lacking and ends is not None:
            served = [x for x in looks_held.get(b, ()) if lo <= x <= hi and in_intervals(x, e, missing[pos])]
            share = {"bookie": b, "first_entry": lo, "last_entry": hi, "entries_lacking": lacking,
                     "checker_reads": list(ends),
                     "lacking_ends": [x for x in dict.fromkeys(ends)
                                      if in_intervals(x, e, missing[pos]) and x not in served]}
            out.append({**share, "looks_held": len(served)} if served else share)
    return out


def coverage_category(least: int, aq: int, wq: int) -> Category | None:
    if least <= 0:
        return Category.NO_REPLICA_OF_AN_ENTRY
    if least < aq:
        return Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY
    if least < wq:
        return Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY
    return None

