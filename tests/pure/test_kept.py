"""What the hand-off follows, as the leaders keep it: read back as written, a record of an older version or with
an entry that cannot be read is read as far as it can be, one that is not the hand-off's at all is none."""

from __future__ import annotations

import json
import logging

import pytest

from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.errors import DataError
from scrutiny.pulsar.owners import Owner
from scrutiny.repair.followup import Followed
from scrutiny.repair.kept import HANDOFF_RECORD, MAX_KEPT, GivenUp, Kept
from scrutiny.repair.plan import Candidate


class Records:
    def __init__(self, data: bytes | None) -> None:
        self.data = data

    def auditor_record(self, name: str) -> bytes | None:
        assert name == "handoff"
        return self.data

    def set_auditor_record(self, name: str, data: bytes) -> None:
        self.data = data


def followed(lid: int, at: int = 1) -> Followed:
    return Followed(Candidate(lid, Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY, ("b1:3181",), 3, "why"), at)


def test_read_back_as_written() -> None:
    unmarked = Violation(Category.UNMARKED_WITHOUT_REPAIR, 4, ("b1:3181",), {"cause": "c"},
                         owner=Owner("topic", "persistent://public/default/t"))
    kept = Kept({3: followed(3), 5: Followed(followed(5).candidate, 7, overdue_noted=True)},
                {4: GivenUp(2, 9, unmarked)})
    store = Records(None)
    assert HANDOFF_RECORD.read(store) == Kept()
    HANDOFF_RECORD.write(store, kept)
    assert HANDOFF_RECORD.read(store) == kept


def test_bounded_to_the_newest() -> None:
    kept = Kept({lid: followed(lid, at=lid) for lid in range(MAX_KEPT + 5)})
    assert set(Kept.parse(kept.to_bytes()).followed) == set(range(5, MAX_KEPT + 5))


def test_an_older_or_damaged_record_is_read_as_far_as_it_can_be(caplog: pytest.LogCaptureFixture) -> None:
    good = json.loads(Kept({3: followed(3)}).to_bytes())["followed"][0]
    older = json.dumps({"followed": [{k: v for k, v in good.items() if k not in ("why", "overdue_noted")}]})
    assert Kept.parse(older.encode()).followed[3].candidate.ledger_id == 3  # no given-up ledgers yet, no why
    with caplog.at_level(logging.ERROR):
        damaged = Kept.parse(json.dumps({"followed": [good, {"ledger_id": "x"}],
                                         "given_up": [{"ledger_id": 4}]}).encode())
    assert set(damaged.followed) == {3} and damaged.given_up == {}
    assert "2 entries cannot be read" in caplog.text
    with pytest.raises(DataError):
        Kept.parse(b"[1, 2]")
    assert HANDOFF_RECORD.read(Records(b"not json")) == Kept()  # none: said in the log, with what it costs
