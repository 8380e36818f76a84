"""What changed in what a DbLedgerStorage bookie holds (continuous scrutiny, the bookie's side)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from scrutiny import entrylog
from scrutiny.changefeed import Change, Kind
from scrutiny.entrysources.entrylogs import log_ids_in
from scrutiny.entrysources.layout import LEDGER_KEY, LOCATION, index_entries
from scrutiny.entrysources.rocksdb import IndexState, SecondaryIndex
from scrutiny.entrysources.rocksdbwal import WalTail, Write

KEYS_PASS_AT_LEAST_EVERY_SECONDS = 300.0  # a keys-only pass when the index moved, even without a new delete
KEYS_PASS_CPU_SHARE = 0.01  # whole passes take at most this share of a core: a pass of 0.1 s waits 10 s
KEYS_PASS_CHEAP_SECONDS = 0.01  # ... but a pass cheaper than this (an index of a few thousand ledgers) never waits


def holds(held: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Which of `ids` the ascending `held` has (a search per id: never a pass over `held`)."""
    return found_at(held, ids, np.searchsorted(held, ids))


def found_at(held: np.ndarray, ids: np.ndarray, at: np.ndarray) -> np.ndarray:
    """`holds`, given where each id would go in `held` (its searchsorted positions)."""
    if not held.size:
        return np.zeros(ids.size, bool)
    return held[np.minimum(at, held.size - 1)] == ids


class WatchedBookie(Protocol):
    """What the watch reads of its source, and tells it, under the source's lock."""

    ledger_dirs: list[Path]
    indexes: list[tuple[SecondaryIndex, SecondaryIndex]]  # per directory: `ledgers`, `locations`

    def cookie(self, d: int) -> bytes | None: ...

    def opened(self) -> list[tuple[SecondaryIndex, SecondaryIndex]]: ...


class DbLedgerStorageWatch:
    """What a DbLedgerStorageSource remembers between two looks at its bookie (under the source's lock).
    Per directory: the cookie, the `ledgers` index's keys, and every entry log's ledgers map (read once, when
    the log is finished; the directory listed again only when its modification time moved).

    The keys are read whole once, then kept up to date from the index's write-ahead log: what the bookie put
    and deleted since the last look, read from where the last look stopped. When the WAL cannot tell (a WAL
    file removed before its end was read, after a flush of the index's memtable, which the bookie seldom
    makes; a WAL this reader cannot read), the keys are read whole again (a keys-only pass) when a key may
    have been deleted, no sooner than KEYS_PASS_CPU_SHARE allows (on a bookie whose garbage collector
    deletes at every look, a pass of its whole index costs what a pass costs, not a pass a look), and at
    least every KEYS_PASS_AT_LEAST_EVERY_SECONDS while the index moves."""

    def __init__(self, source: WatchedBookie, clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.clock = source, clock
        self.cookies: list[bytes | None] = []
        self.sequences: list[int] = []  # as of the last keys-only pass
        self.states: list[IndexState] = []  # as of the last look
        self.deleted: list[bool] = []  # a key may have been deleted since the last keys-only pass
        self.passed: list[float] = []  # when the last keys-only pass was made
        self.pass_cost: list[float] = []  # ... and the CPU seconds it took
        self.held: list[np.ndarray] = []
        self.wals: list[WalTail] = []  # per directory: the `ledgers` index's WAL, followed from the last pass
        self.listed: list[int] = []  # the `current` directory's mtime when its entry logs were listed
        self.logs: list[dict[int, list[int] | None]] = []
        self.passes = 0  # keys-only passes made, stock taking included
        for d, (ledgers, _) in enumerate(source.opened()):
            self.cookies.append(source.cookie(d))
            self.sequences.append(0)
            self.states.append(ledgers.state())
            self.deleted.append(False)
            self.passed.append(0.0)
            self.pass_cost.append(0.0)
            self.held.append(np.empty(0, np.int64))
            self.wals.append(WalTail(ledgers.db))
            self._take_stock(d, ledgers)
            self.listed.append(0)
            self.logs.append({})
            self._list_logs(d)

    def _list_logs(self, d: int) -> None:
        """The directory's entry logs as they are now, each one's ledgers map read."""
        self.listed[d] = self._mtime(d)
        self.logs[d] = {lid: self._map(d, lid) for lid in log_ids_in(self.source.ledger_dirs[d])}

    def _take_stock(self, d: int, ledgers: SecondaryIndex) -> int:
        """The directory's `ledgers` index as it is now, what later looks compare with; keys read."""
        self.states[d] = ledgers.state()
        self.sequences[d] = self.states[d].sequence
        self.deleted[d], self.passed[d] = False, self.clock()
        cpu = time.thread_time()
        self.passes += 1
        self.held[d] = self._keys(ledgers)
        self.pass_cost[d] = time.thread_time() - cpu
        self.wals[d].follow_from(self.sequences[d])
        return int(self.held[d].size)

    def _mtime(self, d: int) -> int:
        try:
            return (self.source.ledger_dirs[d] / "current").stat().st_mtime_ns
        except OSError:
            return -1

    def _keys(self, ledgers: SecondaryIndex, after: int = -1) -> np.ndarray:
        """The ledger ids in the index (above `after`), ascending."""
        keys = b"".join(ledgers.keys_from(LEDGER_KEY.pack(after + 1)))
        ids = np.frombuffer(keys, dtype=">i8").astype(np.int64)
        return np.sort(ids[ids > after])

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

    def look(self) -> tuple[list[Change], int]:
        source, changes, read = self.source, [], 0
        gone_ledgers: list[np.ndarray] = []
        gone_logs: list[tuple[int, int, list[int] | None]] = []
        for d, (ledgers, _) in enumerate(source.indexes):
            cookie = source.cookie(d)
            if cookie != self.cookies[d] or ledgers.identity != self.states[d].identity:  # another instance
                why = "cookie changed" if cookie != self.cookies[d] else "`ledgers` index was created anew"
                changes.append(Change(Kind.BOOKIE_RESET, detail=f"the {why} in {source.ledger_dirs[d]}",
                                      every_ledger=True))
                self.cookies[d] = cookie
                self._list_logs(d)
                read += self._take_stock(d, ledgers)
            else:
                read += self._look_at_ledgers(d, ledgers, changes, gone_ledgers)
            mtime = self._mtime(d)
            # an entry log created or removed; a time too recent may hide a second change (coarse clocks)
            if mtime != self.listed[d] or time.time_ns() - mtime < 2_000_000_000:
                self.listed[d] = mtime
                present = log_ids_in(self.source.ledger_dirs[d])
                gone_logs += [(d, log_id, self.logs[d].pop(log_id)) for log_id in set(self.logs[d]) - present]
                for log_id in present - self.logs[d].keys():
                    self.logs[d][log_id] = None
            for log_id in [i for i, mapped in self.logs[d].items() if mapped is None]:
                self.logs[d][log_id] = self._map(d, log_id)  # the map is written when the log is finished
        if gone_ledgers:
            ids = np.unique(np.concatenate(gone_ledgers))
            for held in self.held:  # held in no directory
                ids = ids[~holds(held, ids)]
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

    def _look_at_ledgers(self, d: int, ledgers: SecondaryIndex, changes: list[Change],
                         gone_ledgers: list[np.ndarray]) -> int:
        """The directory's `ledgers` index since the last look: the ledgers created (keys above the highest
        known), and gone (a keys-only pass, when a delete may be among the changes); keys read."""
        state, last, now, read = ledgers.state(), self.states[d], self.clock(), 0
        sequence = state.sequence
        moved, replaced = sequence != self.sequences[d], sequence < self.sequences[d]
        wal = self.wals[d]
        following = wal.next_sequence >= 0
        writes = None if replaced else wal.read(sequence)
        if writes is not None:
            self.states[d], self.sequences[d] = state, sequence
            return self._apply(d, writes, changes, gone_ledgers)
        if following and moved:  # the WAL lost: what the writes since the last look were is not known
            self.deleted[d] = True
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
            self.passes += 1
            held = self._keys(ledgers)
            self.pass_cost[d], self.deleted[d] = time.thread_time() - cpu, False
            read += held.size
            if held.size == 0 < self.held[d].size or replaced:
                changes.append(Change(Kind.BOOKIE_RESET, every_ledger=True, detail=f"the ledgers index of "
                                      f"{self.source.ledger_dirs[d]} was emptied or replaced"))
            gone_ledgers.append(np.setdiff1d(self.held[d], held, assume_unique=True))
            self.held[d], self.sequences[d], self.passed[d] = held, sequence, now
            wal.follow_from(sequence)
        elif moved:  # the ledgers created since (ids only grow); a delete waits for its pass
            newer = self._keys(ledgers, int(self.held[d][-1]) if self.held[d].size else -1)
            read += newer.size
            self.held[d] = np.concatenate((self.held[d], newer))
        self.states[d] = state
        return read

    def _apply(self, d: int, writes: list[Write], changes: list[Change], gone_ledgers: list[np.ndarray]) -> int:
        """The WAL's puts and deletes of ledgers since the last look, applied to the keys held (a few keys
        found in the sorted array, never a pass over it); writes read."""
        last: dict[bytes, bool] = {w.key: w.deleted for w in writes if len(w.key) == LEDGER_KEY.size}
        if not last:
            return len(writes)
        ids = np.frombuffer(b"".join(last), dtype=">i8").astype(np.int64)
        deleted = np.fromiter(last.values(), dtype=bool, count=len(last))
        held = self.held[d]
        at = np.searchsorted(held, ids)
        present = found_at(held, ids, at)
        gone, new = present & deleted, ~present & ~deleted
        if gone.any():
            gone_ledgers.append(np.sort(ids[gone]))
            if gone.sum() == held.size:
                changes.append(Change(Kind.BOOKIE_RESET, every_ledger=True, detail=f"the ledgers index of "
                                      f"{self.source.ledger_dirs[d]} was emptied"))
            held = np.delete(held, at[gone])
        if new.any():
            added = np.unique(ids[new])
            held = np.insert(held, np.searchsorted(held, added), added)
        self.held[d] = held
        return len(writes)

    def _log_gone(self, d: int, log_id: int, mapped: list[int] | None) -> tuple[Change | None, int]:
        """An entry log removed: the ledgers of its map (of every ledger held, for the log being written, which
        has no map yet) still held whose locations still point into it."""
        source = self.source
        ledgers, locations = source.indexes[d]
        affected, read = [], 0
        for lid in self._keys(ledgers).tolist() if mapped is None else mapped:
            if ledgers.get(LEDGER_KEY.pack(lid)) is None:
                continue
            for _, value in index_entries(locations, lid):
                read += 1
                if entrylog.split_location(LOCATION.unpack(value)[0])[0] == log_id:
                    affected.append(lid)
                    break
        if not affected:
            return None, read  # garbage collection as it should be: nothing held points into it
        return Change(Kind.ENTRY_LOG_GONE, tuple(sorted(affected)), f"{log_id:x}.log of {source.ledger_dirs[d]} "
                      "is gone while the index still points into it", entry_log=log_id), read

