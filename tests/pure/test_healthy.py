"""The healthy majority checked a group at a time (`check_healthy`) against each ledger checked alone."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrutiny.checks import BookieAnswers, expected_share, held_exactly_their_shares
from scrutiny.codec import Availability, encode, encode_groups
from scrutiny.config import ScanSettings
from scrutiny.lostbookies import LostBookies
from scrutiny.metadata import DEFAULT_RACK, LedgerMetadata, LedgerState, Segment
from scrutiny.scan.classify import classify
from scrutiny.scan.context import Pass, RunContext, Silences
from scrutiny.scan.healthy import check_healthy, forget_shapes
from scrutiny.scan.result import BlastTally

B = [f"b{i}:3181" for i in range(9)]
URI = "zk+hierarchical://127.0.0.1:2181/ledgers"
OWNERS = ((), (("application", b"pulsar"), ("component", b"managed-ledger"), ("pulsar/managed-ledger", b"t/a")),
          (("application", b"pulsar"), ("component", b"managed-ledger"), ("pulsar/managed-ledger", b"t/b"),
           ("pulsar/cursor", b"sub")),
          (("application", b"pulsar"), ("component", b"schema"), ("pulsar/schemaId", b"t/a")),
          (("application", b"pulsar"), ("component", b"compacted-ledger"), ("pulsar/compactedTopic", b"t/c")))


def cluster(rng: random.Random, count: int) -> tuple[list[LedgerMetadata], dict[str, BookieAnswers]]:
    """Ledgers on a few ensembles (so that groups form), most held exactly, some short, some of two or three
    segments (on the same few ensembles, often a full turn each), some with a bookie's share short."""
    pool = []
    for _ in range(rng.randint(1, 6)):
        e = rng.randint(1, 5)
        wq = rng.randint(1, e)
        pool.append((tuple(rng.sample(B, e)), wq, rng.randint(1, wq)))
    mds: list[LedgerMetadata] = []
    answers: dict[str, BookieAnswers] = {}
    for lid in range(count):
        ensemble, wq, aq = rng.choice(pool)
        e = len(ensemble)
        last = rng.choice((e - 1, e, 3 * e, rng.randint(0, 200), 0))
        segments = [Segment(0, ensemble)]
        alike = [ens for ens, _, _ in pool if len(ens) == e]
        while rng.random() < 0.2 and last > segments[-1].first_entry_id + 1:
            first = segments[-1].first_entry_id
            at = rng.choice((first + e, rng.randint(first + 1, last)))
            if at <= last:
                segments.append(Segment(at, rng.choice(alike) if rng.random() < 0.7 else tuple(rng.sample(B, e))))
        md = LedgerMetadata(lid, LedgerState.CLOSED, e, wq, aq, last, 0, tuple(segments),
                            custom_metadata=rng.choice(OWNERS))
        mds.append(md)
        for b in md.bookies:
            share = expected_share(md, b)
            got = answers.setdefault(b, BookieAnswers(b))
            if rng.random() < 0.05:
                ids = Availability.of(share).entry_ids()
                got.encoded[lid] = encode(ids[ids % 3 != 1])  # short of its share
            elif rng.random() > 0.02:
                got.encoded[lid] = encode_groups(share)
    return mds, answers


def context(rng: random.Random, mds: list[LedgerMetadata]) -> RunContext:
    racks = {b: f"/r{i % rng.randint(1, 4)}" for i, b in enumerate(B) if rng.random() < 0.9}
    kind = rng.choice(("rackaware", "rackaware", "none", "regionaware", "zoneaware"))
    if kind == "zoneaware":
        racks = {b: f"/z{i % 3}/ud{i % 2}" for i, b in enumerate(B)}
    settings = ScanSettings(metadata_service_uri=URI, placement_policy=kind, enforce_min_racks=rng.random() < 0.2,
                            min_write_quorum=rng.randint(1, 2), min_ack_quorum=rng.randint(1, 2))
    registered = frozenset(b for b in B if rng.random() < 0.9)
    lost = LostBookies(registered, {b: 0 for b in B}, 0, 0) if rng.random() < 0.3 else None
    return RunContext(settings, racks, {}, {}, 10**13, placement=rng.random() < 0.8,
                      blast_radius=rng.random() < 0.8, lost=lost, registered=registered,
                      silent_before=Silences.of({md.ledger_id: tuple(sorted(md.bookies)) for md in mds}))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(list(Pass)))
def test_groups_and_ledger_by_ledger_find_the_same(seed: int, mode: Pass) -> None:
    """Every finding, its order, every count, every ledger left for another look, the blast radius and its topics."""
    rng = random.Random(seed)
    mds, answers = cluster(rng, rng.randint(1, 150))
    ctx = context(rng, mds)
    assert classify(ctx, mode, mds, answers) == classify(ctx, mode, mds, answers, grouped=False)


def on_four_ensembles(rng: random.Random) -> tuple[list[tuple[str, ...]], list[LedgerMetadata],
                                                  dict[str, BookieAnswers]]:
    """200 ledgers of E 3, WQ 2, AQ 2 on four ensembles, every share held exactly."""
    ensembles = [tuple(rng.sample(B, 3)) for _ in range(4)]
    mds = [LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, 50, 0, (Segment(0, ensembles[lid % 4]),))
           for lid in range(200)]
    answers: dict[str, BookieAnswers] = {}
    for md in mds:
        for b in md.bookies:
            answers.setdefault(b, BookieAnswers(b)).encoded[md.ledger_id] = encode_groups(expected_share(md, b))
    return ensembles, mds, answers


def test_a_healthy_cluster_is_checked_in_groups_and_a_group_with_a_finding_is_not() -> None:
    ensembles, mds, answers = on_four_ensembles(random.Random(5))
    held = held_exactly_their_shares(mds, {b: a.columns() for b, a in answers.items()})
    assert all(held)
    # every bookie on its own rack but those of ensemble 0, whose write sets then span one rack
    racks = {b: ("/same" if b in ensembles[0] else f"/r{i}") for i, b in enumerate(B)}
    ctx = RunContext(ScanSettings(metadata_service_uri=URI), racks, {}, {}, 10**13, blast_radius=True)
    groups = check_healthy(ctx, Pass.FIRST, mds, held, BlastTally())
    assert groups.checked == 150 and groups.rest == list(range(0, 200, 4))
    result = classify(ctx, Pass.FIRST, mds, answers)
    assert result == classify(ctx, Pass.FIRST, mds, answers, grouped=False)
    assert result.counts == {"checked": 200}
    assert [v.ledger_id for v in result.violations] == list(range(0, 200, 4))
    assert sum(b.ledgers for key, b in result.blast.items() if key.startswith("bookie:")) == 200 * 3


def test_what_a_shape_shares_is_worked_out_again_under_another_policy_or_other_racks() -> None:
    """What a shape's ledgers share is remembered from range to range (`_SHAPES`): the same ledgers, under
    another placement policy, other quorum minimums or with a bookie on another rack, find what each ledger
    checked alone finds."""
    ensembles, mds, answers = on_four_ensembles(random.Random(3))
    apart = {b: f"/apart{i}" for i, b in enumerate(B)}
    shared = {b: ("/shared" if b in ensembles[0] else f"/r{i}") for i, b in enumerate(B)}  # ensemble 0 on one rack
    found = []
    for kind, racks, min_wq in (("none", shared, 1), ("rackaware", apart, 1), ("rackaware", shared, 1),
                                ("rackaware", shared, 3)):
        settings = ScanSettings(metadata_service_uri=URI, placement_policy=kind, min_write_quorum=min_wq)
        ctx = RunContext(settings, racks, {}, {}, 10**13, blast_radius=True)
        result = classify(ctx, Pass.FIRST, mds, answers)
        assert result == classify(ctx, Pass.FIRST, mds, answers, grouped=False)
        found.append(len(result.violations))
    assert found == [0, 0, 100, 300]


@pytest.mark.parametrize(("kind", "enforce", "wq", "first", "second", "found"), [
    # a rack unknown, or the default one, is not just another rack (enforceMinNumRacksPerWriteQuorum)
    ("rackaware", True, 2, ("/a", "/b", "/c"), ("/d", None, "/e"), 50),
    ("rackaware", True, 2, ("/a", "/b", "/c"), ("/d", DEFAULT_RACK, "/e"), 50),
    # ... nor when it is allowed: its loss is the default rack's
    ("rackaware", False, 2, ("/a", None, "/b"), ("/c", None, "/d"), 0),
    # alike but for the racks: no finding, and a rack's loss named by its own rack
    ("rackaware", True, 3, ("/a", "/a", "/b"), ("/c", "/c", "/d"), 0),
    # zones are read from the names: alike relabelled, one softly adhering
    ("zoneaware", True, 3, ("/z0/u0", "/z1/u0", "/z2/u1"), ("/z0/u0", "/z0/u1", "/z1/u0"), 50),
])
def test_shapes_alike_but_for_their_racks_find_what_each_ledger_alone_finds(
        kind: str, enforce: bool, wq: int, first: tuple[str | None, ...], second: tuple[str | None, ...],
        found: int) -> None:
    """A shape's racks relabelled by where each first occurs (`_Shapes.relabelled`): two ensembles alike but for
    which racks find, and count in the blast radius, what each of their ledgers checked alone finds."""
    forget_shapes()
    ensembles = [tuple(B[:3]), tuple(B[3:6])]
    racks = {b: loc for ens, locs in zip(ensembles, (first, second), strict=True)
             for b, loc in zip(ens, locs, strict=True) if loc is not None}
    mds = [LedgerMetadata(lid, LedgerState.CLOSED, 3, wq, 2, 50, 0, (Segment(0, ensembles[lid % 2]),))
           for lid in range(100)]
    answers: dict[str, BookieAnswers] = {}
    for md in mds:
        for b in md.bookies:
            answers.setdefault(b, BookieAnswers(b)).encoded[md.ledger_id] = encode_groups(expected_share(md, b))
    settings = ScanSettings(metadata_service_uri=URI, placement_policy=kind, enforce_min_racks=enforce)
    ctx = RunContext(settings, racks, {}, {}, 10**13, blast_radius=True)
    result = classify(ctx, Pass.FIRST, mds, answers)
    assert result == classify(ctx, Pass.FIRST, mds, answers, grouped=False)
    assert [v.ledger_id for v in result.violations] == list(range(1, 100, 2))[:found]
    if first[0] == first[1]:  # a rack of two of a write set of three leaves one copy: below the ack quorum
        assert {key: b.below_aq for key, b in result.blast.items() if b.below_aq} == {"rack:/a": 50, "rack:/c": 50}
