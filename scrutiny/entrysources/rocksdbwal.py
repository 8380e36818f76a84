"""What a bookie's RocksDB index wrote since a look, read from its write-ahead log: the `ledgers` index's
puts and deletes, without reading every key again.

The format is RocksDB's (`db/log_format.h`, `db/log_reader.cc`, `db/write_batch.cc` in facebook/rocksdb): a
WAL file (`<number>.log` in the database's directory) is 32 KiB blocks of records, each with a header
(masked CRC32C of its type and payload, length, type; a recyclable record also the low 32 bits of its
file's number), a write too large for a block's rest split into first, middle and last fragments. Each
whole record is a WriteBatch: its first sequence number, how many of its operations take one, then the
operations. Files are numbered in the order RocksDB starts them, and sequence numbers follow on from one
file to the next.

BookKeeper's indexes use RocksDB's defaults for the WAL (in the database's directory, no recycling, no
compression, `conf/*_rocksdb.conf.default`); anything else this reader does not know (a compressed WAL,
a range deletion, a transaction's markers) ends the reading, and the caller reads every key instead.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

import google_crc32c

BLOCK = 32768
HEADER = struct.Struct("<IHB")  # masked CRC32C, length, type
LOG_NUMBER = struct.Struct("<I")
BATCH_HEADER = struct.Struct("<QI")  # first sequence number, how many operations take one
MASK_DELTA = 0xA282EAD8
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
RECYCLABLE = {5: FULL, 6: FIRST, 7: MIDDLE, 8: LAST}
SET_COMPRESSION, TIMESTAMP_SIZES, RECYCLABLE_TIMESTAMP_SIZES = 9, 10, 11
SAFE_TO_IGNORE = 0x80  # a record type with this bit set carries nothing a reader must apply
# WriteBatch operation tags (`db/dbformat.h`): (has a column family id, strings that follow, what it is)
DELETE, PUT, SKIP = "delete", "put", "skip"
OPERATIONS = {0x0: (False, 1, DELETE), 0x1: (False, 2, PUT), 0x2: (False, 2, PUT), 0x3: (False, 1, SKIP),
              0x4: (True, 1, DELETE), 0x5: (True, 2, PUT), 0x6: (True, 2, PUT), 0x7: (False, 1, DELETE),
              0x8: (True, 1, DELETE), 0xD: (False, 0, SKIP), 0x16: (False, 2, PUT), 0x17: (True, 2, PUT)}
UNCOUNTED = (0x3, 0xD)  # log data and a no-op take no sequence number


class WalError(ValueError):
    """What this reader cannot follow: a damaged record, or a part of the format it does not read."""


class Write(NamedTuple):
    sequence: int
    deleted: bool
    key: bytes


def unmask(crc: int) -> int:
    rot = (crc - MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def wal_number(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "log" and stem.isdigit() else None


def records(data: bytes, start: int, number: int) -> tuple[list[bytes], int]:
    """The whole records of a WAL file read from byte `start` (a record's start) to `start + len(data)`,
    and the position after the last one; a record written only in part (the file's tail, being written)
    waits for the next read. `number`: the file's."""
    out: list[bytes] = []
    pos, end, resume = start, start + len(data), start
    parts: list[bytes] = []
    while True:
        left = BLOCK - pos % BLOCK
        if left < HEADER.size:  # a block's trailer: zeros
            pos += left
            continue
        if pos + HEADER.size > end:
            break
        crc, length, kind = HEADER.unpack_from(data, pos - start)
        size = HEADER.size
        if kind in RECYCLABLE or kind in (RECYCLABLE_TIMESTAMP_SIZES, SAFE_TO_IGNORE | 3):
            size += LOG_NUMBER.size
        if pos + size + length > end:
            break
        body = data[pos - start + HEADER.size:pos - start + size + length]
        if kind == 0 or unmask(crc) != google_crc32c.value(bytes([kind]) + body):
            break  # the tail being written (read again next time) or damage (the caller's sequence check)
        if size > HEADER.size:
            if LOG_NUMBER.unpack_from(body)[0] != number & 0xFFFFFFFF:
                break  # a recycled file's older records: the end of this one's
            body = body[LOG_NUMBER.size:]
        kind = RECYCLABLE.get(kind, kind)
        pos += size + length
        if kind == FULL:
            out.append(body)
            parts, resume = [], pos
        elif kind == FIRST:
            parts = [body]
        elif kind in (MIDDLE, LAST) and not parts:
            pass  # the rest of a record begun before `start` (a read from a block's start): older
        elif kind == MIDDLE:
            parts.append(body)
        elif kind == LAST:
            out.append(b"".join([*parts, body]))
            parts, resume = [], pos
        elif kind == SET_COMPRESSION:
            if body[:1] != b"\x00":
                raise WalError(f"WAL {number} is compressed (type {body[:1].hex()}): not read here")
            resume = pos
        elif kind in (TIMESTAMP_SIZES, RECYCLABLE_TIMESTAMP_SIZES) or kind & SAFE_TO_IGNORE:
            resume = pos
        else:
            raise WalError(f"record type {kind} at byte {pos - size - length} of WAL {number}: not read here")
    return out, resume


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data):
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            break
    raise WalError("a WriteBatch's varint runs past its record")


def batch(record: bytes) -> tuple[int, int, list[Write]]:
    """A WriteBatch: its first sequence number, how many sequence numbers it takes, and its puts and deletes
    of the default column family, in order."""
    if len(record) < BATCH_HEADER.size:
        raise WalError(f"a WriteBatch of {len(record)} bytes")
    first, count = BATCH_HEADER.unpack_from(record)
    pos, sequence, writes = BATCH_HEADER.size, first, []
    while pos < len(record):
        tag = record[pos]
        if tag not in OPERATIONS:
            raise WalError(f"WriteBatch operation {tag:#x}: not read here")
        has_family, strings, what = OPERATIONS[tag]
        pos += 1
        family = 0
        if has_family:
            family, pos = _varint(record, pos)
        key = b""
        for i in range(strings):
            n, pos = _varint(record, pos)
            if i == 0:
                key = record[pos:pos + n]
            pos += n
        if pos > len(record):
            raise WalError("a WriteBatch's operation runs past its record")
        if what != SKIP and family == 0:
            writes.append(Write(sequence, what == DELETE, key))
        if tag not in UNCOUNTED:
            sequence += 1
    if sequence - first != count:
        raise WalError(f"a WriteBatch says {count} operations and holds {sequence - first}")
    return first, count, writes


class WalTail:
    """Follows one database's WAL files from a sequence number on: every write after it, in order, at each
    `read`, or None when some could not be read (a WAL file removed before its end was read, after a flush;
    a part of the format not read here): then the caller reads every key, and follows again from there."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.number = -1  # the file being read, and where in it the next record starts
        self.offset = 0
        self.next_sequence = -1  # the sequence number of the next write to read (-1: not following)

    def follow_from(self, sequence: int) -> None:
        """Follow the writes after `sequence` (what the index held then was read whole)."""
        self.number, self.offset, self.next_sequence = -1, 0, sequence + 1

    def read(self, seen: int) -> list[Write] | None:
        """The writes since the last read, up to at least `seen` (the sequence number the index is known to
        have reached: a secondary caught up before this read); None when not all of them can be read."""
        if self.next_sequence < 0:
            return None
        try:
            writes = self._read()
        except (OSError, WalError):
            writes = None
        if writes is None or self.next_sequence <= seen:  # the WAL ends before what the index holds: a gap
            self.next_sequence = -1
            return None
        return writes

    def _read(self) -> list[Write] | None:
        files = sorted((n, name) for name in os.listdir(self.db) if (n := wal_number(name)) is not None)
        if self.number < 0 and files:
            self.number, self.offset = self._start(files)
        writes: list[Write] = []
        for number, name in (f for f in files if f[0] >= self.number):
            start = self.offset if number == self.number else 0
            with open(self.db / name, "rb") as f:
                f.seek(start)
                data = f.read()
            found, self.offset = records(data, start, number)
            self.number = number
            for record in found:
                first, count, ops = batch(record)
                if first > self.next_sequence:
                    return None  # writes between were in a file gone before it was read
                writes += [w for w in ops if w.sequence >= self.next_sequence]
                self.next_sequence = max(self.next_sequence, first + count)
        return writes

    def _start(self, files: list[tuple[int, str]]) -> tuple[int, int]:
        """Where the writes from `next_sequence` on begin: the last block (of the newest file that has one)
        whose first whole WriteBatch begins at or before it. A block always begins with a record's header, so
        reading from there misses only the end of a batch begun before, which is older. Found from the end:
        a look that follows a keys-only pass reads a block or two, not the whole WAL."""
        for number, name in reversed(files):
            with open(self.db / name, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                for block in range((size - 1) // BLOCK, -1, -1):
                    f.seek(block * BLOCK)
                    found, _ = records(f.read(BLOCK), block * BLOCK, number)
                    if found and batch(found[0])[0] <= self.next_sequence:
                        return number, block * BLOCK
        return files[0][0], 0  # every file begins after it: a gap, unless the oldest begins exactly there
