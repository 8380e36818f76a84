"""What continuous scrutiny's looks keep between changes (`scrutiny.auditor.watchedstore`): pure logic
over a stand-in store; the watch that invalidates it is tested end to end in test_continuous."""

from __future__ import annotations

import threading
from typing import Any, cast

from scrutiny.auditor.watchedstore import AGENTS, FACTS, REGISTRATIONS, WatchedStore
from scrutiny.store import MetadataStore


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

    def ledger_ranges(self) -> str:
        return "not kept"


def watched() -> tuple[WatchedStore, Store]:
    s = Store()
    return WatchedStore(cast(MetadataStore, s)), s


def test_each_fact_is_read_once_until_it_changed_and_the_rest_goes_to_the_store() -> None:
    w, s = watched()
    assert w.registrations() == w.registrations() == "registrations #1"
    assert w.lost_bookie_recovery_delay() == 30 and not w.replication_disabled()
    w.lost_bookie_recovery_delay()
    w.replication_disabled()
    assert s.reads == ["registrations", "delay", "disabled"] and w.kept() == set(FACTS) - {AGENTS}
    w.changed(REGISTRATIONS)  # only what changed is read again
    assert w.registrations() == "registrations #4" and w.lost_bookie_recovery_delay() == 30
    assert s.reads[3:] == ["registrations"]
    w.changed()  # a gap: everything
    assert w.kept() == set()
    assert w.ledger_ranges() == "not kept"


def test_a_read_that_raced_a_change_is_used_once_but_not_kept() -> None:
    w, s = watched()
    s.during_read = lambda: w.changed(REGISTRATIONS)  # the watch reports a change while the read is out
    assert w.registrations() == "registrations #1" and REGISTRATIONS not in w.kept()
    s.during_read = None
    w.registrations()
    w.registrations()
    assert s.reads == ["registrations"] * 2


def test_the_agents_addresses_are_a_copy_and_nothing_is_kept_when_unwatched() -> None:
    w, s = watched()
    got = w.agent_addresses()
    got["b1"] = "mine"
    assert w.agent_addresses() == {"b1": "a1"}
    w.keeping = False
    w.changed()
    w.registrations()
    w.registrations()
    assert s.reads == ["agents", "registrations", "registrations"] and w.kept() == set()


def test_reads_from_many_threads_each_see_a_whole_value() -> None:
    w, _ = watched()
    seen: list[Any] = []

    def reader() -> None:
        for _ in range(200):
            seen.append(w.registrations())
            w.changed(REGISTRATIONS)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 800 and all(v.startswith("registrations #") for v in seen)
