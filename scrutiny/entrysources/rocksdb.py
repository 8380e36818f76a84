"""One RocksDB index of a live bookie, read as a RocksDB secondary: caught up with the bookie at every request,
opened anew when the database is another one or the secondary may hold what the bookie flushed away."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple

from scrutiny.entrysources.source import SourceError

_SKIPPED_FILES = ("LOCK", "rocksdict-config.json")
CATCH_UP_TRIES = 5  # a bookie's flushes are minutes apart, its restart's recovery a moment: one more read settles


class IndexState(NamedTuple):
    """What a look at an index compares with the last: its sequence number (one per write), the writes and
    the deletes in the memtables the secondary replayed from the WAL, the live SST files (a flush or a
    compaction adds one: deletes may then have moved into them, or been compacted away), and which database
    this is (its identity) and which opening of it (a reopen replays the WAL anew)."""

    sequence: int
    mem_entries: int
    mem_deletes: int
    files: frozenset[str]
    identity: tuple[int, int, bytes]
    generation: int


def _identity(db: Path) -> tuple[int, int, bytes]:
    """Which database a directory holds: the directory's inode and RocksDB's IDENTITY (a UUID written when
    the database is created). A bookie formatted and back has a new one, whatever its timing."""
    st = db.stat()
    try:
        ident = (db / "IDENTITY").read_bytes()
    except FileNotFoundError:
        ident = b""
    return st.st_dev, st.st_ino, ident


class SecondaryIndex:
    """One of the bookie's RocksDB indexes, read as a RocksDB secondary through a scratch view of
    symlinks to the live files: RocksDB and rocksdict write only in the scratch directory. Catching up
    links the files the bookie created since (new SSTs, a new MANIFEST), then replays what it wrote; a
    database created anew in the directory (the bookie formatted) is opened anew: a secondary would go
    on reading the old one's files, which it holds open."""

    def __init__(self, db: Path, scratch: Path, cache: Any = None) -> None:
        self.db, self.scratch = db, scratch
        self.cache = cache  # rocksdict's block cache, shared by a source's indexes (None: RocksDB's default)
        self.generation = 0  # how many times it was opened
        self.identity: tuple[int, int, bytes] = (0, 0, b"")
        self._handle: Any = None
        self._wals: set[str] = set()  # the write-ahead logs replayed (or there to replay) at the last catch-up
        self.close()  # what an earlier agent left in the scratch directory (killed, say) is not this one's view

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    def _link_new_files(self, view: Path) -> set[str]:
        """Links to the files the bookie created since; the write-ahead logs there now."""
        wals = set()
        for name in os.listdir(self.db):
            if name in _SKIPPED_FILES or name.startswith("LOG"):
                continue
            if name.endswith(".log"):
                wals.add(name)
            link = view / name
            if not os.path.lexists(link):
                os.symlink(self.db / name, link)
        return wals

    def _open(self) -> Any:
        from rocksdict import AccessType, BlockBasedOptions, Options, Rdict

        self.identity = _identity(self.db)
        self.generation += 1
        view = self.scratch / f"view-{self.generation}"
        secondary = self.scratch / f"secondary-{self.generation}"
        view.mkdir(parents=True)
        self._wals = self._link_new_files(view)
        options = Options(raw_mode=True)
        if self.cache is not None:
            table = BlockBasedOptions()
            table.set_block_cache(self.cache)
            options.set_block_based_table_factory(table)
        return Rdict(str(view), options=options, access_type=AccessType.secondary(str(secondary)))

    def _current(self) -> bytes:
        """The MANIFEST the bookie's database names now (it names another after each of its openings)."""
        try:
            return (self.db / "CURRENT").read_bytes()
        except FileNotFoundError:
            return b""

    def _stood_still(self, current: bytes) -> bool:
        """Whether the bookie's database stood still while the secondary read it: the same MANIFEST named, and
        every write-ahead log it was to replay still there. A secondary reads the MANIFEST, then the logs after
        it: a log the bookie flushed into an SST and removed in between (a memtable's flush; a restart, whose
        recovery flushes every log) is skipped, and its keys are in neither (on real bookies: every ledger of a
        bookie restarting, or its entries, missing from one answer)."""
        return self._current() == current and self._wals <= {n for n in os.listdir(self.db) if n.endswith(".log")}

    def catch_up(self) -> None:
        for attempt in range(CATCH_UP_TRIES):
            try:
                current = self._current()
                if self._handle is not None and _identity(self.db) != self.identity:
                    self.close()  # another database: never answer from the one the bookie no longer has
                if self._handle is not None:
                    wals = self._link_new_files(self.scratch / f"view-{self.generation}")
                    if self._wals - wals:
                        # A log the secondary replayed went: the bookie flushed it (a restart always does). The
                        # secondary's memtable may lack that log's tail (a delete) while keeping what it did
                        # replay (the put), which it would answer before any SST: opened anew, it reads both.
                        self.close()
                    else:
                        self._wals = wals
                        self._handle.try_catch_up_with_primary()
                if self._handle is None:
                    self._handle = self._open()
                if self._stood_still(current):
                    return
                self.close()  # read while the bookie moved its keys from a log into an SST: again
            except Exception as exc:  # a compaction may remove a file between listing and reading
                self.close()
                if attempt == CATCH_UP_TRIES - 1:
                    raise SourceError(f"cannot read the index {self.db}: {exc}") from None
        raise SourceError(f"the index {self.db} kept moving its keys while read ({CATCH_UP_TRIES} tries)")

    def state(self) -> IndexState:
        h = self._handle
        entries, deletes = ((h.property_int_value(f"rocksdb.num-{what}-active-mem-table")
                             + h.property_int_value(f"rocksdb.num-{what}-imm-mem-tables"))
                            for what in ("entries", "deletes"))
        return IndexState(h.latest_sequence_number(), entries, deletes, frozenset(f["name"] for f in h.live_files()),
                          self.identity, self.generation)

    def get(self, key: bytes) -> bytes | None:
        value = self._handle.get(key)
        return None if value is None else bytes(value)

    def keys_from(self, lo: bytes) -> Iterator[bytes]:
        """Every key from `lo` on, ascending (keys only)."""
        yield from self._handle.keys(from_key=lo)

    def keys_between(self, lo: bytes, hi: bytes) -> bytes:
        """Every key from `lo` up to, not including, `hi`, joined: keys only (no value is read), RocksDB's
        own upper bound ending the iteration."""
        from rocksdict import ReadOptions

        bound = ReadOptions()
        bound.set_iterate_upper_bound(hi)
        return b"".join(self._handle.keys(from_key=lo, read_opt=bound))

    def items_between(self, lo: bytes, hi: bytes) -> bytes:
        """Every key and its value from `lo` up to, not including, `hi`, joined key, value, key, value (one
        iteration; RocksDB's own upper bound ending it)."""
        from rocksdict import ReadOptions

        bound = ReadOptions()
        bound.set_iterate_upper_bound(hi)
        return b"".join(chain.from_iterable(self._handle.items(from_key=lo, read_opt=bound)))

    def iterator(self) -> Any:
        return self._handle.iter()

    def close(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._handle.close()
            self._handle = None
        for old in self.scratch.glob("*-*"):
            shutil.rmtree(old, ignore_errors=True)

