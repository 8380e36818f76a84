"""BookKeeper's entry logs and entry digests (DefaultEntryLogger, `*DigestManager`), as pure functions:
where an entry's bytes are, what a stored entry is made of, and whether one verifies.

An entry log `<ledgerDir>/current/<hex logId>.log` starts with a 1024-byte header ("BKLO", version,
ledgers-map offset and count); then each entry is an int32 size and that many bytes. A `locations`
value is `(logId << 32) | pos`, pos pointing just after the size field. The bytes are what the client
sent: ledgerId, entryId, lastAddConfirmed, length (int64 each, big-endian), the digest of those 32
bytes and the payload, then the payload.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

import google_crc32c

LOG_HEADER_BYTES = 1024
LOG_MAGIC = b"BKLO"
LOG_HEADER = struct.Struct(">4siqi")  # magic, version, ledgersMapOffset, ledgersCount
ENTRY_SIZE = struct.Struct(">i")
ENTRY_HEADER = struct.Struct(">qqqq")  # ledgerId, entryId, lastAddConfirmed, length
MAP_RECORD = struct.Struct(">qqi")  # a ledgers-map record: ledgerId = -1, entryId = -2, count; then count pairs
MAP_PAIR = struct.Struct(">qq")  # (ledgerId, size)
PADDING_BYTE = b"\xf0"  # the direct-I/O entry logger's padding to its 4 KiB blocks (`directentrylogger/Buffer.java`)
DIGEST_BYTES = {"CRC32": 8, "CRC32C": 4, "HMAC": 20, "DUMMY": 0}
PAYLOAD_HASH_BYTES = 8
# Why a stored copy is not the entry (the `reason` of CORRUPT_ENTRY).
MISSING_LOG = "missing-log"
TRUNCATED = "truncated"
BAD_SIZE = "bad-size"
OTHER_ENTRY = "other-entry"
BAD_DIGEST = "bad-digest"


def log_path(ledger_dir: str | Path, log_id: int) -> Path:
    return Path(ledger_dir) / "current" / f"{log_id:x}.log"


def log_id_of(name: str) -> int | None:
    """The log id of an entry log's file name (`<hex>.log`), None for any other file."""
    stem, _, ext = name.partition(".")
    if ext != "log" or not stem:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def ledgers_map_offset(header: bytes) -> int:
    """Where a finished log's ledgers map starts (0: none yet, the log is still being written; -1: not an
    entry log)."""
    if len(header) < LOG_HEADER.size:
        return -1
    magic, _, offset, _ = LOG_HEADER.unpack_from(header)
    return offset if magic == LOG_MAGIC and offset >= 0 else -1


def ledgers_map(data: bytes) -> list[int]:
    """The ledger ids of a ledgers map (its records from the map's offset to the end of the log); ValueError
    when it is not one. The direct-I/O entry logger pads the map to its 4 KiB block with bytes whose size field
    reads negative (0xF0...): the map ends there."""
    ids: list[int] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos >= ENTRY_SIZE.size and ENTRY_SIZE.unpack_from(data, pos)[0] < 0 \
                and data[pos:].strip(PADDING_BYTE) == b"":
            break
        if pos + ENTRY_SIZE.size + MAP_RECORD.size > len(data):
            raise ValueError(f"a ledgers-map record cut at byte {pos}")
        (size,) = ENTRY_SIZE.unpack_from(data, pos)
        lid, eid, count = MAP_RECORD.unpack_from(data, pos + ENTRY_SIZE.size)
        if (lid, eid) != (-1, -2) or count < 0 or size != MAP_RECORD.size + count * MAP_PAIR.size \
                or pos + ENTRY_SIZE.size + size > len(data):
            raise ValueError(f"not a ledgers-map record at byte {pos}")
        start = pos + ENTRY_SIZE.size + MAP_RECORD.size
        ids += [MAP_PAIR.unpack_from(data, start + i * MAP_PAIR.size)[0] for i in range(count)]
        pos += ENTRY_SIZE.size + size
    return ids


def split_location(location: int) -> tuple[int, int]:
    """(log id, offset of the entry's bytes) of a `locations` value."""
    return location >> 32, location & 0xFFFFFFFF


def mac_key(password: bytes) -> bytes:
    """MacDigestManager's key: SHA-1 of "mac" and the ledger's password."""
    return hashlib.sha1(b"mac" + password).digest()


def digest(digest_type: str, header: bytes, payload: bytes, password: bytes = b"") -> bytes:
    """The digest a client computes over the 32 header bytes and the payload."""
    if digest_type == "CRC32":
        return struct.pack(">q", zlib.crc32(payload, zlib.crc32(header)))
    if digest_type == "CRC32C":
        return struct.pack(">I", google_crc32c.extend(google_crc32c.value(header), payload))
    if digest_type == "HMAC":
        return hmac.new(mac_key(password), header + payload, hashlib.sha1).digest()
    if digest_type == "DUMMY":
        return b""
    raise ValueError(f"unknown digest type {digest_type!r} (CRC32, CRC32C, HMAC or DUMMY)")


def package_entry(ledger_id: int, entry_id: int, last_add_confirmed: int, length: int, payload: bytes,
                  digest_type: str, password: bytes = b"") -> bytes:
    """An entry as a client sends it and a bookie stores it."""
    header = ENTRY_HEADER.pack(ledger_id, entry_id, last_add_confirmed, length)
    return header + digest(digest_type, header, payload, password) + payload


class Verdict(NamedTuple):
    reason: str  # "" when the copy is the entry
    payload_hash: bytes = b""  # a short hash of the payload (copies compared by it); set when verified
    detail: str = ""
    payload: bytes = b""  # set when verified


def payload_hash(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=PAYLOAD_HASH_BYTES).digest()


def verify_entry(stored: bytes, ledger_id: int, entry_id: int, digest_type: str,
                 password: bytes | None = None) -> Verdict:
    """Is `stored` (the bytes after the size field) entry `entry_id` of `ledger_id`, digest included?
    An HMAC ledger without its password is checked for size and ids only."""
    if len(stored) < 16:
        return Verdict(BAD_SIZE, detail=f"{len(stored)} bytes, not even the ids")
    lid, eid = struct.unpack_from(">qq", stored)
    if (lid, eid) != (ledger_id, entry_id):
        return Verdict(OTHER_ENTRY, detail=f"holds ledger {lid} entry {eid}")
    width = DIGEST_BYTES.get(digest_type)
    if width is None:
        raise ValueError(f"unknown digest type {digest_type!r}")
    if len(stored) < ENTRY_HEADER.size + width:
        return Verdict(BAD_SIZE, detail=f"{len(stored)} bytes, shorter than header and digest")
    header = stored[:ENTRY_HEADER.size]
    payload = stored[ENTRY_HEADER.size + width:]
    if digest_type != "HMAC" or password is not None:
        expected = digest(digest_type, header, payload, password or b"")
        if stored[ENTRY_HEADER.size:ENTRY_HEADER.size + width] != expected:
            return Verdict(BAD_DIGEST, detail=f"{digest_type} digest does not match")
    return Verdict("", payload_hash(payload), payload=payload)
