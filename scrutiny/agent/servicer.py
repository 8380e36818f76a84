"""The agent's answers (scrutiny.v1.Bookie): which entries of each ledger the bookie holds, the ledgers it
holds, its stored entries verified, and the feed of what changed (`watching`). What the source cannot do
(list its ledgers, read its entries, watch for changes: its declared capabilities) is UNIMPLEMENTED."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
import numpy as np

from scrutiny import codec
from scrutiny.agent.limits import AgentStopping, Calls, Rate, stoppable
from scrutiny.agent.metrics import AgentMetrics
from scrutiny.agent.watching import WATCH_LINGER_SECONDS, Watching
from scrutiny.entrysources import (
    AnswersMany,
    EntrySource,
    Holding,
    ListsLedgers,
    ReadsEntries,
    SourceError,
    WatchesChanges,
)
from scrutiny.listedcolumns import listed_columns
from scrutiny.pulsar.entry import frame
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc

log = logging.getLogger(__name__)
MAX_LEDGERS_PER_CALL = 100_000
UNARY_CATCH_UP_SECONDS = 0.2  # BP-34's one-ledger call catches up with the bookie at most this often
LIST_PAGE = 250_000  # ledger ids per ListLedgers call when the caller names no page size
MAX_LIST_PAGE = 1_000_000
IDS_PER_MESSAGE = 65_536  # 512 KiB of ledger ids per ListLedgers message
# Answers per stream message, and about how many bytes: a message costs the scan a fixed ~150 us on
# top of its answers, and a large answer (a fragmented ledger) must not swell a message past the limit.
ANSWERS_PER_MESSAGE = 1000
MESSAGE_BYTES = 1 << 20
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


def response_of(answers: list[Any], columns: bool) -> Any:
    """One stream message of these answers: with `columns`, the EOK ones as columns."""
    if not columns:
        return bookie_pb2.GetListOfEntriesOfLedgersResponse(ledgers=answers)
    listed = [a for a in answers if a.status == bookie_pb2.EOK]
    return bookie_pb2.GetListOfEntriesOfLedgersResponse(
        ledgers=[a for a in answers if a.status != bookie_pb2.EOK],
        listed=listed_columns([a.ledger_id for a in listed], [a.availability_of_entries_of_ledger for a in listed])
        if listed else None)


def answer_of(ledger_id: int, held: Holding | None) -> Any:
    if held is None:
        return Answer(status=bookie_pb2.ENOLEDGER, ledger_id=ledger_id)
    # A limbo ledger: the entries listed are held; the bookie itself cannot tell about the others.
    return Answer(status=bookie_pb2.EUNKNOWNLEDGERSTATE if held.limbo else bookie_pb2.EOK, ledger_id=ledger_id,
                  availability_of_entries_of_ledger=held.availability)


class BookieServicer(bookie_pb2_grpc.BookieServicer):
    def __init__(self, source: EntrySource, max_ledgers_per_call: int = MAX_LEDGERS_PER_CALL,
                 answers_per_message: int = ANSWERS_PER_MESSAGE, metrics: AgentMetrics | None = None,
                 deep_rate: Rate | None = None, accepts_passwords: bool = False, entry_rate: Rate | None = None,
                 unary_catch_up_seconds: float = UNARY_CATCH_UP_SECONDS,
                 watch_linger_seconds: float = WATCH_LINGER_SECONDS) -> None:
        self.source = source
        # what the source declares it can do beyond its answers
        self.many = source if isinstance(source, AnswersMany) else None
        self.lister = source if isinstance(source, ListsLedgers) else None
        self.reader = source if isinstance(source, ReadsEntries) else None
        self.max_ledgers_per_call = max_ledgers_per_call
        self.answers_per_message = answers_per_message
        self.metrics = metrics or AgentMetrics()
        self.deep_rate = deep_rate or Rate(32 * 1024 * 1024)
        self.entry_rate = entry_rate or Rate(0)
        self.stopping = threading.Event()
        self.calls = Calls()
        self.watching = (Watching(source, self.metrics, self.spend, self.going, watch_linger_seconds)
                         if isinstance(source, WatchesChanges) else None)
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
        sizes = self.reader.stored_bytes if self.reader is not None and request.with_stored_bytes else None
        columns = request.listed_as_columns and sizes is None  # stored bytes travel in each answer
        for i in range(0, len(ids), self.answers_per_message):
            if not self.going(context):
                return
            answers = self.answers(ids[i:i + self.answers_per_message], failed)
            if sizes is not None:
                self._add_stored_bytes(sizes, answers)
            for batch in in_messages(answers, lambda a: len(a.availability_of_entries_of_ledger) + 16,
                                     self.answers_per_message):
                yield response_of(batch, columns)

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
        if self.lister is None:
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
            ids, complete = self.lister.list_ledgers(request.from_ledger_id, request.max_ledgers or LIST_PAGE)
        except SourceError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        self.spend(len(ids))  # a key read per ledger listed
        packed = np.asarray(ids, dtype=">i8").tobytes()
        step = 8 * IDS_PER_MESSAGE
        for i in range(0, max(len(packed), 1), step):
            yield bookie_pb2.ListLedgersResponse(ledger_ids=packed[i:i + step], last_page=complete and
                                                 i + step >= len(packed))

    @stoppable
    def WatchHoldings(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if self.watching is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          f"a {type(self.source).__name__} cannot watch what the bookie holds")
            return
        with self.watching.followed(context):
            yield from self.watching.stream(request, context)

    def answers(self, ids: list[int], failed: str) -> list[Any]:
        """One stream message's answers; a source that answers many ledgers at once is asked so."""
        if failed or self.many is None:
            return [self.answer(lid, failed) for lid in ids]
        try:
            held = self.many.availability_many(ids)
        except Exception:  # one ledger at a time, each with its own reason
            return [self.answer(lid, failed) for lid in ids]
        out = [answer_of(lid, h) for lid, h in zip(ids, held, strict=True)]
        self.spend(sum(h.entries for h in held if h is not None))
        for status, n in Tally(a.status for a in out).items():
            self.metrics.answers.labels(bookie_pb2.StatusCode.Name(status)).inc(n)
        return out

    @stoppable
    def VerifyEntriesOfLedgers(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        reader = self._entry_reader(context, "deep scrub")
        if reader is None:
            return
        asks = list({a.ledger_id: a for a in request.ledgers}.values())
        if len(asks) > self.max_ledgers_per_call:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(asks)} ledgers in one call; at most {self.max_ledgers_per_call}")
        for a in asks:
            self._refuse_bad_ledger(context, a)
        failed = self.refresh("VerifyEntriesOfLedgers")

        def verified() -> Iterator[Any]:
            for a in asks:
                if not self.going(context):
                    return
                msg = self._verification(reader, a, failed)
                self.metrics.answers.labels(bookie_pb2.StatusCode.Name(msg.status)).inc()
                yield msg

        for batch in in_messages(verified(), lambda m: m.ByteSize(), self.answers_per_message):
            yield bookie_pb2.VerifyEntriesOfLedgersResponse(ledgers=batch)

    @stoppable
    def ReadLastEntry(self, request: Any, context: grpc.ServicerContext) -> Any:
        reader, ask = self._entry_reader(context, "reading an entry"), request.ledger
        if reader is None:
            return None
        self._refuse_bad_ledger(context, ask)
        reply = bookie_pb2.ReadLastEntryResponse
        failed = self.refresh("ReadLastEntry")
        if failed:
            return reply(status=bookie_pb2.EIO, message=failed)
        try:
            got = reader.last_entry(ask.ledger_id, bookie_pb2.DigestType.Name(ask.digest_type), ask.password or None,
                                    self.deep_rate.take)
        except SourceError as exc:
            return reply(status=bookie_pb2.EIO, message=str(exc))
        if got is None:
            return reply(status=bookie_pb2.ENOLEDGER)
        return reply(status=bookie_pb2.EOK, entry_id=got[0], payload=got[1])

    def _entry_reader(self, context: grpc.ServicerContext, what: str) -> ReadsEntries | None:
        """The source's entry logs; the call refused (UNIMPLEMENTED) when it has none."""
        if self.reader is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          f"a {type(self.source).__name__} has no entry logs to read: {what} needs DbLedgerStorage")
        return self.reader

    def _refuse_bad_ledger(self, context: grpc.ServicerContext, ask: Any) -> None:
        """A LedgerToVerify's id, digest type and password, each checked: the call aborted on the first wrong."""
        if ask.ledger_id < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ledger_id {ask.ledger_id} is negative")
        if ask.digest_type not in bookie_pb2.DigestType.values():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ledger {ask.ledger_id}: unknown digest type "
                          f"{ask.digest_type}")
        if ask.password and not self.accepts_passwords:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "ledger passwords (HMAC) are accepted only by an agent served over TLS")

    def _verification(self, reader: ReadsEntries, ask: Any, failed: str) -> Any:
        reply = bookie_pb2.LedgerVerification
        if failed:
            return reply(status=bookie_pb2.EIO, ledger_id=ask.ledger_id, message=failed)
        digest_type = bookie_pb2.DigestType.Name(ask.digest_type)
        framings = PulsarFramings() if ask.pulsar_messages else None
        try:
            got = reader.verify(ask.ledger_id, digest_type, ask.password or None, self.deep_rate.take,
                                framings.add if framings is not None else None)
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
                     corrupt=[bookie_pb2.CorruptEntry(entry_id=e, reason=r, detail=d) for e, r, d in got.corrupt],
                     pulsar=framings.answer() if framings is not None else None)


class PulsarFramings:
    """A ledger's verified entries' Pulsar framing, in columns, as the answer carries them."""

    def __init__(self) -> None:
        self.entry_ids: list[int] = []
        self.stamps: list[int] = []
        self.metadata: list[bytes] = []
        self.first_problem = ""

    def add(self, entry_id: int, payload: bytes) -> None:
        stamps, metadata, detail = frame(payload)
        self.entry_ids.append(entry_id)
        self.stamps.append(stamps)
        self.metadata.append(metadata)
        if detail and not self.first_problem:
            self.first_problem = f"entry {entry_id}: {detail}"

    def answer(self) -> Any:
        return bookie_pb2.PulsarEntries(entry_ids=self.entry_ids, stamps=self.stamps, metadata=self.metadata,
                                        first_problem=self.first_problem)
