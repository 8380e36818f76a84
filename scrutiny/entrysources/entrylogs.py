"""A DbLedgerStorage bookie's entry logs, read where its `locations` index says each entry is: the entry's size
field, its stored bytes, or why they cannot be read. Read-only, each log opened once per call (with
O_NOATIME where the agent owns it) and closed at its end; nothing of the bookie's changes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from scrutiny import entrylog

MAX_ENTRY_BYTES = 64 * 1024 * 1024  # larger than any entry a bookie accepts (nettyMaxFrameSizeBytes)


def log_ids_in(ledger_dir: Path) -> set[int]:
    """The ids of the entry logs in a ledger directory now."""
    with os.scandir(ledger_dir / "current") as it:
        return {i for e in it if (i := entrylog.log_id_of(e.name)) is not None}


class OpenLogs:
    """The entry logs one call reads, per ledger directory; a context manager that closes them."""

    def __init__(self, ledger_dirs: Sequence[Path]) -> None:
        self.ledger_dirs = ledger_dirs
        self._fds: dict[tuple[int, int], int | None] = {}

    def __enter__(self) -> OpenLogs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _log(self, d: int, log_id: int) -> int | None:
        """Directory `d`'s log, opened read-only once, None when it does not exist."""
        key = (d, log_id)
        if key not in self._fds:
            path = entrylog.log_path(self.ledger_dirs[d], log_id)
            try:
                self._fds[key] = os.open(path, os.O_RDONLY | getattr(os, "O_NOATIME", 0))
            except PermissionError:  # O_NOATIME needs the file's owner
                self._fds[key] = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                self._fds[key] = None
        return self._fds[key]

    def size(self, d: int, location: int) -> tuple[int, str, str]:
        """The size field of the entry at a location (its log open, the size sane), or why not."""
        log_id, pos = entrylog.split_location(location)
        fd = self._log(d, log_id)
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

    def read(self, d: int, location: int) -> tuple[bytes, str, str]:
        """The stored bytes at a location, or why they cannot be read."""
        size, reason, detail = self.size(d, location)
        if reason:
            return b"", reason, detail
        log_id, pos = entrylog.split_location(location)
        fd = self._fds[(d, log_id)]
        assert fd is not None  # size() found the log
        stored = os.pread(fd, size, pos)
        if len(stored) < size:
            return stored, entrylog.TRUNCATED, f"log {log_id:x}.log has {len(stored)} of {size} bytes at {pos}"
        return stored, "", ""

    def close(self) -> None:
        """Every log closed: the next read opens it again (compaction may have replaced it)."""
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds.clear()
