"""Which findings the hand-off gives to autorecovery (those its remedy says autorecovery repairs), with the
mark's missing replicas as BookKeeper's Auditor names them, and the limits on how many at a time."""

from __future__ import annotations

import dataclasses

from scrutiny.categories import Category
from scrutiny.checks import BookieAnswer, Outcome, Violation, check_coverage, expected_share
from scrutiny.checks.remedy import RepairContext
from scrutiny.codec import Availability
from scrutiny.repair.followup import Followed, unrepaired
from scrutiny.repair.plan import MarkBudget, candidates
from tests.pure.test_remedy import B, closed, lacking


def test_only_what_autorecovery_repairs_with_the_bookies_to_copy_and_the_version_judged() -> None:
    md = closed(3, 2, 2, 29)
    first = dataclasses.replace(lacking(md, B[1], [0]), ledger_id=3, metadata_version=4)  # the first of its share
    middle = dataclasses.replace(lacking(md, B[0], [3]), ledger_id=4, metadata_version=0)  # both ends held
    unknown = dataclasses.replace(first, ledger_id=5, metadata_version=-1)  # never judged at a known version
    gone = Violation(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, 6, (B[2],), {"lost_bookies": [B[2], B[0]]}, 2)
    corrupt = Violation(Category.CORRUPT_ENTRY, 7, (B[0],), {}, 1)
    at_0 = candidates([corrupt, gone, unknown, middle, first], RepairContext())
    assert [(c.ledger_id, c.category, c.replicas, c.metadata_version) for c in at_0] == [
        (3, Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, (B[1],), 4),
        (6, Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, (B[0], B[2]), 2)]
    assert "first and the last entry" in at_0[0].why
    # at 100% its checker reads every entry: the mid-share loss too; with re-replication disabled, nothing
    assert [c.ledger_id for c in candidates([middle, first], RepairContext(100))] == [3, 4]
    assert candidates([first, gone], RepairContext(replication_disabled=True)) == []


def test_the_budget_per_hand_off_and_per_minute() -> None:
    budget = MarkBudget(per_run=3, per_minute=5)
    assert budget.allowance(0.0) == 3
    for t in (0.0, 1.0, 2.0):
        budget.spent(t)
    assert budget.allowance(10.0) == 2  # five a minute, three spent
    for t in (10.0, 11.0):
        budget.spent(t)
    assert budget.allowance(59.0) == 0
    assert budget.allowance(60.5) == 1  # the mark at 0.0 is a minute old
    assert budget.allowance(71.5) == 3


def test_a_mark_removed_with_the_loss_in_place_says_why_and_a_repaired_one_is_no_finding() -> None:
    md = closed(3, 2, 2, 29)
    middle = dataclasses.replace(lacking(md, B[0], [3]), ledger_id=4, metadata_version=2)
    [marked] = candidates([middle], RepairContext(100))
    f = Followed(marked, 1_700_000_000_000)
    v = unrepaired(f, [middle], 1_700_000_060_000, RepairContext(100))
    assert v is not None and v.category is Category.UNMARKED_WITHOUT_REPAIR and v.ledger_id == 4
    assert "at 0, BookKeeper's default" in v.details["cause"] and v.details["replicas"] == [B[0]]
    assert v.details["marked_at"] < v.details["unmarked_seen_at"]
    assert unrepaired(f, [], 1_700_000_060_000, RepairContext(100)) is None  # the copies back: repaired
    # judged at 0 and still lost: the worker saw it and its copy failed
    first = dataclasses.replace(lacking(md, B[1], [0]), ledger_id=3, metadata_version=4)
    [c] = candidates([first], RepairContext())
    again = unrepaired(Followed(c, 0), [first], 1, RepairContext())
    assert again is not None and "its copy did not restore it" in again.details["cause"]
    # a ledger already unmarked without repair is not handed off again
    assert candidates([middle, v], RepairContext(100)) == []


def test_a_ledger_with_two_findings_autorecovery_repairs_is_one_candidate_whatever_their_order() -> None:
    """The churn soak's late mark (#63 item 4): a ledger whose share on one bookie is gone (LESS_THAN_WQ: its lost
    copies never share a write set with those of the lost bookie) while another of its bookies is lost and nobody
    repairs it (LOST_BOOKIE_RECOVERY_NOT_STARTED). The current state lists findings worst first (the lost bookie,
    rank 2.5, before LESS_THAN_WQ, rank 3); a run's report by category name (LESS_THAN_WQ first). The hand-off chose
    one candidate a ledger from each and marked only when the two agreed: this ledger was never confirmed, so never
    marked. The candidate is now the same in any order: the finding that names the most bookies to copy."""
    md = closed(6, 3, 2, 59, [(0, B[:6])])
    answers = {x: BookieAnswer(Outcome.ENTRIES, Availability.of(expected_share(md, x))) for x in md.bookies}
    answers[B[0]] = answers[B[3]] = BookieAnswer(Outcome.NO_LEDGER)  # a share gone, and a lost bookie's
    coverage = check_coverage(md, answers).violation
    assert coverage is not None and coverage.category is Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY
    short = dataclasses.replace(coverage, metadata_version=3, details={**coverage.details, "lost_bookies": [B[3]]})
    lost = Violation(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, 7, (B[3],), {"lost_bookies": [B[3]]}, 3)
    by_rank, by_name = candidates([lost, short], RepairContext()), candidates([short, lost], RepairContext())
    assert by_rank == by_name and [(c.category, c.replicas) for c in by_rank] == [
        (Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY, (B[0], B[3]))]
    # and two findings naming as many: the worse one
    alone = dataclasses.replace(lacking(md, B[0], list(range(60))), metadata_version=3)
    assert [c.category for c in candidates([alone, lost], RepairContext())] == [
        Category.LOST_BOOKIE_RECOVERY_NOT_STARTED] == [c.category for c in candidates([lost, alone], RepairContext())]
