"""What BookKeeper's metadata says of each ledger, in brief, to hold Pulsar's record against it: present or
not, closed or not, its last entry, its age, and whether Pulsar's keys name it Pulsar's (and whose). Columns,
not objects: a million ledgers travel back from the executors in a few tens of megabytes. Pure."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from scrutiny.pulsar.owners import owner_from_custom_metadata

if TYPE_CHECKING:
    from scrutiny.store import LedgerRead

TAGS = ("", "topic", "cursor", "compacted-topic", "schema")  # a ledger's Pulsar owner kind, by code
_TAG_CODE = {k: i for i, k in enumerate(TAGS)}
_CLOSED = 0x10


def name_hash(name: str) -> int:
    """A stable 63-bit hash of an owner's name (Python's own hash differs from process to process)."""
    data = name.encode()
    return (zlib.crc32(data) << 31) ^ zlib.adler32(data)


def _tag(custom: tuple[tuple[str, bytes], ...]) -> tuple[int, int]:
    """The owner kind's code and the name's hash that a ledger's custom metadata gives it ((0, 0): not Pulsar's)."""
    owner = owner_from_custom_metadata(custom)
    code = _TAG_CODE.get(owner.kind, 0) if owner is not None else 0
    return code, name_hash(owner.name) if owner is not None and code else 0


class LedgerFact(NamedTuple):
    ledger_id: int
    closed: bool
    last_entry_id: int
    ctime_ms: int  # -1: unknown (etcd; Pulsar sets no ctime of its own)
    tag: str  # the owner kind Pulsar's keys give it ("" none: not Pulsar's, or too old to say)
    owner_hash: int  # name_hash of the owner's name (a topic, a schema id); 0 when untagged


@dataclass(frozen=True)
class BookKeeperLedgers:
    """Sorted by ledger id; a ledger absent here was absent from BookKeeper's metadata when read."""

    ids: np.ndarray
    last_entry: np.ndarray
    ctime: np.ndarray
    flags: np.ndarray  # closed bit | tag code
    owner: np.ndarray

    @classmethod
    def of(cls, reads: Iterable[LedgerRead]) -> BookKeeperLedgers:
        rows = []
        for r in reads:
            md = r.metadata
            if md is None:
                continue
            code, owner = _tag(md.custom_metadata)
            rows.append((md.ledger_id, md.last_entry_id, md.ctime if md.ctime > 0 else -1,
                         code | (_CLOSED if md.closed else 0), owner))
        return cls.from_rows(rows)

    @classmethod
    def of_closed(cls, ids: np.ndarray, last_entry: np.ndarray, ctime: np.ndarray, owner: np.ndarray,
                  customs: Sequence[tuple[tuple[str, bytes], ...]]) -> BookKeeperLedgers:
        """Closed ledgers given as columns (a range's plain ones), `owner` each one's custom metadata as its number
        in `customs` (-1: none); the same as `of` their reads."""
        tags = np.array([*map(_tag, customs), (0, 0)], dtype=np.int64)  # (the -1: the last)
        return cls._of(np.column_stack([ids, last_entry, np.where(ctime > 0, ctime, -1), tags[owner, 0] | _CLOSED,
                                        tags[owner, 1]]))

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, int, int, int]]) -> BookKeeperLedgers:
        return cls._of(np.array(rows, dtype=np.int64).reshape(-1, 5))

    @classmethod
    def _of(cls, a: np.ndarray) -> BookKeeperLedgers:
        a = a[np.argsort(a[:, 0], kind="stable")]
        return cls(a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy(), a[:, 3].astype(np.uint8), a[:, 4].copy())

    @classmethod
    def merge(cls, parts: Iterable[BookKeeperLedgers]) -> BookKeeperLedgers:
        parts = [p for p in parts if len(p.ids)]
        if not parts:
            return cls.from_rows([])
        cols = [np.concatenate([getattr(p, c) for p in parts]) for c in ("ids", "last_entry", "ctime", "flags",
                                                                          "owner")]
        order = np.argsort(cols[0], kind="stable")
        return cls(*(c[order] for c in cols))

    def __len__(self) -> int:
        return len(self.ids)

    def positions(self, ledger_ids: np.ndarray) -> np.ndarray:
        """Where each of these ledgers is in the columns, -1 for one BookKeeper's metadata lacks."""
        at = np.searchsorted(self.ids, ledger_ids)
        inside = at < len(self.ids)
        hit = np.zeros(len(ledger_ids), dtype=bool)
        hit[inside] = self.ids[at[inside]] == ledger_ids[inside]
        return np.where(hit, at, -1)

    def closed_entries(self, positions: np.ndarray) -> np.ndarray:
        """BookKeeper's entries (lastEntryId + 1) of the ledgers at these positions, -1 where absent or open."""
        found = positions >= 0
        at = positions[found]
        out = np.full(len(positions), -1, dtype=np.int64)
        out[found] = np.where(self.flags[at] & _CLOSED, self.last_entry[at] + 1, -1)
        return out

    def get(self, ledger_id: int) -> LedgerFact | None:
        i = int(np.searchsorted(self.ids, ledger_id))
        if i == len(self.ids) or self.ids[i] != ledger_id:
            return None
        return self._fact(i)

    def _fact(self, i: int) -> LedgerFact:
        f = int(self.flags[i])
        return LedgerFact(int(self.ids[i]), bool(f & _CLOSED), int(self.last_entry[i]), int(self.ctime[i]),
                          TAGS[f & 0x0F], int(self.owner[i]))

    def tagged_except(self, named: np.ndarray) -> list[LedgerFact]:
        """Every ledger Pulsar's keys say Pulsar created for a topic, a cursor, a compaction or a schema, but
        those in `named`."""
        tagged = np.flatnonzero(self.flags & 0x0F)
        return [self._fact(int(i)) for i in tagged[~np.isin(self.ids[tagged], named)]]

    def of_owner(self, tag: str, name: str, above: int) -> list[LedgerFact]:
        """The ledgers tagged for this owner, with ids above `above` (a hash matches: confirm by reading)."""
        hit = (self.owner == name_hash(name)) & ((self.flags & 0x0F) == _TAG_CODE[tag]) & (self.ids > above)
        return [self._fact(int(i)) for i in np.flatnonzero(hit)]
