"""The metadata store on ZooKeeper (kazoo): a BookKeeper cluster's tree read into snapshots.

How requests are sent (bounded, pipelined, retried, multiRead where the server has it: probed once on a
throwaway session) is `scrutiny.store.zkrequests`; this module answers `TreeStore`'s primitives over them,
enumerates the ledger tree and Pulsar's records level by level, and keeps the session and the election.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import GetData

from scrutiny.metadata import (
    Layout,
    MetadataServiceUri,
    is_ledger_child,
    ledger_paths,
    parse_metadata_service_uri,
)
from scrutiny.metadata.columns import Znode
from scrutiny.pulsar.records import managed_ledger_of, schema_id_of
from scrutiny.pulsar.snapshot import StoredRecords
from scrutiny.store import (
    Election,
    Fence,
    LedgerRange,
    LedgerRead,
    MetadataStoreUnavailable,
    Registration,
    chunk_ids,
)
from scrutiny.store.tree import TreeStore
from scrutiny.store.zkhandler import PollingHandler
from scrutiny.store.zkrequests import DEFAULT_MAX_IN_FLIGHT, OPERATION_TIMEOUT, MultiRead, ZooKeeperRequests, submit
from scrutiny.store.zkwatch import TreeWatch
from scrutiny.tls import read_credentials

if TYPE_CHECKING:
    from kazoo.recipe.election import Election as KazooElection

    from scrutiny.config import ClusterSettings

log = logging.getLogger(__name__)


def probe_multi_read(settings: ClusterSettings, uri: MetadataServiceUri) -> bool:
    """Does the server answer multiRead? Asked on a throwaway session: a 3.5 server answers an unknown
    opcode by closing the session."""
    client = new_client(settings, uri)
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


def new_client(settings: ClusterSettings, uri: MetadataServiceUri) -> KazooClient:
    """The one way scrutiny makes a ZooKeeper client from settings: TLS, auth, session timeout."""
    return KazooClient(hosts=uri.hosts, timeout=settings.zk_session_timeout, handler=PollingHandler(),
                       connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 2.0},
                       **client_args(settings.zk_auth_file, settings.zk_tls_ca, settings.zk_tls_cert,
                                     settings.zk_tls_key))


def open_store(settings: ClusterSettings) -> ZooKeeperStore:
    uri = parse_metadata_service_uri(settings.metadata_service_uri)
    client = new_client(settings, uri)
    try:
        client.start(timeout=settings.zk_connect_timeout)
    except (KazooTimeoutError, KazooException) as exc:
        client.close()
        raise MetadataStoreUnavailable(f"cannot reach ZooKeeper at {uri.hosts}: {exc}") from None
    multi = settings.zk_multi_read == "on" or (settings.zk_multi_read == "auto" and probe_multi_read(settings, uri))
    return ZooKeeperStore(client, uri, max_in_flight=settings.zk_max_in_flight,
                          retry_deadline=settings.zk_retry_deadline, multi_read=multi)


class ZooKeeperStore(ZooKeeperRequests, TreeStore):
    """BookKeeper's tree (and scrutiny's own znodes beside it) read and written over the request layer."""

    def __init__(self, client: KazooClient, uri: MetadataServiceUri | str,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, retry_deadline: float = 60.0,
                 multi_read: bool = False) -> None:
        ZooKeeperRequests.__init__(self, client, max_in_flight, retry_deadline, multi_read)
        TreeStore.__init__(self, uri)

    def close(self) -> None:
        try:
            self.client.stop()
        finally:
            self.client.close()

    # -- the primitives (`children` is the request layer's) -----------------------------------------

    def value(self, path: str) -> bytes | None:
        got = self.get(path)
        return None if got is None else got[0]

    def values(self, paths: Iterable[str]) -> Iterator[tuple[str, bytes | None]]:
        return ((path, None if got is None else got[0]) for path, got in self.get_many(paths))

    def values_below(self, path: str, depth: int) -> Iterator[tuple[str, bytes]]:
        level = [path]
        for _ in range(depth):  # a level's children listed in batches
            level = [f"{p}/{k}" for p, kids in self.children_many(level) for k in kids or []]
        return ((p.removeprefix(f"{path}/"), got) for p, got in self.values(level) if got is not None)

    def present(self, path: str) -> bool:
        return self.exists(path)

    def put(self, path: str, data: bytes) -> None:
        # one request where the record is there (the leader's records are written again and again)
        try:
            self.client.set(path, data)
        except NoNodeError:
            try:
                self.client.create(path, data, makepath=True)
            except NodeExistsError:  # made meanwhile by another writer: this write is the later one
                self.client.set(path, data)

    def create_unless_changed(self, path: str, data: bytes, guard: str, guard_version: int,
                              fence: Fence | None) -> bool | None:
        self.client.ensure_path(path.rsplit("/", 1)[0])  # as the Auditor leaves a mark's parents: empty, persistent
        tx = self.client.transaction()
        if fence is not None:
            tx.check(fence.key, fence.version)
        tx.check(guard, guard_version)
        tx.create(path, data)
        results = tx.commit()
        if fence is not None and isinstance(results[0], (NoNodeError, BadVersionError)):
            return None
        return not any(isinstance(r, Exception) for r in results)

    def ephemeral(self, path: str, data: bytes) -> Registration:
        node = _EphemeralNode(self.client, path, data)
        node.create()
        return node

    def watch_below(self, root: str, on_event: Callable[[str, str], None], on_gap: Callable[[str], None],
                    resume: str = "") -> TreeWatch | None:
        """A persistent recursive watch (ZooKeeper 3.6+, as multiRead: a server that lacks it would end the
        session, so it is asked for only where multiRead was found to work)."""
        if not self.multi_read:
            log.info("ZooKeeper before 3.6 (no multiRead, so no persistent watch): %s is not watched", root)
            return None
        return TreeWatch(self.client, root, on_event, on_gap, timeout=OPERATION_TIMEOUT)

    # -- enumeration ------------------------------------------------------------------------------

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
        for z in self.read_znodes(ledger_ids):
            yield LedgerRead.of(*z)

    def read_znodes(self, ledger_ids: Iterable[int]) -> Iterator[Znode]:
        asked: deque[int] = deque()  # `get_many` answers in the order asked

        def paths() -> Iterator[str]:
            for lid, path in ledger_paths(self.layout, self.root, ledger_ids):
                asked.append(lid)
                yield path

        for _, got in self.get_many(paths()):
            lid = asked.popleft()
            yield Znode(lid, None) if got is None else Znode(lid, got[0], got[1].ctime, got[1].version, got[1].mtime)

    def pulsar_records(self, topics: Iterable[str] | None = None, under: Iterable[str] = ()) -> StoredRecords:
        base, schemas_base = self.uri.managed_ledgers_path, self.uri.schemas_path
        named, scopes = list(topics or ()), list(under)
        whole = topics is None and not scopes
        paths = [f"{base}/{managed_ledger_of(topic)}" for topic in named]
        schema_paths = sorted({f"{schemas_base}/{schema_id_of(topic)}" for topic in named})
        scopes = [""] if whole else scopes
        # every managed ledger below a scope: the znodes whose parent is a `persistent` domain
        level = [f"{base}/{scope}".rstrip("/") for scope in scopes]
        for _ in range(5):
            deeper: list[str] = []
            for path, kids in self.children_many(level):  # a namespace lists all its topics
                for k in kids or []:
                    (paths if path.rsplit("/", 1)[1] == "persistent" else deeper).append(f"{path}/{k}")
            level = deeper
        for scope in scopes:  # a schema's id is tenant/namespace/topic
            found = [f"{schemas_base}/{scope}".rstrip("/")]
            for _ in range(3 - len([part for part in scope.split("/") if part])):
                found = [f"{p}/{k}" for p, kids in self.children_many(found) for k in kids or []]
            schema_paths += found
        paths, schema_paths = list(dict.fromkeys(paths)), list(dict.fromkeys(schema_paths))  # a topic named and below
        # a topic's cursors, and a cursor's record: a few dozen bytes each, learned apart from the tree's
        cursor_paths = [f"{p}/{c}" for p, kids in self.children_many(paths, small=True) for c in kids or []]
        cursors: dict[str, dict[str, bytes]] = {}
        for path, got in self.get_many(cursor_paths, small=True):
            if got is not None:
                name, cursor = path.removeprefix(f"{base}/").rsplit("/", 1)
                cursors.setdefault(name, {})[cursor] = got[0]
        # read after their cursors: a topic deleted meanwhile has no record, and its cursors are dropped
        # (a record lists every ledger of its topic: its size is learned, as the ledgers' are)
        records = {path.removeprefix(f"{base}/"): got for path, got in self.values(paths) if got is not None}
        schemas = {path.removeprefix(f"{schemas_base}/"): got for path, got in self.values(schema_paths)
                   if got is not None}
        return StoredRecords(records, cursors, schemas, whole=whole)

    # -- session and election ---------------------------------------------------------------------

    def election(self, identifier: str, name: str = "") -> Election:
        return ZooKeeperElection(self.client.Election(name or f"{self._auditor}/election", identifier))

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
