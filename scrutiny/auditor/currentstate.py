"""The current state: what is wrong now, as the leader knows it between full runs.

The last full run's findings, plus those continuous scrutiny found since, minus those a later look
cleared; each with when it was first seen (`detected_at`) and how (`found_by`: the run kind, or what
changed). A full run replaces the state and is the safety net: each of its findings that continuous
mode, watching since before the previous full run without a gap, should have made and did not is counted
as missed (`scrutiny_continuous_missed_total`). Thread-safe: the page, the API and /metrics read it.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scrutiny.categories import REGISTRY, Category, Fact, Phase, in_phase, known_counts, severity_of
from scrutiny.checks import Violation
from scrutiny.checks.remedy import RepairContext, remedy
from scrutiny.pulsar.owners import topic_of_owner
from scrutiny.times import iso

# What continuous mode looks at, and a full run after it may count as missed: what the bookies answer of each
# ledger and who is registered (placement, the durability policy and the marks' age change only with the
# metadata, which it also follows, but a run finds them). Not the stored bytes a deep run reads, which no feed
# reports, nor the hand-off's follow-up.
WATCHED = frozenset(c for c, spec in REGISTRY.items() if Fact.ANSWERS in spec.facts and spec.phase is Phase.LEDGERS)
# The hand-off's follow-up findings (a loss a worker left unrepaired) stand while their ledger has a finding of
# its own: no run looks for them, and the loss found again keeps them, the loss gone resolves them.
FOLLOW_UP = frozenset(in_phase(Phase.REPAIR))


@dataclass(frozen=True)
class Current:
    violation: Violation
    detected_ms: int
    found_by: str

    def to_json(self, repair: RepairContext | None = None) -> dict[str, Any]:
        v = self.violation
        return {**v.to_json(), "severity": severity_of(v.category, v.details), "detected_at": iso(self.detected_ms),
                "found_by": self.found_by, "remedy": remedy(v, repair or RepairContext()).to_json()}


@dataclass(frozen=True)
class Resolved:
    was: Current
    resolved_ms: int
    resolved_by: str  # the run kind, or the continuous look, that no longer found it

    def to_json(self) -> dict[str, Any]:
        return {**self.was.to_json(), "resolved_at": iso(self.resolved_ms), "resolved_by": self.resolved_by}


RESOLVED_KEPT = 500


class CurrentState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[tuple[Category, int], Current] = {}
        self._resolved: deque[Resolved] = deque(maxlen=RESOLVED_KEPT)  # the newest last
        self.previous_full_ms = 0  # when the full run before the last one finished (0: none)
        self.last_full_ms = 0
        self.baseline_ms = 0  # when the full run the state rests on started (0: none yet)
        self.baseline_kind = ""  # ... and its kind: a full run, or a rescan of every ledger
        self.watching_since_ms = 0  # continuous mode has seen every change since then (0: not watching)
        self.missed = 0
        self.repair = RepairContext()  # the remedies' context, as the last full run read it
        self.version = 0  # one more at every change of the findings (the keeper writes them for the next leader)
        self._beyond: Counter[Category] = Counter()  # findings a last leader kept as counts only, until a full run

    def baseline(self) -> tuple[int, str, int]:
        """When the full run the state rests on started, its kind, and when the last one finished."""
        with self._lock:
            return self.baseline_ms, self.baseline_kind, self.last_full_ms

    def restore(self, found: Iterable[Current], beyond: Mapping[str, int], baseline_ms: int, baseline_kind: str,
                last_full_ms: int) -> None:
        """The state a last leader kept (a new leader's, until its own runs and looks tell)."""
        with self._lock:
            self._found = {(c.violation.category, c.violation.ledger_id): c for c in found}
            self._beyond = Counter(known_counts(beyond))
            self.baseline_ms, self.baseline_kind, self.last_full_ms = baseline_ms, baseline_kind, last_full_ms
            self.version += 1

    def watching(self, since_ms: int) -> None:
        """Continuous mode (re)started, or found a gap in a feed: it has seen every change only from now on."""
        with self._lock:
            self.watching_since_ms = since_ms

    def stopped_watching(self) -> None:
        with self._lock:
            self.watching_since_ms = 0

    def full_run(self, found: Iterable[Violation], started_ms: int, finished_ms: int, kind: str = "full",
                 repair: RepairContext | None = None, categories: Collection[Category] = tuple(REGISTRY),
                 judges_continuous: bool = True, unsettled: Collection[int] = ()) -> int:
        """A complete whole-cluster run (a full run, a rescan of every ledger, a deep run) that looked for these
        categories: the new state of those (what only another kind looks for stays: a full run never clears a
        deep run's corrupt copy); the findings continuous mode missed (counted, when the run `judges_continuous`:
        not a deep run, whose corrupt copies make coverage findings no feed could report). What a look made
        after the run began is newer than the run's own look at that ledger: a finding found since stays, and
        one cleared since is not brought back; and the run says nothing of the ledgers it left `unsettled`."""
        looked = set(categories) - FOLLOW_UP
        with self._lock:
            trusted = judges_continuous and 0 < self.watching_since_ms <= self.baseline_ms
            cleared_since = {(r.was.violation.category, r.was.violation.ledger_id) for r in self._resolved
                             if r.resolved_ms >= started_ms}
            new: dict[tuple[Category, int], Current] = {}
            missed = 0
            for v in found:
                key = (v.category, v.ledger_id)
                before = self._found.get(key)
                if before is None and key in cleared_since:
                    continue
                if before is None and trusted and v.category in WATCHED:
                    missed += 1
                new[key] = Current(v, before.detected_ms if before else finished_ms, before.found_by if before
                                   else kind)
            # what only another kind looks for, and what a look found since the run began
            left = set(unsettled)
            new.update({k: c for k, c in self._found.items() if k not in new and (
                k[0] not in looked | FOLLOW_UP or (k[0] in looked and (c.detected_ms >= started_ms or k[1] in left)))})
            lossy = {lid for _, lid in new}
            new.update({k: c for k, c in self._found.items() if k[0] in FOLLOW_UP and k[1] in lossy})
            self._resolved.extend(Resolved(c, finished_ms, kind) for k, c in self._found.items() if k not in new)
            self._found, self.baseline_ms, self.baseline_kind = new, started_ms, kind
            self._beyond.clear()
            self.version += 1
            self.repair = repair or self.repair
            self.previous_full_ms, self.last_full_ms = self.last_full_ms, finished_ms
            self.missed += missed
            return missed

    def looked_again(self, ledger_ids: Collection[int], found: Iterable[Violation], now_ms: int,
                     found_by: str | Mapping[int, str], categories: Collection[Category]) -> tuple[int, int]:
        """A look at these ledgers (for these categories) found this: what it no longer finds is cleared, what
        is new is added with its detection time and how it was found (the same for all, or per ledger).
        (new, cleared)."""
        ids = set(ledger_ids)

        def how(ledger_id: int) -> str:
            return found_by if isinstance(found_by, str) else found_by.get(ledger_id, "")

        with self._lock:
            fresh = {(v.category, v.ledger_id): v for v in found}
            added = changed = 0
            for key, v in fresh.items():
                before = self._found.get(key)
                if before is None:
                    added += 1
                changed += before is None or before.violation.to_json() != v.to_json()
                self._found[key] = Current(v, before.detected_ms if before else now_ms,
                                           before.found_by if before else how(v.ledger_id))
            cleared = [k for k in self._found if k[1] in ids and k[0] in categories and k not in fresh]
            gone = set(cleared)
            lossy = {k[1] for k in self._found if k[0] not in FOLLOW_UP and k not in gone}
            cleared += [k for k in self._found if k[0] in FOLLOW_UP and k[1] not in lossy and k not in gone]
            for k in cleared:
                self._resolved.append(Resolved(self._found.pop(k), now_ms, how(k[1])))
            self.version += bool(changed or cleared)
            return added, len(cleared)

    def looked_again_bookies(self, bookies: Collection[str], found: Iterable[Violation], now_ms: int,
                             found_by: str | Mapping[int, str], categories: Collection[Category]) -> tuple[int, int]:
        """A look at every ledger of these bookies: what names one of them (or counts it as gone) and is not
        found again is cleared; what is new is added."""
        named = set(bookies)
        return self._looked_again_where(lambda c: bool(named & {*c.violation.bookies,
                                                                 *c.violation.details.get("lost_bookies", ())}),
                                        found, now_ms, found_by, categories)

    def looked_again_topics(self, topics: Collection[str], found: Iterable[Violation], now_ms: int,
                            found_by: str | Mapping[int, str], categories: Collection[Category]) -> tuple[int, int]:
        """A look at these topics' records: what concerns one of them and is not found again is cleared; what
        is new is added."""
        named = set(topics)
        fresh = [v for v in found if v.owner is not None and topic_of_owner(v.owner) in named]
        return self._looked_again_where(lambda c: c.violation.owner is not None
                                        and topic_of_owner(c.violation.owner) in named, fresh, now_ms, found_by,
                                        categories)

    def replaced(self, found: Iterable[Violation], now_ms: int, found_by: str,
                 categories: Collection[Category]) -> tuple[int, int]:
        """A whole-cluster run of some categories only (the marks' age): those categories as it found them."""
        return self._looked_again_where(lambda c: c.violation.category in categories, found, now_ms, found_by,
                                        categories)

    def _looked_again_where(self, looked_at: Callable[[Current], bool], found: Iterable[Violation], now_ms: int,
                            found_by: str | Mapping[int, str], categories: Collection[Category]) -> tuple[int, int]:
        fresh = list(found)
        with self._lock:
            ids = {k[1] for k, c in self._found.items() if looked_at(c)}
        return self.looked_again(ids | {v.ledger_id for v in fresh}, fresh, now_ms, found_by, categories)

    def forget(self, ledger_ids: Collection[int], now_ms: int) -> None:
        """Deleted ledgers: nothing about them stands."""
        ids = set(ledger_ids)
        with self._lock:
            for k in [k for k in self._found if k[1] in ids]:
                self._resolved.append(Resolved(self._found.pop(k), now_ms, "continuous: the ledger was deleted"))
                self.version += 1

    def resolved(self, since_ms: int = 0) -> list[Resolved]:
        """What a later look no longer found (since then), the newest first; the last RESOLVED_KEPT."""
        with self._lock:
            return [r for r in reversed(self._resolved) if r.resolved_ms > since_ms]

    def counts(self) -> Counter[Category]:
        with self._lock:
            return Counter(k[0] for k in self._found) + self._beyond

    def findings(self, newest_first: bool = False) -> list[Current]:
        """Worst first, then the newest (or the newest first)."""
        with self._lock:
            out = list(self._found.values())
        if newest_first:
            return sorted(out, key=lambda c: (-c.detected_ms, c.violation.ledger_id))
        return sorted(out, key=lambda c: (REGISTRY[c.violation.category].rank, -c.detected_ms, c.violation.ledger_id))

    def to_json(self, feeds: dict[str, str] | None, most: int = 1000, newest_first: bool = False) -> dict[str, Any]:
        """What /api/v1/current answers: the state's figures and its worst (or newest) `most` findings."""
        found = self.findings(newest_first)
        return {"continuous": feeds is not None, "feeds": feeds or {},
                "watching_since": iso(self.watching_since_ms) if self.watching_since_ms else None,
                "full_run_started_at": iso(self.baseline_ms) if self.baseline_ms else None, "missed": self.missed,
                "counts": dict(self.counts()), "total": len(found),
                "violations": [f.to_json(self.repair) for f in found[:most]]}
