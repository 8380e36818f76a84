"""The DbLedgerStorage source: every ledger (or index) directory's `ledgers` and `locations` indexes, read as
RocksDB secondaries through scratch views and caught up with the live bookie at every request; not one
byte of the bookie's directories is written. Entries still in the bookie's write cache (the last
flushInterval: 10 s in BookKeeper, 60 s in Pulsar) are not in the index yet: that is the only lag. It also
reads the entries themselves from the entry logs (the deep scrub, the bytes a ledger holds)."""

from __future__ import annotations

import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from scrutiny import codec, entrylog
from scrutiny.bookkeeper import dbledgerstorage_pb2
from scrutiny.changefeed import Change
from scrutiny.entrysources.dbwatch import DbLedgerStorageWatch
from scrutiny.entrysources.entrylogs import OpenLogs, log_ids_in
from scrutiny.entrysources.layout import COOKIE, ENTRY_KEY, LEDGER_KEY, entries_listed, index_entries
from scrutiny.entrysources.rocksdb import SecondaryIndex
from scrutiny.entrysources.source import Holding, SourceError, Verification

INDEX_CACHE_BYTES = 32 << 20  # the agent's RocksDB block cache, all of a bookie's indexes together
STORED_BYTES_MOST_ENTRIES = 1_000_000  # a ledger's stored bytes are summed entry by entry up to this many
PAGE_BYTES = 4096
LAST_ENTRY_TRIES = 3  # a ledger's last entries read, newest first, for one whose bytes verify


class DbLedgerStorageSource:
    """Every ledger (or index) directory's `ledgers` and `locations` indexes. A ledger's entries count
    in a directory only while that directory's `ledgers` index has the ledger: a ledger the bookie
    deleted is refused (ENOLEDGER) even while its `locations` keys await the next cleanup."""

    def __init__(self, ledger_dirs: Sequence[str | Path], scratch_dir: str | Path | None = None,
                 cache_bytes: int = INDEX_CACHE_BYTES, index_dirs: Sequence[str | Path] = ()) -> None:
        from rocksdict import Cache

        self.ledger_dirs = [Path(d) for d in ledger_dirs]  # where the entry logs are
        if index_dirs and len(index_dirs) != len(ledger_dirs):
            raise SourceError(f"{len(index_dirs)} index directories for {len(ledger_dirs)} ledger directories: a "
                              "bookie pairs them one to one (indexDirectories, ledgerDirectories)")
        dirs = [Path(d) / "current" for d in (index_dirs or ledger_dirs)]
        missing = [str(d / name) for d in dirs for name in ("ledgers", "locations")
                   if not (d / name / "CURRENT").exists()]
        if missing:
            raise SourceError(f"no RocksDB index at {', '.join(missing)} (a DbLedgerStorage bookie keeps both "
                              "`ledgers` and `locations` under <dir>/current)")
        self._own_scratch = scratch_dir is None
        self.scratch = Path(scratch_dir or tempfile.mkdtemp(prefix="scrutiny-dbls-"))
        self._lock = threading.Lock()
        cache = Cache(cache_bytes)  # one bound for every index: the agent's memory does not grow with the bookie's
        self.indexes = [(SecondaryIndex(d / "ledgers", self.scratch / f"{i}-ledgers", cache),
                         SecondaryIndex(d / "locations", self.scratch / f"{i}-locations", cache))
                        for i, d in enumerate(dirs)]
        # Per directory, the entry logs there as listed after the indexes' last catch-up: an entry whose location
        # points into a log not there is not served (#4607), whatever happened while nobody watched.
        self._logs: list[frozenset[int] | None] = [None for _ in dirs]
        self._relisted = [False for _ in dirs]  # ... listed again since, for an entry in a log not there
        self._instances: list[tuple[bytes | None, tuple[int, int, bytes]] | None] = [None for _ in dirs]
        self._watch: DbLedgerStorageWatch | None = None
        self._passes = 0  # keys-only passes of watches let go
    def cookie(self, d: int) -> bytes | None:
        """The bookie's cookie in the directory (None: none there now)."""
        try:
            return (self.ledger_dirs[d] / "current" / COOKIE).read_bytes()
        except OSError:
            return None

    def _catch_up(self, d: int, locations_too: bool = True) -> None:
        """The directory's indexes caught up with the bookie (under the lock), then its entry logs listed. When
        the bookie there is another instance (its cookie changed, its `ledgers` index created anew: formatted and
        back), both indexes are opened anew, whatever the timing."""
        ledgers, locations = self.indexes[d]
        cookie = self.cookie(d)
        known = self._instances[d]
        if known is not None and cookie != known[0]:
            ledgers.close()
        ledgers.catch_up()
        if known is not None and (cookie, ledgers.identity) != known:
            locations.close()
        self._instances[d] = (cookie, ledgers.identity)
        if locations_too or not locations.is_open:
            locations.catch_up()
            self._logs[d], self._relisted[d] = None, False  # listed again after the index that points into them

    def _present(self, d: int) -> frozenset[int]:
        """The entry logs in the directory, listed after the index's last catch-up (a log the index names was
        created before the index named it: absent from this listing, it was removed)."""
        logs = self._logs[d]
        if logs is None:
            try:
                logs = self._logs[d] = frozenset(log_ids_in(self.ledger_dirs[d]))
            except OSError as exc:
                raise SourceError(f"cannot list the entry logs of {self.ledger_dirs[d]}: {exc}") from None
        return logs

    def changes(self) -> tuple[list[Change], int]:
        """What changed in what the bookie holds since the last call (the first takes stock), and how many
        index keys that read (for the CPU budget). Catches up with the `ledgers` index only: the `locations`
        index (the bookie's busiest) is caught up by the answers, and here only when an entry log went."""
        with self._lock:
            for d in range(len(self.indexes)):
                self._catch_up(d, locations_too=False)
            self.opened()
            if self._watch is None:  # stock taken: nothing changed since, every key read
                self._watch = DbLedgerStorageWatch(self)
                return [], sum(held.size for held in self._watch.held)
            return self._watch.look()

    def unwatched(self) -> None:
        """Nobody follows the changes: what was kept to find them goes (the next look takes stock anew)."""
        with self._lock:
            if self._watch is not None:
                self._passes += self._watch.passes
                self._watch = None

    @property
    def index_passes(self) -> int:
        return self._passes + (self._watch.passes if self._watch is not None else 0)

    def refresh(self) -> None:
        with self._lock:
            for d in range(len(self.indexes)):
                self._catch_up(d)

    def opened(self) -> list[tuple[SecondaryIndex, SecondaryIndex]]:
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
            for d, (ledgers, _) in enumerate(self.opened()):
                value = ledgers.get(LEDGER_KEY.pack(ledger_id))
                if value is None:
                    continue
                data = dbledgerstorage_pb2.LedgerData()
                try:
                    data.ParseFromString(value)
                except DecodeError as exc:
                    raise SourceError(f"ledger {ledger_id}: unreadable LedgerData in {ledgers.db}: {exc}") from None
                limbo = limbo or data.limbo
                found.append(self._served(d, ledger_id))
        if not found:
            return None
        return (found[0] if len(found) == 1 else np.unique(np.concatenate(found))), limbo

    def _served(self, d: int, ledger_id: int) -> np.ndarray:
        """The entries the directory's `locations` index lists for the ledger whose entry log is there. An entry
        in a log not listed is looked up again after a catch-up, in a listing made after it: compaction moves
        entries, then removes the log they were in."""
        locations = self.indexes[d][1]
        entry_ids, logs = entries_listed(locations, ledger_id)
        if all(log in self._present(d) for log in np.unique(logs).tolist()):
            return entry_ids
        if not self._relisted[d]:  # once until the next catch-up: a log lost under many ledgers costs one
            locations.catch_up()
            self._logs[d], self._relisted[d] = None, True
            entry_ids, logs = entries_listed(locations, ledger_id)
        return entry_ids[np.isin(logs, np.fromiter(self._present(d), np.int64))]

    def availability(self, ledger_id: int) -> Holding | None:
        got = self.entry_ids(ledger_id)
        return None if got is None else Holding(codec.encode(got[0]), got[1], int(got[0].size))

    def list_ledgers(self, from_id: int, limit: int) -> tuple[np.ndarray, bool]:
        """The ledgers the `ledgers` indexes hold from `from_id` on, ascending, at most `limit`; and
        whether that is all of them. Keys only: a ledger's value is never read."""
        found: list[np.ndarray] = []
        complete = True
        with self._lock:
            for ledgers, _ in self.opened():
                keys: list[bytes] = []
                for key in ledgers.keys_from(LEDGER_KEY.pack(from_id)):
                    if len(keys) == limit:
                        complete = False
                        break
                    keys.append(key)
                found.append(np.frombuffer(b"".join(keys), dtype=">i8").astype(np.int64))
        ids = np.unique(np.concatenate(found)) if found else np.empty(0, np.int64)
        ids = ids[ids >= 0]  # bytewise order puts negative ids after the others: none is a ledger
        return ids[:limit], complete and ids.size <= limit

    def stored_bytes(self, ledger_id: int, most_entries: int = STORED_BYTES_MOST_ENTRIES,
                     throttle: Callable[[int], object] = lambda n: None) -> int | None:
        """The bytes the bookie stores for the ledger's entries (each entry's size field in its entry
        log); None when unknown: no such ledger, too many entries to look up, or a log not readable."""
        where = self.locations_of(ledger_id)
        if where is None or len(where) > most_entries:
            return None
        total = 0
        try:
            with OpenLogs(self.ledger_dirs) as logs:
                for d, _, location in where:
                    size, reason, _ = logs.size(d, location)
                    throttle(PAGE_BYTES)  # a random read of a size field costs the disk a page
                    if reason:
                        return None
                    total += size
        except OSError:
            return None
        return total

    # -- deep scrub --------------------------------------------------------------------------------

    def locations_of(self, ledger_id: int) -> list[tuple[int, int, int]] | None:
        """(directory index, entry id, location) of every entry the indexes list; None: no ledger."""
        out: list[tuple[int, int, int]] = []
        known = False
        with self._lock:
            for d, (ledgers, locations) in enumerate(self.opened()):
                if ledgers.get(LEDGER_KEY.pack(ledger_id)) is None:
                    continue
                known = True
                out += ((d, eid, struct.unpack(">q", value)[0]) for eid, value in index_entries(locations, ledger_id))
        return sorted(out, key=lambda t: t[1]) if known else None

    def _location_now(self, d: int, ledger_id: int, entry_id: int) -> int | None:
        """The entry's location after catching up with the bookie (compaction may have moved it)."""
        with self._lock:
            self._catch_up(d)
            ledgers, locations = self.indexes[d]
            if ledgers.get(LEDGER_KEY.pack(ledger_id)) is None:
                return None
            value = locations.get(ENTRY_KEY.pack(ledger_id, entry_id))
        return None if value is None else int(struct.unpack(">q", value)[0])

    def verify(self, ledger_id: int, digest_type: str, password: bytes | None,
               throttle: Callable[[int], object] = lambda n: None,
               verified: Callable[[int, bytes], object] | None = None) -> Verification | None:
        """Read and verify every entry the index lists (None: no such ledger). A copy that fails is
        read again at its current location before it is believed: compaction moves entries (and
        removes the old log), and an entry gone from the index meanwhile is not held any more."""
        where = self.locations_of(ledger_id)
        if where is None:
            return None
        good: list[int] = []
        hashes: list[bytes] = []
        corrupt: list[tuple[int, str, str]] = []
        read = 0
        try:
            with OpenLogs(self.ledger_dirs) as logs:
                for d, eid, location in where:
                    for attempt in (1, 2):
                        stored, reason, detail = logs.read(d, location)
                        read += len(stored)
                        throttle(len(stored) + entrylog.ENTRY_SIZE.size)
                        if not reason:
                            verdict = entrylog.verify_entry(stored, ledger_id, eid, digest_type, password)
                            reason, detail = verdict.reason, verdict.detail
                        if not reason:
                            good.append(eid)
                            hashes.append(verdict.payload_hash)
                            if verified is not None:
                                verified(eid, verdict.payload)
                            break
                        if attempt == 2:
                            corrupt.append((eid, reason, detail))
                            break
                        now = self._location_now(d, ledger_id, eid)
                        if now is None:
                            break  # deleted meanwhile: not held, not corrupt
                        logs.close()  # the log may have been replaced: open it again
                        location = now
        except OSError as exc:  # the disk failing under the read: the agent cannot tell (EIO)
            raise SourceError(f"ledger {ledger_id}: reading the entry logs: {exc}") from None
        return Verification(np.array(good, dtype=np.int64), b"".join(hashes), corrupt, read,
                            digest_type != "DUMMY" and (digest_type != "HMAC" or password is not None))

    def last_entry(self, ledger_id: int, digest_type: str, password: bytes | None,
                   throttle: Callable[[int], object] = lambda n: None) -> tuple[int, bytes] | None:
        """The last entry the indexes list whose stored bytes verify, and its payload; None: none does."""
        where = self.locations_of(ledger_id) or []
        try:
            with OpenLogs(self.ledger_dirs) as logs:
                for d, eid, location in reversed(where[-LAST_ENTRY_TRIES:]):
                    stored, reason, _ = logs.read(d, location)
                    throttle(len(stored) + entrylog.ENTRY_SIZE.size)
                    verdict = None if reason else entrylog.verify_entry(stored, ledger_id, eid, digest_type, password)
                    if verdict is not None and not verdict.reason:
                        return eid, verdict.payload
        except OSError as exc:
            raise SourceError(f"ledger {ledger_id}: reading the entry logs: {exc}") from None
        return None

    def close(self) -> None:
        with self._lock:
            for ledgers, locations in self.indexes:
                ledgers.close()
                locations.close()
        if self._own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

