"""The scan's client of the bookie agents: which entries does each bookie hold of each ledger?

Every (bookie, ledger) question gets exactly one outcome: the entries, no such ledger, unavailable
(timeout, refused, I/O error: copies unknown, not missing) or invalid (an answer that cannot be
decoded). BP-34 asks the check to be light on bookies: calls per bookie are bounded, and many ledgers
travel in one streaming call.
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent import futures
from typing import Any, NamedTuple

import grpc
import grpc.experimental
import numpy as np
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scrutiny import retry
from scrutiny.channels import TO_AGENT, channel
from scrutiny.checks import NO_LEDGER, BookieAnswer, BookieAnswers, Outcome, listed
from scrutiny.config import DEFAULT_AGENT_PORT, ScanSettings
from scrutiny.listedcolumns import Listed, among, read_listed
from scrutiny.streamloop import StreamLoop
from scrutiny.tls import channel_credentials
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc

log = logging.getLogger(__name__)

_TRANSIENT = (grpc.StatusCode.UNAVAILABLE,)
HEALTH_CHECK_SECONDS = 2.0  # after a call timed out: is the agent there at all?
STREAMING_ASKED_AGAIN_SECONDS = 600.0  # an agent that had no streaming call is asked for it again after this
LOOP_SLACK_SECONDS = 30.0  # calls on the loop over within their deadline and this, or the loop is stuck


class Held(NamedTuple):
    """What a bookie holds of one ledger: its entries, and the bytes stored for them where known."""

    entries: int
    stored_bytes: int | None

    def to_json(self) -> dict[str, int]:
        """As a finding's details give it: `bytes` only where known."""
        return {"entries": self.entries} | ({"bytes": self.stored_bytes} if self.stored_bytes is not None else {})


# EUNKNOWNLEDGERSTATE: a limbo ledger (BP-46); what it lists is held, the rest is unknown.
_LISTS_ENTRIES = {bookie_pb2.EOK: Outcome.ENTRIES, bookie_pb2.EUNKNOWNLEDGERSTATE: Outcome.LIMBO}


def interpret(bookie_id: str, msg: Any) -> BookieAnswer:
    """One GetListOfEntriesOfALedgerResponse as an outcome."""
    outcome = _LISTS_ENTRIES.get(msg.status)
    if outcome is not None:
        return listed(outcome, bookie_id, msg.ledger_id, msg.availability_of_entries_of_ledger)
    if msg.status == bookie_pb2.ENOLEDGER:
        return NO_LEDGER
    try:
        name = bookie_pb2.StatusCode.Name(msg.status)
    except ValueError:
        name = f"status {msg.status}"
    return BookieAnswer(Outcome.UNAVAILABLE, reason=f"{name}: {msg.message}".rstrip(": "))


def take(bookie_id: str, lid: int, msg: Any, got: BookieAnswers) -> None:
    """The answer about ledger `lid` into `got` (the first one counts); a list of entries as encoded."""
    if lid not in got:
        if msg.status == bookie_pb2.EOK:
            got.encoded[lid] = msg.availability_of_entries_of_ledger
        else:
            got.other[lid] = interpret(bookie_id, msg)


def take_listed(bookie_id: str, listed: Listed, asked: np.ndarray, got: BookieAnswers) -> str:
    """The answers of one message's columns about ledgers `asked` (ascending) into `got` (the first one counts, as
    `take`'s); the problem, when the columns do not line up: the ledgers they name are then INVALID."""
    ids = listed.ledger_ids
    keep = among(ids, asked)
    if got.encoded or got.other:
        keep &= ~np.isin(ids, np.fromiter(itertools.chain(got.encoded, got.other), np.int64))
    if listed.problem:
        invalid(bookie_id, listed.problem, (i for i in ids[keep].tolist() if i not in got), got)
        return listed.problem
    if keep.any():  # of a ledger answered twice, `joined` keeps the first columns' answer
        got.add_listed(listed if keep.all() else listed.only(keep))
    return ""


def invalid(bookie_id: str, problem: str, ledger_ids: Iterable[int], got: BookieAnswers) -> None:
    """The ledgers of columns that do not line up: INVALID answers that name the problem."""
    bad = BookieAnswer(Outcome.INVALID, reason=f"bookie {bookie_id}: {problem}")
    got.other.update((i, bad) for i in ledger_ids)


class Reading:
    """One streaming call's messages about `ids` into `got`, as they come."""

    def __init__(self, bookie_id: str, ids: list[int], got: BookieAnswers) -> None:
        self.bookie_id, self.ids, self.got = bookie_id, ids, got
        self.asked, self.asked_ids = set(ids), np.asarray(ids, np.int64)
        self.problem = ""

    def request(self) -> Any:
        """The call that asks for these answers (as columns, where the agent knows how)."""
        return bookie_pb2.GetListOfEntriesOfLedgersRequest(ledger_ids=self.ids, listed_as_columns=True)

    def take(self, msg: Any) -> None:
        for ans in msg.ledgers:
            if ans.ledger_id in self.asked:
                take(self.bookie_id, ans.ledger_id, ans, self.got)
        if msg.HasField("listed"):
            problem = take_listed(self.bookie_id, read_listed(msg.listed), self.asked_ids, self.got)
            self.problem = problem or self.problem

    def end(self) -> None:
        if self.problem:  # columns whose ledgers could not be told: every ledger still unanswered may be among them
            invalid(self.bookie_id, self.problem, self.got.unanswered(self.ids), self.got)


First = Callable[[BookieAnswers], None]  # a first attempt made already: its answers into these, its failure raised


def _replay(answers: BookieAnswers, failure: Exception | None, got: BookieAnswers) -> None:
    got.merge(answers)
    if failure is not None:
        raise failure


class EndpointResolver:
    """Where a bookie's agent listens: an explicit address, else the agent's own registration,
    else the configured default port on the bookie's host."""

    def __init__(self, explicit: Mapping[str, str] | None = None, registered: Mapping[str, str] | None = None,
                 default_port: int = DEFAULT_AGENT_PORT) -> None:
        self.explicit = dict(explicit or {})
        self.registered = dict(registered or {})
        self.default_port = default_port

    def address(self, bookie_id: str) -> str:
        if bookie_id in self.explicit:
            return self.explicit[bookie_id]
        if bookie_id in self.registered:
            return self.registered[bookie_id]
        host = bookie_id.rsplit(":", 1)[0] if ":" in bookie_id else bookie_id
        return f"{host}:{self.default_port}"


class BookieClient:
    def __init__(self, resolver: EndpointResolver, deadline: float = 30.0, ledgers_per_call: int = 1000,
                 max_calls_per_bookie: int = 2, retries: int = 2, backoff: retry.Backoff = retry.BOOKIE_CALL,
                 streaming: bool = True,
                 unary_in_flight: int = 16, max_message_bytes: int = 64 * 1024 * 1024,
                 credentials: grpc.ChannelCredentials | None = None, parallelism: int = 8,
                 deep_ledgers_per_call: int = 20, deep_deadline: float = 900.0,
                 streaming_asked_again: float = STREAMING_ASKED_AGAIN_SECONDS) -> None:
        self.resolver = resolver
        self.deadline = deadline
        self.ledgers_per_call = ledgers_per_call
        self.max_calls_per_bookie = max_calls_per_bookie
        self.retries = retries
        self.backoff = backoff
        self.streaming = streaming
        self.unary_in_flight = unary_in_flight
        self.max_message_bytes = max_message_bytes
        self.credentials = credentials
        self.deep_ledgers_per_call = deep_ledgers_per_call
        self.deep_deadline = deep_deadline
        self.failed_calls = 0  # calls that ended in an error, for the run's statistics
        self._channels: dict[str, grpc.Channel] = {}  # by address: each run's view says which address a bookie has
        # agent address -> when it answered that it has no streaming call (monotonic): asked again after a while,
        # and at once at a new address (an agent upgraded, or moved), so one answer never holds for good
        self._unary_only: dict[str, float] = {}
        self.streaming_asked_again = streaming_asked_again
        self._per_bookie: dict[str, threading.Semaphore] = {}
        self._lock = threading.Lock()
        self._pool = futures.ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="bookie-call")
        # the loop's calls are small (a look's): no bandwidth probe's ping after each answer
        self._loop = StreamLoop(credentials, [("grpc.max_receive_message_length", max_message_bytes),
                                              ("grpc.enable_retries", 0), ("grpc.http2.bdp_probe", 0), *TO_AGENT])

    @classmethod
    def from_settings(cls, s: ScanSettings, registered: Mapping[str, str]) -> BookieClient:
        """The one way a scan's client of the agents is made from settings."""
        return cls(EndpointResolver(s.bookie_endpoints, registered, default_port=s.agent_default_port),
                   deadline=s.bookie_deadline_seconds, ledgers_per_call=s.bookie_ledgers_per_call,
                   max_calls_per_bookie=s.bookie_calls_per_bookie, streaming=s.bookie_streaming,
                   max_message_bytes=s.bookie_max_message_bytes,
                   credentials=channel_credentials(s.bookie_tls_ca, s.bookie_tls_cert, s.bookie_tls_key),
                   deep_ledgers_per_call=s.deep_ledgers_per_call, deep_deadline=s.deep_deadline_seconds)

    # -- channels --------------------------------------------------------------------------------

    def _stub(self, bookie_id: str) -> bookie_pb2_grpc.BookieStub:
        return bookie_pb2_grpc.BookieStub(self._channel(bookie_id))

    def _channel(self, bookie_id: str) -> grpc.Channel:
        address = self.resolver.address(bookie_id)
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                # each call's answers are read on the thread that made it: without a thread of gRPC's per call
                # (`bench.continuous_batch`: a continuous look's calls took half their CPU in those threads)
                options = [("grpc.max_receive_message_length", self.max_message_bytes),
                           ("grpc.enable_retries", 0), (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
                           *TO_AGENT]
                ch = self._channels[address] = channel(address, self.credentials, options)
            return ch

    def forget(self, bookie_id: str) -> None:
        """Close the channel to this bookie's agent (as this view resolves it): the next call connects anew."""
        with self._lock:
            ch = self._channels.pop(self.resolver.address(bookie_id), None)
        if ch is not None:
            ch.close()
        self._loop.forget(self.resolver.address(bookie_id))

    def view(self, registered: Mapping[str, str]) -> BookieClient:
        """This client as one run sees the agents' registrations (its own reading of them): the channels, the
        calls' threads and their limits are shared; where each bookie's agent is, and the failed calls counted,
        are the run's. Runs at once with different readings (continuous mode's lanes, a run's re-check with
        fresher facts) never call an agent at an address another run's reading put there."""
        mine = copy.copy(self)
        mine.resolver = EndpointResolver(self.resolver.explicit, registered, self.resolver.default_port)
        mine.failed_calls = 0
        return mine

    def _slot(self, bookie_id: str) -> threading.Semaphore:
        with self._lock:
            return self._per_bookie.setdefault(bookie_id, threading.Semaphore(self.max_calls_per_bookie))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._loop.close()
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()

    def __enter__(self) -> BookieClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- fetching ---------------------------------------------------------------------------------

    def fetch_many(self, wanted: Mapping[str, Collection[int]], deadline: float = 0.0) -> dict[str, BookieAnswers]:
        """Ask every bookie about its ledgers, bookies in parallel, calls per bookie bounded; each call
        within `deadline` seconds (0: the client's own)."""
        deadline, most = deadline or self.deadline, self.ledgers_per_call
        asks = {b: sorted(set(ids)) for b, ids in wanted.items()}
        out = {b: BookieAnswers(b) for b in wanted}
        # A small fetch (a continuous look): one call a bookie, all read on one loop; what one of them ended with,
        # a failure included, is its first attempt below, the rest asked as ever
        firsts = self._together(asks, deadline) if sum(map(len, asks.values())) <= most else {}
        again = {b: made for b, (made, failure) in firsts.items() if failure is not None}
        tasks = [(b, self._pool.submit(self._fetch_chunk, b, ids[i:i + most], deadline, again.get(b)))
                 for b, ids in asks.items() if b not in firsts or b in again for i in range(0, len(ids), most)]
        for b, (made, failure) in firsts.items():
            if failure is None:  # read whole: nothing to ask again, only what it did not answer for to tell
                out[b].merge(self._ask_chunk(b, asks[b], deadline, made))
        for b, fut in tasks:
            out[b].merge(fut.result())
        return out

    def _together(self, asks: Mapping[str, list[int]], deadline: float) -> dict[str, tuple[First, Exception | None]]:
        """One streaming call to each bookie that streams and has a call free, at once on the loop; each bookie's
        first attempt (its answers, and how the call ended)."""
        slots = {b: self._slot(b) for b, ids in asks.items() if ids and self._streams(b)}
        slots = {b: slot for b, slot in slots.items() if slot.acquire(blocking=False)}
        if not slots:
            return {}
        got = {b: BookieAnswers(b) for b in slots}
        try:
            ended = self._loop.read_all({b: (self.resolver.address(b), functools.partial(
                self._read_aio, b, asks[b], got[b], deadline)) for b in slots}, deadline + LOOP_SLACK_SECONDS)
        finally:
            for slot in slots.values():
                slot.release()
        return {b: (functools.partial(_replay, got[b], exc), exc) for b, exc in ended.items()}

    async def _read_aio(self, bookie_id: str, ids: list[int], got: BookieAnswers, deadline: float,
                        channel: aio.Channel) -> None:
        reading = Reading(bookie_id, ids, got)
        async for msg in bookie_pb2_grpc.BookieStub(channel).GetListOfEntriesOfLedgers(reading.request(),
                                                                                       timeout=deadline):
            reading.take(msg)
        reading.end()

    def fetch(self, bookie_id: str, ledger_ids: Iterable[int]) -> BookieAnswers:
        return self.fetch_many({bookie_id: list(ledger_ids)})[bookie_id]

    def _fetch_chunk(self, bookie_id: str, ids: list[int], deadline: float, first: First | None = None
                     ) -> BookieAnswers:
        with self._slot(bookie_id):
            return self._ask_chunk(bookie_id, ids, deadline, first)

    def _ask_chunk(self, bookie_id: str, ids: list[int], deadline: float, first: First | None = None
                   ) -> BookieAnswers:
        """`ids`' answers, retried as `_retried` says; `first`: the first attempt, made already (`_together`)."""
        got = BookieAnswers(bookie_id)

        def ask() -> None:
            nonlocal first
            remaining = got.unanswered(ids)
            if not remaining:
                return
            streams = first is not None or self._streams(bookie_id)
            try:
                if first is not None:
                    made, first = first, None
                    made(got)
                elif streams:
                    self._stream(bookie_id, remaining, got, deadline)
                else:
                    self._unary(bookie_id, remaining, got, deadline)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED and streams:
                    log.info("bookie %s: its agent has no streaming call: unary calls", bookie_id)
                    with self._lock:
                        self._unary_only[self.resolver.address(bookie_id)] = time.monotonic()
                    self.failed_calls += 1
                    return ask()
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (exc.details() or ""):
                    self.failed_calls += 1
                    return self._one_by_one(bookie_id, got.unanswered(remaining), got, deadline)
                raise
            ended = BookieAnswer(Outcome.UNAVAILABLE, reason="the agent's stream ended without it")
            got.other.update((i, ended) for i in got.unanswered(remaining))

        reason = self._retried(ask)
        unanswered = got.unanswered(ids)
        if unanswered:
            silent = BookieAnswer(Outcome.UNAVAILABLE, reason=f"bookie {bookie_id}: {reason}")
            got.other.update(dict.fromkeys(unanswered, silent))
        self._tell_slow_from_down(bookie_id, got, deadline)
        return got

    def _streams(self, bookie_id: str) -> bool:
        """Whether to ask this bookie's agent in one streaming call: unless it answered, at its address and not
        long ago, that it has none."""
        if not self.streaming:
            return False
        address = self.resolver.address(bookie_id)
        with self._lock:
            since = self._unary_only.get(address)
            if since is not None and time.monotonic() - since >= self.streaming_asked_again:
                del self._unary_only[address]
                since = None
        return since is None

    def _tell_slow_from_down(self, bookie_id: str, got: BookieAnswers, deadline: float) -> None:
        """A call that ran out of time at an agent that answers its health check: the agent is up and
        overloaded, not down. Its copies are unknown all the same; the operator's remedy differs."""
        timed_out = [i for i, a in got.other.items() if a.outcome is Outcome.UNAVAILABLE
                     and "DEADLINE_EXCEEDED" in a.reason]
        if not timed_out or not self._serving(bookie_id):
            return
        for i in timed_out:
            a = got.other[i]
            got.other[i] = a._replace(slow=True, reason=f"{a.reason} (slow: the agent answers its health check, "
                                                        f"not this call within {deadline:g} s)")

    def _serving(self, bookie_id: str) -> bool:
        health = health_pb2_grpc.HealthStub(self._channel(bookie_id))  # the call that timed out: maybe the loop's
        try:
            got = health.Check(health_pb2.HealthCheckRequest(), timeout=HEALTH_CHECK_SECONDS)
        except grpc.RpcError:
            return False
        return bool(got.status == health_pb2.HealthCheckResponse.SERVING)

    def _stream(self, bookie_id: str, ids: list[int], got: BookieAnswers, deadline: float) -> None:
        reading = Reading(bookie_id, ids, got)
        for msg in self._stub(bookie_id).GetListOfEntriesOfLedgers(reading.request(), timeout=deadline):
            reading.take(msg)
        reading.end()

    def _unary(self, bookie_id: str, ids: list[int], got: BookieAnswers, deadline: float) -> None:
        """One call per ledger, as upstream's auditor does, a bounded number in flight."""
        stub = self._stub(bookie_id)
        pending: list[tuple[int, Any]] = []
        failure: grpc.RpcError | None = None

        def settle(lid: int, fut: Any) -> None:
            nonlocal failure
            try:
                take(bookie_id, lid, fut.result(), got)
            except grpc.RpcError as exc:
                if exc.code() in _TRANSIENT:
                    failure = exc
                else:
                    got.other[lid] = BookieAnswer(Outcome.UNAVAILABLE, reason=f"{exc.code().name}: {exc.details()}")

        for lid in ids:
            if len(pending) >= self.unary_in_flight:
                settle(*pending.pop(0))
            req = bookie_pb2.GetListOfEntriesOfALedgerRequest(ledger_id=lid)
            pending.append((lid, stub.GetListOfEntriesOfALedger.future(req, timeout=deadline)))
        for lid, fut in pending:
            settle(lid, fut)
        if failure is not None:
            raise failure

    def _one_by_one(self, bookie_id: str, ids: list[int], got: BookieAnswers, deadline: float) -> None:
        """After a message too large for the limit: find which ledgers' answers are too large."""
        stub = self._stub(bookie_id)
        for lid in ids:
            try:
                msg = stub.GetListOfEntriesOfALedger(bookie_pb2.GetListOfEntriesOfALedgerRequest(ledger_id=lid),
                                                     timeout=deadline)
                take(bookie_id, lid, msg, got)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    got.other[lid] = BookieAnswer(Outcome.INVALID, reason=(
                        f"bookie {bookie_id}, ledger {lid}: answer larger than {self.max_message_bytes} bytes"))
                else:
                    got.other[lid] = BookieAnswer(Outcome.UNAVAILABLE, reason=f"{exc.code().name}: {exc.details()}")

    def _retried(self, call: Callable[[], None]) -> str:
        """`call` again after a transient failure, at most `retries` times: "" once it succeeds, else why not.
        Each failure counts in `failed_calls`."""
        def counted() -> None:
            try:
                call()
            except grpc.RpcError:
                self.failed_calls += 1
                raise

        try:
            retry.Retry(self.backoff, tries=self.retries + 1).call(
                counted, lambda exc: isinstance(exc, grpc.RpcError) and exc.code() in _TRANSIENT)
            return ""
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"

class HoldingsClient:
    """The reverse check's calls (what each bookie holds, beyond what the metadata says), on a
    BookieClient's channels, per-bookie bounds and retries."""

    def __init__(self, client: BookieClient) -> None:
        self.client = client

    def list_many(self, bookie_ids: Iterable[str], keep: Callable[[np.ndarray], np.ndarray] = lambda ids: ids,
                  page: int = 0) -> dict[str, np.ndarray | str]:
        """What `keep` keeps of every ledger each bookie holds (ascending ids), bookies in parallel; or why
        it could not be listed. `keep` runs on each page as it arrives (`page` ids, 0: the agent's own page):
        a caller wanting a few of millions of ids holds a page per bookie in flight, never whole lists."""
        tasks = {b: self.client._pool.submit(self._list, b, page, keep) for b in sorted(set(bookie_ids))}
        return {b: fut.result() for b, fut in tasks.items()}

    def _list(self, bookie_id: str, page: int, keep: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | str:
        kept: list[np.ndarray] = []
        start, done = 0, False

        def next_page() -> None:  # from the last id listed on; a retry asks for the same page again
            nonlocal start, done
            req = bookie_pb2.ListLedgersRequest(from_ledger_id=start, max_ledgers=page)
            msgs = list(self.client._stub(bookie_id).ListLedgers(req, timeout=self.client.deadline))
            data = b"".join(m.ledger_ids for m in msgs)
            ids = np.frombuffer(data[:len(data) // 8 * 8], dtype=">i8").astype(np.int64)
            if len(data) % 8 or (ids.size and (ids[0] < start or np.any(ids[1:] <= ids[:-1]))):
                raise ValueError(f"bookie {bookie_id}: not ascending 8-byte ledger ids from {start}")
            kept.append(keep(ids))
            done = any(m.last_page for m in msgs) or not ids.size
            start = int(ids[-1]) + 1 if ids.size else start

        with self.client._slot(bookie_id):
            while not done:
                try:
                    failed = self.client._retried(next_page)
                except ValueError as exc:
                    return str(exc)
                if failed:
                    return f"bookie {bookie_id}: {failed}"
        return np.concatenate(kept) if kept else np.empty(0, np.int64)

    def held(self, bookie_id: str, ledger_ids: Collection[int]) -> dict[int, Held | None]:
        """What the bookie holds of these ledgers now (entries, and stored bytes where its agent knows
        them), None for a ledger it does not hold; a ledger it did not answer for is left out (unknown)."""
        out: dict[int, Held | None] = {}

        def ask() -> None:
            req = bookie_pb2.GetListOfEntriesOfLedgersRequest(ledger_ids=sorted(set(ledger_ids) - out.keys()),
                                                              with_stored_bytes=True)
            for msg in self.client._stub(bookie_id).GetListOfEntriesOfLedgers(req, timeout=self.client.deadline):
                for ans in msg.ledgers:
                    answer = interpret(bookie_id, ans)
                    if answer.outcome is Outcome.NO_LEDGER:
                        out[ans.ledger_id] = None
                    elif answer.availability is not None:
                        out[ans.ledger_id] = Held(answer.availability.count, ans.stored_bytes
                                                  if ans.HasField("stored_bytes") else None)

        with self.client._slot(bookie_id):
            self.client._retried(ask)
        return out
