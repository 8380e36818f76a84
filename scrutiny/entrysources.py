"""Where a bookie agent learns which entries its bookie holds. One source per agent:

- DbLedgerStorageSource: the bookie's RocksDB indexes (Pulsar's default storage, which upstream cannot
  serve): `ledgers` says which ledgers the bookie has (and which are in limbo), `locations` which of
  their entries it flushed. Both are read as RocksDB secondaries through scratch views, caught up with
  the live bookie at every request; not one byte of the bookie's directories is written. Entries still
  in the bookie's write cache (the last flushInterval: 10 s in BookKeeper, 60 s in Pulsar) are not in
  the index yet: that is the only lag.
- BookieBridgeSource: a stock bookie (Sorted/InterleavedLedgerStorage) asked over BookKeeper's own v3
  protocol, GET_LIST_OF_ENTRIES_OF_LEDGER; its answer is relayed as it is.
- SyntheticStore: a compact file per bookie for the demo, the tests and the benchmarks.

Every source answers `availability(ledger_id)` what the bookie itself would serve: a `Holding` (the
BP-34 encoding, and whether the ledger is in limbo), None for "no such ledger" (ENOLEDGER), or
SourceError when it cannot tell (the agent answers EIO). A source that can list its ledgers answers
`list_ledgers(from_id, limit)` (the reverse check: ledgers the metadata no longer has); the bridge cannot
(BookKeeper's protocol has no such request). DbLedgerStorageSource also answers `verify(...)` (the deep
scrub) and `stored_bytes(ledger_id)`: the entries the index lists, read from the entry logs.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
from google.protobuf.message import DecodeError

from scrutiny import codec, entrylog
from scrutiny.bookkeeper import bookie_protocol_pb2 as bkp
from scrutiny.bookkeeper import dbledgerstorage_pb2
from scrutiny.changefeed import Change, Kind
from scrutiny.errors import StoreError


class Holding(NamedTuple):
    availability: bytes  # the BP-34 encoding of the entries the bookie would serve
    limbo: bool = False  # BP-46: the bookie does not know this ledger's state; entries it lacks are unknown
    entries: int = 0  # how many entries the source looked at to answer (the agent's CPU budget counts them)


class SourceError(StoreError):
    """The source could not tell which entries it holds (mapped to EIO)."""


class Verification(NamedTuple):
    """A deep scrub of one ledger's copies on one bookie."""

    verified: np.ndarray  # entry ids whose stored bytes verified, ascending
    payload_hashes: bytes  # PAYLOAD_HASH_BYTES per verified entry, same order
    corrupt: list[tuple[int, str, str]]  # (entry id, reason, detail), ascending entry id
    bytes_read: int
    digest_checked: bool


MAX_ENTRY_BYTES = 64 * 1024 * 1024  # larger than any entry a bookie accepts (nettyMaxFrameSizeBytes)
INDEX_CACHE_BYTES = 32 << 20  # the agent's RocksDB block cache, all of a bookie's indexes together
STORED_BYTES_MOST_ENTRIES = 1_000_000  # a ledger's stored bytes are summed entry by entry up to this many
PAGE_BYTES = 4096


class EntrySource(Protocol):
    def availability(self, ledger_id: int) -> Holding | None: ...

    def refresh(self) -> None:
        """Catch up with the bookie, once per request, before answering it."""

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# DbLedgerStorage: RocksDB `ledgers` (key: ledger id, big-endian int64; value: LedgerData) and
# `locations` (key: ledger id, entry id, big-endian int64 each) under <dir>/current/

_LEDGER_KEY = struct.Struct(">q")
_LOCATION = struct.Struct(">q")
_KEY = struct.Struct(">qq")
_SKIPPED_FILES = ("LOCK", "rocksdict-config.json")


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


class _SecondaryIndex:
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

    def catch_up(self) -> None:
        for attempt in range(3):
            try:
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
                return
            except Exception as exc:  # a compaction may remove a file between listing and reading
                self.close()
                if attempt == 2:
                    raise SourceError(f"cannot read the index {self.db}: {exc}") from None

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

    def iterator(self) -> Any:
        return self._handle.iter()

    def close(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._handle.close()
            self._handle = None
        for old in self.scratch.glob("*-*"):
            shutil.rmtree(old, ignore_errors=True)


def _entry_ids(locations: _SecondaryIndex, ledger_id: int) -> np.ndarray:
    """The entry ids a `locations` index lists for the ledger, ascending. Keys only, from (ledger, 0) up to
    the ledger's special negative ids (bytewise, they sort after the real ones), decoded in one pass."""
    keys = locations.keys_between(_KEY.pack(ledger_id, 0), _KEY.pack(ledger_id, -(1 << 63)))
    return np.frombuffer(keys, dtype=">i8")[1::2].astype(np.int64)


def _index_entries(locations: Any, ledger_id: int) -> Iterator[tuple[int, bytes]]:
    """(entry id, location value) of every entry a `locations` index lists for the ledger, in order."""
    it = locations.iterator()
    it.seek(_KEY.pack(ledger_id, 0))
    while it.valid():
        lid, eid = _KEY.unpack(it.key())
        if lid != ledger_id:
            return
        if eid >= 0:  # bytewise order puts negative (special) ids after the real ones
            yield eid, it.value()
        it.next()


class DbLedgerStorageSource:
    """Every ledger (or index) directory's `ledgers` and `locations` indexes. A ledger's entries count
    in a directory only while that directory's `ledgers` index has the ledger: a ledger the bookie
    deleted is refused (ENOLEDGER) even while its `locations` keys await the next cleanup."""

    def __init__(self, ledger_dirs: Sequence[str | Path], scratch_dir: str | Path | None = None,
                 cache_bytes: int = INDEX_CACHE_BYTES) -> None:
        from rocksdict import Cache

        self.ledger_dirs = [Path(d) for d in ledger_dirs]
        dirs = [Path(d) / "current" for d in ledger_dirs]
        missing = [str(d / name) for d in dirs for name in ("ledgers", "locations")
                   if not (d / name / "CURRENT").exists()]
        if missing:
            raise SourceError(f"no RocksDB index at {', '.join(missing)} (a DbLedgerStorage bookie keeps both "
                              "`ledgers` and `locations` under <dir>/current)")
        self._own_scratch = scratch_dir is None
        self.scratch = Path(scratch_dir or tempfile.mkdtemp(prefix="scrutiny-dbls-"))
        self._lock = threading.Lock()
        cache = Cache(cache_bytes)  # one bound for every index: the agent's memory does not grow with the bookie's
        self.indexes = [(_SecondaryIndex(d / "ledgers", self.scratch / f"{i}-ledgers", cache),
                         _SecondaryIndex(d / "locations", self.scratch / f"{i}-locations", cache))
                        for i, d in enumerate(dirs)]
        # Entry logs gone while `locations` still point into them, per directory, and the ledgers that do:
        # the bookie cannot serve those entries, so they are not copies (`changes` finds them).
        self.gone_logs: list[set[int]] = [set() for _ in dirs]
        self.suspects: list[set[int]] = [set() for _ in dirs]
        self._instances: list[tuple[bytes | None, tuple[int, int, bytes]] | None] = [None for _ in dirs]
        self._watch: _Watch | None = None

    def cookie(self, d: int) -> bytes | None:
        """The bookie's cookie in the directory (None: none there now)."""
        try:
            return (self.ledger_dirs[d] / "current" / COOKIE).read_bytes()
        except OSError:
            return None

    def _catch_up(self, d: int, locations_too: bool = True) -> None:
        """The directory's indexes caught up with the bookie (under the lock). When the bookie there is another
        instance (its cookie changed, its `ledgers` index created anew: formatted and back), both indexes are
        opened anew and what was known of its entry logs is forgotten, whatever the timing."""
        ledgers, locations = self.indexes[d]
        cookie = self.cookie(d)
        known = self._instances[d]
        if known is not None and cookie != known[0]:
            ledgers.close()
        ledgers.catch_up()
        if known is not None and (cookie, ledgers.identity) != known:
            locations.close()
            self.gone_logs[d].clear()
            self.suspects[d].clear()
        self._instances[d] = (cookie, ledgers.identity)
        if locations_too or not locations.is_open:
            locations.catch_up()

    def changes(self, ledgers_too: bool = True) -> tuple[list[Change], int]:
        """What changed in what the bookie holds since the last call (the first only takes stock), and
        how many index keys that read (for the CPU budget). Catches up with the `ledgers` index only: the
        `locations` index (the bookie's busiest) is caught up by the answers, and here only when an entry
        log went. Without `ledgers_too` (nobody follows the feed) the entry logs and the cookie only: the
        answers need the logs gone (#4607); the index is taken stock of anew at the next look with it."""
        with self._lock:
            for d in range(len(self.indexes)):
                if ledgers_too:
                    self._catch_up(d, locations_too=False)
            self._opened()
            if self._watch is None:
                self._watch = _Watch(self)
            return self._watch.look(ledgers_too)

    def refresh(self) -> None:
        with self._lock:
            for d in range(len(self.indexes)):
                self._catch_up(d)

    def _opened(self) -> list[tuple[_SecondaryIndex, _SecondaryIndex]]:
        """Every directory's two indexes, opened if no request has opened them yet (under the lock)."""
        for d, (ledgers, locations) in enumerate(self.indexes):
            if not (ledgers.is_open and locations.is_open):
                self._catch_up(d)
        return self.indexes

    def entry_ids(self, ledger_id: int) -> tuple[np.ndarray, bool] | None:
        """The entry ids the bookie would serve, and whether the ledger is in limbo; None: no ledger."""
        found: list[np.ndarray] = []
        limbo = False
        with self._lock:
            for d, (ledgers, locations) in enumerate(self._opened()):
                value = ledgers.get(_LEDGER_KEY.pack(ledger_id))
                if value is None:
                    continue
                data = dbledgerstorage_pb2.LedgerData()
                try:
                    data.ParseFromString(value)
                except DecodeError as exc:
                    raise SourceError(f"ledger {ledger_id}: unreadable LedgerData in {ledgers.db}: {exc}") from None
                limbo = limbo or data.limbo
                found.append(_entry_ids(locations, ledger_id) if ledger_id not in self.suspects[d]
                             else self._served(d, locations, ledger_id))
        if not found:
            return None
        return (found[0] if len(found) == 1 else np.unique(np.concatenate(found))), limbo

    def _served(self, d: int, locations: _SecondaryIndex, ledger_id: int) -> np.ndarray:
        """The entries of a ledger some of whose locations point into a gone entry log: those the bookie
        can still read (values read: this is for the few ledgers `changes` found)."""
        gone = self.gone_logs[d]
        return np.array([eid for eid, value in _index_entries(locations, ledger_id)
                         if entrylog.split_location(_LOCATION.unpack(value)[0])[0] not in gone], dtype=np.int64)

    def availability(self, ledger_id: int) -> Holding | None:
        got = self.entry_ids(ledger_id)
        return None if got is None else Holding(codec.encode(got[0]), got[1], int(got[0].size))

    def list_ledgers(self, from_id: int, limit: int) -> tuple[np.ndarray, bool]:
        """The ledgers the `ledgers` indexes hold from `from_id` on, ascending, at most `limit`; and
        whether that is all of them. Keys only: a ledger's value is never read."""
        found: list[np.ndarray] = []
        complete = True
        with self._lock:
            for ledgers, _ in self._opened():
                keys: list[bytes] = []
                for key in ledgers.keys_from(_LEDGER_KEY.pack(from_id)):
                    if len(keys) == limit:
                        complete = False
                        break
                    keys.append(key)
                found.append(np.frombuffer(b"".join(keys), dtype=">i8").astype(np.int64))
        ids = np.unique(np.concatenate(found)) if found else np.empty(0, np.int64)
        ids = ids[ids >= 0]  # bytewise order puts negative ids after the others: none is a ledger
        return ids[:limit], complete and ids.size <= limit

    def stored_bytes(self, ledger_id: int, most_entries: int = STORED_BYTES_MOST_ENTRIES,
                     throttle: Callable[[int], None] = lambda n: None) -> int | None:
        """The bytes the bookie stores for the ledger's entries (each entry's size field in its entry
        log); None when unknown: no such ledger, too many entries to look up, or a log not readable."""
        where = self._locations(ledger_id)
        if where is None or len(where) > most_entries:
            return None
        total = 0
        logs: dict[tuple[int, int], int | None] = {}
        try:
            for d, _, location in where:
                size, reason, _ = self._size(d, location, logs)
                throttle(PAGE_BYTES)  # a random read of a size field costs the disk a page
                if reason:
                    return None
                total += size
        except OSError:
            return None
        finally:
            for fd in logs.values():
                if fd is not None:
                    os.close(fd)
        return total

    # -- deep scrub --------------------------------------------------------------------------------

    def _locations(self, ledger_id: int) -> list[tuple[int, int, int]] | None:
        """(directory index, entry id, location) of every entry the indexes list; None: no ledger."""
        out: list[tuple[int, int, int]] = []
        known = False
        with self._lock:
            for d, (ledgers, locations) in enumerate(self._opened()):
                if ledgers.get(_LEDGER_KEY.pack(ledger_id)) is None:
                    continue
                known = True
                out += ((d, eid, struct.unpack(">q", value)[0]) for eid, value in _index_entries(locations, ledger_id))
        return sorted(out, key=lambda t: t[1]) if known else None

    def _location_now(self, d: int, ledger_id: int, entry_id: int) -> int | None:
        """The entry's location after catching up with the bookie (compaction may have moved it)."""
        with self._lock:
            self._catch_up(d)
            ledgers, locations = self.indexes[d]
            if ledgers.get(_LEDGER_KEY.pack(ledger_id)) is None:
                return None
            value = locations.get(_KEY.pack(ledger_id, entry_id))
        return None if value is None else int(struct.unpack(">q", value)[0])

    def _log(self, d: int, log_id: int, logs: dict[tuple[int, int], int | None]) -> int | None:
        """An entry log opened read-only (once per call: `logs`), None when it does not exist."""
        key = (d, log_id)
        if key not in logs:
            path = entrylog.log_path(self.ledger_dirs[d], log_id)
            try:
                logs[key] = os.open(path, os.O_RDONLY | getattr(os, "O_NOATIME", 0))
            except PermissionError:  # O_NOATIME needs the file's owner
                logs[key] = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                logs[key] = None
        return logs[key]

    def _size(self, d: int, location: int, logs: dict[tuple[int, int], int | None]) -> tuple[int, str, str]:
        """The size field of the entry at a location (its log open, the size sane), or why not."""
        log_id, pos = entrylog.split_location(location)
        fd = self._log(d, log_id, logs)
        if fd is None:
            return -1, entrylog.MISSING_LOG, f"no entry log {log_id:x}.log"
        if pos < entrylog.LOG_HEADER_BYTES + entrylog.ENTRY_SIZE.size:
            return -1, entrylog.BAD_SIZE, f"location {pos} inside the log header"
        head = os.pread(fd, entrylog.ENTRY_SIZE.size, pos - entrylog.ENTRY_SIZE.size)
        if len(head) < entrylog.ENTRY_SIZE.size:
            return -1, entrylog.TRUNCATED, f"log {log_id:x}.log ends before offset {pos}"
        (size,) = entrylog.ENTRY_SIZE.unpack(head)
        if not 0 <= size <= MAX_ENTRY_BYTES:
            return -1, entrylog.BAD_SIZE, f"size field {size} at offset {pos} of log {log_id:x}.log"
        return size, "", ""

    def _read(self, d: int, location: int, logs: dict[tuple[int, int], int | None]) -> tuple[bytes, str, str]:
        """The stored bytes at a location, or why they cannot be read (read-only; nothing changes)."""
        size, reason, detail = self._size(d, location, logs)
        if reason:
            return b"", reason, detail
        log_id, pos = entrylog.split_location(location)
        fd = logs[(d, log_id)]
        assert fd is not None  # _size found the log
        stored = os.pread(fd, size, pos)
        if len(stored) < size:
            return stored, entrylog.TRUNCATED, f"log {log_id:x}.log has {len(stored)} of {size} bytes at {pos}"
        return stored, "", ""

    def verify(self, ledger_id: int, digest_type: str, password: bytes | None,
               throttle: Callable[[int], None] = lambda n: None) -> Verification | None:
        """Read and verify every entry the index lists (None: no such ledger). A copy that fails is
        read again at its current location before it is believed: compaction moves entries (and
        removes the old log), and an entry gone from the index meanwhile is not held any more."""
        where = self._locations(ledger_id)
        if where is None:
            return None
        verified: list[int] = []
        hashes: list[bytes] = []
        corrupt: list[tuple[int, str, str]] = []
        read = 0
        logs: dict[tuple[int, int], int | None] = {}
        try:
            for d, eid, location in where:
                for attempt in (1, 2):
                    stored, reason, detail = self._read(d, location, logs)
                    read += len(stored)
                    throttle(len(stored) + entrylog.ENTRY_SIZE.size)
                    if not reason:
                        verdict = entrylog.verify_entry(stored, ledger_id, eid, digest_type, password)
                        reason, detail = verdict.reason, verdict.detail
                    if not reason:
                        verified.append(eid)
                        hashes.append(verdict.payload_hash)
                        break
                    if attempt == 2:
                        corrupt.append((eid, reason, detail))
                        break
                    now = self._location_now(d, ledger_id, eid)
                    if now is None:
                        break  # deleted meanwhile: not held, not corrupt
                    for fd in logs.values():  # the log may have been replaced: open it again
                        if fd is not None:
                            os.close(fd)
                    logs.clear()
                    location = now
        except OSError as exc:  # the disk failing under the read: the agent cannot tell (EIO)
            raise SourceError(f"ledger {ledger_id}: reading the entry logs: {exc}") from None
        finally:
            for fd in logs.values():
                if fd is not None:
                    os.close(fd)
        return Verification(np.array(verified, dtype=np.int64), b"".join(hashes), corrupt, read,
                            digest_type != "DUMMY" and (digest_type != "HMAC" or password is not None))

    def close(self) -> None:
        with self._lock:
            for ledgers, locations in self.indexes:
                ledgers.close()
                locations.close()
        if self._own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Bridge to a stock bookie over BookKeeper's v3 protocol

MAX_FRAME = 5 * 1024 * 1024
_LEN = struct.Struct(">i")


COOKIE = "VERSION"  # <dir>/current/VERSION: the bookie's cookie (its instance id, its directories)


KEYS_PASS_AT_LEAST_EVERY_SECONDS = 300.0  # a keys-only pass when the index moved, even without a new delete
KEYS_PASS_CPU_SHARE = 0.01  # whole passes take at most this share of a core: a pass of 0.1 s waits 10 s
KEYS_PASS_CHEAP_SECONDS = 0.01  # ... but a pass cheaper than this (an index of a few thousand ledgers) never waits


class _Watch:
    """What a DbLedgerStorageSource remembers between two looks at its bookie (under the source's lock).
    Per directory: the cookie, the `ledgers` index's keys as of its last keys-only pass (made when the index
    moved and a key may have been deleted (no sooner than KEYS_PASS_CPU_SHARE allows: on a bookie whose
    garbage collector deletes at every look, a pass of its whole index costs what a pass costs, not a pass
    a look), or at least every KEYS_PASS_AT_LEAST_EVERY_SECONDS while it
    moves), and every entry log's ledgers map (read once, when the log is finished; the directory listed
    again only when its modification time moved)."""

    def __init__(self, source: DbLedgerStorageSource, clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.clock = source, clock
        self.cookies: list[bytes | None] = []
        self.sequences: list[int] = []  # as of the last keys-only pass
        self.states: list[IndexState] = []  # as of the last look
        self.deleted: list[bool] = []  # a key may have been deleted since the last keys-only pass
        self.passed: list[float] = []  # when the last keys-only pass was made
        self.pass_cost: list[float] = []  # ... and the CPU seconds it took
        self.held: list[np.ndarray] = []
        self.listed: list[int] = []  # the `current` directory's mtime when its entry logs were listed
        self.logs: list[dict[int, list[int] | None]] = []
        self.stale = False  # the `ledgers` index went unwatched: taken stock of anew at the next look at it
        for d, (ledgers, _) in enumerate(source._opened()):
            self.cookies.append(source.cookie(d))
            self.sequences.append(0)
            self.states.append(ledgers.state())
            self.deleted.append(False)
            self.passed.append(0.0)
            self.pass_cost.append(0.0)
            self.held.append(np.empty(0, np.int64))
            self._take_stock(d, ledgers)
            self.listed.append(0)
            self.logs.append({})
            self._list_logs(d)

    def _list_logs(self, d: int) -> None:
        """The directory's entry logs as they are now, each one's ledgers map read."""
        self.listed[d] = self._mtime(d)
        self.logs[d] = {lid: self._map(d, lid) for lid in self._log_ids(d)}

    def _take_stock(self, d: int, ledgers: _SecondaryIndex) -> int:
        """The directory's `ledgers` index as it is now, what later looks compare with; keys read."""
        self.states[d] = ledgers.state()
        self.sequences[d] = self.states[d].sequence
        self.deleted[d], self.passed[d] = False, self.clock()
        cpu = time.thread_time()
        self.held[d] = self._keys(ledgers)
        self.pass_cost[d] = time.thread_time() - cpu
        return int(self.held[d].size)

    def _mtime(self, d: int) -> int:
        try:
            return (self.source.ledger_dirs[d] / "current").stat().st_mtime_ns
        except OSError:
            return -1

    def _keys(self, ledgers: _SecondaryIndex, after: int = -1) -> np.ndarray:
        """The ledger ids in the index (above `after`), ascending."""
        keys = b"".join(ledgers.keys_from(_LEDGER_KEY.pack(after + 1)))
        ids = np.frombuffer(keys, dtype=">i8").astype(np.int64)
        return np.sort(ids[ids > after])

    def _log_ids(self, d: int) -> set[int]:
        with os.scandir(self.source.ledger_dirs[d] / "current") as it:
            return {i for e in it if (i := entrylog.log_id_of(e.name)) is not None}

    def _map(self, d: int, log_id: int) -> list[int] | None:
        """The log's ledgers map, None while it is being written (or unreadable)."""
        try:
            with open(entrylog.log_path(self.source.ledger_dirs[d], log_id), "rb") as f:
                offset = entrylog.ledgers_map_offset(f.read(entrylog.LOG_HEADER.size))
                if offset <= 0:
                    return None
                f.seek(offset)
                return entrylog.ledgers_map(f.read())
        except (OSError, ValueError):
            return None

    def look(self, ledgers_too: bool = True) -> tuple[list[Change], int]:
        source, changes, read = self.source, [], 0
        gone_ledgers: list[np.ndarray] = []
        gone_logs: list[tuple[int, int, list[int] | None]] = []
        stale, self.stale = self.stale, self.stale or not ledgers_too
        for d, (ledgers, _) in enumerate(source.indexes):
            cookie = source.cookie(d)
            recreated = ledgers_too and ledgers.identity != self.states[d].identity
            if cookie != self.cookies[d] or recreated:  # another instance of the bookie: its every ledger
                why = "cookie changed" if cookie != self.cookies[d] else "`ledgers` index was created anew"
                changes.append(Change(Kind.BOOKIE_RESET, detail=f"the {why} in {source.ledger_dirs[d]}",
                                      every_ledger=True))
                self.cookies[d] = cookie
                self._list_logs(d)
                if ledgers_too:
                    read += self._take_stock(d, ledgers)
            elif ledgers_too and stale:
                read += self._take_stock(d, ledgers)
            elif ledgers_too:
                read += self._look_at_ledgers(d, ledgers, changes, gone_ledgers)
            mtime = self._mtime(d)
            # an entry log created or removed; a time too recent may hide a second change (coarse clocks)
            if mtime != self.listed[d] or time.time_ns() - mtime < 2_000_000_000:
                self.listed[d] = mtime
                present = self._log_ids(d)
                gone_logs += [(d, log_id, self.logs[d].pop(log_id)) for log_id in set(self.logs[d]) - present]
                for log_id in present - self.logs[d].keys():
                    self.logs[d][log_id] = None
                    source.gone_logs[d].discard(log_id)  # restored
            for log_id in [i for i, mapped in self.logs[d].items() if mapped is None]:
                self.logs[d][log_id] = self._map(d, log_id)  # the map is written when the log is finished
        if ledgers_too:
            self.stale = False
        if gone_ledgers:
            ids = np.setdiff1d(np.concatenate(gone_ledgers), np.concatenate(self.held))  # held in no directory
            for suspects in source.suspects:
                suspects.difference_update(ids.tolist())
            if ids.size:
                changes.append(Change(Kind.LEDGERS_GONE, tuple(ids.tolist()), "left the ledgers index"))
        if gone_logs:
            for ledgers, locations in source.indexes:  # compaction moves entries before it removes a log
                ledgers.catch_up()
                locations.catch_up()
            for d, log_id, mapped in gone_logs:
                change, n = self._log_gone(d, log_id, mapped)
                read += n
                if change is not None:
                    changes.append(change)
        return changes, read

    def _look_at_ledgers(self, d: int, ledgers: _SecondaryIndex, changes: list[Change],
                         gone_ledgers: list[np.ndarray]) -> int:
        """The directory's `ledgers` index since the last look: the ledgers created (keys above the highest
        known), and gone (a keys-only pass, when a delete may be among the changes); keys read."""
        state, last, now, read = ledgers.state(), self.states[d], self.clock(), 0
        sequence = state.sequence
        moved, replaced = sequence != self.sequences[d], sequence < self.sequences[d]
        # Every write since the last look is in the memtables the secondary held then when they grew by as many
        # entries as the sequence moved: then the deletes among them are the memtables' new deletes. Else (a
        # flush, perhaps a compaction that dropped a delete, a memtable the secondary let go, a reopen) the
        # writes are unknown: a pass. The `ledgers` index seldom flushes (a 64 MB memtable, a restart).
        written = sequence - last.sequence
        same = (not state.files - last.files and state.generation == last.generation
                and state.mem_entries - last.mem_entries == written)
        if written and (not same or state.mem_deletes > last.mem_deletes):
            self.deleted[d] = True
        affordable = (self.pass_cost[d] < KEYS_PASS_CHEAP_SECONDS
                      or now - self.passed[d] >= self.pass_cost[d] / KEYS_PASS_CPU_SHARE)
        if replaced or (moved and affordable and (
                self.deleted[d] or now - self.passed[d] >= KEYS_PASS_AT_LEAST_EVERY_SECONDS)):
            cpu = time.thread_time()
            held = self._keys(ledgers)
            self.pass_cost[d], self.deleted[d] = time.thread_time() - cpu, False
            read += held.size
            if held.size == 0 < self.held[d].size or replaced:
                changes.append(Change(Kind.BOOKIE_RESET, every_ledger=True, detail=f"the ledgers index of "
                                      f"{self.source.ledger_dirs[d]} was emptied or replaced"))
            gone_ledgers.append(np.setdiff1d(self.held[d], held, assume_unique=True))
            self.held[d], self.sequences[d], self.passed[d] = held, sequence, now
        elif moved:  # the ledgers created since (ids only grow); a delete waits for its pass
            newer = self._keys(ledgers, int(self.held[d][-1]) if self.held[d].size else -1)
            read += newer.size
            self.held[d] = np.concatenate((self.held[d], newer))
        self.states[d] = state
        return read

    def _log_gone(self, d: int, log_id: int, mapped: list[int] | None) -> tuple[Change | None, int]:
        """An entry log removed: the ledgers of its map still held whose locations still point into it."""
        source = self.source
        if mapped is None:  # the log being written, or one whose map was unreadable: which ledgers is unknown
            source.gone_logs[d].add(log_id)
            return Change(Kind.ENTRY_LOG_GONE, detail=f"{log_id:x}.log of {source.ledger_dirs[d]} (no ledgers map)",
                          entry_log=log_id, every_ledger=True), 0
        ledgers, locations = source.indexes[d]
        affected, read = [], 0
        for lid in mapped:
            if ledgers.get(_LEDGER_KEY.pack(lid)) is None:
                continue
            for _, value in _index_entries(locations, lid):
                read += 1
                if entrylog.split_location(_LOCATION.unpack(value)[0])[0] == log_id:
                    affected.append(lid)
                    break
        if not affected:
            return None, read  # garbage collection as it should be: nothing held points into it
        source.gone_logs[d].add(log_id)
        source.suspects[d].update(affected)
        return Change(Kind.ENTRY_LOG_GONE, tuple(sorted(affected)), f"{log_id:x}.log of {source.ledger_dirs[d]} "
                      "is gone while the index still points into it", entry_log=log_id), read


def request_frame(ledger_id: int, txn_id: int) -> bytes:
    req = bkp.Request(
        header=bkp.BKPacketHeader(version=bkp.VERSION_THREE, operation=bkp.GET_LIST_OF_ENTRIES_OF_LEDGER,
                                  txnId=txn_id),
        getListOfEntriesOfLedgerRequest=bkp.GetListOfEntriesOfLedgerRequest(ledgerId=ledger_id),
    )
    body = req.SerializeToString()
    return _LEN.pack(len(body)) + body


def read_frame(sock: socket.socket) -> bytes:
    (length,) = _LEN.unpack(_recv_exactly(sock, 4))
    if length < 0 or length > MAX_FRAME:
        raise SourceError(f"bookie sent a frame of {length} bytes (at most {MAX_FRAME})")
    return _recv_exactly(sock, length)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise SourceError("bookie closed the connection mid-frame")
        buf += chunk
    return bytes(buf)


class BookieBridgeSource:
    """Relays GET_LIST_OF_ENTRIES_OF_LEDGER to a stock bookie; a small pool of connections, one
    request in flight on each."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, connections: int = 4) -> None:
        self.address = (host, port)
        self.timeout = timeout
        self._pool: queue.LifoQueue[socket.socket | None] = queue.LifoQueue()
        for _ in range(connections):
            self._pool.put(None)
        self._txn = 0
        self._txn_lock = threading.Lock()

    def _next_txn(self) -> int:
        with self._txn_lock:
            self._txn += 1
            return self._txn

    def refresh(self) -> None:
        pass  # the stock bookie answers from its own live state

    def availability(self, ledger_id: int) -> Holding | None:
        sock = self._pool.get()
        try:
            if sock is None:
                sock = socket.create_connection(self.address, timeout=self.timeout)
            txn = self._next_txn()
            sock.sendall(request_frame(ledger_id, txn))
            resp = bkp.Response()
            resp.ParseFromString(read_frame(sock))
        except (OSError, SourceError, ValueError) as exc:
            if sock is not None:
                sock.close()
            sock = None
            raise SourceError(f"bookie {self.address[0]}:{self.address[1]}: {exc}") from None
        finally:
            self._pool.put(sock)
        if resp.header.txnId != txn:
            raise SourceError(f"bookie answered transaction {resp.header.txnId}, asked {txn}")
        inner = resp.getListOfEntriesOfLedgerResponse
        status = inner.status if inner.HasField("status") else resp.status
        if bkp.ENOLEDGER in (resp.status, status):
            return None
        if bkp.EUNKNOWNLEDGERSTATE in (resp.status, status):
            return Holding(bytes(inner.availabilityOfEntriesOfLedger) or codec.encode([]), limbo=True)
        if status != bkp.EOK or resp.status != bkp.EOK:
            raise SourceError(f"bookie answered {bkp.BKStatusCode.Name(status if status else resp.status)}")
        return Holding(bytes(inner.availabilityOfEntriesOfLedger))

    def close(self) -> None:
        while not self._pool.empty():
            sock = self._pool.get_nowait()
            if sock is not None:
                sock.close()


# ---------------------------------------------------------------------------------------------
# The synthetic store: one file per bookie, ledger id -> groups

_MAGIC = b"SCRSYN01"
_HEAD = struct.Struct("<8sqq")
CORRUPT = -1  # a ledger whose answer the agent garbles (fault injection)


class SyntheticStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                head = f.read(_HEAD.size)
        except OSError as exc:
            raise SourceError(f"synthetic store {self.path}: {exc.strerror}") from None
        if len(head) < _HEAD.size or head[:8] != _MAGIC:
            raise SourceError(f"{self.path} is not a synthetic store file")
        _, n_ledgers, n_groups = _HEAD.unpack(head)
        size = self.path.stat().st_size
        if size != _HEAD.size + 8 * (3 * n_ledgers + 4 * n_groups):
            raise SourceError(f"{self.path} is truncated or corrupt")
        self._index = np.memmap(self.path, dtype="<i8", mode="r", offset=_HEAD.size, shape=(n_ledgers, 3)) \
            if n_ledgers else np.empty((0, 3), np.int64)
        self._groups = np.memmap(self.path, dtype="<i8", mode="r", offset=_HEAD.size + 24 * n_ledgers,
                                 shape=(n_groups, 4)) if n_groups else np.empty((0, 4), np.int64)
        self._ids = np.asarray(self._index[:, 0])

    def __len__(self) -> int:
        return int(self._ids.size)

    def refresh(self) -> None:
        pass  # a file written once

    def availability(self, ledger_id: int) -> Holding | None:
        return self.availability_many([ledger_id])[0]

    def list_ledgers(self, from_id: int, limit: int) -> tuple[np.ndarray, bool]:
        at = int(np.searchsorted(self._ids, from_id))
        return np.array(self._ids[at:at + limit], dtype=np.int64), at + limit >= self._ids.size

    def availability_many(self, ledger_ids: Sequence[int]) -> list[Holding | None]:
        """Many answers at once: the groups of every ledger asked encoded in one numpy pass, then cut."""
        if not self._ids.size:
            return [None] * len(ledger_ids)
        ids = np.asarray(ledger_ids, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._ids, ids), self._ids.size - 1)
        found = self._ids[at] == ids
        starts = np.where(found, self._index[at, 1], 0)
        counts = np.where(found, self._index[at, 2], 0)
        sizes = np.maximum(counts, 0)
        total = int(sizes.sum())
        rows = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(total)
        g = self._groups[rows] if total else np.empty((0, 4), np.int64)
        arr = np.empty(total, dtype=[("first", ">i8"), ("last", ">i8"), ("size", ">i4"), ("period", ">i4")])
        arr["first"], arr["last"], arr["size"], arr["period"] = g[:, 0], g[:, 1], g[:, 2], g[:, 3]
        body = arr.tobytes()
        # entries per group, then per ledger (the agent's CPU budget counts them)
        per_group = np.where(g[:, 1] == g[:, 0], 1, (g[:, 1] - g[:, 0]) // np.maximum(g[:, 3], 1) + 1) * g[:, 2]
        ends = np.cumsum(sizes)
        totals = np.concatenate(([0], np.cumsum(per_group)))
        per_ledger = totals[ends] - totals[ends - sizes]
        out: list[Holding | None] = []
        offset = 0
        for ok, count, n in zip(found.tolist(), counts.tolist(), per_ledger.tolist(), strict=True):
            if not ok:
                out.append(None)
            elif count == CORRUPT:
                out.append(Holding(codec.encode([1, 2, 3])[:70]))  # a truncated answer: refused by every decoder
            else:
                out.append(Holding(struct.pack(">ii", codec.CURRENT_VERSION, count) + bytes(56)
                                   + body[offset * 24:(offset + count) * 24], entries=int(n)))
                offset += count
        return out

    def close(self) -> None:
        pass
