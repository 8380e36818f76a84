"""What every range of one run needs, shipped once per job to the executors: the run's settings and facts, the
pass it is, the ledgers whose bookies were silent at the last look."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from scrutiny.checks import (
    BookieAnswer,
    DeepAnswer,
    deep_slice_key,
    in_deep_slice,
)
from scrutiny.config import ScanSettings
from scrutiny.lostbookies import LostBookies
from scrutiny.metadata import LedgerMetadata

LEDGER_COUNTERS = ("seen", "checked", "skipped_open", "skipped_empty", "skipped_underreplicated",
                   "deleted_during_run")


Answers = Mapping[str, Mapping[int, BookieAnswer]]  # bookie -> ledger -> what it said
DeepAnswers = Mapping[str, Mapping[int, DeepAnswer]]  # bookie -> ledger -> its deep scrub


class Pass(enum.Enum):
    FIRST = "first"  # a bookie that does not answer makes the ledger potentially faulty
    FINAL = "final"  # a delayed re-check: silent at this look and the one before, and registered = BOOKIE_UNAVAILABLE


@dataclass(frozen=True, eq=False)
class Silences:
    """Ledger -> the bookies silent about it at a look. A lost rack silences millions of ledgers with
    a few distinct sets of bookies: sorted ids and an index into those sets (about 12 bytes a ledger
    in the driver, and as few in the closure each pass ships), not a dict of tuples (about 200)."""

    ledger_ids: np.ndarray  # int64, ascending
    which: np.ndarray  # int32: the index of each ledger's set in `bookies`
    bookies: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, silent: Mapping[int, tuple[str, ...]]) -> Silences:
        ids = np.fromiter(silent, np.int64, len(silent))
        sets: dict[tuple[str, ...], int] = {}
        which = np.fromiter((sets.setdefault(b, len(sets)) for b in silent.values()), np.int32, len(silent))
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], which[order], tuple(sets))

    def plus(self, more: Mapping[int, tuple[str, ...]]) -> Silences:
        """These silences and `more`; for a ledger in both, the one in `more`."""
        if not more:
            return self
        other = Silences.of(more)
        ids = np.concatenate([self.ledger_ids, other.ledger_ids])
        which = np.concatenate([self.which, other.which + len(self.bookies)])
        last = len(ids) - 1 - np.unique(ids[::-1], return_index=True)[1]  # each ledger's last, ascending
        return Silences(ids[last], which[last], self.bookies + other.bookies)

    def get(self, ledger_id: int) -> tuple[str, ...]:
        i = int(np.searchsorted(self.ledger_ids, ledger_id))
        return self.bookies[self.which[i]] if i < len(self.ledger_ids) and self.ledger_ids[i] == ledger_id else ()

    def silent(self) -> set[str]:
        """Every bookie silent about some ledger."""
        return {b for i in np.unique(self.which).tolist() for b in self.bookies[i]}

    def __len__(self) -> int:
        return len(self.ledger_ids)

    def __iter__(self) -> Iterator[int]:
        for i in range(0, len(self.ledger_ids), 10_000):  # never a million Python ints at once
            yield from self.ledger_ids[i:i + 10_000].tolist()


NO_SILENCES = Silences.of({})


@dataclass(frozen=True)
class RunContext:
    """Everything an executor needs, shipped once per job."""

    settings: ScanSettings
    locations: Mapping[str, str]
    marked: Mapping[int, tuple[str, ...]]  # ledgers marked under-replicated -> the bookies each mark names
    agent_addresses: Mapping[str, str]
    now_ms: int
    only_bookies: frozenset[str] = frozenset()  # scope: only ledgers whose ensembles contain one of these
    placement: bool = True
    without: frozenset[str] = frozenset()  # a what-if: these bookies down (their copies gone)
    blast_radius: bool = False  # count, per bookie and per rack, what would fall below AQ without it
    holdings: bool = False  # the reverse check: bring back every ledger id enumerated (the first pass)
    pulsar: bool = False  # bring back each ledger in brief (`BookKeeperLedgers`), to hold Pulsar's record against
    lost: LostBookies | None = None  # is anybody repairing the ledgers of bookies gone from the registrations?
    scrub: frozenset[int] = frozenset()  # a run that is not deep: these ledgers scrubbed all the same
    # FINAL passes only:
    lost_bookies: frozenset[str] = frozenset()  # unregistered at every look: their copies are gone
    registered: frozenset[str] = frozenset()  # registered now
    silent_before: Silences = NO_SILENCES  # per ledger, at the last look

    def scrubs(self, md: LedgerMetadata) -> bool:
        """Are the ledger's stored copies read (the deep scrub)? A deep run's slice, else those asked for."""
        s = self.settings
        if md.last_entry_id < 0:
            return False
        return in_deep_slice(deep_slice_key(md), s.deep_slices, s.deep_slice) if s.deep else md.ledger_id in self.scrub

