"""The lost bookie nobody handles (LOST_BOOKIE_RECOVERY_NOT_STARTED), on ZooKeeper and on etcd: a bookie
whose registration is gone, named by closed ledgers that nobody marks under-replicated after
lostBookieRecoveryDelay and the grace; and the races that must not make it a finding."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scrutiny.agent import BookieAgent
from scrutiny.checks import expected_share
from scrutiny.config import ScanSettings
from scrutiny.entrysources import SyntheticStore
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.errors import DataError
from scrutiny.lostbookies import SIGHTINGS, parse_sightings, sightings_to_bytes
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment, UnderreplicationMark
from scrutiny.orphans import SIGHTINGS as ORPHAN_SIGHTINGS
from scrutiny.report import Report
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.demo import bookie
from tests.conftest import Place
from tests.support.helpers import HookEngine

LOST = bookie(1)
CATEGORY = "LOST_BOOKIE_RECOVERY_NOT_STARTED"


@dataclass
class Cluster:
    writer: ClusterWriter
    place: Place

    def settings(self, **kw: object) -> ScanSettings:
        base: dict[str, object] = dict(metadata_service_uri=self.place.uri, placement_policy="none",
                                       recheck_delay=0.2, bookie_deadline_seconds=5.0, lost_bookie_grace_period=1)
        return ScanSettings(**{**base, **kw})  # type: ignore[arg-type]

    def run(self, engine: object = None, record: bool = False, **kw: object) -> Report:
        return ScrutinyRun(self.settings(**kw), engine or LocalEngine(),  # type: ignore[arg-type]
                           record_sightings=record).execute()


@pytest.fixture
def cluster(place: Place, tmp_path: Path) -> Iterator[Cluster]:
    """Ledgers 1-3 (E3 WQ2 AQ2) and 4 (E3 WQ3 AQ2) on bookies 1-3, 5 (E3) on bookies 2-4, every copy in place.
    Bookie 1 then loses its registration; its agent still answers (its disk is there, nobody reads it)."""
    w = ClusterWriter(place.client, place.root)
    w.init_cluster()
    three = tuple(bookie(n) for n in (1, 2, 3))
    mds = [LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, 29, 0, (Segment(0, three),)) for lid in (1, 2, 3)]
    mds += [LedgerMetadata(4, LedgerState.CLOSED, 3, 3, 2, 29, 0, (Segment(0, three),)),
            LedgerMetadata(5, LedgerState.CLOSED, 3, 2, 2, 29, 0, (Segment(0, tuple(bookie(n) for n in (2, 3, 4))),))]
    w.write_ledgers(mds)
    store = SyntheticStoreWriter()
    for md in mds:
        for b in md.bookies:
            store.add(b, md.ledger_id, expected_share(md, b))
    paths = store.write_all(tmp_path)
    agents = []
    for n in (1, 2, 3, 4):
        w.register_bookie(BookieRegistration(bookie(n), False))
        a = BookieAgent(SyntheticStore(paths[bookie(n)]), bind="127.0.0.1:0").start()
        a.register(place.registry, bookie(n), f"127.0.0.1:{a.port}")
        agents.append(a)
    w.set_lost_bookie_recovery_delay(1)
    w.unregister_bookie(LOST)
    try:
        yield Cluster(w, place)
    finally:
        for a in agents:
            a.stop(grace=0)


def lost_findings(report: Report) -> dict[int, dict[str, object]]:
    return {v.ledger_id: v.details for v in report.violations if str(v.category) == CATEGORY}


def test_a_lost_bookie_nobody_marks_is_reported_after_the_delay_and_the_grace(cluster: Cluster) -> None:
    # first seen gone now: not yet (the delay, 1 s here, and the grace, 1 s)
    first = cluster.run(record=True)
    assert first.complete and not first.violations and first.exit_status() == 0
    assert first.stats["lost_bookies"] == 1 and first.stats["lost_bookie_ledgers_not_yet_due"] == 4
    time.sleep(2.1)
    later = cluster.run(record=True)
    found = lost_findings(later)
    assert set(found) == {1, 2, 3, 4} and later.exit_status() == 1  # ledger 5 does not name it
    assert {v.bookies for v in later.violations} == {(LOST,)}
    assert found[1]["least_copies"] == 1 and found[1]["below_ack_quorum"] is True  # WQ 2: one copy left
    assert found[4]["least_copies"] == 2 and found[4]["below_ack_quorum"] is False  # WQ 3: still AQ
    assert found[1]["lost_bookie_recovery_delay_seconds"] == 1 and found[1]["lost_bookies"] == [LOST]
    assert "not marked under-replicated after lostBookieRecoveryDelay 1 s" in later.render_text()
    # a scan reads the auditor's sightings and records nothing
    assert set(lost_findings(cluster.run())) == {1, 2, 3, 4}
    # autorecovery marks them (and is repairing): no finding
    for lid in (1, 2, 3, 4):
        cluster.writer.mark_underreplicated(UnderreplicationMark(lid, (LOST,), int(time.time() * 1000)))
    marked = cluster.run(record=True)
    assert not lost_findings(marked) and marked.ledgers["skipped_underreplicated"] == 4


def test_without_the_auditors_sightings_a_scan_reports_only_with_no_delay_and_no_grace(cluster: Cluster) -> None:
    assert not lost_findings(cluster.run())  # first seen now, by a scan that keeps nothing
    assert not lost_findings(cluster.run())
    cluster.writer.set_lost_bookie_recovery_delay(0)
    assert set(lost_findings(cluster.run(lost_bookie_grace_period=0))) == {1, 2, 3, 4}


def test_a_lost_bookie_back_during_the_run_is_not_a_finding(cluster: Cluster) -> None:
    cluster.writer.set_lost_bookie_recovery_delay(0)
    back = HookEngine(lambda: cluster.writer.register_bookie(BookieRegistration(LOST, False)))
    report = cluster.run(back, lost_bookie_grace_period=0)
    assert not lost_findings(report) and report.complete
    assert report.stats["relooked_after_registration_change"] == 4


def test_a_ledger_marked_during_the_run_is_not_a_finding(cluster: Cluster) -> None:
    cluster.writer.set_lost_bookie_recovery_delay(0)
    marks = HookEngine(lambda: cluster.writer.mark_underreplicated(UnderreplicationMark(2, (LOST,), None)))
    assert set(lost_findings(cluster.run(marks, lost_bookie_grace_period=0))) == {1, 3, 4}


def test_sightings_are_forgotten_when_the_bookie_is_back(cluster: Cluster) -> None:
    store = cluster.place.registry
    cluster.run(record=True)
    assert set(SIGHTINGS.read(store)) == {LOST}
    cluster.writer.register_bookie(BookieRegistration(LOST, False))
    cluster.run(record=True)
    assert SIGHTINGS.read(store) == {}


def test_stored_sightings_are_checked() -> None:
    assert parse_sightings(sightings_to_bytes({"b:3181": 5}), "x") == {"b:3181": 5}
    for bad in (b"", b"[]", b'{"format": 2}', b'{"format": 1, "first_seen_gone_ms": {"b": -1}}',
                b'{"format": 1, "first_seen_gone_ms": {"b": "soon"}}', b"\xff"):
        with pytest.raises(DataError, match="stored"):
            parse_sightings(bad, "stored")


def test_scrutiny_sightings_prints_what_the_auditor_keeps(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    from scrutiny.cli import main
    from scrutiny.orphans import Sightings

    cluster.run(record=True)
    ORPHAN_SIGHTINGS.write(cluster.place.registry, Sightings({bookie(2): {77: 1_700_000_000_000}}))
    assert main(["sightings", "--metadata-service-uri", cluster.place.uri]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["orphans"] == {bookie(2): {"77": "2023-11-14T22:13:20.000Z"}} and doc["orphans_untracked"] == 0
    assert set(doc["lost_bookies"]) == {LOST}

