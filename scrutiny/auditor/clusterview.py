"""What the console asks the cluster live, apart from the runs: the run history the leaders keep in the
store, the bookies registered now and their racks, one ledger's metadata, and what each of its bookies
holds of it now (one short call each)."""

from __future__ import annotations

from collections.abc import Callable

from scrutiny.auditor import history
from scrutiny.bookieclient import BookieClient
from scrutiny.checks import BookieAnswer
from scrutiny.config import ScanSettings
from scrutiny.errors import StoreError
from scrutiny.metadata import LedgerMetadata
from scrutiny.store import LedgerRead, MetadataStore


class ClusterView:
    def __init__(self, store: Callable[[], MetadataStore], scan: Callable[[], ScanSettings]) -> None:
        self._store, self._scan = store, scan  # the leader's connected store, the settings as reloaded

    def run_history(self) -> list[history.RunPoint]:
        try:
            return history.read(self._store())
        except StoreError:
            return []

    def bookies_now(self) -> tuple[dict[str, str], dict[str, str]]:
        """(bookie -> writable | read-only, bookie -> rack) as the store says now."""
        store = self._store()
        regs = store.registrations()
        racks = dict(self._scan().racks) or store.racks(self._scan().racks_znode)[0]
        return {**dict.fromkeys(regs.writable, "writable"), **dict.fromkeys(regs.readonly, "read-only")}, racks

    def ledger(self, ledger_id: int) -> LedgerRead:
        return next(iter(self._store().read_ledgers([ledger_id])))

    def ask_bookies(self, md: LedgerMetadata, deadline: float = 3.0) -> dict[str, BookieAnswer | None]:
        """What each bookie of the ledger holds of it now (one short call each, in parallel)."""
        s = self._scan()
        addresses = {**self._store().agent_addresses(), **s.bookie_endpoints}
        with BookieClient.from_settings(s, addresses) as client:
            client.retries = 0  # a page waits for one look, not for backoffs
            got = client.fetch_many({b: [md.ledger_id] for b in md.bookies}, deadline)
        return {b: a.get(md.ledger_id) for b, a in got.items()}
