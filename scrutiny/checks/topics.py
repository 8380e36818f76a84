"""Pulsar's record held against BookKeeper's, both ways (`docs/formats.md` 19):

- a ledger a topic needs (data, cursor, schema, compacted) that BookKeeper lacks;
- a cursor whose mark-delete or acknowledged range is where the topic has nothing;
- a closed ledger's entries in the record that differ from BookKeeper's lastEntryId + 1;
- the record's open head ledger closed in BookKeeper, an error when later facts show the broker wrote on;
- ledgers Pulsar created that nothing names any more (leaked), once older than a grace.

Pure: the record and BookKeeper's ledgers are read (and read again) by `scrutiny.scan.topics`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from scrutiny.categories import Category
from scrutiny.checks.violation import Violation
from scrutiny.pulsar.ledgers import BookKeeperLedgers, LedgerFact
from scrutiny.pulsar.owners import Owner
from scrutiny.pulsar.snapshot import Need, PulsarRecord, TopicRecord
from scrutiny.pulsar.transactions import transaction_depends, transaction_role

_DEPENDS = {
    "data": "the topic's entries in it: the topic cannot load, or its consumers stall at this ledger",
    "cursor": "the subscription's position: the cursor cannot be recovered",
    "compacted": "the topic's compacted view: compacted reads fail",
    "schema": "this schema version: producers and consumers using it fail",
}


def check_topics(record: PulsarRecord, bookkeeper: BookKeeperLedgers) -> list[Violation]:
    """Every finding of the record against BookKeeper's ledgers, but leaks (`leaked`). Columns where a
    cluster has millions of ledgers; a Python object only for what is found."""
    needed = record.needed_ids()
    absent = set(needed[bookkeeper.positions(needed) < 0].tolist())
    out = [missing(n) for n in record.needs() if n.ledger_id in absent] if absent else []
    out += entry_counts(record, bookkeeper)
    for topic in record.topics.values():
        out += cursor_positions(topic)
        out += head_closed(topic, bookkeeper)
    return out


def missing(need: Need) -> Violation:
    """A ledger the record needs and BookKeeper lacks, with what depended on it (a transaction's log or snapshot
    in a data ledger of Pulsar's own)."""
    role = transaction_role(need.topic) if need.kind == "data" else {}
    depends = transaction_depends(role) if role else _DEPENDS[need.kind]
    return Violation(Category.TOPIC_LEDGER_MISSING, need.ledger_id,
                     details={**need.to_json(), **role, "depends": depends}, owner=need.owner)


def _acknowledged(topic: TopicRecord) -> Iterator[tuple[str, str, Any]]:
    """(subscription, what, position) of every position the cursors' records hold, the ledger form's none."""
    for c in topic.cursors.values():
        for what, pos in c.positions():
            if pos.entry_id >= 0:  # L:-1 is before L's first entry: it says nothing was acknowledged there
                yield c.name, what, pos


def cursor_positions(topic: TopicRecord) -> list[Violation]:
    """Positions in a ledger the topic does not list (and that is not below its first: trimmed), or past a
    closed ledger's entries as the record counts them (past a closed head: `head_closed`)."""
    listed = {li.ledger_id: li for li in topic.managed_ledger.ledgers}
    if not listed:
        return []
    first = min(listed)
    found: dict[int, list[dict[str, Any]]] = {}
    for sub, what, pos in _acknowledged(topic):
        li = listed.get(pos.ledger_id)
        if li is None and pos.ledger_id > first:
            reason = f"ledger {pos.ledger_id} is not among the topic's ledgers ({first} .. {max(listed)})"
        elif li is not None and li.entries is not None and pos.entry_id >= li.entries:
            reason = f"the topic's record gives ledger {pos.ledger_id} {li.entries} entries (0 .. {li.entries - 1})"
        else:
            continue
        found.setdefault(pos.ledger_id, []).append({"subscription": sub, "position": str(pos), "what": what,
                                                    "reason": reason})
    return [Violation(Category.CURSOR_POSITION_NOT_IN_TOPIC, lid, details={"topic": topic.topic, "positions": ps},
                      owner=Owner("topic", topic.topic)) for lid, ps in sorted(found.items())]


def entry_counts(record: PulsarRecord, bookkeeper: BookKeeperLedgers) -> list[Violation]:
    """A closed ledger whose entries in the record differ from BookKeeper's lastEntryId + 1 (where BookKeeper
    has it closed: one still in recovery has no count yet)."""
    topics, index, counts = record.closed_counts()
    theirs = bookkeeper.closed_entries(bookkeeper.positions(counts[:, 0]))
    out = []
    for i in np.flatnonzero((theirs >= 0) & (theirs != counts[:, 1])).tolist():
        topic = topics[int(index[i])].topic
        out.append(Violation(Category.TOPIC_ENTRY_COUNT_MISMATCH, int(counts[i, 0]), details={
            "topic": topic, "record_entries": int(counts[i, 1]), "bookkeeper_entries": int(theirs[i]),
            "bookkeeper_last_entry_id": int(theirs[i]) - 1}, owner=Owner("topic", topic)))
    return out


def head_closed(topic: TopicRecord, bookkeeper: BookKeeperLedgers) -> list[Violation]:
    """The head the record keeps open, closed in BookKeeper. A graceful unload closes an idle topic's head the
    same way without updating the record: an error only when later facts show the broker wrote on."""
    head = topic.managed_ledger.head
    if head is None or topic.managed_ledger.terminated is not None:
        return []
    fact = bookkeeper.get(head.ledger_id)
    if fact is None or not fact.closed:
        return []
    evidence = [f"subscription {sub}: {what} at {pos}, past the close at entry {fact.last_entry_id}"
                for sub, what, pos in _acknowledged(topic)
                if pos.ledger_id == head.ledger_id and pos.entry_id > fact.last_entry_id]
    evidence += [f"ledger {later.ledger_id}, newer and the topic's by its keys, holds {later.last_entry_id + 1} "
                 "entries the record does not list"
                 for later in bookkeeper.of_owner("topic", topic.topic, above=head.ledger_id)
                 if later.closed and later.last_entry_id >= 0]
    category = Category.TOPIC_WRITTEN_PAST_CLOSED_HEAD if evidence else Category.TOPIC_HEAD_LEDGER_CLOSED
    return [Violation(category, head.ledger_id, details={
        "topic": topic.topic, "bookkeeper_last_entry_id": fact.last_entry_id, "evidence": evidence},
        owner=Owner("topic", topic.topic))]


def unnamed(record: PulsarRecord, bookkeeper: BookKeeperLedgers) -> list[LedgerFact]:
    """Ledgers Pulsar's keys say it created for a topic, a cursor, a compaction or a schema, that the whole
    record names nowhere (none when the record is some topics' only)."""
    if not record.whole:
        return []
    return bookkeeper.tagged_except(np.concatenate([record.needed_ids(),
                                                    np.fromiter(record.offloaded, dtype=np.int64)]))


def leaked(candidates: list[LedgerFact], now_ms: int, grace_seconds: int,
           unnamed_since: Mapping[int, int]) -> list[LedgerFact]:
    """Those older than the grace: by the ledger's ctime, or where there is none (etcd) since first seen
    unnamed (`unnamed_since`, kept across runs). A compacted ledger still open is being written by a
    compaction, which names it only when done: never a leak."""
    grace_ms = grace_seconds * 1000
    return [f for f in candidates if (f.closed or f.tag != "compacted-topic")
            and now_ms - (f.ctime_ms if f.ctime_ms >= 0 else unnamed_since.get(f.ledger_id, now_ms)) >= grace_ms]
