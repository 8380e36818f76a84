"""Pulsar's records of a topic, decoded: the managed ledger (its ledgers, as `ManagedLedgerInfo` lists
them), its cursors (`ManagedCursorInfo`) and the topic's schema (`SchemaLocator`). Each `from_node` takes
the stored bytes as Pulsar writes them (binary proto2, optionally behind the compression header; 0 bytes
just after creation; the protobuf text format of clusters older than 2017) and raises MetadataError naming
the record and what is wrong. Pure."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from google.protobuf import text_format
from google.protobuf.message import DecodeError, Message

from scrutiny.errors import MetadataError
from scrutiny.pulsar import managed_ledger_pb2 as mlpb
from scrutiny.pulsar import schema_storage_pb2 as schemapb
from scrutiny.pulsar.codec import uncompressed

COMPACTION_CURSOR = "__compaction"
COMPACTED_LEDGER_PROPERTY = "CompactedTopicLedger"


def url_encoded(name: str) -> str:
    """As Pulsar's `Codec.encode` (Java's URLEncoder) encodes a topic's local name or a cursor's."""
    return urllib.parse.quote_plus(name, safe="*")


def url_decoded(name: str) -> str:
    return urllib.parse.unquote_plus(name)


def topic_of(managed_ledger: str) -> str:
    """`tenant/namespace/persistent/<url-encoded>` (or the v1 `property/cluster/namespace/persistent/
    <name>`) as `persistent://tenant/namespace/<name>`; anything else as it is."""
    parts = managed_ledger.split("/")
    if len(parts) in (4, 5) and parts[-2] == "persistent":
        return f"persistent://{'/'.join(parts[:-2])}/{urllib.parse.unquote_plus(parts[-1])}"
    return managed_ledger


def managed_ledger_of(topic: str) -> str:
    """The inverse of `topic_of`: the managed ledger's name (its node under /managed-ledgers)."""
    if not topic.startswith("persistent://"):
        raise MetadataError(f"topic {topic!r} is not persistent://tenant/namespace/name")
    parts = topic.removeprefix("persistent://").split("/")
    if len(parts) not in (3, 4) or not all(parts):
        raise MetadataError(f"topic {topic!r} is not persistent://tenant/namespace/name")
    return "/".join([*parts[:-1], "persistent", url_encoded(parts[-1])])


def schema_id_of(topic: str) -> str:
    """The topic's schema id (`TopicName.getSchemaName`): tenant/namespace/name, without a partition suffix."""
    name = topic.removeprefix("persistent://")
    base, sep, index = name.rpartition("-partition-")
    return base if sep and index.isdigit() else name


def topic_of_path(managed_ledgers_root: str, schemas_root: str, path: str) -> str | None:
    """The topic a record's node concerns (a managed ledger, one of its cursors, a schema: the topic of that
    schema id); None for the nodes above them (tenants, namespaces, domains)."""
    if path.startswith(managed_ledgers_root + "/"):
        parts = path[len(managed_ledgers_root) + 1:].split("/")
        for at in (2, 3):  # tenant/ns/persistent/<topic>, or the v1 property/cluster/ns/persistent/<topic>
            if len(parts) > at + 1 and parts[at] == "persistent":
                return topic_of("/".join(parts[:at + 2]))
        return None
    if path.startswith(schemas_root + "/"):
        parts = path[len(schemas_root) + 1:].split("/")
        return f"persistent://{'/'.join(parts)}" if len(parts) == 3 and all(parts) else None
    return None


_PRINTABLE = bytes(range(32, 127)) + b"\t\n\r"
M = TypeVar("M", bound=Message)


def _parsed(message: M, where: str, data: bytes) -> M:
    """Binary proto2 (its first byte a field tag, never a letter), or the text format of the oldest
    clusters (a field name first, printable throughout)."""
    body = uncompressed(where, data)
    try:
        if body[:1].isalpha() and not body.translate(None, _PRINTABLE):
            text_format.Parse(body.decode(), message, allow_unknown_field=True)
        else:
            message.ParseFromString(body)
    except (DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        raise MetadataError(f"{where}: undecodable {type(message).__name__}: {exc}") from None
    return message


class Position(NamedTuple):
    ledger_id: int
    entry_id: int  # -1: before the ledger's first entry

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> Position | None:
        """`str`'s inverse; None when `text` is no position."""
        ledger_id, _, entry_id = text.partition(":")
        try:
            return cls(int(ledger_id), int(entry_id))
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """One ledger as the managed ledger lists it. `entries` and `size` are set when the broker closed it;
    the open head ledger (and one in recovery) has neither."""

    ledger_id: int
    entries: int | None = None
    size: int | None = None
    offloaded: bool = False  # offloadContext.complete: a copy is in tiered storage
    bookkeeper_deleted: bool = False  # offloadContext.bookkeeperDeleted: BookKeeper's copy deleted on purpose

    @property
    def gone_on_purpose(self) -> bool:
        """Offloaded and deleted from BookKeeper after the deletion lag: not BookKeeper's any more."""
        return self.offloaded and self.bookkeeper_deleted


@dataclass(frozen=True)
class ManagedLedgerRecord:
    name: str  # below /managed-ledgers: tenant/namespace/persistent/<encoded local name>
    ledgers: tuple[LedgerInfo, ...] = ()
    terminated: Position | None = None  # terminatedPosition: nothing more is written

    @property
    def topic(self) -> str:
        return topic_of(self.name)

    @property
    def head(self) -> LedgerInfo | None:
        """The ledger the broker writes to: the last one, while the record gives it no entries yet."""
        return self.ledgers[-1] if self.ledgers and self.ledgers[-1].entries is None else None

    @classmethod
    def from_node(cls, name: str, data: bytes) -> ManagedLedgerRecord:
        if not data:  # createIfMissing writes 0 bytes first
            return cls(name)
        info = _parsed(mlpb.ManagedLedgerInfo(), f"managed ledger {name}", data)
        ledgers = tuple(LedgerInfo(li.ledgerId, li.entries if li.HasField("entries") else None,
                                   li.size if li.HasField("size") else None, li.offloadContext.complete,
                                   li.offloadContext.bookkeeperDeleted) for li in info.ledgerInfo)
        end = info.terminatedPosition
        return cls(name, ledgers, Position(end.ledgerId, end.entryId) if info.HasField("terminatedPosition") else None)


@dataclass(frozen=True)
class CursorRecord:
    """A subscription's cursor. Its position is inline when `ledger_id` is -1; else it is in that BookKeeper
    ledger, and the record holds none of it (`mark_delete` None)."""

    name: str  # the subscription (decoded; %23 in the node's name is #)
    ledger_id: int = -1
    mark_delete: Position | None = None
    acknowledged: tuple[tuple[Position, Position], ...] = ()  # individually, past the mark-delete: (lower, upper]
    properties: Mapping[str, int] = field(default_factory=dict)

    @property
    def compacted_ledger(self) -> int | None:
        """The compacted ledger the compaction cursor names."""
        if self.name != COMPACTION_CURSOR:
            return None
        return self.properties.get(COMPACTED_LEDGER_PROPERTY)

    def positions(self) -> list[tuple[str, Position]]:
        """Every position the record says was acknowledged: the mark-delete and each range's last entry."""
        out = [("mark-delete", self.mark_delete)] if self.mark_delete is not None else []
        return out + [(f"acknowledged ({lower}..{upper}]", upper) for lower, upper in self.acknowledged]

    @classmethod
    def from_node(cls, where: str, name: str, data: bytes) -> CursorRecord:
        if not data:
            return cls(name)
        info = _parsed(mlpb.ManagedCursorInfo(), f"cursor {where}", data)
        ledger_id = info.cursorsLedgerId if info.HasField("cursorsLedgerId") else -1
        props = {p.name: p.value for p in info.properties}
        if ledger_id >= 0:  # the position is the ledger's last entry: whatever the record holds is older
            return cls(name, ledger_id, properties=props)
        mark = (Position(info.markDeleteLedgerId, info.markDeleteEntryId)
                if info.HasField("markDeleteLedgerId") else None)
        ranges = tuple((Position(r.lowerEndpoint.ledgerId, r.lowerEndpoint.entryId),
                        Position(r.upperEndpoint.ledgerId, r.upperEndpoint.entryId))
                       for r in info.individualDeletedMessages)
        return cls(name, ledger_id, mark, ranges, props)


def position_entry(where: str, data: bytes) -> tuple[Position, dict[str, int]]:
    """A cursor's position as its ledger's entry holds it (`PositionInfo`): the mark-delete, its properties."""
    info = _parsed(mlpb.PositionInfo(), where, data)
    if not info.HasField("ledgerId") or not info.HasField("entryId"):
        raise MetadataError(f"{where}: a PositionInfo without its position")
    return Position(info.ledgerId, info.entryId), {p.name: p.value for p in info.properties}


@dataclass(frozen=True)
class SchemaRecord:
    schema_id: str  # tenant/namespace/topic
    versions: tuple[tuple[int, int], ...] = ()  # (version, ledger id), the latest last

    @classmethod
    def from_node(cls, schema_id: str, data: bytes) -> SchemaRecord:
        if not data:
            return cls(schema_id)
        locator: Any = _parsed(schemapb.SchemaLocator(), f"schema {schema_id}", data)
        seen = {e.version: e.position.ledgerId for e in locator.index}
        if locator.HasField("info"):
            seen.setdefault(locator.info.version, locator.info.position.ledgerId)
        return cls(schema_id, tuple((v, lid) for v, lid in sorted(seen.items()) if lid >= 0))
