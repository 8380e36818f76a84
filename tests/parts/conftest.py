"""What the parts' tests of a live DbLedgerStorage bookie share."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scrutiny import entrylog
from scrutiny.testing.clusterwriter import cookie
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie


def stored(lid: int, eid: int) -> bytes:
    """An entry of the ledger as its client packages it (CRC32C)."""
    return entrylog.package_entry(lid, eid, eid - 1, 0, b"x" * 64, "CRC32C")


@pytest.fixture
def bookie(tmp_path: Path) -> Iterator[tuple[Path, LiveBookie]]:
    """Ledgers 1-3 in entry log 1 (finished: it has its ledgers map), 4-5 in log 2, 6 in log 3 (still being
    written: no map yet), ten entries each; the bookie is live (its indexes open read-write) and has a cookie."""
    path = tmp_path / "bookie"
    live = LiveBookie(path)
    for log_id, ledgers in ((1, (1, 2, 3)), (2, (4, 5)), (3, (6,))):
        log = EntryLog(path, log_id)
        for lid in ledgers:
            live.write(lid, {e: stored(lid, e) for e in range(10)}, log)
        if log_id < 3:
            log.finish()
    live.flush()
    (path / "current" / "VERSION").write_bytes(cookie("127.0.8.1:3181", "one"))
    yield path, live
    live.close()


@dataclass
class Writing:
    """What a bookie writing, flushing and restarting has done so far (`writing_flushing_restarting`)."""

    written: list[int] = field(default_factory=list)  # its ledgers, in the order written (two entries each)
    moves: Counter[str] = field(default_factory=Counter)  # its flushes and restarts
    lock: threading.Lock = field(default_factory=threading.Lock)

    def last(self, n: int) -> list[int]:
        with self.lock:
            return self.written[-n:]


@contextmanager
def writing_flushing_restarting(bookie: LiveBookie, first: int = 0) -> Iterator[Writing]:
    """The bookie creates ledgers from `first` on as fast as it can, flushing its memtables every 200 ledgers and
    restarting (its recovery flushes every write-ahead log) every 600, until the block ends."""
    done, stop = Writing(), threading.Event()

    def churn() -> None:
        lid = first
        while not stop.is_set():
            for _ in range(20):
                bookie.add(lid, range(2))
                with done.lock:
                    done.written.append(lid)
                lid += 1
            if (lid - first) % 600 == 0:
                bookie.restart()
                done.moves["restarts"] += 1
            elif (lid - first) % 200 == 0:
                bookie.flush()
                done.moves["flushes"] += 1
            time.sleep(0.002)

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        yield done
    finally:
        stop.set()
        churner.join(10)
