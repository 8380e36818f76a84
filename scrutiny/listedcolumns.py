"""An agent's EOK answers as columns (`ListedColumns`): written by the agent, read by the scan; pure.

A scan reads a few answers per ledger, hundreds of thousands a second: as a protobuf sub-message each, the
reading costs more than the answers' bytes. As columns, a message of a thousand answers is three fields."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from scrutiny.v1 import bookie_pb2

_ID = np.dtype(">i8")
_SIZE = np.dtype(">u4")


def listed_columns(ledger_ids: Sequence[int], answers: Sequence[bytes]) -> Any:
    """The columns of these EOK answers, answer i being ledger i's encoding."""
    return bookie_pb2.ListedColumns(ledger_ids=np.asarray(ledger_ids, _ID).tobytes(),
                                    sizes=np.fromiter(map(len, answers), _SIZE, len(answers)).tobytes(),
                                    availability=b"".join(answers))


class Listed(NamedTuple):
    """The columns read: each ledger's encoding, or (`problem`) why they could not be; then `ledger_ids` are those
    the columns name where they can be read, none otherwise."""

    ledger_ids: list[int]
    answers: list[bytes]
    problem: str = ""


def read_listed(msg: Any) -> Listed:
    """The answers of a `ListedColumns`, each ledger's bytes apart, never decoded here."""
    raw_ids, raw_sizes, data = msg.ledger_ids, msg.sizes, msg.availability
    if len(raw_ids) % _ID.itemsize:
        return Listed([], [], f"listed columns: {len(raw_ids)} bytes of ledger ids, not a whole number of 8")
    ids = np.frombuffer(raw_ids, _ID).tolist()
    if len(raw_sizes) != _SIZE.itemsize * len(ids):
        return Listed(ids, [], f"listed columns: {len(raw_sizes)} bytes of sizes for {len(ids)} ledgers")
    ends = np.cumsum(np.frombuffer(raw_sizes, _SIZE), dtype=np.int64)
    if ends.size and ends[-1] != len(data):
        return Listed(ids, [], f"listed columns: sizes add up to {ends[-1]} bytes, the answers are {len(data)}")
    if not ends.size and data:
        return Listed(ids, [], f"listed columns: {len(data)} bytes of answers for no ledger")
    bounds = ends.tolist()
    return Listed(ids, [data[s:e] for s, e in zip([0, *bounds][:len(bounds)], bounds, strict=True)])
