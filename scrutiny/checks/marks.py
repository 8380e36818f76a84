"""The age of the under-replication marks: a ledger marked for longer than the grace period."""

from __future__ import annotations

from collections.abc import Iterable

from scrutiny.categories import Category
from scrutiny.checks.violation import Violation
from scrutiny.metadata import (
    UnderreplicationMark,
)


def check_underreplication_age(marks: Iterable[UnderreplicationMark], grace_seconds: int,
                               now_ms: int) -> list[Violation]:
    """Marks whose age in whole seconds is greater than the grace period (0 = off); marks of open
    ledgers count too; marks without ctime cannot be aged."""
    if grace_seconds <= 0:
        return []
    out = []
    for mark in marks:
        age = mark.age_seconds(now_ms)
        if age is not None and age > grace_seconds:
            details = {"marked_at_ms": mark.ctime, "age_seconds": age, "grace_period_seconds": grace_seconds}
            out.append(Violation(Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD, mark.ledger_id, mark.replicas,
                                 details))
    return out

