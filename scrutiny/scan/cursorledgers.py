"""Where a live broker keeps a cursor's position: the last entry of the cursor's own ledger (`PositionInfo`: the
mark-delete and its properties), asked of the agents of that ledger's current ensemble; a cursor its broker
closed keeps it inline in its record. Deduplication's snapshot (cursor `pulsar.dedup`) and the compacted ledger a
compaction names (cursor `__compaction`) are such properties."""

from __future__ import annotations

import logging

from scrutiny.bookieclient import BookieClient
from scrutiny.config import ScanSettings
from scrutiny.deepclient import DeepScrubClient
from scrutiny.errors import MetadataError
from scrutiny.pulsar.records import CursorRecord, Position, position_entry
from scrutiny.store import MetadataStore
from scrutiny.store.facts import ClusterFacts

log = logging.getLogger(__name__)


class CursorLedgers:
    """Cursors' positions, their ledgers read through one client opened for the phase, if ever."""

    def __init__(self, settings: ScanSettings, store: MetadataStore) -> None:
        self.settings, self.store = settings, store
        self._client: BookieClient | None = None

    def mark_delete(self, topic: str, cursor: CursorRecord) -> tuple[Position, dict[str, int]] | None:
        """The cursor's mark-delete and its properties; None when neither its record nor its ledger gives them."""
        if cursor.mark_delete is not None:
            return cursor.mark_delete, dict(cursor.properties)
        data = self.last_entry(cursor.ledger_id) if cursor.ledger_id >= 0 else None
        if data is None:
            return None
        try:
            return position_entry(f"{topic}'s cursor {cursor.name}, ledger {cursor.ledger_id}", data)
        except MetadataError as exc:  # another version's entry (compressed, chunked): nothing judged against it
            log.info("%s", exc)
            return None

    def last_entry(self, ledger_id: int) -> bytes | None:
        md = next(iter(self.store.read_ledgers([ledger_id]))).metadata
        if md is None or not md.segments:
            return None
        if self._client is None:
            self._client = BookieClient.from_settings(self.settings, ClusterFacts.read(self.store).agent_addresses)
        got = [g for b in md.segments[-1].ensemble
               if (g := DeepScrubClient(self._client).last_entry(b, md, self.settings.deep_send_passwords)) is not None]
        return max(got)[1] if got else None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
