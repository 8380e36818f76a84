"""The per-range work on an executor: one range read from the store, its bookies asked, its ledgers checked;
the store sessions and agent channels each executor process keeps for the tasks it runs."""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from scrutiny.bookieclient import BookieClient
from scrutiny.deepclient import DeepScrubClient
from scrutiny.errors import DataError, StoreError
from scrutiny.orphans import LedgerIds
from scrutiny.pulsar.ledgers import BookKeeperLedgers
from scrutiny.runstats import Scan, StoreUse
from scrutiny.scan.classify import by_bookie, classify, select, wanted
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.plain import PlainRange, in_columns
from scrutiny.scan.result import RangeResult
from scrutiny.store import LedgerRange, LedgerRead, MetadataStore, ReadsZnodes, open_store

# A range is tens of thousands of short-lived objects without cycles. CPython's default, a young
# collection every 700 allocations (and so a full one every 70,000), re-walks the whole range each
# time: about 15% of a scan's CPU for nothing collected (measured over 100k ledgers). An executor
# process's collector runs this seldom between ranges, and not at all during one (`uncollected`).
YOUNG_COLLECTION_THRESHOLD = 10_000


@dataclass
class _Resources:
    store: MetadataStore
    client: BookieClient
    users: int = 0
    retired: bool = False

    def close(self) -> None:
        self.client.close()
        self.store.close()


class ExecutorResources:
    """Metadata-store sessions and agent channels per executor process, reused by every task the process
    runs (Spark reuses its Python workers), one set per run settings: a few at once, since runs of different
    settings can share a process (the auditor's continuous scrutiny beside a local full run). The agents'
    registrations are not part of the key: a bookie joining or leaving must not open a new session and new
    channels to every agent, so a set learns each run's addresses instead. A set is closed once it is among
    the least recently used and no task uses it."""

    MOST = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sets: OrderedDict[str, _Resources] = OrderedDict()

    def _acquire(self, ctx: RunContext) -> _Resources:
        key = repr(ctx.settings)  # settings hold dicts: unhashable
        with self._lock:
            got = self._sets.get(key)
            if got is None:
                young, *older = gc.get_threshold()
                if 0 < young < YOUNG_COLLECTION_THRESHOLD:  # 0: collection switched off, leave it so
                    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *older)
                got = self._sets[key] = _Resources(open_store(ctx.settings),
                                                   BookieClient.from_settings(ctx.settings, ctx.agent_addresses))
            self._sets.move_to_end(key)
            got.users += 1
            while len(self._sets) > self.MOST:
                _, old = self._sets.popitem(last=False)
                old.retired = True
                if not old.users:
                    old.close()
            return got

    def _release(self, got: _Resources) -> None:
        with self._lock:
            got.users -= 1
            if got.retired and not got.users:
                got.close()

    @contextlib.contextmanager
    def use(self, ctx: RunContext) -> Iterator[tuple[MetadataStore, BookieClient]]:
        """The session and channels for this run's settings, kept open while the caller uses them."""
        got = self._acquire(ctx)
        try:
            yield got.store, got.client.view(ctx.agent_addresses)
        finally:
            self._release(got)

    def get(self, ctx: RunContext) -> tuple[MetadataStore, BookieClient]:
        """The same, for a caller that holds no task (tests, benches): open until retired or closed."""
        got = self._acquire(ctx)
        self._release(got)
        return got.store, got.client.view(ctx.agent_addresses)

    def close(self) -> None:
        with self._lock:
            sets, self._sets = list(self._sets.values()), OrderedDict()
        for got in sets:
            got.close()


EXECUTOR = ExecutorResources()


atexit.register(EXECUTOR.close)


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """The cyclic collector off while a range is worked, on again after (unless it was off already). Its
    objects have no cycles, and reference counting frees them: the collector would only walk them again and
    again while they live. They must be freed before the block ends, or the first collection after it walks
    them all. Another range in another thread may find it off and leave it so; the first one turns it back on
    when it ends, so it is never off longer than a range."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class BetweenTasks:
    """What a reused Spark worker keeps from task to task (its store sessions and agent channels, its modules, the
    shapes it worked out) moved out of the cyclic collector's sight when a task ends. pyspark's daemon runs a full
    collection after every task, which walked all of it again each time. A task's own cycles are collected first;
    every `FULL_EVERY`th task the kept objects are collected too, so that a cycle among them (a retired session's)
    is not kept for the process's life. One worker runs one task at a time."""

    FULL_EVERY = 100

    def __init__(self) -> None:
        self.tasks = 0

    def ended(self) -> None:
        self.tasks += 1
        if self.tasks % self.FULL_EVERY == 0:
            gc.unfreeze()
        gc.collect()
        gc.freeze()


BETWEEN_TASKS = BetweenTasks()


def check_range(ctx: RunContext, rng: LedgerRange, mode: Pass = Pass.FIRST) -> RangeResult:
    """Read one range and check it. Never raises for one bad ledger; a range that cannot be read at
    all comes back with an error (the run is then incomplete)."""
    try:
        with uncollected(), EXECUTOR.use(ctx) as (store, client):
            # returned within: the range's objects are freed before the collector is on again
            return _checked(ctx, rng, mode, store, client)
    except (StoreError, DataError) as exc:
        return RangeResult(errors=(f"range {rng.describe()}: {exc}",))


def _checked(ctx: RunContext, rng: LedgerRange, mode: Pass, store: MetadataStore, client: BookieClient
             ) -> RangeResult:
    reads_before, failed_before = store.reads, client.failed_calls
    ids = store.ledger_ids(rng)
    enumerated = (LedgerIds.of(np.array(ids, dtype=np.int64)),) if ctx.holdings and mode is Pass.FIRST else ()
    if in_columns(ctx, mode) and isinstance(store, ReadsZnodes):
        plain = PlainRange.of(ctx, list(store.read_znodes(ids)))
        asked = plain.wanted()
        checked = plain.classify(ctx, mode, client.fetch_many(asked, ctx.settings.bookie_deadline_seconds)
                                 if asked else {})
        return RangeResult.merge([RangeResult(stats=_io(store, client, reads_before, failed_before),
                                              enumerated=enumerated, bookkeeper=(plain.brief(),) if ctx.pulsar else ()),
                                  checked])
    reads: Iterable[LedgerRead] = store.read_ledgers(ids)
    if ctx.pulsar and mode is Pass.FIRST:
        reads = list(reads)
        bookkeeper: tuple[BookKeeperLedgers, ...] = (BookKeeperLedgers.of(reads),)
    else:
        bookkeeper = ()
    selection = select(ctx, reads)
    s = ctx.settings
    deadline = s.recheck_deadline if mode is Pass.FINAL else s.bookie_deadline_seconds
    answers = client.fetch_many(wanted(selection.candidates), deadline) if selection.candidates else {}
    scrub = [md for md in selection.candidates if ctx.scrubs(md)] if s.deep or ctx.scrub else []
    deep = (DeepScrubClient(client).verify_many(by_bookie(scrub), s.deep_send_passwords) if s.deep or scrub
            else None)
    checked = classify(ctx, mode, selection.candidates, answers, deep, selection.marked)
    return RangeResult.merge([
        RangeResult(selection.counts, selection.violations, deleted=selection.deleted,
                    marked_in_scope=selection.marked_in_scope, stats=_io(store, client, reads_before, failed_before),
                    enumerated=enumerated, bookkeeper=bookkeeper),
        checked,
    ])


def _io(store: MetadataStore, client: BookieClient, reads_before: int, failed_before: int) -> dict[str, int]:
    """What a range cost the store and the bookies' agents."""
    return {**Scan(bookie_calls_failed=client.failed_calls - failed_before).nonzero(),
            **StoreUse(store.reads - reads_before, store.peak_in_flight).nonzero()}

