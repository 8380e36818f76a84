"""What a bookie said about a ledger, as the checks count it: which entries it holds, that it holds none, or
that it could not be asked (and why)."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from scrutiny.codec import (
    EMPTY_ANSWER,
    Availability,
    CodecError,
    decode,
)


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
    decoded only when looked at: most shares are healthy, and those are compared as bytes
    (`held_exactly_their_shares`). A ledger is in `encoded` or in `other`, never in both."""

    __slots__ = ("bookie_id", "encoded", "other")

    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.encoded: dict[int, bytes] = {}  # ledger -> the entries it holds (EOK), as encoded
        self.other: dict[int, BookieAnswer] = {}  # ledger -> any other answer

    def __getitem__(self, ledger_id: int) -> BookieAnswer:
        answer = self.other.get(ledger_id)
        if answer is None:
            answer = listed(Outcome.ENTRIES, self.bookie_id, ledger_id, self.encoded[ledger_id])
        return answer

    def get(self, ledger_id: int, default: Any = None) -> Any:
        return self[ledger_id] if ledger_id in self.encoded or ledger_id in self.other else default

    def __contains__(self, ledger_id: object) -> bool:
        return ledger_id in self.encoded or ledger_id in self.other

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.encoded, self.other)

    def __len__(self) -> int:
        return len(self.encoded) + len(self.other)

    def unanswered(self, ledger_ids: Iterable[int]) -> list[int]:
        """Those of `ledger_ids` not answered here, in their order."""
        if not self.encoded and not self.other:
            return list(ledger_ids)
        return [i for i in ledger_ids if i not in self.encoded and i not in self.other]

    def merge(self, more: BookieAnswers) -> None:
        """Answers about other ledgers (another call's)."""
        self.encoded.update(more.encoded)
        self.other.update(more.other)

