"""Pulsar's whole record (or some topics'), one immutable snapshot per decision: every managed ledger with
its cursors, every schema, and what they name, decoded from the bytes a store read (`StoredRecords`).
One undecodable record is a problem named, never a stop. Pure."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from scrutiny.errors import MetadataError
from scrutiny.pulsar.owners import Owner
from scrutiny.pulsar.records import CursorRecord, ManagedLedgerRecord, SchemaRecord, schema_id_of, url_decoded

KINDS = ("data", "cursor", "compacted", "schema")  # what a topic needs a ledger for


@dataclass(frozen=True)
class StoredRecords:
    """Pulsar's records as a store read them: bytes, keyed by their names below the store's roots."""

    managed_ledgers: Mapping[str, bytes] = field(default_factory=dict)  # tenant/ns/persistent/<encoded>
    cursors: Mapping[str, Mapping[str, bytes]] = field(default_factory=dict)  # managed ledger -> node name
    schemas: Mapping[str, bytes] = field(default_factory=dict)  # tenant/ns/topic
    whole: bool = True  # every topic's, not some topics'


class Need(NamedTuple):
    """A ledger a topic's record names, and what for."""

    ledger_id: int
    kind: str  # one of KINDS
    topic: str  # persistent://tenant/ns/name (a schema's: its schema id)
    cursor: str = ""  # the subscription of a cursor ledger
    version: int = -1  # the schema version
    entries: int | None = None  # a data ledger's, as the record gives them (None: open)
    size: int | None = None

    @property
    def owner(self) -> Owner:
        kind = {"data": "topic", "compacted": "compacted-topic"}.get(self.kind, self.kind)
        return Owner(kind, self.topic, self.cursor)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind, "topic": self.topic}
        if self.cursor:
            out["subscription"] = self.cursor
        if self.version >= 0:
            out["schema_version"] = self.version
        if self.entries is not None:
            out["entries"] = self.entries
        if self.size is not None:
            out["bytes"] = self.size
        return out


@dataclass(frozen=True)
class TopicRecord:
    managed_ledger: ManagedLedgerRecord
    cursors: Mapping[str, CursorRecord] = field(default_factory=dict)

    @property
    def topic(self) -> str:
        return self.managed_ledger.topic

    def needs(self) -> Iterator[Need]:
        topic = self.topic
        for li in self.managed_ledger.ledgers:
            if not li.gone_on_purpose:
                yield Need(li.ledger_id, "data", topic, entries=li.entries, size=li.size)
        for c in self.cursors.values():
            if c.ledger_id >= 0:
                yield Need(c.ledger_id, "cursor", topic, c.name)
            if (compacted := c.compacted_ledger) is not None and compacted >= 0:
                yield Need(compacted, "compacted", topic)


@dataclass(frozen=True)
class PulsarRecord:
    topics: Mapping[str, TopicRecord] = field(default_factory=dict)  # by managed-ledger name
    schemas: Mapping[str, SchemaRecord] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    whole: bool = True

    @classmethod
    def decode(cls, stored: StoredRecords) -> PulsarRecord:
        problems: list[str] = []
        topics = {}
        for name, data in sorted(stored.managed_ledgers.items()):
            try:
                ml = ManagedLedgerRecord.from_node(name, data)
            except MetadataError as exc:
                problems.append(str(exc))
                continue
            cursors = {}
            for node, cdata in sorted(stored.cursors.get(name, {}).items()):
                try:
                    c = CursorRecord.from_node(f"{name}/{node}", url_decoded(node), cdata)
                except MetadataError as exc:
                    problems.append(str(exc))
                    continue
                cursors[c.name] = c
            topics[name] = TopicRecord(ml, cursors)
        schemas = {}
        for sid, data in sorted(stored.schemas.items()):
            try:
                schemas[sid] = SchemaRecord.from_node(sid, data)
            except MetadataError as exc:
                problems.append(str(exc))
        return cls(topics, schemas, tuple(problems), stored.whole)

    def needs(self) -> Iterator[Need]:
        """Every ledger the record names (a ledger offloaded and deleted from BookKeeper is not needed there)."""
        for t in self.topics.values():
            yield from t.needs()
        for s in self.schemas.values():
            for version, lid in s.versions:
                yield Need(lid, "schema", s.schema_id, version=version)

    def needed_ids(self) -> np.ndarray:
        """The ids of `needs()`, without building a Need each (a million of them in a large cluster)."""
        ids: list[int] = []
        for t in self.topics.values():
            ids += [li.ledger_id for li in t.managed_ledger.ledgers if not li.gone_on_purpose]
            for c in t.cursors.values():
                ids += [lid for lid in (c.ledger_id, c.compacted_ledger) if lid is not None and lid >= 0]
        for s in self.schemas.values():
            ids += [lid for _, lid in s.versions]
        return np.array(ids, dtype=np.int64)

    def closed_counts(self) -> tuple[list[TopicRecord], np.ndarray, np.ndarray]:
        """Every ledger the record gives entries for (closed by its broker) and BookKeeper still holds (not
        offloaded and deleted): the topics in order, and per ledger its topic's index, its id and its entries."""
        topics = list(self.topics.values())
        rows = [(i, li.ledger_id, li.entries) for i, t in enumerate(topics) for li in t.managed_ledger.ledgers
                if li.entries is not None and not li.gone_on_purpose]
        a = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return topics, a[:, 0], a[:, 1:]

    def named(self) -> dict[int, Need]:
        """Ledger id -> the first need naming it."""
        out: dict[int, Need] = {}
        for n in self.needs():
            out.setdefault(n.ledger_id, n)
        return out

    def owners(self) -> dict[int, Owner]:
        return {lid: n.owner for lid, n in self.named().items()}

    @property
    def offloaded(self) -> frozenset[int]:
        """Ledgers offloaded to tiered storage and deleted from BookKeeper: no longer BookKeeper's."""
        return frozenset(li.ledger_id for t in self.topics.values() for li in t.managed_ledger.ledgers
                         if li.gone_on_purpose)

    @functools.cached_property
    def _by_topic(self) -> dict[str, TopicRecord]:
        out: dict[str, TopicRecord] = {}
        for t in self.topics.values():
            out.setdefault(t.topic, t)
        return out

    def topic(self, topic: str) -> TopicRecord | None:
        """By topic name (the record's keys are managed-ledger names): one lookup, for a phase that asks per topic."""
        return self._by_topic.get(topic)

    def topic_ledgers(self, topic: str) -> set[int]:
        """The ledgers a topic's record names (data, cursors, compacted; not its schema's, shared by partitions)."""
        found = self.topic(topic)
        return {n.ledger_id for n in found.needs()} if found else set()

    def schema_of(self, topic: str) -> SchemaRecord | None:
        return self.schemas.get(schema_id_of(topic))
