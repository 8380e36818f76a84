"""When continuous scrutiny's watch saw each bookie's registration go. BookKeeper marks a lost bookie's
ledgers only after its lostBookieRecoveryDelay, so the lost-bookie check is due that long (and the grace)
after then; the times are also written where runs keep their sightings, so that a run counts the delay from
the earlier of the two. A bookie the watch saw registered again has no sighting left there: gone again, it is
judged from its new departure, never from an earlier one (each look writes what the watch saw first). A bookie
the sightings name that the watch never saw go (it went while no leader watched, or the last leader saw it) is
taken from them (`adopt`), so that it too is looked at when due, whatever this leader saw. One leadership's:
new at each election (an earlier leadership's watch may have missed the bookie's return)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from scrutiny.config import ScanSettings
from scrutiny.lostbookies import SIGHTINGS as LOST_BOOKIE_SIGHTINGS
from scrutiny.store import MetadataStore
from scrutiny.store.facts import SIGHTINGS, ClusterFacts, FactsCache

log = logging.getLogger(__name__)


class GoneBookies:
    def __init__(self, scan: ScanSettings) -> None:
        self.scan = scan
        self._lock = threading.Lock()
        self._recording = threading.Lock()  # a look in another lane waits for a record on its way
        self._gone: dict[str, int] = {}  # bookie -> when the watch saw its registration go (ms)
        self._back: set[str] = set()  # seen registered again since the last `record`: their sightings go
        self._back_at: dict[str, int] = {}  # bookie -> when the watch last saw it registered again (ms)
        self._judged_ms = 0  # when the last whole-cluster run started: a bookie due by then, it reported
        self._unrecorded = False

    def went(self, bookie: str, at_ms: int) -> None:
        with self._lock:
            self._gone.setdefault(bookie, at_ms)
            self._unrecorded = True

    def back(self, bookie: str, at_ms: int) -> None:
        with self._lock:
            self._gone.pop(bookie, None)
            self._back.add(bookie)
            self._back_at[bookie] = at_ms
            self._unrecorded = True

    def judged(self, started_ms: int) -> None:
        """A whole-cluster run started then (the election's, or one after): it judged every bookie due by then."""
        with self._lock:
            self._judged_ms = max(self._judged_ms, started_ms)

    def adopt(self, facts: ClusterFacts, now_ms: int) -> dict[str, float]:
        """The bookies the stored sightings name, unregistered, that the watch has not seen go: gone since their
        sighting (already recorded). Those a whole-cluster run judged not yet due, with the seconds until they
        are. Never one the watch saw back after its sighting: a reading of the facts may predate its return."""
        with self._lock:
            new = {b: t for b, t in facts.lost_bookie_sightings.items() if b not in facts.registered
                   and b not in self._gone and t > self._back_at.get(b, -1)}
            self._gone.update(new)
            judged = self._judged_ms
        waits = {b: self._wait(t, facts.recovery_delay, now_ms) for b, t in sorted(new.items())}
        return {b: w for b, w in waits.items() if now_ms + w * 1000 > judged}

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
        return self._wait(gone, delay, now_ms)

    def _wait(self, gone_ms: int, delay: int | None, now_ms: int) -> float:
        delay = self.scan.lost_bookie_recovery_delay if delay is None else delay
        return (gone_ms - now_ms) / 1000 + delay + self.scan.lost_bookie_grace_period + 1

    def record(self, store: MetadataStore | None, facts: FactsCache | None) -> None:
        """What the watch saw since the last call, into the sightings the looks and runs read (before a look),
        and the facts' sightings spoiled when they changed, before a look in another lane can start."""
        with self._recording:
            with self._lock:
                if not self._unrecorded or store is None:
                    return
                gone, back = dict(self._gone), set(self._back)
                self._back.clear()
                self._unrecorded = False
            written = sight_lost_bookies(store, gone, back)
            if written is None:
                with self._lock:  # the next look tries again
                    self._back |= back - self._gone.keys()
                    self._unrecorded = True
            elif written and facts is not None:
                facts.changed(SIGHTINGS)


def sight_lost_bookies(store: MetadataStore, gone: dict[str, int], back: Collection[str] = ()) -> bool | None:
    """The watch saw when each registration went (`gone`, ms), and which came back since (`back`): the
    lost-bookie sightings a run reads, so that the lost-bookie check counts its delay from the bookie's last
    departure (the earlier of the watch's time and what runs recorded since). Whether they changed; None: they
    could not be read or written."""
    try:
        seen = LOST_BOOKIE_SIGHTINGS.read(store)
        kept = {b: t for b, t in seen.items() if b not in back}
        merged = {**kept, **{b: min(t, kept.get(b, t)) for b, t in gone.items()}}
        if merged == seen:
            return False
        LOST_BOOKIE_SIGHTINGS.write(store, merged)
        return True
    except Exception as exc:  # the runs' own sightings then
        log.info("continuous scrutiny: cannot record when registrations went: %s", exc)
        return None
