"""When continuous scrutiny takes a bookie for gone (`scrutiny.auditor.gonebookies`): from its own watch, or from
the sightings the runs and the last leaders recorded (pure logic; end to end in test_continuous)."""

from __future__ import annotations

from scrutiny.auditor.gonebookies import GoneBookies
from scrutiny.config import ScanSettings

SCAN = ScanSettings(metadata_service_uri="zk://127.0.0.1:2181/ledgers")


def test_a_sighted_bookie_the_watch_never_saw_go_is_adopted_with_its_sighting() -> None:
    g = GoneBookies(SCAN)
    g.went("seen", 5_000)
    adopted = g.adopt({"sighted": 1_000, "seen": 2_000, "registered": 1_000}, registered={"registered"})
    assert adopted == ["sighted"]  # the watch's own time stands for "seen"; a registered bookie is not gone
    assert g.among({"sighted", "seen", "registered"}) == {"sighted", "seen"}
    assert g.adopt({"sighted": 1_000}, registered=()) == []  # once


def test_a_sighting_older_than_the_watchs_return_is_stale() -> None:
    g = GoneBookies(SCAN)
    g.went("b", 1_000)
    g.back("b", 3_000)
    # a reading of the facts from before its return still names it: not gone
    assert g.adopt({"b": 1_000}, registered=()) == [] and g.among({"b"}) == set()
    assert g.adopt({"b": 4_000}, registered=()) == ["b"]  # sighted gone again since: gone
