"""The leaders' records (`scrutiny.records`): each read tolerantly, whatever another version or a damaged
store left; pure logic over a dict standing in for the store."""

from __future__ import annotations

import logging

import pytest

from scrutiny.auditor.cursors import CURSORS, Cursors
from scrutiny.auditor.deeprecord import DEEP_PASS
from scrutiny.auditor.history import HISTORY
from scrutiny.auditor.lastrun import last_run
from scrutiny.auditor.leadership import cadence
from scrutiny.deeppass import DeepPass
from scrutiny.lostbookies import SIGHTINGS as LOST
from scrutiny.orphans import SIGHTINGS as ORPHANS
from scrutiny.orphans import Sightings
from scrutiny.records import LeaderRecord


class Records(dict[str, bytes]):
    def auditor_record(self, name: str) -> bytes | None:
        return self.get(name)

    def set_auditor_record(self, name: str, data: bytes) -> None:
        self[name] = data


EVERY: list[tuple[LeaderRecord, object]] = [  # type: ignore[type-arg]
    (cadence("full"), 1234), (last_run("full"), None), (DEEP_PASS, DeepPass.fresh(8, 1000)),
    (ORPHANS, Sightings({"b:3181": {7: 1000}})), (LOST, {"b:3181": 1000}),
    (CURSORS, Cursors({"b:3181": ("feed", 3)}, "r42")), (HISTORY, [])]


@pytest.mark.parametrize(("record", "value"), EVERY, ids=[r.name for r, _ in EVERY])
def test_each_record_is_written_read_back_and_empty_when_absent_or_unreadable(
        record: LeaderRecord, value: object, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[type-arg]
    store = Records()
    assert record.read(store) == record.empty()
    if value is not None:
        record.write(store, value)
        assert record.read(store) == value
    for garbage in (b"\x00garbage", b'{"format": 99}', "znode é".encode()):
        store[record.name] = garbage
        with caplog.at_level(logging.ERROR):
            assert record.read(store) == record.empty()
        assert record.name in caplog.text and "cannot be read" in caplog.text
        caplog.clear()
