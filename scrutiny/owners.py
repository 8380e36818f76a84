"""Which Pulsar topic (or cursor, compacted topic, schema) a ledger belongs to: pure decoding of the
ledger's own custom metadata and of Pulsar's `/managed-ledgers` znodes (`../shared/spec/
bookkeeper-formats.md` 13). No I/O."""

from __future__ import annotations

import functools
import struct
import urllib.parse
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cramjam
from google.protobuf.message import DecodeError

from scrutiny.metadata import MetadataError
from scrutiny.pulsar import managed_ledger_pb2 as mlpb

KINDS = ("topic", "cursor", "compacted-topic", "schema", "other", "unknown")
COMPACTION_CURSOR = "__compaction"
COMPACTED_LEDGER_PROPERTY = "CompactedTopicLedger"
_MAGIC = b"\x47\x78"
_LEN = struct.Struct(">i")


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


def topic_of(managed_ledger: str) -> str:
    """`tenant/namespace/persistent/<url-encoded>` (or the v1 `property/cluster/namespace/persistent/
    <name>`) as `persistent://tenant/namespace/<name>`; anything else as it is."""
    parts = managed_ledger.split("/")
    if len(parts) in (4, 5) and parts[-2] == "persistent":
        return f"persistent://{'/'.join(parts[:-2])}/{urllib.parse.unquote(parts[-1])}"
    return managed_ledger


def managed_ledger_of(topic: str) -> str:
    """The inverse of `topic_of`: the managed ledger's name (its znode under /managed-ledgers)."""
    if not topic.startswith("persistent://"):
        raise MetadataError(f"topic {topic!r} is not persistent://tenant/namespace/name")
    parts = topic.removeprefix("persistent://").split("/")
    if len(parts) not in (3, 4) or not all(parts):
        raise MetadataError(f"topic {topic!r} is not persistent://tenant/namespace/name")
    return "/".join([*parts[:-1], "persistent", urllib.parse.quote(parts[-1], safe="")])


@functools.lru_cache(maxsize=4096)  # every ledger of a topic (or cursor) carries the same keys
def owner_from_custom_metadata(custom: tuple[tuple[str, bytes], ...]) -> Owner | None:
    """Pulsar's keys in the ledger's own metadata; None when the ledger carries none (older Pulsar:
    look it up in /managed-ledgers)."""
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


def _uncompressed(where: str, data: bytes) -> bytes:
    """A managed-ledger znode value without its optional compression header."""
    if not data.startswith(_MAGIC):
        return data
    try:
        (length,) = _LEN.unpack_from(data, 2)
        meta = mlpb.ManagedLedgerInfoMetadata()
        meta.ParseFromString(data[6:6 + length])
        body = data[6 + length:]
        kind = meta.compressionType
        if kind == mlpb.ManagedLedgerInfoMetadata.NONE:
            return body
        if kind == mlpb.ManagedLedgerInfoMetadata.ZLIB:
            # Pulsar's CompressionCodecZLib deflates with SYNC_FLUSH and never finishes: no final block, no
            # Adler-32, which zlib.decompress refuses as truncated; a decompressobj takes what there is
            out = zlib.decompressobj().decompress(body)
            if len(out) != meta.uncompressedSize:
                raise ValueError(f"ZLIB gave {len(out)} bytes where the header says {meta.uncompressedSize}")
            return out
        if kind == mlpb.ManagedLedgerInfoMetadata.LZ4:
            return bytes(cramjam.lz4.decompress_block(body, output_len=meta.uncompressedSize))
        if kind == mlpb.ManagedLedgerInfoMetadata.ZSTD:
            return bytes(cramjam.zstd.decompress(body))
        if kind == mlpb.ManagedLedgerInfoMetadata.SNAPPY:
            return bytes(cramjam.snappy.decompress_raw(body))
    except (struct.error, DecodeError, zlib.error, cramjam.DecompressionError, ValueError) as exc:
        raise MetadataError(f"managed ledger {where}: undecodable compressed value: {exc}") from None
    raise MetadataError(f"managed ledger {where}: unknown compression type {kind}")


@dataclass(frozen=True)
class ManagedLedger:
    name: str
    ledgers: tuple[int, ...]
    offloaded: frozenset[int]  # in tiered storage with bookkeeperDeleted: no longer BookKeeper's


def decode_managed_ledger(name: str, data: bytes) -> ManagedLedger:
    info = mlpb.ManagedLedgerInfo()
    try:
        info.ParseFromString(_uncompressed(name, data))
    except DecodeError as exc:
        raise MetadataError(f"managed ledger {name}: undecodable ManagedLedgerInfo: {exc}") from None
    ledgers = tuple(li.ledgerId for li in info.ledgerInfo)
    offloaded = frozenset(li.ledgerId for li in info.ledgerInfo if li.offloadContext.bookkeeperDeleted)
    return ManagedLedger(name, ledgers, offloaded)


def decode_cursor(where: str, data: bytes) -> tuple[int, dict[str, int]]:
    """A cursor znode: its ledger id (-1: none) and its properties (the compaction cursor keeps the
    compacted ledger's id in `CompactedTopicLedger`)."""
    info = mlpb.ManagedCursorInfo()
    try:
        info.ParseFromString(_uncompressed(where, data))
    except DecodeError as exc:
        raise MetadataError(f"cursor {where}: undecodable ManagedCursorInfo: {exc}") from None
    return (info.cursorsLedgerId if info.HasField("cursorsLedgerId") else -1,
            {p.name: p.value for p in info.properties})


@dataclass
class PulsarOwners:
    """Owners read from /managed-ledgers: ledger id -> owner, and the ledgers BookKeeper no longer has."""

    owners: dict[int, Owner] = field(default_factory=dict)
    offloaded: set[int] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def add(self, ml: ManagedLedger, cursors: Mapping[str, tuple[int, dict[str, int]]]) -> None:
        topic = topic_of(ml.name)
        for lid in ml.ledgers:
            self.owners[lid] = Owner("topic", topic)
        self.offloaded |= ml.offloaded
        for cursor, (lid, props) in cursors.items():
            if lid >= 0:
                self.owners[lid] = Owner("cursor", topic, cursor)
            if cursor == COMPACTION_CURSOR and COMPACTED_LEDGER_PROPERTY in props:
                self.owners[props[COMPACTED_LEDGER_PROPERTY]] = Owner("compacted-topic", topic)

    @classmethod
    def decode(cls, base: str, records: Mapping[str, bytes],
               cursors: Mapping[str, Mapping[str, bytes]]) -> PulsarOwners:
        """From the stored records: managed ledger name (below `base`) -> ManagedLedgerInfo bytes, and
        name -> cursor -> ManagedCursorInfo bytes. Each undecodable one is a problem, never a stop."""
        found = cls()
        decoded: dict[str, dict[str, tuple[int, dict[str, int]]]] = {}
        for name, of in cursors.items():
            for cursor, data in of.items():
                try:
                    decoded.setdefault(name, {})[cursor] = decode_cursor(f"{base}/{name}/{cursor}", data)
                except MetadataError as exc:
                    found.problems.append(str(exc))
        for name, data in records.items():
            try:
                ml = decode_managed_ledger(name, data)
            except MetadataError as exc:
                found.problems.append(str(exc))
                continue
            found.add(ml, decoded.get(name, {}))
        return found

    def topic_ledgers(self, topic: str) -> set[int]:
        return {lid for lid, o in self.owners.items() if o.name == topic and o.kind != "schema"}


# -- encoding, for the test tooling and the demo ------------------------------------------------------

def encode_managed_ledger(ledgers: Iterable[int], offloaded: Iterable[int] = (), compression: str = "NONE") -> bytes:
    gone = set(offloaded)
    info = mlpb.ManagedLedgerInfo()
    for lid in ledgers:
        li = info.ledgerInfo.add(ledgerId=lid, entries=10, size=1000, timestamp=1)
        if lid in gone:
            li.offloadContext.complete = True
            li.offloadContext.bookkeeperDeleted = True
    return _compressed(info.SerializeToString(), compression)


def encode_cursor(ledger_id: int, properties: Mapping[str, int] | None = None) -> bytes:
    info = mlpb.ManagedCursorInfo(cursorsLedgerId=ledger_id)
    for k, v in (properties or {}).items():
        info.properties.add(name=k, value=v)
    return info.SerializeToString()


def _deflated(body: bytes) -> bytes:
    """As Pulsar's CompressionCodecZLib writes it: a zlib stream flushed with SYNC_FLUSH, never finished."""
    deflater = zlib.compressobj()
    return deflater.compress(body) + deflater.flush(zlib.Z_SYNC_FLUSH)


def _compressed(body: bytes, compression: str) -> bytes:
    if compression == "NONE":
        return body
    packers = {"ZLIB": _deflated, "LZ4": lambda b: bytes(cramjam.lz4.compress_block(b, store_size=False)),
               "ZSTD": lambda b: bytes(cramjam.zstd.compress(b)),
               "SNAPPY": lambda b: bytes(cramjam.snappy.compress_raw(b))}
    packed = packers[compression](body)
    meta = mlpb.ManagedLedgerInfoMetadata(compressionType=compression, uncompressedSize=len(body)).SerializeToString()
    return _MAGIC + _LEN.pack(len(meta)) + meta + packed
