"""A lost bookie nobody handles: LOST_BOOKIE_RECOVERY_NOT_STARTED.

BookKeeper's auditor marks every ledger of a bookie whose registration (`available/`) is gone
under-replicated after `lostBookieRecoveryDelay` (BP-34: the auditor must "be aware of its
unavailability"), and autorecovery then copies its entries elsewhere. Nothing records when a
registration went away: what scrutiny knows is when it first saw the bookie gone. The auditor keeps that
per bookie from run to run (the sightings, plain JSON in the store); `scrutiny scan` reads them and takes a
bookie it has no sighting for as first seen gone now. Pure: the store is the driver's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from scrutiny.categories import Category
from scrutiny.checks import BookieAnswer, Violation, coverage_without
from scrutiny.checks.whatif import most_in_a_write_set
from scrutiny.errors import DataError
from scrutiny.metadata import LedgerMetadata
from scrutiny.records import LeaderRecord
from scrutiny.times import iso

FORMAT = 1


@dataclass(frozen=True)
class LostBookies:
    """What decides whether nobody is repairing a lost bookie's ledgers. BookKeeper's auditor marks every
    ledger of a bookie whose registration is gone under-replicated after `lostBookieRecoveryDelay`;
    autorecovery then copies them. A bookie unregistered at every look of a run, named by a closed
    ledger that carries no mark that long (plus a grace) after the bookie was first seen gone, means
    autorecovery is off or its auditor is dead: the data is one failure closer to loss and nobody acts."""

    registered: frozenset[str]  # registered (writable or read-only) at some look of the run
    first_seen: Mapping[str, int] = field(default_factory=dict)  # bookie -> first seen unregistered (ms)
    delay_seconds: int = 0  # lostBookieRecoveryDelay: the store's, else the setting
    grace_seconds: int = 300
    replication_disabled: bool = False  # underreplication/disable exists: BookKeeper's repairs are off

    def gone(self, md: LedgerMetadata) -> set[str]:
        """The bookies of the ledger's non-empty segments registered at no look."""
        if md.bookies <= self.registered:
            return set()
        return {b for seg, _, _ in md.segment_ranges() for b in seg.ensemble} - self.registered

    def due(self, bookie: str, now_ms: int) -> bool:
        """Gone for longer than the delay and the grace (a bookie never seen gone before: first seen now)."""
        wait_ms = (self.delay_seconds + self.grace_seconds) * 1000
        since = self.first_seen.get(bookie)
        return wait_ms == 0 or (since is not None and now_ms - since >= wait_ms)

    def with_registered(self, more: Iterable[str]) -> LostBookies:
        return dataclasses.replace(self, registered=self.registered | frozenset(more))


def check_lost_bookie_recovery(md: LedgerMetadata, answers: Mapping[str, BookieAnswer], healthy: bool,
                               gone: Collection[str], lost: LostBookies, now_ms: int) -> Violation | None:
    """LOST_BOOKIE_RECOVERY_NOT_STARTED: the closed, unmarked ledger names bookies gone long enough for
    BookKeeper to have marked it (None while none is). Its details say the fewest copies of any entry on
    the bookies still registered (whatever the gone ones still hold: no client reads them): below AQ the
    data is at risk now (the page). `healthy`: every bookie holds exactly its share (`answers` unused)."""
    due = sorted(b for b in gone if lost.due(b, now_ms))
    if not due:
        return None
    least_copies = (md.write_quorum - most_in_a_write_set(md, set(gone)) if healthy
                    else coverage_without(md, answers, gone).least_copies)
    details = {"lost_bookies": sorted(gone), "seen_gone_since": {b: iso(t) if (t := lost.first_seen.get(b)) is not None
                                                                 else None for b in due},
               "least_copies": least_copies, "ack_quorum": md.ack_quorum, "write_quorum": md.write_quorum,
               "below_ack_quorum": least_copies < md.ack_quorum,
               "lost_bookie_recovery_delay_seconds": lost.delay_seconds, "grace_period_seconds": lost.grace_seconds,
               "replication_disabled": lost.replication_disabled}
    return Violation(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, md.ledger_id, tuple(due), details, md.znode_version)


def sightings_to_bytes(first_seen: Mapping[str, int]) -> bytes:
    """The sightings as the store keeps them: readable JSON (`scrutiny sightings` prints them)."""
    return json.dumps({"format": FORMAT, "first_seen_gone_ms": dict(sorted(first_seen.items()))},
                      separators=(",", ":")).encode()


def parse_sightings(data: bytes, where: str) -> dict[str, int]:
    """Stored sightings: bookie -> first seen gone (ms); DataError naming `where` and what is wrong otherwise."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DataError(f"{where}: not format {FORMAT}")
    seen = doc.get("first_seen_gone_ms")
    if not isinstance(seen, dict) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                             for t in seen.values()):
        raise DataError(f"{where}: first_seen_gone_ms is not {{bookie: milliseconds}}")
    return {str(b): t for b, t in seen.items()}


SIGHTINGS: LeaderRecord[dict[str, int]] = LeaderRecord(
    "lost-bookie-sightings", lambda data: parse_sightings(data, "the stored lost-bookie sightings"),
    sightings_to_bytes, dict, "every lost bookie is seen gone from now")
