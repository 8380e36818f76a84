"""The healthy majority of a range, checked a group at a time: pure.

A ledger whose every bookie holds exactly its share (`held_exactly_their_shares`), each of whose segments runs a
full turn of its ensemble, and that names no lost bookie, has checks that depend on where its bookies are, its
write quorum and its ack quorum alone: its placement, its durability policy, what a rack's loss would do to it; a
bookie's loss takes one copy of each of its entries. Those are worked out once per distinct shape (locations of each
segment's ensemble, WQ, AQ) and kept for the ranges that follow: a few hundred shapes on five racks, thousands on
twenty, most of them the same but for which racks (relabelled, they share the work). The bookies of every ledger of
a group are counted in bulk. A group with a finding goes back, ledger by ledger, to `classify`'s own path, which
stays the reference (a property test holds the two to the same result).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, compress
from typing import NamedTuple, TypeVar

import numpy as np

from scrutiny.checks import PlacementPolicy, blast_radius, check_durability_policy, check_placement
from scrutiny.metadata import DEFAULT_RACK, LedgerMetadata
from scrutiny.metadata.columns import PlainLedgers
from scrutiny.pulsar.owners import owner_from_custom_metadata
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.result import TOPIC_OWNERS, BlastTally

# (per segment, each ensemble member's location or None; WQ; AQ)
Shape = tuple[tuple[tuple[str | None, ...], ...], int, int]
Key = tuple[str, str]  # a blast radius key: ("bookie", id) or ("rack", name)


@dataclass(frozen=True)
class HealthyGroups:
    """The ledgers of a range checked as groups (`checked` of them), and the indices of the rest, in order."""

    checked: int
    rest: list[int]


def check_healthy(ctx: RunContext, mode: Pass, ledgers: Sequence[LedgerMetadata], held: Sequence[bool],
                  tally: BlastTally) -> HealthyGroups:
    """Check the ledgers held exactly as groups, their blast radius into `tally`; the others are left."""
    locate = ctx.locations.get
    registered = ctx.lost.registered if ctx.lost is not None else None
    groups: defaultdict[Shape, list[int]] = defaultdict(list)
    if len(held) != len(ledgers):
        raise ValueError(f"{len(held)} verdicts for {len(ledgers)} ledgers")
    rest = [i for i, h in enumerate(held) if not h]
    for i in compress(range(len(ledgers)), held):
        md = ledgers[i]
        segments, e = md.segments, md.ensemble_size
        # full turns: every write set of each ensemble occurs, so what a loss does is the ensembles' alone
        if len(segments) == 1:  # most ledgers
            full = md.last_entry_id - segments[0].first_entry_id >= e - 1 and len(md.bookies) == e
        else:  # an ensemble changed: each segment holds entries, a full turn of its own ensemble at least
            ranges = md.segment_ranges()
            full = len(ranges) == len(segments) and all(hi - lo + 1 >= e and len(set(seg.ensemble)) == e
                                                        for seg, lo, hi in ranges)
        if full and (registered is None or md.bookies <= registered):
            where = ((tuple(map(locate, segments[0].ensemble)),) if len(segments) == 1
                     else tuple([tuple(map(locate, seg.ensemble)) for seg in segments]))
            groups[where, md.write_quorum, md.ack_quorum].append(i)
        else:
            rest.append(i)
    checked = 0
    bulk = _Bulk(mode) if ctx.blast_radius else None
    memo = _shapes_of(ctx)
    for shape, members in groups.items():
        known = memo.shapes.get(shape) or memo.work_out(ctx, shape, ledgers[members[0]])
        if not known.clean:
            rest += members
            continue
        checked += len(members)
        if bulk is not None:
            bulk.group(known, [ledgers[i] for i in members])
    if bulk is not None:
        bulk.into(tally)
    rest.sort()  # a group with a finding joined the rest out of order
    return HealthyGroups(checked, rest)


def check_healthy_plain(ctx: RunContext, mode: Pass, plain: PlainLedgers, held: np.ndarray,
                        metadata_of: Callable[[int], LedgerMetadata], tally: BlastTally) -> np.ndarray:
    """`check_healthy` of plain ledgers (`scrutiny.metadata.columns`), from their columns, `held` their verdicts;
    `metadata_of(row)`: a row's `LedgerMetadata`, for a shape not worked out before. Returns the rows not checked."""
    e, members = plain.ensemble_size, plain.members
    full = held & (plain.last_entry_id >= e - 1)  # a full turn of the ensemble (a plain ledger's are distinct)
    if ctx.lost is not None:
        registered = ctx.lost.registered
        known_to = np.array([b in registered for b in plain.bookies] + [True])  # (the padding's -1: the last)
        full &= known_to[members].all(axis=1)
    rows = np.flatnonzero(full)
    if not rows.size:
        return np.flatnonzero(~full)
    locate = ctx.locations.get
    codes: dict[str | None, int] = {}
    code_of = np.array([codes.setdefault(locate(b), len(codes)) for b in plain.bookies] + [-1], dtype=np.int64)
    located = list(codes)
    shapes, first, which = _distinct_rows(np.column_stack([e[rows], plain.write_quorum[rows], plain.ack_quorum[rows],
                                                           code_of[members[rows]]]))
    memo = _shapes_of(ctx)
    knowns = []
    for j, (size, wq, aq, *where) in enumerate(shapes.tolist()):
        shape = ((tuple([located[c] for c in where[:size]]),), wq, aq)
        knowns.append(memo.shapes.get(shape) or memo.work_out(ctx, shape, metadata_of(int(rows[first[j]]))))
    clean = np.array([known.clean for known in knowns])[which]
    if ctx.blast_radius:
        _Bulk(mode).plain(plain, rows[clean], knowns, which[clean]).into(tally)
    full[rows[~clean]] = False
    return np.flatnonzero(~full)


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`np.unique(rows, axis=0)`'s distinct rows, the first of each, which each row is; each row made one number
    first where its values allow (a sort of numbers, not of rows: much the cheaper)."""
    shifted = rows - rows.min(initial=0)
    base = int(shifted.max(initial=0)) + 1
    if base ** rows.shape[1] < 1 << 62:
        _, first, which = np.unique(shifted @ (base ** np.arange(rows.shape[1] - 1, -1, -1, dtype=np.int64)),
                                    return_index=True, return_inverse=True)
        return rows[first], first, which
    distinct, first, which = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    return distinct, first, which.ravel()


def _shapes_of(ctx: RunContext) -> _Shapes:
    """What each shape shares under the run's placement policy, as far as worked out."""
    settings = ctx.settings
    policy = settings.placement() if ctx.placement else None
    memo = _MEMO.get(key := (policy, settings.min_write_quorum, settings.min_ack_quorum) if policy else None)
    if memo is None:
        memo = _MEMO[key] = _Shapes(policy is None or policy.kind in _RELABELLED)
    return memo


def _clean(ctx: RunContext, md: LedgerMetadata) -> bool:
    """Would the ledger, held exactly, have no finding of its own (as every ledger of its shape)?"""
    s = ctx.settings
    return not ctx.placement or (check_durability_policy(md, s.min_write_quorum, s.min_ack_quorum) is None
                                 and check_placement(md, s.placement(), ctx.locations) is None)


class _Shape(NamedTuple):
    """What every held ledger of a shape shares: no finding of its own (`clean`); the racks it depends on; those
    whose loss alone would leave an entry fewer copies than its ack quorum (`below`), or none (`without`); and
    whether a bookie's loss alone would (it takes one copy: WQ - 1 are left)."""

    clean: bool
    depend: tuple[Key, ...]
    below: tuple[Key, ...]
    without: tuple[Key, ...]
    bookie_below: bool
    bookie_without: bool


# A shape with its racks told apart only by where each first occurs (the default rack, or none, as -1).
Relabelled = tuple[tuple[tuple[int, ...], ...], int, int]
# Policies whose checks see only which bookies share a rack, and which are on the default one: the same
# relabelled shape, the same findings and losses, whichever racks. Zones and regions are read from the names.
_RELABELLED = ("rackaware", "none")


class _Shapes:
    """What each shape shares under one placement policy, worked out once for every range an executor checks: in
    a cluster of many racks a range has thousands of shapes, most of them seen before, or the same relabelled."""

    def __init__(self, relabel: bool) -> None:
        self.shapes: dict[Shape, _Shape] = {}
        self.relabel = relabel
        self.relabelled: dict[Relabelled, tuple[bool, tuple[tuple[int, int], ...]]] = {}

    def work_out(self, ctx: RunContext, shape: Shape, md: LedgerMetadata) -> _Shape:
        """`shape`'s, from `md`, one of its ledgers, or from a shape seen before with the same relabelled racks."""
        where, wq, aq = shape
        names: dict[str, int] = {}  # each rack by where it first occurs
        relabelled = (tuple([tuple([-1 if loc is None or loc == DEFAULT_RACK else names.setdefault(loc, len(names))
                                    for loc in seg]) for seg in where]), wq, aq) if self.relabel else None
        known = self.relabelled.get(relabelled) if relabelled is not None else None
        if known is None:
            clean = _clean(ctx, md)
            racks = [(name, left) for (scope, name), left in blast_radius(md, {}, ctx.locations, wq).items()
                     if scope == "rack"]
            if relabelled is not None:
                _keep(self.relabelled, relabelled, (clean, tuple((names.get(name, -1), left) for name, left in racks)))
        else:
            by_label = [*names, DEFAULT_RACK]  # -1: the default rack
            clean, racks = known[0], [(by_label[label], left) for label, left in known[1]]
        return _keep(self.shapes, shape, _Shape(
            clean, tuple(("rack", loc) for loc in dict.fromkeys(chain.from_iterable(where)) if loc is not None),
            tuple(("rack", name) for name, left in racks if left < aq),
            tuple(("rack", name) for name, left in racks if left <= 0), wq - 1 < aq, wq - 1 <= 0))


_K = TypeVar("_K")
_V = TypeVar("_V")


def _keep(memo: dict[_K, _V], key: _K, value: _V) -> _V:
    if len(memo) >= MOST_SHAPES:
        memo.clear()
    memo[key] = value
    return value


# Per placement policy: it names every setting that decides `clean` (None: placement not checked). A shape names
# the locations themselves, so a bookie moved to another rack is another shape.
_MEMO: dict[tuple[PlacementPolicy, int, int] | None, _Shapes] = {}
MOST_SHAPES = 100_000  # per policy, of each kind


def forget_shapes() -> None:
    """What every shape shares forgotten: the next range works it out again (a first range, measured)."""
    _MEMO.clear()


class _Bulk:
    """The blast radius of a range's groups, added up before it goes to the tally: in a cluster of many racks, a
    range has nearly as many shapes as ledgers, so a group costs little beyond counting its ledgers' bookies."""

    KINDS = ("depend", "below", "without")

    def __init__(self, mode: Pass) -> None:
        self.first = mode is Pass.FIRST
        # each bookie's ledgers; of them, those a bookie's loss leaves at their ack quorum, and those without a copy
        self.every: Counter[str] = Counter()
        self.kept: Counter[str] = Counter()
        self.without: Counter[str] = Counter()
        self.racks: dict[str, Counter[Key]] = {kind: Counter() for kind in self.KINDS}
        self.owned: list[tuple[tuple[tuple[str, bytes], ...], frozenset[str], _Shape]] = []  # (custom, bookies, ..)

    def group(self, known: _Shape, members: list[LedgerMetadata]) -> None:
        """A group's ledgers: each depends on its bookies and racks; a bookie's loss, and a rack's as `known`
        says, leaves each the same copies."""
        each = list(chain.from_iterable([md.bookies for md in members]))  # (a list a group: cheaper to count)
        self.every.update(each)
        if not known.bookie_below:
            self.kept.update(each)
        elif known.bookie_without:
            self.without.update(each)
        self._racks(known, len(members))
        self.owned += [(md.custom_metadata, md.bookies, known) for md in members if md.custom_metadata]

    def plain(self, plain: PlainLedgers, rows: np.ndarray, knowns: list[_Shape], which: np.ndarray) -> _Bulk:
        """The same of plain ledgers' `rows`, each of the shape `knowns[which]`, counted in columns."""
        members, names = plain.members[rows], plain.bookies
        below = np.array([known.bookie_below for known in knowns])[which]
        without = np.array([known.bookie_without for known in knowns])[which]
        for counter, of in ((self.every, members), (self.kept, members[~below]), (self.without,
                                                                                   members[below & without])):
            counts = np.bincount(of[of >= 0], minlength=len(names))
            counter.update({names[b]: int(counts[b]) for b in np.flatnonzero(counts).tolist()})
        for j, n in enumerate(np.bincount(which, minlength=len(knowns)).tolist()):
            if n:
                self._racks(knowns[j], n)
        owned = np.flatnonzero(plain.owner[rows] >= 0)
        if owned.size:
            ensembles, _, ensemble_of = _distinct_rows(members[owned])
            bookies = [frozenset(names[b] for b in ensemble if b >= 0) for ensemble in ensembles.tolist()]
            self.owned += [(plain.customs[c], bookies[x], knowns[w]) for c, x, w in zip(
                plain.owner[rows[owned]].tolist(), ensemble_of.tolist(), which[owned].tolist(), strict=True)]
        return self

    def _racks(self, known: _Shape, n: int) -> None:
        racks = self.racks
        if self.first:
            for key in known.depend:
                racks["depend"][key] += n
        for key in known.below:
            racks["below"][key] += n
        for key in known.without:
            racks["without"][key] += n

    def into(self, tally: BlastTally) -> None:
        by_custom: defaultdict[tuple[tuple[str, bytes], ...], list[tuple[frozenset[str], _Shape]]] = defaultdict(list)
        for custom, bookies, known in self.owned:
            by_custom[custom].append((bookies, known))
        owned: defaultdict[str, list[tuple[frozenset[str], _Shape]]] = defaultdict(list)  # a topic's ledgers
        for custom, of_ledgers in by_custom.items():
            owner = owner_from_custom_metadata(custom)
            if owner is not None and owner.kind in TOPIC_OWNERS:
                owned[owner.name] += of_ledgers
        topics: dict[str, defaultdict[Key, set[str]]] = {kind: defaultdict(set) for kind in self.KINDS}
        for topic, of_ledgers in owned.items():  # each topic's bookies and racks, then each one's topics
            shapes = {id(known): known for _, known in of_ledgers}.values()
            named = frozenset().union(*[bookies for bookies, _ in of_ledgers])
            below = frozenset().union(*[bookies for bookies, known in of_ledgers if known.bookie_below])
            without = frozenset().union(*[bookies for bookies, known in of_ledgers if known.bookie_without])
            kinds = [("depend", named, [known.depend for known in shapes])] if self.first else []
            kinds += [("below", below, [known.below for known in shapes]),
                      ("without", without, [known.without for known in shapes])]
            for kind, bookies, racks in kinds:
                of_kind = topics[kind]
                for b in bookies:
                    of_kind["bookie", b].add(topic)
                for key in set(chain.from_iterable(racks)):
                    of_kind[key].add(topic)
        every = self.every
        counted = {"depend": every if self.first else Counter(), "below": every - self.kept if self.kept else every,
                   "without": self.without}
        for kind in self.KINDS:
            tally.add(kind, {**{("bookie", b): n for b, n in counted[kind].items()}, **self.racks[kind]},
                      topics[kind])
