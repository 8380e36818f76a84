"""The churn soak's judge of the hand-off (scrutiny.testing.racedlosses): each thing the hand-off can do wrong
against the losses the churn raced is named, and what it does right is not."""

from __future__ import annotations

from scrutiny.categories import Category
from scrutiny.repair.plan import DELETED, MARKED, NOT_CONFIRMED, REPAIRED, UNREPAIRED, Candidate, Handed
from scrutiny.testing.racedlosses import Loss, Losses, concluded, judge

B = "127.0.4.1:3181"


def handed(lid: int, outcome: str, at_ms: int, version: int = 4, seconds: float | None = None) -> Handed:
    c = Candidate(lid, Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, (B,), version, "a share gone")
    return Handed(at_ms, "soak", c, outcome, seconds=seconds)


def test_a_loss_marked_and_repaired_and_one_the_churn_ended_first_are_right() -> None:
    losses = {1: Loss(B, 1000, 4, 3000, "repaired"), 2: Loss(B, 1000, 7, 1500, "rereplicated"),
              3: Loss(B, 1000, 4, 2500, "deleted", deleted=True)}
    journal = [handed(1, MARKED, 2000), handed(1, REPAIRED, 3100, seconds=1.1),
               handed(3, MARKED, 2000), handed(3, DELETED, 2600)]
    wrong, figures = judge(journal, losses)
    assert wrong == []
    assert figures == {"injected": 3, "marked": 2, "repaired": 1, "deleted_while_marked": 1,
                       "rereplicated_by_the_churn_before_a_mark": 1, "mark_to_repaired_p50_s": 1.1,
                       "mark_to_repaired_max_s": 1.1}


def test_a_ledger_repaired_then_deleted_before_the_follow_up_looked_is_right() -> None:
    losses = {1: Loss(B, 1000, 4, 3000, "repaired", deleted=True)}
    assert judge([handed(1, MARKED, 2000), handed(1, DELETED, 3500)], losses)[0] == []


def test_what_the_hand_off_can_do_wrong_is_named() -> None:
    losses = {1: Loss(B, 1000, 4, 3000, "repaired"), 2: Loss(B, 5000, 4), 3: Loss(B, 1000, 4, 1500, "rereplicated"),
              4: Loss(B, 1000, 4, 3000, "repaired"), 5: Loss(B, 1000, 4)}
    journal = [handed(1, MARKED, 2000), handed(1, MARKED, 2500), handed(1, REPAIRED, 3100),
               handed(2, MARKED, 2000),  # before its loss
               handed(3, MARKED, 2000, version=5),  # the churn had moved it on: not the loss's version
               handed(4, MARKED, 2000), handed(4, UNREPAIRED, 3100),
               handed(9, MARKED, 2000),  # nothing lost there
               handed(5, NOT_CONFIRMED, 2000)]  # a look again did not find it
    wrong, _ = judge(journal, losses)
    assert wrong == [
        "ledger 1 marked 2 times",
        "ledger 2 marked before its loss",
        "ledger 3 marked at metadata version 5; its loss stood at 4 only",
        "ledger 9 marked, which only the churn's legal operations touched",
        "ledger 2 marked for its loss on 127.0.4.1:3181, and the hand-off's follow-up concluded nothing (the loss: "
        "standing)",
        "ledger 3 marked for its loss on 127.0.4.1:3181, and the hand-off's follow-up concluded nothing (the loss: "
        "rereplicated)",
        "ledger 4 marked for its loss on 127.0.4.1:3181, and the hand-off's follow-up concluded unmarked without "
        "repair (the loss: repaired)",
        "ledger 5: its loss on 127.0.4.1:3181 was never marked, and is standing (the hand-off's journal of it: "
        "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY not marked: a look again did not find it)",
    ]


def test_concluded_once_every_mark_is_followed_to_an_end() -> None:
    assert concluded([handed(1, MARKED, 2000), handed(1, REPAIRED, 3000), handed(2, MARKED, 2000),
                      handed(2, DELETED, 2500)])
    assert not concluded([handed(1, MARKED, 2000), handed(1, REPAIRED, 3000), handed(2, MARKED, 2000)])


def test_a_loss_ends_once_and_a_deletion_is_kept_after_it_ended() -> None:
    losses = Losses({1: Loss(B, 1000, 4), 2: Loss(B, 1000, 4)})
    losses.end(1, "repaired")
    losses.end(1, "deleted")
    assert losses[1].how == "repaired" and losses[1].deleted
    assert losses.standing(1) is None and losses.standing(2) is losses[2]
    assert list(losses.still_standing()) == [2]
