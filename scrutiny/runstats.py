"""A run's figures, one dataclass per part of the run: each name a report's `stats`, StatsD and /metrics use is
spelled once, as a field here. A part writes its figures by keyword (`stats.add(Holdings(orphan_candidates=3))`),
a reader reads them as attributes (`Scan.of(report.stats).bookie_calls_failed`); the report keeps them flat, as
the contract's JSON has always had them (docs/report.md). Units are in the names: `_ms`, `_bytes`, else a count
(of ledgers, unless the name says entries, copies, bookies or topics)."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Self


@dataclass(frozen=True)
class Figures:
    """A part's figures: 0 when nothing happened. Figures whose name says `peak` keep the largest when runs'
    ranges are added up; every other adds."""

    @classmethod
    @functools.cache
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def of(cls, stats: Mapping[str, int]) -> Self:
        """Tolerant, as a report from another version may be: a figure it lacks is 0."""
        return cls(**{n: int(stats.get(n, 0)) for n in cls.names()})

    @classmethod
    def given(cls, stats: Mapping[str, int]) -> Self | None:
        """The figures when the run had this part (its report names one of them), else None."""
        return cls.of(stats) if any(n in stats for n in cls.names()) else None

    def items(self) -> dict[str, int]:
        return {n: getattr(self, n) for n in self.names()}  # not asdict: it deep-copies every int

    def nonzero(self) -> dict[str, int]:
        """Only what happened: what a range sends back from an executor."""
        return {n: v for n, v in self.items().items() if v}


@dataclass(frozen=True)
class Timings(Figures):
    """How long each phase of a whole run took."""

    first_pass_ms: int = 0
    recheck_ms: int = 0
    verify_ms: int = 0

    def phases(self) -> dict[str, int]:
        """Phase name (as StatsD and /metrics label it) -> milliseconds."""
        return {n.removesuffix("_ms"): v for n, v in self.items().items()}


@dataclass(frozen=True)
class Marks(Figures):
    """The under-replication marks: every run's, and all of the periodic age check's."""

    underreplicated_marks: int = 0
    marks_gone_before_reporting: int = 0


@dataclass(frozen=True)
class Scan(Figures):
    """What a run looked at again and why, what it dropped, and its calls (every run of the ledgers)."""

    potentially_faulty: int = 0
    rechecked_again: int = 0
    left_unsettled_after_rechecks: int = 0
    left_unsettled_after_rereads: int = 0
    reasked_before_reporting: int = 0
    reanalyzed_after_metadata_change: int = 0
    reanalyzed_after_rack_change: int = 0
    relooked_after_registration_change: int = 0
    relooked_after_agent_moved: int = 0
    dropped_marked_during_run: int = 0
    dropped_offloaded: int = 0
    ledgers_with_limbo_copies: int = 0
    ledgers_with_residue_past_the_close: int = 0
    bookie_calls_failed: int = 0
    lost_bookies: int = 0
    lost_bookie_ledgers_not_yet_due: int = 0


@dataclass(frozen=True)
class StoreUse(Figures):
    """The metadata store's reads of a run's ranges, and the most it had in flight at once."""

    store_reads: int = 0
    store_peak_in_flight: int = 0


@dataclass(frozen=True)
class Deep(Figures):
    """A deep run's scrub: ledgers with a copy verified, copies of a ledger on one bookie not verifiable or
    their digest not checked, entry copies verified and corrupt (an entry on two bookies counts twice), bytes."""

    deep_ledgers_verified: int = 0
    deep_entries_verified: int = 0
    deep_bytes_read: int = 0
    deep_entries_corrupt: int = 0
    deep_copies_unverified: int = 0
    deep_copies_digest_unchecked: int = 0


@dataclass(frozen=True)
class DeepPassPosition(Figures):
    """Where the auditor's deep pass is, after a deep run recorded its slice."""

    deep_pass_slices: int = 0
    deep_pass_next_slice: int = 0
    deep_pass_progress_permille: int = 0
    deep_passes_completed: int = 0
    deep_oldest_verified_ms: int = 0


@dataclass(frozen=True)
class Holdings(Figures):
    """The reverse check (whole-cluster runs): bookies, and (bookie, ledger) pairs."""

    orphan_bookies_listed: int = 0
    orphan_bookies_not_listed: int = 0
    orphan_candidates: int = 0
    orphan_sightings_untracked: int = 0


@dataclass(frozen=True)
class PulsarRecordFigures(Figures):
    """Pulsar's record held against BookKeeper's: topics and schemas read, findings before the second look,
    Pulsar's ledgers named by nothing (any age), leaks reported and their bytes on the bookies."""

    pulsar_topics: int = 0
    pulsar_schemas: int = 0
    pulsar_candidates: int = 0
    pulsar_unnamed: int = 0
    pulsar_leaked_ledgers: int = 0
    pulsar_leaked_bytes: int = 0
    pulsar_store_reads: int = 0
    pulsar_ms: int = 0


@dataclass(frozen=True)
class Messages(Figures):
    """Every acknowledged message (deep runs that hold Pulsar's record): topics and ledgers validated in order,
    topics whose validation stopped at a ledger not read whole, restarts after a ledger the record lists and
    BookKeeper lost, topics without a deduplication snapshot, snapshots judged and waiting for their horizon,
    entries lost; and, never findings, what producers did legitimately."""

    pulsar_topics_validated: int = 0
    pulsar_ledgers_validated: int = 0
    pulsar_validation_stopped: int = 0
    pulsar_restarts_after_a_lost_ledger: int = 0
    pulsar_topics_without_dedup_snapshot: int = 0
    pulsar_dedup_snapshots_judged: int = 0
    pulsar_dedup_snapshots_waiting: int = 0
    pulsar_messages_validated: int = 0  # a transaction's once it committed
    pulsar_messages_aborted: int = 0  # in transactions aborted: stored, never received
    pulsar_messages_in_open_transactions: int = 0  # read without their transaction's outcome yet
    pulsar_transactions_committed: int = 0
    pulsar_transactions_aborted: int = 0
    pulsar_sequence_gaps: int = 0
    pulsar_producer_restarts: int = 0
    pulsar_repeats: int = 0
    pulsar_markers: int = 0
    pulsar_entries_not_messages: int = 0
    pulsar_entries_lost: int = 0


# What each kind of run reports, every figure present (0 when nothing happened): a script reads them without
# KeyError. Where a part's figures are optional (StoreUse, and the checkpoint's own in Messages), none is added.
EVERY_RUN: tuple[type[Figures], ...] = (Marks, Timings, Scan)
MARKS_CHECK: tuple[type[Figures], ...] = (Marks,)
PARTS: tuple[type[Figures], ...] = (Timings, Marks, Scan, StoreUse, Deep, DeepPassPosition, Holdings,
                                    PulsarRecordFigures, Messages)


class RunFigures(Counter[str]):
    """A run's figures as its parts add them up (ranges from Spark's executors, phases, checks): flat, by the
    names of `PARTS`, never another."""

    KNOWN: ClassVar[frozenset[str]] = frozenset(n for part in PARTS for n in part.names())

    def add(self, *figures: Figures | Mapping[str, int]) -> None:
        for f in figures:
            for name, n in (f.items() if isinstance(f, Figures) else f).items():
                if name not in self.KNOWN:
                    raise ValueError(f"no run figure is named {name!r}")
                if n:
                    self[name] = max(self[name], n) if "peak" in name else self[name] + n

    def report(self, parts: Iterable[type[Figures]]) -> dict[str, int]:
        """The report's `stats`: every figure of `parts` (0 when none), and whatever else was added."""
        return {n: 0 for part in parts for n in part.names()} | dict(self)
