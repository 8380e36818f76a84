"""A run between its first pass and its report: what its looks found so far, and what it knows of the cluster
as it started."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from scrutiny.checks.sequences import LedgerSequences
from scrutiny.findings import Findings
from scrutiny.metadata import UnderreplicationMark
from scrutiny.orphans import LedgerIds
from scrutiny.pulsar.ledgers import BookKeeperLedgers
from scrutiny.runstats import Deep, RunFigures
from scrutiny.scan.context import LEDGER_COUNTERS, NO_SILENCES, RunContext, Silences
from scrutiny.scan.result import Blast, RangeResult
from scrutiny.store import MetadataStore


@dataclass
class PendingRun:
    """A run between its first pass and its end (the delayed re-check). Its findings change only
    through `absorb` and `drop`."""

    store: MetadataStore
    started_ms: int
    ctx: RunContext
    marks: dict[int, UnderreplicationMark]
    scope: set[int] | None = None
    registered_at_start: frozenset[str] = frozenset()  # a bookie's copies are gone only if unregistered at every look
    racks_from_store: bool = False
    counts: Counter[str] = field(default_factory=lambda: Counter({k: 0 for k in LEDGER_COUNTERS}))
    findings: Findings = field(default_factory=Findings)
    errors: list[str] = field(default_factory=list)
    stats: RunFigures = field(default_factory=RunFigures)
    faulty: Silences = NO_SILENCES
    blast: dict[str, Blast] = field(default_factory=dict)
    enumerated: list[LedgerIds] = field(default_factory=list)  # every ledger id of the first pass (`holdings`)
    marked_in_scope: list[int] = field(default_factory=list)  # a one-bookie run's marked ledgers
    unregistered: set[str] = field(default_factory=set)  # bookies named by checked ledgers, registered at no look
    bookkeeper: list[BookKeeperLedgers] = field(default_factory=list)  # the first pass's ledgers in brief (`pulsar`)
    messages: dict[int, LedgerSequences] = field(default_factory=dict)  # a deep run's topic ledgers, the last look's
    pulsar_topics: tuple[str, ...] | None = None  # the topics whose record the run holds (None: every topic's)
    replication_disabled: bool | None = None  # at the start: each finding's remedy depends on it
    unsettled: set[int] = field(default_factory=set)  # ledgers it could not settle: nothing said of them

    def absorb(self, result: RangeResult, first_look: bool = True) -> None:
        """One range's result. Ledgers looked at again were counted at their first look: only their
        deletions count again."""
        if first_look:
            self.counts.update(result.counts)
            self.enumerated += result.enumerated
            self.marked_in_scope += result.marked_in_scope
            self.bookkeeper += result.bookkeeper
            self.stats.add(result.stats)
        else:
            self.counts["deleted_during_run"] += result.counts.get("deleted_during_run", 0)
            # a ledger scrubbed again is verified once in the figures
            self.stats.add({n: v for n, v in result.stats.items() if n not in Deep.names()})
        self.unregistered |= result.unregistered
        self.messages.update((m.ledger_id, m) for m in result.messages)
        self.findings.add(result.violations)
        self.findings.drop(result.deleted)
        self.errors += result.errors
        for key, b in result.blast.items():
            self.blast[key] = b.plus(self.blast[key]) if key in self.blast else b
