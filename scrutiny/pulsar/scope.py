"""A Pulsar tenant or namespace (`tenant/namespace`): the part of a cluster its operator answers for, and which
topics, and which ledgers' owners, are in it. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from scrutiny.errors import MetadataError
from scrutiny.pulsar.owners import PULSAR_KINDS, Owner, topic_of_owner

_NAME = re.compile(r"[-=:.\w]+")  # what Pulsar's NamedEntity allows in a tenant's or a namespace's name
KINDS = {"tenant": 1, "namespace": 2}  # how many names, joined by `/`


def is_scope(text: str, kind: str) -> bool:
    names = text.split("/")
    return len(names) == KINDS[kind] and all(_NAME.fullmatch(n) for n in names)


@dataclass(frozen=True)
class Scope:
    kind: str  # tenant | namespace
    name: str  # tenant, or tenant/namespace

    @classmethod
    def of(cls, kind: str, text: str) -> Scope:
        name = text.strip()
        if not is_scope(name, kind):
            want = "a tenant's name (no /)" if kind == "tenant" else "tenant/namespace"
            raise MetadataError(f"{name!r} is not {want}: Pulsar's names are letters, digits and - _ = : .")
        return cls(kind, name)

    def holds(self, topic: str) -> bool:
        """A topic (persistent://tenant/namespace/name) of this tenant or namespace."""
        return topic.startswith(f"persistent://{self.name}/")

    def owns(self, owner: Owner | None) -> bool:
        """A ledger of this owner belongs to a topic of this tenant or namespace (its data, a cursor, its
        compacted topic, a schema version)."""
        return owner is not None and owner.kind in PULSAR_KINDS and self.holds(topic_of_owner(owner))
