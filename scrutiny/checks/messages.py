"""Pulsar's own stamps on its entries, read by the deep scrub: a message whose Pulsar checksum fails on a
copy whose BookKeeper digest is good was corrupted before BookKeeper stored it, and every consumer will
reject it. Pure."""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np

from scrutiny.categories import Category
from scrutiny.checks.deep import DeepAnswer
from scrutiny.checks.violation import Violation, id_ranges
from scrutiny.metadata import LedgerMetadata
from scrutiny.pulsar.entry import Stamp
from scrutiny.pulsar.owners import owner_from_custom_metadata

MAX_NAMED_MESSAGES = 10


def _data_topic(md: LedgerMetadata) -> str | None:
    """The topic whose data the ledger holds, if Pulsar created it so (not a cursor's, a schema's or a
    compacted one's)."""
    owner = owner_from_custom_metadata(md.custom_metadata)
    return owner.name if owner is not None and owner.kind == "topic" else None


def holds_messages(md: LedgerMetadata) -> bool:
    return _data_topic(md) is not None


def deep_slice_key(md: LedgerMetadata) -> int:
    """What puts a ledger in a deep pass's slice: a topic's data ledgers go together (their messages are
    validated in order, in the run that scrubs them), every other ledger by its id."""
    topic = _data_topic(md)
    return zlib.crc32(topic.encode()) if topic is not None else md.ledger_id


def check_checksums(md: LedgerMetadata, deep: Mapping[str, DeepAnswer]) -> list[Violation]:
    """PULSAR_CHECKSUM_MISMATCH: entries whose verified copy (BookKeeper's digest good) carries a Pulsar
    CRC32C that does not match its message."""
    copies: dict[str, dict[str, object]] = {}
    named: dict[int, dict[str, object]] = {}
    for bookie, answer in sorted(deep.items()):
        env = answer.envelopes
        if env is None:
            continue
        bad = env.stamped(Stamp.CHECKSUM_BAD)
        if not bad.any():
            continue
        ids = env.entry_ids[bad]
        copies[bookie] = {"entries": id_ranges(ids), "count": int(ids.size), "example": env.first_problem}
        for i in np.flatnonzero(bad)[:MAX_NAMED_MESSAGES]:
            who = int(env.producer[i])
            named.setdefault(int(env.entry_ids[i]), {
                "entry_id": int(env.entry_ids[i]), "producer": env.producers[who] if who >= 0 else "",
                "sequence_ids": [int(env.first_sequence_ids[i]), int(env.last_sequence_ids[i])]})
    if not copies:
        return []
    messages = [named[e] for e in sorted(named)][:MAX_NAMED_MESSAGES]
    return [Violation(Category.PULSAR_CHECKSUM_MISMATCH, md.ledger_id, tuple(copies),
                      {"copies": copies, "messages": messages}, md.znode_version)]
