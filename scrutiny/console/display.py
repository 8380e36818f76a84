"""What the operator's console shows, computed from plain data (pure: `scrutiny.console.web` serves it
and the templates draw it): the verdict, the bookies and their states, a ledger's copies as entry
ranges, the history chart's geometry, and an unavailability in words."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scrutiny.auditor.face import RunPoint
from scrutiny.categories import SEVERITIES, Category, in_words, plural, severity_of, worst_first
from scrutiny.checks import BookieAnswer, Outcome, Violation, expected_share
from scrutiny.codec import Availability, CodecError
from scrutiny.metadata import LedgerMetadata
from scrutiny.times import iso


@dataclass(frozen=True)
class Verdict:
    level: str  # HEALTH_OK | HEALTH_WARN | HEALTH_ERR | UNKNOWN
    words: str
    by_severity: dict[str, int]  # ledgers per severity (a ledger counted once per category)


def verdict(found: Iterable[Violation], checked: bool, complete: bool = True) -> Verdict:
    """Is acknowledged data at risk right now? `checked`: a complete whole-cluster run stands behind it."""
    by = Counter(severity_of(v.category, v.details) for v in found)
    counts = {s: by.get(s, 0) for s in SEVERITIES}
    if counts["critical"]:
        its = "its" if counts["critical"] == 1 else "their"
        return Verdict("HEALTH_ERR", f"acknowledged data at risk now: {plural(counts['critical'], 'ledger')} "
                       f"below {its} ack quorum, without a copy, with a corrupt copy, or needed by a topic and gone",
                       counts)
    if not checked:
        return Verdict("UNKNOWN", "no complete full run yet: nothing is known about the ledgers", counts)
    if counts["error"] or counts["warning"]:
        return Verdict("HEALTH_WARN", "no acknowledged data known at risk; "
                       f"{plural(counts['error'] + counts['warning'], 'finding')} to look at", counts)
    if not complete:
        return Verdict("HEALTH_WARN", "the last run was incomplete: some ledgers were not checked", counts)
    return Verdict("HEALTH_OK", "every closed ledger checked has its copies; nothing to look at", counts)


# -- the bookies ----------------------------------------------------------------------------------

STATES = ("down", "unregistered", "slow", "answering", "not asked")  # worst first


@dataclass
class BookieRow:
    bookie: str
    state: str = "not asked"
    why: str = ""
    rack: str = ""
    registered: str = "no"  # writable | read-only | no
    last_reached: str = ""
    ledgers: int | None = None  # closed ledgers checked whose ensembles name it (the last full run)
    topics: int | None = None
    below_aq_if_down: int | None = None
    findings: Counter[str] = field(default_factory=Counter)
    orphans: int = 0
    orphan_bytes: int = 0


def bookie_rows(registered: Mapping[str, str], racks: Mapping[str, str],
                depends: Mapping[str, Mapping[str, int]] | None, found: Iterable[Violation],
                feeds: Mapping[str, str], run_finished_at: str) -> list[BookieRow]:
    """Every registered bookie and every bookie the ledgers name, with its state: down (silent at every
    look, or its agent's feed is down now), slow (up, but not answering in time), unregistered (named by
    ledgers, registered nowhere), answering. `registered`: bookie -> writable | read-only; `depends`: the
    last full run's blast radius per bookie (what depends on it; None: not computed)."""
    rows: dict[str, BookieRow] = {}

    def row(b: str) -> BookieRow:
        if b not in rows:
            rows[b] = BookieRow(b, rack=racks.get(b, ""), registered=registered.get(b, "no"))
        return rows[b]

    for b in registered:
        row(b)
    for b, fig in (depends or {}).items():
        r = row(b)
        r.ledgers, r.topics = fig.get("ledgers", 0), fig.get("topics", 0)
        r.below_aq_if_down = fig.get("ledgers_below_aq", 0)
    silence: dict[str, tuple[str, str]] = {}
    for v in found:
        for b in v.bookies:
            row(b).findings[str(v.category)] += 1
        if v.category is Category.BOOKIE_UNAVAILABLE:
            for b, how in v.details.get("silence", {}).items():
                if how == "down" or b not in silence:
                    silence[b] = (how, in_words(str(v.details.get("reasons", {}).get(b, ""))))
        elif v.category is Category.ORPHAN_LEDGER:
            for b, held in v.details.get("held_by", {}).items():
                row(b).orphans += 1
                row(b).orphan_bytes += int(held.get("bytes", 0))
        elif v.category is Category.LOST_BOOKIE_RECOVERY_NOT_STARTED:
            for b in v.details.get("lost_bookies", ()):
                row(b).findings[str(v.category)] += 1
    for b, r in rows.items():
        feed = feeds.get(f"agent {b}")
        if r.registered == "no" and (r.ledgers or r.findings):
            r.state, r.why = "unregistered", "named by ledgers, registered nowhere: its copies count as gone"
        elif b in silence:
            r.state, r.why = ("slow" if silence[b][0] == "slow" else "down"), silence[b][1]
        elif feed == "down":
            r.state, r.why = "down", "its agent's change feed is down now"
        elif feed == "up" or r.ledgers is not None:
            r.state = "answering"
        if feed == "up":
            r.last_reached = "now (its change feed is up)"
        elif r.state == "answering" and run_finished_at:
            r.last_reached = f"at the last full run ({run_finished_at})"
    return sorted(rows.values(), key=lambda r: (STATES.index(r.state), r.rack, r.bookie))


# -- a ledger's copies ----------------------------------------------------------------------------------


RANGES_LISTED = 200  # of each kind per copy; the bars show the whole segment
BUCKETS = 400  # the bars' resolution: a striped copy of a million entries is 400 bars, not 333,333


@dataclass(frozen=True)
class Copy:
    """What one bookie of one segment holds of the entries the segment gives it, as ranges."""

    bookie: str
    expected: int
    held: list[tuple[int, int]]  # entry ranges it holds within the segment (the first RANGES_LISTED)
    missing: list[tuple[int, int]]  # entry ranges it should hold and does not (the first RANGES_LISTED)
    answer: str  # entries | no such ledger | unavailable: why | ...
    bars: list[tuple[int, int, str]] = field(default_factory=list)  # (first, last, held | missing): to draw
    lacking: int = 0  # entries it should hold and does not


@dataclass(frozen=True)
class SegmentView:
    first_entry_id: int
    last_entry_id: int  # of this segment (-1: expects nothing)
    ensemble: tuple[str, ...]
    copies: list[Copy]


def ranges(ids: np.ndarray) -> list[tuple[int, int]]:
    """Sorted entry ids as [first, last] runs of consecutive ids."""
    if ids.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1)
    starts = np.concatenate(([ids[0]], ids[breaks + 1]))
    ends = np.concatenate((ids[breaks], [ids[-1]]))
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


DRAWN_ENTRIES = 2_000_000  # a bigger copy is told in counts, not drawn


def copies(md: LedgerMetadata, answers: Mapping[str, BookieAnswer | None],
           registered: Collection[str]) -> list[SegmentView]:
    """Per segment and bookie: what the metadata says it holds, what it said it holds (`answers`:
    bookie -> its answer, None when not asked). A bookie registered nowhere whose agent does not answer holds
    nothing, as the runs count it (BP-34: gone from the cluster, its copies are gone)."""
    out = []
    for seg, first, last in md.segment_ranges():
        views = []
        for b in seg.ensemble:
            a = answers.get(b)
            try:
                want = Availability.of(expected_share(md, b)).entry_ids(DRAWN_ENTRIES)
                want = want[(want >= first) & (want <= last)]
                if a is None:
                    views.append(Copy(b, int(want.size), [], [], "not asked"))
                elif a.outcome is Outcome.ENTRIES and a.availability is not None:
                    have = a.availability.entry_ids(DRAWN_ENTRIES)
                    views.append(_copy(b, want, have[(have >= first) & (have <= last)], first, last, "entries"))
                elif a.outcome is Outcome.NO_LEDGER:
                    views.append(_copy(b, want, np.empty(0, np.int64), first, last, "it holds no such ledger"))
                elif b not in registered:
                    views.append(_copy(b, want, np.empty(0, np.int64), first, last, "registered nowhere and its "
                                       f"agent not answering ({in_words(a.reason)}): its copies count as gone"))
                else:
                    views.append(Copy(b, int(want.size), [], [], f"{a.outcome}: {in_words(a.reason)}"))
            except CodecError as exc:
                views.append(Copy(b, -1, [], [], f"too large to draw here ({exc}); the report has its ranges"))
        out.append(SegmentView(first, last, seg.ensemble, views))
    return out


def _copy(bookie: str, want: np.ndarray, have: np.ndarray, first: int, last: int, answer: str) -> Copy:
    lacks = np.setdiff1d(want, have)
    return Copy(bookie, int(want.size), ranges(have)[:RANGES_LISTED], ranges(lacks)[:RANGES_LISTED], answer,
                bars(have, lacks, first, last), int(lacks.size))


def bars(have: np.ndarray, lacks: np.ndarray, first: int, last: int) -> list[tuple[int, int, str]]:
    """The segment cut into at most BUCKETS spans: each red where an entry is lacking, green where all it
    should hold is held; consecutive spans of a colour merged."""
    span = last - first + 1
    n = min(BUCKETS, span)
    state = np.zeros(n, np.int8)  # 0 nothing expected, 1 held, 2 lacking
    state[np.unique((have - first) * n // span)] = 1
    state[np.unique((lacks - first) * n // span)] = 2
    out: list[tuple[int, int, str]] = []
    for i, st in enumerate(state.tolist()):
        lo, hi = first + i * span // n, first + (i + 1) * span // n - 1
        if st and out and out[-1][2] == ("held", "missing")[st - 1] and out[-1][1] == lo - 1:
            out[-1] = (out[-1][0], hi, out[-1][2])
        elif st:
            out.append((lo, hi, ("held", "missing")[st - 1]))
    return out


# -- the history chart ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    series: list[tuple[str, str]]  # (categories with these counts, SVG polyline points)
    most: int
    first: str
    last: str  # "" when there is one run
    runs: int


CHART_W, CHART_H, PAD = 640, 160, 30


WHOLE_RUNS = ("full", "rescan")  # every ledger, every check: comparable points


def chart(points: Sequence[RunPoint]) -> Chart | None:
    """Findings per category over the whole-cluster runs, oldest left (one run: in the middle); None before
    the first. Categories with the same counts at every run are one line (one would hide the other)."""
    runs = [p for p in points if p.kind in WHOLE_RUNS]
    if not runs:
        return None
    shown = [c for c in worst_first() if any(p.counts.get(c) for p in runs)]
    most = max([1, *(p.counts.get(c, 0) for p in runs for c in shown)])
    step = (CHART_W - 2 * PAD) / max(1, len(runs) - 1)
    left = PAD if len(runs) > 1 else CHART_W / 2
    lines: dict[tuple[int, ...], list[str]] = {}
    for c in shown:
        lines.setdefault(tuple(p.counts.get(c, 0) for p in runs), []).append(str(c))
    series = []
    for counts, categories in lines.items():
        xy = [(left + i * step, CHART_H - PAD - (CHART_H - 2 * PAD) * n / most) for i, n in enumerate(counts)]
        series.append((", ".join(categories), " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)))
    return Chart(CHART_W, CHART_H, series, most, iso(runs[0].finished_ms),
                 iso(runs[-1].finished_ms) if len(runs) > 1 else "", len(runs))
