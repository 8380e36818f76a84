"""ZooKeeper requests as scrutiny sends them: bounded, pipelined, retried, and batched in multiRead.

Reads are pipelined with a bounded number of requests in flight: results are collected on the caller's
thread, never on kazoo's event thread, and never more than `max_in_flight` requests are outstanding
(upstream's auditor expired its own session by firing every read at once, BookKeeper #2802). Where the
server has it (ZooKeeper 3.6+), reads go in `multiRead` requests: hundreds of reads per request, batches
sized by the bytes of their answers, a few batches in flight. Every wait is bounded and retried across
connection loss and session expiry until the retry deadline. Nothing here knows BookKeeper's tree: that
is `scrutiny.store.zookeeper`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    EXCEPTIONS,
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    SessionExpiredError,
    UnimplementedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import (
    GetChildren,
    GetData,
    ZnodeStat,
    int_struct,
    multiheader_struct,
    read_string,
    stat_struct,
)
from kazoo.protocol.states import KeeperState

from scrutiny import retry
from scrutiny.errors import ConfigError
from scrutiny.store import MetadataStoreUnavailable

log = logging.getLogger(__name__)
DEFAULT_MAX_IN_FLIGHT = 256
_RETRYABLE = (ConnectionLoss, ConnectionClosedError, SessionExpiredError, KazooTimeoutError)
OPERATION_TIMEOUT = 10.0  # seconds one request may wait for an answer before it is retried
# multiRead: answers kept well under the 1 MiB packet cap (jute.maxbuffer); a few batches in flight.
MULTI_BYTES = 256 * 1024
MULTI_MAX_OPS = 1000
MULTI_IN_FLIGHT = 4
# Small records (Pulsar's cursors and managed ledgers, a few dozen bytes each) may go more to a batch, as long as
# the request itself (its paths) stays as far under the cap as the answers do.
SMALL_MAX_OPS = 8000


ReadOp = type[GetData | GetChildren]


class MultiRead:
    """ZooKeeper's read-only multi (opcode 22, 3.6+), a request type beside kazoo's own: many getData or
    getChildren (one kind per request) in one request, one result per op (the answer, or the op's own
    error, e.g. NONODE). Written and read with kazoo's structs, by hand: it carries a scan's every read."""

    type = 22

    def __init__(self, op: ReadOp, paths: list[str]) -> None:
        self.op, self.paths = op, paths

    def serialize(self) -> bytearray:
        b = bytearray()
        header = multiheader_struct.pack(self.op.type, False, -1)
        for path in self.paths:
            encoded = path.encode("utf-8")
            b += header
            b += int_struct.pack(len(encoded))
            b += encoded
            b += b"\0"  # no watch
        return b + multiheader_struct.pack(-1, True, -1)

    @classmethod
    def deserialize(cls, buf: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        header_size, int_size, stat_size = multiheader_struct.size, int_struct.size, stat_struct.size
        while True:
            kind, done, err = multiheader_struct.unpack_from(buf, offset)
            offset += header_size
            if done:
                return results
            if kind == -1:
                err = int_struct.unpack_from(buf, offset)[0]
                offset += int_size
                results.append(EXCEPTIONS[err]())
            elif kind == GetChildren.type:
                count = int_struct.unpack_from(buf, offset)[0]
                offset += int_size
                children = []
                for _ in range(max(count, 0)):
                    child, offset = read_string(buf, offset)
                    children.append(child)
                results.append(children)
            else:
                length = int_struct.unpack_from(buf, offset)[0]
                offset += int_size
                data = buf[offset:offset + length] if length >= 0 else None
                offset += max(length, 0)
                results.append((data, ZnodeStat._make(stat_struct.unpack_from(buf, offset))))
                offset += stat_size


def submit(client: KazooClient, request: Any) -> Any:
    """A request on the client's own connection (kazoo's protocol layer, its xids and its retries)."""
    result = client.handler.async_result()
    client._call(request, result)
    return result


class ZooKeeperRequests:
    """The request layer over one kazoo client: single reads with retries, pipelined reads, multiRead
    batches, and the counters a run reports (reads, requests, the peak in flight)."""

    def __init__(self, client: KazooClient, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, retry_deadline: float = 60.0,
                 multi_read: bool = False) -> None:
        if max_in_flight < 1:
            raise ConfigError("zk_max_in_flight must be at least 1")
        self.client = client
        self.max_in_flight = max_in_flight
        self.peak_in_flight = 0
        self.reads = 0
        self.retry_deadline = retry_deadline
        self.multi_read = multi_read
        self.requests = 0  # requests sent (a multiRead is one)
        # What one answer costs, per kind of read, learned from the answers (a full leaf bucket's
        # listing is ~100 KiB): the first batches are small, later ones sized to MULTI_BYTES.
        # per kind of read: (op, small); the ledger tree's buckets have thousands of children, a record none
        self._answer_bytes: dict[tuple[int, bool], float] = {
            (GetData.type, False): 512.0, (GetChildren.type, False): 64 * 1024.0,
            (GetData.type, True): 128.0, (GetChildren.type, True): 128.0}

    def call(self, start: Callable[..., Any], *args: Any) -> Any:
        """One request (an asynchronous kazoo call), retried across connection loss and session
        expiry until the retry deadline. Each wait is bounded: while disconnected, kazoo queues a
        request without limit, since it cannot learn that its session expired before it reconnects."""
        deadline = time.monotonic() + self.retry_deadline

        def once() -> Any:
            return start(*args).get(timeout=max(0.05, min(deadline - time.monotonic(), OPERATION_TIMEOUT)))

        def retryable(exc: Exception) -> bool:  # a client we stopped ourselves never comes back
            return isinstance(exc, _RETRYABLE) and self.client.client_state != KeeperState.CLOSED

        try:
            return retry.Retry(retry.ZOOKEEPER_REQUEST, deadline=self.retry_deadline).call(once, retryable)
        except _RETRYABLE as exc:
            raise MetadataStoreUnavailable(
                f"ZooKeeper unavailable for {self.retry_deadline:.0f} s: {type(exc).__name__}") from None

    def get(self, path: str) -> tuple[bytes, Any] | None:
        try:
            got: tuple[bytes, Any] = self.call(self.client.get_async, path)
            return got
        except NoNodeError:
            return None

    def children(self, path: str) -> list[str]:
        try:
            return sorted(self.call(self.client.get_children_async, path))
        except NoNodeError:
            return []

    def exists(self, path: str) -> bool:
        return self.call(self.client.exists_async, path) is not None

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
            self.peak_in_flight = max(self.peak_in_flight, len(pending))
            self.reads += 1
            self.requests += 1
        while pending:
            yield drain_one()

    def get_many(self, paths: Iterable[str], small: bool = False) -> Iterator[tuple[str, tuple[bytes, Any] | None]]:
        """Each path's data and stat (None: no such node), in order. `small`: records of a few dozen bytes."""
        if self.multi_read:
            return self._multi(paths, GetData, small)
        return self._pipelined(paths, self.client.get_async)

    def children_many(self, paths: Iterable[str], small: bool = False) -> Iterator[tuple[str, list[str] | None]]:
        if self.multi_read:
            return self._multi(paths, GetChildren, small)
        return self._pipelined(paths, self.client.get_children_async)

    def _batches(self, paths: Iterable[str], op: ReadOp, small: bool) -> Iterator[list[str]]:
        """Batches sized by the bytes their answers are expected to take (learned per kind of read), and by
        the bytes of their paths."""
        def most() -> int:
            cap = SMALL_MAX_OPS if small else MULTI_MAX_OPS
            return max(1, min(cap, int(MULTI_BYTES / self._answer_bytes[op.type, small])))

        batch: list[str] = []
        limit, size = most(), 0
        for path in paths:
            batch.append(path)
            size += len(path) + 8
            if len(batch) >= limit or size >= MULTI_BYTES:
                yield batch
                batch, limit, size = [], most(), 0
        if batch:
            yield batch

    def _multi(self, paths: Iterable[str], op: ReadOp, small: bool = False) -> Iterator[tuple[str, Any]]:
        """Reads in multiRead batches, a few batches in flight, in order; per-op errors per path
        (NONODE: None, as on the single path)."""
        pending: deque[tuple[list[str], Any]] = deque()
        single = self.client.get_async if op is GetData else self.client.get_children_async

        def request(batch: list[str]) -> Any:
            # Our paths are already normal: the chroot is only prepended (kazoo normalises every path).
            return submit(self.client, MultiRead(op, [self.client.chroot + p for p in batch]))

        def drain_one() -> Iterator[tuple[str, Any]]:
            batch, handle = pending.popleft()
            try:
                if handle is None:
                    raise ConnectionLoss()
                results = handle.get(timeout=OPERATION_TIMEOUT)
            except UnimplementedError:
                # A server without multiRead (a 3.5 member of a mixed ensemble): single reads from now on.
                log.warning("ZooKeeper answered multiRead with UNIMPLEMENTED: pipelined single reads from now on")
                self.multi_read = False
                yield from self._pipelined(batch, single)
                return
            except _RETRYABLE:
                if not self.multi_read:  # the session went down with the server that refused multiRead
                    yield from self._pipelined(batch, single)
                    return
                results = self.call(request, batch)
            size = 0
            for path, got in zip(batch, results, strict=True):
                if isinstance(got, NoNodeError):
                    yield path, None
                    continue
                if isinstance(got, Exception):
                    raise got
                size += 80 + (len(got[0] or b"") if op is GetData else sum(len(c) + 4 for c in got))
                yield path, got
            learned = self._answer_bytes[op.type, small]
            self._answer_bytes[op.type, small] = max(0.8 * learned + 0.2 * size / len(batch), size / len(batch), 16)

        for batch in self._batches(paths, op, small):
            if len(pending) >= min(MULTI_IN_FLIGHT, self.max_in_flight):
                yield from drain_one()
            try:
                handle = request(batch)
            except _RETRYABLE:
                handle = None
            pending.append((batch, handle))
            self.peak_in_flight = max(self.peak_in_flight, len(pending))  # requests, as on the single path
            self.reads += len(batch)
            self.requests += 1
        while pending:
            yield from drain_one()
