"""A bookie's ledger directory written in BookKeeper's formats (entry log 1 and both indexes), for the
deep scrub's tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scrutiny import entrylog
from scrutiny.metadata import LedgerMetadata, LedgerState, Segment
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie


@dataclass
class Bookie:
    """One bookie's ledger directory: entry log 1 and both indexes."""

    path: Path
    index: LiveBookie
    log: EntryLog
    mds: dict[int, LedgerMetadata] = field(default_factory=dict)

    def store(self, md: LedgerMetadata, entries: dict[int, bytes]) -> None:
        self.mds[md.ledger_id] = md
        self.index.write(md.ledger_id, entries, self.log)

    def seal(self) -> None:
        self.log.finish()
        self.index.flush()

    def log_bytes(self) -> bytearray:
        return bytearray(entrylog.log_path(self.path, 1).read_bytes())

    def rewrite_log(self, data: bytes) -> None:
        entrylog.log_path(self.path, 1).write_bytes(data)

    def pos(self, lid: int, eid: int) -> int:
        return entrylog.split_location(self.index.location(lid, eid))[1]


def ledger(lid: int, ens: list[str], digest_type: str = "CRC32C", last: int = 19) -> LedgerMetadata:
    return LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, last, 0, (Segment(0, tuple(ens)),),
                          digest_type=digest_type, password=b"pw")
