from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scrutiny import entrylog
from scrutiny.codec import (
    HEADER_SIZE,
    Availability,
    CodecError,
    SequenceGroup,
    decode,
    encode,
    encode_groups,
    encode_unmerged,
    groups_of,
    is_exact_encoding,
    laid_out,
    leading_words,
)

G = SequenceGroup


def raw(groups: list[tuple[int, int, int, int]], version: int = 0, count: int | None = None) -> bytes:
    header = struct.pack(">ii", version, len(groups) if count is None else count) + bytes(56)
    return header + b"".join(struct.pack(">qqii", *g) for g in groups)


def test_bp34_examples_give_exactly_the_listed_groups() -> None:
    assert decode(encode([1, 2, 4, 5, 7, 8, 10, 11])).groups == (G(1, 10, 2, 3),)
    assert decode(encode([1, 2, 3, 6, 7, 8, 11, 13, 16, 17, 18, 21, 22])).groups == (
        G(1, 6, 3, 5), G(11, 13, 1, 2), G(16, 16, 3, 0), G(21, 21, 2, 0))


def test_layout_is_big_endian_with_a_64_byte_header() -> None:
    data = encode([1, 2, 4, 5, 7, 8, 10, 11])
    assert len(data) == HEADER_SIZE + 24
    assert data[:8] == b"\x00\x00\x00\x00\x00\x00\x00\x01"  # version 0, ONE group (not 8 entries)
    assert data[8:64] == bytes(56)
    assert struct.unpack(">qqii", data[64:]) == (1, 10, 2, 3)


def test_empty_answer_is_64_zero_bytes() -> None:
    assert encode([]) == bytes(64)
    a = decode(bytes(64))
    assert a.count == 0 and a.groups == () and 5 not in a


def test_unsorted_duplicates_and_numpy_input() -> None:
    assert encode([8, 7, 1, 2, 2, 5, 4, 11, 10]) == encode(np.array([1, 2, 4, 5, 7, 8, 10, 11], dtype=np.int32))


def test_java_shape_one_group_per_run_is_accepted() -> None:
    a = decode(encode_unmerged([1, 2, 4, 5, 7, 8]))
    assert a.groups == (G(1, 1, 2, 0), G(4, 4, 2, 0), G(7, 7, 2, 0))
    assert a.entry_ids().tolist() == [1, 2, 4, 5, 7, 8]
    assert a.missing(G(1, 10, 2, 3)) == [G(10, 10, 2, 0)]


def test_membership_count_and_expansion() -> None:
    a = decode(encode([1, 2, 3, 6, 7, 8, 11, 13, 16, 17, 18, 21, 22]))
    assert a.count == 13
    assert [e for e in range(25) if e in a] == [1, 2, 3, 6, 7, 8, 11, 13, 16, 17, 18, 21, 22]
    assert a.entry_ids().tolist() == [1, 2, 3, 6, 7, 8, 11, 13, 16, 17, 18, 21, 22]
    assert "x" not in a and -1 not in a


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "short buffer"),
        (bytes(63), "short buffer"),
        (raw([], version=1), "version 1"),
        (raw([(0, 0, 1, 0)], count=2), "group count 2"),
        (raw([(0, 0, 1, 0)], count=0), "group count 0"),
        (raw([], count=-1), "negative group count"),
        (raw([(0, 0, 0, 0)]), "not positive"),
        (raw([(0, 0, -3, 0)]), "not positive"),
        (raw([(0, 6, 2, 0)]), "sequencePeriod is 0"),
        (raw([(6, 0, 2, 3)]), "before firstSequenceStart"),
        (raw([(0, 7, 2, 3)]), "not a multiple"),
        (raw([(0, 6, 2, -3)]), "negative sequencePeriod"),
        (raw([(10, 10, 2, 0), (0, 0, 2, 0)]), "out of order"),
        (raw([(0, 0, 5, 0), (3, 3, 2, 0)]), "overlapping"),
        (raw([(-5, -5, 2, 0)]), "negative entry id"),
        (raw([(0, 6, 4, 3)]), "overlap"),
        (raw([(2**63 - 2, 2**63 - 2, 5, 0)]), "overflows"),
    ],
)
def test_malformed_answers_are_refused_with_a_clear_error(data: bytes, words: str) -> None:
    with pytest.raises(CodecError, match=words):
        decode(data)


def test_missing_of_a_healthy_ten_million_entry_share_is_computed_on_groups() -> None:
    ids = np.arange(10_000_000, dtype=np.int64)
    share = ids[((0 - ids) % 3) < 2]  # ensemble position 0 of E=3, WQ=2
    a = decode(encode(share))
    assert len(a.groups) == 2  # merged: {0}, then {2, .., 2, 3}
    assert a.missing(G(2, 9_999_998, 2, 3)) == []
    holey = decode(encode(np.setdiff1d(share, np.arange(100, 200))))
    assert holey.missing(G(2, 9_999_998, 2, 3)) == [G(101, 197, 2, 3)]


def test_missing_single_run_expected() -> None:
    a = Availability.of([G(0, 0, 10, 0), G(20, 20, 10, 0)])
    assert a.missing(G(0, 0, 30, 0)) == [G(10, 10, 10, 0)]
    assert Availability.empty().missing(G(5, 5, 3, 0)) == [G(5, 5, 3, 0)]


def test_missing_refuses_a_malformed_expected_set() -> None:
    with pytest.raises(CodecError):
        Availability.empty().missing(G(0, 10, 2, 0))


def test_expansion_is_bounded() -> None:
    a = Availability.of([G(0, 0, 2**31 - 1, 0)])
    with pytest.raises(CodecError, match="refusing to expand"):
        a.entry_ids(limit=1000)


id_sets = st.lists(st.integers(min_value=0, max_value=5000), max_size=300)


@given(id_sets)
def test_roundtrip(ids: list[int]) -> None:
    a = decode(encode(ids))
    assert a.entry_ids().tolist() == sorted(set(ids))
    assert a.count == len(set(ids))
    b = decode(encode_unmerged(ids))
    assert b.entry_ids().tolist() == sorted(set(ids))


@given(id_sets, id_sets)
def test_missing_matches_set_difference(held: list[int], wanted: list[int]) -> None:
    a = decode(encode(held))
    expected_groups = decode(encode(wanted)).groups
    gone = a.missing(expected_groups)
    got = sorted(e for g in gone for e in Availability.of([g]).entry_ids().tolist())
    assert got == sorted(set(wanted) - set(held))


@given(st.integers(1, 7), st.integers(1, 7), st.integers(0, 40), st.integers(0, 400),
       st.lists(st.integers(0, 500), max_size=40))
def test_missing_of_round_robin_shares(e: int, wq: int, lo: int, span: int, lost: list[int]) -> None:
    wq = min(wq, e)
    hi = lo + span
    for pos in range(e):
        share = [x for x in range(lo, hi + 1) if (pos - x) % e < wq]
        held = sorted(set(share) - set(lost))
        gone = decode(encode(held)).missing(decode(encode(share)).groups) if share else []
        got = sorted(x for g in gone for x in Availability.of([g]).entry_ids().tolist())
        assert got == sorted(set(share) & set(lost))


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_random_bytes_never_crash(data: bytes) -> None:
    try:
        a = decode(data)
    except CodecError:
        return
    assert a.count >= 0


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(-3, 2**63 - 1), st.integers(-3, 2**63 - 1),
                          st.integers(-2, 2**31 - 1), st.integers(-2, 2**31 - 1)), max_size=6))
def test_random_groups_are_validated_or_refused(groups: list[tuple[int, int, int, int]]) -> None:
    try:
        a = decode(raw(groups))
    except CodecError:
        return
    # Accepted answers are well formed: membership and counts never crash or allocate.
    assert a.count >= 0
    for g in a.groups:
        assert g.first in a and g.end in a


@settings(max_examples=400)
@given(st.lists(st.tuples(st.integers(-2, 40), st.integers(-2, 40), st.integers(-1, 6), st.integers(-1, 8)),
                max_size=5))
@example([(0, 0, 2, 0), (2, 2, 1, 0)])  # adjacent: valid
@example([(0, 3, 2, 3), (4, 4, 1, 0)])  # overlapping: refused
def test_small_and_large_answers_are_refused_for_the_same_reason(groups: list[tuple[int, int, int, int]]) -> None:
    from scrutiny.codec import _validate_arrays, _validate_rows

    def reason(check: object, *args: object) -> str:
        try:
            check(*args)  # type: ignore[operator]
        except CodecError as exc:
            return str(exc)
        return ""

    columns = [np.array([g[k] for g in groups], dtype=np.int64) for k in range(4)]
    assert reason(_validate_rows, groups) == reason(_validate_arrays, *columns)


small_id_sets = st.lists(st.integers(min_value=0, max_value=400), max_size=120)


@settings(max_examples=100, deadline=None)
@given(small_id_sets, small_id_sets, st.integers(1, 7), st.integers(0, 60), st.integers(0, 400))
def test_an_answer_held_as_rows_or_as_columns_is_the_same_answer(ids: list[int], other: list[int], modulus: int,
                                                                 lo: int, span: int) -> None:
    groups = decode(encode(ids)).groups
    rows = Availability(rows=tuple(tuple(g) for g in groups))  # type: ignore[misc]
    columns = Availability(columns=tuple(np.array([g[k] for g in groups], dtype=np.int64)  # type: ignore[arg-type]
                                         for k in range(4)))
    wanted = decode(encode(other)).groups
    for a in (rows, columns):
        assert a.groups == groups and a.count == len(set(ids)) and a.same_groups(groups)
        assert a.entry_ids().tolist() == sorted(set(ids))
        assert [e in a for e in range(0, 401, 7)] == [e in set(ids) for e in range(0, 401, 7)]
        assert a.residue_intervals(modulus, lo, lo + span) == rows.residue_intervals(modulus, lo, lo + span)
        assert a.missing(wanted) == rows.missing(wanted)
        assert a.same_groups(wanted) == (wanted == groups)


def test_encode_groups_roundtrip() -> None:
    gs = [G(1, 6, 3, 5), G(11, 13, 1, 2)]
    assert list(decode(encode_groups(gs)).groups) == gs


def as_read(answers: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """What `is_exact_encoding` is given of these answers: each one's leading words (3 groups) and its size."""
    data, starts, sizes = laid_out(answers)
    return leading_words(data, starts, 3), sizes


@settings(max_examples=60)
@given(st.lists(id_sets, min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_exact_encodings_are_found_in_bulk_and_nothing_else(sets: list[list[int]], rnd: object) -> None:
    """An answer passes only as the byte-exact encoding of its groups; the reserved header bytes alone
    may differ (decoding ignores them). A malformed answer does not disturb the others' verdicts."""
    import random

    assert isinstance(rnd, random.Random)
    groups = [groups_of(ids)[:3] for ids in sets]
    rows = np.zeros((len(groups), 3, 4), dtype=np.int64)
    for i, gs in enumerate(groups):
        rows[i, :len(gs)] = gs or np.empty((0, 4))
    counts = np.array([len(gs) for gs in groups])
    exact = [encode_groups(gs) for gs in groups]
    assert is_exact_encoding(*as_read(exact), rows, counts).all()
    answers, want = [], []
    for answer in exact:
        kind = rnd.choice(("same", "reserved", "flip", "short", "long", "odd"))
        b = bytearray(answer)
        if kind == "reserved":
            b[rnd.randrange(8, HEADER_SIZE)] ^= 0xFF
        elif kind == "flip":
            at = rnd.choice([*range(8), *range(HEADER_SIZE, len(b))])
            b[at] ^= 1 << rnd.randrange(8)
        elif kind == "short":
            b = b[:-8]
        elif kind == "long":
            b += bytes(24)
        elif kind == "odd":
            b += b"\0"
        answers.append(bytes(b))
        want.append(kind in ("same", "reserved"))
    assert is_exact_encoding(*as_read(answers), rows, counts).tolist() == want


def test_a_direct_io_entry_logs_ledgers_map_ends_at_its_padding() -> None:
    """The direct-I/O entry logger pads its ledgers map to the 4 KiB block with 0xF0 bytes (a size read there is
    negative: BookKeeper's own scanner skips it). The bytes after a real 4.17 bookie's map offset, shortened."""
    record = entrylog.MAP_RECORD.pack(-1, -2, 2) + entrylog.MAP_PAIR.pack(7, 900) + entrylog.MAP_PAIR.pack(9, 40)
    data = entrylog.ENTRY_SIZE.pack(len(record)) + record
    assert entrylog.ledgers_map(data + b"\xf0" * (4096 - len(data))) == [7, 9]
    assert entrylog.ledgers_map(data) == [7, 9]
    with pytest.raises(ValueError, match="ledgers-map record"):
        entrylog.ledgers_map(data + b"\xf0" * 8 + b"\x00" * 8)  # not padding to the end: not a map
