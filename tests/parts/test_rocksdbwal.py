"""The reader of a RocksDB index's write-ahead log, against WALs real RocksDB wrote (rocksdict's) and records
made here for what a bookie's RocksDB never writes by default (recycled files, compression)."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import google_crc32c
import pytest
from rocksdict import Options, Rdict

from scrutiny.entrysources import rocksdbwal
from scrutiny.entrysources.rocksdbwal import BLOCK, WalTail, Write, batch, records


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + rocksdbwal.MASK_DELTA) & 0xFFFFFFFF


def record(kind: int, body: bytes, number: int | None = None) -> bytes:
    """One physical record as RocksDB's log writer makes it (with the file's number: a recyclable one)."""
    head = b"" if number is None else struct.pack("<I", number)
    return struct.pack("<IHB", mask(google_crc32c.value(bytes([kind]) + head + body)), len(body), kind) + head + body


def put_batch(sequence: int, key: bytes) -> bytes:
    return struct.pack("<QI", sequence, 1) + b"\x01" + bytes([len(key)]) + key + b"\x01v"


def wal_of(db: Path) -> Path:
    (wal,) = [p for p in db.iterdir() if p.suffix == ".log" and p.stem.isdigit()]
    return wal


def test_every_write_is_read_in_order_whatever_its_size(tmp_path: Path) -> None:
    """Puts and deletes, one of them larger than a block (fragments), batches of several: every write of the
    default column family, with its sequence number, as the database numbered it."""
    db = Rdict(str(tmp_path / "db"), options=Options(raw_mode=True))
    rng = random.Random(1)
    expected: list[Write] = []
    try:
        tail = WalTail(tmp_path / "db")
        tail.follow_from(db.latest_sequence_number())
        for i in range(300):
            key = i.to_bytes(8, "big")
            if rng.random() < 0.3 and i:
                gone = rng.randrange(i).to_bytes(8, "big")
                del db[gone]
                expected.append(Write(db.latest_sequence_number(), True, gone))
            value = b"v" * (rng.choice([10, 100, 3 * BLOCK]))
            db[key] = value
            expected.append(Write(db.latest_sequence_number(), False, key))
            if i % 50 == 0:
                assert tail.read(db.latest_sequence_number()) == expected
                expected = []
        assert tail.read(db.latest_sequence_number()) == expected
    finally:
        db.close()


def test_a_record_written_in_part_waits_for_the_next_read(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path / "db"), options=Options(raw_mode=True))
    try:
        for i in range(40):
            db[i.to_bytes(8, "big")] = b"v" * 2000
        data = wal_of(tmp_path / "db").read_bytes()
    finally:
        db.close()
    whole, end = records(data, 0, 1)
    assert [batch(r)[0] for r in whole] == list(range(1, 41)) and end == len(data)
    for cut in (len(data) - 1, BLOCK + 5, BLOCK - 3):
        first, resume = records(data[:cut], 0, 1)
        rest, _ = records(data[resume:], resume, 1)
        assert first + rest == whole, cut


def test_a_recycled_files_older_records_end_it(tmp_path: Path) -> None:
    data = record(5, put_batch(7, b"a" * 8), number=12) + record(5, put_batch(8, b"b" * 8), number=3)
    found, end = records(data, 0, 12)
    assert [batch(r)[2] for r in found] == [[Write(7, False, b"a" * 8)]] and end == len(data) // 2


def test_what_this_reader_does_not_read_is_refused(tmp_path: Path) -> None:
    """A compressed WAL and a range deletion: the tail reports it cannot tell (the caller reads every key)."""
    with pytest.raises(rocksdbwal.WalError, match="compressed"):
        records(record(9, b"\x07"), 0, 1)
    ranged = struct.pack("<QI", 5, 1) + b"\x0f\x01a\x01b"
    with pytest.raises(rocksdbwal.WalError, match="0xf"):
        batch(ranged)
    db = tmp_path / "db"
    db.mkdir()
    (db / "000004.log").write_bytes(record(1, put_batch(1, b"k" * 8)) + record(1, ranged))
    tail = WalTail(db)
    tail.follow_from(0)
    assert tail.read(0) is None and tail.read(0) is None  # and it stays so until followed anew


def test_writes_gone_unread_are_a_gap(tmp_path: Path) -> None:
    """The WAL removed (a flush) with writes the reader had not read: it cannot tell what they were."""
    path = tmp_path / "db"
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        tail = WalTail(path)
        tail.follow_from(db.latest_sequence_number())
        db[b"k" * 8] = b"v"
        assert tail.read(db.latest_sequence_number()) == [Write(1, False, b"k" * 8)]
        del db[b"k" * 8]
        db.flush()
        db[b"j" * 8] = b"v"
        assert tail.read(db.latest_sequence_number()) is None
        tail.follow_from(db.latest_sequence_number())
        del db[b"j" * 8]
        assert tail.read(db.latest_sequence_number()) == [Write(4, True, b"j" * 8)]
    finally:
        db.close()


def test_following_from_a_sequence_reads_from_the_block_that_holds_it(tmp_path: Path) -> None:
    """After a keys-only pass at some sequence number, the writes after it, and only those, whatever the block
    it falls in (found from the WAL's end, a block at a time: a large WAL is not read whole)."""
    db = Rdict(str(tmp_path / "db"), options=Options(raw_mode=True))
    try:
        for i in range(3000):
            db[i.to_bytes(8, "big")] = b"v" * (40 if i % 100 else 50_000)  # some batches span blocks
        assert wal_of(tmp_path / "db").stat().st_size > 20 * BLOCK
        for after in (0, 1, 99, 100, 101, 1500, 2999, 3000):
            tail = WalTail(tmp_path / "db")
            tail.follow_from(after)
            got = tail.read(3000)
            assert got is not None and [w.sequence for w in got] == list(range(after + 1, 3001)), after
    finally:
        db.close()
