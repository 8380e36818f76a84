"""False alarms under routine churn, each reproduced deterministically at the moment it strikes: the
first pass, the delayed re-check, the re-read before reporting. Every fact a finding rests on must
still be true when it is reported."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from scrutiny.agent import BookieAgent
from scrutiny.checks import expected_share
from scrutiny.config import ScanSettings
from scrutiny.entrysources import SyntheticStore
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment, UnderreplicationMark
from scrutiny.report import Report
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine, Progress
from scrutiny.scan.result import RangeResult
from scrutiny.store import LedgerRange
from scrutiny.store.zookeeper import ZooKeeperStore
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper
from tests.support.helpers import HookEngine

BOOKIES = [f"127.0.3.{n}:3181" for n in range(1, 5)]


@dataclass
class Cluster:
    """Ledgers 1..6 (E3 WQ2 AQ2) on bookies 1..4, all healthy; an agent per bookie that can be stopped
    and started again (a rolling restart), bookie registrations that can come and go."""

    writer: ClusterWriter
    store: ZooKeeperStore
    uri: str
    files: dict[str, Path]
    agents: dict[str, BookieAgent] = field(default_factory=dict)

    def start_agent(self, bookie: str) -> None:
        agent = BookieAgent(SyntheticStore(self.files[bookie]), bind="127.0.0.1:0").start()
        agent.register(self.store, bookie, f"127.0.0.1:{agent.port}")
        self.agents[bookie] = agent

    def stop_agent(self, bookie: str) -> None:
        self.agents.pop(bookie).stop(grace=0)

    def settings(self, **kw: object) -> ScanSettings:
        base: dict[str, object] = dict(metadata_service_uri=self.uri, engine="local", recheck_delay=0.2,
                                       placement_policy="none", bookie_deadline_seconds=3.0,
                                       underreplicated_grace_period=1)
        base.update(kw)
        return ScanSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
def cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    store = SyntheticStoreWriter()
    mds = []
    for lid in range(1, 7):
        ens = tuple(BOOKIES[(lid + i) % 4] for i in range(3))
        md = LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, 99, 0, (Segment(0, ens),))
        mds.append(md)
        for b in ens:
            store.add(b, lid, expected_share(md, b))
    w.write_ledgers(mds)
    for b in BOOKIES:
        w.register_bookie(BookieRegistration(b, False))
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    c = Cluster(w, store_on(zk_client, uri), uri, store.write_all(tmp_path))
    for b in BOOKIES:
        c.start_agent(b)
    yield c
    for a in c.agents.values():
        a.stop(grace=0)


def found(report: Report) -> set[tuple[str, int]]:
    return {(str(v.category), v.ledger_id) for v in report.violations}


class OnPass(LocalEngine):
    """Something happens to the cluster once, right after the first pass of the given kind."""

    def __init__(self, mode: Pass, hook: Callable[[], None]) -> None:
        self.mode = mode
        self.hook: Callable[[], None] | None = hook

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Progress | None = None) -> Iterator[RangeResult]:
        yield from super().map_ranges(ctx, ranges, mode, progress)
        if mode is self.mode and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()


def delays(*hooks: Callable[[], None]) -> Callable[[float], None]:
    """A `sleep` for the run that does one thing at each delayed look, in turn."""
    todo = list(hooks)

    def sleep(_: float) -> None:
        if todo:
            todo.pop(0)()

    return sleep


# -- under-replication marks ----------------------------------------------------------------------

def test_a_mark_repaired_during_the_run_is_not_aged(cluster: Cluster) -> None:
    old = int(time.time() * 1000) - 3_600_000
    cluster.writer.mark_underreplicated(UnderreplicationMark(1, (BOOKIES[2],), old))
    # a replication worker repairs ledger 1 and removes the mark while the run is still going
    report = ScrutinyRun(cluster.settings(), HookEngine(lambda: cluster.writer.unmark_underreplicated(1))).execute()
    assert found(report) == set() and report.stats["marks_gone_before_reporting"] == 1
    # a mark removed and re-created meanwhile is aged from its new ctime
    cluster.writer.mark_underreplicated(UnderreplicationMark(2, (BOOKIES[2],), old))
    fresh = UnderreplicationMark(2, (BOOKIES[3],), int(time.time() * 1000))
    report = ScrutinyRun(cluster.settings(underreplicated_grace_period=600),
                         HookEngine(lambda: cluster.writer.mark_underreplicated(fresh))).execute()
    assert found(report) == set()
    # and one that stays is reported
    cluster.writer.mark_underreplicated(UnderreplicationMark(3, (BOOKIES[2],), old))
    report = ScrutinyRun(cluster.settings(underreplicated_grace_period=600), LocalEngine()).execute()
    assert found(report) == {("UNDERREPLICATED_ELAPSED_GRACE_PERIOD", 3)}


# -- a rolling restart -------------------------------------------------------------------------------

def test_a_rolling_restart_across_the_recheck_is_no_false_alarm(cluster: Cluster) -> None:
    a, b = BOOKIES[0], BOOKIES[1]
    cluster.stop_agent(a)  # bookie A restarting during the first look
    # at the re-check: A is back, and B (which answered the first look) is restarting; B is back
    # before its own delayed look
    sleep = delays(lambda: (cluster.start_agent(a), cluster.stop_agent(b)), lambda: cluster.start_agent(b))
    report = ScrutinyRun(cluster.settings(), LocalEngine(), sleep=sleep).execute()
    assert found(report) == set() and report.complete
    assert report.stats["rechecked_again"] > 0  # B got its own delayed look


def test_a_bookie_silent_at_two_looks_is_reported_after_its_own_delayed_look(cluster: Cluster) -> None:
    a, b = BOOKIES[0], BOOKIES[1]
    cluster.stop_agent(a)
    sleep = delays(lambda: (cluster.start_agent(a), cluster.stop_agent(b)))  # B stays down from the re-check on
    report = ScrutinyRun(cluster.settings(), LocalEngine(), sleep=sleep).execute()
    blamed = {bk for v in report.violations for bk in v.bookies}
    # the ledgers re-checked because of A that are also on B (the others were answered in full at the first look)
    both = {lid for lid in range(1, 7) if {a, b} <= {BOOKIES[(lid + i) % 4] for i in range(3)}}
    assert found(report) == {("BOOKIE_UNAVAILABLE", lid) for lid in both} and blamed == {b}
    assert report.stats["rechecked_again"] == len(both)


def test_a_bookie_unregistered_only_while_it_restarts_has_not_lost_its_copies(cluster: Cluster) -> None:
    a = BOOKIES[0]
    cluster.stop_agent(a)

    def restarting() -> None:  # its registration is gone at the re-check (the bookie process restarts) ...
        cluster.writer.unregister_bookie(a)

    def back() -> None:  # ... and back at the next look
        cluster.writer.register_bookie(BookieRegistration(a, False))
        cluster.start_agent(a)

    report = ScrutinyRun(cluster.settings(), LocalEngine(), sleep=delays(restarting, back)).execute()
    assert found(report) == set()  # never NO_REPLICA / LESS_THAN_AQ from copies of a bookie that came back


def test_a_blamed_bookie_that_left_before_reporting_is_looked_at_again(cluster: Cluster) -> None:
    a = BOOKIES[0]
    cluster.stop_agent(a)
    # silent at both looks and registered: BOOKIE_UNAVAILABLE, unless its registration is gone when the
    # finding is about to be reported (then it is neither "registered" nor "unregistered at every look")
    report = ScrutinyRun(cluster.settings(), OnPass(Pass.FINAL, lambda: cluster.writer.unregister_bookie(a))).execute()
    assert found(report) == set() and report.stats["relooked_after_registration_change"] > 0
    assert report.stats["left_unsettled_after_rechecks"] > 0  # the next run will know
    # the same without the registration change: reported
    cluster.writer.register_bookie(BookieRegistration(a, False))
    report = ScrutinyRun(cluster.settings(), LocalEngine()).execute()
    assert {v.category for v in report.violations} == {"BOOKIE_UNAVAILABLE"}


def test_a_silence_at_an_address_the_agent_has_left_is_looked_at_again_where_it_listens(cluster: Cluster) -> None:
    a = BOOKIES[0]
    old = cluster.agents[a].port
    cluster.stop_agent(a)
    # its process killed: the registration outlives it a while, so both looks ask the address it had
    stale = cluster.store.register_agent(a, f"127.0.0.1:{old}")

    def back_elsewhere() -> None:  # it came back on another port during the delayed look (a loaded machine)
        stale.close()
        cluster.start_agent(a)

    report = ScrutinyRun(cluster.settings(), OnPass(Pass.FINAL, back_elsewhere)).execute()
    assert found(report) == set() and report.complete
    assert report.stats["relooked_after_agent_moved"] > 0
    # silent where it is still registered: reported, with where it was asked
    port = cluster.agents[a].port
    cluster.stop_agent(a)
    stale = cluster.store.register_agent(a, f"127.0.0.1:{port}")
    report = ScrutinyRun(cluster.settings(), LocalEngine()).execute()
    assert {v.category for v in report.violations} == {"BOOKIE_UNAVAILABLE"}
    assert {v.details["agents"][a] for v in report.violations} == {f"127.0.0.1:{port}"}
    assert report.stats["relooked_after_agent_moved"] == 0
    stale.close()


# -- racks ------------------------------------------------------------------------------------------

class EveryPass(LocalEngine):
    """Something happens to the cluster after every pass (the first and each look again)."""

    def __init__(self, hook: Callable[[], None]) -> None:
        self.hook = hook

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Progress | None = None) -> Iterator[RangeResult]:
        yield from super().map_ranges(ctx, ranges, mode, progress)
        self.hook()


def test_a_finding_whose_facts_keep_changing_is_left_to_the_next_run_and_the_run_completes(cluster: Cluster) -> None:
    """A ledger's metadata rewritten after every look at it (a churn faster than the re-reads): after
    verify_rounds re-reads its finding is not reported, the ledger is named unsettled, and the run is complete
    (one ledger never stops a run); the others' findings stand."""
    md = next(cluster.store.read_ledgers([3])).metadata
    assert md is not None
    weak = cluster.settings(min_ack_quorum=3)  # every ledger's AQ 2 is a finding resting on its metadata
    report = ScrutinyRun(weak, EveryPass(lambda: cluster.writer.update_ledger(md))).execute()
    assert report.complete, report.errors
    assert found(report) == {("WEAK_DURABILITY_POLICY", lid) for lid in (1, 2, 4, 5, 6)}
    assert report.unsettled == {3} and report.stats["left_unsettled_after_rereads"] == 1


def test_a_rack_map_fixed_during_the_run_is_no_placement_finding(cluster: Cluster) -> None:
    racks = f"{cluster.uri.split('//', 1)[1].split('/', 1)[1].rsplit('/', 1)[0]}/bookies"
    bad = {b: "/rack-a" for b in BOOKIES}
    good = {b: f"/rack-{i}" for i, b in enumerate(BOOKIES)}
    cluster.writer.write_racks(bad, "/" + racks)
    report = ScrutinyRun(cluster.settings(placement_policy="rackaware"),
                         HookEngine(lambda: cluster.writer.write_racks(good, "/" + racks))).execute()
    assert found(report) == set() and report.stats["reanalyzed_after_rack_change"] == 6
    # racks that stay wrong are reported (a map that breaks only mid-run is the next run's finding)
    cluster.writer.write_racks(bad, "/" + racks)
    report = ScrutinyRun(cluster.settings(placement_policy="rackaware"), LocalEngine()).execute()
    assert found(report) == {("PLACEMENT_POLICY_NOT_ADHERING", lid) for lid in range(1, 7)}
