"""The current state the leader keeps between full runs: a run replaces what it looked at, nothing else; what a
leader keeps of it for the next one."""

from __future__ import annotations

import random
import zlib

import pytest

from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.keptstate import KeptState, kept
from scrutiny.auditor.runkinds import DEEP, FULL, KIND_CATEGORIES
from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.errors import DataError


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


def test_the_state_a_leader_keeps_is_what_the_next_one_restores() -> None:
    """Every finding whole with when and how it was found, the baseline, and the counts: the next leader's state
    (its gauges, its API) is the last one's until its own runs and looks tell."""
    state = CurrentState()
    state.full_run([Violation(Category.PLACEMENT_POLICY_NOT_ADHERING, 3, ("b1:3181",), {"racks": 1})], 1000, 2000)
    gone = {"least_copies": 0, "write_quorum": 2, "ack_quorum": 2, "ensemble_size": 2, "under_covered": [
        {"first_entry": 0, "last_entry": 4, "sequence_size": 1, "sequence_period": 1, "entries": 5, "copies": 0,
         "missing_bookies": ["b2:3181"]}]}
    state.looked_again([7], [Violation(Category.NO_REPLICA_OF_AN_ENTRY, 7, ("b2:3181",), gone)], 2500,
                       "continuous: LEDGERS_GONE on b2:3181", KIND_CATEGORIES[FULL])
    data = kept(state).to_bytes()
    restored = CurrentState()
    record = KeptState.parse(data)
    restored.restore(record.found, record.beyond, record.baseline_ms,
                     record.baseline_kind, record.last_full_ms)
    assert [c.to_json() for c in restored.findings()] == [c.to_json() for c in state.findings()]
    assert restored.counts() == state.counts() and restored.baseline() == state.baseline() == (1000, "full", 2000)


def test_a_state_too_large_to_keep_keeps_its_worst_findings_and_counts_the_rest() -> None:
    state = CurrentState()
    def pad() -> dict[str, str]:  # details that do not compress away
        return {"pad": random.randbytes(100).hex()}

    lost = [Violation(Category.NO_REPLICA_OF_AN_ENTRY, i, ("b1:3181",), pad()) for i in range(50)]
    weak = [Violation(Category.WEAK_DURABILITY_POLICY, 1000 + i, (), pad()) for i in range(50)]
    state.full_run(lost + weak, 1000, 2000)
    small = kept(state, most=60, most_bytes=1_500)  # 60 findings do not fit in 1.5 KB compressed: fewer do
    assert 0 < len(small.found) < 60 and len(small.to_bytes()) <= 1_500
    assert all(c.violation.category is Category.NO_REPLICA_OF_AN_ENTRY for c in small.found)  # the worst first
    restored = CurrentState()
    restored.restore(small.found, small.beyond, small.baseline_ms, small.baseline_kind, small.last_full_ms)
    assert restored.counts() == state.counts()  # the gauges count every finding
    restored.full_run([], 3000, 4000)
    assert restored.counts() == {}  # a full run replaces it all


def test_an_unreadable_kept_state_is_none() -> None:
    with pytest.raises(DataError):
        KeptState.parse(b"not zlib")
    with pytest.raises(DataError):
        KeptState.parse(zlib.compress(b'{"format": 99}'))


def test_what_a_look_made_while_a_full_run_ran_is_newer_than_the_run() -> None:
    """A loss continuous mode found while a full run ran (the run looked at that ledger before it) stands after the
    run; a loss a look cleared while the run ran (repaired meanwhile) is not brought back by the run's older look."""
    state = CurrentState()
    state.full_run([], 0, 500)
    lost = Violation(Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, 7, ("b1:3181",))
    repaired = Violation(Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, 8, ("b2:3181",))
    state.looked_again([8], [repaired], 900, "continuous", KIND_CATEGORIES[FULL])
    # a full run starts at 1000; at 1200 a look finds 7's loss, at 1300 another finds 8 repaired
    state.looked_again([7], [lost], 1200, "continuous", KIND_CATEGORIES[FULL])
    state.looked_again([8], [], 1300, "continuous", KIND_CATEGORIES[FULL])
    state.full_run([repaired], 1000, 2000)  # what the run saw: 7 before its loss, 8 before its repair
    assert {(str(c.violation.category), c.violation.ledger_id) for c in state.findings()} == {
        ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 7)}
    state.full_run([], 2500, 3000)  # the next run looked after: 7's loss gone since, as it says
    assert state.findings() == []


def test_a_run_says_nothing_of_the_ledgers_it_left_unsettled() -> None:
    state = CurrentState()
    lost = Violation(Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, 7, ("b1:3181",))
    state.full_run([lost], 0, 500)
    state.full_run([], 1000, 2000, unsettled={7})  # its facts kept changing, or its bookie fell silent anew
    assert [c.violation for c in state.findings()] == [lost]
    state.full_run([], 3000, 4000)
    assert state.findings() == []
