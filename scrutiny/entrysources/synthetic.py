"""The synthetic store: one compact file per bookie (ledger id -> SequenceGroups) for the demo, the tests and
the benchmarks; its format, its reader (the agent's `--source synthetic`) and its writer."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from scrutiny import codec
from scrutiny.codec import SequenceGroup
from scrutiny.entrysources.source import Holding, SourceError

_MAGIC = b"SCRSYN01"
_HEAD = struct.Struct("<8sqq")
CORRUPT = -1  # a ledger whose answer the agent garbles (fault injection)


class SyntheticStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                head = f.read(_HEAD.size)
        except OSError as exc:
            raise SourceError(f"synthetic store {self.path}: {exc.strerror}") from None
        if len(head) < _HEAD.size or head[:8] != _MAGIC:
            raise SourceError(f"{self.path} is not a synthetic store file")
        _, n_ledgers, n_groups = _HEAD.unpack(head)
        size = self.path.stat().st_size
        if size != _HEAD.size + 8 * (3 * n_ledgers + 4 * n_groups):
            raise SourceError(f"{self.path} is truncated or corrupt")
        self._index = np.memmap(self.path, dtype="<i8", mode="r", offset=_HEAD.size, shape=(n_ledgers, 3)) \
            if n_ledgers else np.empty((0, 3), np.int64)
        self._groups = np.memmap(self.path, dtype="<i8", mode="r", offset=_HEAD.size + 24 * n_ledgers,
                                 shape=(n_groups, 4)) if n_groups else np.empty((0, 4), np.int64)
        self._ids = np.asarray(self._index[:, 0])

    def __len__(self) -> int:
        return int(self._ids.size)

    def refresh(self) -> None:
        pass  # a file written once

    def availability(self, ledger_id: int) -> Holding | None:
        return self.availability_many([ledger_id])[0]

    def list_ledgers(self, from_id: int, limit: int) -> tuple[np.ndarray, bool]:
        at = int(np.searchsorted(self._ids, from_id))
        return np.array(self._ids[at:at + limit], dtype=np.int64), at + limit >= self._ids.size

    def availability_many(self, ledger_ids: Sequence[int]) -> list[Holding | None]:
        """Many answers at once: the groups of every ledger asked encoded in one numpy pass, then cut."""
        if not self._ids.size:
            return [None] * len(ledger_ids)
        ids = np.asarray(ledger_ids, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._ids, ids), self._ids.size - 1)
        found = self._ids[at] == ids
        starts = np.where(found, self._index[at, 1], 0)
        counts = np.where(found, self._index[at, 2], 0)
        sizes = np.maximum(counts, 0)
        total = int(sizes.sum())
        rows = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(total)
        g = self._groups[rows] if total else np.empty((0, 4), np.int64)
        arr = np.empty(total, dtype=[("first", ">i8"), ("last", ">i8"), ("size", ">i4"), ("period", ">i4")])
        arr["first"], arr["last"], arr["size"], arr["period"] = g[:, 0], g[:, 1], g[:, 2], g[:, 3]
        body = arr.tobytes()
        # entries per group, then per ledger (the agent's CPU budget counts them)
        per_group = np.where(g[:, 1] == g[:, 0], 1, (g[:, 1] - g[:, 0]) // np.maximum(g[:, 3], 1) + 1) * g[:, 2]
        ends = np.cumsum(sizes)
        totals = np.concatenate(([0], np.cumsum(per_group)))
        per_ledger = totals[ends] - totals[ends - sizes]
        out: list[Holding | None] = []
        offset = 0
        for ok, count, n in zip(found.tolist(), counts.tolist(), per_ledger.tolist(), strict=True):
            if not ok:
                out.append(None)
            elif count == CORRUPT:
                out.append(Holding(codec.encode([1, 2, 3])[:70]))  # a truncated answer: refused by every decoder
            else:
                out.append(Holding(struct.pack(">ii", codec.CURRENT_VERSION, count) + bytes(56)
                                   + body[offset * 24:(offset + count) * 24], entries=int(n)))
                offset += count
        return out

    def close(self) -> None:
        pass


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
