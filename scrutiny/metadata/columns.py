"""A range's plain ledgers read as columns, never as objects: ptars reads the znodes' protobuf bodies into Arrow
columns (in Rust), and the rules that make a ledger plain are checked over them.

A plain ledger is one `decode_ledger_metadata` reads as sound, closed, with entries, of one segment from entry 0:
most of a cluster's. Every other znode (another format, a body protobuf would refuse, several segments, an
inconsistency, an open or empty ledger) is left to the reference path, one `LedgerMetadata` at a time; so is any
plain ledger a check has something to say about (`scan.plain`). A property test holds the two to the same result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from google.protobuf.internal import decoder as pb_decoder
from google.protobuf.message import DecodeError

from scrutiny.bookkeeper.ledger_metadata_pb2 import LedgerMetadataFormat
from scrutiny.metadata.ledger import MAX_ENSEMBLE_SIZE, V3_HEADER

if TYPE_CHECKING:  # pyarrow is imported by the first range read in columns, not by every command
    import pyarrow as pa

_BODY = len(V3_HEADER)
_CLOSED = 3  # the proto's default state
_LAST_ENTRY_BELOW = 1 << 60  # numpy's int64 would wrap on entry ids near 2**63 (`held_exactly_their_shares`)
_handler: Any = None


class Znode(NamedTuple):
    """A ledger's znode as read: its bytes (None: no such znode) and its stat."""

    ledger_id: int
    data: bytes | None
    ctime: int = -1
    version: int = -1
    mtime: int = -1


@dataclass(frozen=True)
class PlainLedgers:
    """The plain ledgers among a range's znodes, a row each. `members`: each ensemble position's bookie, as its
    number in `bookies` (-1 past the ledger's ensemble size); `owner`: its custom metadata, as its number in
    `customs` (-1: none)."""

    rows: np.ndarray  # each one's index among the znodes read
    ledger_ids: np.ndarray
    ensemble_size: np.ndarray
    write_quorum: np.ndarray
    ack_quorum: np.ndarray
    last_entry_id: np.ndarray
    members: np.ndarray
    bookies: list[str]
    owner: np.ndarray
    customs: list[tuple[tuple[str, bytes], ...]]
    ctime: np.ndarray  # as the metadata says, else the znode's

    def __len__(self) -> int:
        return int(self.rows.size)

    def take(self, keep: np.ndarray) -> PlainLedgers:
        """The rows `keep` selects (a mask or indices)."""
        return PlainLedgers(self.rows[keep], self.ledger_ids[keep], self.ensemble_size[keep], self.write_quorum[keep],
                            self.ack_quorum[keep], self.last_entry_id[keep], self.members[keep], self.bookies,
                            self.owner[keep], self.customs, self.ctime[keep])

    def wanted(self) -> dict[str, list[int]]:
        """The ledgers each bookie is asked about: every bookie of each ensemble."""
        named = self.members >= 0
        bookie = self.members[named]
        ledger = np.broadcast_to(self.ledger_ids[:, None], self.members.shape)[named]
        order = np.argsort(bookie, kind="stable")
        bookie, ledger = bookie[order], ledger[order]
        bounds = np.searchsorted(bookie, np.arange(len(self.bookies) + 1))
        return {b: ledger[lo:hi].tolist() for b, lo, hi in zip(self.bookies, bounds[:-1].tolist(), bounds[1:].tolist(),
                                                       strict=True) if hi > lo}


def _ptars() -> Any:
    global _handler
    if _handler is None:  # the descriptors are read once a process
        from ptars import HandlerPool

        message = LedgerMetadataFormat.DESCRIPTOR
        _handler = HandlerPool([message.file]).get_for_message(message)
    return _handler


def plain_ledgers(znodes: Sequence[Znode], leave: np.ndarray | None = None) -> PlainLedgers:
    """The plain ledgers among `znodes`, but those whose ids are in `leave` (sorted)."""
    rows: list[int] = []
    bodies: list[bytes] = []
    for i, z in enumerate(znodes):
        data = z.data
        if data is None or not data.startswith(V3_HEADER) or len(data) <= _BODY:
            continue
        length, pos = data[_BODY], _BODY + 1
        if length & 0x80:  # a body of 128 bytes or more (a ledger with custom metadata)
            try:
                length, pos = pb_decoder._DecodeVarint32(data, _BODY)  # type: ignore[attr-defined]
            except (IndexError, DecodeError):  # the reference names what is wrong
                continue
        if pos + length <= len(data):
            rows.append(i)
            bodies.append(data[pos:pos + length])
    try:
        batch = _ptars().list_to_record_batch(bodies) if bodies else None
    except ValueError:  # one body ptars cannot read (invalid UTF-8 in a string) fails them all: none is plain
        batch = None
    if batch is None:
        return _none()
    ids = np.fromiter((znodes[i].ledger_id for i in rows), np.int64, len(rows))
    ctimes = np.fromiter((znodes[i].ctime for i in rows), np.int64, len(rows))
    return _plain(batch, np.asarray(rows, dtype=np.int64), ids, ctimes, leave)


def _none() -> PlainLedgers:
    empty = np.zeros(0, dtype=np.int64)
    return PlainLedgers(empty, empty, empty, empty, empty, empty, np.zeros((0, 0), np.int64), [], empty, [], empty)


def _numbers(column: pa.Array, default: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as int64, `default` where it is null (absent), and where it is present. Read from its
    buffers: pyarrow's `to_numpy` and `fill_null` import pandas and the compute functions on their first call."""
    width = column.type.bit_width // 8
    values = np.frombuffer(column.buffers()[1], f"<i{width}", len(column), column.offset * width).astype(np.int64)
    if not column.null_count:
        return values, np.ones(len(column), dtype=bool)
    bits = np.unpackbits(np.frombuffer(column.buffers()[0], np.uint8), bitorder="little")
    present = bits[column.offset:column.offset + len(column)].astype(bool)
    return np.where(present, values, default), present


def _plain(batch: pa.RecordBatch, rows: np.ndarray, ids: np.ndarray, znode_ctimes: np.ndarray,
           leave: np.ndarray | None) -> PlainLedgers:
    wq, _ = _numbers(batch.column("quorumSize"))  # absent: 0, not plain (protobuf's reference refuses it)
    e, _ = _numbers(batch.column("ensembleSize"))
    aq, aq_present = _numbers(batch.column("ackQuorumSize"))
    aq = np.where(aq_present, aq, wq)  # absent: the write quorum (a present 0 stays 0, and is not plain)
    last, _ = _numbers(batch.column("lastEntryId"), -1)
    state, _ = _numbers(batch.column("state"), _CLOSED)
    segment = batch.column("segment")
    seg_offsets, _ = _numbers(segment.offsets)
    first_of, _ = _numbers(segment.values.field("firstEntryId"))
    members = segment.values.field("ensembleMember")
    member_offsets, _ = _numbers(members.offsets)
    one = np.diff(seg_offsets) == 1
    seg = np.where(one, seg_offsets[:-1], 0)  # each ledger's one segment (where it has one)
    start = member_offsets[np.minimum(seg, member_offsets.size - 1)]
    size = member_offsets[np.minimum(seg + 1, member_offsets.size - 1)] - start
    # `inconsistencies`' rules for a sound one-segment ledger; closed, with entries (a state protobuf does not know
    # reads as the default there, and stays itself here: such a ledger is not plain)
    plain = (one & (first_of[seg] == 0 if first_of.size else False) & (wq >= 1) & (wq <= e)
             & (e <= MAX_ENSEMBLE_SIZE) & (aq >= 1) & (aq <= wq) & (size == e) & (state == _CLOSED)
             & (last >= 0) & (last < _LAST_ENTRY_BELOW))
    if leave is not None and leave.size:
        plain &= ~np.isin(ids, leave)
    encoded = members.values.dictionary_encode()
    names: list[str] = encoded.dictionary.to_pylist()
    member, _ = _numbers(encoded.indices)
    widest = int(e[plain].max()) if plain.any() else 0
    position = np.arange(widest)
    inside = plain[:, None] & (position < e[:, None])
    matrix = np.where(inside, member[np.where(inside, start[:, None] + position, 0)], -1) if member.size else \
        np.full(inside.shape, -1, dtype=np.int64)
    # a bookie named twice, or an empty id: not sound (the padding made unequal to anything)
    ordered = np.sort(np.where(inside, matrix, -1 - position), axis=1)
    empty = names.index("") if "" in names else -2
    plain &= ~((ordered[:, 1:] == ordered[:, :-1]).any(axis=1) | (matrix == empty).any(axis=1))
    owner, customs = _owners(batch.column("customMetadata"), plain)
    keep = np.flatnonzero(plain)
    ctime, present = _numbers(batch.column("ctime"))
    return PlainLedgers(rows[keep], ids[keep], e[keep], wq[keep], aq[keep], last[keep], matrix[keep], names,
                        owner[keep], customs, np.where(present, ctime, znode_ctimes)[keep])


def _owners(column: pa.Array, plain: np.ndarray) -> tuple[np.ndarray, list[tuple[tuple[str, bytes], ...]]]:
    """Each plain ledger's custom metadata as its number among the distinct ones, (key, value) pairs in their order
    (an absent key or value: empty); -1: none."""
    offsets, _ = _numbers(column.offsets)
    counts = np.diff(offsets)
    owner = np.full(len(column), -1, dtype=np.int64)
    if not counts[plain].any():
        return owner, []
    keys = [k or "" for k in column.values.field("key").to_pylist()]
    values = [v or b"" for v in column.values.field("value").to_pylist()]
    pairs = list(zip(keys, values, strict=True))
    bounds = offsets.tolist()
    number: dict[tuple[tuple[str, bytes], ...], int] = {}
    for i in np.flatnonzero(plain & (counts > 0)).tolist():
        custom = tuple(pairs[bounds[i]:bounds[i + 1]])
        owner[i] = number.setdefault(custom, len(number))
    return owner, list(number)
