"""Pulsar's records encoded as Pulsar's brokers encode them, for the test tooling, the soaks and the demo
(never for a real cluster: scrutiny writes nothing of Pulsar's)."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

import google_crc32c

from scrutiny.pulsar import managed_ledger_pb2 as mlpb
from scrutiny.pulsar import pulsar_api_pb2 as apipb
from scrutiny.pulsar import schema_storage_pb2 as schemapb
from scrutiny.pulsar.codec import compressed, packed
from scrutiny.pulsar.entry import BROKER_ENTRY_MAGIC, CHECKSUM_MAGIC, MARKER_PRODUCER
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


def position_entry(mark_delete: Position, properties: Mapping[str, int] | None = None) -> bytes:
    """An entry of a cursor's ledger: its position (`PositionInfo`) each time the broker persists it."""
    info = mlpb.PositionInfo(ledgerId=mark_delete.ledger_id, entryId=mark_delete.entry_id)
    for k, v in (properties or {}).items():
        info.properties.add(name=k, value=v)
    return info.SerializeToString()


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


def message(producer: str, sequence_id: int, payloads: Sequence[bytes] = (b"m",), *, batch: bool | None = None,
            highest_sequence_id: int | None = None, compression: str = "NONE", encrypted: bool = False,
            broker_entry: tuple[int, int] | None = None, checksum: bool = True, corrupt: bool = False,
            chunk: tuple[int, int] | None = None, marker_type: int | None = None,
            transaction: tuple[int, int] | None = None, replicated_from: str = "") -> bytes:
    """One entry as a Pulsar broker stores it: one message, or a batch of `payloads` (each a single message
    with its own metadata); optionally compressed or (in form) encrypted, with the broker's entry metadata
    (timestamp, index), with or without Pulsar's checksum (`corrupt`: a byte flipped after it was taken),
    one chunk (chunk id, chunks), a marker or a transaction's message."""
    batch = len(payloads) > 1 if batch is None else batch
    meta = apipb.MessageMetadata(producer_name=producer, sequence_id=sequence_id, publish_time=1_700_000_000_000)
    if batch:
        meta.num_messages_in_batch = len(payloads)
        body = b"".join(_single(p, sequence_id + i) for i, p in enumerate(payloads))
        last = sequence_id + len(payloads) - 1
        meta.highest_sequence_id = last if highest_sequence_id is None else highest_sequence_id
    else:
        body = payloads[0]
    if compression != "NONE":
        meta.compression = apipb.CompressionType.Value(compression)  # type: ignore[assignment]
        meta.uncompressed_size = len(body)
        body = packed(body, compression)
    if encrypted:
        meta.encryption_keys.add(key="app-key", value=b"\x01" * 16)
        meta.encryption_algo, meta.encryption_param = "RSA", b"\x02" * 12
        body = bytes(b ^ 0x5A for b in body)
    if chunk is not None:
        meta.chunk_id, meta.num_chunks_from_msg = chunk
        meta.uuid, meta.total_chunk_msg_size = f"{producer}-{sequence_id}", len(body) * chunk[1]
    if marker_type is not None:
        meta.producer_name, meta.sequence_id, meta.marker_type = MARKER_PRODUCER, 0, marker_type
    if transaction is not None:
        meta.txnid_most_bits, meta.txnid_least_bits = transaction
    if replicated_from:
        meta.replicated_from = replicated_from
    head = meta.SerializeToString()
    framed = struct.pack(">I", len(head)) + head + body
    if checksum:
        crc = google_crc32c.value(framed)
        if corrupt:
            framed = framed[:-1] + bytes([framed[-1] ^ 0xFF])
        framed = struct.pack(">HI", CHECKSUM_MAGIC, crc) + framed
    if broker_entry is not None:
        bem = apipb.BrokerEntryMetadata(broker_timestamp=broker_entry[0], index=broker_entry[1]).SerializeToString()
        framed = struct.pack(">HI", BROKER_ENTRY_MAGIC, len(bem)) + bem + framed
    return framed


def _single(payload: bytes, sequence_id: int) -> bytes:
    single = apipb.SingleMessageMetadata(payload_size=len(payload), sequence_id=sequence_id).SerializeToString()
    return struct.pack(">I", len(single)) + single + payload

