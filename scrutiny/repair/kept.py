"""What the hand-off follows, kept by the leaders (`<scrutiny path>/auditor/handoff`), so that it survives a
failover: each mark being followed to its end (written by a leader, or adopted from BookKeeper's Auditor), and the
ledgers a worker unmarked without repair, never to be marked again at that metadata version (marked again, they
would be unmarked again). Read tolerantly: a record of an older version lacks fields, an entry that cannot be read
is skipped and said so. Pure."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.errors import DataError
from scrutiny.records import LeaderRecord
from scrutiny.repair.followup import Followed
from scrutiny.repair.plan import Candidate

log = logging.getLogger(__name__)
MAX_KEPT = 10_000  # of each kind, the newest: a record of a few MB at most


@dataclass(frozen=True)
class GivenUp:
    """A ledger a worker unmarked while its loss remained: not marked again while at `metadata_version`."""

    metadata_version: int
    at_ms: int
    finding: Violation  # UNMARKED_WITHOUT_REPAIR, as concluded


@dataclass(frozen=True)
class Kept:
    followed: Mapping[int, Followed] = field(default_factory=dict)
    given_up: Mapping[int, GivenUp] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        followed = sorted(self.followed.values(), key=lambda f: f.marked_ms)[-MAX_KEPT:]
        given_up = sorted(self.given_up.items(), key=lambda kv: kv[1].at_ms)[-MAX_KEPT:]
        return json.dumps({
            "followed": [{"ledger_id": f.candidate.ledger_id, "category": str(f.candidate.category),
                          "replicas": list(f.candidate.replicas), "metadata_version": f.candidate.metadata_version,
                          "why": f.candidate.why, "marked_ms": f.marked_ms, "overdue_noted": f.overdue_noted}
                         for f in followed],
            "given_up": [{"ledger_id": lid, "metadata_version": g.metadata_version, "at_ms": g.at_ms,
                          "finding": g.finding.to_json()} for lid, g in given_up]}, sort_keys=True).encode()

    @staticmethod
    def parse(data: bytes) -> Kept:
        try:
            doc = json.loads(data)
            followed_docs, given_up_docs = list(doc.get("followed", [])), list(doc.get("given_up", []))
        except (ValueError, TypeError, AttributeError) as exc:
            raise DataError(f"not the hand-off's record ({type(exc).__name__}: {exc})") from None
        followed: dict[int, Followed] = {}
        given_up: dict[int, GivenUp] = {}
        skipped = 0
        for d in followed_docs:
            try:
                c = Candidate(int(d["ledger_id"]), Category(d["category"]), tuple(map(str, d["replicas"])),
                              int(d["metadata_version"]), str(d.get("why", "")))
                followed[c.ledger_id] = Followed(c, int(d["marked_ms"]), bool(d.get("overdue_noted", False)))
            except (KeyError, ValueError, TypeError):
                skipped += 1
        for d in given_up_docs:
            try:
                given_up[int(d["ledger_id"])] = GivenUp(int(d["metadata_version"]), int(d.get("at_ms", 0)),
                                                        Violation.from_json(d["finding"]))
            except (KeyError, ValueError, TypeError, AttributeError):
                skipped += 1
        if skipped:
            log.error("the hand-off's record: %d entries cannot be read and are left out", skipped)
        return Kept(followed, given_up)


HANDOFF_RECORD: LeaderRecord[Kept] = LeaderRecord(
    "handoff", Kept.parse, Kept.to_bytes, Kept,
    "the marks written before are not followed to their end, and a ledger a worker unmarked without repair may be "
    "marked again")

