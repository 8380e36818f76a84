"""What a bookie said about a ledger, as the checks count it: which entries it holds, that it holds none, or
that it could not be asked (and why)."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from scrutiny.codec import (
    EMPTY_ANSWER,
    Availability,
    CodecError,
    decode,
)
from scrutiny.listedcolumns import Listed, among, joined


class Outcome(enum.StrEnum):
    ENTRIES = "entries"
    NO_LEDGER = "no_ledger"
    UNAVAILABLE = "unavailable"
    INVALID = "invalid"
    LIMBO = "limbo"  # BP-46: the bookie holds what it lists and cannot tell about the rest (unknown)


class BookieAnswer(NamedTuple):  # one per (bookie, ledger) of a scan: a tuple is the cheapest immutable record
    outcome: Outcome
    availability: Availability | None = None
    reason: str = ""
    slow: bool = False  # UNAVAILABLE: the call timed out at an agent that answers its health check


NO_LEDGER = BookieAnswer(Outcome.NO_LEDGER)


def listed(outcome: Outcome, bookie_id: str, ledger_id: int, encoded: bytes) -> BookieAnswer:
    """An answer that lists entries (BP-34 encoded), decoded; one that cannot be decoded is INVALID."""
    try:
        return BookieAnswer(outcome, decode(encoded or EMPTY_ANSWER))
    except CodecError as exc:
        return BookieAnswer(Outcome.INVALID, reason=f"bookie {bookie_id}, ledger {ledger_id}: {exc}")


class BookieAnswers(Mapping[int, BookieAnswer]):
    """What one bookie said about many ledgers. A list of entries is kept as the bookie encoded it and
    decoded only when looked at: most shares are healthy, and those are compared as words
    (`held_exactly_their_shares`). The lists of a whole message stay as the columns it sent (`listed`), the
    rest is kept one at a time; a ledger is in one place only, its first answer's."""

    __slots__ = ("_at", "_in_listed", "_joined", "bookie_id", "encoded", "listed", "other")

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.encoded: dict[int, bytes] = {}  # ledger -> the entries it holds (EOK), as encoded
        self.other: dict[int, BookieAnswer] = {}  # ledger -> any other answer
        self.listed: list[Listed] = []  # EOK answers a message at a time, of ledgers in neither dict
        self._joined: Listed | None = None
        self._at: dict[int, int] | None = None  # ledger -> its answer in `joined()`, when one was looked up
        self._in_listed: set[int] | None = None  # the ledgers of `listed`, once asked while answers come

    def add_listed(self, listed: Listed) -> None:
        """A message's columns, of ledgers not answered before (a ledger listed twice: its first answer)."""
        self.listed.append(listed)
        self._joined = self._at = None
        if self._in_listed is not None:
            self._in_listed.update(listed.ledger_ids.tolist())

    def joined(self) -> Listed:
        """The columns' answers as one (`joined`)."""
        if self._joined is None:
            self._joined = joined(self.listed)
        return self._joined

    def columns(self) -> Listed:
        """Every list of entries as columns, laid out as `joined` lays them out."""
        return joined([self.joined(), Listed.of(self.encoded)]) if self.encoded else self.joined()

    def __getitem__(self, ledger_id: int) -> BookieAnswer:
        answer = self.get(ledger_id)
        if answer is None:
            raise KeyError(ledger_id)
        return answer

    def get(self, ledger_id: int, default: Any = None) -> Any:
        answer = self.other.get(ledger_id)
        if answer is not None:
            return answer
        encoded = self.encoded.get(ledger_id)
        if encoded is None:
            if not self.listed:
                return default
            if self._at is None:
                ids = self.joined().ledger_ids
                self._at = dict(zip(ids.tolist(), range(ids.size), strict=True))
            at = self._at.get(ledger_id)
            if at is None:
                return default
            encoded = self.joined().answer(at)
        return listed(Outcome.ENTRIES, self.bookie_id, ledger_id, encoded)

    def __contains__(self, ledger_id: object) -> bool:
        if ledger_id in self.encoded or ledger_id in self.other:
            return True
        if not self.listed:
            return False
        if self._in_listed is None:
            self._in_listed = set(self.joined().ledger_ids.tolist())
        return ledger_id in self._in_listed

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.encoded, self.other, self.joined().ledger_ids.tolist() if self.listed else ())

    def __len__(self) -> int:
        return len(self.encoded) + len(self.other) + (self.joined().ledger_ids.size if self.listed else 0)

    def unanswered(self, ledger_ids: Iterable[int]) -> list[int]:
        """Those of `ledger_ids` not answered here, in their order."""
        ids = list(ledger_ids)
        if self.listed:
            asked = np.fromiter(ids, np.int64, len(ids))
            ids = asked[~among(asked, self.joined().ledger_ids)].tolist()
        if not self.encoded and not self.other:
            return ids
        return [i for i in ids if i not in self.encoded and i not in self.other]

    def merge(self, more: BookieAnswers) -> None:
        """Answers about other ledgers (another call's)."""
        self.encoded.update(more.encoded)
        self.other.update(more.other)
        for listed_ in more.listed:
            self.add_listed(listed_)

