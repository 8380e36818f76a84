"""The facts about the cluster, apart from its ledgers, that a decision rests on, read at one moment (Patroni's
`Cluster`): the bookies' registrations, where their agents listen, BookKeeper's lostBookieRecoveryDelay,
whether re-replication is disabled, and when the leaders first saw each lost bookie gone (their sightings).
A run takes one reading at its start and a fresh one at each later step that must see what changed meanwhile
(the delayed re-check, the re-reads before reporting); nothing reads them piecemeal. `FactsCache` keeps a
reading between changes for the leader's continuous looks."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from scrutiny.lostbookies import SIGHTINGS as LOST_BOOKIE_SIGHTINGS
from scrutiny.store import MetadataStore, Registrations

# The parts of a reading, as a cache keeps them and the store's watch (or the leader) spoils them.
REGISTRATIONS, AGENTS, REPLICATION, SIGHTINGS = PARTS = ("registrations", "agents", "replication", "sightings")


@dataclass(frozen=True)
class ClusterFacts:
    registrations: Registrations
    agent_addresses: Mapping[str, str]  # bookie -> its agent, as registered (BookieClient adds the configured ones)
    recovery_delay: int | None  # BookKeeper's lostBookieRecoveryDelay as the cluster keeps it, if it does
    replication_disabled: bool
    lost_bookie_sightings: Mapping[str, int]  # bookie -> when first seen gone (ms), as the leaders record it

    @classmethod
    def read(cls, store: MetadataStore) -> ClusterFacts:
        return cls(store.registrations(), store.agent_addresses(), store.lost_bookie_recovery_delay(),
                   store.replication_disabled(), LOST_BOOKIE_SIGHTINGS.read(store))

    @property
    def registered(self) -> frozenset[str]:
        """Every bookie registered, writable or read-only."""
        return frozenset(self.registrations.writable) | frozenset(self.registrations.readonly)


def _read(store: MetadataStore, part: str) -> dict[str, object]:
    if part == REGISTRATIONS:
        return {"registrations": store.registrations()}
    if part == AGENTS:
        return {"agent_addresses": store.agent_addresses()}
    if part == SIGHTINGS:
        return {"lost_bookie_sightings": LOST_BOOKIE_SIGHTINGS.read(store)}
    return {"recovery_delay": store.lost_bookie_recovery_delay(), "replication_disabled": store.replication_disabled()}


class FactsCache:
    """The leader's reading, each part kept until the store's watch says it changed (`changed(part)`) or may
    have missed a change (`changed()`: every part); a part whose read raced such a change is used once and not
    kept. The agents' addresses and the sightings live outside the watched tree: the leader spoils both when it
    lists the agents, the sightings too at every registration change (the only change that moves one) and when it
    records them itself. A sighting a full run recorded meanwhile is used at the next listing: a lost bookie's
    check is then due later, never early.
    `reads` counts the reads of each part (/metrics shows them)."""

    def __init__(self, store: MetadataStore, keeping: bool = True, reads: Counter[str] | None = None) -> None:
        self.store = store
        self.keeping = keeping  # False: every reading from the store (nothing watches it)
        self.reads: Counter[str] = Counter() if reads is None else reads
        self._lock = threading.Lock()
        self._kept: dict[str, dict[str, object]] = {}
        self._changes = dict.fromkeys(PARTS, 0)  # per part: a ledger's change never spoils a read

    def changed(self, *parts: str) -> None:
        with self._lock:
            for part in parts or PARTS:
                self._changes[part] += 1
                self._kept.pop(part, None)

    def facts(self) -> ClusterFacts:
        fields: dict[str, object] = {}
        for part in PARTS:
            with self._lock:
                kept, before = self._kept.get(part), self._changes[part]
            if kept is None:
                kept = _read(self.store, part)
                with self._lock:
                    self.reads[part] += 1
                    if self.keeping and self._changes[part] == before:
                        self._kept[part] = kept
            fields |= kept
        return ClusterFacts(**fields)  # type: ignore[arg-type]
