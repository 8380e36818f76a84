"""Which entries each bookie of a segment should hold (round robin), as residues: in a segment with ensemble
size E, entry e = k*E + r sits on ensemble positions (r + w) % E, w < WQ, whatever k is. A bookie's share
and what it holds become, per residue r, intervals of k, so a ledger of ten million entries costs what
one of ten does."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from scrutiny.codec import (
    INT32_MAX,
    Intervals,
    Row,
    SequenceGroup,
)
from scrutiny.metadata import (
    LedgerMetadata,
)


def expected_k(r: int, e: int, lo: int, hi: int) -> tuple[int, int]:
    return -((r - lo) // e), (hi - r) // e


def stored_ends(e: int, wq: int, pos: int, lo: int, hi: int) -> tuple[int, int] | None:
    """The first and the last entry of lo..hi that ensemble position `pos` stores (None: none), the two that
    BookKeeper's `LedgerChecker` reads of each bookie's share of a fragment at verification percentage 0."""
    residues = [r for r in range(e) if (pos - r) % e < wq]
    firsts = [f for r in residues if (f := lo + (r - lo) % e) <= hi]
    lasts = [x for r in residues if (x := hi - (hi - r) % e) >= lo]
    return (min(firsts), max(lasts)) if firsts else None


def in_intervals(entry: int, e: int, per_residue: Sequence[Intervals]) -> bool:
    """Is this entry among per-residue k-intervals (entry = k*E + r)?"""
    r = entry % e
    k = (entry - r) // e
    return any(k0 <= k <= k1 for k0, k1 in per_residue[r])


def sweep(per_position: Sequence[Intervals]) -> list[tuple[int, int, frozenset[int]]]:
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


def expected_share(md: LedgerMetadata, bookie_id: str) -> list[SequenceGroup]:
    """The groups a bookie must hold of a closed ledger, as BP-34's encoder groups them (`codec.groups_of`, what
    an agent sends): per segment a partial head run, the periodic body (period E, size WQ) and a partial tail run,
    regrouped across the segments (a bookie that keeps its position through an ensemble change holds one body)."""
    return [SequenceGroup._make(row) for row in expected_rows(md, bookie_id)]


def expected_rows(md: LedgerMetadata, bookie_id: str) -> list[Row]:
    """`expected_share` as (first, last, size, period) rows."""
    return spans_rows(md.ensemble_size, md.write_quorum, share_spans(md, bookie_id))


def share_spans(md: LedgerMetadata, bookie_id: str) -> list[tuple[int, int, int]]:
    """(position, first, last): the entries of the ledger a bookie takes part in, a span per position it keeps
    through the ensemble changes (one round robin across segments that touch)."""
    spans: list[list[int]] = []  # [position, first, last]
    for seg, lo, hi in md.segment_ranges():
        if bookie_id in seg.ensemble:
            pos = seg.ensemble.index(bookie_id)
            if spans and spans[-1][0] == pos and spans[-1][2] + 1 == lo:
                spans[-1][2] = hi  # kept its position through the change
            else:
                spans.append([pos, lo, hi])
    return [(pos, lo, hi) for pos, lo, hi in spans]


def spans_rows(e: int, wq: int, spans: Sequence[tuple[int, int, int]]) -> list[Row]:
    """The rows of a bookie's `share_spans`, regrouped across them."""
    rows = [row for pos, lo, hi in spans for row in share_rows(e, wq, pos, lo, hi)]
    return regrouped(rows) if len(spans) > 1 else rows


def regrouped(rows: Sequence[Row]) -> list[Row]:
    """Rows in entry order (each a train of runs: maximal, equally spaced, of one size) as BP-34's encoder groups
    the entries they list: runs that touch across two rows joined, then `codec.group_runs`'s greedy grouping, a
    train at a time rather than a run at a time."""
    trains: list[list[int]] = []  # [first run's start, runs, size, period (0: one run)]
    for first, last, size, period in rows:
        n = (last - first) // period + 1 if period else 1
        train = [first, n, size, period if n > 1 else 0]
        if trains and (before := trains[-1])[0] + (before[1] - 1) * before[3] + before[2] == first:
            # the last run before and this row's first run are one run
            joined = [before[0] + (before[1] - 1) * before[3], 1, before[2] + size, 0]
            before[1] -= 1
            if before[1] == 1:
                before[3] = 0
            elif not before[1]:
                trains.pop()
            trains.append(joined)
            if n == 1:
                continue
            train = [first + period, n - 1, size, period if n > 2 else 0]
        trains.append(train)
    out: list[Row] = []
    group: list[int] | None = None  # [first, last run's start, size, period (0: one run so far)]
    for start, n, size, period in trains:
        k = 0
        while k < n:
            at = start + k * period
            if (group is not None and group[2] == size and (gap := at - group[1]) <= INT32_MAX
                    and group[3] in (0, gap)):
                group[1], group[3] = at, gap
            else:
                if group is not None:
                    out.append((group[0], group[1], group[2], group[3]))
                group = [at, at, size, 0]
            k += 1
            if k < n and group[3] in (0, period) and period <= INT32_MAX:
                group[1], group[3] = start + (n - 1) * period, period  # the rest of the train at its period
                k = n
    if group is not None:
        out.append((group[0], group[1], group[2], group[3]))
    return out


def share_rows(e: int, wq: int, pos: int, lo: int, hi: int) -> list[Row]:
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
        if len(out) == 2 and out[0][2] == out[1][2]:  # a head and a tail alike, nothing between: one group
            return [(lo, last_start, out[0][2], last_start - lo)]
    return out


def share_columns(e: np.ndarray, wq: np.ndarray, pos: np.ndarray, lo: np.ndarray,
                   hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`share_rows` over arrays: (n, 3, 4) rows (the head, body and tail runs that exist, in that
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
    # a head and a tail alike, nothing between: one group (as share_rows)
    alike = np.flatnonzero((counts == 2) & (rows[:, 0, 2] == rows[:, 1, 2]))
    rows[alike, 0, 1] = rows[alike, 1, 0]
    rows[alike, 0, 3] = rows[alike, 1, 0] - rows[alike, 0, 0]
    rows[alike, 1] = 0
    counts[alike] = 1
    return rows, counts

