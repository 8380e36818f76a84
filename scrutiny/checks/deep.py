"""The deep scrub's check: copies whose stored bytes do not verify (corrupt) or differ from the others'
(divergent), from what each agent read of its entry logs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from scrutiny import entrylog
from scrutiny.categories import Category
from scrutiny.checks.answers import BookieAnswer
from scrutiny.checks.violation import Violation, id_ranges
from scrutiny.codec import (
    Availability,
    groups_of,
)
from scrutiny.metadata import (
    LedgerMetadata,
)
from scrutiny.pulsar.entry import LedgerEnvelopes


@dataclass(frozen=True, slots=True)
class DeepAnswer:
    """One bookie's deep scrub of one ledger: the entries whose stored bytes verified (with a short
    hash of each payload), and those that failed; `verified` None when it could not be done."""

    verified: np.ndarray | None = None
    payload_hashes: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))
    corrupt: tuple[tuple[int, str, str], ...] = ()  # (entry id, reason, detail)
    bytes_read: int = 0
    digest_checked: bool = True
    reason: str = ""  # why not verified
    envelopes: LedgerEnvelopes | None = None  # a Pulsar topic's ledger: the verified entries' envelopes


def in_deep_slice(ledger_id: int, slices: int, slice_: int) -> bool:
    """Is the ledger in this slice of a deep pass? Ids mixed first: consecutive ledgers spread evenly."""
    return slices <= 1 or (((ledger_id * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> 32) % slices == slice_


def check_deep(md: LedgerMetadata, deep: Mapping[str, DeepAnswer]) -> list[Violation]:
    """CORRUPT_ENTRY: copies whose stored bytes are not the entry; DIVERGENT_COPIES: verified copies of
    one entry whose payloads differ (copies may differ in their header, never in their payload)."""
    out: list[Violation] = []
    corrupt = {b: a.corrupt for b, a in sorted(deep.items()) if a.corrupt}
    if corrupt:
        copies = {}
        for b, bad in corrupt.items():
            ids = np.array(sorted(e for e, _, _ in bad), dtype=np.int64)
            copies[b] = {"entries": id_ranges(ids), "count": len(bad),
                         "reasons": dict(Counter(r for _, r, _ in bad)), "example": f"entry {bad[0][0]}: {bad[0][2]}"}
        out.append(Violation(Category.CORRUPT_ENTRY, md.ledger_id, tuple(corrupt), {"copies": copies},
                             md.znode_version))
    held = [(b, a.verified, a.payload_hashes) for b, a in sorted(deep.items())
            if a.verified is not None and a.verified.size]
    if len(held) >= 2:
        ids = np.concatenate([v for _, v, _ in held])
        hashes = np.concatenate([h for _, _, h in held])
        who = np.repeat(np.arange(len(held)), [v.size for _, v, _ in held])
        order = np.lexsort((hashes, ids))
        ids, hashes, who = ids[order], hashes[order], who[order]
        same_entry = ids[1:] == ids[:-1]
        differ = same_entry & (hashes[1:] != hashes[:-1])
        if differ.any():
            bad_ids = np.unique(ids[1:][differ])
            first = int(bad_ids[0])
            at = ids == first
            by_hash: dict[str, list[str]] = {}
            for h, w in zip(hashes[at], who[at], strict=True):
                by_hash.setdefault(f"{int(h):016x}", []).append(held[int(w)][0])
            bookies = sorted({held[int(w)][0] for w in who[np.isin(ids, bad_ids)]})
            out.append(Violation(Category.DIVERGENT_COPIES, md.ledger_id, tuple(bookies),
                                 {"entries": id_ranges(bad_ids), "count": int(bad_ids.size),
                                  "first_entry_copies": by_hash}, md.znode_version))
    return out


# Why a copy is corrupt, where the bookie still serves it: its digest fails, which only a client checks. Every
# other reason (its entry log gone, cut short, another entry at its location) fails the bookie's own read.
SERVED_REASONS = frozenset({entrylog.BAD_DIGEST})


def served_corrupt(deep: DeepAnswer) -> list[int]:
    """The corrupt copies the bookie serves all the same (BookKeeper's checker reads them back)."""
    return sorted(e for e, reason, _ in deep.corrupt if reason in SERVED_REASONS)


def without_corrupt(answer: BookieAnswer, deep: DeepAnswer | None) -> BookieAnswer:
    """What a bookie holds once its corrupt copies are not counted (a deep run's coverage)."""
    if deep is None or not deep.corrupt or answer.availability is None:
        return answer
    held = answer.availability.entry_ids(limit=max(answer.availability.count, 1))
    left = np.setdiff1d(held, np.array([e for e, _, _ in deep.corrupt], dtype=np.int64))
    return answer._replace(availability=Availability.of(groups_of(left)))

