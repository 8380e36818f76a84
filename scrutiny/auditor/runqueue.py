"""The auditor's run queue: runs execute one at a time on one worker, in the order asked; a run that
needs BP-34's delayed re-check hands its second half to a timer and frees the worker meanwhile."""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from scrutiny.auditor.runkinds import JUDGING_KINDS, WHOLE_CLUSTER_KINDS
from scrutiny.errors import Busy
from scrutiny.logsetup import RUN_ID
from scrutiny.report import Report

log = logging.getLogger(__name__)


@dataclass
class Ticket:
    """One requested run, from the queue to its report."""

    kind: str
    ledger_ids: tuple[int, ...] | None = None
    bookie_id: str = ""
    without: tuple[str, ...] = ()  # a what-if: these bookies down ...
    without_racks: tuple[str, ...] = ()  # ... and these racks
    deep_slice: int = -1  # a deep run: the slice of the deep pass it verifies
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started_ms: int = 0
    finished_ms: int = 0
    ranges_done: int = 0
    ranges_total: int = 0
    report: Report | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def whole_cluster(self) -> bool:
        """A run of its kind over every ledger (not some ledgers', one bookie's, or a what-if)."""
        return self.kind in WHOLE_CLUSTER_KINDS and self.ledger_ids is None and not self.bookie_id

    def judged_every_ledger(self, report: Report) -> bool:
        """A complete run over every ledger, of a kind that judges them all: the current state, and the lost bookies
        due by its start, are its to judge."""
        return report.complete and self.whole_cluster and self.kind in JUDGING_KINDS


@dataclass(frozen=True)
class Later:
    """The second half of a run, due after a delay (the re-check)."""

    delay_seconds: float
    finish: Callable[[], Report]
    abandon: Callable[[], None] = lambda: None  # frees what the first half holds (its store session)


Execute = Callable[[Ticket], "Report | Later"]
Publish = Callable[[Ticket, Report], None]
Schedule = Callable[[float, Callable[[], None]], None]  # run a function once, after a delay


class RunQueue:
    def __init__(self, execute: Execute, publish: Publish, schedule: Schedule, failed: Callable[[Ticket, Exception],
                 Report], max_queued: int = 8) -> None:
        self._execute, self._publish, self._schedule, self._failed = execute, publish, schedule, failed
        self.max_queued = max_queued
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)  # a re-check ended (`stop` waits for those going)
        self._finishing = 0  # re-checks going now (on the scheduler's threads)
        self._queue: queue.Queue[Ticket | None] = queue.Queue()
        self.queued: list[Ticket] = []
        self.awaiting_recheck: list[Ticket] = []
        self._later: dict[str, Later] = {}  # run id -> the second half of a run awaiting its re-check
        self.current: Ticket | None = None
        self.last: dict[str, Ticket] = {}
        self._worker = threading.Thread(target=self._work, name="run-worker", daemon=True)

    def start(self) -> None:
        self._worker.start()

    def stop(self, grace_seconds: float) -> bool:
        """Stop taking runs; wait for the current one, and for the re-checks going, at most `grace_seconds` in
        all. False if something was abandoned. (A re-check not begun yet is `abandon_rechecks`'.)"""
        deadline = time.monotonic() + grace_seconds
        self._queue.put(None)
        if self._worker.is_alive():
            self._worker.join(grace_seconds)
        with self._lock:
            self._finished.wait_for(lambda: self._finishing == 0, max(0.0, deadline - time.monotonic()))
            return not self._worker.is_alive() and self._finishing == 0

    def submit(self, ticket: Ticket) -> tuple[Ticket, bool]:
        """Queue a run; returns it and whether it waits behind another."""
        with self._lock:
            if len(self.queued) >= self.max_queued:
                raise Busy(f"{len(self.queued)} runs already queued; try again later")
            waits = self.current is not None or bool(self.queued)
            self.queued.append(ticket)
        self._queue.put(ticket)
        return ticket, waits

    def busy_with(self, kind: str) -> bool:
        """A run of this kind is queued, going, or waiting for its re-check."""
        with self._lock:
            return any(t.kind == kind for t in [*self.queued, *self.awaiting_recheck, self.current] if t)

    def waiting(self, kind: str) -> bool:
        """A run of this kind is queued and has not started."""
        with self._lock:
            return any(t.kind == kind for t in self.queued)

    def going_since_ms(self, kind: str) -> int | None:
        """When the run of this kind that is going (or waiting for its re-check) started (0: starting now)."""
        with self._lock:
            return next((t.started_ms for t in (self.current, *self.awaiting_recheck) if t and t.kind == kind), None)

    def _work(self) -> None:
        while True:
            ticket = self._queue.get()
            if ticket is None:
                return
            with self._lock:
                self.queued.remove(ticket)
                self.current = ticket
            token = RUN_ID.set(ticket.run_id)
            try:
                outcome = self._execute(ticket)
                if isinstance(outcome, Later):
                    with self._lock:
                        self.awaiting_recheck.append(ticket)
                        self._later[ticket.run_id] = outcome
                    self._schedule(outcome.delay_seconds, functools.partial(self._finish, ticket, outcome))
                else:
                    self._done(ticket, outcome)
            except Exception as exc:
                log.exception("run %s failed", ticket.run_id)
                self._done(ticket, self._failed(ticket, exc))
            finally:
                RUN_ID.reset(token)
                with self._lock:
                    self.current = None

    def _finish(self, ticket: Ticket, later: Later) -> None:
        with self._lock:
            if self._later.pop(ticket.run_id, None) is None:
                return  # abandoned at shutdown before its timer fired
            self._finishing += 1
        token = RUN_ID.set(ticket.run_id)
        try:
            report = later.finish()
        except Exception as exc:
            log.exception("run %s failed in its re-check", ticket.run_id)
            report = self._failed(ticket, exc)
        finally:
            RUN_ID.reset(token)
            with self._lock:
                self.awaiting_recheck.remove(ticket)
        try:
            self._done(ticket, report)
        finally:
            with self._lock:
                self._finishing -= 1
                self._finished.notify_all()

    def abandon_rechecks(self) -> None:
        """At shutdown, once no timer can fire: the runs awaiting their re-check end here, their sessions closed."""
        with self._lock:
            abandoned, self._later = list(self._later.values()), {}
        for later in abandoned:
            try:
                later.abandon()
            except Exception as exc:
                log.debug("abandoning a re-check: %s", exc)

    def _done(self, ticket: Ticket, report: Report) -> None:
        ticket.report = report
        try:
            self._publish(ticket, report)
        finally:
            with self._lock:
                self.last[ticket.kind] = ticket
            ticket.done.set()
