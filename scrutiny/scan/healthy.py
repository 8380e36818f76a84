"""The healthy majority of a range, checked a group at a time: pure.

A ledger whose every bookie holds exactly its share (`held_exactly_their_shares`), each of whose segments runs a
full turn of its ensemble, and that names no lost bookie, has checks that depend on where its bookies are, its
write quorum and its ack quorum alone: its placement, its durability policy, what a rack's loss would do to it; a
bookie's loss takes one copy of each of its entries. Those are worked out once per distinct (locations of each
segment's ensemble, WQ, AQ), a few hundred in a cluster of millions of ledgers, and the bookies of every ledger of
a group are counted in bulk. A group with a finding goes back, ledger by ledger, to `classify`'s own path, which
stays the reference (a property test holds the two to the same result).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress

from scrutiny.checks import blast_radius, check_durability_policy, check_placement
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
            groups[tuple(tuple(map(locate, seg.ensemble)) for seg in segments), md.write_quorum, md.ack_quorum
                   ].append(i)
        else:
            rest.append(i)
    checked = 0
    owners: dict[tuple[tuple[str, bytes], ...], Owner | None] = {}
    for (where, _, _), members in groups.items():
        md = ledgers[members[0]]
        if not _clean(ctx, md):
            rest += members
            continue
        checked += len(members)
        if ctx.blast_radius:
            _tally(ctx, mode, where, [ledgers[i] for i in members], owners, tally)
    rest.sort()  # a group with a finding joined the rest out of order
    return HealthyGroups(checked, rest)


def _clean(ctx: RunContext, md: LedgerMetadata) -> bool:
    """Would the ledger, held exactly, have no finding of its own (as every ledger of its shape)?"""
    s = ctx.settings
    return not ctx.placement or (check_durability_policy(md, s.min_write_quorum, s.min_ack_quorum) is None
                                 and check_placement(md, s.placement(), ctx.locations) is None)


def _tally(ctx: RunContext, mode: Pass, where: tuple[tuple[str | None, ...], ...], group: list[LedgerMetadata],
           owners: dict[tuple[tuple[str, bytes], ...], Owner | None], tally: BlastTally) -> None:
    """One group's blast radius: each bookie's and rack's ledgers and topics, and those a loss would take below
    their ack quorum or without a copy (the same for every ledger of the group: `blast_radius` of one)."""
    first = group[0]
    least = blast_radius(first, {}, ctx.locations, first.write_quorum)
    bookie_left = least["bookie", first.segments[0].ensemble[0]]
    racks = {key: left for key, left in least.items() if key[0] == "rack"}
    by_custom: defaultdict[tuple[tuple[str, bytes], ...], list[frozenset[str]]] = defaultdict(list)
    for md in group:  # the bookies of each owner's ledgers
        by_custom[md.custom_metadata].append(md.bookies)
    bookies: Counter[str] = Counter()
    by_topic: dict[str, set[str]] = {}
    for custom, of_ledgers in by_custom.items():
        each = list(chain.from_iterable(of_ledgers))
        bookies.update(each)
        owner = owners[custom] if custom in owners else owners.setdefault(custom, owner_from_custom_metadata(custom))
        if owner is not None and owner.kind in TOPIC_OWNERS:
            by_topic.setdefault(owner.name, set()).update(each)
    topics = set(by_topic)
    bookie_topics: dict[Key, set[str]] = {}
    for topic, named in by_topic.items():
        for b in named:
            bookie_topics.setdefault(("bookie", b), set()).add(topic)
    per_bookie = {("bookie", b): n for b, n in bookies.items()}

    def add(kind: str, with_bookies: bool, rack_keys: list[Key]) -> None:
        rack_counts = dict.fromkeys(rack_keys, len(group))
        tally.add(kind, {**per_bookie, **rack_counts} if with_bookies else rack_counts,
                  {**(bookie_topics if with_bookies else {}), **dict.fromkeys(rack_keys, topics)})

    if mode is Pass.FIRST:
        add("depend", True, [("rack", loc) for loc in dict.fromkeys(chain.from_iterable(where)) if loc is not None])
    add("below", bookie_left < first.ack_quorum, [key for key, left in racks.items() if left < first.ack_quorum])
    add("without", bookie_left <= 0, [key for key, left in racks.items() if left <= 0])
