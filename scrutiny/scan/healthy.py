"""The healthy majority of a range, checked a group at a time: pure.

A ledger whose every bookie holds exactly its share (`held_exactly_their_shares`), each of whose segments runs a
full turn of its ensemble, and that names no lost bookie, has checks that depend on where its bookies are, its
write quorum and its ack quorum alone: its placement, its durability policy, what a rack's loss would do to it; a
bookie's loss takes one copy of each of its entries. Those are worked out once per distinct shape (locations of each
segment's ensemble, WQ, AQ) and kept for the ranges that follow: a few hundred shapes on five racks, thousands on
twenty. The bookies of every ledger of a group are counted in bulk. A group with a finding goes back, ledger by
ledger, to `classify`'s own path, which stays the reference (a property test holds the two to the same result).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress
from typing import NamedTuple

from scrutiny.checks import PlacementPolicy, blast_radius, check_durability_policy, check_placement
from scrutiny.metadata import LedgerMetadata
from scrutiny.pulsar.owners import Owner, owner_from_custom_metadata
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
    bulk = _Bulk()
    settings = ctx.settings
    shapes = _SHAPES.setdefault(
        (settings.placement(), settings.min_write_quorum, settings.min_ack_quorum) if ctx.placement else None, {})
    for shape, members in groups.items():
        md = ledgers[members[0]]
        known = shapes.get(shape)
        if known is None:
            if len(shapes) >= MOST_SHAPES:
                shapes.clear()
            least = blast_radius(md, {}, ctx.locations, md.write_quorum)
            known = shapes[shape] = _Shape(
                _clean(ctx, md), tuple((key, left) for key, left in least.items() if key[0] == "rack"))
        if not known.clean:
            rest += members
            continue
        checked += len(members)
        if ctx.blast_radius:
            bulk.group(mode, shape, known.racks, [ledgers[i] for i in members])
    if ctx.blast_radius:
        bulk.into(tally)
    rest.sort()  # a group with a finding joined the rest out of order
    return HealthyGroups(checked, rest)


def _clean(ctx: RunContext, md: LedgerMetadata) -> bool:
    """Would the ledger, held exactly, have no finding of its own (as every ledger of its shape)?"""
    s = ctx.settings
    return not ctx.placement or (check_durability_policy(md, s.min_write_quorum, s.min_ack_quorum) is None
                                 and check_placement(md, s.placement(), ctx.locations) is None)


class _Shape(NamedTuple):
    """What every held ledger of a shape shares: no finding of its own (`clean`), and each rack's loss leaves."""

    clean: bool
    racks: tuple[tuple[Key, int], ...]


# Worked out once per placement policy and shape, for every range an executor checks: the same few thousand
# shapes recur in every range. A shape names the locations themselves, so a bookie moved to another rack is
# another shape; the policy names every setting that decides `clean` (None: placement not checked).
_SHAPES: dict[tuple[PlacementPolicy, int, int] | None, dict[Shape, _Shape]] = {}
MOST_SHAPES = 100_000  # per policy


def forget_shapes() -> None:
    """What every shape shares forgotten: the next range works it out again (a first range, measured)."""
    _SHAPES.clear()


class _Bulk:
    """The blast radius of a range's groups, added up before it goes to the tally (once per kind, not three times
    per group: in a cluster of many racks, a range has nearly as many shapes as ledgers)."""

    KINDS = ("depend", "below", "without")

    def __init__(self) -> None:
        self.bookies: dict[str, Counter[str]] = {kind: Counter() for kind in self.KINDS}
        self.racks: dict[str, Counter[Key]] = {kind: Counter() for kind in self.KINDS}
        self.topics: dict[str, defaultdict[Key, set[str]]] = {kind: defaultdict(set) for kind in self.KINDS}
        self.owners: dict[tuple[tuple[str, bytes], ...], Owner | None] = {}

    def group(self, mode: Pass, shape: Shape, racks: tuple[tuple[Key, int], ...], group: list[LedgerMetadata]) -> None:
        """One group's: each bookie's and rack's ledgers and topics, and those a loss would take below their ack
        quorum or without a copy (the same for every ledger of the group: a bookie's loss takes one copy, a
        rack's as `racks` says)."""
        where, wq, aq = shape
        bookie_left = wq - 1
        kinds = [("depend", True, [("rack", loc) for loc in dict.fromkeys(chain.from_iterable(where))
                                   if loc is not None])] if mode is Pass.FIRST else []
        kinds += [("below", bookie_left < aq, [key for key, left in racks if left < aq]),
                  ("without", bookie_left <= 0, [key for key, left in racks if left <= 0])]
        by_custom: defaultdict[tuple[tuple[str, bytes], ...], list[frozenset[str]]] = defaultdict(list)
        for md in group:  # the bookies of each owner's ledgers
            by_custom[md.custom_metadata].append(md.bookies)
        by_topic: defaultdict[str, set[str]] = defaultdict(set)
        for custom, of_ledgers in by_custom.items():
            each = list(chain.from_iterable(of_ledgers))
            for kind, with_bookies, _ in kinds:
                if with_bookies:
                    self.bookies[kind].update(each)
            owner = (self.owners[custom] if custom in self.owners
                     else self.owners.setdefault(custom, owner_from_custom_metadata(custom)))
            if owner is not None and owner.kind in TOPIC_OWNERS:
                by_topic[owner.name].update(each)
        for kind, with_bookies, rack_keys in kinds:
            topics = self.topics[kind]
            for topic, named in by_topic.items() if with_bookies else ():
                for b in named:
                    topics["bookie", b].add(topic)
            for key in rack_keys:
                self.racks[kind][key] += len(group)
                topics[key].update(by_topic)

    def into(self, tally: BlastTally) -> None:
        for kind in self.KINDS:
            tally.add(kind, {**{("bookie", b): n for b, n in self.bookies[kind].items()}, **self.racks[kind]},
                      self.topics[kind])
