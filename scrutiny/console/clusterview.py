"""What the console asks the cluster live, apart from the runs: the run history the leaders keep in the
store, the bookies registered now and their racks, one ledger's metadata, what each of its bookies holds
of it now (one short call each), and one topic's record, or a tenant's or namespace's, in Pulsar's metadata
store."""

from __future__ import annotations

from collections.abc import Callable

from scrutiny.auditor.face import RunPoint, run_history
from scrutiny.bookieclient import BookieClient
from scrutiny.checks import BookieAnswer
from scrutiny.checks.sequences import MessageCheckpoint
from scrutiny.config import ScanSettings
from scrutiny.errors import StoreError
from scrutiny.metadata import LedgerMetadata
from scrutiny.pulsar.scope import Scope
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.scan.messages import checkpoint_record
from scrutiny.scan.topics import pulsar_store
from scrutiny.store import LedgerRead, MetadataStore


class ClusterView:
    def __init__(self, store: Callable[[], MetadataStore], scan: Callable[[], ScanSettings]) -> None:
        self._store, self._scan = store, scan  # the leader's connected store, the settings as reloaded

    def run_history(self) -> list[RunPoint]:
        try:
            return run_history(self._store())
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

    def messages(self, topic: str) -> MessageCheckpoint:
        """Where the validation of the topic's messages stands (its deep runs' checkpoint)."""
        return checkpoint_record(topic).read(self._store())

    def topic(self, topic: str) -> tuple[PulsarRecord, dict[int, LedgerRead]]:
        """The topic's record (its managed ledger, cursors and schema), and BookKeeper's metadata of each
        ledger it names."""
        store = self._store()
        with pulsar_store(store, self._scan()) as pulsar:
            record = PulsarRecord.decode(pulsar.pulsar_records([topic]))
        ids = sorted({n.ledger_id for n in record.needs()})
        return record, {r.ledger_id: r for r in store.read_ledgers(ids)}

    def topics_in(self, scope: Scope) -> PulsarRecord:
        """The records of every topic of a tenant or namespace, as they are now."""
        with pulsar_store(self._store(), self._scan()) as pulsar:
            return PulsarRecord.decode(pulsar.pulsar_records([], under=[scope.name]))
