"""The one interface to the metadata store (Patroni's AbstractDCS is the model).

Everything scrutiny reads or writes in the cluster's coordination store goes through `MetadataStore`:
enumeration of ledgers as opaque range tokens, ledger reads, under-replication marks, bookie
registrations, racks, the bookie agents' registry, and for the auditor its election, cadence, last
complete runs, deep-scrub cursor and orphan sightings.
ZooKeeper (`scrutiny.store.zookeeper`) and etcd as Pulsar's metadata store keeps it (`scrutiny.store.etcd`,
PIP-45) implement it as `TreeStore`s (`scrutiny.store.tree`: what a path holds, written once over each
backend's primitives); another store (Oxia) is one new module doing the same, plus its URI scheme in
`BACKENDS`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, Self, runtime_checkable

import numpy as np

from scrutiny.errors import ConfigError, StoreError
from scrutiny.metadata import (
    BookieRegistration,
    LedgerMetadata,
    MetadataError,
    TreeChange,
    UnderreplicationMark,
    decode_ledger_metadata,
    decode_ur_mark,
    store_scheme,
)
from scrutiny.metadata.columns import Znode
from scrutiny.pulsar.snapshot import StoredRecords

if TYPE_CHECKING:
    from scrutiny.config import ClusterSettings

# URI scheme -> module with a `open_store(settings)` function: BookKeeper's `zk+<layout>://` by the part
# before any `+layout`, Pulsar's `metadata-store:<store>:` (PIP-45) by its store.
BACKENDS = {"zk": "scrutiny.store.zookeeper", "metadata-store:zk": "scrutiny.store.zookeeper",
            "metadata-store:etcd": "scrutiny.store.etcd"}
RANGE_SIZE = 10_000  # ledgers per explicit-id range: the size of a level-2 hierarchical bucket


class MetadataStoreUnavailable(StoreError):
    """The metadata store could not be reached, or stayed unreachable past the retry budget."""


@dataclass(frozen=True, slots=True)
class LedgerRange:
    """A unit of work. `token` is opaque outside the store that made it (it names, say, a bucket of
    the ledger tree); `ids` lists the ledgers instead when a run is about chosen ledgers."""

    token: str
    ids: tuple[int, ...] | None = None

    def describe(self) -> str:
        return self.token if self.ids is None else f"{len(self.ids)} chosen ledgers from {self.ids[0]}"


def chunk_ids(ids: Iterable[int] | np.ndarray, size: int = RANGE_SIZE) -> list[LedgerRange]:
    """Ranges of explicit ledger ids (sorted, unique), `size` at a time."""
    # numpy's unique: 8 bytes a ledger on the way, not a set's 70 (a lost rack re-checks millions)
    ordered = np.unique(ids if isinstance(ids, np.ndarray) else np.fromiter(ids, np.int64))
    return [LedgerRange("ids", tuple(ordered[i:i + size].tolist())) for i in range(0, len(ordered), size)]


class LedgerRead(NamedTuple):  # one per ledger of a scan: a tuple is the cheapest immutable record
    """The outcome of reading one ledger's metadata."""

    ledger_id: int
    metadata: LedgerMetadata | None = None
    error: str | None = None  # undecodable or inconsistent metadata
    deleted: bool = False  # gone between enumeration and read

    @classmethod
    def of(cls, ledger_id: int, data: bytes | None, ctime: int = -1, version: int = -1, mtime: int = -1
           ) -> LedgerRead:
        """What a store read at the ledger's path (None: nothing, deleted), decoded; metadata that cannot be
        decoded is an error named, never a stop."""
        if data is None:
            return cls(ledger_id, deleted=True)
        try:
            return cls(ledger_id, decode_ledger_metadata(ledger_id, data, ctime, version, znode_mtime=mtime))
        except MetadataError as exc:
            return cls(ledger_id, error=str(exc))


@runtime_checkable
class ReadsZnodes(Protocol):
    """A store that gives each ledger's record as stored, undecoded (a range is then decoded in columns)."""

    def read_znodes(self, ledger_ids: Iterable[int]) -> Iterator[Znode]:
        """Each ledger's record and its stat, in order (no data: deleted)."""


@dataclass(frozen=True, slots=True)
class Registrations:
    writable: dict[str, BookieRegistration]
    readonly: dict[str, BookieRegistration]
    cookies: frozenset[str]
    problems: tuple[str, ...] = ()

    def registered(self, bookie_id: str) -> bool:
        return bookie_id in self.writable or bookie_id in self.readonly


class Fence(NamedTuple):
    """The leader's own election node as it won: a write conditional on it is refused once the leader's session is
    gone, whatever the deposed process still believes (ZooKeeper: the node at `version`; etcd: the key at its
    create revision `version`)."""

    key: str
    version: int


class Election(Protocol):
    def run(self, lead: Callable[[], None]) -> None:
        """Block until elected, call `lead`, give up leadership when it returns."""

    def cancel(self) -> None: ...

    def contenders(self) -> list[str]:
        """The identifiers of every contender, the leader first."""

    def fence(self) -> Fence | None:
        """While leading: this contender's own election node."""


class Registration(Protocol):
    """An ephemeral registration kept across session loss until closed."""

    def close(self) -> None: ...


class TreeWatchHandle(Protocol):
    """A running watch of the ledgers tree."""

    def position(self) -> str:
        """Where a later watch can resume without a gap ("" where the store cannot resume)."""

    def close(self) -> None: ...


class Watches:
    """Several watches as one (a store watching two trees)."""

    def __init__(self, watches: list[TreeWatchHandle]) -> None:
        self.watches = watches

    def position(self) -> str:
        return ""

    def close(self) -> None:
        for w in reversed(self.watches):  # the last added first (ZooKeeper's wrap the connection's reader)
            w.close()


class MetadataStore(ABC):
    reads: int = 0  # requests sent, for the run's statistics
    peak_in_flight: int = 0

    # -- ledgers ----------------------------------------------------------------------------------

    @abstractmethod
    def ledger_ranges(self) -> list[LedgerRange]:
        """Every unit of work of the whole ledger tree."""

    def ranges_of(self, ledger_ids: Iterable[int] | np.ndarray) -> list[LedgerRange]:
        """Units of work for chosen ledgers."""
        return chunk_ids(ledger_ids)

    @abstractmethod
    def ledger_ids(self, rng: LedgerRange) -> list[int]:
        """The ledgers of one unit of work, ascending."""

    @abstractmethod
    def read_ledgers(self, ledger_ids: Iterable[int]) -> Iterator[LedgerRead]:
        """Each ledger's metadata, in order; one bad or deleted ledger never stops the others."""

    # -- under-replication ------------------------------------------------------------------------

    @abstractmethod
    def underreplication_marks(self) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        """Every mark, and problems with single marks."""

    @abstractmethod
    def marks_of(self, ledger_ids: Iterable[int]) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        """The marks of these ledgers only (a run over a few ledgers), read in batches; problems as above."""

    @abstractmethod
    def underreplication_mark(self, ledger_id: int) -> UnderreplicationMark | None:
        """One ledger's mark now (an unreadable mark is still a mark, without ctime)."""

    @abstractmethod
    def marked(self, ledger_ids: Iterable[int]) -> set[int]:
        """Those of the ledgers with a mark now, read in batches (readable or not, a mark is a mark)."""

    @abstractmethod
    def replication_disabled(self) -> bool: ...

    @abstractmethod
    def mark_underreplicated(self, mark: UnderreplicationMark, metadata_version: int, fence: Fence | None = None
                             ) -> bool:
        """Mark a ledger under-replicated as BookKeeper's Auditor does (`marks.ur_mark_path`, its text payload),
        in one transaction with its conditions: no mark there yet, the ledger's metadata still at
        `metadata_version` (not deleted, no ensemble change, not re-closed since it was judged), and the
        leader's `fence` still standing. True if written; False if the ledger changed or was marked; `Fenced`
        if the fence fell (this process leads no more)."""

    @abstractmethod
    def lost_bookie_recovery_delay(self) -> int | None:
        """BookKeeper's lostBookieRecoveryDelay as the cluster keeps it (`underreplication/`), if it does."""

    # -- bookies ----------------------------------------------------------------------------------

    @abstractmethod
    def registrations(self) -> Registrations: ...

    @abstractmethod
    def racks(self, where: str = "") -> tuple[dict[str, str], list[str]]:
        """bookie id -> location (Pulsar's rack data), and problems with single entries."""

    @abstractmethod
    def agent_addresses(self) -> dict[str, str]:
        """bookie id -> address of its agent, from the agents' own registrations."""

    @abstractmethod
    def register_agent(self, bookie_id: str, address: str) -> Registration: ...

    # -- Pulsar -----------------------------------------------------------------------------------

    @abstractmethod
    def pulsar_present(self) -> bool:
        """Does this store keep any of Pulsar's records (a managed ledger, a schema)?"""

    @abstractmethod
    def pulsar_records(self, topics: Iterable[str] | None = None, under: Iterable[str] = ()) -> StoredRecords:
        """Pulsar's records as stored (every topic's; or these topics' and those of every topic below each of
        `under`, a tenant or a `tenant/namespace`): the managed ledgers, their cursors, the schemas; empty where
        Pulsar keeps none here. Decoded by `scrutiny.pulsar.snapshot`."""

    # -- the auditor ------------------------------------------------------------------------------

    @abstractmethod
    def election(self, identifier: str, name: str = "") -> Election:
        """scrutiny's own election (never BookKeeper's auditor election)."""

    @abstractmethod
    def auditor_record(self, name: str) -> bytes | None:
        """One of the records the leaders keep beside their election (`<scrutiny path>/auditor/<name>`): the
        cadence, the last runs, the deep pass, the sightings, continuous scrutiny's cursors, the history
        (each a `scrutiny.records.LeaderRecord`, read tolerantly)."""

    @abstractmethod
    def set_auditor_record(self, name: str, data: bytes) -> None: ...

    def watch_tree(self, on_change: Callable[[TreeChange], None], on_gap: Callable[[str], None],
                   resume: str = "") -> TreeWatchHandle | None:
        """Every change to a ledger's metadata, an under-replication mark or a bookie's registration, as it
        happens (`on_change`, called on the store's own thread: take note only), and each time some may have
        been missed (`on_gap`), until closed; from `resume` (a position an earlier watch gave) where the store
        can; None where this store cannot watch (then only runs look)."""
        return None

    def watch_topics(self, on_topic: Callable[[str], None], on_gap: Callable[[str], None]) -> TreeWatchHandle | None:
        """Every change to a Pulsar record kept here (a managed ledger, a cursor, a schema), as the topic it
        concerns (`on_topic`, called on the store's own thread: take note only), and each time some may have
        been missed (`on_gap`), from now until closed; None where this store cannot watch."""
        return None

    @abstractmethod
    def on_session_lost(self, callback: Callable[[], None]) -> None:
        """Call `callback` (it must not block) when the session, and the leadership it held, is lost."""

    # -- lifecycle --------------------------------------------------------------------------------

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_marks(found: Iterable[tuple[int, bytes]]) -> tuple[dict[int, UnderreplicationMark], list[str]]:
    """Each ledger's mark as read; one that cannot be decoded is a problem named, never a stop."""
    marks: dict[int, UnderreplicationMark] = {}
    problems = []
    for lid, data in found:
        try:
            marks[lid] = decode_ur_mark(lid, data)
        except MetadataError as exc:
            problems.append(str(exc))
    return marks, problems


def parse_recovery_delay(data: bytes | None) -> int | None:
    """`underreplication/lostBookieRecoveryDelay`: ASCII seconds (BookKeeper's own shell writes it)."""
    text = data.decode("ascii", "replace").strip() if data is not None else ""
    return int(text) if text.isdigit() else None


def open_store(settings: ClusterSettings) -> MetadataStore:
    """The store named by `metadata_service_uri`'s scheme, connected with the settings' one policy
    for TLS, authentication, bounds and retries. Raises MetadataStoreUnavailable."""
    scheme = store_scheme(settings.metadata_service_uri)
    if scheme not in BACKENDS:
        hint = ("; BookKeeper's own etcd driver keeps another layout (no under-replication, no auditor) and is "
                "not read" if scheme == "etcd" else "")
        raise ConfigError(f"metadata service URI {settings.metadata_service_uri!r}: unknown store {scheme!r} "
                          "(known: zk, as zk+<layout>://host:port;.../root or metadata-store:zk:host:port/chroot; "
                          f"Pulsar's metadata store on etcd, as metadata-store:etcd:http://host:2379,...){hint}")
    backend = importlib.import_module(BACKENDS[scheme])
    store: MetadataStore = backend.open_store(settings)
    return store
