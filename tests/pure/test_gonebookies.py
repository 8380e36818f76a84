"""When continuous scrutiny takes a bookie for gone (`scrutiny.auditor.gonebookies`): from its own watch, or from
the sightings the runs and the last leaders recorded (pure logic; end to end in test_continuous)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from scrutiny.auditor.gonebookies import GoneBookies
from scrutiny.config import ScanSettings
from scrutiny.metadata import BookieRegistration
from scrutiny.store import Registrations
from scrutiny.store.facts import ClusterFacts

DELAY, GRACE = 60, 10
SCAN = ScanSettings(metadata_service_uri="zk://127.0.0.1:2181/ledgers", lost_bookie_grace_period=GRACE)


def facts(sightings: Mapping[str, int], registered: Collection[str] = ()) -> ClusterFacts:
    return ClusterFacts(Registrations({b: BookieRegistration(b, False) for b in registered}, {}, frozenset()), {},
                        DELAY, False, sightings)


def due_in(sighted_ms: int, now_ms: int) -> float:
    return (sighted_ms - now_ms) / 1000 + DELAY + GRACE + 1


def test_a_sighted_bookie_the_watch_never_saw_go_is_adopted_with_its_sighting() -> None:
    g = GoneBookies(SCAN)
    g.went("seen", 5_000)
    adopted = g.adopt(facts({"sighted": 1_000, "seen": 2_000, "registered": 1_000}, {"registered"}), 3_000)
    assert adopted == {"sighted": due_in(1_000, 3_000)}  # the watch's own time stands; a registered one is not gone
    assert g.among({"sighted", "seen", "registered"}) == {"sighted", "seen"}
    assert g.until_due("sighted", 3_000, None) == 0.0  # (no facts: the run says)
    assert g.adopt(facts({"sighted": 1_000}), 3_000) == {}  # once


def test_a_bookie_a_whole_cluster_run_judged_due_is_that_runs_to_report() -> None:
    g = GoneBookies(SCAN)
    sighted = 1_000
    due_ms = sighted + (DELAY + GRACE + 1) * 1000
    g.judged(due_ms + 1)  # the run started once it was due: it found it
    assert g.adopt(facts({"b": sighted}), due_ms + 5_000) == {}
    assert g.among({"b"}) == {"b"}
    g = GoneBookies(SCAN)
    g.judged(due_ms - 1)  # ... before: not yet due then, looked at when due (at once, now)
    assert g.adopt(facts({"b": sighted}), due_ms + 5_000) == {"b": due_in(sighted, due_ms + 5_000)}


def test_a_sighting_older_than_the_watchs_return_is_stale() -> None:
    g = GoneBookies(SCAN)
    g.went("b", 1_000)
    g.back("b", 3_000)
    # a reading of the facts from before its return still names it: not gone
    assert g.adopt(facts({"b": 1_000}), 3_500) == {} and g.among({"b"}) == set()
    assert list(g.adopt(facts({"b": 4_000}), 4_500)) == ["b"]  # sighted gone again since: gone
