"""A bookie's DbLedgerStorage indexes, laid out as BookKeeper writes them (tests and the demo):
`<dir>/current/ledgers` (key: ledger id as a big-endian int64; value: LedgerData) and
`<dir>/current/locations` (key: ledger id, entry id, big-endian int64 each; value: the entry's
location, `(logId << 32) | offset`). `LiveBookie` keeps both open and writes while agents read, as a
running bookie does; it deletes a ledger the bookie's way (from `ledgers` at once, its `locations`
keys only at a later cleanup)."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from scrutiny.bookkeeper import dbledgerstorage_pb2
from scrutiny.entrysources import _KEY, _LEDGER_KEY

_LOCATION = struct.Struct(">q")


def ledger_data(limbo: bool = False, fenced: bool = False) -> bytes:
    return dbledgerstorage_pb2.LedgerData(exists=True, fenced=fenced, masterKey=b"", limbo=limbo).SerializeToString()


class LiveBookie:
    """Both indexes of one ledger directory, open read-write (the bookie's side of a test)."""

    def __init__(self, ledger_dir: str | Path) -> None:
        from rocksdict import Options, Rdict

        current = Path(ledger_dir) / "current"
        current.mkdir(parents=True, exist_ok=True)
        self.ledgers = Rdict(str(current / "ledgers"), options=Options(raw_mode=True))
        self.locations = Rdict(str(current / "locations"), options=Options(raw_mode=True))

    def add(self, ledger_id: int, entry_ids: Iterable[int], log_id: int = 1, limbo: bool = False) -> None:
        """The ledger exists (as `limbo` says) and these entries are flushed (their locations written)."""
        self.ledgers[_LEDGER_KEY.pack(ledger_id)] = ledger_data(limbo)
        for eid in entry_ids:
            self.locations[_KEY.pack(ledger_id, int(eid))] = _LOCATION.pack((log_id << 32) | (int(eid) & 0xFFFFFFFF))

    def set_limbo(self, ledger_id: int, limbo: bool) -> None:
        self.ledgers[_LEDGER_KEY.pack(ledger_id)] = ledger_data(limbo)

    def delete(self, ledger_id: int) -> None:
        """What the bookie's garbage collector does first: the ledger is gone from `ledgers`."""
        del self.ledgers[_LEDGER_KEY.pack(ledger_id)]

    def cleanup(self, ledger_id: int) -> None:
        """The later checkpoint: the deleted ledger's `locations` keys go too."""
        keys: list[Any] = []
        it = self.locations.iter()
        it.seek(_KEY.pack(ledger_id, 0))
        while it.valid() and _KEY.unpack(it.key())[0] == ledger_id:
            keys.append(it.key())
            it.next()
        for k in keys:
            del self.locations[k]

    def flush(self) -> None:
        self.ledgers.flush()
        self.locations.flush()

    def close(self) -> None:
        for db in (self.ledgers, self.locations):
            with contextlib.suppress(Exception):
                db.close()

    def __enter__(self) -> LiveBookie:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_index(ledger_dir: str | Path, entries: Mapping[int, Iterable[int]], limbo: Iterable[int] = (),
                deleted: Iterable[int] = ()) -> None:
    """Both indexes of a stopped bookie: `entries` per ledger; `limbo` ledgers in limbo; `deleted`
    ledgers gone from `ledgers` but with their `locations` keys still there (before the cleanup)."""
    in_limbo = set(limbo)
    with LiveBookie(ledger_dir) as bookie:
        for lid, eids in entries.items():
            bookie.add(lid, eids, limbo=lid in in_limbo)
        for lid in deleted:
            bookie.delete(lid)
        bookie.flush()
    for name in ("ledgers", "locations"):  # rocksdict's own file: a real bookie's directory has none
        with contextlib.suppress(FileNotFoundError):
            (Path(ledger_dir) / "current" / name / "rocksdict-config.json").unlink()


