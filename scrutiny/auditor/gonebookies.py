"""When continuous scrutiny's watch saw each bookie's registration go. BookKeeper marks a lost bookie's
ledgers only after its lostBookieRecoveryDelay, so the lost-bookie check is due that long (and the grace)
after then; the times are also written where runs keep their sightings, so that a run counts the delay from
the earlier of the two."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from scrutiny.config import ScanSettings
from scrutiny.lostbookies import SIGHTINGS as LOST_BOOKIE_SIGHTINGS
from scrutiny.store import MetadataStore
from scrutiny.store.facts import FactsCache

log = logging.getLogger(__name__)


class GoneBookies:
    def __init__(self, scan: ScanSettings) -> None:
        self.scan = scan
        self._lock = threading.Lock()
        self._gone: dict[str, int] = {}  # bookie -> when the watch saw its registration go (ms)

    def went(self, bookie: str, at_ms: int) -> None:
        with self._lock:
            self._gone.setdefault(bookie, at_ms)

    def back(self, bookie: str) -> None:
        with self._lock:
            self._gone.pop(bookie, None)

    def among(self, bookies: Collection[str]) -> set[str]:
        with self._lock:
            return set(bookies) & self._gone.keys()

    def until_due(self, bookie: str, now_ms: int, facts: FactsCache | None) -> float:
        """Seconds until the lost-bookie check is due for this bookie (0: due, or not gone): the cluster's
        lostBookieRecoveryDelay when it has one, as a run reads it, and the grace."""
        with self._lock:
            gone = self._gone.get(bookie)
        if gone is None or facts is None:
            return 0.0
        try:
            delay = facts.facts().recovery_delay
        except Exception:  # the run itself will say whether it is due
            return 0.0
        delay = self.scan.lost_bookie_recovery_delay if delay is None else delay
        return (gone - now_ms) / 1000 + delay + self.scan.lost_bookie_grace_period + 1

    def record(self, store: MetadataStore | None) -> None:
        with self._lock:
            gone = dict(self._gone)
        if gone and store is not None:
            sight_lost_bookies(store, gone)


def sight_lost_bookies(store: MetadataStore, gone: dict[str, int]) -> None:
    """The watch saw when each registration went (`gone`, ms): the lost-bookie sightings a run reads (the
    earlier of that and what runs recorded), so that the lost-bookie check counts its delay from then."""
    try:
        seen = LOST_BOOKIE_SIGHTINGS.read(store)
        merged = {**seen, **{b: min(t, seen.get(b, t)) for b, t in gone.items()}}
        if merged != seen:
            LOST_BOOKIE_SIGHTINGS.write(store, merged)
    except Exception as exc:  # the runs' own sightings then: later, never early
        log.info("continuous scrutiny: cannot record when registrations went: %s", exc)
