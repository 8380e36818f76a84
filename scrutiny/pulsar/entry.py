"""A Pulsar entry as its broker stores it in BookKeeper, read for what data integrity validation needs: who
sent it, which sequence ids it carries, and whether Pulsar's own checksum holds. All big-endian:

    optional  0x0e02 | u32 size | BrokerEntryMetadata          (brokerEntryMetadataInterceptors)
    optional  0x0e01 | u32 CRC32C over everything after it      (every client since protocol v6)
              u32 size | MessageMetadata | payload

Only the envelope is read: a payload (batched, compressed or encrypted) is checked by the checksum, never
opened (`../shared/spec/pulsar-and-repair.md` 2). Pure."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import google_crc32c
import numpy as np
from google.protobuf.message import DecodeError

from scrutiny.pulsar import pulsar_api_pb2 as apipb

BROKER_ENTRY_MAGIC = 0x0E02
CHECKSUM_MAGIC = 0x0E01
MARKER_PRODUCER = "pulsar.marker"  # Markers.java: replicated-subscription and transaction markers
_MAGIC = struct.Struct(">H")
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


class Envelope(NamedTuple):
    """One stored entry, in brief."""

    producer: str
    first_sequence_id: int
    last_sequence_id: int
    messages: int
    stamps: Stamp
    detail: str = ""  # why UNREADABLE or CHECKSUM_BAD

    @property
    def is_message(self) -> bool:
        return not self.stamps & Stamp.UNREADABLE


def unreadable(detail: str, stamps: Stamp) -> Envelope:
    return Envelope("", -1, -1, 0, stamps | Stamp.UNREADABLE, detail)


def read_envelope(data: bytes) -> Envelope:
    """The envelope of one entry's payload (BookKeeper's header and digest removed)."""
    at = 0
    stamps = Stamp(0)
    try:
        if len(data) >= 2 and _MAGIC.unpack_from(data, 0)[0] == BROKER_ENTRY_MAGIC:
            (size,) = _U32.unpack_from(data, 2)
            at = 6 + size
            stamps |= Stamp.BROKER_ENTRY
        checksum_bad = ""
        if len(data) >= at + 2 and _MAGIC.unpack_from(data, at)[0] == CHECKSUM_MAGIC:
            (stored,) = _U32.unpack_from(data, at + 2)
            at += 6
            stamps |= Stamp.CHECKSUM
            computed = google_crc32c.value(data[at:])
            if computed != stored:
                stamps |= Stamp.CHECKSUM_BAD
                checksum_bad = f"Pulsar's CRC32C is {computed:08x}, the entry says {stored:08x}"
        (size,) = _U32.unpack_from(data, at)
        if size > _MAX_METADATA or at + 4 + size > len(data):
            return unreadable(f"a metadata size of {size} in {len(data)} bytes", stamps)
        meta = apipb.MessageMetadata()
        meta.ParseFromString(data[at + 4:at + 4 + size])
    except struct.error:
        return unreadable(f"{len(data)} bytes: shorter than a message's envelope", stamps)
    except DecodeError as exc:
        return unreadable(f"MessageMetadata: {exc}", stamps)
    if not meta.HasField("producer_name") or not meta.HasField("sequence_id"):
        return unreadable("MessageMetadata without producer_name or sequence_id", stamps)
    stamps |= _stamps_of(meta)
    n = max(meta.num_messages_in_batch, 1)
    last = meta.highest_sequence_id if meta.highest_sequence_id > meta.sequence_id else meta.sequence_id + n - 1
    return Envelope(meta.producer_name, _signed(meta.sequence_id), _signed(last), n, stamps, checksum_bad)


def _signed(sequence_id: int) -> int:
    """As Pulsar's Java code holds it (a long)."""
    return sequence_id - (1 << 64) if sequence_id >= 1 << 63 else sequence_id


def _stamps_of(meta: apipb.MessageMetadata) -> Stamp:
    stamps = Stamp(0)
    if meta.HasField("marker_type") or meta.producer_name == MARKER_PRODUCER:
        stamps |= Stamp.MARKER
    if meta.num_chunks_from_msg > 1:
        stamps |= Stamp.CHUNK
    if meta.HasField("txnid_most_bits") or meta.HasField("txnid_least_bits"):
        stamps |= Stamp.TRANSACTION
    if meta.HasField("replicated_from"):
        stamps |= Stamp.REPLICATED
    if meta.compression != apipb.NONE:
        stamps |= Stamp.COMPRESSED
    if meta.encryption_keys:
        stamps |= Stamp.ENCRYPTED
    return stamps



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

    @staticmethod
    def gather(read: Iterable[tuple[int, Envelope]]) -> LedgerEnvelopes:
        names: dict[str, int] = {}
        rows = []
        problem = ""
        for eid, env in read:
            who = names.setdefault(env.producer, len(names)) if env.is_message else -1
            rows.append((eid, who, env.first_sequence_id, env.last_sequence_id, env.messages, int(env.stamps)))
            if env.detail and not problem:
                problem = f"entry {eid}: {env.detail}"
        return LedgerEnvelopes.of_columns(tuple(names), list(zip(*rows, strict=True)) or [()] * 6, problem)

    @staticmethod
    def of_columns(producers: tuple[str, ...], cols: Sequence[Sequence[int]], first_problem: str) -> LedgerEnvelopes:
        """From the six columns in the fields' order."""
        ids, who, first, last, messages, stamps = (np.array(c, dtype=t) for c, t in zip(cols, _TYPES, strict=True))
        return LedgerEnvelopes(producers, ids, who, first, last, messages, stamps, first_problem)

    def stamped(self, stamp: Stamp) -> np.ndarray:
        """A mask of the entries with `stamp`."""
        return (self.stamps & np.uint32(stamp)) != 0
