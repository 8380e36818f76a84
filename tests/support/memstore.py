"""A second metadata store, in memory: proof that another store is one module plus a URI scheme
(`mem://<cluster>`). Clusters live in this process; each `open_store` is a new session on one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from scrutiny.config import ClusterSettings
from scrutiny.metadata import BookieRegistration, LedgerMetadata, UnderreplicationMark
from scrutiny.pulsar.snapshot import StoredRecords
from scrutiny.store import (
    BACKENDS,
    Election,
    LedgerRange,
    LedgerRead,
    MetadataStore,
    MetadataStoreUnavailable,
    Registration,
    Registrations,
    chunk_ids,
)


@dataclass
class MemoryCluster:
    ledgers: dict[int, LedgerMetadata] = field(default_factory=dict)
    marks: dict[int, UnderreplicationMark] = field(default_factory=dict)
    bookies: dict[str, BookieRegistration] = field(default_factory=dict)
    racks: dict[str, str] = field(default_factory=dict)
    agents: dict[str, str] = field(default_factory=dict)
    auditor_records: dict[str, bytes] = field(default_factory=dict)
    lost_bookie_recovery_delay: int | None = None
    replication_disabled: bool = False
    up: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)


CLUSTERS: dict[str, MemoryCluster] = {}


def install() -> None:
    BACKENDS["mem"] = __name__


def open_store(settings: ClusterSettings) -> MemoryStore:
    name = settings.metadata_service_uri.removeprefix("mem://").split("/", 1)[0]
    cluster = CLUSTERS.get(name)
    if cluster is None or not cluster.up:
        raise MetadataStoreUnavailable(f"no memory cluster {name!r} up")
    return MemoryStore(cluster)


class _Unregister:
    def __init__(self, agents: dict[str, str], bookie_id: str) -> None:
        self.agents, self.bookie_id = agents, bookie_id

    def close(self) -> None:
        self.agents.pop(self.bookie_id, None)


class _FirstComer:
    """An election where the first to run leads until it returns."""

    holder: str | None = None
    lock = threading.Lock()

    def __init__(self, identifier: str) -> None:
        self.identifier = identifier

    def run(self, lead: Callable[[], None]) -> None:
        with _FirstComer.lock:
            _FirstComer.holder = self.identifier
            try:
                lead()
            finally:
                _FirstComer.holder = None

    def cancel(self) -> None:
        pass

    def contenders(self) -> list[str]:
        return [_FirstComer.holder] if _FirstComer.holder else []


class MemoryStore(MetadataStore):
    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster

    def _check(self) -> MemoryCluster:
        if not self.cluster.up:
            raise MetadataStoreUnavailable("the memory cluster is down")
        self.reads += 1
        return self.cluster

    def ledger_ranges(self) -> list[LedgerRange]:
        return chunk_ids(self._check().ledgers, size=3)

    def ledger_ids(self, rng: LedgerRange) -> list[int]:
        assert rng.ids is not None
        return list(rng.ids)

    def read_ledgers(self, ledger_ids: Iterable[int]) -> Iterator[LedgerRead]:
        c = self._check()
        for lid in ledger_ids:
            md = c.ledgers.get(lid)
            yield LedgerRead(lid, md) if md is not None else LedgerRead(lid, deleted=True)

    def underreplication_marks(self) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        return dict(self._check().marks), []

    def marks_of(self, ledger_ids: Iterable[int]) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        marks = self._check().marks
        return {lid: marks[lid] for lid in ledger_ids if lid in marks}, []

    def underreplication_mark(self, ledger_id: int) -> UnderreplicationMark | None:
        return self._check().marks.get(ledger_id)

    def marked(self, ledger_ids: Iterable[int]) -> set[int]:
        return set(ledger_ids) & self._check().marks.keys()

    def replication_disabled(self) -> bool:
        return self._check().replication_disabled

    def mark_underreplicated(self, mark: UnderreplicationMark, metadata_version: int) -> bool:
        c = self._check()
        md = c.ledgers.get(mark.ledger_id)
        if mark.ledger_id in c.marks or md is None or md.znode_version != metadata_version:
            return False
        c.marks[mark.ledger_id] = mark
        return True

    def lost_bookie_recovery_delay(self) -> int | None:
        return self._check().lost_bookie_recovery_delay

    def registrations(self) -> Registrations:
        c = self._check()
        return Registrations({b: r for b, r in c.bookies.items() if not r.readonly},
                             {b: r for b, r in c.bookies.items() if r.readonly}, frozenset(c.bookies))

    def racks(self, where: str = "") -> tuple[dict[str, str], list[str]]:
        return dict(self._check().racks), []

    def agent_addresses(self) -> dict[str, str]:
        return dict(self._check().agents)

    def register_agent(self, bookie_id: str, address: str) -> Registration:
        self._check().agents[bookie_id] = address
        return _Unregister(self.cluster.agents, bookie_id)

    def pulsar_present(self) -> bool:
        return False  # this store keeps no Pulsar records

    def pulsar_records(self, topics: Iterable[str] | None = None, under: Iterable[str] = ()) -> StoredRecords:
        return StoredRecords(whole=topics is None and not list(under))

    def election(self, identifier: str, name: str = "") -> Election:
        return _FirstComer(identifier)

    def auditor_record(self, name: str) -> bytes | None:
        return self._check().auditor_records.get(name)

    def set_auditor_record(self, name: str, data: bytes) -> None:
        self._check().auditor_records[name] = data

    def on_session_lost(self, callback: Callable[[], None]) -> None:
        pass

    def close(self) -> None:
        pass
