"""The bookie agent: serves scrutiny.v1.Bookie next to one bookie, from one entry source."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scrutiny import codec
from scrutiny.changefeed import Change, ChangeFeed, Event
from scrutiny.config import DEFAULT_AGENT_PORT
from scrutiny.entrysources import EntrySource, Holding, SourceError
from scrutiny.prometheus import PREFIX, MetricsEndpoint
from scrutiny.store import MetadataStore, Registration
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_AGENT_PORT", "AgentStopping", "BookieAgent", "BookieServicer"]
MAX_LEDGERS_PER_CALL = 100_000
UNARY_CATCH_UP_SECONDS = 0.2  # BP-34's one-ledger call catches up with the bookie at most this often
LIST_PAGE = 250_000  # ledger ids per ListLedgers call when the caller names no page size
MAX_LIST_PAGE = 1_000_000
IDS_PER_MESSAGE = 65_536  # 512 KiB of ledger ids per ListLedgers message
# Answers per stream message, and about how many bytes: a message costs the scan a fixed ~150 us on
# top of its answers, and a large answer (a fragmented ledger) must not swell a message past the limit.
ANSWERS_PER_MESSAGE = 1000
MESSAGE_BYTES = 1 << 20
SERVICE_NAME = "scrutiny.v1.Bookie"
# A WatchHoldings stream says it is alive at least this often. A host gone without a word is told by the
# reader's HTTP/2 keepalive pings (answered by gRPC's core, never waking Python); the heartbeat is for an
# agent whose process hangs, and each one costs the reader a wake-up: seldom.
HEARTBEAT_SECONDS = 300.0
KEEPALIVE_PINGS_AT_MOST_EVERY_MS = 10_000  # the readers ping every 30 s (scrutiny.auditor.feeds)
WATCH_INTERVAL_SECONDS = 5.0  # the agent looks at its bookie for changes this often (0: never)
# ... its `ledgers` index from its start and while a reader follows its feed, and this long after the last
# one left: a leader's hand-over (a new election, an auditor restarted) resumes the feed without a gap, and
# an agent nobody follows (continuous mode off) then watches only its entry logs, which its answers need.
WATCH_LINGER_SECONDS = 900.0
GIVE_UP_AFTER_GRACE = 3.0  # seconds past the stop's grace after which the process ends regardless

Answer = bookie_pb2.GetListOfEntriesOfALedgerResponse


def in_messages(answers: Iterable[Any], size_of: Callable[[Any], int], most: int) -> Iterator[list[Any]]:
    """Answers cut into stream messages of at most `most` answers and about MESSAGE_BYTES."""
    batch: list[Any] = []
    size = 0
    for a in answers:
        batch.append(a)
        size += size_of(a)
        if size >= MESSAGE_BYTES or len(batch) >= most:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class AgentStopping(BaseException):
    """Ends a call that the agent's stop caught waiting for its budget or between two messages. A
    BaseException, as GeneratorExit is: the handlers keep `except Exception` so that one bad ledger
    never ends a stream, and a stop must not be taken for one bad ledger."""


class Calls:
    """The calls in flight, so that a stop knows when no call still uses the source."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self.running = 0

    def __enter__(self) -> None:
        with self._idle:
            self.running += 1

    def __exit__(self, *exc: object) -> None:
        with self._idle:
            self.running -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self.running == 0, timeout)


def stoppable(method: Callable[..., Any]) -> Callable[..., Any]:
    """A servicer method counted in flight, and ended as UNAVAILABLE (a scan treats the bookie as
    silent and looks again later) when the agent stops under it."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def streaming(self: BookieServicer, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with self.calls:
                try:
                    yield from method(self, request, context)
                except AgentStopping:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the bookie agent is stopping")
        return streaming

    @functools.wraps(method)
    def unary(self: BookieServicer, request: Any, context: grpc.ServicerContext) -> Any:
        with self.calls:
            try:
                return method(self, request, context)
            except AgentStopping:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the bookie agent is stopping")
    return unary


def answer_of(ledger_id: int, held: Holding | None) -> Any:
    if held is None:
        return Answer(status=bookie_pb2.ENOLEDGER, ledger_id=ledger_id)
    # A limbo ledger: the entries listed are held; the bookie itself cannot tell about the others.
    return Answer(status=bookie_pb2.EUNKNOWNLEDGERSTATE if held.limbo else bookie_pb2.EOK, ledger_id=ledger_id,
                  availability_of_entries_of_ledger=held.availability)


class Rate:
    """A shared rate limit, in bytes read or entries listed (HDFS's block scanner and Ceph's scrub sleep
    do the same): a caller that got ahead of the rate sleeps until the rate has caught up with it.
    A rate of 0 is no limit."""

    def __init__(self, per_second: float, clock: Any = time.monotonic, sleep: Any = time.sleep) -> None:
        self.rate = per_second
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._free_at = clock()  # when what was taken so far will have been paid for

    def take(self, n: int) -> float:
        """Take `n` units; the seconds slept for them."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            self._free_at = max(self._free_at, now - 0.1) + n / self.rate  # at most 0.1 s of credit
            wait = self._free_at - now
        if wait > 0:
            self.sleep(wait)
        return max(wait, 0.0)


class AgentMetrics:
    """What an agent exports on /metrics: requests, answers by status, catch-up time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(f"{PREFIX}agent_requests", "calls served", ["method"], registry=self.registry)
        self.answers = Counter(f"{PREFIX}agent_answers", "ledger answers by status", ["status"],
                               registry=self.registry)
        self.verified_bytes = Counter(f"{PREFIX}agent_deep_read_bytes", "entry-log bytes read by deep scrubs",
                                      registry=self.registry)
        self.corrupt = Counter(f"{PREFIX}agent_deep_corrupt_entries", "entries whose stored bytes failed, by reason",
                               ["reason"], registry=self.registry)
        self.catch_up = Histogram(f"{PREFIX}agent_catch_up_seconds", "catching up with the bookie, per request",
                                  registry=self.registry, buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .5))
        self.entries = Counter(f"{PREFIX}agent_entries_listed", "entries (and ledgers) read from the index to answer",
                               registry=self.registry)
        self.throttled = Counter(f"{PREFIX}agent_throttled_seconds", "time answers waited for the CPU budget "
                                 "(entries_per_second)", registry=self.registry)
        self.changes = Counter(f"{PREFIX}agent_changes", "changes seen in what the bookie holds, by kind",
                               ["kind"], registry=self.registry)
        self.watch = Histogram(f"{PREFIX}agent_watch_seconds", "one look at the bookie for changes (catch-up "
                               "included)", registry=self.registry, buckets=(.001, .005, .01, .05, .1, .5, 1, 5))
        self.watching = Gauge(f"{PREFIX}agent_watching", "1 while the agent watches its ledgers index for changes "
                              "(a reader follows its feed, or left less than the linger ago)", registry=self.registry)
        self.budget = Gauge(f"{PREFIX}agent_entries_per_second_limit", "the CPU budget: entries listed per second, "
                            "all calls together (0: none)", registry=self.registry)


class BookieServicer(bookie_pb2_grpc.BookieServicer):
    def __init__(self, source: EntrySource, max_ledgers_per_call: int = MAX_LEDGERS_PER_CALL,
                 answers_per_message: int = ANSWERS_PER_MESSAGE, metrics: AgentMetrics | None = None,
                 deep_rate: Rate | None = None, accepts_passwords: bool = False, entry_rate: Rate | None = None,
                 unary_catch_up_seconds: float = UNARY_CATCH_UP_SECONDS,
                 watch_linger_seconds: float = WATCH_LINGER_SECONDS) -> None:
        self.source = source
        self.max_ledgers_per_call = max_ledgers_per_call
        self.answers_per_message = answers_per_message
        self.metrics = metrics or AgentMetrics()
        self.deep_rate = deep_rate or Rate(32 * 1024 * 1024)
        self.entry_rate = entry_rate or Rate(0)
        self.stopping = threading.Event()
        self.calls = Calls()
        self.feed = ChangeFeed()
        self.watch_linger = watch_linger_seconds
        self._watching = False
        self._followers = 0
        # monotonic: when the last reader left. An agent starts as if one just had: it watches from its start,
        # and a leader that follows it within the linger (after the agent's restart, say) gets every change
        self._left_at = time.monotonic()
        self._watch_lock = threading.Lock()  # one look at a time; readers come and go between looks
        for rate in (self.deep_rate, self.entry_rate):
            rate.sleep = self.pause
        self.metrics.budget.set(self.entry_rate.rate)
        self.accepts_passwords = accepts_passwords  # HMAC keys travel only over TLS
        self.unary_catch_up_seconds = unary_catch_up_seconds
        self._caught_up_at = -float("inf")  # monotonic

    def pause(self, seconds: float) -> None:
        """A throttled call's wait, cut short by the agent's stop."""
        if self.stopping.wait(seconds):
            raise AgentStopping

    def going(self, context: grpc.ServicerContext) -> bool:
        """Whether a stream should send its next message: its caller is there and the agent not stopping."""
        if self.stopping.is_set():
            raise AgentStopping
        return bool(context.is_active())

    def refresh(self, method: str, unary: bool = False) -> str:
        """Catch up with the bookie once per request, and for BP-34's one-ledger call at most every
        `unary_catch_up_seconds` (a catch-up costs about a millisecond of CPU, as much as thousands of
        entries); the reason when that failed (every answer EIO)."""
        self.metrics.requests.labels(method).inc()
        if unary and time.monotonic() - self._caught_up_at < self.unary_catch_up_seconds:
            return ""
        try:
            with self.metrics.catch_up.time():
                self.source.refresh()
        except SourceError as exc:
            return str(exc)
        self._caught_up_at = time.monotonic()
        return ""

    def spend(self, entries: int) -> None:
        """The CPU budget: `entries` read from the index, paid for (slept for) at entries_per_second."""
        self.metrics.entries.inc(entries)
        waited = self.entry_rate.take(entries)
        if waited:
            self.metrics.throttled.inc(waited)

    def answer(self, ledger_id: int, failed: str = "") -> Any:
        msg = self._answer(ledger_id, failed)
        self.metrics.answers.labels(bookie_pb2.StatusCode.Name(msg.status)).inc()
        return msg

    def _answer(self, ledger_id: int, failed: str) -> Any:
        if failed:
            return Answer(status=bookie_pb2.EIO, ledger_id=ledger_id, message=failed)
        try:
            held = self.source.availability(ledger_id)
        except SourceError as exc:
            return Answer(status=bookie_pb2.EIO, ledger_id=ledger_id, message=str(exc))
        except Exception as exc:  # a source bug must not kill the stream for every other ledger
            log.exception("source failed on ledger %d", ledger_id)
            return Answer(status=bookie_pb2.EIO, ledger_id=ledger_id, message=f"{type(exc).__name__}: {exc}")
        if held is not None:
            self.spend(held.entries)
        return answer_of(ledger_id, held)

    @stoppable
    def GetListOfEntriesOfALedger(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.ledger_id < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ledger_id {request.ledger_id} is negative")
        return self.answer(request.ledger_id, self.refresh("GetListOfEntriesOfALedger", unary=True))

    @stoppable
    def GetListOfEntriesOfLedgers(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        ids = list(dict.fromkeys(request.ledger_ids))  # one answer per ledger, asked once or twice
        if len(ids) > self.max_ledgers_per_call:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(ids)} ledger ids in one call; at most {self.max_ledgers_per_call}")
        negative = next((i for i in ids if i < 0), None)
        if negative is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ledger_id {negative} is negative")
        failed = self.refresh("GetListOfEntriesOfLedgers")
        sizes = getattr(self.source, "stored_bytes", None) if request.with_stored_bytes else None
        for i in range(0, len(ids), self.answers_per_message):
            if not self.going(context):
                return
            answers = self.answers(ids[i:i + self.answers_per_message], failed)
            if sizes is not None:
                self._add_stored_bytes(sizes, answers)
            for batch in in_messages(answers, lambda a: len(a.availability_of_entries_of_ledger) + 16,
                                     self.answers_per_message):
                yield bookie_pb2.GetListOfEntriesOfLedgersResponse(ledgers=batch)

    def _add_stored_bytes(self, sizes: Callable[..., int | None], answers: list[Any]) -> None:
        """The bytes stored for each ledger that lists entries, read at the deep scrub's rate."""
        for a in answers:
            if a.status not in (bookie_pb2.EOK, bookie_pb2.EUNKNOWNLEDGERSTATE):
                continue
            try:
                n = sizes(a.ledger_id, throttle=self.deep_rate.take)
            except Exception:  # unknown, not an error: the answer itself stands
                log.exception("stored bytes of ledger %d", a.ledger_id)
                n = None
            if n is not None:
                a.stored_bytes = n

    @stoppable
    def ListLedgers(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        lister = getattr(self.source, "list_ledgers", None)
        if lister is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          f"a {type(self.source).__name__} cannot list the bookie's ledgers")
            return
        if request.from_ledger_id < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"from_ledger_id {request.from_ledger_id} is negative")
        if not 0 <= request.max_ledgers <= MAX_LIST_PAGE:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"max_ledgers {request.max_ledgers}: 0 (the agent's page, {LIST_PAGE}) .. {MAX_LIST_PAGE}")
        failed = self.refresh("ListLedgers")
        if failed:
            context.abort(grpc.StatusCode.UNAVAILABLE, failed)
        try:
            ids, complete = lister(request.from_ledger_id, request.max_ledgers or LIST_PAGE)
        except SourceError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        self.spend(len(ids))  # a key read per ledger listed
        packed = np.asarray(ids, dtype=">i8").tobytes()
        step = 8 * IDS_PER_MESSAGE
        for i in range(0, max(len(packed), 1), step):
            yield bookie_pb2.ListLedgersResponse(ledger_ids=packed[i:i + step], last_page=complete and
                                                 i + step >= len(packed))

    def watch_once(self) -> list[Change]:
        """One look at the bookie for changes (its cost paid from the CPU budget), appended to the feed.
        Once nobody has followed the feed for WATCH_LINGER_SECONDS (since the last reader left, or the
        start) only what the answers need is watched (entry logs gone: #4607), not the `ledgers` index: the
        feed starts anew, and a reader resuming from the old one is told it missed changes."""
        changes = getattr(self.source, "changes", None)
        if changes is None:
            return []
        with self._watch_lock:
            followed = bool(self._followers) or time.monotonic() - self._left_at < self.watch_linger
            if self._watching and not followed:
                self._watching = False
                self.metrics.watching.set(0)
                self.feed.renew()
            return self._look(changes, followed)

    def _look(self, changes: Callable[[bool], tuple[list[Change], int]], followed: bool) -> list[Change]:
        with self.metrics.watch.time():
            found, read = changes(followed)  # the first followed look after a pause takes stock of the index
        if followed:
            self._watching = True
            self.metrics.watching.set(1)
        self.spend(read)
        self.feed.append(found)
        for c in found:
            self.metrics.changes.labels(str(c.kind)).inc()
        return list(found)

    @contextlib.contextmanager
    def _followed(self, context: grpc.ServicerContext) -> Iterator[None]:
        """A reader follows the feed; the agent watches the whole bookie before it reads (stock taken of
        the `ledgers` index at once if nobody followed)."""
        changes = getattr(self.source, "changes", None)
        if changes is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          f"a {type(self.source).__name__} cannot watch what the bookie holds")
            return  # abort raises
        with self._watch_lock:
            if not self._watching:
                try:
                    self._look(changes, True)
                except SourceError as exc:
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot take stock of what the bookie holds: {exc}")
            self._followers += 1
        try:
            yield
        finally:
            with self._watch_lock:
                self._followers -= 1
                self._left_at = time.monotonic()

    @stoppable
    def WatchHoldings(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with self._followed(context):
            yield from self._stream(request, context)

    def _stream(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        context.send_initial_metadata(())  # the reader knows at once that it follows a live, watching agent
        msg = bookie_pb2.HoldingsChange
        feed, last, heartbeat = self.feed, request.after_sequence, time.monotonic()
        reader = request.feed_id
        while self.going(context):
            events, gap = feed.since(reader, last)
            if gap:
                yield msg(kind=msg.GAP, feed_id=feed.feed_id, sequence=feed.last,
                          detail="changes after the cursor are not all kept (the agent restarted, or "
                          "nobody followed it for a while)")
            for e in events:
                yield _change_message(feed.feed_id, e)
                last = e.sequence
            reader = feed.feed_id
            if gap and not events:
                last = feed.last
            if not feed.wait(last, 1.0) and time.monotonic() - heartbeat >= HEARTBEAT_SECONDS:
                yield msg(kind=msg.HEARTBEAT, feed_id=feed.feed_id, sequence=feed.last)
                heartbeat = time.monotonic()

    def answers(self, ids: list[int], failed: str) -> list[Any]:
        """One stream message's answers; a source that answers many ledgers at once is asked so."""
        many = getattr(self.source, "availability_many", None)
        if failed or many is None:
            return [self.answer(lid, failed) for lid in ids]
        try:
            held = many(ids)
        except Exception:  # one ledger at a time, each with its own reason
            return [self.answer(lid, failed) for lid in ids]
        out = [answer_of(lid, h) for lid, h in zip(ids, held, strict=True)]
        self.spend(sum(h.entries for h in held if h is not None))
        for status, n in Tally(a.status for a in out).items():
            self.metrics.answers.labels(bookie_pb2.StatusCode.Name(status)).inc(n)
        return out

    @stoppable
    def VerifyEntriesOfLedgers(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        verify = getattr(self.source, "verify", None)
        if verify is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          f"a {type(self.source).__name__} has no entry logs to read: deep scrub needs DbLedgerStorage")
        asks = list({a.ledger_id: a for a in request.ledgers}.values())
        if len(asks) > self.max_ledgers_per_call:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(asks)} ledgers in one call; at most {self.max_ledgers_per_call}")
        for a in asks:
            if a.ledger_id < 0:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ledger_id {a.ledger_id} is negative")
            if a.digest_type not in bookie_pb2.DigestType.values():
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ledger {a.ledger_id}: unknown digest type "
                              f"{a.digest_type}")
            if a.password and not self.accepts_passwords:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "ledger passwords (HMAC) are accepted only by an agent served over TLS")
        failed = self.refresh("VerifyEntriesOfLedgers")

        def verified() -> Iterator[Any]:
            for a in asks:
                if not self.going(context):
                    return
                msg = self._verification(verify, a, failed)
                self.metrics.answers.labels(bookie_pb2.StatusCode.Name(msg.status)).inc()
                yield msg

        for batch in in_messages(verified(), lambda m: m.ByteSize(), self.answers_per_message):
            yield bookie_pb2.VerifyEntriesOfLedgersResponse(ledgers=batch)

    def _verification(self, verify: Any, ask: Any, failed: str) -> Any:
        reply = bookie_pb2.LedgerVerification
        if failed:
            return reply(status=bookie_pb2.EIO, ledger_id=ask.ledger_id, message=failed)
        digest_type = bookie_pb2.DigestType.Name(ask.digest_type)
        try:
            got = verify(ask.ledger_id, digest_type, ask.password or None, self.deep_rate.take)
        except SourceError as exc:
            return reply(status=bookie_pb2.EIO, ledger_id=ask.ledger_id, message=str(exc))
        except Exception as exc:  # a source bug must not kill the stream for every other ledger
            log.exception("deep scrub failed on ledger %d", ask.ledger_id)
            return reply(status=bookie_pb2.EIO, ledger_id=ask.ledger_id, message=f"{type(exc).__name__}: {exc}")
        if got is None:
            return reply(status=bookie_pb2.ENOLEDGER, ledger_id=ask.ledger_id)
        self.metrics.verified_bytes.inc(got.bytes_read)
        for _, reason, _ in got.corrupt:
            self.metrics.corrupt.labels(reason).inc()
        return reply(status=bookie_pb2.EOK, ledger_id=ask.ledger_id, verified_entries=codec.encode(got.verified),
                     payload_hashes=got.payload_hashes, bytes_read=got.bytes_read,
                     digest_unchecked=not got.digest_checked,
                     corrupt=[bookie_pb2.CorruptEntry(entry_id=e, reason=r, detail=d) for e, r, d in got.corrupt])


def _change_message(feed_id: str, e: Event) -> Any:
    c = e.change
    return bookie_pb2.HoldingsChange(kind=str(c.kind), feed_id=feed_id,
                                     sequence=e.sequence, observed_at_ms=e.observed_ms, ledger_ids=c.ledger_ids,
                                     entry_log_id=c.entry_log, every_ledger=c.every_ledger, detail=c.detail)


class BookieAgent:
    """A running agent: gRPC server, health service, optional ZooKeeper registration."""

    def __init__(self, source: EntrySource, bind: str = f"0.0.0.0:{DEFAULT_AGENT_PORT}", workers: int = 8,
                 max_concurrent_calls: int = 64, max_message_bytes: int = 64 * 1024 * 1024,
                 answers_per_message: int = ANSWERS_PER_MESSAGE,
                 credentials: grpc.ServerCredentials | None = None,
                 deep_bytes_per_second: float = 32 * 1024 * 1024, entries_per_second: float = 0,
                 unary_catch_up_seconds: float = UNARY_CATCH_UP_SECONDS,
                 watch_interval_seconds: float = WATCH_INTERVAL_SECONDS,
                 watch_linger_seconds: float = WATCH_LINGER_SECONDS) -> None:
        self.source = source
        self.watch_interval = watch_interval_seconds
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent"),
            maximum_concurrent_rpcs=max_concurrent_calls,
            options=[("grpc.max_send_message_length", max_message_bytes),
                     ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                     # gRPC's default takes a ping more often than every 5 minutes for abuse
                     ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_PINGS_AT_MOST_EVERY_MS),
                     ("grpc.http2.max_ping_strikes", 0)],
        )
        self.servicer = BookieServicer(source, answers_per_message=answers_per_message,
                                       deep_rate=Rate(deep_bytes_per_second),
                                       accepts_passwords=credentials is not None,
                                       entry_rate=Rate(entries_per_second),
                                       unary_catch_up_seconds=unary_catch_up_seconds,
                                       watch_linger_seconds=watch_linger_seconds)
        bookie_pb2_grpc.add_BookieServicer_to_server(self.servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = (self.server.add_secure_port(bind, credentials) if credentials
                     else self.server.add_insecure_port(bind))
        if self.port == 0:
            raise OSError(f"cannot listen on {bind}")
        self.registration: Registration | None = None
        self.metrics_endpoint: MetricsEndpoint | None = None
        self._stopped = threading.Event()

    def start(self) -> BookieAgent:
        self.server.start()
        if self.watch_interval > 0 and getattr(self.source, "changes", None) is not None:
            threading.Thread(target=self._watch, name="agent-watch", daemon=True).start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def _watch(self) -> None:
        """Look at the bookie for changes every `watch_interval` seconds until the agent stops."""
        stopping = self.servicer.stopping
        while not stopping.wait(self.watch_interval):
            try:
                self.servicer.watch_once()
            except AgentStopping:
                return
            except Exception:  # the bookie's index mid-rewrite, say: the next look tries again
                log.exception("looking at the bookie for changes")

    def serve_metrics(self, listen: str) -> int:
        """Prometheus' /metrics on `listen`; the port bound."""
        self.metrics_endpoint = MetricsEndpoint(listen, self.servicer.metrics.registry)
        return self.metrics_endpoint.port

    def register(self, store: MetadataStore, bookie_id: str, address: str) -> None:
        """Tell scans where this agent listens: an ephemeral registration, kept until `stop`."""
        self.registration = store.register_agent(bookie_id, address)

    def stop(self, grace: float = 5.0) -> bool:
        """Stop serving within about `grace` seconds, whatever the calls are doing: a call waiting for
        its budget or between two messages ends at once (UNAVAILABLE), the others have the grace.
        Whether every call had ended, and so the source could be closed."""
        if self._stopped.is_set():
            return True
        self.servicer.stopping.set()
        self.servicer.feed.close()  # WatchHoldings streams end at once
        self.health.enter_graceful_shutdown()
        if self.registration is not None:
            self.registration.close()
        self.server.stop(grace).wait(grace + 1)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        drained = self.servicer.calls.wait_idle(1.0)
        if drained:  # a call still inside the source (a long index read) must not see it closed
            self.source.close()
        else:
            log.warning("%d calls still running %.1f s after the stop began", self.servicer.calls.running, grace)
        self._stopped.set()
        return drained

    def serve_until_signalled(self, grace: float, after: Callable[[], None] | None = None) -> int:
        """The agent process's life: serve until SIGTERM or SIGINT, then stop within `grace` (and, past
        it, whatever holds the stop up: a store that does not answer the deregistration, a call deep in
        the source, a few seconds more at most); a second signal ends the process at once. `after`
        runs once the agent has stopped. The exit status."""
        requested = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            if requested.is_set():  # the operator will not wait
                os._exit(128 + signum)
            requested.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # Waited for in slices: a signal the kernel delivers to another thread only flags it, and Python runs
        # the handler once the main thread runs again (a wait without a timeout would never return).
        while not requested.wait(0.2):
            pass
        watchdog = threading.Timer(grace + GIVE_UP_AFTER_GRACE, _exit_now, (1, f"the agent did not stop within "
                                                                          f"{grace + GIVE_UP_AFTER_GRACE:.0f} s"))
        watchdog.daemon = True
        watchdog.start()
        drained = self.stop(grace)
        if after is not None:
            after()
        if not drained:  # the interpreter would wait at exit for the gRPC threads still in those calls
            _exit_now(0, "calls still running at the end of the grace were cut off")
        watchdog.cancel()
        return 0


def _exit_now(status: int, why: str) -> None:
    (log.error if status else log.warning)("%s: exiting", why)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(status)
