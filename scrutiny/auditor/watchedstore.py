"""The leader's store as continuous scrutiny's looks read it.

A look at a few ledgers is a run, and a run reads the cluster's facts at its start: every bookie's
registration, every agent's address, lostBookieRecoveryDelay, whether re-replication is disabled. On a
cluster of 60 bookies that was 120 of the 150 znodes a look read, and 9 of its 11 requests, for facts that
had not changed. Here the facts the store's watch covers are read once and kept until the watch says one of
them changed or may have missed a change (a gap); a read that raced such a change is not kept. The agents'
addresses live outside the watched tree: they are kept until the agents are listed again, and read afresh
before every delayed re-check, so a silence is never judged on an old address. Everything else is read from
the store as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from scrutiny.store import MetadataStore, Registrations

T = TypeVar("T")
REGISTRATIONS, AGENTS, RECOVERY_DELAY, REPLICATION_DISABLED = FACTS = (
    "registrations", "agents", "recovery delay", "replication disabled")


class WatchedStore:
    """`store`, with the facts above kept between changes; `changed(...)` forgets them (all: a gap)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.keeping = True  # False: every fact read from the store (nothing watches it)
        self._lock = threading.Lock()
        self._kept: dict[str, Any] = {}
        self._changes = dict.fromkeys(FACTS, 0)  # per fact, so that a ledger's change never spoils a read

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def changed(self, *facts: str) -> None:
        with self._lock:
            for fact in facts or FACTS:
                self._changes[fact] += 1
                self._kept.pop(fact, None)

    def kept(self) -> set[str]:
        with self._lock:
            return set(self._kept)

    def _read(self, fact: str, read: Callable[[], T]) -> T:
        with self._lock:
            if fact in self._kept:
                return self._kept[fact]
            before = self._changes[fact]
        value = read()
        with self._lock:
            if self.keeping and self._changes[fact] == before:
                self._kept[fact] = value
        return value

    def registrations(self) -> Registrations:
        return self._read(REGISTRATIONS, self.store.registrations)

    def agent_addresses(self) -> dict[str, str]:
        return dict(self._read(AGENTS, self.store.agent_addresses))

    def lost_bookie_recovery_delay(self) -> int | None:
        return self._read(RECOVERY_DELAY, self.store.lost_bookie_recovery_delay)

    def replication_disabled(self) -> bool:
        return self._read(REPLICATION_DISABLED, self.store.replication_disabled)
