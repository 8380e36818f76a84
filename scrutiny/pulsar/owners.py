"""Which Pulsar topic (or cursor, compacted topic, schema) a ledger belongs to, from the keys Pulsar puts
in the ledger's own custom metadata (`LedgerMetadataUtils`; `docs/formats.md` 13).
Pure."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrutiny.pulsar.records import topic_of

KINDS = ("topic", "cursor", "compacted-topic", "schema", "other", "unknown")
# Ledgers Pulsar created for a topic: a leak when nothing names them any more
PULSAR_KINDS = frozenset({"topic", "cursor", "compacted-topic", "schema"})


@dataclass(frozen=True, slots=True, order=True)
class Owner:
    kind: str  # one of KINDS
    name: str = ""  # a topic as persistent://tenant/namespace/name, a schema id, an application
    cursor: str = ""  # only for cursors

    def to_json(self) -> dict[str, str]:
        out = {"kind": self.kind, "name": self.name}
        if self.kind == "cursor":
            out["cursor"] = self.cursor
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Owner:
        return cls(str(doc.get("kind", "unknown")), str(doc.get("name", "")), str(doc.get("cursor", "")))


UNKNOWN = Owner("unknown")


@functools.lru_cache(maxsize=4096)  # every ledger of a topic (or cursor) carries the same keys
def owner_from_custom_metadata(custom: tuple[tuple[str, bytes], ...]) -> Owner | None:
    """Pulsar's keys in the ledger's own metadata; None when the ledger carries none (older Pulsar:
    look it up in Pulsar's record)."""
    keys = {k: v.decode("utf-8", "replace") for k, v in custom if k != "pulsar/compactedTo"}
    component = keys.get("component", "")
    if component == "managed-ledger" and "pulsar/managed-ledger" in keys:
        topic = topic_of(keys["pulsar/managed-ledger"])
        if "pulsar/cursor" in keys:
            return Owner("cursor", topic, keys["pulsar/cursor"])
        return Owner("topic", topic)
    if component == "compacted-ledger" and "pulsar/compactedTopic" in keys:
        return Owner("compacted-topic", keys["pulsar/compactedTopic"])
    if component == "schema" and "pulsar/schemaId" in keys:
        return Owner("schema", keys["pulsar/schemaId"])
    if "application" in keys:
        return Owner("other", keys["application"] + (f"/{component}" if component else ""))
    return None


def topic_of_owner(owner: Owner) -> str:
    """The topic whose records name a ledger of this owner (a schema's: the topic of its schema id)."""
    return f"persistent://{owner.name}" if owner.kind == "schema" else owner.name
