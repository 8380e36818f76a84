"""The pure checks: BookKeeper's placement and replicas-check scenarios, against the spec."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrutiny.bookieclient import take_listed
from scrutiny.categories import Category
from scrutiny.checks import (
    NO_LEDGER,
    BookieAnswer,
    BookieAnswers,
    Outcome,
    PlacementPolicy,
    PlacementResult,
    check_coverage,
    check_ensemble,
    check_past_the_close,
    check_placement,
    check_underreplication_age,
    expected_share,
    held_exactly_their_shares,
    listed,
)
from scrutiny.codec import Availability, decode, encode, encode_groups, encode_unmerged, groups_of
from scrutiny.config import ScanSettings
from scrutiny.listedcolumns import listed_columns, read_listed
from scrutiny.metadata import DEFAULT_RACK, LedgerMetadata, LedgerState, Segment, UnderreplicationMark
from scrutiny.scan.classify import classify
from scrutiny.scan.context import Pass, RunContext, Silences
from scrutiny.v1 import bookie_pb2

B = [f"b{i}:3181" for i in range(12)]


def ledger(e: int, wq: int, aq: int, last: int, segments: list[tuple[int, list[str]]] | None = None,
           lid: int = 1) -> LedgerMetadata:
    segs = tuple(Segment(f, tuple(ens)) for f, ens in (segments or [(0, B[:e])]))
    return LedgerMetadata(lid, LedgerState.CLOSED, e, wq, aq, last, 0, segs)


def holding(ids: object) -> BookieAnswer:
    return BookieAnswer(Outcome.ENTRIES, decode(encode(ids)))  # type: ignore[arg-type]


def healthy_answers(md: LedgerMetadata) -> dict[str, BookieAnswer]:
    return {b: BookieAnswer(Outcome.ENTRIES, Availability.of(expected_share(md, b))) for b in md.bookies}


def share_ids(md: LedgerMetadata, b: str) -> np.ndarray:
    return Availability.of(expected_share(md, b)).entry_ids()


# -- placement ------------------------------------------------------------------------------------

RACKAWARE = PlacementPolicy("rackaware")


def test_rackaware_strict_and_fail() -> None:
    racks = {B[0]: "/r1", B[1]: "/r2", B[2]: "/r3", B[3]: "/r1"}
    assert check_ensemble(RACKAWARE, B[:3], 2, racks)[0] is PlacementResult.MEETS_STRICT
    result, why = check_ensemble(RACKAWARE, [B[0], B[3], B[1]], 2, racks)
    assert result is PlacementResult.FAIL and "position 0" in why  # b0, b3 share /r1
    assert check_ensemble(RACKAWARE, [], 2, racks)[0] is PlacementResult.FAIL


def test_rackaware_unmapped_bookies_are_on_the_default_rack() -> None:
    racks = {B[0]: "/r1"}
    # b1 and b2 both unmapped: the write set (b1, b2) spans one rack
    assert check_ensemble(RACKAWARE, B[:3], 2, racks)[0] is PlacementResult.FAIL
    racks = {B[0]: "/r1", B[1]: "/r2"}
    assert check_ensemble(RACKAWARE, B[:3], 2, racks)[0] is PlacementResult.MEETS_STRICT  # b2 on the default
    enforce = PlacementPolicy("rackaware", enforce_min_racks=True)
    assert check_ensemble(enforce, B[:3], 2, racks)[0] is PlacementResult.FAIL
    assert check_ensemble(enforce, B[:3], 2, {**racks, B[2]: "/r3"})[0] is PlacementResult.MEETS_STRICT
    assert racks.get(B[5], DEFAULT_RACK) == "/default-rack"


def test_rackaware_min_racks_is_capped_by_the_write_quorum() -> None:
    racks = dict.fromkeys(B[:3], "/r1")
    assert check_ensemble(RACKAWARE, B[:3], 1, racks)[0] is PlacementResult.MEETS_STRICT
    three = PlacementPolicy("rackaware", min_racks_per_write_quorum=3)
    two_racks = {B[0]: "/r1", B[1]: "/r2", B[2]: "/r1", B[3]: "/r2"}
    assert check_ensemble(three, B[:4], 3, two_racks)[0] is PlacementResult.FAIL
    assert check_ensemble(three, B[:4], 2, two_racks)[0] is PlacementResult.MEETS_STRICT


def test_rackaware_agrees_with_every_write_set_counted_by_hand() -> None:
    import random

    rng = random.Random(11)
    for _ in range(500):
        e = rng.randint(1, 7)
        wq = rng.randint(1, e)
        ensemble = rng.sample(B, e)
        racks = {b: f"/r{rng.randrange(4)}" for b in B if rng.random() < 0.85}  # some on the default rack
        policy = PlacementPolicy("rackaware", min_racks_per_write_quorum=rng.randint(1, 4),
                                 enforce_min_racks=rng.random() < 0.5)
        need = min(wq, policy.min_racks_per_write_quorum)
        by_hand = PlacementResult.MEETS_STRICT
        for i in range(e):
            spanned = {racks.get(ensemble[(i + j) % e], DEFAULT_RACK) for j in range(wq)}
            if len(spanned) < need or (policy.enforce_min_racks and DEFAULT_RACK in spanned):
                by_hand = PlacementResult.FAIL
        assert check_ensemble(policy, ensemble, wq, racks)[0] is by_hand, (policy, ensemble, wq, racks)


ZONEAWARE = PlacementPolicy("zoneaware")


@pytest.mark.parametrize(
    ("ensemble", "wq", "locations", "expected"),
    [
        (B[:6], 3, {B[i]: f"/z{i % 3}/ud{i}" for i in range(6)}, PlacementResult.MEETS_STRICT),
        (B[:5], 3, {B[i]: f"/z{i % 3}/ud{i}" for i in range(5)}, PlacementResult.FAIL),  # E % WQ != 0
        (B[:4], 2, {B[i]: f"/z{i % 2}/ud{i}" for i in range(4)}, PlacementResult.FAIL),  # WQ <= min zones
        (B[:6], 3, {**{B[i]: f"/z{i % 3}/ud{i}" for i in range(6)}, B[0]: "/default-zone/default-upgradedomain"},
         PlacementResult.FAIL),
        (B[:6], 3, {B[i]: f"/z{i % 3}/ud{i}" for i in range(5)}, PlacementResult.FAIL),  # b5 unknown
        (B[:6], 3, {B[i]: f"/z{i % 2}/ud{i}" for i in range(6)}, PlacementResult.MEETS_SOFT),  # 2 < 3 zones
        (B[:6], 3, {B[i]: f"/z{i % 2}/ud0" for i in range(6)}, PlacementResult.FAIL),  # one upgrade domain
        (B[:6], 3, dict.fromkeys(B[:6], "/z0/ud1"), PlacementResult.FAIL),  # one zone
    ],
)
def test_zoneaware(ensemble: list[str], wq: int, locations: dict[str, str], expected: PlacementResult) -> None:
    assert check_ensemble(ZONEAWARE, ensemble, wq, locations)[0] is expected


def test_regionaware_is_a_real_check() -> None:
    policy = PlacementPolicy("regionaware")
    two_regions = {B[0]: "/east/r1", B[1]: "/west/r1", B[2]: "/east/r2", B[3]: "/west/r2"}
    assert check_ensemble(policy, B[:4], 2, two_regions)[0] is PlacementResult.MEETS_STRICT
    assert check_ensemble(policy, B[:3], 2, two_regions)[0] is PlacementResult.FAIL  # (b2, b0): east only
    one_region = {B[0]: "/east/r1", B[1]: "/east/r2", B[2]: "/east/r3"}
    assert check_ensemble(policy, B[:3], 2, one_region)[0] is PlacementResult.FAIL
    same_rack = {B[0]: "/east/r1", B[1]: "/east/r1", B[2]: "/west/r1", B[3]: "/west/r2"}
    assert check_ensemble(policy, B[:4], 3, same_rack)[0] is PlacementResult.MEETS_SOFT
    assert check_ensemble(PlacementPolicy("none"), B[:3], 2, {})[0] is PlacementResult.MEETS_STRICT


def test_a_ledger_is_judged_by_its_worst_segment_and_counted_once() -> None:
    racks = {B[0]: "/r1", B[1]: "/r2", B[2]: "/r3", B[3]: "/r1", B[4]: "/r1"}
    md = ledger(3, 2, 2, 99, [(0, B[:3]), (10, [B[0], B[3], B[4]]), (20, [B[3], B[4], B[0]])])
    v = check_placement(md, RACKAWARE, racks)
    assert v is not None and v.category is Category.PLACEMENT_POLICY_NOT_ADHERING
    assert len(v.details["segments"]) == 2 and v.ledger_id == 1
    assert check_placement(ledger(3, 2, 2, 99), RACKAWARE, racks) is None
    soft = check_placement(ledger(4, 3, 2, 9), PlacementPolicy("regionaware"),
                           {B[0]: "/e/r1", B[1]: "/e/r1", B[2]: "/w/r1", B[3]: "/w/r2"})
    assert soft is not None and soft.category is Category.PLACEMENT_POLICY_SOFTLY_ADHERING


# -- coverage ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("e", "wq"), [(3, 2), (5, 2), (5, 3), (4, 2), (6, 2), (3, 3), (1, 1), (7, 2)])
def test_healthy_ledgers_are_clean_including_e_minus_wq_at_least_2(e: int, wq: int) -> None:
    md = ledger(e, wq, wq, 999)
    res = check_coverage(md, healthy_answers(md))
    assert res.violation is None and res.least_copies == wq and not res.unavailable
    java_shape = {b: BookieAnswer(Outcome.ENTRIES, decode(encode_unmerged(share_ids(md, b)))) for b in md.bookies}
    assert check_coverage(md, java_shape).violation is None


def test_lost_ledger_copy_classes() -> None:
    md = ledger(3, 2, 2, 99)
    answers = {**healthy_answers(md), B[2]: NO_LEDGER}
    v = check_coverage(md, answers).violation
    assert v is not None and v.category is Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY and v.bookies == (B[2],)
    md = ledger(3, 3, 2, 99)
    v = check_coverage(md, {**healthy_answers(md), B[1]: NO_LEDGER}).violation
    assert v is not None and v.category is Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY
    v = check_coverage(md, {**healthy_answers(md), B[1]: NO_LEDGER, B[2]: NO_LEDGER}).violation
    assert v is not None and v.category is Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY
    v = check_coverage(md, dict.fromkeys(md.bookies, NO_LEDGER)).violation
    assert v is not None and v.category is Category.NO_REPLICA_OF_AN_ENTRY


def test_no_replica_of_one_entry_names_the_range_and_bookies() -> None:
    md = ledger(3, 2, 2, 299)
    answers = healthy_answers(md)
    for b in B[:2]:
        answers[b] = holding(np.setdiff1d(share_ids(md, b), [150]))
    v = check_coverage(md, answers).violation
    assert v is not None and v.category is Category.NO_REPLICA_OF_AN_ENTRY
    worst = v.details["under_covered"][0]
    assert (worst["first_entry"], worst["last_entry"], worst["copies"]) == (150, 150, 0)
    assert worst["missing_bookies"] == sorted(B[:2])


def test_copies_outside_the_write_set_do_not_count() -> None:
    md = ledger(3, 2, 2, 99)
    answers = healthy_answers(md)
    answers[B[0]] = holding(np.setdiff1d(np.arange(100), [0]))  # everything but its own entry 0
    v = check_coverage(md, answers).violation
    assert v is not None and v.category is Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY
    assert v.details["under_covered"][0]["first_entry"] == 0


def test_unavailable_and_invalid_bookies_are_unknown_not_missing() -> None:
    md = ledger(3, 2, 2, 99)
    answers = {**healthy_answers(md), B[1]: BookieAnswer(Outcome.UNAVAILABLE, reason="refused"),
               B[2]: BookieAnswer(Outcome.INVALID, reason="garbage")}
    res = check_coverage(md, answers)
    assert res.violation is None and res.unavailable == {B[1]} and res.invalid == {B[2]: "garbage"}
    answers[B[0]] = NO_LEDGER
    res = check_coverage(md, answers)
    assert res.violation is not None and res.violation.details["unknown_bookies"] == sorted(B[1:3])


def test_segments_with_their_own_ensembles_and_empty_segments() -> None:
    md = ledger(3, 2, 2, 60, [(0, B[:3]), (10, B[3:6]), (10, B[6:9]), (70, B[9:12])])
    answers = healthy_answers(md)
    assert all(not expected_share(md, b) for b in B[3:6] + B[9:12])  # empty segments expect nothing
    assert check_coverage(md, answers).violation is None
    answers[B[6]] = NO_LEDGER
    v = check_coverage(md, answers).violation
    assert v is not None and all(r["first_entry"] >= 10 for r in v.details["under_covered"])


def test_huge_healthy_ledger_is_checked_on_groups() -> None:
    md = ledger(3, 2, 2, 9_999_999)
    answers = healthy_answers(md)
    assert all(len(a.availability.groups) <= 3 for a in answers.values() if a.availability)
    assert check_coverage(md, answers).violation is None


def _brute(md: LedgerMetadata, held: dict[str, set[int] | None]) -> int:
    least = md.write_quorum
    for seg, lo, hi in md.segment_ranges():
        e = md.ensemble_size
        for x in range(lo, hi + 1):
            ws = [seg.ensemble[(x + w) % e] for w in range(md.write_quorum)]
            least = min(least, sum(1 for b in ws if held[b] is None or x in held[b]))  # type: ignore[operator]
    return least


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_coverage_matches_a_brute_force_count(data: st.DataObject) -> None:
    e = data.draw(st.integers(1, 6))
    wq = data.draw(st.integers(1, e))
    aq = data.draw(st.integers(1, wq))
    last = data.draw(st.integers(0, 80))
    firsts = sorted({0, *data.draw(st.lists(st.integers(0, 90), max_size=2))})
    segs = [(f, data.draw(st.permutations(B))[:e]) for f in firsts]
    md = ledger(e, wq, aq, last, segs)
    held: dict[str, set[int] | None] = {}
    answers: dict[str, BookieAnswer] = {}
    for b in sorted(md.bookies):
        kind = data.draw(st.sampled_from(["healthy", "lossy", "none", "unavailable", "extra"]))
        share = set(share_ids(md, b).tolist())
        if kind == "unavailable":
            held[b], answers[b] = None, BookieAnswer(Outcome.UNAVAILABLE)
            continue
        if kind == "lossy":
            share -= set(data.draw(st.lists(st.integers(0, 90), max_size=30)))
        elif kind == "none":
            share = set()
        elif kind == "extra":
            share |= set(data.draw(st.lists(st.integers(0, 90), max_size=30)))
        held[b], answers[b] = share, holding(sorted(share))
    res = check_coverage(md, answers)
    assert res.least_copies == _brute(md, held)
    if res.violation is not None:
        # the ranges name exactly the under-covered entries
        named = {x for r in res.violation.details["under_covered"]
                 for x in range(r["first_entry"], r["last_entry"] + 1)
                 if r["sequence_period"] == 0 or (x - r["first_entry"]) % r["sequence_period"] < r["sequence_size"]}
        assert min(r["copies"] for r in res.violation.details["under_covered"]) == res.least_copies
        assert named


def test_the_exact_share_fast_path_agrees_with_the_full_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from scrutiny.checks import coverage

    rng = random.Random(5)
    for _ in range(200):
        e = rng.randint(1, 6)
        wq = rng.randint(1, e)
        last = rng.choice((-1, 0, 1, e, 3 * e, 40))
        segs = [(0, rng.sample(B, e))] + ([(rng.randint(0, last + 2), rng.sample(B, e))] if rng.random() < 0.4 else [])
        md = ledger(e, wq, 1, last, segs)
        answers = healthy_answers(md)
        victim = rng.choice(sorted(md.bookies))
        lossy = dict(answers, **{victim: holding(share_ids(md, victim)[1:])})
        for case in (answers, lossy):
            fast = check_coverage(md, case)
            with monkeypatch.context() as m:
                m.setattr(coverage, "each_holds_its_share", lambda md, answers: False)
                slow = check_coverage(md, case)
            assert fast == slow, (md, case)


def random_answers(rng: random.Random, md: LedgerMetadata, answers: dict[str, BookieAnswers]) -> None:
    """Each bookie's answer about `md` as bytes: mostly its share as an agent encodes it, else lossy,
    in the Java shape, empty, garbage, another status, or no answer."""
    for b in md.bookies:
        share = expected_share(md, b)
        kind = rng.choices(("agent", "lossy", "java", "empty", "garbage", "no_ledger", "silent"),
                           (12, 2, 2, 1, 1, 1, 1))[0]
        got = answers.setdefault(b, BookieAnswers(b))
        ids = Availability.of(share).entry_ids()
        if kind == "agent":
            got.encoded[md.ledger_id] = encode_groups(share)
        elif kind == "lossy":
            got.encoded[md.ledger_id] = encode(ids[ids % 5 != rng.randrange(5)])
        elif kind == "java":
            got.encoded[md.ledger_id] = encode_unmerged(ids)
        elif kind == "empty":
            got.encoded[md.ledger_id] = b""
        elif kind == "garbage":
            got.encoded[md.ledger_id] = rng.randbytes(rng.choice((7, 64, 88)))
        elif kind == "no_ledger":
            got.other[md.ledger_id] = NO_LEDGER


def as_a_scan_reads_them(rng: random.Random, answers: dict[str, BookieAnswers]) -> dict[str, BookieAnswers]:
    """The same answers as a scan takes them from an agent's stream: most lists of entries as columns, a message
    at a time in any order, now and then with a ledger listed again after its first answer or one not asked; the
    rest one at a time."""
    out = {}
    for b, said in answers.items():
        got = out[b] = BookieAnswers(b)
        got.other.update(said.other)
        items = list(said.encoded.items())
        rng.shuffle(items)
        alone = rng.randrange(len(items) // 4 + 1)
        got.encoded.update(items[:alone])
        asked = np.array(sorted([*said.encoded, *said.other]), dtype=np.int64)
        at = alone
        while at < len(items):
            message = items[at:at + rng.randint(1, 40)]
            at += len(message)
            if rng.random() < 0.3:  # answered already: its first answer counts; not asked: not taken
                message.append((rng.choice(items[:at])[0], rng.randbytes(88)))
                message.insert(rng.randrange(len(message)), (10**9 + rng.randrange(100), encode([0])))
            wire = listed_columns([lid for lid, _ in message], [a for _, a in message]).SerializeToString()
            assert take_listed(b, read_listed(bookie_pb2.ListedColumns.FromString(wire)), asked, got) == ""
        assert kept(got) == kept(said) and len(got) == len(said) and sorted(got) == sorted(said)
        assert all((got[lid].outcome, got[lid].reason) == (said[lid].outcome, said[lid].reason) for lid in said)
    return out


def kept(answers: BookieAnswers) -> dict[int, object]:
    """Each ledger's answer as kept: its bytes, or any other answer."""
    listed = answers.columns()
    return {**dict(zip(listed.ledger_ids.tolist(), listed.answers(), strict=True)), **answers.other}


def random_ledgers(rng: random.Random, count: int) -> list[LedgerMetadata]:
    out = []
    for lid in range(count):
        e = rng.randint(1, 6)
        wq = rng.randint(1, e)
        last = rng.choice((0, 1, e - 1, e, 3 * e + 1, rng.randint(0, 500)))
        segs = [(0, rng.sample(B, e))]
        if rng.random() < 0.2 and last > 2:
            segs.append((rng.randint(1, last), rng.sample(B, e)))
        out.append(ledger(e, wq, rng.randint(1, wq), last, segs, lid=lid))
    return out


@settings(max_examples=300, deadline=None)
@given(e=st.integers(1, 6), data=st.data())
def test_a_share_is_grouped_as_an_agent_encodes_its_entries_across_ensemble_changes(e: int, data: st.DataObject
                                                                                       ) -> None:
    """`expected_share` against BP-34's encoder over the entries a bookie must hold, worked out entry by entry:
    a bookie that keeps its position through an ensemble change holds one body, as its agent sends it."""
    wq = data.draw(st.integers(1, e))
    last = data.draw(st.integers(0, 120))
    firsts = sorted({0, *data.draw(st.lists(st.integers(0, last + 2), max_size=3))})
    pool = B[:e + 3]
    segments = tuple(Segment(f, tuple(data.draw(st.permutations(pool))[:e])) for f in firsts)
    md = LedgerMetadata(1, LedgerState.CLOSED, e, wq, 1, last, 0, segments)
    for b in md.bookies:
        held = [x for seg, lo, hi in md.segment_ranges() if b in seg.ensemble for x in range(lo, hi + 1)
                if (seg.ensemble.index(b) - x) % e < wq]
        assert expected_share(md, b) == groups_of(held)


def test_shares_held_exactly_are_found_in_bulk_as_each_ledger_alone_finds_them() -> None:
    """The bulk verdict (numpy over every ledger at once) against each ledger's shares encoded one by
    one; and a ledger it passes is healthy to the full coverage check."""
    rng = random.Random(11)
    mds = random_ledgers(rng, 600)
    answers: dict[str, BookieAnswers] = {}
    for md in mds:
        random_answers(rng, md, answers)
    sent = as_a_scan_reads_them(rng, answers)
    verdict = held_exactly_their_shares(mds, {b: a.columns() for b, a in sent.items()})
    for md, held in zip(mds, verdict, strict=True):
        exact = all(answers[b].encoded.get(md.ledger_id) == encode_groups(expected_share(md, b)) for b in md.bookies)
        assert held == exact, md
        if held:
            cov = check_coverage(md, {b: answers[b][md.ledger_id] for b in md.bookies})
            assert cov.violation is None and cov.least_copies == md.write_quorum
    assert 100 < sum(verdict) < len(mds)


@pytest.mark.parametrize("mode", list(Pass))
def test_a_range_classified_with_answers_kept_encoded_is_classified_as_ledger_by_ledger(mode: Pass) -> None:
    """Every finding, every ledger left for another look and the blast radius: the same whether the
    answers stay encoded (the bulk verdict first) or are each decoded up front (ledger by ledger)."""
    rng = random.Random(12)
    mds = random_ledgers(rng, 400)
    topic = (("application", b"pulsar"), ("component", b"managed-ledger"))
    mds = [dataclasses.replace(md, custom_metadata=(*topic, ("pulsar/managed-ledger", b"t/%d" % (md.ledger_id % 7))))
           if md.ledger_id % 3 else md for md in mds]
    answers: dict[str, BookieAnswers] = {}
    for md in mds:
        random_answers(rng, md, answers)
    decoded = {b: {lid: a[lid] for lid in a} for b, a in answers.items()}
    racks = {b: f"/r{i % 4}" for i, b in enumerate(B)}
    ctx = RunContext(ScanSettings(metadata_service_uri="zk+hierarchical://127.0.0.1:2181/ledgers"), racks,
                     {}, {}, 10**13, blast_radius=True, registered=frozenset(B),
                     silent_before=Silences.of({md.ledger_id: tuple(sorted(md.bookies)) for md in mds}))
    bulk = classify(ctx, mode, mds, as_a_scan_reads_them(rng, answers))
    alone = classify(ctx, mode, mds, decoded)
    assert bulk == alone
    assert bulk.violations and (bulk.potentially_faulty or mode is Pass.FINAL)
    assert any(b.topics_below_aq for b in bulk.blast.values())


def test_answers_kept_encoded_are_decoded_when_looked_at() -> None:
    got = BookieAnswers("b1:3181")
    got.encoded[1] = encode([0, 1, 2])
    got.encoded[2] = b"not an answer"
    got.other[3] = NO_LEDGER
    assert len(got) == 3 and sorted(got) == [1, 2, 3] and 2 in got and 4 not in got
    assert got[1].outcome is Outcome.ENTRIES and got[1].availability.entry_ids().tolist() == [0, 1, 2]  # type: ignore[union-attr]
    assert got[2] == listed(Outcome.ENTRIES, "b1:3181", 2, b"not an answer")
    assert got[2].outcome is Outcome.INVALID and got[2].reason.startswith("bookie b1:3181, ledger 2: short buffer")
    assert got[3] is NO_LEDGER and got.get(4) is None
    with pytest.raises(KeyError):
        got[4]


# -- under-replication age ----------------------------------------------------------------------------

def test_underreplication_age_is_strictly_greater_than_the_grace_period() -> None:
    now = 1_700_000_100_000
    marks = [UnderreplicationMark(1, ("a",), now - 100_000), UnderreplicationMark(2, ("a",), now - 100_999),
             UnderreplicationMark(3, ("a",), now - 101_000), UnderreplicationMark(4, (), None)]
    got = check_underreplication_age(marks, 100, now)
    assert [v.ledger_id for v in got] == [3]
    assert got[0].details["age_seconds"] == 101
    assert check_underreplication_age(marks, 0, now) == []


def test_blast_radius_of_a_healthy_ledger_by_arithmetic_equals_the_set_arithmetic() -> None:
    import random

    from scrutiny.checks import blast_radius, coverage_without

    rng = random.Random(3)
    racks = {b: f"/r{i % 3}" for i, b in enumerate(B)}
    for _ in range(300):
        e = rng.randint(1, 6)
        wq = rng.randint(1, e)
        last = rng.choice((0, 1, e - 1, e, 3 * e, 40))
        segs = [(0, rng.sample(B, e))]
        if rng.random() < 0.4:
            segs.append((rng.randint(0, last + 2), rng.sample(B, e)))  # possibly empty or short
        md = ledger(e, wq, 1, last, segs)
        answers = {b: BookieAnswer(Outcome.ENTRIES, Availability.of(expected_share(md, b))) for b in md.bookies}
        least = check_coverage(md, answers).least_copies
        assert least == wq
        fast = blast_radius(md, answers, racks, least)
        slow = {key: coverage_without(md, answers, [b for b in md.bookies if (b if key[0] == "bookie" else
                                                                              racks[b]) == key[1]]).least_copies
                for key in fast}
        assert fast == slow, (md, fast, slow)
        assert set(fast) == {("bookie", b) for b in md.bookies} | {("rack", racks[b]) for b in md.bookies}


# -- entries past the close (apache/bookkeeper #4812; docs/entries-past-the-close.md) --------------


def with_past_close(md: LedgerMetadata, extra: dict[str, list[int]]) -> dict[str, BookieAnswer]:
    """Healthy answers, plus entries above lastEntryId on some bookies."""
    return {b: holding(np.union1d(share_ids(md, b), extra.get(b, []))) for b in md.bookies}


def test_a_replaced_bookie_that_took_writes_after_the_close_is_found() -> None:
    md = ledger(3, 2, 2, 99)  # entry e on positions e % 3 and (e + 1) % 3
    # entries 100-104 acknowledged after the close: each on both bookies of its write set
    extra = {b: [e for e in range(100, 105) if (i - e) % 3 < 2] for i, b in enumerate(B[:3])}
    past = check_past_the_close(md, with_past_close(md, extra))
    v = past.violation
    assert v is not None and v.category is Category.ENTRIES_PAST_THE_CLOSE
    assert v.details["entries"] == [[100, 104]] and v.details["count"] == 5 and v.details["least_copies"] == 2
    assert set(v.bookies) == set(B[:3]) and not past.residue
    assert check_coverage(md, with_past_close(md, extra)).violation is None  # the ledger itself is whole


def test_a_recovery_residue_is_not_reported() -> None:
    md = ledger(3, 2, 2, 99)
    one = check_past_the_close(md, with_past_close(md, {B[1]: [100]}))  # entry 100 on one bookie: < AQ
    assert one.violation is None and one.residue
    # entries after the first missing one may have every copy: in flight at the fence, never acknowledged
    gap = check_past_the_close(md, with_past_close(md, {B[1]: [100, 101], B[2]: [101]}))
    assert gap.violation is None and gap.residue
    assert check_past_the_close(md, healthy_answers(md)).violation is None


def test_past_the_close_stops_at_the_first_entry_below_aq_and_counts_what_follows() -> None:
    md = ledger(3, 3, 2, 9)  # every entry on all three
    extra = {B[0]: [10, 11, 12, 14], B[1]: [10, 11, 14], B[2]: [12, 13, 14]}  # 13 has one copy
    past = check_past_the_close(md, with_past_close(md, extra))
    assert past.violation is not None and past.violation.details["entries"] == [[10, 12]] and past.residue


def test_past_the_close_follows_an_ensemble_change_after_the_close() -> None:
    # the writer replaced a bookie at entry 50 (a segment after the close at 40): entries 41-49 go to the
    # first ensemble, 50 on to the second
    md = ledger(3, 2, 2, 40, [(0, B[:3]), (50, [B[0], B[5], B[2]])])
    held = {b: list(share_ids(md, b)) for b in md.bookies}
    first, second = ledger(3, 2, 2, 49, [(0, B[:3])]), ledger(3, 2, 2, 52, [(0, [B[0], B[5], B[2]])])
    for b in B[:3]:
        held[b] += [e for e in share_ids(first, b) if e > 40]
    for b in (B[0], B[5], B[2]):
        held[b] += [e for e in share_ids(second, b) if e >= 50]
    past = check_past_the_close(md, {b: holding(ids) for b, ids in held.items()})
    assert past.violation is not None and past.violation.details["entries"] == [[41, 52]]
    assert past.violation.details["ensemble"] == B[:3]


def test_silent_bookies_copies_past_the_close_are_unknown_not_counted() -> None:
    md = ledger(3, 2, 2, 99)
    answers = with_past_close(md, {B[0]: [100], B[1]: [100]})
    answers[B[1]] = BookieAnswer(Outcome.UNAVAILABLE, reason="down")
    assert check_past_the_close(md, answers).violation is None


@settings(max_examples=300, deadline=None)
@given(e=st.integers(1, 5), data=st.data())
def test_past_the_close_matches_counting_entry_by_entry(e: int, data: st.DataObject) -> None:
    wq = data.draw(st.integers(1, e))
    aq = data.draw(st.integers(1, wq))
    last = data.draw(st.integers(0, 30))
    md = ledger(e, wq, aq, last)
    extra = {b: data.draw(st.lists(st.integers(last + 1, last + 25), max_size=12)) for b in md.bookies}
    past = check_past_the_close(md, with_past_close(md, extra))
    ens = md.segments[0].ensemble

    def copies(x: int) -> int:
        return sum(1 for w in range(wq) if x in extra[ens[(x + w) % e]])

    end = last
    while copies(end + 1) >= aq:
        end += 1
    if end == last:
        assert past.violation is None
    else:
        assert past.violation is not None and past.violation.details["entries"] == [[last + 1, end]]
        assert past.violation.details["least_copies"] == min(copies(x) for x in range(last + 1, end + 1))
    assert past.residue == any(x > end for ids in extra.values() for x in ids)
