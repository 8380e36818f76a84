"""A finding: a category, a ledger, the bookies it names, its details, and its owner."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scrutiny.categories import Category
from scrutiny.codec import (
    runs_of,
)
from scrutiny.pulsar.owners import UNKNOWN, Owner

MAX_DETAIL_RANGES = 50


@dataclass(frozen=True)
class Violation:
    category: Category
    ledger_id: int
    bookies: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)
    # The metadata znode version the finding was computed from (for the re-read before reporting).
    metadata_version: int = -1
    owner: Owner | None = None  # the Pulsar topic (cursor, ...) the ledger belongs to; None: not known yet

    def to_json(self) -> dict[str, Any]:
        return {"category": str(self.category), "ledger_id": self.ledger_id, "bookies": list(self.bookies),
                "details": dict(self.details), "owner": (self.owner or UNKNOWN).to_json()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Violation:
        """As `to_json` wrote it (an unknown category or a missing field raises ValueError or KeyError)."""
        return cls(Category(doc["category"]), int(doc["ledger_id"]), tuple(doc.get("bookies", ())),
                   doc.get("details", {}), owner=Owner.from_json(doc.get("owner", {})))


def id_ranges(ids: np.ndarray, limit: int = MAX_DETAIL_RANGES) -> list[list[int]]:
    """Sorted unique ids as [first, last] runs (at most `limit`)."""
    starts, sizes = runs_of(ids)
    return [[int(s), int(s + n - 1)] for s, n in zip(starts[:limit], sizes[:limit], strict=True)]

