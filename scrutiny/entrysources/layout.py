"""DbLedgerStorage's indexes as BookKeeper lays them out under <dir>/current/: `ledgers` (key: ledger id,
big-endian int64; value: LedgerData) and `locations` (key: ledger id, entry id, big-endian int64 each;
value: the entry's location, `(logId << 32) | offset`), and the bookie's cookie beside them."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from scrutiny.entrysources.rocksdb import SecondaryIndex

LEDGER_KEY = struct.Struct(">q")
LOCATION = struct.Struct(">q")
ENTRY_KEY = struct.Struct(">qq")


def entries_listed(locations: SecondaryIndex, ledger_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The entry ids a `locations` index lists for the ledger, ascending, and the entry log each one is in. One
    pass from (ledger, 0) up to the ledger's special negative ids (bytewise, they sort after the real ones),
    keys and values decoded together."""
    rows = np.frombuffer(locations.items_between(ENTRY_KEY.pack(ledger_id, 0), ENTRY_KEY.pack(ledger_id, -(1 << 63))),
                         dtype=">i8").reshape(-1, 3)  # ledger id, entry id, location
    return rows[:, 1].astype(np.int64), (rows[:, 2] >> 32).astype(np.int64)


def index_entries(locations: Any, ledger_id: int) -> Iterator[tuple[int, bytes]]:
    """(entry id, location value) of every entry a `locations` index lists for the ledger, in order."""
    it = locations.iterator()
    it.seek(ENTRY_KEY.pack(ledger_id, 0))
    while it.valid():
        lid, eid = ENTRY_KEY.unpack(it.key())
        if lid != ledger_id:
            return
        if eid >= 0:  # bytewise order puts negative (special) ids after the real ones
            yield eid, it.value()
        it.next()


COOKIE = "VERSION"  # <dir>/current/VERSION: the bookie's cookie (its instance id, its directories)

