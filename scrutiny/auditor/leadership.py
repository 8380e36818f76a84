"""Leadership: one auditor of two or three leads, through scrutiny's own election in the metadata
store; the time of each periodic kind's last complete run is kept there too (the cadence), so that a
new leader keeps it instead of starting over (BookKeeper #1683)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.interval import IntervalTrigger

from scrutiny import retry
from scrutiny.errors import StoreError
from scrutiny.records import LeaderRecord
from scrutiny.store import Election, Fence, MetadataStore
from scrutiny.times import iso_seconds

log = logging.getLogger(__name__)


class Leadership:
    """Connects to the store (backing off while it is unreachable: never a crash loop), contends in
    the election, and leads until told to step down or until the store session is lost."""

    def __init__(self, connect: Callable[[], MetadataStore], identifier: str, election_name: str,
                 on_elected: Callable[[], None], on_deposed: Callable[[], None],
                 on_taking_over: Callable[[], None] = lambda: None) -> None:
        self._connect, self.identifier, self.election_name = connect, identifier, election_name
        self._on_elected, self._on_deposed, self._on_taking_over = on_elected, on_deposed, on_taking_over
        self.store: MetadataStore | None = None
        self.leading = threading.Event()
        self.stopping = threading.Event()
        self._step_down = threading.Event()
        self._election: Election | None = None
        self._thread = threading.Thread(target=self._contend, name="election", daemon=True)
        self._retry = retry.Retry(retry.RECONNECT, sleep=self.stopping.wait)  # a stop cuts a wait short

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Depose, then let go (as Patroni demotes before it frees the leader key): the leader stops acting (its
        deposition callback runs to its end) and releases the election on a live session; only then is the
        store closed. A standby stops contending."""
        self.stopping.set()
        self._step_down.set()
        if self._election is not None:
            self._election.cancel()  # a standby waiting to lead
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the election did not end within %.0f s: closing the store under it", timeout)
        if self.store is not None:
            try:
                self.store.close()
            except Exception as exc:
                log.debug("closing the metadata store: %s", exc)

    def fence(self) -> Fence | None:
        """While leading: its own election node, which a deposed leader's writes are conditional on."""
        election = self._election
        return election.fence() if election is not None and self.leading.is_set() else None

    def connected_store(self) -> MetadataStore:
        if self.store is None:
            raise StoreError("not connected to the metadata store yet")
        return self.store

    def _connect_with_backoff(self) -> bool:
        def connect() -> None:
            self.store = self._connect()
            self.store.on_session_lost(self._session_lost)

        try:
            self._retry.call(connect, lambda exc: isinstance(exc, StoreError) and not self.stopping.is_set(),
                             lambda exc, delay: log.warning("%s; retrying in %.0f s", exc, delay))
            return True
        except StoreError:
            return False  # stopping

    def _session_lost(self) -> None:
        if self.stopping.is_set():
            return  # our own stop closed it: nothing was lost
        log.warning("metadata store session lost: stepping down")
        self._step_down.set()

    def _contend(self) -> None:
        if not self._connect_with_backoff():
            return
        store = self.connected_store()

        def contend() -> None:
            self._election = store.election(self.identifier, self.election_name)
            leader = next(iter(self._election.contenders()), "")
            if leader and leader != self.identifier:
                log.info("standing by: %s leads", leader)
            self._election.run(self._lead)

        while not self.stopping.is_set():  # each leadership ended, contend again
            try:
                self._retry.call(contend, lambda exc: not self.stopping.is_set(), lambda exc, delay: log.warning(
                    "leader election interrupted (%s); again in %.0f s", exc, delay))
            except Exception:
                return  # stopping

    def _lead(self) -> None:
        self._step_down.clear()
        if self.stopping.is_set():
            return
        try:  # before it says it leads: what the last leader kept is shown from the first moment
            self._on_taking_over()
        except Exception as exc:
            log.error("taking over: %s", exc)
        self.leading.set()
        log.info("leading (%s)", self.identifier)
        try:
            self._on_elected()
            self._step_down.wait()
        finally:
            self.leading.clear()
            self._on_deposed()
            log.info("no longer leading")

    def leader_address(self) -> str:
        if self.leading.is_set():
            return self.identifier
        try:
            contenders = self.connected_store().election(self.identifier, self.election_name).contenders()
        except Exception:
            return ""
        return str(contenders[0]) if contenders else ""


def cadence(kind: str) -> LeaderRecord[int | None]:
    """When the last complete run of a periodic kind started (ms), as the leaders record it."""
    return LeaderRecord(f"cadence/{kind}", lambda data: int(data.decode()), lambda ms: str(ms).encode(),
                        lambda: None, "its next run is due now")


class PeriodicRuns:
    """The periodic kinds on the scheduler while leading, each first due one interval after the last
    complete run of its kind (the cadence in the store), or now when there is none."""

    def __init__(self, scheduler: BaseScheduler, store: Callable[[], MetadataStore],
                 due: Callable[[str], None]) -> None:
        self.scheduler, self._store, self._due = scheduler, store, due
        self._kinds: set[str] = set()
        self._lock = threading.RLock()  # elected, deposed and reloaded come from different threads

    def schedule(self, intervals: Mapping[str, float]) -> None:
        with self._lock:
            self._schedule(intervals)

    def _schedule(self, intervals: Mapping[str, float]) -> None:
        self.clear()
        now = time.time()
        for kind, interval in intervals.items():
            if interval <= 0:
                continue
            last = cadence(kind).read(self._store())
            first = now if last is None else max(now, last / 1000 + interval)
            self.scheduler.add_job(self._due, IntervalTrigger(seconds=interval), args=[kind], id=kind,
                                   next_run_time=datetime.fromtimestamp(first, UTC), coalesce=True,
                                   max_instances=1, misfire_grace_time=None)
            self._kinds.add(kind)
            log.info("%s runs every %s s, next at %s", kind, interval, iso_seconds(first))

    def clear(self) -> None:
        with self._lock:
            for kind in self._kinds:
                if self.scheduler.get_job(kind):
                    self.scheduler.remove_job(kind)
            self._kinds.clear()

    def next_runs(self) -> dict[str, str]:
        out = {}
        for kind in sorted(self._kinds):
            job = self.scheduler.get_job(kind)
            if job is not None and job.next_run_time is not None:
                out[kind] = iso_seconds(job.next_run_time.timestamp())
        return out

    def record(self, kind: str, started_ms: int) -> None:
        """A complete run of `kind` started at `started_ms`: the next leader keeps the cadence."""
        try:
            cadence(kind).write(self._store(), started_ms)
        except Exception as exc:
            log.warning("could not record the %s cadence: %s", kind, exc)
