"""The losses the churn races (`ChurnCluster.lose_share`), and the hand-off judged against them: every mark written
is for an injected loss that still stood when it was marked (the mark's metadata version is the one the loss stood
at, and the store wrote the mark only at that version), no ledger is marked twice, nothing the churn did legally is
marked, and every loss is either repaired through its mark or ended by the churn before one."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scrutiny.auditor.currentstate import Current
from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.repair.plan import DELETED, MARKED, OVERDUE, REPAIRED, UNREPAIRED, Handed


@dataclass
class Loss:
    """A bookie's whole share of a closed ledger gone during the churn: autorecovery's to repair."""

    bookie: str
    at_ms: int
    version: int  # the ledger's metadata version while the loss stands (whatever ends it changes or deletes it)
    ended_ms: int | None = None
    how: str = ""  # what ended it: "deleted" or "rereplicated" by the churn, "repaired" by a worker on a mark
    deleted: bool = False  # the ledger deleted since (also after the loss ended)


class Losses(dict[int, Loss]):
    """By ledger, one loss per ledger at most (the churn's lock guards it)."""

    def standing(self, ledger_id: int) -> Loss | None:
        loss = self.get(ledger_id)
        return loss if loss is not None and loss.ended_ms is None else None

    def still_standing(self) -> dict[int, Loss]:
        return {lid: loss for lid, loss in self.items() if loss.ended_ms is None}

    def end(self, ledger_id: int, how: str) -> None:
        loss = self.standing(ledger_id)
        if loss is not None:
            loss.ended_ms, loss.how = int(time.time() * 1000), how
        if how == "deleted" and ledger_id in self:
            self[ledger_id].deleted = True


# what a bookie's share gone is reported as, the mark on it included once it outlives the grace period
LOSS_CATEGORIES = frozenset({Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, Category.LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY,
                             Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD})
STALE_MS = 10_000  # continuous scrutiny's state may hold a loss this long after it ended (its detection budget)


def of_a_loss(v: Violation, losses: Mapping[int, Loss], since_ms: int) -> bool:
    """A finding of a loss that stood at some time since `since_ms` (a run's start): no false alarm."""
    loss = losses.get(v.ledger_id)
    return (loss is not None and v.category in LOSS_CATEGORIES
            and (loss.ended_ms is None or loss.ended_ms >= since_ms))


def held_for_a_loss(c: Current, losses: Mapping[int, Loss], now_ms: int) -> bool:
    """Continuous scrutiny's finding, seen at `now_ms`, of a loss that stood when it was detected, and stands
    still or ended within STALE_MS."""
    loss = losses.get(c.violation.ledger_id)
    return (loss is not None and c.violation.category in LOSS_CATEGORIES and c.detected_ms >= loss.at_ms
            and (loss.ended_ms is None or now_ms - loss.ended_ms <= STALE_MS))


FOLLOW_UP_ENDS = (REPAIRED, DELETED, UNREPAIRED, OVERDUE)


def concluded(journal: Iterable[Handed]) -> bool:
    """Every mark in the journal followed to an end (the follow-up's look after the worker's turn)."""
    handed = list(journal)
    ended = {h.candidate.ledger_id for h in handed if h.outcome in FOLLOW_UP_ENDS}
    return all(h.candidate.ledger_id in ended for h in handed if h.outcome == MARKED)


def judge(journal: Iterable[Handed], losses: Mapping[int, Loss]) -> tuple[list[str], dict[str, Any]]:
    """What the hand-off did wrong, one line each; and its figures."""
    wrong: list[str] = []
    handed = sorted(journal, key=lambda h: h.at_ms)
    marks = [h for h in handed if h.outcome == MARKED]
    times = Counter(h.candidate.ledger_id for h in marks)
    wrong += [f"ledger {lid} marked {n} times" for lid, n in sorted(times.items()) if n > 1]
    for h in marks:
        lid, version = h.candidate.ledger_id, h.candidate.metadata_version
        loss = losses.get(lid)
        if loss is None:
            wrong.append(f"ledger {lid} marked, which only the churn's legal operations touched")
        elif h.at_ms < loss.at_ms:
            wrong.append(f"ledger {lid} marked before its loss")
        elif version != loss.version:
            wrong.append(f"ledger {lid} marked at metadata version {version}; its loss stood at {loss.version} only")
    ended = {h.candidate.ledger_id: h.outcome for h in handed if h.outcome in FOLLOW_UP_ENDS}
    figures: Counter[str] = Counter(injected=len(losses))
    for lid, loss in sorted(losses.items()):
        if lid in times:
            figures["marked"] += 1
            outcome = ended.get(lid)
            # the follow-up looks after the worker: a ledger repaired and then deleted is seen deleted
            if outcome == REPAIRED or (outcome == DELETED and loss.deleted):
                figures["repaired" if outcome == REPAIRED else "deleted_while_marked"] += 1
            else:
                wrong.append(f"ledger {lid} marked for its loss on {loss.bookie}, and the hand-off's follow-up "
                             f"concluded {outcome or 'nothing'} (the loss: {loss.how or 'standing'})")
        elif loss.how in ("deleted", "rereplicated"):
            figures[f"{loss.how}_by_the_churn_before_a_mark"] += 1
        else:
            tried = "; ".join(f"{h.candidate.category} {h.outcome}" for h in handed if h.candidate.ledger_id == lid)
            wrong.append(f"ledger {lid}: its loss on {loss.bookie} was never marked, and is "
                         f"{loss.how or 'standing'} (the hand-off's journal of it: {tried or 'nothing'})")
    repairs = sorted(h.seconds for h in handed if h.outcome == REPAIRED and h.seconds is not None)
    out: dict[str, Any] = dict(figures)
    if repairs:
        out["mark_to_repaired_p50_s"], out["mark_to_repaired_max_s"] = repairs[len(repairs) // 2], repairs[-1]
    return wrong, out
