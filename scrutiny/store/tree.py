"""A store that keeps BookKeeper's tree one value per path, as ZooKeeper does (ZooKeeper itself; Pulsar's
metadata store on etcd, and on Oxia): what a path holds and how it is decoded is written once here, over a
few primitives each backend answers its own way (Patroni's `AbstractDCS` is the model).

A backend writes the primitives (`value`, `values`, `children`, `values_below`, `present`, `put`,
`create_unless_changed`, `ephemeral`, `watch_below`), its enumeration of the ledgers (`ledger_ranges`,
`ledger_ids`, `read_ledgers`) and of Pulsar's records (`pulsar_records`), its session (`on_session_lost`,
`close`) and its election: 16 methods, nine of them primitives of a few lines, where `MetadataStore` alone
asks for 21 whole operations.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator

from scrutiny.errors import Fenced
from scrutiny.metadata import (
    BookieRegistration,
    Layout,
    MetadataError,
    MetadataServiceUri,
    TreeChange,
    UnderreplicationMark,
    decode_agent_registration,
    decode_bookie_service_info,
    decode_racks,
    decode_ur_mark,
    encode_agent_registration,
    encode_ur_mark,
    ledger_id_of_mark,
    ledger_path,
    parse_layout,
    parse_metadata_service_uri,
    tree_change,
    ur_mark_path,
)
from scrutiny.pulsar.records import topic_of_path
from scrutiny.store import (
    Fence,
    MetadataStore,
    Registration,
    Registrations,
    TreeWatchHandle,
    Watches,
    decode_marks,
    parse_recovery_delay,
)

log = logging.getLogger(__name__)


class TreeStore(MetadataStore):
    def __init__(self, uri: MetadataServiceUri | str) -> None:
        self.uri = parse_metadata_service_uri(uri) if isinstance(uri, str) else uri
        self.root = self.uri.root
        self._layout: Layout | None = self.uri.layout
        self._auditor = f"{self.uri.scrutiny_path}/auditor"

    # -- the primitives -------------------------------------------------------------------------

    @abstractmethod
    def value(self, path: str) -> bytes | None:
        """What `path` holds (None: no such path)."""

    @abstractmethod
    def values(self, paths: Iterable[str]) -> Iterator[tuple[str, bytes | None]]:
        """Each path and what it holds, read in batches."""

    @abstractmethod
    def children(self, path: str) -> list[str]:
        """The names of the paths right below `path`, sorted ([] where there are none)."""

    @abstractmethod
    def values_below(self, path: str, depth: int) -> Iterator[tuple[str, bytes]]:
        """Each path `depth` levels below `path` (as the rest of it, `a/b` at depth 2) and what it holds;
        one gone meanwhile is left out."""

    @abstractmethod
    def present(self, path: str) -> bool:
        """Does `path`, or anything below it, exist?"""

    @abstractmethod
    def put(self, path: str, data: bytes) -> None:
        """Write `path` (created if absent)."""

    @abstractmethod
    def create_unless_changed(self, path: str, data: bytes, guard: str, guard_version: int,
                              fence: Fence | None) -> bool | None:
        """Create `path` in one transaction with its conditions: absent yet, `guard` still at `guard_version`
        (the store's version as decoded into `LedgerMetadata.znode_version`), `fence` still standing. True if
        written, False if a condition other than the fence failed, None if the fence fell."""

    @abstractmethod
    def ephemeral(self, path: str, data: bytes) -> Registration:
        """`path` holding `data` for as long as this process's session (put back after a new one) until closed."""

    @abstractmethod
    def watch_below(self, root: str, on_event: Callable[[str, str], None], on_gap: Callable[[str], None],
                    resume: str = "") -> TreeWatchHandle | None:
        """Every change below `root` as (event, path) on the store's own thread (`on_event`: take note only),
        and each time some may have been missed (`on_gap`), from `resume` where the store can; None where it
        cannot watch."""

    # -- ledgers ----------------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            got = self.value(f"{self.root}/LAYOUT")
            if got is None:
                raise MetadataError(f"no LAYOUT under {self.root}: is this a BookKeeper metadata root?")
            self._layout = parse_layout(got)
        return self._layout

    # -- under-replication ------------------------------------------------------------------------

    def underreplication_marks(self) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        found = ((ledger_id_of_mark(rest.rsplit("/", 1)[-1]), value)
                 for rest, value in self.values_below(f"{self.root}/underreplication/ledgers", 5))
        return decode_marks((lid, value) for lid, value in found if lid is not None)  # (not a stray path)

    def marks_of(self, ledger_ids: Iterable[int]) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        paths = {ur_mark_path(self.root, lid): lid for lid in ledger_ids}
        # (a mark gone meanwhile, re-replicated, or none: not there)
        return decode_marks((paths[path], got) for path, got in self.values(list(paths)) if got is not None)

    def underreplication_mark(self, ledger_id: int) -> UnderreplicationMark | None:
        got = self.value(ur_mark_path(self.root, ledger_id))
        if got is None:
            return None
        try:
            return decode_ur_mark(ledger_id, got)
        except MetadataError:
            return UnderreplicationMark(ledger_id, (), None)  # a mark we cannot read is still a mark

    def marked(self, ledger_ids: Iterable[int]) -> set[int]:
        paths = {ur_mark_path(self.root, lid): lid for lid in ledger_ids}
        return {paths[path] for path, got in self.values(list(paths)) if got is not None}

    def replication_disabled(self) -> bool:
        return self.value(f"{self.root}/underreplication/disable") is not None

    def mark_underreplicated(self, mark: UnderreplicationMark, metadata_version: int, fence: Fence | None = None
                             ) -> bool:
        if metadata_version < 0:  # unknown: no condition could hold the ledger to what was judged
            return False
        done = self.create_unless_changed(ur_mark_path(self.root, mark.ledger_id), encode_ur_mark(mark),
                                          ledger_path(self.layout, self.root, mark.ledger_id), metadata_version,
                                          fence)
        if done is None:
            raise Fenced(f"ledger {mark.ledger_id} not marked: {fence.key if fence else 'the fence'} is gone "
                         "(this process leads no more)")
        return done

    def lost_bookie_recovery_delay(self) -> int | None:
        return parse_recovery_delay(self.value(f"{self.root}/underreplication/lostBookieRecoveryDelay"))

    # -- bookies ----------------------------------------------------------------------------------

    def registrations(self) -> Registrations:
        avail = f"{self.root}/available"
        problems: list[str] = []
        found: dict[bool, dict[str, BookieRegistration]] = {False: {}, True: {}}
        for readonly, base in ((False, avail), (True, f"{avail}/readonly")):
            for bookie, data in self.values_below(base, 1):
                if bookie == "readonly" and not readonly:
                    continue
                try:
                    found[readonly][bookie] = decode_bookie_service_info(bookie, readonly, data)
                except MetadataError as exc:
                    problems.append(str(exc))
                    found[readonly][bookie] = BookieRegistration(bookie, readonly)
        cookies = frozenset(self.children(f"{self.root}/cookies"))
        return Registrations(found[False], found[True], cookies, tuple(problems))

    def racks(self, where: str = "") -> tuple[dict[str, str], list[str]]:
        path = where or self.uri.racks_path
        got = self.value(path)
        if got is None:
            return {}, []
        try:
            return decode_racks(got, path)
        except MetadataError as exc:
            return {}, [str(exc)]

    def agent_addresses(self) -> dict[str, str]:
        base = f"{self.uri.scrutiny_path}/agents"
        out = {}
        for name, data in self.values_below(base, 1):
            try:
                bookie_id, address = decode_agent_registration(f"{base}/{name}", data)
            except MetadataError as exc:
                log.warning("ignoring %s", exc)
                continue
            out[bookie_id] = address
        return out

    def register_agent(self, bookie_id: str, address: str) -> Registration:
        return self.ephemeral(f"{self.uri.scrutiny_path}/agents/{bookie_id}",
                              encode_agent_registration(bookie_id, address))

    # -- Pulsar -----------------------------------------------------------------------------------

    def pulsar_present(self) -> bool:
        return self.present(self.uri.managed_ledgers_path) or self.present(self.uri.schemas_path)

    # -- the auditor ------------------------------------------------------------------------------

    def auditor_record(self, name: str) -> bytes | None:
        return self.value(f"{self._auditor}/{name}")

    def set_auditor_record(self, name: str, data: bytes) -> None:
        self.put(f"{self._auditor}/{name}", data)

    def watch_tree(self, on_change: Callable[[TreeChange], None], on_gap: Callable[[str], None],
                   resume: str = "") -> TreeWatchHandle | None:
        root = self.root

        def event(kind: str, path: str) -> None:
            change = tree_change(root, kind, path)
            if change is not None:
                on_change(change)

        watch = self.watch_below(root, event, on_gap, resume)
        if watch is None:
            log.warning("this metadata store cannot be watched: continuous scrutiny learns of metadata changes "
                        "only from runs")
        return watch

    def watch_topics(self, on_topic: Callable[[str], None], on_gap: Callable[[str], None]) -> Watches | None:
        ml, schemas = self.uri.managed_ledgers_path, self.uri.schemas_path

        def event(kind: str, path: str) -> None:
            topic = topic_of_path(ml, schemas, path)
            if topic is not None:
                on_topic(topic)

        watches: list[TreeWatchHandle] = []
        for root in (ml, schemas):
            watch = self.watch_below(root, event, on_gap)
            if watch is None:
                Watches(watches).close()
                return None
            watches.append(watch)
        return Watches(watches)
