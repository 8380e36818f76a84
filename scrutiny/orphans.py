"""The reverse check: ledgers a bookie holds that the metadata does not have (ORPHAN_LEDGER).

A deleted ledger stays on its bookies until their garbage collector runs (`gcWaitTime`, 15 minutes by
default), so "held but absent from the metadata" is normal for a while. Nothing records when a ledger's
metadata went away: what scrutiny knows is when it first saw the ledger held and absent. `Sightings` keeps
that per (bookie, ledger), from run to run (the auditor stores it beside its other state); a ledger is an
orphan once it has been seen held and absent for longer than the grace period, is still absent when read
again, and is still held when its bookie is asked again. First-seen is never earlier than the deletion,
so a ledger is never reported early. Pure: the store and the agents are the driver's.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.errors import DataError
from scrutiny.records import LeaderRecord

FORMAT = 1
# At most this many (bookie, ledger) sightings are kept (a stuck garbage collector can leave millions):
# the oldest, which are the next to be reported; the rest are seen again by later runs.
MAX_SIGHTINGS = 200_000


@dataclass(frozen=True)
class Sightings:
    """bookie -> ledger -> when it was first seen held by that bookie and absent from the metadata (ms)."""

    first_seen: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    untracked: int = 0  # candidates left out by MAX_SIGHTINGS at the last update

    def __len__(self) -> int:
        return sum(len(per) for per in self.first_seen.values())

    def seen(self, absent: Mapping[str, Iterable[int]], now_ms: int, most: int = MAX_SIGHTINGS) -> Sightings:
        """After a run that listed the bookies in `absent` (each with the ledgers it holds that the metadata
        does not have, read again): a ledger keeps its first sighting while it stays held and absent, a new
        one is first seen now, any other is forgotten. Bookies not listed this time keep theirs."""
        rows = [(t, b, lid) for b, per in self.first_seen.items() if b not in absent for lid, t in per.items()]
        for b, ledgers in absent.items():
            before = self.first_seen.get(b, {})
            rows += [(before.get(lid, now_ms), b, lid) for lid in ledgers]
        rows.sort()
        out: dict[str, dict[int, int]] = {}
        for t, b, lid in rows[:most]:
            out.setdefault(b, {})[lid] = t
        return Sightings(out, max(0, len(rows) - most))

    def due(self, grace_ms: int, now_ms: int) -> dict[str, dict[int, int]]:
        """The sightings at least as old as the grace period: bookie -> ledger -> first seen."""
        return {b: old for b, per in self.first_seen.items()
                if (old := {lid: t for lid, t in per.items() if now_ms - t >= grace_ms})}

    def to_bytes(self) -> bytes:
        """Compact: per bookie, the ledgers first seen at each time, as ascending id deltas; zlib."""
        bookies: dict[str, dict[str, list[int]]] = {}
        for b, per in sorted(self.first_seen.items()):
            at: dict[int, list[int]] = {}
            for lid, t in per.items():
                at.setdefault(t, []).append(lid)
            bookies[b] = {str(t): np.diff(np.array(sorted(ids), dtype=np.int64), prepend=0).tolist()
                          for t, ids in sorted(at.items())}
        doc = {"format": FORMAT, "untracked": self.untracked, "bookies": bookies}
        return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)

    @classmethod
    def parse(cls, data: bytes, where: str) -> Sightings:
        """Stored sightings; DataError naming `where` and what is wrong otherwise."""
        try:
            doc = json.loads(zlib.decompress(data))
        except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{where}: not zlib-compressed JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise DataError(f"{where}: not format {FORMAT}")
        out: dict[str, dict[int, int]] = {}
        try:
            for b, at in _mapping(doc.get("bookies", {})).items():
                for t, deltas in _mapping(at).items():
                    if not isinstance(deltas, list) or not all(isinstance(d, int) and d >= 0 for d in deltas):
                        raise ValueError(f"bookie {b}: ledger ids are not non-negative deltas")
                    first_seen = int(t)
                    out.setdefault(str(b), {}).update(dict.fromkeys(np.cumsum(deltas).tolist(), first_seen))
            untracked = int(doc.get("untracked", 0))
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: {exc}") from None
        return cls(out, untracked)


SIGHTINGS = LeaderRecord("orphan-sightings", lambda data: Sightings.parse(data, "the stored orphan sightings"),
                         Sightings.to_bytes, Sightings, "every orphan candidate is sighted anew")


@dataclass(frozen=True, slots=True)
class LedgerIds:
    """The ledger ids one range enumerated, compactly: a range's ids are dense (a hierarchical bucket holds
    up to 10,000 consecutive ids), so a bitmap over their span costs about a bit a ledger, where the ids
    themselves would cost 64. Ids too sparse for a bitmap are kept as they are."""

    first: int
    last: int
    bits: np.ndarray | None = None  # bit i: ledger first + i was enumerated
    ids: np.ndarray | None = None  # ascending, when sparse

    @classmethod
    def of(cls, ids: np.ndarray) -> LedgerIds:
        if not ids.size:
            return cls(0, -1, ids=ids)
        first, last = int(ids[0]), int(ids[-1])
        if last - first + 1 > 64 * ids.size:
            return cls(first, last, ids=ids)
        present = np.zeros(last - first + 1, dtype=bool)
        present[ids - first] = True
        return cls(first, last, bits=np.packbits(present))

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Which of these ids were enumerated."""
        inside = (ids >= self.first) & (ids <= self.last)
        if self.bits is None:
            if self.ids is None or not self.ids.size:
                return np.zeros(ids.size, dtype=bool)
            at = np.minimum(np.searchsorted(self.ids, ids), self.ids.size - 1)
            return inside & (self.ids[at] == ids)
        offset = np.where(inside, ids - self.first, 0)
        return inside & (((self.bits[offset >> 3] >> (7 - (offset & 7))) & 1) == 1)


def not_enumerated(held: np.ndarray, enumerated: Iterable[LedgerIds]) -> np.ndarray:
    """The ledger ids in `held` (ascending) that no range enumerated."""
    missing = np.ones(held.size, dtype=bool)
    for rng in enumerated:
        lo, hi = np.searchsorted(held, [rng.first, rng.last + 1])
        if hi > lo:
            missing[lo:hi] &= ~rng.contains(held[lo:hi])
    return held[missing]


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a map, got {type(value).__name__}")
    return value


def orphan(ledger_id: int, held_by: Mapping[str, Mapping[str, int]], first_seen_ms: int, now_ms: int,
           grace_seconds: int, iso: str) -> Violation:
    """ORPHAN_LEDGER: the ledger, each bookie that holds it with its entries (and bytes where known), and
    since when it has been seen absent from the metadata (`iso`: that time, as the report writes times)."""
    details = {"held_by": {b: dict(h) for b, h in sorted(held_by.items())}, "absent_since": iso,
               "absent_seconds": (now_ms - first_seen_ms) // 1000, "grace_period_seconds": grace_seconds}
    return Violation(Category.ORPHAN_LEDGER, ledger_id, tuple(sorted(held_by)), details)
