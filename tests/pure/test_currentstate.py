"""The current state the leader keeps between full runs: a run replaces what it looked at, nothing else."""

from __future__ import annotations

from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.runkinds import DEEP, FULL, KIND_CATEGORIES
from scrutiny.categories import Category
from scrutiny.checks import Violation


def test_a_full_run_keeps_what_only_a_deep_run_looks_for() -> None:
    state = CurrentState()
    corrupt = Violation(Category.CORRUPT_ENTRY, 7, ("b1:3181",))
    lost = Violation(Category.NO_REPLICA_OF_AN_ENTRY, 8, ("b2:3181",))
    state.full_run([corrupt, lost], 1000, 2000, DEEP, categories=KIND_CATEGORIES[DEEP])
    state.full_run([], 3000, 4000, FULL, categories=KIND_CATEGORIES[FULL])
    assert dict(state.counts()) == {"CORRUPT_ENTRY": 1}  # the full run cleared the loss, not the corrupt copy
    state.full_run([], 5000, 6000, DEEP, categories=KIND_CATEGORIES[DEEP])
    assert dict(state.counts()) == {}


def test_a_deep_runs_corrupt_copy_is_nothing_continuous_scrutiny_missed() -> None:
    """No feed reports the stored bytes: a deep run finding them is no miss; a loss a full run finds is one."""
    state = CurrentState()
    state.watching(500)
    state.full_run([], 1000, 2000, FULL, categories=KIND_CATEGORIES[FULL])
    corrupt = Violation(Category.CORRUPT_ENTRY, 7, ("b1:3181",))
    assert state.full_run([corrupt], 3000, 4000, DEEP, categories=KIND_CATEGORIES[DEEP]) == 0
    lost = Violation(Category.NO_REPLICA_OF_AN_ENTRY, 8, ("b2:3181",))
    assert state.full_run([lost], 5000, 6000, FULL, categories=KIND_CATEGORIES[FULL]) == 1
    assert state.missed == 1


def test_a_deep_run_judges_nothing_of_continuous_scrutiny() -> None:
    """A corrupt copy counts as none in a deep run: its coverage finding is one no feed could report."""
    state = CurrentState()
    state.watching(500)
    state.full_run([], 1000, 2000, FULL, categories=KIND_CATEGORIES[FULL])
    short = Violation(Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY, 7, ("b1:3181",))
    assert state.full_run([short], 3000, 4000, DEEP, categories=KIND_CATEGORIES[DEEP], judges_continuous=False) == 0
    assert state.missed == 0 and dict(state.counts()) == {"LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY": 1}
