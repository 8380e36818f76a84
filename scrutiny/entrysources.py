"""Where a bookie agent learns which entries its bookie holds. One source per agent:

- DbLedgerStorageSource: the bookie's RocksDB `locations` index (Pulsar's default storage, which
  upstream cannot serve), opened read-only through a scratch view so the live bookie's files are never
  touched. Entries still in the bookie's write cache (the last flushInterval: 10 s in BookKeeper,
  60 s in Pulsar) are not in the index yet.
- BookieBridgeSource: a stock bookie (Sorted/InterleavedLedgerStorage) asked over BookKeeper's own v3
  protocol, GET_LIST_OF_ENTRIES_OF_LEDGER; its answer is relayed as it is.
- SyntheticStore: a compact file per bookie for the demo, the tests and the benchmarks.

Every source answers `availability(ledger_id)`: the BP-34 encoding, None for "no such ledger", or
SourceError when it cannot tell (the agent answers EIO).
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from scrutiny import codec
from scrutiny.bookkeeper import bookie_protocol_pb2 as bkp
from scrutiny.errors import StoreError


class SourceError(StoreError):
    """The source could not tell which entries it holds (mapped to EIO)."""


class EntrySource(Protocol):
    def availability(self, ledger_id: int) -> bytes | None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# DbLedgerStorage: RocksDB `locations` index, key = ledger id, entry id (big-endian int64 each)

_KEY = struct.Struct(">qq")
_SKIPPED_FILES = ("LOCK", "rocksdict-config.json")


class DbLedgerStorageSource:
    """Reads `<dir>/current/locations` of every ledger (or index) directory and takes the union:
    a ledger lives in directory `id % number_of_dirs`, but a changed directory list leaves old
    data where it was."""

    def __init__(self, ledger_dirs: Sequence[str | Path], scratch_dir: str | Path | None = None,
                 refresh_seconds: float = 5.0) -> None:
        self.dbs = [Path(d) / "current" / "locations" for d in ledger_dirs]
        missing = [str(p) for p in self.dbs if not (p / "CURRENT").exists()]
        if missing:
            raise SourceError(f"no RocksDB locations index at {', '.join(missing)}")
        self._own_scratch = scratch_dir is None
        self.scratch = Path(scratch_dir or tempfile.mkdtemp(prefix="scrutiny-dbls-"))
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._opened_at = 0.0
        self._handles: list[Any] = []
        self._generation = 0

    def _view(self, db: Path, index: int) -> Path:
        """A scratch directory of symlinks to the live files: RocksDB (and rocksdict's own config
        file) can write there without touching the bookie's directory."""
        view = self.scratch / f"view-{self._generation}-{index}"
        view.mkdir(parents=True)
        for name in os.listdir(db):
            if name in _SKIPPED_FILES or name.startswith("LOG"):
                continue
            os.symlink(db / name, view / name)
        return view

    def _open(self) -> list[Any]:
        from rocksdict import AccessType, Options, Rdict

        with self._lock:
            if self._handles and time.monotonic() - self._opened_at < self.refresh_seconds:
                return self._handles
            self._close_handles()
            self._generation += 1
            handles: list[Any] = []
            for i, db in enumerate(self.dbs):
                for attempt in range(3):
                    try:
                        view = self._view(db, i * 10 + attempt)
                        handles.append(Rdict(str(view), options=Options(raw_mode=True),
                                             access_type=AccessType.read_only(False)))
                        break
                    except Exception as exc:  # a compaction may remove a file under the view
                        if attempt == 2:
                            raise SourceError(f"cannot open the locations index {db}: {exc}") from None
            self._handles, self._opened_at = handles, time.monotonic()
            return handles

    def entry_ids(self, ledger_id: int) -> np.ndarray | None:
        found: list[int] = []
        seen = False
        for handle in self._open():
            it = handle.iter()
            it.seek(_KEY.pack(ledger_id, 0))
            while it.valid():
                lid, eid = _KEY.unpack(it.key())
                if lid != ledger_id:
                    break
                seen = True
                if eid >= 0:  # bytewise order puts negative (special) ids after the real ones
                    found.append(eid)
                it.next()
        return np.array(found, dtype=np.int64) if seen else None

    def availability(self, ledger_id: int) -> bytes | None:
        ids = self.entry_ids(ledger_id)
        return None if ids is None else codec.encode(ids)

    def _close_handles(self) -> None:
        for h in self._handles:
            with contextlib.suppress(Exception):
                h.close()
        self._handles = []
        for old in self.scratch.glob("view-*"):
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._close_handles()
        if self._own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Bridge to a stock bookie over BookKeeper's v3 protocol

MAX_FRAME = 5 * 1024 * 1024
_LEN = struct.Struct(">i")


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

    def availability(self, ledger_id: int) -> bytes | None:
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
        if status != bkp.EOK or resp.status != bkp.EOK:
            raise SourceError(f"bookie answered {bkp.BKStatusCode.Name(status if status else resp.status)}")
        return bytes(inner.availabilityOfEntriesOfLedger)

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
        with open(self.path, "rb") as f:
            head = f.read(_HEAD.size)
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

    def availability(self, ledger_id: int) -> bytes | None:
        i = int(np.searchsorted(self._ids, ledger_id))
        if i >= self._ids.size or int(self._ids[i]) != ledger_id:
            return None
        start, count = int(self._index[i, 1]), int(self._index[i, 2])
        if count == CORRUPT:
            return codec.encode([1, 2, 3])[:70]  # a truncated answer: refused by every decoder
        g = self._groups[start:start + count]
        arr = np.empty(count, dtype=[("first", ">i8"), ("last", ">i8"), ("size", ">i4"), ("period", ">i4")])
        arr["first"], arr["last"], arr["size"], arr["period"] = g[:, 0], g[:, 1], g[:, 2], g[:, 3]
        return struct.pack(">ii", codec.CURRENT_VERSION, count) + bytes(56) + arr.tobytes()

    def close(self) -> None:
        pass
