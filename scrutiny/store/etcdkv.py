"""etcd requests as scrutiny sends them: etcd's own v3 gRPC API (KV, Lease, Auth) over the project's gRPC
stack, with deadlines, failover between endpoints and retries until the retry deadline.

Ranges are paged at the revision of their first page (one consistent snapshot however many pages);
single keys are read in Txn batches (etcd refuses a Txn of more than `--max-txn-ops`, 128 by default)
with a few in flight. A `Session` is a lease kept alive: what ZooKeeper calls a session, to which
ephemeral keys and the election are bound. Nothing here knows BookKeeper's tree: that is
`scrutiny.store.etcd`. This is the one module that speaks to etcd.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, TypeVar

import grpc

from scrutiny import retry
from scrutiny.channels import channel
from scrutiny.errors import ConfigError, StoreError
from scrutiny.etcd import rpc_pb2 as pb
from scrutiny.etcd import rpc_pb2_grpc as pb_grpc
from scrutiny.store import MetadataStoreUnavailable
from scrutiny.tls import read_credentials, read_secret

log = logging.getLogger(__name__)
KeyValue = pb.KeyValue
MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
TXN_IN_FLIGHT = 8
PAGE_KEYS = 10_000  # keys-only pages
PAGE_VALUES = 1_000  # pages with values (a ledger's metadata is a few hundred bytes)
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
T = TypeVar("T")


def prefix_end(prefix: bytes) -> bytes:
    """The end of the range of every key starting with `prefix` (etcd's `clientv3.GetPrefixRangeEnd`)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


class WatchBatch(NamedTuple):
    events: list[tuple[str, str, int]]  # (created | changed | deleted, key, its revision), in order
    revision: int  # the store's revision when etcd sent it
    compact_revision: int  # not 0: the start revision is gone from etcd's history (the watch is cancelled)
    created: bool  # the watch's first answer: what follows may still replay revisions before `revision`


class EtcdKV:
    """One connection to an etcd cluster: a channel to one endpoint at a time, the next on failure."""

    def __init__(self, endpoints: Iterable[str], *, ca: str = "", cert: str = "", key: str = "",
                 auth_file: str = "", timeout: float = 10.0, retry_deadline: float = 60.0) -> None:
        self.endpoints = [e.strip() for e in endpoints if e.strip()]
        if not self.endpoints:
            raise ConfigError("etcd: no endpoints")
        self.timeout, self.retry_deadline = timeout, retry_deadline
        tls = any(e.startswith("https://") for e in self.endpoints) or bool(ca or cert)
        self._credentials = (grpc.ssl_channel_credentials(
            root_certificates=read_secret(ca, "etcd CA") if ca else None,
            private_key=read_secret(key, "etcd client key") if key else None,
            certificate_chain=read_secret(cert, "etcd client certificate") if cert else None)
            if tls else None)
        self._user = read_credentials(auth_file, "etcd credentials") if auth_file else None
        self._lock = threading.Lock()
        self._current = -1
        self._channel: grpc.Channel | None = None
        self._token: str | None = None
        self.reads = 0
        self._connect()

    # -- connection ----------------------------------------------------------------------------

    def _target(self, endpoint: str) -> str:
        return endpoint.split("://", 1)[-1].rstrip("/")

    def _connect(self, after_failure: bool = False) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._current = (self._current + 1) % len(self.endpoints)
            target = self._target(self.endpoints[self._current])
            options = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
            self._channel = channel(target, self._credentials, options)
            self.kv = pb_grpc.KVStub(self._channel)
            self.lease = pb_grpc.LeaseStub(self._channel)
            self.watcher = pb_grpc.WatchStub(self._channel)
            self.auth = pb_grpc.AuthStub(self._channel)
            self._token = None
        if after_failure:
            log.info("etcd: trying %s", self.endpoints[self._current])

    def _metadata(self) -> list[tuple[str, str]]:
        if self._user is None:
            return []
        if self._token is None:
            got = self.auth.Authenticate(pb.AuthenticateRequest(name=self._user[0], password=self._user[1]),
                                         timeout=self.timeout)
            self._token = got.token
        return [("token", self._token)]

    def call(self, what: str, method: Callable[[Any], Callable[..., T]], request: Any,
             retry_deadline: float | None = None) -> T:
        """`method(stubs)(request)`, retried across unavailability (on the next endpoint) until the retry
        deadline (the connection's, or `retry_deadline`); any other refusal is a StoreError naming `what`."""
        retry_deadline = self.retry_deadline if retry_deadline is None else retry_deadline

        def once() -> T:
            try:
                return method(self)(request, timeout=self.timeout, metadata=self._metadata())
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.UNAUTHENTICATED or self._user is None or self._token is None:
                    raise
                self._token = None  # expired token: authenticate again, at once
                return method(self)(request, timeout=self.timeout, metadata=self._metadata())

        try:
            return retry.Retry(retry.ZOOKEEPER_REQUEST, deadline=retry_deadline).call(
                once, lambda exc: isinstance(exc, grpc.RpcError) and exc.code() in _RETRYABLE,
                lambda exc, delay: self._connect(after_failure=True))
        except grpc.RpcError as exc:
            if exc.code() not in _RETRYABLE:
                raise StoreError(f"etcd refused {what}: {exc.code().name} {exc.details()}") from None
            raise MetadataStoreUnavailable(
                f"etcd unreachable at {', '.join(self.endpoints)} for {retry_deadline:.0f} s "
                f"({what}: {exc.details()})") from None

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    # -- reads ---------------------------------------------------------------------------------

    def get(self, key: bytes) -> KeyValue | None:
        self.reads += 1
        got = self.call(f"a read of {key!r}", lambda s: s.kv.Range, pb.RangeRequest(key=key))
        return got.kvs[0] if got.kvs else None

    def scan(self, key: bytes, end: bytes, *, keys_only: bool = False, page: int = 0) -> Iterator[KeyValue]:
        """Every key in [key, end), ascending, in pages read at one revision."""
        page = page or (PAGE_KEYS if keys_only else PAGE_VALUES)
        revision = 0
        while True:
            self.reads += 1
            got = self.call(f"a range read from {key!r}", lambda s: s.kv.Range,
                            pb.RangeRequest(key=key, range_end=end, limit=page, revision=revision,
                                            keys_only=keys_only))
            revision = revision or got.header.revision
            yield from got.kvs
            if not got.more or not got.kvs:
                return
            key = got.kvs[-1].key + b"\0"

    def scan_prefix(self, prefix: bytes, *, keys_only: bool = False) -> Iterator[KeyValue]:
        return self.scan(prefix, prefix_end(prefix), keys_only=keys_only)

    def first(self, key: bytes, end: bytes, retry_deadline: float | None = None) -> bytes | None:
        """The first key in [key, end), or None."""
        self.reads += 1
        got = self.call(f"a range read from {key!r}", lambda s: s.kv.Range,
                        pb.RangeRequest(key=key, range_end=end, limit=1, keys_only=True), retry_deadline)
        return got.kvs[0].key if got.kvs else None

    def get_many(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, KeyValue | None]]:
        """Each key's value, in order, read in Txn batches with a few in flight."""
        def batches() -> Iterator[list[bytes]]:
            batch: list[bytes] = []
            for k in keys:
                batch.append(k)
                if len(batch) == MAX_TXN_OPS:
                    yield batch
                    batch = []
            if batch:
                yield batch

        requests = ((batch, pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(key=k))
                                                   for k in batch])) for batch in batches())
        for batch, got in self._pipelined(requests, lambda s: s.kv.Txn, "a batch of reads"):
            for k, r in zip(batch, got.responses, strict=True):
                kvs = r.response_range.kvs
                yield k, (kvs[0] if kvs else None)

    def ranges(self, spans: Iterable[tuple[bytes, bytes]]) -> Iterator[KeyValue]:
        """Every key of each [start, end) span, each span whole in one answer (keep them small), a few
        spans in flight."""
        requests = ((span, pb.RangeRequest(key=span[0], range_end=span[1])) for span in spans)
        for _, got in self._pipelined(requests, lambda s: s.kv.Range, "a range read"):
            yield from got.kvs

    def _pipelined(self, requests: Iterable[tuple[T, Any]], method: Callable[[Any], Any],
                   what: str) -> Iterator[tuple[T, Any]]:
        """Each request's answer, in order, with TXN_IN_FLIGHT requests outstanding; one that fails is sent
        again on its own with the retry policy."""
        pending: deque[tuple[T, Any, Any]] = deque()

        def settle() -> tuple[T, Any]:
            tag, request, future = pending.popleft()
            try:
                if future is not None:
                    return tag, future.result()
            except grpc.RpcError:
                pass
            return tag, self.call(what, method, request)

        for tag, request in requests:
            if len(pending) >= TXN_IN_FLIGHT:
                yield settle()
            self.reads += 1
            try:
                future = method(self).future(request, timeout=self.timeout, metadata=self._metadata())
            except grpc.RpcError:  # authentication failed: the retry policy decides
                future = None
            pending.append((tag, request, future))
        while pending:
            yield settle()

    # -- writes --------------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        self.call(f"a write of {key!r}", lambda s: s.kv.Put, pb.PutRequest(key=key, value=value, lease=lease))

    def create(self, key: bytes, value: bytes, lease: int = 0) -> bool:
        """Put `key` only if absent; False if it exists."""
        return self.put_many([(key, value)], only_new=True, lease=lease)

    def put_many(self, items: list[tuple[bytes, bytes]], *, only_new: bool = False, lease: int = 0) -> bool:
        """Several puts in one transaction (at most MAX_TXN_OPS); with `only_new`, none unless every key
        is absent."""
        compare = [pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=k, create_revision=0)
                   for k, _ in items] if only_new else []
        req = pb.TxnRequest(compare=compare, success=[
            pb.RequestOp(request_put=pb.PutRequest(key=k, value=v, lease=lease)) for k, v in items])
        return self.call(f"a transaction of {len(items)} writes", lambda s: s.kv.Txn, req).succeeded

    def create_if_unchanged(self, key: bytes, value: bytes, other: bytes, version: int,
                            created: tuple[bytes, int] | None = None) -> bool | None:
        """Put `key` only if absent, `other` at `version` (etcd's per-key count of writes; 0: absent) and, when
        given, `created`'s key still the one created at that revision: True if put; False if `key` or `other`
        failed; None if `created` did (read back in the same transaction)."""
        compare = [pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=key, create_revision=0),
                   pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.VERSION, key=other, version=version)]
        failure = []
        if created is not None:
            compare.append(pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=created[0],
                                      create_revision=created[1]))
            failure = [pb.RequestOp(request_range=pb.RangeRequest(key=created[0], keys_only=True))]
        req = pb.TxnRequest(compare=compare, success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))],
                            failure=failure)
        got = self.call(f"a conditional write of {key!r}", lambda s: s.kv.Txn, req)
        if got.succeeded:
            return True
        if created is not None:
            held = got.responses[0].response_range.kvs
            if not held or held[0].create_revision != created[1]:
                return None
        return False

    def delete(self, key: bytes, end: bytes = b"") -> int:
        got = self.call(f"a delete of {key!r}", lambda s: s.kv.DeleteRange,
                        pb.DeleteRangeRequest(key=key, range_end=end))
        return got.deleted

    def at_version(self, key: bytes, version: int, value: bytes | None) -> bool:
        """Put `value` (None: delete the key) only if `key` is at `version` (etcd's count of writes)."""
        op = (pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key)) if value is None
              else pb.RequestOp(request_put=pb.PutRequest(key=key, value=value)))
        req = pb.TxnRequest(compare=[pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.VERSION, key=key,
                                                version=version)], success=[op])
        return self.call(f"a conditional write of {key!r}", lambda s: s.kv.Txn, req).succeeded

    # -- leases --------------------------------------------------------------------------------

    def grant(self, ttl: int) -> int:
        got = self.call("a lease grant", lambda s: s.lease.LeaseGrant, pb.LeaseGrantRequest(TTL=ttl))
        if got.error:
            raise StoreError(f"etcd refused a lease: {got.error}")
        return got.ID

    def revision(self) -> int:
        """The store's current revision."""
        got = self.call("a read of the revision", lambda s: s.kv.Range, pb.RangeRequest(key=b"/", limit=1,
                                                                                      keys_only=True))
        return int(got.header.revision)

    def reconnect(self) -> None:
        """The next endpoint (a stream broke on this one)."""
        self._connect(after_failure=True)

    def watch(self, prefix: bytes, start_revision: int, stop: threading.Event) -> Iterator[WatchBatch]:
        """What changed below `prefix` from `start_revision` on, a response at a time, until `stop` or the
        stream fails (grpc.RpcError: the caller resumes from the last revision it saw); a watch etcd
        cancelled for another reason than compaction is a StoreError."""
        create = pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=prefix, range_end=prefix_end(prefix), start_revision=start_revision, progress_notify=True))

        def requests() -> Iterator[Any]:
            yield create
            stop.wait()  # the request side stays open until the watch ends

        call = self.watcher.Watch(requests(), metadata=self._metadata())
        stop_watch = threading.Thread(target=lambda: (stop.wait(), call.cancel()), daemon=True)
        stop_watch.start()
        for resp in call:
            if resp.canceled and not resp.compact_revision:
                raise StoreError(f"etcd cancelled the watch: {resp.cancel_reason}")
            events = [("deleted" if ev.type == pb.Event.DELETE else "created"
                       if ev.kv.create_revision == ev.kv.mod_revision else "changed",
                       ev.kv.key.decode("utf-8", "replace"), ev.kv.mod_revision) for ev in resp.events]
            yield WatchBatch(events, resp.header.revision, resp.compact_revision, resp.created)

    def keep_alive(self, lease: int) -> int:
        """One keep-alive: the lease's remaining TTL (0 or less: it is gone). One attempt, no retry: the
        session decides what a failure means."""
        responses = self.lease.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lease)]), timeout=self.timeout,
                                              metadata=self._metadata())
        for r in responses:
            return r.TTL
        return 0

    def revoke(self, lease: int) -> None:
        try:
            self.lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=lease), timeout=self.timeout, metadata=self._metadata())
        except grpc.RpcError as exc:
            log.info("etcd: lease %x not revoked (%s): it expires on its own", lease, exc.code())


class Session:
    """A lease kept alive every ttl/3 until closed. When a keep-alive finds it gone, or none succeeds
    for a whole TTL, it is lost: the callbacks run, and a new lease is granted for what comes next
    (the ephemeral keys re-created on it, a new election)."""

    def __init__(self, kv: EtcdKV, ttl: int) -> None:
        self.kv, self.ttl = kv, max(2, int(ttl))
        self.lease = kv.grant(self.ttl)
        self._lost: list[Callable[[], None]] = []
        self._renewed: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="etcd-lease", daemon=True)
        self._thread.start()

    def on_lost(self, callback: Callable[[], None]) -> None:
        self._lost.append(callback)

    def on_renewed(self, callback: Callable[[], None]) -> None:
        self._renewed.append(callback)

    def _keep(self) -> None:
        last_ok, fired = time.monotonic(), False
        while not self._stop.wait(self.ttl / 3):
            try:
                alive = self.kv.keep_alive(self.lease) > 0
                if alive:
                    last_ok = time.monotonic()
            except grpc.RpcError as exc:
                alive = time.monotonic() - last_ok < self.ttl
                log.info("etcd: lease keep-alive failed (%s)", exc.code())
            if alive or self._stop.is_set():
                continue
            if not fired:
                log.warning("etcd: lease %x lost", self.lease)
                fired = True
                for callback in self._lost:
                    callback()
            try:
                self.lease = self.kv.grant(self.ttl)
            except StoreError as exc:
                log.warning("etcd: no new lease yet (%s)", exc)
                continue
            last_ok, fired = time.monotonic(), False
            for callback in self._renewed:
                callback()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.kv.timeout + 1)
        self.kv.revoke(self.lease)
