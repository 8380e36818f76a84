"""The agents' EOK answers as columns: read back as written, and columns that do not line up named, never
guessed at."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from scrutiny.bookieclient import take, take_listed
from scrutiny.checks import BookieAnswer, BookieAnswers, Outcome
from scrutiny.codec import is_exact_encoding, leading_words
from scrutiny.listedcolumns import Listed, joined, listed_columns, read_listed
from scrutiny.v1 import bookie_pb2

ledger_ids = st.integers(min_value=0, max_value=2**63 - 1)


@given(st.lists(st.tuples(ledger_ids, st.binary(max_size=200)), max_size=50))
def test_columns_are_read_back_as_written(answers: list[tuple[int, bytes]]) -> None:
    ids, encoded = [i for i, _ in answers], [a for _, a in answers]
    wire = bookie_pb2.ListedColumns.FromString(listed_columns(ids, encoded).SerializeToString())
    got = read_listed(wire)
    assert got.ledger_ids.tolist() == ids and got.answers() == encoded and not got.problem


one_group = st.binary(min_size=80, max_size=80).map(lambda b: bytes(4) + (1).to_bytes(4, "big") + b)


@given(st.lists(st.lists(st.tuples(st.integers(0, 30), st.one_of(st.binary(max_size=100), one_group)), max_size=12),
                max_size=5))
@example([[(5, b"c" * 8), (6, b"d" * 8)], [(1, b"a" * 8), (2, b"b" * 8)], [(2, b"again!!!"), (3, b"e" * 8)]])  # overlap
def test_joined_columns_keep_each_ledgers_first_answer_and_are_read_as_words(
        messages: list[list[tuple[int, bytes]]]) -> None:
    """Several messages' columns as one: each ledger's first answer, ledgers ascending, and every answer where
    `is_exact_encoding` reads it as 64-bit words, whatever its size."""
    parts = [read_listed(listed_columns([i for i, _ in m], [a for _, a in m])) for m in messages]
    first: dict[int, bytes] = {}
    for m in messages:
        for lid, answer in m:
            first.setdefault(lid, answer)
    one = joined(parts)
    assert one.ledger_ids.tolist() == sorted(first) and one.answers() == [first[i] for i in sorted(first)]
    assert not (one.starts % 8).any() and not len(one.data) % 8
    # each answer against itself read as one header word and one group: only those of that very shape pass
    groups = [tuple(np.frombuffer(a[64:88], ">i8,>i8,>i4,>i4")[0]) if len(a) == 88 else (0, 0, 0, 0)
              for a in one.answers()]
    rows = np.array(groups, dtype=np.int64).reshape(-1, 1, 4)
    exact = is_exact_encoding(leading_words(one.data, one.starts, 1), one.sizes, rows, np.ones(len(first), np.int64))
    assert exact.tolist() == [len(a) == 88 and a[:8] == bytes(4) + (1).to_bytes(4, "big") for a in one.answers()]


@given(st.lists(st.integers(0, 10**6), unique=True, max_size=40).map(sorted),
       st.lists(st.integers(1, 8), max_size=8), st.randoms(), st.data())
def test_messages_that_follow_one_another_are_joined_end_to_end_in_any_order(
        ids: list[int], cuts: list[int], rng: random.Random, data: st.DataObject) -> None:
    """A bookie's messages as its agent sends them (each ascending, each after the last), come in any order: joined
    as one, each answer its own, words aligned."""
    answers = {i: data.draw(st.one_of(st.binary(max_size=100), one_group)) for i in ids}
    messages, at = [], 0
    for n in [*cuts, len(ids)]:
        messages.append(ids[at:at + n])
        at += n
    rng.shuffle(messages)
    one = joined([read_listed(listed_columns(m, [answers[i] for i in m])) for m in messages])
    assert one.ledger_ids.tolist() == ids and one.answers() == [answers[i] for i in ids]
    assert not (one.starts % 8).any() and not len(one.data) % 8


def test_columns_that_do_not_line_up_are_named() -> None:
    good = listed_columns([7, 9], [b"a" * 64, b"b" * 88])
    cases = {
        "ledger_ids": (good.ledger_ids[:-1], [], "15 bytes of ledger ids, not a whole number of 8"),
        "sizes": (good.sizes[:-4], [7, 9], "4 bytes of sizes for 2 ledgers"),
        "availability": (good.availability + b"x", [7, 9], "sizes add up to 152 bytes, the answers are 153"),
    }
    for name, (value, named, problem) in cases.items():
        msg = bookie_pb2.ListedColumns()
        msg.CopyFrom(good)
        setattr(msg, name, value)
        got = read_listed(msg)
        assert got.ledger_ids.tolist() == named and not got.answers() and got.problem == f"listed columns: {problem}"
    stray = read_listed(bookie_pb2.ListedColumns(availability=b"x" * 64))
    assert not stray.ledger_ids.size and stray.problem == "listed columns: 64 bytes of answers for no ledger"


def test_a_reader_takes_the_first_answer_of_each_ledger_asked_only() -> None:
    got = BookieAnswers("b1:3181")
    got.other[3] = BookieAnswer(Outcome.NO_LEDGER)
    listed = read_listed(listed_columns([1, 2, 3, 1, 99], [b"one", b"two", b"three", b"again", b"stray"]))
    problem = take_listed("b1:3181", listed, np.array([1, 2, 3]), got)
    columns = got.columns()
    assert problem == "" and columns.ledger_ids.tolist() == [1, 2] and columns.answers() == [b"one", b"two"]
    assert got.other[3].outcome is Outcome.NO_LEDGER and sorted(got) == [1, 2, 3] and 99 not in got


def test_columns_that_do_not_line_up_make_their_ledgers_invalid() -> None:
    got = BookieAnswers("b1:3181")
    got.encoded[1] = b"kept"
    problem = take_listed("b1:3181", Listed.unreadable(np.array([1, 2, 5]), "listed columns: broken"), np.array([1, 2]),
                          got)
    assert problem == "listed columns: broken" and got.encoded == {1: b"kept"} and set(got.other) == {2}
    assert got.other[2].outcome is Outcome.INVALID and got.other[2].reason == "bookie b1:3181: listed columns: broken"


def test_an_answer_one_at_a_time_after_the_columns_that_listed_its_ledger_does_not_count() -> None:
    """The first answer counts wherever it came: columns, then the same ledger as a sub-message (not taken);
    a sub-message, then columns that list its ledger again (not taken either)."""
    got = BookieAnswers("b1:3181")
    asked = np.array([1, 2, 3])
    assert take_listed("b1:3181", read_listed(listed_columns([1], [b"first"])), asked, got) == ""
    take("b1:3181", 1, bookie_pb2.GetListOfEntriesOfALedgerResponse(ledger_id=1, status=bookie_pb2.ENOLEDGER), got)
    take("b1:3181", 2, bookie_pb2.GetListOfEntriesOfALedgerResponse(ledger_id=2, status=bookie_pb2.ENOLEDGER), got)
    assert take_listed("b1:3181", read_listed(listed_columns([2, 3], [b"second", b"third"])), asked, got) == ""
    columns = got.columns()
    assert columns.ledger_ids.tolist() == [1, 3] and columns.answers() == [b"first", b"third"]
    assert set(got.other) == {2} and len(got) == 3 and got.unanswered([0, 1, 2, 3, 4]) == [0, 4]
