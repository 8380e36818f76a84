"""What changed in what a bookie holds, as its agent sees it (continuous scrutiny, the bookie's side).

The agent looks at its bookie at every catch-up (`watch_interval_seconds`) and appends what it finds to a
`ChangeFeed`: ledgers gone from the bookie's `ledgers` index, an entry log gone while the index still
points into it (the class of apache/bookkeeper #4607), the bookie back empty or as another instance. A
change is a reason to look again at some ledgers, never a finding: the auditor runs BP-34's steps on them
(the metadata says whether the bookie should hold them). Changes carry a sequence number within one feed
(`feed_id`: the agent process); a reader resumes after the last one it saw, and a reader whose cursor
names another feed, or changes no longer kept, is told it has a gap (then only a full look is safe).
Pure but for its lock: the sources find the changes, the agent serves the feed.
"""

from __future__ import annotations

import enum
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MOST_LEDGER_IDS = 1_000_000  # kept across the kept changes (8 MB): older changes are dropped first
IDS_PER_CHANGE = 10_000


class Kind(enum.StrEnum):
    LEDGERS_GONE = "LEDGERS_GONE"  # left the `ledgers` index: deleted by the bookie (GC), or lost
    ENTRY_LOG_GONE = "ENTRY_LOG_GONE"  # an entry log removed while these ledgers' locations still point into it
    BOOKIE_RESET = "BOOKIE_RESET"  # back empty, or another instance (cookie, index wiped): every ledger


@dataclass(frozen=True)
class Change:
    kind: Kind
    ledger_ids: tuple[int, ...] = ()
    detail: str = ""
    entry_log: int = -1
    every_ledger: bool = False  # which ledgers is unknown: every ledger the bookie should hold is to be looked at


@dataclass(frozen=True)
class Event:
    sequence: int
    observed_ms: int
    change: Change


def split(change: Change, most: int = IDS_PER_CHANGE) -> list[Change]:
    """A change with many ledgers as several, each with at most `most` (a stream message stays small)."""
    ids = change.ledger_ids
    if len(ids) <= most:
        return [change]
    return [Change(change.kind, ids[i:i + most], change.detail, change.entry_log, change.every_ledger)
            for i in range(0, len(ids), most)]


class ChangeFeed:
    """The changes one agent has seen, numbered from 1, the newest kept (at most MOST_LEDGER_IDS ledger ids)."""

    def __init__(self, clock: Callable[[], float] = time.time, most_ids: int = MOST_LEDGER_IDS) -> None:
        self.feed_id = uuid.uuid4().hex[:16]
        self._clock, self._most = clock, most_ids
        self._events: deque[Event] = deque()
        self._ids = 0
        self._last = 0
        self._closed = False
        self._changed = threading.Condition()

    @property
    def last(self) -> int:
        return self._last

    def append(self, changes: Iterable[Change]) -> None:
        now = int(self._clock() * 1000)
        with self._changed:
            for part in (p for c in changes for p in split(c)):
                self._last += 1
                self._events.append(Event(self._last, now, part))
                self._ids += len(part.ledger_ids)
            while self._ids > self._most and len(self._events) > 1:
                self._ids -= len(self._events.popleft().change.ledger_ids)
            self._changed.notify_all()

    def since(self, feed_id: str, after: int) -> tuple[list[Event], bool]:
        """The changes after `after`, and whether the reader missed some: its cursor names another feed
        (this agent restarted), or changes after it are no longer kept, or it is ahead of this feed."""
        with self._changed:
            first = self._events[0].sequence if self._events else self._last + 1
            if not (feed_id or after):  # a first reader: what is kept, and it has missed nothing
                return list(self._events), False
            if feed_id != self.feed_id:
                return list(self._events), True
            gap = after < first - 1 or after > self._last
            return [e for e in self._events if e.sequence > after] if not gap else list(self._events), gap

    def renew(self) -> None:
        """A new feed: what was kept goes, and a reader resuming from this one is told it missed changes (the
        agent stopped watching for a while). Sequence numbers go on growing."""
        with self._changed:
            self.feed_id = uuid.uuid4().hex[:16]
            self._events.clear()
            self._ids = 0

    def close(self) -> None:
        """No reader waits any more (the agent is stopping)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait(self, after: int, timeout: float) -> bool:
        """Until there is a change after `after` (True), or `timeout` seconds, or the feed is closed."""
        with self._changed:
            return self._changed.wait_for(lambda: self._last > after or self._closed, timeout) and not self._closed
