"""When a run that is asked for starts: a periodic kind due on the leader's schedule, or the full run continuous
scrutiny asks for (a gap in a feed, a mass event, a new leader). Never while re-replication is disabled (unless
runs go on then) or the store cannot tell; a periodic run whose previous one is still going is skipped and
counted, one queued or just started is the same period's."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Protocol

from scrutiny.auditor.publishing import Publisher
from scrutiny.auditor.runkinds import DEEP, FULL, UNDERREPLICATION
from scrutiny.auditor.runqueue import RunQueue, Ticket
from scrutiny.config import AuditorSettings
from scrutiny.store import MetadataStore

log = logging.getLogger(__name__)


class Leader(Protocol):
    """What of the auditor a trigger reads."""

    queue: RunQueue
    publisher: Publisher

    @property
    def leading(self) -> threading.Event: ...

    def auditor_settings(self) -> AuditorSettings: ...

    def connected_store(self) -> MetadataStore: ...


def intervals(s: AuditorSettings) -> dict[str, float]:
    """Each periodic kind's interval (0: not run)."""
    return {FULL: s.full_interval_seconds, UNDERREPLICATION: s.underreplication_interval_seconds,
            DEEP: s.deep_interval_seconds}


class RunTrigger:
    def __init__(self, leader: Leader) -> None:
        self.leader = leader
        self.skipped: Counter[str] = Counter()  # "<kind>.<reason>" -> runs not started

    def due(self, kind: str) -> None:
        """A periodic run is due. One of its kind queued, or started less than half an interval ago (continuous
        scrutiny asked for it at the same election), is this one; one going since longer is too slow: skipped."""
        queue = self.leader.queue
        if not self._may_run(kind) or queue.waiting(kind):
            return
        since = queue.going_since_ms(kind)
        if since is not None:
            if since == 0 or time.time() * 1000 - since < intervals(self.leader.auditor_settings())[kind] * 500:
                log.info("the %s run going now is this period's", kind)
                return
            log.warning("the previous %s run is still going: skipping this one", kind)
            self._skip(kind, "still_running")
            return
        queue.submit(Ticket(kind))

    def full_run_asked(self, why: str) -> None:
        """Continuous scrutiny asks for a full run: one queued covers it; one going may have read a ledger before
        what it asks about: another is queued behind it."""
        if self._may_run(FULL) and not self.leader.queue.waiting(FULL):
            self.leader.queue.submit(Ticket(FULL))

    def _may_run(self, kind: str) -> bool:
        if not self.leader.leading.is_set():
            return False
        try:
            disabled = self.leader.connected_store().replication_disabled()
        except Exception as exc:
            log.warning("cannot tell whether replication is disabled (%s): skipping the %s run", exc, kind)
            self._skip(kind, "zookeeper_unavailable")
            return False
        if disabled and not self.leader.auditor_settings().run_when_replication_disabled:
            log.info("ledger replication is disabled: skipping the %s run", kind)
            self._skip(kind, "replication_disabled")
            return False
        return True

    def _skip(self, kind: str, reason: str) -> None:
        self.skipped[f"{kind}.{reason}"] += 1
        self.leader.publisher.skipped(kind, reason)
