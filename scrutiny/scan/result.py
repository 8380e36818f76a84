"""What one range (or many, merged) found: the only thing that travels back from an executor to the driver."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from scrutiny.checks import (
    Violation,
)
from scrutiny.checks.sequences import LedgerSequences
from scrutiny.metadata import LedgerMetadata
from scrutiny.orphans import LedgerIds
from scrutiny.pulsar.ledgers import BookKeeperLedgers
from scrutiny.pulsar.owners import Owner
from scrutiny.runstats import RunFigures


@dataclass(frozen=True)
class Blast:
    """What one bookie (or rack) going down alone would do, and what depends on it."""

    below_aq: int = 0  # ledgers with some entry below its ack quorum (or without a copy)
    no_copy: int = 0  # ledgers with some entry without any copy
    topics_below_aq: frozenset[str] = frozenset()
    topics_no_copy: frozenset[str] = frozenset()
    ledgers: int = 0  # closed ledgers checked whose ensembles name it
    topics: frozenset[str] = frozenset()  # ... and their topics

    def plus(self, other: Blast) -> Blast:
        return Blast(self.below_aq + other.below_aq, self.no_copy + other.no_copy,
                     self.topics_below_aq | other.topics_below_aq, self.topics_no_copy | other.topics_no_copy,
                     self.ledgers + other.ledgers, self.topics | other.topics)

    def to_json(self) -> dict[str, int]:
        return {"ledgers_below_aq": self.below_aq, "ledgers_without_a_copy": self.no_copy,
                "topics_below_aq": len(self.topics_below_aq), "topics_without_a_copy": len(self.topics_no_copy),
                "ledgers": self.ledgers, "topics": len(self.topics)}


TOPIC_OWNERS = ("topic", "cursor", "compacted-topic")  # owners whose topic a bookie's or rack's loss would touch


class BlastTally:
    """A range's blast radius as its ledgers are checked: per (scope, name), the ledgers (and topics) that depend
    on the bookie or rack, and those that would fall below their ack quorum, or lose every copy of an entry,
    were it alone down. Keys are counted once, at the end: cheaper than a Counter per key. The healthy
    majority comes counted already (`add`)."""

    def __init__(self) -> None:
        self._depend: list[tuple[str, str]] = []
        self._below: list[tuple[str, str]] = []
        self._without: list[tuple[str, str]] = []
        self._grouped: dict[str, Counter[tuple[str, str]]] = {"depend": Counter(), "below": Counter(),
                                                              "without": Counter()}
        self._topics: dict[str, dict[tuple[str, str], set[str]]] = {"depend": {}, "below": {}, "without": {}}

    def _topic(self, kind: str, key: tuple[str, str], owner: Owner | None) -> None:
        if owner is not None and owner.kind in TOPIC_OWNERS:
            self._topics[kind].setdefault(key, set()).add(owner.name)

    def depends(self, md: LedgerMetadata, locations: Mapping[str, str], owner: Owner | None) -> None:
        for key in {("bookie", b) for b in md.bookies} | {("rack", locations[b]) for b in md.bookies
                                                          if b in locations}:
            self._depend.append(key)
            self._topic("depend", key, owner)

    def would_have(self, md: LedgerMetadata, least_copies: Mapping[tuple[str, str], int], owner: Owner | None) -> None:
        for key, left in least_copies.items():
            if left < md.ack_quorum:
                self._below.append(key)
                self._topic("below", key, owner)
                if left <= 0:
                    self._without.append(key)
                    self._topic("without", key, owner)

    def add(self, kind: str, ledgers: Mapping[tuple[str, str], int],
            topics: Mapping[tuple[str, str], Collection[str]]) -> None:
        """Ledgers counted elsewhere, per key (`kind`: "depend", "below" or "without"), and their topics."""
        self._grouped[kind].update(ledgers)
        for key, names in topics.items():
            self._topics[kind].setdefault(key, set()).update(names)

    def blast(self) -> dict[str, Blast]:
        grouped = self._grouped
        below = Counter(self._below) + grouped["below"]
        without = Counter(self._without) + grouped["without"]
        depend = Counter(self._depend) + grouped["depend"]
        topics = self._topics
        return {f"{scope}:{name}": Blast(below[scope, name], without[scope, name],
                                         frozenset(topics["below"].get((scope, name), ())),
                                         frozenset(topics["without"].get((scope, name), ())),
                                         depend[scope, name], frozenset(topics["depend"].get((scope, name), ())))
                for scope, name in depend.keys() | below.keys()}


@dataclass(frozen=True)
class RangeResult:
    """What one range (or many, merged) found. Only this travels back to the driver."""

    counts: Mapping[str, int] = field(default_factory=dict)
    violations: tuple[Violation, ...] = ()
    potentially_faulty: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    deleted: tuple[int, ...] = ()
    marked_in_scope: tuple[int, ...] = ()  # only for a one-bookie run
    errors: tuple[str, ...] = ()
    stats: Mapping[str, int] = field(default_factory=dict)  # figures (runstats): added up as RunFigures does
    # "bookie:<id>" / "rack:<name>" -> (ledgers below AQ, ledgers without a copy, their topics, ...) if it went down
    blast: Mapping[str, Blast] = field(default_factory=dict)
    enumerated: tuple[LedgerIds, ...] = ()  # the ledger ids of the ranges, when the run asked (`holdings`)
    unregistered: frozenset[str] = frozenset()  # bookies named by checked ledgers and registered at no look
    bookkeeper: tuple[BookKeeperLedgers, ...] = ()  # the ranges' ledgers in brief, when the run asked (`pulsar`)
    messages: tuple[LedgerSequences, ...] = ()  # a deep run: each topic ledger scrubbed, its producers' ids

    @staticmethod
    def merge(results: Iterable[RangeResult]) -> RangeResult:
        counts: Counter[str] = Counter()
        stats = RunFigures()
        violations: list[Violation] = []
        faulty: dict[int, tuple[str, ...]] = {}
        deleted: list[int] = []
        marked: list[int] = []
        errors: list[str] = []
        blast: dict[str, Blast] = {}
        enumerated: list[LedgerIds] = []
        unregistered: set[str] = set()
        bookkeeper: list[BookKeeperLedgers] = []
        messages: list[LedgerSequences] = []
        for r in results:
            messages += r.messages
            enumerated += r.enumerated
            bookkeeper += r.bookkeeper
            unregistered |= r.unregistered
            for key, b in r.blast.items():
                blast[key] = b.plus(blast[key]) if key in blast else b
            counts.update(r.counts)
            stats.add(r.stats)
            violations += r.violations
            faulty.update(r.potentially_faulty)
            deleted += r.deleted
            marked += r.marked_in_scope
            errors += r.errors
        return RangeResult(dict(counts), tuple(violations), faulty, tuple(deleted), tuple(marked), tuple(errors),
                           dict(stats), blast, tuple(enumerated), frozenset(unregistered), tuple(bookkeeper),
                           tuple(messages))

