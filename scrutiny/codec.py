"""BP-34's availability encoding: which entries of a ledger a bookie holds, as SequenceGroups.

Layout (all big-endian): int32 version (0), int32 group count, 56 reserved bytes, then per group
int64 firstSequenceStart, int64 lastSequenceStart, int32 sequenceSize, int32 sequencePeriod.

Set arithmetic here works on groups, never on expanded entry ids where the shapes allow it: sets are
turned into per-residue intervals ("entry e = k * modulus + r, for k in [k0, k1]"), so a bookie's
share of a healthy ten-million-entry ledger is a handful of intervals, as for a ten-entry one.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from scrutiny.errors import DataError

HEADER_SIZE = 64
GROUP_SIZE = 24
CURRENT_VERSION = 0
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1  # sequenceSize and sequencePeriod are int32 on the wire
# Refuse to expand more ids than this into memory unless the caller asks for more.
DEFAULT_EXPAND_LIMIT = 50_000_000

_HEADER = struct.Struct(">ii")
_HEADER_DTYPE = np.dtype([("version", ">i4"), ("count", ">i4")])
_GROUP_DTYPE = np.dtype([("first", ">i8"), ("last", ">i8"), ("size", ">i4"), ("period", ">i4")])
# Periods up to this are combined exactly (lcm); larger mixes fall back to run-by-run work.
_MAX_MODULUS = 1 << 16


class CodecError(DataError):
    """An availability answer that does not follow the BP-34 encoding."""


class SequenceGroup(NamedTuple):
    """Entries first + k*period + j, k = 0..(last-first)/period, j = 0..size-1. A tuple: a decoded
    answer's rows compare equal to the groups they hold without building any."""

    first: int
    last: int
    size: int
    period: int

    @property
    def sequences(self) -> int:
        return 1 if self.last == self.first else (self.last - self.first) // self.period + 1

    @property
    def count(self) -> int:  # type: ignore[override]  # tuple.count: a group's tuple is never searched
        return self.sequences * self.size

    @property
    def end(self) -> int:
        """The last entry id of the group."""
        return self.last + self.size - 1

    def __contains__(self, entry_id: object) -> bool:
        if not isinstance(entry_id, int | np.integer):
            return False
        e = int(entry_id)
        if e < self.first or e > self.end:
            return False
        if self.last == self.first:
            return True
        offset = (e - self.first) % self.period
        return offset < self.size and e - offset <= self.last


# ---------------------------------------------------------------------------------------------
# Encoding


def _sorted_unique(entry_ids: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(entry_ids, np.ndarray):
        arr = entry_ids.astype(np.int64, copy=False).ravel()
    else:
        arr = np.fromiter((int(e) for e in entry_ids), dtype=np.int64)
    if arr.size and arr.min() < 0:
        raise CodecError(f"negative entry id {int(arr.min())}")
    # Sort and de-duplicate by hand: much faster than np.unique here, and free when already sorted.
    step = np.diff(arr)
    if step.size and not bool((step > 0).all()):
        arr = np.sort(arr)
        arr = arr[np.concatenate(([True], np.diff(arr) != 0))]
    return arr


def group_runs(starts: np.ndarray, sizes: np.ndarray) -> list[SequenceGroup]:
    """BP-34's greedy grouping of runs (sorted, disjoint, non-adjacent) into SequenceGroups.

    A group starts with one run; the next run of the same size sets the period; further runs of
    that size at that period extend it; anything else closes it. Runs never merge at a period that
    would not fit the int32 sequencePeriod (such runs stay groups of their own).
    """
    n = int(starts.size)
    if n == 0:
        return []
    # link i: run i+1 may follow run i in one group (same size); key: (size, gap) of the link.
    gaps = np.diff(starts)
    linked = (sizes[1:] == sizes[:-1]) & (gaps <= INT32_MAX)
    # chain_end[i]: the last link of the unbroken stretch of links with the same key starting at i.
    breaks = np.ones(max(n - 1, 0), dtype=bool)
    if n > 2:
        breaks[1:] = ~(linked[1:] & linked[:-1] & (gaps[1:] == gaps[:-1]))
    stretch_id = np.cumsum(breaks) - 1
    stretch_last = np.zeros(int(stretch_id[-1]) + 1 if n > 1 else 0, dtype=np.int64)
    if n > 1:
        stretch_last[stretch_id] = np.arange(n - 1)
    groups: list[SequenceGroup] = []
    starts_l = starts.tolist()
    sizes_l = sizes.tolist()
    linked_l = linked.tolist()
    i = 0
    while i < n:
        if i < n - 1 and linked_l[i]:
            last_link = int(stretch_last[stretch_id[i]])
            j = last_link + 1
            groups.append(SequenceGroup(starts_l[i], starts_l[j], sizes_l[i], starts_l[i + 1] - starts_l[i]))
            i = j + 1
        else:
            groups.append(SequenceGroup(starts_l[i], starts_l[i], sizes_l[i], 0))
            i += 1
    return groups


def runs_of(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive ids in a sorted unique array: (starts, sizes)."""
    if ids.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    begin = np.concatenate(([0], cut))
    end = np.concatenate((cut, [ids.size]))
    return ids[begin], end - begin


def groups_of(entry_ids: Iterable[int] | np.ndarray) -> list[SequenceGroup]:
    """The merged SequenceGroups of a set of entry ids (any order, duplicates allowed)."""
    starts, sizes = runs_of(_sorted_unique(entry_ids))
    if sizes.size and int(sizes.max()) > INT32_MAX:
        starts, sizes = _split_long_runs(starts, sizes)
    return group_runs(starts, sizes)


def _split_long_runs(starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs longer than the int32 sequenceSize, as adjacent runs that fit it."""
    out_starts: list[int] = []
    out_sizes: list[int] = []
    for s, z in zip(starts.tolist(), sizes.tolist(), strict=True):
        while z > INT32_MAX:
            out_starts.append(s)
            out_sizes.append(INT32_MAX)
            s, z = s + INT32_MAX, z - INT32_MAX
        out_starts.append(s)
        out_sizes.append(z)
    return np.array(out_starts, dtype=np.int64), np.array(out_sizes, dtype=np.int64)


def encode_groups(groups: Sequence[SequenceGroup]) -> bytes:
    arr = np.empty(len(groups), dtype=_GROUP_DTYPE)
    if groups:
        arr["first"] = [g.first for g in groups]
        arr["last"] = [g.last for g in groups]
        arr["size"] = [g.size for g in groups]
        arr["period"] = [g.period for g in groups]
    return _HEADER.pack(CURRENT_VERSION, len(groups)) + bytes(HEADER_SIZE - _HEADER.size) + arr.tobytes()


EMPTY_ANSWER = encode_groups([])


def encode(entry_ids: Iterable[int] | np.ndarray) -> bytes:
    """Encode a set of entry ids, merging sequences into groups as BP-34 describes."""
    return encode_groups(groups_of(entry_ids))


def encode_unmerged(entry_ids: Iterable[int] | np.ndarray) -> bytes:
    """One single-sequence group per run: the shape a real (upstream Java) bookie sends."""
    starts, sizes = _split_long_runs(*runs_of(_sorted_unique(entry_ids)))
    return encode_groups([SequenceGroup(s, s, z, 0) for s, z in zip(starts.tolist(), sizes.tolist(), strict=True)])


def laid_out(answers: Sequence[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Answers one after another, each from a multiple of 8 bytes (zeros between), as `is_exact_encoding` reads
    them: (the bytes, where each starts, its size)."""
    sizes = np.fromiter(map(len, answers), np.int64, len(answers))
    if not (sizes & 7).any():  # every well-formed answer (64 + 24 * groups bytes)
        return b"".join(answers), np.cumsum(sizes) - sizes, sizes
    padded = sizes + (-sizes & 7)
    return (b"".join([a + bytes(-len(a) & 7) for a in answers]), np.cumsum(padded) - padded, sizes)


def leading_words(data: bytes, starts: np.ndarray, k: int) -> np.ndarray:
    """(n, 1 + 3k) uint64: of each answer from `starts` (multiples of 8) in `data` (a whole number of 64-bit
    words), its first header word and the words of its first k groups as `is_exact_encoding` compares them;
    zeros past the end of `data`."""
    words = np.frombuffer(data, np.uint64)
    at = starts[:, None] // 8 + np.concatenate([[0], np.arange(HEADER_SIZE // 8, HEADER_SIZE // 8 + 3 * k)])
    inside = at < words.size
    leading = np.zeros(at.shape, dtype=np.uint64)
    leading[inside] = words[at[inside]]
    return leading


def is_exact_encoding(leading: np.ndarray, sizes: np.ndarray, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Which answers are exactly the encoding of their groups: answer i, of `sizes[i]` bytes (negative: no answer)
    and `leading[i]` its `leading_words`, of the first `counts[i]` rows of `rows[i]` ((n, k, 4) ints: first,
    last, size, period). All at once and as 64-bit words, so that such an answer is never decoded; the reserved
    header bytes are not compared (decoding ignores them)."""
    k = rows.shape[1]
    header = np.zeros(len(counts), _HEADER_DTYPE)
    header["count"] = counts
    groups = np.zeros((len(counts), k), _GROUP_DTYPE)
    for i, name in enumerate(_GROUP_DTYPE.names or ()):
        groups[name] = rows[..., i]
    unused = np.arange(3 * k) >= 3 * counts[:, None]
    return ((sizes == HEADER_SIZE + GROUP_SIZE * counts) & (leading[:, 0] == header.view(np.uint64))
            & ((leading[:, 1:1 + 3 * k] == groups.view(np.uint64)) | unused).all(axis=1))


# ---------------------------------------------------------------------------------------------
# Decoding


def decode(data: bytes | bytearray | memoryview) -> Availability:
    """Decode and validate an answer; raises CodecError naming what is wrong."""
    buf = data if type(data) is bytes else bytes(data)
    if len(buf) < HEADER_SIZE:
        raise CodecError(f"short buffer: {len(buf)} bytes, the header alone is {HEADER_SIZE}")
    version, count = _HEADER.unpack_from(buf, 0)
    if version > CURRENT_VERSION or version < 0:
        raise CodecError(f"unsupported header version {version} (this decoder reads version 0)")
    if count < 0:
        raise CodecError(f"negative group count {count}")
    expected_len = HEADER_SIZE + GROUP_SIZE * count
    if len(buf) != expected_len:
        raise CodecError(
            f"group count {count} needs {expected_len} bytes but the answer has {len(buf)}"
        )
    if count <= _SMALL_ANSWER:
        # Most answers (a healthy share is up to three groups per segment): Python ints, no numpy.
        rows = tuple(_GROUP.iter_unpack(buf[HEADER_SIZE:]))
        _validate_rows(rows)
        return Availability(rows=rows)
    arr = np.frombuffer(buf, dtype=_GROUP_DTYPE, offset=HEADER_SIZE, count=count)
    first, last, size, period = (arr[name].astype(np.int64) for name in ("first", "last", "size", "period"))
    _validate_arrays(first, last, size, period)
    return Availability(columns=(first, last, size, period))


# Each group's rules, checked in this order; written so that they read the same over Python ints (a
# small answer, checked group by group: numpy costs more than the work there) and numpy arrays (a large one).
_GROUP_RULES: tuple[tuple[str, Callable[[Any, Any, Any, Any], Any]], ...] = (
    ("negative entry id", lambda f, la, s, p: f < 0),
    ("sequenceSize is not positive", lambda f, la, s, p: s <= 0),
    ("negative sequencePeriod", lambda f, la, s, p: p < 0),
    ("lastSequenceStart is before firstSequenceStart", lambda f, la, s, p: la < f),
    ("sequencePeriod is 0 but lastSequenceStart differs from firstSequenceStart",
     lambda f, la, s, p: (p == 0) & (la != f)),
    # p + (p <= 0): a period of 0 divides by 1 (such groups are single sequences, checked above)
    ("lastSequenceStart - firstSequenceStart is not a multiple of sequencePeriod",
     lambda f, la, s, p: (p > 0) & ((la - f) % (p + (p <= 0)) != 0)),
    ("sequences of the group overlap (sequenceSize > sequencePeriod)",
     lambda f, la, s, p: (p > 0) & (la != f) & (s > p)),
    ("the group's last entry id overflows a signed 64-bit integer", lambda f, la, s, p: la > INT64_MAX - (s - 1)),
)
_ORDER = "groups out of order or overlapping (starts at or before the previous group's end)"
_SMALL_ANSWER = 16  # groups; up to this many are held and checked as Python ints
_GROUP = struct.Struct(">qqii")
Row = tuple[int, int, int, int]  # (first, last, size, period): a SequenceGroup's fields
Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # the same, one array per field


def _invalid(i: int, first: int, what: str) -> CodecError:
    return CodecError(f"group {i} (firstSequenceStart {first}): {what}")


def _validate_rows(rows: Sequence[Row]) -> None:
    end = -1
    for f, la, s, p in rows:  # the common case, every rule at once; the table below names a failure
        if not (end < f and s > 0 and la >= f and la <= INT64_MAX - (s - 1)
                and (la == f if p == 0 else p > 0 and (la - f) % p == 0 and (la == f or s <= p))):
            break
        end = la + s - 1
    else:
        return
    for what, rule in _GROUP_RULES:
        for i, row in enumerate(rows):
            if rule(*row):
                raise _invalid(i, row[0], what)
    for i in range(1, len(rows)):
        if rows[i][0] <= rows[i - 1][1] + rows[i - 1][2] - 1:
            raise _invalid(i, rows[i][0], _ORDER)


def _validate_arrays(first: np.ndarray, last: np.ndarray, size: np.ndarray, period: np.ndarray) -> None:
    def fail(what: str, mask: np.ndarray) -> None:
        bad = np.flatnonzero(mask)
        if bad.size:
            raise _invalid(int(bad[0]), int(first[bad[0]]), what)

    for what, rule in _GROUP_RULES:
        fail(what, rule(first, last, size, period))
    if first.size > 1:
        fail(_ORDER, np.concatenate(([False], first[1:] <= (last + size - 1)[:-1])))


class Availability:
    """A decoded, validated answer: the entries one bookie holds of one ledger. A small answer is
    kept as Python int rows (comparing it with an expected share is then a tuple comparison), a
    large one as numpy columns; either is derived from the other when first needed."""

    __slots__ = ("_columns", "_rows")

    def __init__(self, *, rows: tuple[Row, ...] | None = None, columns: Columns | None = None) -> None:
        self._rows, self._columns = rows, columns

    @classmethod
    def of(cls, groups: Sequence[SequenceGroup]) -> Availability:
        """From groups (checked like a decoded answer)."""
        if len(groups) <= _SMALL_ANSWER:
            rows = tuple((int(g.first), int(g.last), int(g.size), int(g.period)) for g in groups)
            _validate_rows(rows)
            return cls(rows=rows)
        first, last, size, period = (np.array([g[i] for g in groups], dtype=np.int64) for i in range(4))
        _validate_arrays(first, last, size, period)
        return cls(columns=(first, last, size, period))

    @classmethod
    def empty(cls) -> Availability:
        return cls(rows=())

    @property
    def _cols(self) -> Columns:
        if self._columns is None:
            rows = self._rows or ()
            first, last, size, period = (np.array([r[i] for r in rows], dtype=np.int64) for i in range(4))
            self._columns = (first, last, size, period)
        return self._columns

    @property
    def rows(self) -> tuple[Row, ...]:
        if self._rows is None:
            self._rows = tuple(zip(*(c.tolist() for c in self._cols), strict=True))
        return self._rows

    @property
    def groups(self) -> tuple[SequenceGroup, ...]:
        return tuple(map(SequenceGroup._make, self.rows))

    def __len__(self) -> int:
        return self.count

    @property
    def count(self) -> int:
        """How many entries the answer holds."""
        if self._rows is not None:
            return sum(SequenceGroup._make(r).count for r in self._rows)
        first, last, size, period = self._cols
        single = last == first
        seqs = np.where(single, 1, (last - first) // np.where(single, 1, period) + 1)
        # uint64: one group may hold up to 2^63 ids; the sum is taken in Python ints.
        return sum((seqs.astype(np.uint64) * size.astype(np.uint64)).tolist())

    @property
    def highest(self) -> int:
        """The highest entry id held (-1 when none)."""
        if self._rows is not None:
            return max((r[1] + r[2] - 1 for r in self._rows), default=-1)
        first, last, size, _ = self._cols
        return int((last + size - 1).max()) if first.size else -1

    def same_groups(self, groups: Sequence[Row]) -> bool:
        """Held as exactly these groups? Cheap; the same set in another grouping is not seen here."""
        if self._rows is None and len(groups) != self._cols[0].size:
            return False
        return self.rows == tuple(groups)

    def __contains__(self, entry_id: object) -> bool:
        if not isinstance(entry_id, int | np.integer):
            return False
        columns = self._cols
        i = int(np.searchsorted(columns[0], int(entry_id), side="right")) - 1
        return i >= 0 and int(entry_id) in SequenceGroup._make(int(c[i]) for c in columns)

    def entry_ids(self, limit: int = DEFAULT_EXPAND_LIMIT) -> np.ndarray:
        """Every entry id held, ascending; refuses (CodecError) to expand more than `limit` ids."""
        total = self.count
        if total > limit:
            raise CodecError(f"refusing to expand {total} entry ids (limit {limit})")
        first, last, size, period = self._cols
        single = last == first
        seqs = np.where(single, 1, (last - first) // np.where(single, 1, period) + 1)
        per_group = seqs * size
        starts = np.cumsum(per_group) - per_group
        # Position t of group g holds first + (t // size) * period + t % size.
        g = np.repeat(np.arange(per_group.size), per_group)
        t = np.arange(total, dtype=np.int64) - starts[g]
        sizes = size[g]
        return first[g] + (t // sizes) * period[g] + t % sizes

    def missing(self, expected: SequenceGroup | Sequence[SequenceGroup]) -> list[SequenceGroup]:
        """The entries of `expected` that this answer does not hold, as disjoint groups sorted by
        first entry (their spans may interleave), computed on groups."""
        wanted = sorted([expected] if isinstance(expected, SequenceGroup) else expected)
        if not wanted:
            return []
        Availability.of(wanted)  # the expected set must itself be well formed
        held_periods = self._cols[3]
        periods = [g.period for g in wanted if g.period] or held_periods[held_periods > 0][:1].tolist()
        modulus = 1
        for p in periods:
            modulus = math.lcm(modulus, p)
            if modulus > _MAX_MODULUS:
                # Odd mixes of periods: work sequence by sequence instead of by residue.
                modulus = 1
                break
        lo = min(g.first for g in wanted)
        hi = max(g.end for g in wanted)
        want = residue_intervals(wanted, modulus, lo, hi)
        have = self.residue_intervals(modulus, lo, hi)
        gone = [subtract(w, h) for w, h in zip(want, have, strict=True)]
        return groups_from_residues(gone, modulus)

    def residue_intervals(self, modulus: int, lo: int, hi: int) -> list[list[tuple[int, int]]]:
        """Held entries within [lo, hi] as, per residue r mod `modulus`, sorted disjoint
        inclusive intervals [k0, k1] of k where entry k * modulus + r is held."""
        if hi < lo:
            return [[] for _ in range(modulus)]
        if self._rows is not None:
            return residue_intervals(map(SequenceGroup._make, self._rows), modulus, lo, hi)
        # Only the groups whose span meets [lo, hi].
        first, last, size, period = self._cols
        a = int(np.searchsorted(last + size - 1, lo, side="left"))
        b = int(np.searchsorted(first, hi, side="right"))
        sub = zip(first[a:b].tolist(), last[a:b].tolist(), size[a:b].tolist(), period[a:b].tolist(), strict=True)
        return residue_intervals(map(SequenceGroup._make, sub), modulus, lo, hi)


# ---------------------------------------------------------------------------------------------
# Residue-interval arithmetic (pure, shared with the coverage check)

Intervals = list[tuple[int, int]]


def _append(out: Intervals, k0: int, k1: int) -> None:
    """Append an interval to a list kept sorted by construction, merging touching neighbours."""
    if k1 < k0:
        return
    if out and k0 <= out[-1][1] + 1:
        if k1 > out[-1][1]:
            out[-1] = (out[-1][0], k1)
        return
    out.append((k0, k1))


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _run_into(per_residue: list[Intervals], start: int, stop: int, modulus: int) -> None:
    """Add the single run [start, stop] to per-residue intervals."""
    if stop - start + 1 >= modulus:
        for r in range(modulus):
            _append(per_residue[r], _ceil_div(start - r, modulus), (stop - r) // modulus)
    else:
        for e in range(start, stop + 1):
            _append(per_residue[e % modulus], e // modulus, e // modulus)


def residue_intervals(groups: Iterable[SequenceGroup], modulus: int, lo: int, hi: int) -> list[Intervals]:
    """Groups (sorted by first entry) clipped to [lo, hi], as per-residue k-intervals."""
    per_residue: list[Intervals] = [[] for _ in range(modulus)]
    deferred: list[tuple[int, int]] = []
    for g in groups:
        if g.end < lo or g.first > hi:
            continue
        if g.last == g.first:
            _run_into(per_residue, max(g.first, lo), min(g.end, hi), modulus)
        elif g.period == modulus:
            # Each offset j of the group's sequences is one residue, one k-interval.
            for j in range(g.size):
                r = (g.first + j) % modulus
                e0 = g.first + j
                e1 = g.last + j
                e0 = e0 if e0 >= lo else e0 + _ceil_div(lo - e0, g.period) * g.period
                e1 = e1 if e1 <= hi else e1 - _ceil_div(e1 - hi, g.period) * g.period
                if e0 <= e1:
                    _append(per_residue[r], e0 // modulus, e1 // modulus)
        else:
            # Shapes that do not line up with the modulus: sequence by sequence, clipped.
            k_lo = max(0, _ceil_div(lo - (g.first + g.size - 1), g.period))
            k_hi = min((g.last - g.first) // g.period, (hi - g.first) // g.period)
            for k in range(k_lo, k_hi + 1):
                s = g.first + k * g.period
                deferred.append((max(s, lo), min(s + g.size - 1, hi)))
    if deferred:
        # Sequences of different groups can interleave here; sort so _append can merge.
        runs: list[Intervals] = [[] for _ in range(modulus)]
        for s, e in deferred:
            _run_into(runs, s, e, modulus)
        per_residue = [union(a, b) for a, b in zip(per_residue, runs, strict=True)]
    return per_residue


def union(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    for k0, k1 in sorted(a + b):
        _append(out, k0, k1)
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a minus b, both sorted and disjoint."""
    out: Intervals = []
    j = 0
    for k0, k1 in a:
        cur = k0
        while j < len(b) and b[j][1] < cur:
            j += 1
        i = j
        while i < len(b) and b[i][0] <= k1 and cur <= k1:
            if b[i][0] > cur:
                out.append((cur, b[i][0] - 1))
            cur = max(cur, b[i][1] + 1)
            i += 1
        if cur <= k1:
            out.append((cur, k1))
    return out


def groups_from_residues(per_residue: Sequence[Intervals], modulus: int) -> list[SequenceGroup]:
    """Per-residue k-intervals back into groups. Residue r with interval (k0, k1) continues into
    residue r+1 with the same interval, or from the last residue into residue 0 at (k0+1, k1+1):
    such chains are the sequences of one group."""
    items = {(r, k0, k1) for r, intervals in enumerate(per_residue) for k0, k1 in intervals}

    def successor(item: tuple[int, int, int]) -> tuple[int, int, int]:
        r, k0, k1 = item
        return (r + 1, k0, k1) if r + 1 < modulus else (0, k0 + 1, k1 + 1)

    def predecessor(item: tuple[int, int, int]) -> tuple[int, int, int]:
        r, k0, k1 = item
        return (r - 1, k0, k1) if r > 0 else (modulus - 1, k0 - 1, k1 - 1)

    out: list[SequenceGroup] = []
    for head in items:
        if predecessor(head) in items:
            continue
        length, nxt = 1, successor(head)
        while nxt in items:
            length, nxt = length + 1, successor(nxt)
        r, k0, k1 = head
        first, last = k0 * modulus + r, k1 * modulus + r
        if k1 == k0 or length >= modulus:
            # One sequence, or sequences that touch: a single run.
            out.append(SequenceGroup(first, first, last - first + length, 0))
        else:
            out.append(SequenceGroup(first, last, length, modulus))
    out.sort()
    return out
