"""The one interface to ZooKeeper: reads a BookKeeper cluster's tree into metadata snapshots.

Reads are pipelined with a bounded number in flight: results are collected on the caller's thread,
never on kazoo's event thread, and never more than `max_in_flight` requests are outstanding (upstream's
auditor expired its own session by firing every read at once, BookKeeper #2802).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, KazooException, NoNodeError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from scrutiny.metadata import (
    BookieRegistration,
    Layout,
    LedgerMetadata,
    MetadataError,
    MetadataServiceUri,
    UnderreplicationMark,
    decode_bookie_service_info,
    decode_ledger_metadata,
    decode_racks,
    decode_ur_mark,
    is_ledger_child,
    ledger_id_of_mark,
    ledger_path,
    parse_layout,
    parse_metadata_service_uri,
    ur_mark_path,
)

log = logging.getLogger(__name__)
DEFAULT_MAX_IN_FLIGHT = 256
_RETRYABLE = (ConnectionLoss, ConnectionClosedError, SessionExpiredError, KazooTimeoutError)
OPERATION_TIMEOUT = 10.0  # seconds one request may wait for an answer before it is retried


class MetadataStoreUnavailable(RuntimeError):
    """ZooKeeper could not be reached or stayed unreachable past the retry budget."""


@dataclass(frozen=True, slots=True)
class LedgerRange:
    """A unit of work: a bucket znode whose `L####` children are ledgers (hierarchical layouts),
    or an explicit list of ledger ids (flat layout, or a scan of chosen ledgers)."""

    path: str
    prefix: str = ""
    ids: tuple[int, ...] | None = None

    def ledger_id(self, leaf: str) -> int | None:
        digits = leaf[1:]
        if not leaf.startswith("L") or not digits.isdigit():
            return None
        if self.prefix and len(digits) != 4:
            return None
        return int(self.prefix + digits)


@dataclass(frozen=True, slots=True)
class LedgerRead:
    """The outcome of reading one ledger's znode."""

    ledger_id: int
    metadata: LedgerMetadata | None = None
    error: str | None = None  # undecodable or inconsistent metadata
    deleted: bool = False  # gone between enumeration and read


@dataclass(frozen=True, slots=True)
class Registrations:
    writable: dict[str, BookieRegistration]
    readonly: dict[str, BookieRegistration]
    cookies: frozenset[str]
    problems: tuple[str, ...] = ()

    def registered(self, bookie_id: str) -> bool:
        return bookie_id in self.writable or bookie_id in self.readonly


class ZkMetadataStore:
    def __init__(self, client: KazooClient, uri: MetadataServiceUri, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 retry_deadline: float = 60.0) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.client = client
        self.uri = uri
        self.root = uri.root
        self.max_in_flight = max_in_flight
        self.peak_in_flight = 0
        self.reads = 0
        self.retry_deadline = retry_deadline
        self._layout: Layout | None = uri.layout

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def connect(cls, uri: str | MetadataServiceUri, timeout: float = 10.0, session_timeout: float = 30.0,
                max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, retry_deadline: float = 60.0,
                **client_args: Any) -> ZkMetadataStore:
        parsed = parse_metadata_service_uri(uri) if isinstance(uri, str) else uri
        client = KazooClient(hosts=parsed.hosts, timeout=session_timeout,
                             connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 2.0}, **client_args)
        try:
            client.start(timeout=timeout)
        except (KazooTimeoutError, KazooException) as exc:
            client.close()
            raise MetadataStoreUnavailable(f"cannot reach ZooKeeper at {parsed.hosts}: {exc}") from None
        return cls(client, parsed, max_in_flight=max_in_flight, retry_deadline=retry_deadline)

    def close(self) -> None:
        try:
            self.client.stop()
        finally:
            self.client.close()

    def __enter__(self) -> ZkMetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, start: Callable[..., Any], *args: Any) -> Any:
        """One request (an asynchronous kazoo call), retried across connection loss and session
        expiry until the retry deadline. Each wait is bounded: while disconnected, kazoo queues a
        request without limit, since it cannot learn that its session expired before it reconnects."""
        deadline = time.monotonic() + self.retry_deadline
        delay = 0.1
        while True:
            remaining = deadline - time.monotonic()
            try:
                return start(*args).get(timeout=max(0.05, min(remaining, OPERATION_TIMEOUT)))
            except _RETRYABLE as exc:
                if time.monotonic() + delay >= deadline:
                    raise MetadataStoreUnavailable(
                        f"ZooKeeper unavailable for {self.retry_deadline:.0f} s: {type(exc).__name__}") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def get(self, path: str) -> tuple[bytes, Any] | None:
        try:
            return self.call(self.client.get_async, path)
        except NoNodeError:
            return None

    def children(self, path: str) -> list[str]:
        try:
            return sorted(self.call(self.client.get_children_async, path))
        except NoNodeError:
            return []

    def exists(self, path: str) -> bool:
        return self.call(self.client.exists_async, path) is not None

    # -- pipelined reads ----------------------------------------------------------------------

    def _pipelined(self, paths: Iterable[str], start: Callable[[str], Any]) -> Iterator[tuple[str, Any]]:
        """Yield (path, result or None for a missing node), in order, at most max_in_flight outstanding."""
        pending: deque[tuple[str, Any]] = deque()

        def drain_one() -> tuple[str, Any]:
            path, handle = pending.popleft()
            try:
                if handle is None:
                    raise ConnectionLoss()
                return path, handle.get(timeout=OPERATION_TIMEOUT)
            except NoNodeError:
                return path, None
            except _RETRYABLE:
                # The connection dropped under this request: redo it on its own, with retries.
                try:
                    return path, self.call(start, path)
                except NoNodeError:
                    return path, None

        for path in paths:
            if len(pending) >= self.max_in_flight:
                yield drain_one()
            try:
                handle = start(path)
            except _RETRYABLE:
                handle = None  # submitted again, with retries, when collected
            pending.append((path, handle))
            if len(pending) > self.peak_in_flight:
                self.peak_in_flight = len(pending)
            self.reads += 1
        while pending:
            yield drain_one()

    def get_many(self, paths: Iterable[str]) -> Iterator[tuple[str, tuple[bytes, Any] | None]]:
        return self._pipelined(paths, self.client.get_async)

    def children_many(self, paths: Iterable[str]) -> Iterator[tuple[str, list[str] | None]]:
        return self._pipelined(paths, self.client.get_children_async)

    # -- layout and enumeration ---------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            got = self.get(f"{self.root}/LAYOUT")
            if got is None:
                raise MetadataError(f"no LAYOUT znode under {self.root}: is this a BookKeeper metadata root?")
            self._layout = parse_layout(got[0])
        return self._layout

    def ledger_ranges(self) -> list[LedgerRange]:
        """Every unit of work under the root: level-2 buckets of the short hierarchical tree,
        level-4 buckets of the long tree, or chunks of a flat root."""
        top = [c for c in self.children(self.root) if is_ledger_child(c)]
        if self.layout is Layout.FLAT:
            ids = sorted(int(c[1:]) for c in top if c.startswith("L") and c[1:].isdigit())
            return chunk_ids(self.root, ids)
        short = [c for c in top if len(c) == 2 and c.isdigit()] if self.layout is Layout.HIERARCHICAL else []
        long_ = [c for c in top if len(c) == 3 and c.isdigit()]
        ranges = []
        for path, kids in self.children_many(f"{self.root}/{c}" for c in short):
            for k in kids or []:
                if len(k) == 4 and k.isdigit():
                    ranges.append(LedgerRange(f"{path}/{k}", path.rsplit("/", 1)[1] + k))
        level = [(f"{self.root}/{c}", c) for c in long_]
        for _ in range(3):
            prefixes = dict(level)
            level = [
                (f"{path}/{k}", prefixes[path] + k)
                for path, kids in self.children_many(p for p, _ in level)
                for k in kids or []
                if len(k) == 4 and k.isdigit()
            ]
        ranges += [LedgerRange(path, prefix) for path, prefix in level]
        return ranges

    def ledger_ids(self, rng: LedgerRange) -> list[int]:
        if rng.ids is not None:
            return list(rng.ids)
        ids = (rng.ledger_id(leaf) for leaf in self.children(rng.path))
        return sorted(i for i in ids if i is not None)

    # -- ledgers ------------------------------------------------------------------------------

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

    # -- under-replication --------------------------------------------------------------------

    def underreplication_marks(self) -> tuple[dict[int, UnderreplicationMark], list[str]]:
        """Every mark under underreplication/ledgers, and problems with single marks."""
        level = [f"{self.root}/underreplication/ledgers"]
        for _ in range(4):
            level = [f"{p}/{k}" for p, kids in self.children_many(level) for k in kids or []]
        leaves: dict[str, int] = {}
        for path, kids in self.children_many(level):
            for k in kids or []:
                lid = ledger_id_of_mark(k)
                if lid is not None:
                    leaves[f"{path}/{k}"] = lid
        marks: dict[int, UnderreplicationMark] = {}
        problems = []
        for path, got in self.get_many(list(leaves)):
            if got is None:
                continue  # re-replicated meanwhile
            try:
                marks[leaves[path]] = decode_ur_mark(leaves[path], got[0])
            except MetadataError as exc:
                problems.append(str(exc))
        return marks, problems

    def underreplication_mark(self, ledger_id: int) -> UnderreplicationMark | None:
        got = self.get(ur_mark_path(self.root, ledger_id))
        if got is None:
            return None
        try:
            return decode_ur_mark(ledger_id, got[0])
        except MetadataError:
            # A mark we cannot read is still a mark.
            return UnderreplicationMark(ledger_id, (), None)

    def replication_disabled(self) -> bool:
        return self.exists(f"{self.root}/underreplication/disable")

    def lost_bookie_recovery_delay(self) -> int | None:
        got = self.get(f"{self.root}/underreplication/lostBookieRecoveryDelay")
        if got is None:
            return None
        text = got[0].decode("ascii", "replace").strip()
        return int(text) if text.lstrip("-").isdigit() else None

    # -- bookies ------------------------------------------------------------------------------

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

    def agent_addresses(self) -> dict[str, str]:
        """bookie id -> address of its agent, from the agents' own registrations."""
        base = f"{self.uri.scrutiny_path}/agents"
        out = {}
        for path, got in self.get_many(f"{base}/{b}" for b in self.children(base)):
            if got is None:
                continue
            try:
                doc = json.loads(got[0])
                out[str(doc["bookie_id"])] = str(doc["address"])
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable agent registration %s", path)
        return out

    def racks(self, path: str | None = None) -> tuple[dict[str, str], list[str]]:
        where = path or self.uri.racks_path
        got = self.get(where)
        if got is None:
            return {}, []
        try:
            return decode_racks(got[0], where)
        except MetadataError as exc:
            return {}, [str(exc)]


def chunk_ids(root: str, ids: list[int], size: int = 10_000) -> list[LedgerRange]:
    return [LedgerRange(root, "", tuple(ids[i:i + size])) for i in range(0, len(ids), size)]
