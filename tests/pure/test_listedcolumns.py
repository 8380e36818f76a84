"""The agents' EOK answers as columns: read back as written, and columns that do not line up named, never
guessed at."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scrutiny.bookieclient import take_listed
from scrutiny.checks import BookieAnswer, BookieAnswers, Outcome
from scrutiny.listedcolumns import Listed, listed_columns, read_listed
from scrutiny.v1 import bookie_pb2

ledger_ids = st.integers(min_value=0, max_value=2**63 - 1)


@given(st.lists(st.tuples(ledger_ids, st.binary(max_size=200)), max_size=50))
def test_columns_are_read_back_as_written(answers: list[tuple[int, bytes]]) -> None:
    ids, encoded = [i for i, _ in answers], [a for _, a in answers]
    wire = bookie_pb2.ListedColumns.FromString(listed_columns(ids, encoded).SerializeToString())
    assert read_listed(wire) == Listed(ids, encoded)


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
        assert got.ledger_ids == named and not got.answers and got.problem == f"listed columns: {problem}"
    stray = read_listed(bookie_pb2.ListedColumns(availability=b"x" * 64))
    assert stray == Listed([], [], "listed columns: 64 bytes of answers for no ledger")


def test_a_reader_takes_the_first_answer_of_each_ledger_asked_only() -> None:
    got = BookieAnswers("b1:3181")
    got.other[3] = BookieAnswer(Outcome.NO_LEDGER)
    problem = take_listed("b1:3181", Listed([1, 2, 3, 1, 99], [b"one", b"two", b"three", b"again", b"stray"]),
                          {1, 2, 3}, got)
    assert problem == "" and got.encoded == {1: b"one", 2: b"two"} and got.other[3].outcome is Outcome.NO_LEDGER


def test_columns_that_do_not_line_up_make_their_ledgers_invalid() -> None:
    got = BookieAnswers("b1:3181")
    got.encoded[1] = b"kept"
    problem = take_listed("b1:3181", Listed([1, 2, 5], [], "listed columns: broken"), {1, 2}, got)
    assert problem == "listed columns: broken" and got.encoded == {1: b"kept"} and set(got.other) == {2}
    assert got.other[2].outcome is Outcome.INVALID and got.other[2].reason == "bookie b1:3181: listed columns: broken"
