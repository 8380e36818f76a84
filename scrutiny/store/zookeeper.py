"""The metadata store on ZooKeeper (kazoo): a BookKeeper cluster's tree read into snapshots.

How requests are sent (bounded, pipelined, retried, multiRead where the server has it: probed once on a
throwaway session) is `scrutiny.store.zkrequests`; this module is what they read and write: ledgers,
marks, registrations, racks, Pulsar's records, and scrutiny's own znodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import (
    GetData,
)

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
    decode_ledger_metadata,
    decode_racks,
    decode_ur_mark,
    encode_agent_registration,
    encode_ur_mark,
    is_ledger_child,
    ledger_id_of_mark,
    ledger_path,
    parse_layout,
    parse_metadata_service_uri,
    tree_change,
    ur_mark_path,
)
from scrutiny.pulsar.records import managed_ledger_of, schema_id_of, topic_of_path
from scrutiny.pulsar.snapshot import StoredRecords
from scrutiny.store import (
    Election,
    Fence,
    LedgerRange,
    LedgerRead,
    MetadataStore,
    MetadataStoreUnavailable,
    Registration,
    Registrations,
    Watches,
    chunk_ids,
    decode_marks,
    parse_recovery_delay,
)
from scrutiny.store.zkrequests import DEFAULT_MAX_IN_FLIGHT, OPERATION_TIMEOUT, MultiRead, ZooKeeperRequests, submit
from scrutiny.store.zkwatch import TreeWatch
from scrutiny.tls import read_credentials

if TYPE_CHECKING:
    from kazoo.recipe.election import Election as KazooElection

    from scrutiny.config import ClusterSettings

log = logging.getLogger(__name__)
def probe_multi_read(settings: ClusterSettings) -> bool:
    """Does the server answer multiRead? Asked on a throwaway session: a 3.5 server answers an unknown
    opcode by closing the session."""
    client = new_client(settings)
    try:
        client.start(timeout=settings.zk_connect_timeout)
        submit(client, MultiRead(GetData, ["/"])).get(timeout=5)
        return True
    except Exception as exc:
        log.info("ZooKeeper has no multiRead (%s): pipelined single reads", type(exc).__name__)
        return False
    finally:
        client.stop()
        client.close()


def client_args(auth_file: str = "", ca: str = "", cert: str = "", key: str = "") -> dict[str, Any]:
    """KazooClient arguments: digest credentials from `auth_file` ("user:password"), and TLS.
    With credentials, the znodes scrutiny creates get an ACL: all for that identity, read for others."""
    args: dict[str, Any] = {}
    if auth_file:
        from kazoo.security import make_acl, make_digest_acl

        user, password = read_credentials(auth_file, "ZooKeeper credentials")
        args["auth_data"] = [("digest", f"{user}:{password}")]
        args["default_acl"] = [make_digest_acl(user, password, all=True), make_acl("world", "anyone", read=True)]
    if ca or cert or key:
        args.update(use_ssl=True, verify_certs=bool(ca))
        if ca:
            args["ca"] = ca
        if cert:
            args["certfile"] = cert
        if key:
            args["keyfile"] = key
    return args


def new_client(settings: ClusterSettings) -> KazooClient:
    """The one way scrutiny makes a ZooKeeper client from settings: TLS, auth, session timeout."""
    uri = parse_metadata_service_uri(settings.metadata_service_uri)
    return KazooClient(hosts=uri.hosts, timeout=settings.zk_session_timeout,
                       connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 2.0},
                       **client_args(settings.zk_auth_file, settings.zk_tls_ca, settings.zk_tls_cert,
                                     settings.zk_tls_key))


def open_store(settings: ClusterSettings) -> ZooKeeperStore:
    client = new_client(settings)
    uri = parse_metadata_service_uri(settings.metadata_service_uri)
    try:
        client.start(timeout=settings.zk_connect_timeout)
    except (KazooTimeoutError, KazooException) as exc:
        client.close()
        raise MetadataStoreUnavailable(f"cannot reach ZooKeeper at {uri.hosts}: {exc}") from None
    multi = settings.zk_multi_read == "on" or (settings.zk_multi_read == "auto" and probe_multi_read(settings))
    return ZooKeeperStore(client, uri, max_in_flight=settings.zk_max_in_flight,
                          retry_deadline=settings.zk_retry_deadline, multi_read=multi)


class ZooKeeperStore(ZooKeeperRequests, MetadataStore):
    """BookKeeper's tree (and scrutiny's own znodes beside it) in the store's vocabulary, over the
    request layer."""

    def __init__(self, client: KazooClient, uri: MetadataServiceUri | str,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, retry_deadline: float = 60.0,
                 multi_read: bool = False) -> None:
        super().__init__(client, max_in_flight, retry_deadline, multi_read)
        self.uri = parse_metadata_service_uri(uri) if isinstance(uri, str) else uri
        self.root = self.uri.root
        self._layout: Layout | None = self.uri.layout
        self._auditor_path = f"{self.uri.scrutiny_path}/auditor"

    def close(self) -> None:
        try:
            self.client.stop()
        finally:
            self.client.close()


    # -- layout and enumeration -------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            got = self.get(f"{self.root}/LAYOUT")
            if got is None:
                raise MetadataError(f"no LAYOUT znode under {self.root}: is this a BookKeeper metadata root?")
            self._layout = parse_layout(got[0])
        return self._layout

    def ledger_ranges(self) -> list[LedgerRange]:
        """Level-2 buckets of the short hierarchical tree, level-4 buckets of the long tree (a token is
        the bucket's path under the root), or chunks of a flat root's ids."""
        top = [c for c in self.children(self.root) if is_ledger_child(c)]
        if self.layout is Layout.FLAT:
            return chunk_ids(int(c[1:]) for c in top if c.startswith("L") and c[1:].isdigit())
        short = [c for c in top if len(c) == 2 and c.isdigit()] if self.layout is Layout.HIERARCHICAL else []
        long_ = [c for c in top if len(c) == 3 and c.isdigit()]
        ranges = [LedgerRange(f"{path.rsplit('/', 1)[1]}/{k}")
                  for path, kids in self.children_many(f"{self.root}/{c}" for c in short)
                  for k in kids or [] if len(k) == 4 and k.isdigit()]
        level = [f"{self.root}/{c}" for c in long_]
        for _ in range(3):
            level = [f"{path}/{k}" for path, kids in self.children_many(level)
                     for k in kids or [] if len(k) == 4 and k.isdigit()]
        return ranges + [LedgerRange(path.removeprefix(f"{self.root}/")) for path in level]

    def ledger_ids(self, rng: LedgerRange) -> list[int]:
        if rng.ids is not None:
            return list(rng.ids)
        prefix = rng.token.replace("/", "")  # a bucket's digits are the leading digits of its ids
        ids = [int(prefix + leaf[1:]) for leaf in self.children(f"{self.root}/{rng.token}")
               if leaf.startswith("L") and len(leaf) == 5 and leaf[1:].isdigit()]
        return sorted(ids)

    def read_ledgers(self, ledger_ids: Iterable[int]) -> Iterator[LedgerRead]:
        layout = self.layout
        ids: dict[str, int] = {}

        def paths() -> Iterator[str]:
            for lid in ledger_ids:
                p = ledger_path(layout, self.root, lid)
                ids[p] = lid
                yield p

        for path, got in self.get_many(paths()):
            lid = ids.pop(path)
            if got is None:
                yield LedgerRead(lid, deleted=True)
                continue
            data, stat = got
            try:
                md = decode_ledger_metadata(lid, data, stat.ctime, stat.version, znode_mtime=stat.mtime)
                yield LedgerRead(lid, md)
            except MetadataError as exc:
                yield LedgerRead(lid, error=str(exc))

    # -- under-replication ------------------------------------------------------------------------

    def underreplication_marks(self) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        level = [f"{self.root}/underreplication/ledgers"]
        for _ in range(4):
            level = [f"{p}/{k}" for p, kids in self.children_many(level) for k in kids or []]
        leaves: dict[str, int] = {}
        for path, kids in self.children_many(level):
            for k in kids or []:
                lid = ledger_id_of_mark(k)
                if lid is not None:
                    leaves[f"{path}/{k}"] = lid
        return self._marks(leaves)

    def marks_of(self, ledger_ids: Iterable[int]) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        return self._marks({ur_mark_path(self.root, lid): lid for lid in ledger_ids})

    def _marks(self, paths: dict[str, int]) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        # (a mark gone meanwhile, re-replicated, or none: not there)
        return decode_marks((paths[path], got[0]) for path, got in self.get_many(list(paths)) if got is not None)

    def underreplication_mark(self, ledger_id: int) -> UnderreplicationMark | None:
        got = self.get(ur_mark_path(self.root, ledger_id))
        if got is None:
            return None
        try:
            return decode_ur_mark(ledger_id, got[0])
        except MetadataError:
            return UnderreplicationMark(ledger_id, (), None)  # a mark we cannot read is still a mark

    def marked(self, ledger_ids: Iterable[int]) -> set[int]:
        paths = {ur_mark_path(self.root, lid): lid for lid in ledger_ids}
        return {paths[path] for path, got in self.get_many(list(paths)) if got is not None}

    def replication_disabled(self) -> bool:
        return self.exists(f"{self.root}/underreplication/disable")

    def mark_underreplicated(self, mark: UnderreplicationMark, metadata_version: int, fence: Fence | None = None
                             ) -> bool:
        if metadata_version < 0:  # unknown: ZooKeeper's check would take any version
            return False
        path = ur_mark_path(self.root, mark.ledger_id)
        self.client.ensure_path(path.rsplit("/", 1)[0])  # as the Auditor leaves them: empty, persistent
        tx = self.client.transaction()
        if fence is not None:
            tx.check(fence.key, fence.version)
        tx.check(ledger_path(self.layout, self.root, mark.ledger_id), metadata_version)
        tx.create(path, encode_ur_mark(mark))
        results = tx.commit()
        if fence is not None and isinstance(results[0], (NoNodeError, BadVersionError)):
            raise Fenced(f"ledger {mark.ledger_id} not marked: {fence.key} is gone (this process leads no more)")
        return not any(isinstance(r, Exception) for r in results)

    def lost_bookie_recovery_delay(self) -> int | None:
        got = self.get(f"{self.root}/underreplication/lostBookieRecoveryDelay")
        return parse_recovery_delay(None if got is None else got[0])

    # -- bookies ----------------------------------------------------------------------------------

    def registrations(self) -> Registrations:
        avail = f"{self.root}/available"
        writable_ids = [c for c in self.children(avail) if c != "readonly"]
        readonly_ids = self.children(f"{avail}/readonly")
        problems: list[str] = []
        found: dict[bool, dict[str, BookieRegistration]] = {False: {}, True: {}}
        for readonly, base, ids in ((False, avail, writable_ids), (True, f"{avail}/readonly", readonly_ids)):
            for path, got in self.get_many(f"{base}/{b}" for b in ids):
                if got is None:
                    continue  # went away meanwhile
                bookie = path.rsplit("/", 1)[1]
                try:
                    found[readonly][bookie] = decode_bookie_service_info(bookie, readonly, got[0])
                except MetadataError as exc:
                    problems.append(str(exc))
                    found[readonly][bookie] = BookieRegistration(bookie, readonly)
        cookies = frozenset(self.children(f"{self.root}/cookies"))
        return Registrations(found[False], found[True], cookies, tuple(problems))

    def racks(self, where: str = "") -> tuple[dict[str, str], list[str]]:
        path = where or self.uri.racks_path
        got = self.get(path)
        if got is None:
            return {}, []
        try:
            return decode_racks(got[0], path)
        except MetadataError as exc:
            return {}, [str(exc)]

    def _agents_path(self) -> str:
        return f"{self.uri.scrutiny_path}/agents"

    def agent_addresses(self) -> dict[str, str]:
        base = self._agents_path()
        out = {}
        for path, got in self.get_many(f"{base}/{b}" for b in self.children(base)):
            if got is None:
                continue
            try:
                bookie_id, address = decode_agent_registration(path, got[0])
            except MetadataError as exc:
                log.warning("ignoring %s", exc)
                continue
            out[bookie_id] = address
        return out

    def register_agent(self, bookie_id: str, address: str) -> Registration:
        reg = _EphemeralNode(self.client, f"{self._agents_path()}/{bookie_id}",
                             encode_agent_registration(bookie_id, address))
        reg.create()
        return reg

    # -- Pulsar -----------------------------------------------------------------------------------

    def pulsar_present(self) -> bool:
        return self.exists(self.uri.managed_ledgers_path) or self.exists(self.uri.schemas_path)

    def pulsar_records(self, topics: Iterable[str] | None = None) -> StoredRecords:
        base, schemas_base = self.uri.managed_ledgers_path, self.uri.schemas_path
        paths: list[str] = []
        schema_paths: list[str] = []
        if topics is not None:
            paths = [f"{base}/{managed_ledger_of(topic)}" for topic in topics]
            schema_paths = sorted({f"{schemas_base}/{schema_id_of(topic)}" for topic in topics})
        else:  # every managed ledger: the znodes whose parent is a `persistent` domain
            level = [base]
            for _ in range(5):
                deeper: list[str] = []
                for path, kids in self.children_many(level):  # a namespace lists all its topics
                    for k in kids or []:
                        (paths if path.rsplit("/", 1)[1] == "persistent" else deeper).append(f"{path}/{k}")
                level = deeper
            schema_paths = [schemas_base]
            for _ in range(3):  # tenant, namespace, topic
                schema_paths = [f"{p}/{k}" for p, kids in self.children_many(schema_paths) for k in kids or []]
        # a topic's cursors, and a cursor's record: a few dozen bytes each, learned apart from the tree's
        cursor_paths = [f"{p}/{c}" for p, kids in self.children_many(paths, small=True) for c in kids or []]
        cursors: dict[str, dict[str, bytes]] = {}
        for path, got in self.get_many(cursor_paths, small=True):
            if got is not None:
                name, cursor = path.removeprefix(f"{base}/").rsplit("/", 1)
                cursors.setdefault(name, {})[cursor] = got[0]
        # read after their cursors: a topic deleted meanwhile has no record, and its cursors are dropped
        # (a record lists every ledger of its topic: its size is learned, as the ledgers' are)
        records = {path.removeprefix(f"{base}/"): got[0] for path, got in self.get_many(paths) if got is not None}
        schemas = {path.removeprefix(f"{schemas_base}/"): got[0] for path, got in self.get_many(schema_paths)
                   if got is not None}
        return StoredRecords(records, cursors, schemas, whole=topics is None)

    # -- the auditor ------------------------------------------------------------------------------

    def election(self, identifier: str, name: str = "") -> Election:
        return ZooKeeperElection(self.client.Election(name or f"{self._auditor_path}/election", identifier))

    def auditor_record(self, name: str) -> bytes | None:
        got = self.get(f"{self._auditor_path}/{name}")
        return None if got is None else got[0]

    def set_auditor_record(self, name: str, data: bytes) -> None:
        self._put(f"{self._auditor_path}/{name}", data)

    def _put(self, path: str, data: bytes) -> None:
        if self.exists(path):
            self.client.set(path, data)
        else:
            self.client.create(path, data, makepath=True)

    def watch_tree(self, on_change: Callable[[TreeChange], None], on_gap: Callable[[str], None],
                   resume: str = "") -> TreeWatch | None:
        """A persistent recursive watch on the ledgers root (ZooKeeper 3.6+, as multiRead: a server that
        lacks it would end the session, so it is asked for only where multiRead was found to work)."""
        if not self.multi_read:
            log.warning("ZooKeeper before 3.6 (no multiRead, so no persistent watch): continuous scrutiny "
                        "learns of metadata changes only from runs")
            return None
        root = self.root

        def event(kind: str, path: str) -> None:
            change = tree_change(root, kind, path)
            if change is not None:
                on_change(change)

        return TreeWatch(self.client, root, event, on_gap, timeout=OPERATION_TIMEOUT)

    def watch_topics(self, on_topic: Callable[[str], None], on_gap: Callable[[str], None]) -> Watches | None:
        """Persistent recursive watches on the managed ledgers and the schemas (3.6+, as `watch_tree`)."""
        if not self.multi_read:
            return None
        ml, schemas = self.uri.managed_ledgers_path, self.uri.schemas_path

        def event(kind: str, path: str) -> None:
            topic = topic_of_path(ml, schemas, path)
            if topic is not None:
                on_topic(topic)

        return Watches([TreeWatch(self.client, root, event, on_gap, timeout=OPERATION_TIMEOUT)
                        for root in (ml, schemas)])

    def on_session_lost(self, callback: Callable[[], None]) -> None:
        def listener(state: str) -> None:  # on kazoo's event thread: only flag, never block
            if state == KazooState.LOST:
                callback()

        self.client.add_listener(listener)


class _EphemeralNode:
    """An ephemeral znode kept across session loss (re-created on reconnection) until closed."""

    def __init__(self, client: KazooClient, path: str, data: bytes) -> None:
        self.client, self.path, self.data = client, path, data
        self._closed = False
        client.add_listener(self._on_state)

    def create(self) -> None:
        try:
            self.client.create(self.path, self.data, ephemeral=True, makepath=True)
        except NodeExistsError:
            # A previous session's node may linger until it expires: take it over.
            self.client.delete(self.path)
            self.client.create(self.path, self.data, ephemeral=True, makepath=True)

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED and not self._closed:
            self.client.handler.spawn(self._recreate)  # never block kazoo's event thread

    def _recreate(self) -> None:
        try:
            if not self.client.exists(self.path):
                self.create()
        except Exception as exc:
            log.warning("could not re-register %s: %s", self.path, exc)

    def close(self) -> None:
        self._closed = True
        self.client.remove_listener(self._on_state)
        try:
            if self.client.connected and self.client.exists(self.path):
                self.client.delete(self.path)
        except Exception as exc:
            log.warning("could not remove %s: %s", self.path, exc)


class ZooKeeperElection:
    """kazoo's election recipe (a lock's sequential ephemeral nodes), and the leader's own node as its fence."""

    def __init__(self, election: KazooElection) -> None:
        self._election = election

    def run(self, lead: Callable[[], None]) -> None:
        self._election.run(lead)

    def cancel(self) -> None:
        self._election.cancel()

    def contenders(self) -> list[str]:
        return [str(c) for c in self._election.contenders()]

    def fence(self) -> Fence | None:
        lock = self._election.lock
        return Fence(f"{lock.path}/{lock.node}", 0) if lock.is_acquired and lock.node else None  # never rewritten
