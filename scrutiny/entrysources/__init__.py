"""Where a bookie agent learns which entries its bookie holds: one source per agent (`source`: what every
source answers, and the capabilities some declare).

- `dbledgerstorage`: the bookie's RocksDB indexes (Pulsar's default storage, which upstream cannot serve),
  read as secondaries (`rocksdb`) in DbLedgerStorage's layout (`layout`), and what changed in them
  (`dbwatch`);
- `bridge`: a stock bookie (Sorted/InterleavedLedgerStorage) asked over BookKeeper's own v3 protocol;
- `synthetic`: a compact file per bookie for the demo, the tests and the benchmarks (its format, its
  reader, its writer).
"""

from __future__ import annotations

from scrutiny.entrysources.bridge import BookieBridgeSource
from scrutiny.entrysources.dbledgerstorage import DbLedgerStorageSource
from scrutiny.entrysources.source import (
    AnswersMany,
    EntrySource,
    Holding,
    ListsLedgers,
    ReadsEntries,
    SourceError,
    Verification,
    WatchesChanges,
)
from scrutiny.entrysources.synthetic import SyntheticStore

__all__ = ["AnswersMany", "BookieBridgeSource", "DbLedgerStorageSource", "EntrySource", "Holding", "ListsLedgers",
           "ReadsEntries", "SourceError", "SyntheticStore", "Verification", "WatchesChanges"]
