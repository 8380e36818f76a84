"""What every entry source answers, and the capabilities some declare.

Every source answers `availability(ledger_id)` what the bookie itself would serve: a `Holding` (the BP-34
encoding, and whether the ledger is in limbo), None for "no such ledger" (ENOLEDGER), or SourceError when it
cannot tell (the agent answers EIO). The agent asks a source for more only where it declares it: listing its
ledgers (the reverse check), answering many ledgers at once, reading the entries themselves (the deep
scrub), watching what changed (continuous scrutiny)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from scrutiny.changefeed import Change
from scrutiny.errors import StoreError


class Holding(NamedTuple):
    availability: bytes  # the BP-34 encoding of the entries the bookie would serve
    limbo: bool = False  # BP-46: the bookie does not know this ledger's state; entries it lacks are unknown
    entries: int = 0  # how many entries the source looked at to answer (the agent's CPU budget counts them)


class SourceError(StoreError):
    """The source could not tell which entries it holds (mapped to EIO)."""


class Verification(NamedTuple):
    """A deep scrub of one ledger's copies on one bookie."""

    verified: np.ndarray  # entry ids whose stored bytes verified, ascending
    payload_hashes: bytes  # PAYLOAD_HASH_BYTES per verified entry, same order
    corrupt: list[tuple[int, str, str]]  # (entry id, reason, detail), ascending entry id
    bytes_read: int
    digest_checked: bool


class EntrySource(Protocol):
    def availability(self, ledger_id: int) -> Holding | None: ...

    def refresh(self) -> None:
        """Catch up with the bookie, once per request, before answering it."""

    def close(self) -> None: ...



@runtime_checkable
class AnswersMany(Protocol):
    """Many ledgers answered at once (cheaper than one at a time)."""

    def availability_many(self, ledger_ids: Sequence[int]) -> list[Holding | None]: ...


@runtime_checkable
class ListsLedgers(Protocol):
    """The ledgers the bookie holds (the reverse check: ledgers the metadata no longer has)."""

    def list_ledgers(self, from_id: int, limit: int) -> tuple[np.ndarray, bool]:
        """The ledgers held from `from_id` on, ascending, at most `limit`; and whether that is all of them."""


@runtime_checkable
class ReadsEntries(Protocol):
    """The entries themselves, read where the bookie stores them (the deep scrub; a ledger's bytes)."""

    def verify(self, ledger_id: int, digest_type: str, password: bytes | None,
               throttle: Callable[[int], object] = ...,
               verified: Callable[[int, bytes], object] | None = None) -> Verification | None:
        """Every entry's stored copy verified; `verified` is given each good copy's (entry id, payload)."""

    def stored_bytes(self, ledger_id: int, most_entries: int = ...,
                     throttle: Callable[[int], object] = ...) -> int | None: ...

    def last_entry(self, ledger_id: int, digest_type: str, password: bytes | None,
                   throttle: Callable[[int], object] = ...) -> tuple[int, bytes] | None: ...


@runtime_checkable
class WatchesChanges(Protocol):
    """What changed in what the bookie holds since the last call (continuous scrutiny)."""

    index_passes: int  # how often every key of the index was read to watch it (its WAL could not tell)

    def changes(self) -> tuple[list[Change], int]:
        """The changes, and how many index keys that read (the agent's CPU budget counts them)."""

    def unwatched(self) -> None:
        """Nobody follows the changes any more: what was kept to find them goes; the next call takes stock."""
