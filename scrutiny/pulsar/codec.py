"""The compression header Pulsar's MetaStoreImpl may put before a managed-ledger or cursor record:
`0x4778`, a big-endian int32 length, a `ManagedLedgerInfoMetadata` (or the cursor's, of the same shape) of
that length, then the compressed protobuf. Each codec as Pulsar frames it (`docs/formats.md` 19): LZ4 a raw
block, ZSTD one frame, SNAPPY raw, ZLIB deflate flushed with SYNC_FLUSH and never finished. Pure."""

from __future__ import annotations

import struct
import zlib

import cramjam
from google.protobuf.message import DecodeError

from scrutiny.errors import MetadataError
from scrutiny.pulsar import managed_ledger_pb2 as mlpb

MAGIC = b"\x47\x78"
_LEN = struct.Struct(">i")
_Header = mlpb.ManagedLedgerInfoMetadata
COMPRESSIONS = ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")


def uncompressed(where: str, data: bytes) -> bytes:
    """A record without its optional compression header; MetadataError naming `where` when it is broken."""
    if not data.startswith(MAGIC):
        return data
    try:
        (length,) = _LEN.unpack_from(data, 2)
        meta = _Header()
        meta.ParseFromString(data[6:6 + length])
        body = data[6 + length:]
        kind = meta.compressionType
        if kind == _Header.NONE:
            return body
        if kind == _Header.ZLIB:
            # never finished by Pulsar: no final block, no Adler-32, which zlib.decompress refuses as truncated
            out = zlib.decompressobj().decompress(body)
            if len(out) != meta.uncompressedSize:
                raise ValueError(f"ZLIB gave {len(out)} bytes where the header says {meta.uncompressedSize}")
            return out
        if kind == _Header.LZ4:
            return bytes(cramjam.lz4.decompress_block(body, output_len=meta.uncompressedSize))
        if kind == _Header.ZSTD:
            return bytes(cramjam.zstd.decompress(body))
        if kind == _Header.SNAPPY:
            return bytes(cramjam.snappy.decompress_raw(body))
    except (struct.error, DecodeError, zlib.error, cramjam.DecompressionError, ValueError) as exc:
        raise MetadataError(f"{where}: undecodable compressed value: {exc}") from None
    raise MetadataError(f"{where}: unknown compression type {kind}")


def _deflated(body: bytes) -> bytes:
    deflater = zlib.compressobj()
    return deflater.compress(body) + deflater.flush(zlib.Z_SYNC_FLUSH)


_PACKERS = {"ZLIB": _deflated, "LZ4": lambda b: bytes(cramjam.lz4.compress_block(b, store_size=False)),
            "ZSTD": lambda b: bytes(cramjam.zstd.compress(b)),
            "SNAPPY": lambda b: bytes(cramjam.snappy.compress_raw(b))}


def packed(body: bytes, compression: str) -> bytes:
    """`body` as Pulsar's codec for `compression` (not NONE) gives it: records and messages use the same codecs."""
    return _PACKERS[compression](body)


def compressed(body: bytes, compression: str) -> bytes:
    """As Pulsar's brokers write a record with `managedLedgerInfoCompressionType` (or the cursors')."""
    if compression == "NONE":
        return body
    meta = _Header(compressionType=compression, uncompressedSize=len(body)).SerializeToString()
    return MAGIC + _LEN.pack(len(meta)) + meta + packed(body, compression)
