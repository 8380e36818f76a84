"""A Pulsar entry as its broker stores it in BookKeeper, read for what data integrity validation needs: who
sent it, which sequence ids it carries, and whether Pulsar's own checksum holds. All big-endian:

    optional  0x0e02 | u32 size | BrokerEntryMetadata          (brokerEntryMetadataInterceptors)
    optional  0x0e01 | u32 CRC32C over everything after it      (every client since protocol v6)
              u32 size | MessageMetadata | payload

Only the envelope is read: a payload (batched, compressed or encrypted) is checked by the checksum, never
opened (`docs/formats.md` 20). Pure."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import google_crc32c
import numpy as np
from google.protobuf.message import DecodeError

from scrutiny.pulsar import pulsar_api_pb2 as apipb

_MessageMetadata = apipb.MessageMetadata

BROKER_ENTRY_MAGIC = 0x0E02
CHECKSUM_MAGIC = 0x0E01
MARKER_PRODUCER = "pulsar.marker"  # Markers.java: replicated-subscription and transaction markers
_U32 = struct.Struct(">I")
_MAX_METADATA = 5 * 1024 * 1024  # Pulsar's largest frame: a size beyond is not a message


class Stamp(enum.IntFlag):
    """What an entry's envelope says besides its producer and ids (flags travel as one integer)."""

    CHECKSUM = 1  # it carries Pulsar's CRC32C
    CHECKSUM_BAD = 2  # ... and it does not match
    MARKER = 4
    CHUNK = 8  # one chunk of a chunked message: the chunks share the message's sequence id
    TRANSACTION = 16
    REPLICATED = 32  # ids are the origin cluster's producer's
    BROKER_ENTRY = 64
    COMPRESSED = 128
    ENCRYPTED = 256
    UNREADABLE = 512  # not a Pulsar message (a KoP entry in Kafka's format, say): never validated


# the flags as plain ints: an IntFlag's `|` costs as much as the rest of an entry's framing (bench/messages)
_BROKER_ENTRY, _CHECKSUM, _CHECKSUM_BAD = int(Stamp.BROKER_ENTRY), int(Stamp.CHECKSUM), int(Stamp.CHECKSUM_BAD)
_MARKER, _CHUNK, _TRANSACTION = int(Stamp.MARKER), int(Stamp.CHUNK), int(Stamp.TRANSACTION)
_REPLICATED, _COMPRESSED, _ENCRYPTED = int(Stamp.REPLICATED), int(Stamp.COMPRESSED), int(Stamp.ENCRYPTED)
_UNREADABLE = int(Stamp.UNREADABLE)
_BROKER_ENTRY_BYTES = struct.pack(">H", BROKER_ENTRY_MAGIC)
_CHECKSUM_BYTES = struct.pack(">H", CHECKSUM_MAGIC)


class Envelope(NamedTuple):
    """One stored entry, in brief."""

    producer: str
    first_sequence_id: int
    last_sequence_id: int
    messages: int  # a batch's; a chunked message counts at its last chunk
    stamps: int  # Stamp flags
    detail: str = ""  # why UNREADABLE or CHECKSUM_BAD
    transaction: tuple[int, int] | None = None  # a transaction's message or marker: its id (most, least bits)
    marker: int = 0  # a marker's type (MarkerType: TXN_COMMIT, TXN_ABORT, ...)

    @property
    def is_message(self) -> bool:
        return not self.stamps & _UNREADABLE


def unreadable(detail: str, stamps: int) -> Envelope:
    return Envelope("", -1, -1, 0, stamps | _UNREADABLE, detail)


# An entry's framing, read where it is stored (the agent): its stamps so far, the MessageMetadata's bytes
# (empty when the entry is no Pulsar message), and why not, or why its checksum failed. A plain tuple: the
# agent makes one an entry.
Framed = tuple[int, bytes, str]


_CHECKSUMMED = struct.Struct(">HII")  # the checksum's magic, the checksum, the metadata's size


def frame(data: bytes) -> Framed:
    """The framing of one entry's payload (BookKeeper's header and digest removed): the broker's entry metadata
    skipped, Pulsar's checksum verified, the message metadata cut out (not parsed: the agent's CPU is the
    bookie host's). The common entry (a checksum that holds, after the broker's metadata or not) is read in an
    unpack or two: per entry, this is most of what a deep scrub's Pulsar framing costs the agent
    (bench/messages)."""
    at, stamps = 0, _CHECKSUM
    if len(data) >= 10:
        magic, stored, size = _CHECKSUMMED.unpack_from(data)
        if magic == BROKER_ENTRY_MAGIC and stored + 16 <= len(data):
            at, stamps = 6 + stored, _CHECKSUM | _BROKER_ENTRY
            magic, stored, size = _CHECKSUMMED.unpack_from(data, at)
        start = at + 10
        if magic == CHECKSUM_MAGIC and size <= _MAX_METADATA and start + size <= len(data) \
                and google_crc32c.value(data[at + 6:]) == stored:
            return stamps, data[start:start + size], ""
    return framed(data)


def framed(data: bytes) -> Framed:
    """`frame` read step by step, every form: the reference its shortcut must agree with."""
    at = stamps = 0
    checksum_bad = ""
    try:
        if data.startswith(_BROKER_ENTRY_BYTES):
            at = 6 + _U32.unpack_from(data, 2)[0]
            stamps = _BROKER_ENTRY
        if data.startswith(_CHECKSUM_BYTES, at):
            stored = _U32.unpack_from(data, at + 2)[0]
            at += 6
            stamps |= _CHECKSUM
            computed = google_crc32c.value(data[at:])
            if computed != stored:
                stamps |= _CHECKSUM_BAD
                checksum_bad = f"Pulsar's CRC32C is {computed:08x}, the entry says {stored:08x}"
        size = _U32.unpack_from(data, at)[0]
    except struct.error:
        return stamps | _UNREADABLE, b"", f"{len(data)} bytes: shorter than a message's envelope"
    if size > _MAX_METADATA or at + 4 + size > len(data):
        return stamps | _UNREADABLE, b"", f"a metadata size of {size} in {len(data)} bytes"
    return stamps, data[at + 4:at + 4 + size], checksum_bad


def envelope(framed: Framed) -> Envelope:
    """An entry's envelope from its framing: the message metadata parsed."""
    stamps, metadata, detail = framed
    if stamps & _UNREADABLE:
        return unreadable(detail, stamps)
    try:
        meta = _MessageMetadata.FromString(metadata)
    except DecodeError as exc:
        return unreadable(f"MessageMetadata: {exc}", stamps)
    producer, first = meta.producer_name, meta.sequence_id
    if not producer or not meta.HasField("sequence_id"):
        return unreadable("MessageMetadata without producer_name or sequence_id", stamps)
    marker = 0
    if meta.HasField("marker_type") or producer == MARKER_PRODUCER:
        stamps |= _MARKER
        marker = meta.marker_type
    n = max(meta.num_messages_in_batch, 1)
    if meta.num_chunks_from_msg > 1:
        stamps |= _CHUNK
        n = int(meta.chunk_id == meta.num_chunks_from_msg - 1)  # one message, counted at its last chunk
    transaction = None
    if meta.HasField("txnid_most_bits"):
        stamps |= _TRANSACTION
        transaction = (meta.txnid_most_bits, meta.txnid_least_bits)
    if meta.replicated_from:
        stamps |= _REPLICATED
    if meta.compression:
        stamps |= _COMPRESSED
    if meta.encryption_keys:
        stamps |= _ENCRYPTED
    highest = meta.highest_sequence_id
    last = highest if highest > first else first + max(meta.num_messages_in_batch, 1) - 1
    if last >= 1 << 63:  # as Pulsar's Java code holds them (longs)
        first, last = (first - (1 << 64) if first >= 1 << 63 else first), last - (1 << 64)
    return Envelope(producer, first, last, n, stamps, detail, transaction, marker)


def read_envelope(data: bytes) -> Envelope:
    """The envelope of one entry's payload, framing and metadata."""
    return envelope(frame(data))


_TYPES = (np.int64, np.int32, np.int64, np.int64, np.int32, np.uint32)


@dataclass(frozen=True, eq=False)
class LedgerEnvelopes:
    """One copy's verified entries of a ledger, their envelopes in columns (entry ids ascending)."""

    producers: tuple[str, ...]
    entry_ids: np.ndarray  # int64
    producer: np.ndarray  # int32 index into producers; -1 when not a Pulsar message
    first_sequence_ids: np.ndarray  # int64
    last_sequence_ids: np.ndarray  # int64
    messages: np.ndarray  # int32
    stamps: np.ndarray  # uint32 (Stamp)
    first_problem: str = ""
    # the few entries of transactions, by entry id: (the transaction's most and least bits, the marker's type or 0)
    transactions: Mapping[int, tuple[int, int, int]] = field(default_factory=dict)

    @staticmethod
    def gather(read: Iterable[tuple[int, Envelope]], problem: str = "") -> LedgerEnvelopes:
        """Entries' envelopes in columns; `problem`, else the first entry's that has one, names what was wrong."""
        names: dict[str, int] = {}
        rows = []
        transactions = {}
        for eid, env in read:
            who = names.setdefault(env.producer, len(names)) if env.is_message else -1
            rows.append((eid, who, env.first_sequence_id, env.last_sequence_id, env.messages, int(env.stamps)))
            if env.transaction is not None:
                transactions[eid] = (*env.transaction, env.marker)
            if env.detail and not problem:
                problem = f"entry {eid}: {env.detail}"
        cols = list(zip(*rows, strict=True)) or [()] * 6
        ids, producer, first, last, messages, stamps = (np.array(c, dtype=t) for c, t in zip(cols, _TYPES,
                                                                                               strict=True))
        return LedgerEnvelopes(tuple(names), ids, producer, first, last, messages, stamps, problem, transactions)

    def stamped(self, stamp: Stamp) -> np.ndarray:
        """A mask of the entries with `stamp`."""
        return (self.stamps & np.uint32(int(stamp))) != 0
