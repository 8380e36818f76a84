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
        # (not before, until): how long each lane's loop planned to sleep at its last look at it; None: never looked
        self._sleeps: dict[str, tuple[float, float] | None] = dict.fromkeys(LANES)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(d) for d in self._due.values()) + sum(self._looking.values())

    def add(self, ledger_ids: list[int] | tuple[int, ...], at_ms: int, why: str) -> None:
        with self._lock:
            due = self._due[LEDGERS]
            soonest = math.inf
            for lid in ledger_ids:
                old = due.get(lid)
                due[lid] = d = Due(max(at_ms, old.at_ms) if old else at_ms, why)
                soonest = min(soonest, d.at_ms)
            sooner = self._sooner(LEDGERS, soonest)
        if sooner:
            self._pokes[LEDGERS]()

    def add_named(self, lane: str, name: str, at_ms: int, why: str) -> None:
        """A bookie, or a topic: its look due then (as last asked)."""
        with self._lock:
            self._due[lane][name] = Due(at_ms, why)
            sooner = self._sooner(lane, at_ms)
        if sooner:
            self._pokes[lane]()

    def _sooner(self, lane: str, at_ms: float) -> bool:
        """Whether the lane's loop must wake for something due then: a loop woken for every change only to
        sleep again until its planned time cost the leader a thread's wake-up per change (under the lock)."""
        sleep = self._sleeps[lane]
        return sleep is None or max(at_ms, sleep[0]) < sleep[1]

    def forget(self, ledger_id: int) -> None:
        with self._lock:
            self._due[LEDGERS].pop(ledger_id, None)

    def sleep_ms(self, lane: str, now_ms: int, not_before_ms: float) -> float | None:
        """How long the lane's loop may sleep from `now_ms`: until the first look due, not before
        `not_before_ms`; None when nothing is due (until poked). From then on an add wakes it only for a look
        due sooner than that: one it would take then anyway is found by its next call (the lock orders them)."""
        with self._lock:
            first = min((d.at_ms for d in self._due[lane].values()), default=None)
            wake = math.inf if first is None else max(first, not_before_ms)
            self._sleeps[lane] = (not_before_ms, wake)
            return None if first is None else wake - now_ms

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
