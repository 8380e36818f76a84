"""The cluster's facts a decision rests on (`scrutiny.store.facts`): one reading, and the leader's cache of it
between changes, pure logic over a stand-in store; the watch that spoils the cache is tested end to end in
test_continuous."""

from __future__ import annotations

import threading
from typing import Any, cast

from scrutiny.lostbookies import sightings_to_bytes
from scrutiny.store import MetadataStore
from scrutiny.store.facts import AGENTS, PARTS, REGISTRATIONS, REPLICATION, SIGHTINGS, ClusterFacts, FactsCache


class Store:
    def __init__(self) -> None:
        self.reads: list[str] = []
        self.during_read: Any = None  # something that happens while a read is on its way

    def registrations(self) -> str:
        self.reads.append("registrations")
        if self.during_read:
            self.during_read()
        return f"registrations #{len(self.reads)}"

    def agent_addresses(self) -> dict[str, str]:
        self.reads.append("agents")
        return {"b1": f"a{len(self.reads)}"}

    def lost_bookie_recovery_delay(self) -> int:
        self.reads.append("delay")
        return 30

    def replication_disabled(self) -> bool:
        self.reads.append("disabled")
        return False

    def auditor_record(self, name: str) -> bytes | None:
        assert name == "lost-bookie-sightings"
        self.reads.append("sightings")
        return sightings_to_bytes({"b2": len(self.reads)})


EVERY_READ = ["registrations", "agents", "delay", "disabled", "sightings"]


def cached() -> tuple[FactsCache, Store]:
    s = Store()
    return FactsCache(cast(MetadataStore, s)), s


def test_a_reading_reads_every_fact_once() -> None:
    s = Store()
    facts = ClusterFacts.read(cast(MetadataStore, s))
    assert (facts.registrations, facts.agent_addresses, facts.recovery_delay, facts.replication_disabled,
            facts.lost_bookie_sightings) == ("registrations #1", {"b1": "a2"}, 30, False, {"b2": 5})
    assert s.reads == EVERY_READ


def test_each_part_is_read_once_until_it_changed() -> None:
    c, s = cached()
    assert c.facts() == c.facts() and c.facts().registrations == "registrations #1"
    assert s.reads == EVERY_READ and c.reads == dict.fromkeys(PARTS, 1)
    c.changed(REGISTRATIONS)  # only what changed is read again
    assert c.facts().registrations == "registrations #6" and s.reads[5:] == ["registrations"]
    c.changed(REPLICATION)
    c.facts()
    assert s.reads[6:] == ["delay", "disabled"]
    c.changed(SIGHTINGS)  # the leader recorded them
    assert c.facts().lost_bookie_sightings == {"b2": 9} and s.reads[8:] == ["sightings"]
    c.changed()  # a gap: every part
    c.facts()
    assert s.reads[9:] == EVERY_READ
    assert c.reads == {REGISTRATIONS: 3, AGENTS: 2, REPLICATION: 3, SIGHTINGS: 3}


def test_a_read_that_raced_a_change_is_used_once_but_not_kept() -> None:
    c, s = cached()
    s.during_read = lambda: c.changed(REGISTRATIONS)  # the watch reports a change while the read is out
    assert c.facts().registrations == "registrations #1"
    s.during_read = None
    c.facts()
    c.facts()
    assert s.reads.count("registrations") == 2 and s.reads.count("agents") == 1


def test_nothing_is_kept_when_unwatched() -> None:
    c, s = cached()
    c.keeping = False
    c.facts()
    c.facts()
    assert s.reads == EVERY_READ * 2


def test_readings_from_many_threads_are_each_whole() -> None:
    c, _ = cached()
    seen: list[ClusterFacts] = []

    def reader() -> None:
        for _ in range(200):
            seen.append(c.facts())
            c.changed(REGISTRATIONS)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 800 and all(f.registrations.startswith("registrations #") and f.recovery_delay == 30
                                    for f in seen)
