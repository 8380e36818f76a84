"""Writes a bookie's DbLedgerStorage index the way BookKeeper lays it out (tests and the demo)."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

from scrutiny.entrysources import _KEY


def write_locations_index(ledger_dir: str | Path, entries: Mapping[int, Iterable[int]]) -> None:
    """Build a `locations` database the way DbLedgerStorage lays it out (tests and the demo)."""
    from rocksdict import Options, Rdict

    path = Path(ledger_dir) / "current" / "locations"
    path.mkdir(parents=True, exist_ok=True)
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        for lid, eids in entries.items():
            for eid in eids:
                db[_KEY.pack(lid, int(eid))] = struct.pack(">q", (1 << 32) | (int(eid) & 0xFFFFFFFF))
        db.flush()
    finally:
        db.close()
    with contextlib.suppress(FileNotFoundError):
        (path / "rocksdict-config.json").unlink()
