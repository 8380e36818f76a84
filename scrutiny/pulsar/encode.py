"""Pulsar's records encoded as Pulsar's brokers encode them, for the test tooling, the soaks and the demo
(never for a real cluster: scrutiny writes nothing of Pulsar's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scrutiny.pulsar import managed_ledger_pb2 as mlpb
from scrutiny.pulsar import schema_storage_pb2 as schemapb
from scrutiny.pulsar.codec import compressed
from scrutiny.pulsar.records import COMPACTED_LEDGER_PROPERTY, LedgerInfo, Position, managed_ledger_of, url_encoded


def managed_ledger(ledgers: Iterable[LedgerInfo | int], compression: str = "NONE",
                   terminated: Position | None = None) -> bytes:
    """A `ManagedLedgerInfo`; a bare id is a closed ledger of 10 entries and 1000 bytes."""
    info = mlpb.ManagedLedgerInfo()
    for li in ledgers:
        if isinstance(li, int):
            li = LedgerInfo(li, 10, 1000)
        out = info.ledgerInfo.add(ledgerId=li.ledger_id, timestamp=1 if li.entries is not None else 0)
        if li.entries is not None:
            out.entries = li.entries
        if li.size is not None:
            out.size = li.size
        if li.offloaded or li.bookkeeper_deleted:
            out.offloadContext.complete = li.offloaded
            out.offloadContext.bookkeeperDeleted = li.bookkeeper_deleted
    if terminated is not None:
        info.terminatedPosition.ledgerId, info.terminatedPosition.entryId = terminated
    return compressed(info.SerializeToString(), compression)


def cursor(ledger_id: int = -1, mark_delete: Position | None = None,
           acknowledged: Iterable[tuple[Position, Position]] = (), properties: Mapping[str, int] | None = None,
           compression: str = "NONE") -> bytes:
    """A `ManagedCursorInfo`: its position in `ledger_id`, or inline when that is -1."""
    info = mlpb.ManagedCursorInfo(cursorsLedgerId=ledger_id)
    if mark_delete is not None:
        info.markDeleteLedgerId, info.markDeleteEntryId = mark_delete
    for lower, upper in acknowledged:
        r = info.individualDeletedMessages.add()
        r.lowerEndpoint.ledgerId, r.lowerEndpoint.entryId = lower
        r.upperEndpoint.ledgerId, r.upperEndpoint.entryId = upper
    for k, v in (properties or {}).items():
        info.properties.add(name=k, value=v)
    return compressed(info.SerializeToString(), compression)


def compaction_cursor(compacted_ledger: int, mark_delete: Position | None = None) -> bytes:
    return cursor(-1, mark_delete, properties={COMPACTED_LEDGER_PROPERTY: compacted_ledger})


def schema_locator(versions: Iterable[tuple[int, int]]) -> bytes:
    """A `SchemaLocator` of (version, ledger id) pairs, the latest as its `info`."""
    locator = schemapb.SchemaLocator()
    for version, lid in versions:
        entry = locator.index.add(version=version, hash=b"h%d" % version)
        entry.position.ledgerId, entry.position.entryId = lid, 0
        locator.info.CopyFrom(entry)
    return locator.SerializeToString()


def cursor_node(subscription: str) -> str:
    """A cursor's node name, as Pulsar encodes the subscription (`#` as %23)."""
    return url_encoded(subscription)


def ledger_keys(kind: str, topic: str = "", cursor: str = "", schema_id: str = "") -> tuple[tuple[str, bytes], ...]:
    """The custom metadata Pulsar's `LedgerMetadataUtils` puts on a ledger it creates for a topic's data
    (`kind` "topic"), a cursor, a compaction ("compacted-topic") or a schema."""
    app = ("application", b"pulsar")
    if kind in ("topic", "cursor"):
        data = (app, ("component", b"managed-ledger"), ("pulsar/managed-ledger", managed_ledger_of(topic).encode()))
        return (*data, ("pulsar/cursor", cursor.encode())) if kind == "cursor" else data
    if kind == "compacted-topic":
        return (app, ("component", b"compacted-ledger"), ("pulsar/compactedTopic", topic.encode()),
                ("pulsar/compactedTo", b"-1:-1"))
    return (app, ("component", b"schema"), ("pulsar/schemaId", schema_id.encode()))
