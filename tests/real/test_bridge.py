"""The stock bookie behind the bridge source: a real SortedLedgerStorage bookie answers BookKeeper's v3
GET_LIST_OF_ENTRIES_OF_LEDGER, and the bridge relays what it holds; a real DbLedgerStorage bookie never answers it
(`DbLedgerStorage.getListOfEntriesOfLedger` throws UnsupportedOperationException, which the v3 processor does not
catch: apache/bookkeeper #2078), which is why the agent reads a DbLedgerStorage bookie's own index."""

from __future__ import annotations

import time

import pytest

from scrutiny import codec
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.config import ScanSettings
from scrutiny.entrysources.bridge import BookieBridgeSource
from scrutiny.entrysources.source import SourceError
from scrutiny.store import open_store
from scrutiny.testing.realbookkeeper import DB_LEDGER_STORAGE, SORTED_LEDGER_STORAGE, RealBookKeeper


def test_a_stock_bookie_answers_the_bridge_and_a_dbledgerstorage_bookie_never_does(
        bookkeeper: RealBookKeeper) -> None:
    stock = bookkeeper.add_bookie(SORTED_LEDGER_STORAGE)
    db = bookkeeper.add_bookie(DB_LEDGER_STORAGE)
    client = bookkeeper.client()
    ledger, last = client.create(2, 2, 2, "CRC32C", entries=25)
    with open_store(ScanSettings(metadata_service_uri=bookkeeper.uri)) as store:
        md = next(store.read_ledgers([ledger])).metadata
    assert md is not None and md.last_entry_id == last == 24
    bridge = BookieBridgeSource("127.0.0.1", stock.port, timeout=5)
    try:
        held = bridge.availability(ledger)
        assert held is not None and codec.decode(held.availability).entry_ids().tolist() == list(range(25))
        assert bridge.availability(ledger + 1000) is None  # ENOLEDGER
    finally:
        bridge.close()
    expected = Availability.of(expected_share(md, stock.bookie_id)).entry_ids().tolist()
    assert expected == list(range(25))
    silent = BookieBridgeSource("127.0.0.1", db.port, timeout=3)
    t0 = time.monotonic()
    try:
        with pytest.raises(SourceError, match="timed out"):
            silent.availability(ledger)
    finally:
        silent.close()
    assert time.monotonic() - t0 >= 3
