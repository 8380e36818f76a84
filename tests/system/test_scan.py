"""Whole runs: real ZooKeeper, real agents, the Spark job; BP-34's re-check and re-read steps."""

from __future__ import annotations

import dataclasses
import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from scrutiny.agent import BookieAgent
from scrutiny.categories import Category, Phase, in_phase
from scrutiny.checks import expected_share
from scrutiny.config import ClusterSettings, ScanSettings
from scrutiny.entrysources import SyntheticStore
from scrutiny.entrysources.source import Holding
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.metadata import (
    BookieRegistration,
    LedgerMetadata,
    LedgerState,
    Segment,
    UnderreplicationMark,
)
from scrutiny.scan import engines
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import MetadataStore, chunk_ids, open_store
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.demo import DECOMMISSIONED, DemoCluster, bookie, build_demo_cluster, demo_agents
from scrutiny.testing.localzk import LocalZooKeeper
from tests.conftest import Place, place_on
from tests.support.helpers import HookEngine


def settings_for(uri: str, **kw: object) -> ScanSettings:
    base = dict(metadata_service_uri=uri, recheck_delay=0.5, underreplicated_grace_period=3600,
                bookie_deadline_seconds=5.0)
    base.update(kw)
    return ScanSettings(**base)  # type: ignore[arg-type]


def only_coverage(uri: str) -> ScanSettings:
    """The small cluster has no rack data: look at coverage alone."""
    return settings_for(uri, placement_policy="none")


@pytest.fixture
def demo(place: Place, tmp_path: Path) -> Iterator[tuple[DemoCluster, str]]:
    """The demo cluster, on ZooKeeper and on Pulsar's metadata store on etcd: the same findings."""
    cluster = build_demo_cluster(place.client, place.root, tmp_path, healthy=300)
    with demo_agents(cluster, place.registry):
        yield cluster, place.uri


def found(report_violations: list) -> set[tuple[str, int]]:  # type: ignore[type-arg]
    return {(str(v.category), v.ledger_id) for v in report_violations}


def test_spark_run_finds_exactly_the_injected_faults(demo: tuple[DemoCluster, str], spark_engine: object,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    demo, uri = demo  # type: ignore[assignment]
    report = ScrutinyRun(settings_for(uri), spark_engine).execute()  # type: ignore[arg-type]
    assert report.complete, report.errors
    assert found(report.violations) == demo.expected
    assert report.ledgers["seen"] == demo.ledgers
    assert (report.ledgers["skipped_open"], report.ledgers["skipped_empty"],
            report.ledgers["skipped_underreplicated"]) == (4, 2, 1)
    assert report.counts["BOOKIE_UNAVAILABLE"] == 2 and report.counts["PLACEMENT_POLICY_SOFTLY_ADHERING"] == 0
    assert report.exit_status() == 1
    # the same findings from the in-process engine
    local = ScrutinyRun(settings_for(uri), LocalEngine()).execute()
    assert found(local.violations) == found(report.violations)
    # every ledger again, as ranges of 5, their results brought to the driver a partition at a time
    with open_store(ClusterSettings(metadata_service_uri=uri)) as store:
        ids = [lid for rng in store.ledger_ranges() for lid in store.ledger_ids(rng)]
    monkeypatch.setattr(MetadataStore, "ranges_of", lambda self, ledger_ids: chunk_ids(ledger_ids, 5))
    monkeypatch.setattr(engines, "FETCH_FINDINGS", 1)
    fetched = ScrutinyRun(settings_for(uri), spark_engine).execute(ids)  # type: ignore[arg-type]
    # chosen ledgers, not the whole cluster: no reverse check (what bookies hold beyond the metadata), and
    # no topic's record held against BookKeeper's
    whole_cluster_only = {f for f in found(report.violations) if f[0] in in_phase(Phase.HOLDINGS)
                          + in_phase(Phase.TOPICS)}
    assert whole_cluster_only == {("ORPHAN_LEDGER", 9013)} | {f for f in demo.expected if f[1] > 9100}
    assert found(fetched.violations) == found(report.violations) - whole_cluster_only
    assert fetched.ledgers == report.ledgers


def test_scope_of_chosen_ledgers_and_of_one_bookie(demo: tuple[DemoCluster, str]) -> None:
    _, uri = demo
    report = ScrutinyRun(settings_for(uri, ledgers=(9001, 9004, 3, 17)), LocalEngine()).execute()
    assert found(report.violations) == {("NO_REPLICA_OF_AN_ENTRY", 9001), ("PLACEMENT_POLICY_NOT_ADHERING", 9004),
                                        ("UNDERREPLICATED_ELAPSED_GRACE_PERIOD", 17)}
    assert report.ledgers["seen"] == 4
    gone = ScrutinyRun(settings_for(uri), LocalEngine()).execute(only_bookies=[bookie(DECOMMISSIONED)])
    # its ledger, and the one whose metadata nobody can read (it may be one of its ledgers)
    assert found(gone.violations) == {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 9008), ("INVALID_METADATA", 9010)}
    assert gone.ledgers["seen"] == 2


def _small_cluster(client: Any, root: str, tmp_path: Path) -> tuple[ClusterWriter, dict[str, Path],
                                                                                LedgerMetadata]:
    """Ledger 1 (E3, WQ2, AQ2) whose third bookie lost its copy; a fourth bookie holds a copy too."""
    w = ClusterWriter(client, root)
    w.init_cluster()
    ens = tuple(bookie(n) for n in (1, 2, 3))
    md = LedgerMetadata(1, LedgerState.CLOSED, 3, 2, 2, 99, 0, (Segment(0, ens),))
    w.write_ledgers([md])
    store = SyntheticStoreWriter()
    store.add(bookie(1), 1, expected_share(md, bookie(1)))
    store.add(bookie(2), 1, expected_share(md, bookie(2)))
    store.add(bookie(4), 1, expected_share(md, bookie(3)))  # the re-replicated copy
    for n in (1, 2, 3, 4):
        w.register_bookie(BookieRegistration(bookie(n), False))
    store.add(bookie(3), 2, [])
    return w, store.write_all(tmp_path), md


Small = tuple[ClusterWriter, LedgerMetadata, dict[str, BookieAgent], Place]


@pytest.fixture
def small(place: Place, tmp_path: Path) -> Iterator[Small]:
    """On ZooKeeper and on etcd: the races between the scan and the cluster are the store's to see."""
    w, files, md = _small_cluster(place.client, place.root, tmp_path)
    agents = {}
    for b, f in files.items():
        a = BookieAgent(SyntheticStore(f), bind="127.0.0.1:0").start()
        a.register(place.registry, b, f"127.0.0.1:{a.port}")
        agents[b] = a
    yield w, md, agents, place
    for a in agents.values():
        a.stop(grace=0)


def test_the_fault_is_reported_when_nothing_changes(small: Small) -> None:
    _, _, _, place = small
    report = ScrutinyRun(only_coverage(place.uri), LocalEngine()).execute()
    assert found(report.violations) == {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 1)}
    assert report.stats["reasked_before_reporting"] == 1 and report.stats["potentially_faulty"] == 0
    # the store's requests, named for no one store (ZooKeeper or etcd)
    assert report.stats["store_reads"] > 0 and not {"zk_reads", "zk_peak_in_flight"} & report.stats.keys()


class ReadWhileFlushed:
    """A bookie's index as its agent read it once while the bookie moved it into a new file: each ledger
    missing at its first answer, whole after."""

    def __init__(self, first: Path, then: Path) -> None:
        self.first, self.then = SyntheticStore(first), SyntheticStore(then)
        self.answered: Counter[int] = Counter()

    def availability(self, ledger_id: int) -> Holding | None:
        self.answered[ledger_id] += 1
        return (self.first if self.answered[ledger_id] == 1 else self.then).availability(ledger_id)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_one_wrong_answer_of_a_bookie_is_asked_again_and_no_finding(small: Small) -> None:
    """Every bookie answered and the ledger closed long ago: no delayed re-check. The finding rests on one
    answer all the same, and is asked again before the report, which holds what the second look found."""
    _w, md, agents, place = small
    whole = SyntheticStoreWriter()
    whole.add(bookie(3), 1, expected_share(md, bookie(3)))
    short = Path(agents[bookie(3)].source.path)  # type: ignore[attr-defined]
    paths = whole.write_all(short.parent / "whole")
    agents[bookie(3)].stop(grace=0)
    source = ReadWhileFlushed(short, paths[bookie(3)])
    agents[bookie(3)] = BookieAgent(source, bind="127.0.0.1:0").start()
    agents[bookie(3)].register(place.registry, bookie(3), f"127.0.0.1:{agents[bookie(3)].port}")
    report = ScrutinyRun(only_coverage(place.uri), LocalEngine()).execute()
    assert report.complete and not report.violations, report.violations
    assert source.answered[1] == 2
    assert report.stats["reasked_before_reporting"] == 1 and report.stats["potentially_faulty"] == 0


def test_metadata_change_during_the_run_is_no_false_alarm(small: Small) -> None:
    w, md, _, place = small
    rereplicated = dataclasses.replace(md, segments=(Segment(0, (bookie(1), bookie(2), bookie(4))),))
    run = ScrutinyRun(only_coverage(place.uri), HookEngine(lambda: w.update_ledger(rereplicated)))
    report = run.execute()
    assert not report.violations and report.complete
    assert report.stats["reanalyzed_after_metadata_change"] == 1


def test_ledger_marked_or_deleted_during_the_run_is_dropped(small: Small) -> None:
    w, _, _, place = small
    mark = UnderreplicationMark(1, (bookie(3),), None)
    report = ScrutinyRun(only_coverage(place.uri), HookEngine(lambda: w.mark_underreplicated(mark))).execute()
    assert not report.violations and report.stats["dropped_marked_during_run"] == 1
    w.unmark_underreplicated(1)
    report = ScrutinyRun(only_coverage(place.uri), HookEngine(lambda: w.delete_ledger(1))).execute()
    assert not report.violations and report.ledgers["deleted_during_run"] == 1


def test_an_agent_that_comes_back_before_the_recheck(small: Small) -> None:
    _w, md, agents, place = small
    # bookie 3 is healthy this time, but its agent is down when the run starts
    store = SyntheticStoreWriter()
    store.add(bookie(3), 1, expected_share(md, bookie(3)))
    path = store.write_all(Path(agents[bookie(1)].source.path).parent / "again")  # type: ignore[attr-defined]
    agents[bookie(3)].stop(grace=0)
    revived: list[BookieAgent] = []

    def come_back(_: float) -> None:
        a = BookieAgent(SyntheticStore(path[bookie(3)]), bind="127.0.0.1:0").start()
        a.register(place.registry, bookie(3), f"127.0.0.1:{a.port}")
        revived.append(a)

    try:
        report = ScrutinyRun(only_coverage(place.uri), LocalEngine(), sleep=come_back).execute()
    finally:
        for a in revived:
            a.stop(grace=0)
    assert not report.violations and report.stats["potentially_faulty"] == 1


def test_still_silent_registered_bookie_is_reported_unregistered_one_lost(small: Small) -> None:
    w, _md, agents, place = small
    agents[bookie(1)].stop(grace=0)
    report = ScrutinyRun(only_coverage(place.uri), LocalEngine()).execute()
    assert found(report.violations) == {("BOOKIE_UNAVAILABLE", 1), ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 1)}
    unavailable = next(v for v in report.violations if v.category is Category.BOOKIE_UNAVAILABLE)
    assert unavailable.bookies == (bookie(1),)
    # once bookie 1 is no longer registered, its copies count as gone: entries on {1, 3} have none
    w.unregister_bookie(bookie(1))
    report = ScrutinyRun(only_coverage(place.uri), LocalEngine()).execute()
    assert found(report.violations) == {("NO_REPLICA_OF_AN_ENTRY", 1)}


def test_a_cluster_behind_pulsars_metadata_store_driver_on_zookeeper(
        zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> None:
    """`metadataServiceUri=metadata-store:zk:<hosts>/<chroot>` (PIP-45): the same tree under the chroot's
    /ledgers, the same findings as BookKeeper's own URI for it."""
    uri = f"metadata-store:zk:{zk_server.hosts}{zk_namespace}"
    cluster = build_demo_cluster(zk_client, f"{zk_namespace}/ledgers", tmp_path, healthy=20)
    with demo_agents(cluster, store_on(zk_client, uri)):
        report = ScrutinyRun(settings_for(uri), LocalEngine()).execute()
    assert report.complete, report.errors
    assert found(report.violations) == cluster.expected
    assert report.ledgers["seen"] == cluster.ledgers


def test_weak_durability_policies_are_named_per_ledger_and_per_topic(
        zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> None:
    """WQ 1 (one copy of everything) and AQ 1 (acknowledged on one copy) are at risk by design: a
    warning per ledger, and in `owners` the topic that writes that way."""
    from scrutiny.testing.demo import pulsar_keys

    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    bookies = [bookie(n) for n in (1, 2, 3)]
    store = SyntheticStoreWriter()
    policies = {1: (3, 1, 1), 2: (3, 2, 1), 3: (3, 2, 2), 6: (3, 3, 2)}  # ledger -> E, WQ, AQ
    mds = [LedgerMetadata(lid, LedgerState.CLOSED, e, wq, aq, 29, 0, (Segment(0, tuple(bookies)),),
                          custom_metadata=pulsar_keys(lid)) for lid, (e, wq, aq) in policies.items()]
    # still being written: the policy is in the metadata from creation, the topic is named now
    writing = [LedgerMetadata(lid, LedgerState.OPEN, 3, wq, aq, -1, 0, (Segment(0, tuple(bookies)),),
                              custom_metadata=pulsar_keys(lid)) for lid, wq, aq in ((7, 1, 1), (8, 2, 2))]
    w.write_ledgers(mds + writing)
    for b in bookies:
        w.register_bookie(BookieRegistration(b, False))
        for md in mds:
            store.add(b, md.ledger_id, expected_share(md, b))
    paths = store.write_all(tmp_path)
    agents = [BookieAgent(SyntheticStore(paths[b]), bind="127.0.0.1:0").start() for b in bookies]
    try:
        endpoints = {b: f"127.0.0.1:{a.port}" for b, a in zip(bookies, agents, strict=True)}
        settings = dataclasses.replace(only_coverage(f"zk+hierarchical://{zk_server.hosts}{root}"),
                                       bookie_endpoints=endpoints)
        report = ScrutinyRun(settings, LocalEngine()).execute()
        stricter = ScrutinyRun(dataclasses.replace(settings, min_write_quorum=3), LocalEngine()).execute()
    finally:
        for a in agents:
            a.stop(grace=0)
    assert found(report.violations) == {("WEAK_DURABILITY_POLICY", 1), ("WEAK_DURABILITY_POLICY", 2),
                                        ("WEAK_DURABILITY_POLICY", 7)}
    assert report.exit_status() == 0 and report.ledgers["skipped_open"] == 2  # a warning; coverage: closed only
    reasons = {v.ledger_id: v.details["reasons"] for v in report.violations}
    assert "every entry has one copy" in reasons[1][0] and "acknowledged with 1 copy" in reasons[1][1]
    assert len(reasons[2]) == 1 and "ack quorum 1" in reasons[2][0]
    topics = {o["name"]: o["counts"] for o in report.owners}
    assert topics == {"persistent://public/demo/topic-1": {"WEAK_DURABILITY_POLICY": 1},
                      "persistent://public/demo/topic-2": {"WEAK_DURABILITY_POLICY": 2}}  # ledgers 2 and 7
    assert found(stricter.violations) == {("WEAK_DURABILITY_POLICY", i) for i in (1, 2, 3, 7, 8)}  # WQ 2 < 3


def test_a_ranges_objects_are_freed_before_the_cyclic_collector_is_on_again(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector is paused while a range is worked: by the time it is on again the range's objects must be
    gone, or its first young collection walks them all (what the pause was to spare)."""
    left: list[int] = []  # what each range left in the young generation as the collector comes back on
    paused_at = 0
    disable, enable = gc.disable, gc.enable

    def disabled() -> None:
        nonlocal paused_at
        paused_at = gc.get_count()[0]
        disable()

    def enabled() -> None:
        left.append(gc.get_count()[0] - paused_at)
        enable()

    runs: list[list[int]] = []
    with place_on(request, "zk") as place:
        cluster = build_demo_cluster(place.client, place.root, tmp_path, healthy=3000)  # one range
        with demo_agents(cluster, place.registry):
            # a first run opens what an executor keeps (its store's session, its channels) within its first range
            ScrutinyRun(only_coverage(place.uri), LocalEngine()).execute()
            monkeypatch.setattr(gc, "disable", disabled)
            monkeypatch.setattr(gc, "enable", enabled)
            for _ in range(2):  # a range's own objects outlive the pause in every run; what else a loaded
                left = []       # machine allocates meanwhile (another thread's, a reconnect's) in one at most
                report = ScrutinyRun(only_coverage(place.uri), LocalEngine()).execute()
                assert report.complete and report.ledgers["seen"] == cluster.ledgers
                runs.append(left)
    # (its objects outliving the pause, the range of 3,000 ledgers left 16,000 in each run)
    assert all(runs) and min(max(run) for run in runs) < 5_000, runs
