"""Each finding's remedy: the commands with their ids, and whether BookKeeper's autorecovery would repair it,
as its LedgerChecker (first and last entry of each bookie's share of a fragment at percentage 0) decides."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scrutiny.categories import REGISTRY, Category
from scrutiny.checks import BookieAnswer, Outcome, Violation, check_coverage, expected_share
from scrutiny.checks.remedy import MAYBE, NO, REMEDIES, YES, RepairContext, remedy
from scrutiny.checks.shares import stored_ends
from scrutiny.codec import Availability, decode, encode
from scrutiny.findings import Findings
from scrutiny.metadata import LedgerMetadata, LedgerState, Segment
from scrutiny.pulsar.owners import Owner
from scrutiny.report import Report

B = [f"b{i}:3181" for i in range(6)]


def closed(e: int, wq: int, aq: int, last: int, segments: list[tuple[int, list[str]]] | None = None) -> LedgerMetadata:
    segs = tuple(Segment(f, tuple(ens)) for f, ens in (segments or [(0, B[:e])]))
    return LedgerMetadata(7, LedgerState.CLOSED, e, wq, aq, last, 0, segs)


def share(md: LedgerMetadata, b: str) -> np.ndarray:
    return Availability.of(expected_share(md, b)).entry_ids()


def lacking(md: LedgerMetadata, b: str, entries: list[int]) -> Violation:
    answers = {x: BookieAnswer(Outcome.ENTRIES, Availability.of(expected_share(md, x))) for x in md.bookies}
    answers[b] = BookieAnswer(Outcome.ENTRIES, decode(encode(np.setdiff1d(share(md, b), entries))))
    v = check_coverage(md, answers).violation
    assert v is not None
    return v


def test_the_ends_of_a_share_are_those_the_checker_reads() -> None:
    # E 3, WQ 2: position 0 stores residues 0 and 2 (entries 0, 2, 3, 5, 6, ...)
    assert stored_ends(3, 2, 0, 0, 29) == (0, 29)
    assert stored_ends(3, 2, 1, 0, 29) == (0, 28)
    assert stored_ends(3, 2, 2, 0, 29) == (1, 29)
    assert stored_ends(3, 2, 1, 10, 10) == (10, 10) and stored_ends(3, 2, 0, 10, 10) is None
    md = closed(3, 2, 2, 29)
    for b in md.bookies:
        ids = share(md, b)
        pos = md.segments[0].ensemble.index(b)
        assert stored_ends(3, 2, pos, 0, 29) == (ids.min(), ids.max())


def test_a_copy_lost_mid_share_is_one_autorecovery_would_unmark_at_percentage_0() -> None:
    md = closed(3, 2, 2, 29)
    v = lacking(md, B[0], [3])
    assert v.category is Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY
    assert v.details["shares_lacking"] == [{"bookie": B[0], "first_entry": 0, "last_entry": 29, "entries_lacking": 1,
                                            "checker_reads": [0, 29], "lacking_ends": []}]
    r = remedy(v, RepairContext())
    assert r.commands == (f"bin/bookkeeper shell recover {B[0]} -l 7",)
    assert r.autorecovery == NO and "entries 0 and 29" in r.why and "without repair" in r.why
    assert remedy(v, RepairContext(verification_percentage=30)).autorecovery == MAYBE
    assert remedy(v, RepairContext(verification_percentage=100)).autorecovery == YES


def test_a_lost_first_or_last_entry_of_a_share_is_one_it_repairs() -> None:
    md = closed(3, 2, 2, 29)
    for entries in ([0], [29], [0, 3, 29]):
        v = lacking(md, B[0], entries)
        assert v.details["shares_lacking"][0]["lacking_ends"] == [e for e in (0, 29) if e in entries]
        r = remedy(v, RepairContext())
        assert r.autorecovery == YES and f"lacks entry {entries[0]}" in r.why
    # a second fragment: each bookie's share of each is judged alone, and all must be seen
    md = closed(3, 2, 2, 59, [(0, B[:3]), (30, [B[3], B[1], B[2]])])
    answers = {x: BookieAnswer(Outcome.ENTRIES, Availability.of(expected_share(md, x))) for x in md.bookies}
    answers[B[1]] = BookieAnswer(Outcome.ENTRIES, decode(encode(np.setdiff1d(share(md, B[1]), [0, 34]))))
    v = check_coverage(md, answers).violation
    assert v is not None
    by_fragment = {s["first_entry"]: s["lacking_ends"] for s in v.details["shares_lacking"]}
    assert by_fragment == {0: [0], 30: []}
    assert remedy(v, RepairContext()).autorecovery == NO


def test_no_copy_left_nothing_can_copy_and_a_disabled_cluster_copies_nothing() -> None:
    md = closed(3, 2, 2, 29)
    answers = {x: BookieAnswer(Outcome.ENTRIES, Availability.of(expected_share(md, x))) for x in md.bookies}
    for b in B[:2]:
        answers[b] = BookieAnswer(Outcome.ENTRIES, decode(encode(np.setdiff1d(share(md, b), [15]))))
    v = check_coverage(md, answers).violation
    assert v is not None and v.category is Category.NO_REPLICA_OF_AN_ENTRY
    r = remedy(v, RepairContext())
    assert r.autorecovery == NO and "15-15" in r.action
    assert r.commands == ("bin/bookkeeper shell readledger -l 7 -fe 15",)
    off = remedy(lacking(md, B[0], [0]), RepairContext(replication_disabled=True))
    assert off.autorecovery == NO and off.commands[0] == "bin/bookkeeper shell autorecovery -enable"
    lost = Violation(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, 9, (B[4],),
                     {"lost_bookies": [B[4]], "replication_disabled": False})
    r = remedy(lost, RepairContext(replication_disabled=False))
    assert r.autorecovery == YES and f"bin/bookkeeper shell recover {B[4]} -l 9" in r.commands


def test_a_copy_the_bookie_cannot_read_is_one_its_checker_sees_and_a_bad_digest_is_not() -> None:
    """A deep run counts both as no copy. A copy whose entry log is gone (or cut short, or another entry at its
    location) fails the bookie's own read, which fails BookKeeper's checker as a missing copy does; a copy whose
    digest fails is served, and the checker, which verifies no digest, reads it back as held."""
    md = closed(3, 2, 2, 29)

    def deep_finding(entries: list[int], served: list[int]) -> Violation:
        answers = {x: BookieAnswer(Outcome.ENTRIES, Availability.of(expected_share(md, x))) for x in md.bookies}
        answers[B[0]] = BookieAnswer(Outcome.ENTRIES, decode(encode(np.setdiff1d(share(md, B[0]), entries))))
        v = check_coverage(md, answers, {B[0]: served}).violation
        assert v is not None
        return v

    unreadable = deep_finding([0, 3], [])
    assert unreadable.details["shares_lacking"][0]["lacking_ends"] == [0]
    assert remedy(unreadable, RepairContext()).autorecovery == YES
    bad_digest = deep_finding([0, 3], [0, 3])
    share_ = bad_digest.details["shares_lacking"][0]
    assert (share_["lacking_ends"], share_["looks_held"]) == ([], 2)
    for p in (0, 30, 100):
        r = remedy(bad_digest, RepairContext(verification_percentage=p))
        assert r.autorecovery == NO and "digest" in r.why, p
    mixed = deep_finding([0, 3], [0])  # the end's digest fails (served), entry 3's log is gone (not)
    assert remedy(mixed, RepairContext()).autorecovery == NO
    assert remedy(mixed, RepairContext(verification_percentage=30)).autorecovery == MAYBE
    assert remedy(mixed, RepairContext(verification_percentage=100)).autorecovery == YES

    def corrupt(*reasons: str) -> Violation:
        return Violation(Category.CORRUPT_ENTRY, 7, (B[0],), {"copies": {B[0]: {
            "entries": [[3, 3]], "count": len(reasons), "reasons": dict.fromkeys(reasons, 1)}}})

    assert remedy(corrupt("bad-digest"), RepairContext(verification_percentage=100)).autorecovery == NO
    gone = corrupt("missing-log")
    assert remedy(gone, RepairContext(verification_percentage=100)).autorecovery == YES
    r = remedy(gone, RepairContext())
    assert r.autorecovery == MAYBE and "missing-log" in r.why and "coverage finding" in r.why
    assert remedy(gone, RepairContext(100, replication_disabled=True)).autorecovery == NO


@pytest.mark.parametrize("category", list(Category))
def test_every_category_has_a_remedy_that_serializes(category: Category) -> None:
    assert set(REMEDIES) == set(REGISTRY)
    v = Violation(category, 11, (B[1],), {}, owner=Owner("topic", "persistent://t/ns/orders"))
    r = remedy(v, RepairContext())
    assert r.action and "{" not in r.action and all("{" not in c for c in r.commands)
    assert all(c.startswith(("bin/bookkeeper shell ", "pulsar-admin ")) for c in r.commands)
    json.dumps(r.to_json())


def test_the_report_carries_each_remedy_and_its_context() -> None:
    v = lacking(closed(3, 2, 2, 29), B[0], [3])
    report = Report("r1", "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:01.000Z", True, {}, Findings([v]),
                    repair=RepairContext(0, False))
    doc = json.loads(report.dumps())
    assert doc["repair"] == {"auditor_ledger_verification_percentage": 0, "replication_disabled": False}
    assert doc["violations"][0]["remedy"]["autorecovery"] == NO
    again = Report.from_json(doc)
    assert again.repair == report.repair
    assert again.to_json()["violations"][0]["remedy"] == doc["violations"][0]["remedy"]
    assert "autorecovery, if marked: no" in report.render_text()
