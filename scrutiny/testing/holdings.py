"""What a test bookie holds, in memory and changing as the test says (an agent's entry source)."""

from __future__ import annotations

import threading

import numpy as np

from scrutiny import codec
from scrutiny.changefeed import Change, Kind
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.entrysources import Holding
from scrutiny.metadata import LedgerMetadata


class MutableHoldings:
    """A bookie's holdings that change while its agent serves them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ledgers: dict[int, np.ndarray] = {}
        self._gone: list[int] = []  # dropped since the last look (`changes`)
        self._wiped = False

    def put(self, ledger_id: int, entry_ids: np.ndarray) -> None:
        with self._lock:
            old = self._ledgers.get(ledger_id)
            self._ledgers[ledger_id] = entry_ids if old is None else np.union1d(old, entry_ids)

    def lose(self, ledger_id: int, entry_ids: np.ndarray) -> None:
        """Entries gone from a ledger the bookie still lists, leaving nothing a change feed reports (a damaged
        `locations` index, say): only a run that asks finds it."""
        with self._lock:
            self._ledgers[ledger_id] = np.setdiff1d(self._ledgers[ledger_id], entry_ids)

    def drop(self, ledger_id: int) -> None:
        with self._lock:
            if self._ledgers.pop(ledger_id, None) is not None:
                self._gone.append(ledger_id)

    def wipe(self) -> None:
        """The bookie back empty (a disk replaced, the bookie formatted again under its id): what a
        DbLedgerStorage agent sees of its index emptied, every ledger it held gone and a reset."""
        with self._lock:
            self._gone = sorted({*self._gone, *self._ledgers})
            self._ledgers.clear()
            self._wiped = True

    index_passes = 0  # what it holds is known without reading it whole

    def changes(self) -> tuple[list[Change], int]:
        """What a DbLedgerStorage agent would see since the last look: the drops (LEDGERS_GONE), a wipe
        (BOOKIE_RESET)."""
        with self._lock:
            gone, self._gone = sorted(self._gone), []
            wiped, self._wiped = self._wiped, False
        found = [Change(Kind.BOOKIE_RESET, detail="back empty", every_ledger=True)] if wiped else []
        return found + ([Change(Kind.LEDGERS_GONE, tuple(gone), "dropped")] if gone else []), len(gone)

    def unwatched(self) -> None:
        """Nobody follows: what happened meanwhile is forgotten."""
        with self._lock:
            self._gone, self._wiped = [], False

    def refresh(self) -> None:
        pass

    def availability(self, ledger_id: int) -> Holding | None:
        with self._lock:
            ids = self._ledgers.get(ledger_id)
        return None if ids is None else Holding(codec.encode(ids))

    def held(self, ledger_id: int) -> np.ndarray:
        """The entries of the ledger it holds (none: empty)."""
        with self._lock:
            return self._ledgers.get(ledger_id, np.array([], dtype=np.int64))

    def list_ledgers(self, from_id: int, limit: int) -> tuple[np.ndarray, bool]:
        with self._lock:
            ids = sorted(lid for lid in self._ledgers if lid >= from_id)
        return np.array(ids[:limit], dtype=np.int64), len(ids) <= limit

    def close(self) -> None:
        pass


def share(md: LedgerMetadata, bookie: str) -> np.ndarray:
    return Availability.of(expected_share(md, bookie)).entry_ids()

