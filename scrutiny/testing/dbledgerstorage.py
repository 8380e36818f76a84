"""A bookie's DbLedgerStorage indexes, laid out as BookKeeper writes them (tests and the demo):
`<dir>/current/ledgers` (key: ledger id as a big-endian int64; value: LedgerData) and
`<dir>/current/locations` (key: ledger id, entry id, big-endian int64 each; value: the entry's
location, `(logId << 32) | offset`). `LiveBookie` keeps both open and writes while agents read, as a
running bookie does; it deletes a ledger the bookie's way (from `ledgers` at once, its `locations`
keys only at a later cleanup). `EntryLog` writes entry logs as DefaultEntryLogger does, and
`LiveBookie.compact` moves entries to a new log the way compaction does."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from scrutiny.bookkeeper import dbledgerstorage_pb2
from scrutiny.entrylog import (
    ENTRY_SIZE,
    LOG_HEADER,
    LOG_HEADER_BYTES,
    LOG_MAGIC,
    MAP_PAIR,
    MAP_RECORD,
    log_path,
    split_location,
)
from scrutiny.entrysources.layout import ENTRY_KEY, LEDGER_KEY, LOCATION


def log_header(map_offset: int = 0, ledgers: int = 0) -> bytes:
    """An entry log's 1024-byte header: where its ledgers map is (0: not yet, the log is being written)."""
    return LOG_HEADER.pack(LOG_MAGIC, 1, map_offset, ledgers).ljust(LOG_HEADER_BYTES, b"\0")


class EntryLog:
    """One entry log being appended: the 1024-byte header, then each entry as an int32 size and its
    bytes; `finish` appends the ledgers map (records of at most 10,000 ledgers) and points the header
    at it, as a rolled-over log has."""

    def __init__(self, ledger_dir: str | Path, log_id: int) -> None:
        self.log_id = log_id
        self.path = log_path(ledger_dir, log_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "wb")  # noqa: SIM115 - appended to until finish()
        self.file.write(log_header())
        self.sizes: dict[int, int] = {}

    def append(self, ledger_id: int, stored: bytes) -> int:
        """Write one entry's bytes; its location."""
        self.file.write(ENTRY_SIZE.pack(len(stored)))
        pos = self.file.tell()
        self.file.write(stored)
        self.file.flush()
        self.sizes[ledger_id] = self.sizes.get(ledger_id, 0) + len(stored)
        return (self.log_id << 32) | pos

    def finish(self) -> None:
        offset = self.file.tell()
        pairs = list(self.sizes.items())
        for i in range(0, len(pairs), 10_000):
            chunk = pairs[i:i + 10_000]
            record = MAP_RECORD.pack(-1, -2, len(chunk)) + b"".join(MAP_PAIR.pack(*p) for p in chunk)
            self.file.write(ENTRY_SIZE.pack(len(record)) + record)
        self.file.seek(0)
        self.file.write(log_header(offset, len(pairs)))
        self.file.close()


def ledger_data(limbo: bool = False, fenced: bool = False, password: bytes = b"") -> bytes:
    """A `ledgers` index value as a bookie writes it: its master key is SHA-1("ledger" + the ledger's password)
    (`DigestManager.generateMasterKey`; Pulsar's password is empty); BP-46's limbo only when set."""
    key = hashlib.sha1(b"ledger" + password).digest()
    data = dbledgerstorage_pb2.LedgerData(exists=True, fenced=fenced, masterKey=key)
    if limbo:
        data.limbo = True
    return data.SerializeToString()


class LiveBookie:
    """Both indexes of one ledger directory, open read-write (the bookie's side of a test)."""

    def __init__(self, ledger_dir: str | Path) -> None:
        self.ledger_dir = Path(ledger_dir)
        (self.ledger_dir / "current").mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        from rocksdict import Options, Rdict

        current = self.ledger_dir / "current"
        self.ledgers = Rdict(str(current / "ledgers"), options=Options(raw_mode=True))
        self.locations = Rdict(str(current / "locations"), options=Options(raw_mode=True))

    def add(self, ledger_id: int, entry_ids: Iterable[int], log_id: int = 1, limbo: bool = False) -> None:
        """The ledger exists (as `limbo` says) and these entries are flushed (their locations written) into entry
        log `log_id` (a log being written, its header only, when there is none: the entries' bytes are not)."""
        path = log_path(self.ledger_dir, log_id)
        if not path.exists():
            path.write_bytes(log_header())
        self.ledgers[LEDGER_KEY.pack(ledger_id)] = ledger_data(limbo)
        for eid in entry_ids:
            location = (log_id << 32) | (int(eid) & 0xFFFFFFFF)
            self.locations[ENTRY_KEY.pack(ledger_id, int(eid))] = LOCATION.pack(location)

    def write(self, ledger_id: int, entries: Mapping[int, bytes], log: EntryLog) -> None:
        """Store these entries (as packaged by the client) in `log` and index them."""
        self.ledgers[LEDGER_KEY.pack(ledger_id)] = ledger_data()
        for eid, stored in sorted(entries.items()):
            self.locations[ENTRY_KEY.pack(ledger_id, eid)] = LOCATION.pack(log.append(ledger_id, stored))

    def location(self, ledger_id: int, entry_id: int) -> int:
        value: Any = self.locations[ENTRY_KEY.pack(ledger_id, entry_id)]
        return int(LOCATION.unpack(value)[0])

    def compact(self, ledger_dir: str | Path, old_log_id: int, new_log: EntryLog) -> None:
        """Garbage-collector compaction: the live entries of an old log copied to a new one, their
        locations updated, then the old log removed."""
        old = log_path(ledger_dir, old_log_id).read_bytes()
        moved: list[tuple[bytes, int]] = []
        items: Any = self.locations.items()  # raw mode: bytes keys and values
        for key, value in items:
            log_id, pos = split_location(LOCATION.unpack(value)[0])
            if log_id == old_log_id:
                (size,) = ENTRY_SIZE.unpack_from(old, pos - ENTRY_SIZE.size)
                moved.append((key, new_log.append(ENTRY_KEY.unpack(key)[0], old[pos:pos + size])))
        new_log.finish()
        for key, location in moved:
            self.locations[key] = LOCATION.pack(location)
        self.locations.flush()
        log_path(ledger_dir, old_log_id).unlink()

    def set_limbo(self, ledger_id: int, limbo: bool) -> None:
        self.ledgers[LEDGER_KEY.pack(ledger_id)] = ledger_data(limbo)

    def delete(self, ledger_id: int) -> None:
        """What the bookie's garbage collector does first: the ledger is gone from `ledgers`."""
        del self.ledgers[LEDGER_KEY.pack(ledger_id)]

    def cleanup(self, ledger_id: int) -> None:
        """The later checkpoint: the deleted ledger's `locations` keys go too."""
        keys: list[Any] = []
        it = self.locations.iter()
        it.seek(ENTRY_KEY.pack(ledger_id, 0))
        while it.valid() and ENTRY_KEY.unpack(it.key())[0] == ledger_id:
            keys.append(it.key())
            it.next()
        for k in keys:
            del self.locations[k]

    def checkpoint(self) -> None:
        """What a bookie's checkpoint does to its indexes (`LedgerMetadataIndex.flush`, `EntryLocationIndex`'s
        batch): a synced write; their memtables stay (RocksDB flushes one when it is full, or at a restart)."""
        self.ledgers.flush_wal(True)
        self.locations.flush_wal(True)

    def flush(self) -> None:
        """The memtables flushed to SST files (as RocksDB does when one is full, or at a restart)."""
        self.ledgers.flush()
        self.locations.flush()

    def restart(self) -> None:
        """The bookie stopped and started: both indexes closed and opened again (RocksDB's recovery flushes their
        write-ahead logs into SST files, then removes them)."""
        self.close()
        self._open()

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


