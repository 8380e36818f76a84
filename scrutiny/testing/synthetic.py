"""Writes the synthetic store files the agent serves with `--source synthetic` (demo, tests, benchmarks)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from scrutiny import codec
from scrutiny.codec import SequenceGroup
from scrutiny.entrysources import _HEAD, _MAGIC, CORRUPT

__all__ = ["CORRUPT", "SyntheticStoreWriter"]


class SyntheticStoreWriter:
    """Collects each bookie's ledgers as groups; faults are just other groups (missing entries,
    extra copies), no entry (a lost ledger copy), or CORRUPT (an undecodable answer)."""

    def __init__(self) -> None:
        self._ledgers: dict[str, list[int]] = {}
        self._counts: dict[str, list[int]] = {}
        self._groups: dict[str, list[int]] = {}

    def add(self, bookie_id: str, ledger_id: int, groups: Sequence[SequenceGroup] | int) -> None:
        self._ledgers.setdefault(bookie_id, []).append(ledger_id)
        counts = self._counts.setdefault(bookie_id, [])
        if isinstance(groups, int):
            counts.append(groups)
            return
        counts.append(len(groups))
        flat = self._groups.setdefault(bookie_id, [])
        for g in groups:
            flat += (g.first, g.last, g.size, g.period)

    def add_entries(self, bookie_id: str, ledger_id: int, entry_ids: Iterable[int] | np.ndarray) -> None:
        self.add(bookie_id, ledger_id, codec.groups_of(entry_ids))

    def bookies(self) -> list[str]:
        return sorted(self._ledgers)

    def write(self, bookie_id: str, path: str | Path) -> None:
        ledgers = np.array(self._ledgers.get(bookie_id, []), dtype=np.int64)
        counts = np.array(self._counts.get(bookie_id, []), dtype=np.int64)
        groups = np.array(self._groups.get(bookie_id, []), dtype=np.int64).reshape(-1, 4)
        starts = np.concatenate(([0], np.cumsum(np.maximum(counts, 0))[:-1])) if counts.size else counts
        order = np.argsort(ledgers, kind="stable")
        if ledgers.size and np.any(np.diff(ledgers[order]) == 0):
            raise ValueError(f"bookie {bookie_id}: a ledger was added twice")
        index = np.stack([ledgers[order], starts[order], counts[order]], axis=1) if ledgers.size else (
            np.empty((0, 3), np.int64))
        tmp = Path(f"{path}.tmp")
        with open(tmp, "wb") as f:
            f.write(_HEAD.pack(_MAGIC, index.shape[0], groups.shape[0]))
            f.write(np.ascontiguousarray(index, dtype="<i8").tobytes())
            f.write(np.ascontiguousarray(groups, dtype="<i8").tobytes())
        os.replace(tmp, path)

    def write_all(self, directory: str | Path) -> dict[str, Path]:
        Path(directory).mkdir(parents=True, exist_ok=True)
        out = {}
        for b in self.bookies():
            p = Path(directory) / f"{b.replace(':', '_')}.synth"
            self.write(b, p)
            out[b] = p
        return out
