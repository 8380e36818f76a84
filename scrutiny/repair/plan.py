"""Which findings to hand to autorecovery, and how many at a time. Pure.

A finding is handed off only when its remedy says autorecovery repairs it once marked (`checks.remedy`:
"yes"), with the bookies whose share to copy as the mark's missing replicas, as BookKeeper's Auditor names
them, and the metadata version it was judged at (the mark is written only while the ledger is still there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scrutiny.categories import REGISTRY, Category
from scrutiny.checks import Violation
from scrutiny.checks.remedy import YES, RepairContext, remedy
from scrutiny.times import iso

OFF, DRY_RUN, MARK = "off", "dry-run", "mark"
MODES = (OFF, DRY_RUN, MARK)

# What became of a candidate (the journal's `outcome`).
MARKED = "marked"
WOULD_MARK = "would mark (dry run)"
ALREADY_MARKED = "already marked"
CHANGED = "not marked: the ledger changed or was marked meanwhile"
NOT_CONFIRMED = "not marked: a look again did not find it"
NOT_AGAIN = "not marked: a worker unmarked it without repair before (at this metadata version)"
FENCED = "not marked: this process leads no more (its election node is gone)"
OVER_LIMIT = "not marked yet: over the limit"
# ... and of a mark it wrote, followed to its end (`followup`)
REPAIRED = "repaired: the copies are back where the metadata says"
UNREPAIRED = "unmarked without repair"
OVERDUE = "still marked after repair_deadline_seconds"
DELETED = "the ledger was deleted while marked"


@dataclass(frozen=True)
class Candidate:
    """A finding autorecovery repairs if marked."""

    ledger_id: int
    category: Category
    replicas: tuple[str, ...]  # the mark's missing replicas: the bookies whose share a worker copies
    metadata_version: int
    why: str  # the remedy's reason

    @property
    def key(self) -> tuple[int, Category, int]:
        """A finding is handed off once per metadata version: a repair changes the ensemble."""
        return self.ledger_id, self.category, self.metadata_version


def missing_replicas(v: Violation) -> tuple[str, ...]:
    lacking = v.details.get("shares_lacking") or []
    if lacking:
        return tuple(sorted({str(s["bookie"]) for s in lacking}))
    return tuple(sorted(v.details.get("lost_bookies") or v.bookies))


def candidate(v: Violation, ctx: RepairContext) -> Candidate | None:
    r = remedy(v, ctx)
    replicas = missing_replicas(v)
    if r.autorecovery != YES or not replicas or v.metadata_version < 0:
        return None
    return Candidate(v.ledger_id, v.category, replicas, v.metadata_version, r.why)


def preferred(c: Candidate) -> tuple[int, float, str]:
    """Of a ledger's findings autorecovery repairs, the one its mark stands for: the one that names the most
    bookies to copy (a coverage finding counts a lost bookie's share too), then the worst, then by name. Never the
    order they come in: the current state lists findings worst first, a report by category, and the hand-off
    confirms a candidate by finding the same one again."""
    return -len(c.replicas), REGISTRY[c.category].rank, str(c.category)


def candidates(found: Iterable[Violation], ctx: RepairContext) -> list[Candidate]:
    """One per ledger (`preferred` of its findings that autorecovery repairs), by ledger id; none for a ledger
    whose mark a worker already removed without repair (marked again, it would be unmarked again)."""
    found = list(found)
    given_up = {v.ledger_id for v in found if v.category is Category.UNMARKED_WITHOUT_REPAIR}
    out: dict[int, Candidate] = {}
    for v in found:
        if v.ledger_id in given_up:
            continue
        c = candidate(v, ctx)
        if c is not None and (c.ledger_id not in out or preferred(c) < preferred(out[c.ledger_id])):
            out[c.ledger_id] = c
    return [out[k] for k in sorted(out)]


class MarkBudget:
    """At most `per_run` marks in one hand-off and `per_minute` in any 60 s."""

    def __init__(self, per_run: int, per_minute: int) -> None:
        self.per_run, self.per_minute = per_run, per_minute
        self._recent: deque[float] = deque()

    def allowance(self, now_s: float) -> int:
        while self._recent and self._recent[0] <= now_s - 60:
            self._recent.popleft()
        return max(0, min(self.per_run, self.per_minute - len(self._recent)))

    def spent(self, now_s: float) -> None:
        self._recent.append(now_s)


@dataclass(frozen=True)
class Handed:
    """One line of the journal: what the hand-off did with one candidate, when, by whom, why."""

    at_ms: int
    by: str  # the auditor (its advertised address)
    candidate: Candidate
    outcome: str
    run_id: str = ""  # the look again that confirmed it (or that followed the mark to its end)
    seconds: float | None = None  # from the mark to its end (a repair's time)

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        return {"at": iso(self.at_ms), "by": self.by, "ledger_id": c.ledger_id, "category": str(c.category),
                "replicas": list(c.replicas), "metadata_version": c.metadata_version, "why": c.why,
                "outcome": self.outcome, "run_id": self.run_id,
                **({"seconds": round(self.seconds, 1)} if self.seconds is not None else {})}
