"""What continuous scrutiny's feeds named and is still to look at, each due at its time (now, after the
write-cache grace, after the lost-bookie delay), in three lanes: ledgers, bookies (every ledger of one: a
pass over the whole metadata, which a look at a few ledgers never waits for) and Pulsar's topics (a topic's
record against BookKeeper's)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LEDGERS, BOOKIES, TOPICS = LANES = ("ledgers", "bookies", "topics")


@dataclass(frozen=True)
class Due:
    at_ms: int
    why: str


class Backlog:
    """What the feeds named, each due at its time, in its lane; and how many of each are being looked at."""

    def __init__(self, pokes: dict[str, Callable[[], None]]) -> None:
        self._lock = threading.Lock()
        self._due: dict[str, dict[Any, Due]] = {lane: {} for lane in LANES}
        self._looking = dict.fromkeys(LANES, 0)
        self._pokes = pokes  # wake the loop that takes each lane

    def __len__(self) -> int:
        with self._lock:
            return sum(len(d) for d in self._due.values()) + sum(self._looking.values())

    def add(self, ledger_ids: list[int] | tuple[int, ...], at_ms: int, why: str) -> None:
        with self._lock:
            due = self._due[LEDGERS]
            for lid in ledger_ids:
                old = due.get(lid)
                due[lid] = Due(max(at_ms, old.at_ms) if old else at_ms, why)
        self._pokes[LEDGERS]()

    def add_named(self, lane: str, name: str, at_ms: int, why: str) -> None:
        """A bookie, or a topic: its look due then (as last asked)."""
        with self._lock:
            self._due[lane][name] = Due(at_ms, why)
        self._pokes[lane]()

    def forget(self, ledger_id: int) -> None:
        with self._lock:
            self._due[LEDGERS].pop(ledger_id, None)

    def first_due_ms(self, lane: str) -> int | None:
        with self._lock:
            return min((d.at_ms for d in self._due[lane].values()), default=None)

    def take(self, lane: str, now_ms: int, most: float = math.inf) -> tuple[dict[Any, Due], int]:
        """What is due now in this lane, and how many more than `most` made a mass event instead. Counted
        as being looked at until `done`."""
        with self._lock:
            waiting = self._due[lane]
            due = {k: d for k, d in waiting.items() if d.at_ms <= now_ms}
            for k in due:
                del waiting[k]
            mass = len(due) if len(due) > most else 0
            if mass:  # a rack lost: one full run, never a storm of small ones
                due = {}
            self._looking[lane] = len(due)
            return due, mass

    def done(self, lane: str) -> None:
        with self._lock:
            self._looking[lane] = 0
