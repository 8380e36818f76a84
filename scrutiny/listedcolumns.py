"""An agent's EOK answers as columns (`ListedColumns`): written by the agent, read by the scan; pure.

A scan reads a few answers per ledger, hundreds of thousands a second: as a protobuf sub-message each, the
reading costs more than the answers' bytes. As columns, a message of a thousand answers is three fields, and
the scan keeps them so (`Listed`) until the checks compare them as words (`is_exact_encoding`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from scrutiny.codec import laid_out
from scrutiny.v1 import bookie_pb2

_ID = np.dtype(">i8")
_SIZE = np.dtype(">u4")
_NONE = np.zeros(0, np.int64)


def listed_columns(ledger_ids: Sequence[int], answers: Sequence[bytes]) -> Any:
    """The columns of these EOK answers, answer i being ledger i's encoding."""
    return bookie_pb2.ListedColumns(ledger_ids=np.asarray(ledger_ids, _ID).tobytes(),
                                    sizes=np.fromiter(map(len, answers), _SIZE, len(answers)).tobytes(),
                                    availability=b"".join(answers))


class Listed(NamedTuple):
    """Answers as columns: answer j, ledger `ledger_ids[j]`'s encoding, is the `sizes[j]` bytes of `data` from
    `starts[j]`. Or (`problem`) why the columns could not be read: `ledger_ids` are then those they name where
    they can be read, none otherwise, and there is no answer."""

    ledger_ids: np.ndarray  # int64
    starts: np.ndarray  # int64
    sizes: np.ndarray  # int64
    data: bytes
    problem: str = ""

    @classmethod
    def of(cls, answers: Mapping[int, bytes]) -> Listed:
        """These answers (ledger -> its encoding) in their order, each from a multiple of 8 bytes (`laid_out`)."""
        data, starts, sizes = laid_out(list(answers.values()))
        return cls(np.fromiter(answers, np.int64, len(answers)), starts, sizes, data)

    @classmethod
    def unreadable(cls, ledger_ids: np.ndarray, problem: str) -> Listed:
        return cls(ledger_ids, _NONE, _NONE, b"", problem)

    def answer(self, j: int) -> bytes:
        start = int(self.starts[j])
        return self.data[start:start + int(self.sizes[j])]

    def answers(self) -> list[bytes]:
        """Each answer's bytes apart, in order."""
        return [self.data[s:s + z] for s, z in zip(self.starts.tolist(), self.sizes.tolist(), strict=True)]

    def only(self, keep: np.ndarray) -> Listed:
        """The answers `keep` (a mask) selects."""
        return Listed(self.ledger_ids[keep], self.starts[keep], self.sizes[keep], self.data)


NOTHING_LISTED = Listed(_NONE, _NONE, _NONE, b"")


def read_listed(msg: Any) -> Listed:
    """The answers of a `ListedColumns` as they came (never decoded here), or why they cannot be read."""
    raw_ids, raw_sizes, data = msg.ledger_ids, msg.sizes, msg.availability
    if len(raw_ids) % _ID.itemsize:
        return Listed.unreadable(_NONE, f"listed columns: {len(raw_ids)} bytes of ledger ids, not a whole number of 8")
    ids = np.frombuffer(raw_ids, _ID).astype(np.int64)
    if len(raw_sizes) != _SIZE.itemsize * ids.size:
        return Listed.unreadable(ids, f"listed columns: {len(raw_sizes)} bytes of sizes for {ids.size} ledgers")
    sizes = np.frombuffer(raw_sizes, _SIZE).astype(np.int64)
    ends = np.cumsum(sizes)
    if ends.size and ends[-1] != len(data):
        return Listed.unreadable(ids, f"listed columns: sizes add up to {ends[-1]} bytes, the answers are {len(data)}")
    if not ends.size and data:
        return Listed.unreadable(ids, f"listed columns: {len(data)} bytes of answers for no ledger")
    return Listed(ids, ends - sizes, sizes, data)


def among(ids: np.ndarray, ascending: np.ndarray) -> np.ndarray:
    """Which of `ids` are in `ascending` (sorted, each once): a mask."""
    if not ascending.size:
        return np.zeros(ids.shape, dtype=bool)
    return ascending[np.minimum(np.searchsorted(ascending, ids), ascending.size - 1)] == ids


def joined(parts: Sequence[Listed]) -> Listed:
    """One `Listed` of several: each ledger's first answer, ledgers ascending, every answer from a multiple of 8
    bytes of `data` (as `is_exact_encoding` reads them) and `data` a whole number of 8-byte words."""
    laid = []
    for p in parts:
        if not p.ledger_ids.size:
            continue
        if (p.starts & 7).any():  # an answer of a size no agent sends: each apart, padded
            data, starts, sizes = laid_out(p.answers())
            p = Listed(p.ledger_ids, starts, sizes, data)
        laid.append(p if not len(p.data) & 7 else p._replace(data=p.data + bytes(-len(p.data) & 7)))
    if not laid:
        return NOTHING_LISTED
    if len(laid) == 1 and (laid[0].ledger_ids[1:] > laid[0].ledger_ids[:-1]).all():
        return laid[0]  # ascending already (as an agent answers what it was asked)
    bases = np.cumsum([0] + [len(p.data) for p in laid[:-1]])
    ids = np.concatenate([p.ledger_ids for p in laid])
    ledgers, first = np.unique(ids, return_index=True)
    starts = np.concatenate([p.starts + base for p, base in zip(laid, bases.tolist(), strict=True)])
    sizes = np.concatenate([p.sizes for p in laid])
    return Listed(ledgers, starts[first], sizes[first], b"".join([p.data for p in laid]))
