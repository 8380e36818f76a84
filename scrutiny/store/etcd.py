"""The metadata store on etcd, as Pulsar's metadata-store driver keeps BookKeeper's metadata there
(`metadataServiceUri=metadata-store:etcd:http://host:2379,...`, PIP-45).

Pulsar's etcd store keeps one key per ZooKeeper path, with the same values (formats section 16): the
ledgers at the hybrid hierarchical paths under /ledgers, the marks, the registrations (bound to a lease,
etcd's ephemeral), Pulsar's records beside them. A "directory" is only a key prefix there, so the tree is
read by range: buckets found by bounded windows of bucket numbers (one request per bucket of up to 10,000
ledgers, a few per gap), a bucket's ledgers by a keys-only range, their metadata by ranges with values
(dense) or Txn batches (sparse).
What etcd does not have: a key's creation and modification times (Pulsar reports 0), so a v3 payload's
own ctime is the only one, and a ledger's close time is unknown (a write-cache grace then always looks
again). scrutiny's own keys (agents, election, cadence) sit under /scrutiny, bound to a lease where they
must go with their owner; its election is etcd's concurrency recipe (keys `<prefix>/<lease hex>`, the
lowest create revision leads), so `etcdctl elect -l /scrutiny/auditor/election` shows the leader.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING

import grpc

from scrutiny.errors import StoreError
from scrutiny.metadata import (
    SHORT_PATH_LIMIT,
    Layout,
    MetadataServiceUri,
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
    Registration,
)
from scrutiny.store.etcdkv import EtcdKV, Session, prefix_end
from scrutiny.store.tree import TreeStore

if TYPE_CHECKING:
    from scrutiny.config import ClusterSettings

log = logging.getLogger(__name__)
# A ledger's key below the root: its bucket (2-4 digits below 2^31, 3-4-4-4 from it) and its leaf.
_LEDGER_KEY = re.compile(rb"^(\d{2}/\d{4}|\d{3}/\d{4}/\d{4}/\d{4})/L(\d{4})$")


@dataclass(frozen=True)
class _Shape:
    """One of the hybrid layout's bucket shapes: buckets numbered by ledger id // 10,000, in groups whose
    keys are contiguous in etcd's byte order (the two shapes interleave: `00/...` < `000/...` < `01/...`)."""

    digits: tuple[int, ...]  # the token's groups of digits: (2, 4) or (3, 4, 4, 4)
    start: int  # the first bucket number of this shape
    end: int  # past the last
    group: int  # buckets per contiguous group: one two-digit top child; ten three-digit ones

    def token(self, bucket: int) -> str:
        text, out = f"{bucket:0{sum(self.digits)}d}", []
        for n in self.digits:
            out.append(text[:n])
            text = text[n:]
        return "/".join(out)


# ids below 2147483647 at 2-4-4 (buckets up to 214748), from it at 3-4-4-4-4 (formats, section 7)
_SHORT = _Shape((2, 4), 0, SHORT_PATH_LIMIT // 10_000 + 1, 10**4)
_LONG = _Shape((3, 4, 4, 4), SHORT_PATH_LIMIT // 10_000, (1 << 63) // 10_000 + 1, 10**13)
DENSE = 32  # from this many ledgers of one bucket, range reads between the first and last beat Txn gets
SPAN = 500  # ledgers asked for per range read (the answer whole, about 150 KB), several in flight
READ_CHUNK = 10_000


def open_store(settings: ClusterSettings) -> EtcdStore:
    uri = parse_metadata_service_uri(settings.metadata_service_uri)
    kv = EtcdKV(uri.servers, ca=settings.etcd_tls_ca, cert=settings.etcd_tls_cert, key=settings.etcd_tls_key,
                auth_file=settings.etcd_auth_file, timeout=settings.etcd_timeout,
                retry_deadline=settings.etcd_retry_deadline)
    try:
        # reachable at all: fail now (as soon as ZooKeeper's connect would), not in the middle of a run
        kv.first(b"/", b"/\0", retry_deadline=settings.etcd_connect_timeout)
    except Exception:
        kv.close()
        raise
    return EtcdStore(kv, uri, lease_ttl=settings.etcd_lease_ttl)


class EtcdStore(TreeStore):
    def __init__(self, kv: EtcdKV, uri: MetadataServiceUri | str, lease_ttl: int = 30) -> None:
        super().__init__(uri)
        self.kv = kv
        self._lease_ttl = lease_ttl
        self._session: Session | None = None
        self._session_lock = threading.Lock()

    @property
    def reads(self) -> int:  # type: ignore[override]
        return self.kv.reads

    @property
    def session(self) -> Session:
        """The lease ephemeral keys and the election are bound to, granted when first needed."""
        with self._session_lock:
            if self._session is None:
                self._session = Session(self.kv, self._lease_ttl)
            return self._session

    def close(self) -> None:
        try:
            if self._session is not None:
                self._session.close()
        finally:
            self.kv.close()

    # -- the primitives ---------------------------------------------------------------------------

    def value(self, path: str) -> bytes | None:
        got = self.kv.get(path.encode())
        return None if got is None else got.value

    def values(self, paths: Iterable[str]) -> Iterator[tuple[str, bytes | None]]:
        return ((key.decode(), None if got is None else got.value)
                for key, got in self.kv.get_many([p.encode() for p in paths]))

    def children(self, path: str) -> list[str]:
        prefix = f"{path}/".encode()
        return sorted({kv.key[len(prefix):].decode("utf-8", "replace").split("/", 1)[0]
                       for kv in self.kv.scan_prefix(prefix, keys_only=True)})

    def values_below(self, path: str, depth: int) -> Iterator[tuple[str, bytes]]:
        """One range read (etcd has no directories: a key may sit below another, or alone below nothing)."""
        return ((rest, value) for rest, value in self._below(path) if rest.count("/") == depth - 1)

    def _below(self, path: str) -> Iterator[tuple[str, bytes]]:
        """(rest of the key, value) of every key below `path/`, at any depth."""
        prefix = f"{path}/".encode()
        for kv in self.kv.scan_prefix(prefix):
            yield kv.key[len(prefix):].decode("utf-8", "replace"), kv.value

    def present(self, path: str) -> bool:
        prefix = f"{path}/".encode()
        return self.kv.first(prefix, prefix_end(prefix)) is not None or self.kv.get(path.encode()) is not None

    def put(self, path: str, data: bytes) -> None:
        self.kv.put(path.encode(), data)

    def create_unless_changed(self, path: str, data: bytes, guard: str, guard_version: int,
                              fence: Fence | None) -> bool | None:
        # no parent keys: Pulsar's etcd store lists children by prefix; its version counts from 1 (Stat's 0)
        return self.kv.create_if_unchanged(path.encode(), data, guard.encode(), guard_version + 1,
                                           (fence.key.encode(), fence.version) if fence is not None else None)

    def ephemeral(self, path: str, data: bytes) -> Registration:
        return EphemeralKey(self.session, path, data)

    def watch_below(self, root: str, on_event: Callable[[str, str], None], on_gap: Callable[[str], None],
                    resume: str = "") -> EtcdTreeWatch:
        """etcd's watch, from the revision after `resume` (or now): ordered and gap-free while etcd keeps
        that history; a broken stream resumes from the last revision seen, a compacted one is a gap."""
        return EtcdTreeWatch(self.kv, root, on_event, on_gap, int(resume) if resume.isdigit() else 0)

    # -- enumeration --------------------------------------------------------------------------------

    def ledger_ranges(self) -> list[LedgerRange]:
        """The buckets of the ledger tree (tokens as ZooKeeper's store makes them: `00/0000`,
        `000/0000/0021/4748`), found without listing the ledgers: the first ledger key in a window of
        buckets after the last one found, the window doubling while empty (a group's first window is all
        of it). Every window is bounded: etcd counts every key of the range it is asked about, limit or
        not, so an open-ended "first key from here" costs the rest of the tree (quadratic over a scan)."""
        return [LedgerRange(t) for shape in (_SHORT, _LONG) for t in self._buckets(shape)]

    def _buckets(self, shape: _Shape) -> Iterator[str]:
        base = f"{self.root}/"
        bucket = shape.start
        while bucket < shape.end:
            last = min((bucket // shape.group + 1) * shape.group, shape.end) - 1
            group_end = prefix_end(f"{base}{shape.token(last)[:shape.digits[0]]}/".encode())
            width = shape.group  # a group's first probe: all of it (one request for an empty group)
            while bucket <= last:
                hi = bucket + width
                end = group_end if hi > last else f"{base}{shape.token(hi)}/".encode()
                found = self._first_bucket(f"{base}{shape.token(bucket)}/".encode(), end, shape)
                if found is None:
                    bucket, width = hi, width * 2
                    continue
                yield shape.token(found)
                bucket, width = found + 1, 1
            bucket = last + 1

    def _first_bucket(self, start: bytes, end: bytes, shape: _Shape) -> int | None:
        """The number of the first bucket of this shape holding a ledger key in [start, end)."""
        base = len(self.root) + 1
        while (key := self.kv.first(start, end)) is not None:
            m = _LEDGER_KEY.match(key[base:])
            if m and len(m.group(1)) == len(shape.token(0)):
                return int(m.group(1).replace(b"/", b""))
            start = key + b"\0"  # a parent key, a stray key: the next one
        return None

    def ledger_ids(self, rng: LedgerRange) -> list[int]:
        if rng.ids is not None:
            return list(rng.ids)
        digits = rng.token.replace("/", "")
        prefix = f"{self.root}/{rng.token}/".encode()
        leaves = (kv.key[len(prefix):] for kv in self.kv.scan_prefix(prefix, keys_only=True))
        return sorted(int(digits + leaf[1:].decode()) for leaf in leaves
                      if len(leaf) == 5 and leaf[:1] == b"L" and leaf[1:].isdigit())

    def read_ledgers(self, ledger_ids: Iterable[int]) -> Iterator[LedgerRead]:
        for z in self.read_znodes(ledger_ids):
            yield LedgerRead.of(*z)

    def read_znodes(self, ledger_ids: Iterable[int]) -> Iterator[Znode]:
        chunk: list[int] = []
        for lid in ledger_ids:
            chunk.append(lid)
            if len(chunk) == READ_CHUNK:
                yield from self._read_chunk(chunk)
                chunk = []
        if chunk:
            yield from self._read_chunk(chunk)

    def _read_chunk(self, ids: list[int]) -> Iterator[Znode]:
        path = {lid: p.encode() for lid, p in ledger_paths(Layout.HIERARCHICAL, self.root, ids)}
        spans: list[tuple[bytes, bytes]] = []
        sparse: list[bytes] = []
        for _bucket, group in groupby(sorted(path.values()), key=lambda p: p.rsplit(b"/", 1)[0]):
            keys = list(group)
            if len(keys) < DENSE:
                sparse += keys
                continue
            spans += [(keys[i], keys[min(i + SPAN, len(keys)) - 1] + b"\0") for i in range(0, len(keys), SPAN)]
        wanted = set(path.values())
        got: dict[bytes, tuple[bytes, int] | None] = {
            item.key: (item.value, item.version) for item in self.kv.ranges(spans) if item.key in wanted}
        for key, one in self.kv.get_many(sparse):
            got[key] = None if one is None else (one.value, one.version)
        for lid in ids:
            found = got.get(path[lid])
            # etcd has no creation or modification time (Pulsar's Stat says 0: unknown); version 1 is Stat's 0
            yield Znode(lid, None) if found is None else Znode(lid, found[0], version=found[1] - 1)

    def pulsar_records(self, topics: Iterable[str] | None = None, under: Iterable[str] = ()) -> StoredRecords:
        """Managed ledgers are the keys whose parent is a `persistent` domain, cursors their children;
        schemas the keys three levels below /schemas."""
        base, schemas_base = self.uri.managed_ledgers_path, self.uri.schemas_path
        named, below = sorted({managed_ledger_of(t) for t in topics or ()}), list(under)
        whole = topics is None and not below
        records: dict[str, bytes] = {}
        cursors: dict[str, dict[str, bytes]] = {}
        for name in named:
            if (value := self.value(f"{base}/{name}")) is not None:
                records[name] = value
        for scope in named + below if not whole else [""]:  # a topic's cursors below it; a scope's topics too
            for rest, value in self._below(f"{base}/{scope}".rstrip("/")):
                parts = f"{scope}/{rest}".strip("/").split("/")
                if len(parts) >= 2 and parts[-2] == "persistent":
                    records["/".join(parts)] = value
                elif len(parts) >= 3 and parts[-3] == "persistent":
                    cursors.setdefault("/".join(parts[:-1]), {})[parts[-1]] = value
        ids = sorted({schema_id_of(t) for t in topics or ()})
        schemas = {sid: value for sid in ids if (value := self.value(f"{schemas_base}/{sid}")) is not None}
        for scope in below if not whole else [""]:  # a schema's id is tenant/namespace/topic
            schemas |= {sid: value for rest, value in self._below(f"{schemas_base}/{scope}".rstrip("/"))
                        if (sid := f"{scope}/{rest}".strip("/")).count("/") == 2}
        return StoredRecords(dict(sorted(records.items())), cursors, schemas, whole=whole)

    # -- session and election -----------------------------------------------------------------------

    def election(self, identifier: str, name: str = "") -> Election:
        return EtcdElection(self, name or f"{self._auditor}/election", identifier)

    def on_session_lost(self, callback: Callable[[], None]) -> None:
        self.session.on_lost(callback)


class EphemeralKey:
    """A key bound to the session's lease, re-created on each new lease until closed."""

    def __init__(self, session: Session, path: str, data: bytes) -> None:
        self.session, self.key, self.data = session, path.encode(), data
        self._closed = False
        session.on_renewed(self._create)
        self._create()

    def _create(self) -> None:
        if not self._closed:
            try:
                self.session.kv.put(self.key, self.data, lease=self.session.lease)
            except Exception as exc:
                log.warning("could not register %s: %s", self.key.decode(), exc)

    def close(self) -> None:
        self._closed = True
        try:
            self.session.kv.delete(self.key)
        except Exception as exc:
            log.warning("could not remove %s: %s", self.key.decode(), exc)


class EtcdElection:
    """etcd's election recipe: each contender a key `<name>/<lease hex>` on its lease; the lowest create
    revision leads; the others wait for every key created before theirs to go."""

    POLL = 0.5

    def __init__(self, store: EtcdStore, name: str, identifier: str) -> None:
        self.store, self.prefix, self.identifier = store, f"{name}/".encode(), identifier
        self._cancelled = threading.Event()
        self._won: Fence | None = None  # the key it leads with, at its create revision

    def _contenders(self) -> list[tuple[int, bytes, bytes]]:
        return sorted((kv.create_revision, kv.key, kv.value) for kv in self.store.kv.scan_prefix(self.prefix))

    def contenders(self) -> list[str]:
        return [value.decode("utf-8", "replace") for _, _, value in self._contenders()]

    def run(self, lead: Callable[[], None]) -> None:
        self._cancelled.clear()
        session = self.store.session
        key = b""
        try:
            while not self._cancelled.is_set():
                lease = session.lease
                key = self.prefix + f"{lease:x}".encode()
                contenders = self._contenders()
                if key not in (k for _, k, _ in contenders):  # first round, or a lost lease took it: a write
                    self.store.kv.create(key, self.identifier.encode(), lease=lease)
                    contenders = self._contenders()
                if contenders and contenders[0][1] == key:
                    self._won = Fence(key.decode(), contenders[0][0])
                    try:
                        lead()
                    finally:
                        self._won = None
                    return
                self._cancelled.wait(self.POLL)  # a poll is one read: no write while waiting
        finally:
            if key:
                self.store.kv.delete(key)

    def fence(self) -> Fence | None:
        return self._won

    def cancel(self) -> None:
        self._cancelled.set()


class EtcdTreeWatch:
    """A watch of every key below a prefix (the ledgers root, Pulsar's records), as (event, key) on `on_event`,
    on its own thread, resumed from the last revision seen when the stream breaks (etcd replays what changed
    meanwhile); a compacted start revision is a gap."""

    def __init__(self, kv: EtcdKV, root: str, on_event: Callable[[str, str], None],
                 on_gap: Callable[[str], None], after: int) -> None:
        self.kv, self.root, self.on_event, self.on_gap = kv, root, on_event, on_gap
        self._stop = threading.Event()
        self._seen = after or kv.revision()  # every change up to this revision is accounted for
        self._thread = threading.Thread(target=self._run, name="etcd-watch", daemon=True)
        self._thread.start()

    def position(self) -> str:
        return str(self._seen)

    def _run(self) -> None:
        prefix = (self.root + "/").encode()
        while not self._stop.is_set():
            try:
                for batch in self.kv.watch(prefix, self._seen + 1, self._stop):
                    if batch.compact_revision:
                        self._seen = self.kv.revision()
                        self.on_gap(f"etcd compacted its history past revision {batch.compact_revision - 1}")
                        break  # a new watch from now
                    for kind, key, _ in batch.events:
                        self.on_event(kind, key)
                    if batch.events:
                        self._seen = max(self._seen, batch.events[-1][2])
                    elif not batch.created:  # progress: nothing below the root changed up to the store's revision
                        self._seen = max(self._seen, batch.revision)
            except (grpc.RpcError, StoreError) as exc:
                if not self._stop.is_set():
                    log.info("etcd watch interrupted (%s): resuming after revision %d", exc, self._seen)
                    self._stop.wait(1.0)
                    self.kv.reconnect()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
