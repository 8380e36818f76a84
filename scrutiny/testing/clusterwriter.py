"""Writes the tree a real BookKeeper cluster keeps in ZooKeeper (for tests, the demo, benchmarks).

Ledgers are created in batched transactions with a bounded number of commits in flight, which is
what makes a million-ledger cluster practical (single creates manage a few thousand per second).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from scrutiny.metadata import (
    BookieRegistration,
    Layout,
    LedgerMetadata,
    UnderreplicationMark,
    encode_bookie_service_info,
    encode_ledger_metadata,
    encode_racks,
    encode_ur_mark,
    format_layout,
    ledger_path,
    ur_mark_path,
)


def cookie(bookie_id: str, instance_id: str, journal_dir: str = "/data/bookkeeper/journal",
           ledger_dir: str = "/data/bookkeeper/ledgers") -> bytes:
    """A bookie's cookie as BookKeeper writes it, in the metadata (`cookies/<id>`) and in each of its directories
    (`current/VERSION`): format 5, the protobuf text of its CookieFormat (`bookie/Cookie.java`)."""
    return (f'5\nbookieHost: "{bookie_id}"\njournalDir: "{journal_dir}"\nledgerDirs: "1\\t{ledger_dir}"\n'
            f'instanceId: "{instance_id}"\n').encode()


make_cookie = cookie  # (register_bookie's own `cookie` flag shadows the name)


class ClusterWriter:
    def __init__(self, client: KazooClient, root: str = "/ledgers", layout: Layout = Layout.HIERARCHICAL) -> None:
        self.client = client
        self.root = root
        self.layout = layout
        self._known_parents: set[str] = set()

    def init_cluster(self, instance_id: str | None = None, write_layout: bool = True) -> None:
        """The znodes `bookkeeper shell initnewcluster` creates."""
        c = self.client
        c.ensure_path(self.root)
        if write_layout:
            self._put(f"{self.root}/LAYOUT", format_layout(self.layout))
        self._put(f"{self.root}/INSTANCEID", (instance_id or str(uuid.uuid4())).encode())
        for sub in ("available/readonly", "cookies", "underreplication/ledgers", "underreplication/locks",
                    "idgen"):
            c.ensure_path(f"{self.root}/{sub}")
        self._put(f"{self.root}/underreplication/LAYOUT", b'type: "BASIC"\nversion: 1\n')

    def _put(self, path: str, data: bytes, ephemeral: bool = False) -> None:
        try:
            self.client.create(path, data, makepath=True, ephemeral=ephemeral)
        except NodeExistsError:
            self.client.set(path, data)

    def _ensure_parents(self, paths: Iterable[str]) -> None:
        for parent in sorted({p.rsplit("/", 1)[0] for p in paths} - self._known_parents):
            self.client.ensure_path(parent)
            self._known_parents.add(parent)

    def write_ledgers(self, ledgers: Iterable[LedgerMetadata],
                      version: int | Callable[[LedgerMetadata], int] = 3,
                      batch: int = 500, in_flight: int = 8) -> int:
        """Create ledger znodes (a batch per transaction); returns how many were written."""
        pick = version if callable(version) else (lambda _md: version)
        return self.write_nodes(((ledger_path(self.layout, self.root, md.ledger_id),
                                  encode_ledger_metadata(md, pick(md))) for md in ledgers), batch, in_flight)

    def write_nodes(self, items: Iterable[tuple[str, bytes]], batch: int = 500, in_flight: int = 8,
                    parents: bool = False) -> int:
        """Create znodes (a batch per transaction, a few in flight); returns how many were written. `parents`:
        they will have children (Pulsar's managed ledgers, their cursors), so they are not made again."""
        pending: deque[Any] = deque()
        written = 0

        def settle() -> None:
            results = pending.popleft().get()
            bad = [r for r in results if isinstance(r, Exception)]
            if bad:
                raise RuntimeError(f"node batch failed: {bad[0]!r}")

        def flush(chunk: list[tuple[str, bytes]]) -> None:
            self._ensure_parents(p for p, _ in chunk)
            tx = self.client.transaction()
            for p, data in chunk:
                tx.create(p, data)
            if len(pending) >= in_flight:
                settle()
            pending.append(tx.commit_async())
            if parents:
                self._known_parents.update(p for p, _ in chunk)

        chunk: list[tuple[str, bytes]] = []
        for item in items:
            chunk.append(item)
            if len(chunk) >= batch:
                flush(chunk)
                written += len(chunk)
                chunk = []
        if chunk:
            flush(chunk)
            written += len(chunk)
        while pending:
            settle()
        return written

    def write_raw_ledger(self, ledger_id: int, data: bytes) -> None:
        """Any payload at a ledger's path (hostile and malformed znodes for tests)."""
        self._put(ledger_path(self.layout, self.root, ledger_id), data)

    def update_ledger(self, md: LedgerMetadata, version: int = 3) -> None:
        self.client.set(ledger_path(self.layout, self.root, md.ledger_id), encode_ledger_metadata(md, version))

    def delete_ledger(self, ledger_id: int) -> None:
        self.client.delete(ledger_path(self.layout, self.root, ledger_id))

    def register_bookie(self, reg: BookieRegistration, ephemeral: bool = True, cookie: bool = True) -> None:
        base = f"{self.root}/available" + ("/readonly" if reg.readonly else "")
        self._put(f"{base}/{reg.bookie_id}", encode_bookie_service_info(reg), ephemeral=ephemeral)
        if cookie:
            instance, _ = self.client.get(f"{self.root}/INSTANCEID")
            self._put(f"{self.root}/cookies/{reg.bookie_id}", make_cookie(reg.bookie_id, instance.decode()))

    def unregister_bookie(self, bookie_id: str) -> None:
        for path in (f"{self.root}/available/{bookie_id}", f"{self.root}/available/readonly/{bookie_id}"):
            if self.client.exists(path):
                self.client.delete(path)

    def mark_underreplicated(self, mark: UnderreplicationMark) -> None:
        self._put(ur_mark_path(self.root, mark.ledger_id), encode_ur_mark(mark))

    def unmark_underreplicated(self, ledger_id: int) -> None:
        self.client.delete(ur_mark_path(self.root, ledger_id))

    def write_racks(self, racks: Mapping[str, str], path: str) -> None:
        self._put(path, encode_racks(racks))

    def set_replication_disabled(self, disabled: bool) -> None:
        path = f"{self.root}/underreplication/disable"
        if disabled:
            self._put(path, b"")
        elif self.client.exists(path):
            self.client.delete(path)

    def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        self._put(f"{self.root}/underreplication/lostBookieRecoveryDelay", str(seconds).encode())

    def write_auditor_record(self, name: str, data: bytes) -> None:
        """A record the auditor's leaders keep (`MetadataStore.auditor_record`): what a leader that watched
        the cluster before would have left, e.g. its orphan and lost-bookie sightings."""
        self._put(f"{self.root.rsplit('/', 1)[0]}/scrutiny/auditor/{name}", data)

    def write_managed_ledger(self, name: str, data: bytes, cursors: Mapping[str, bytes] | None = None) -> None:
        """Pulsar's record of a managed ledger (a topic), beside the ledgers root, and its cursors (by node name)."""
        base = self.managed_ledger_path(name)
        self._put(base, data)
        for cursor, value in (cursors or {}).items():
            self._put(f"{base}/{cursor}", value)

    def write_cursor(self, name: str, node: str, data: bytes) -> None:
        self._put(f"{self.managed_ledger_path(name)}/{node}", data)

    def managed_ledger_path(self, name: str) -> str:
        return f"{self.root.rsplit('/', 1)[0]}/managed-ledgers/{name}"

    def delete_managed_ledger(self, name: str, cursors: Iterable[str] = ()) -> None:
        """A topic's record gone, its cursors (by node name) first."""
        base = self.managed_ledger_path(name)
        for cursor in cursors:
            self.client.delete(f"{base}/{cursor}")
        self.client.delete(base)

    def write_schema(self, schema_id: str, data: bytes) -> None:
        """Pulsar's schema locator of a topic (`tenant/namespace/topic`), beside the ledgers root."""
        self._put(f"{self.root.rsplit('/', 1)[0]}/schemas/{schema_id}", data)
