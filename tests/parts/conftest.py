"""What the parts' tests of a live DbLedgerStorage bookie share."""

from __future__ import annotations

from collections.abc import Iterator
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
