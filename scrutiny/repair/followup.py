"""Each mark the hand-off wrote, followed to its end. Pure: the hand-off reads the marks and looks again.

A replication worker removes a mark when its checker finds nothing more to copy (`markLedgerReplicated`). Once
the mark is gone, a look at the ledger tells which end it came to: the copies back where the metadata (perhaps a
new ensemble) says, a repair, with its time; or the loss still there, a repair claimed and not done
(`UNMARKED_WITHOUT_REPAIR`), with the cause where scrutiny can tell it and the command that repairs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.checks.remedy import NO, RepairContext, remedy
from scrutiny.repair.plan import Candidate
from scrutiny.times import iso

# What a mark is written for, and so what must be gone once it is removed.
LOSSES = frozenset({Category.NO_REPLICA_OF_AN_ENTRY, Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY,
                    Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY, Category.LOST_BOOKIE_RECOVERY_NOT_STARTED})


@dataclass(frozen=True)
class Followed:
    candidate: Candidate
    marked_ms: int
    overdue_noted: bool = False


def unrepaired(f: Followed, found: Iterable[Violation], now_ms: int, ctx: RepairContext) -> Violation | None:
    """The look after the mark was removed found this: the repair claimed and not done, or None (repaired)."""
    loss = next((v for v in found if v.ledger_id == f.candidate.ledger_id and v.category in LOSSES), None)
    if loss is None:
        return None
    at_zero = remedy(loss, RepairContext(0))
    if ctx.verification_percentage > 0 and at_zero.autorecovery == NO:
        cause = (f"scrutiny judged with auditor_ledger_verification_percentage {ctx.verification_percentage}, and "
                 f"the worker's checker did not see the loss: at 0, BookKeeper's default, {at_zero.why}; set "
                 "auditor_ledger_verification_percentage to what the cluster runs with")
    else:
        cause = ("the worker's checker saw the loss and its copy did not restore it: its log says why (a source "
                 "bookie that failed the read, apache/bookkeeper #4678 on large fragments)")
    return Violation(Category.UNMARKED_WITHOUT_REPAIR, loss.ledger_id, loss.bookies, {
        "marked_at": iso(f.marked_ms), "replicas": list(f.candidate.replicas), "marked_for": str(f.candidate.category),
        "unmarked_by": "a replication worker (or by hand)", "unmarked_seen_at": iso(now_ms),
        "loss": f"{loss.category} on {', '.join(loss.bookies)}", "cause": cause,
        **({"shares_lacking": loss.details["shares_lacking"]} if "shares_lacking" in loss.details else {})},
        loss.metadata_version, loss.owner)
