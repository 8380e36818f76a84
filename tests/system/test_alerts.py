"""Every alert the shipped rules define, active in a real Prometheus that loads
deploy/prometheus/scrutiny-rules.yml as shipped and scrapes a real auditor through the situation the alert is
for: the demo's faults, a slow agent, a lost bookie, the hand-off's mark unmarked without repair, a loss
continuous scrutiny could not see, a deep pass behind, no complete run for days, no leader. Active means
firing, or pending for the `for` of its rule: the expression holds on what was scraped."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kazoo.client import KazooClient

from scrutiny.auditor import DEEP, Auditor
from scrutiny.auditor.deeprecord import DEEP_PASS
from scrutiny.auditor.lastrun import last_run
from scrutiny.auditor.leadership import cadence
from scrutiny.auditor.runqueue import Ticket
from scrutiny.config import AuditorSettings, MetricsSettings, ScanSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.deeppass import DeepPass
from scrutiny.lostbookies import SIGHTINGS as LOST_BOOKIE_SIGHTINGS
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at, store_on
from scrutiny.testing.demo import build_demo_cluster, demo_agents
from scrutiny.testing.holdings import share
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.replicationworker import ReplicationWorker
from tests.support.helpers import wait_for
from tests.support.prometheus import RULES, Prometheus
from tests.system.test_console import B1, B2, B3, B4, B5, Console, md, start_cluster

pytestmark = pytest.mark.slow
DAY_MS = 86400 * 1000

# Where each shipped alert meets its situation.
DEMO = {"ScrutinyDataAtRisk", "ScrutinyUnderReplicatedTooLong", "ScrutinyBookiesUnavailable",
        "ScrutinyCorruptCopies", "ScrutinyCorruptMessages", "ScrutinyTopicMessagesLost",
        "ScrutinyWeakDurabilityPolicy", "ScrutinyEntriesPastTheClose", "ScrutinyOrphanLedgers",
        "ScrutinyLostBookieNotRecovered", "ScrutinyTopicDataLost", "ScrutinyTopicRecordInconsistent",
        "ScrutinyLeakedLedgers"}
CLUSTER = {"ScrutinyBookieAgentSlow", "ScrutinyLostBookieDataAtRisk", "ScrutinyUnmarkedWithoutRepair",
           "ScrutinyContinuousMissed", "ScrutinyDeepScrubDebt"}
STALE = {"ScrutinyNoCompleteRun", "ScrutinyNoLeader"}


def test_every_shipped_alert_has_its_situation_here() -> None:
    shipped = set(re.findall(r"- alert: (\w+)", (RULES / "scrutiny-rules.yml").read_text()))
    assert shipped == DEMO | CLUSTER | STALE


def wait_active(prom: Prometheus, alerts: set[str], timeout: float = 60) -> None:
    wait_for(lambda: alerts <= prom.active(), timeout, lambda: f"for {sorted(alerts - prom.active())} "
             f"(active: {sorted(prom.active())})")


def test_the_demos_faults_each_raise_their_alert(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                 zk_namespace: str, tmp_path: Path) -> None:
    """The demo's cluster (a fault of each kind, DbLedgerStorage bookies for the deep scrub, Pulsar's records):
    a full run and a deep run of a real auditor, and every alert about a finding of theirs is active; before
    them, none is."""
    root = f"{zk_namespace}/ledgers"
    demo = build_demo_cluster(zk_client, root, tmp_path / "stores", healthy=60)
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    scan = ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.3, underreplicated_grace_period=3600)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"),
                               underreplication_interval_seconds=0, insecure_open_rescan=True)
    with demo_agents(demo, store_on(zk_client, uri)):
        auditor = Auditor(scan, settings, metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb,
                          engine=LocalEngine())
        auditor.start()
        prom = None
        try:
            assert auditor.http is not None
            prom = Prometheus(tmp_path, {"auditor": auditor.http.port})
            wait_for(lambda: "full" in auditor.last and auditor.last["full"].report is not None, 60)
            deep, _ = auditor.queue.submit(Ticket(DEEP))
            assert deep.done.wait(120)
            wait_active(prom, DEMO)
            assert not (prom.active() & (CLUSTER | STALE)), prom.active()
        finally:
            if prom is not None:
                prom.close()
            auditor.stop()


@pytest.fixture
def lagging(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> Iterator[Console]:
    """Ledgers 1-6 on B1-B3; ledger 10 on B5, whose agent is slow; ledger 20 on B4 and B1, B4 gone two days ago
    and never re-replicated; a deep pass of two slices both last verified fifteen days ago."""
    root = f"{zk_namespace}/ledgers"
    store = store_on(zk_client, f"zk+hierarchical://{zk_server.hosts}{root}")
    now = int(time.time() * 1000)
    zk_client.ensure_path(f"{root}/cookies/{B4}")
    LOST_BOOKIE_SIGHTINGS.write(store, {B4: now - 2 * DAY_MS})
    DEEP_PASS.write(store, DeepPass(2, 0, (now - 15 * DAY_MS,) * 2, now - 30 * DAY_MS))
    ledgers = [*(md(lid) for lid in range(1, 7)), md(10, (B1, B2, B5)),
               dataclasses.replace(md(20, (B4, B1)), ensemble_size=2)]
    c = start_cluster(zk_server, zk_client, zk_namespace, tmp_path, ledgers, (B1, B2, B3, B5), (B1, B2, B3, B5),
                      slow=(B5,), auditor_extra={"deep_interval_seconds": 3.5 * 86400, "deep_pass_days": 7},
                      # re-checked within 1.5 s: B5 takes 3 (at 3 s, a loaded machine could see it answer in time)
                      scan_extra={"bookie_deadline_seconds": 0.5})
    try:
        yield c
    finally:
        c.stop()


def test_a_slow_agent_a_lost_bookie_and_a_deep_pass_behind_raise_their_alerts(lagging: Console,
                                                                                tmp_path: Path) -> None:
    """At the first full run: B5's agent answers its health check, never a call in time; B4 is gone with its
    copies of ledger 20, below its ack quorum, and nobody re-replicates them; the deep run at election verified
    one slice of two: the other was verified fifteen days ago."""
    prom = Prometheus(tmp_path, {"auditor": lagging.auditor.http.port})  # type: ignore[union-attr]
    try:
        wait_active(prom, {"ScrutinyBookieAgentSlow", "ScrutinyLostBookieDataAtRisk", "ScrutinyDeepScrubDebt"})
    finally:
        prom.close()


@pytest.fixture
def handing_off(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
                tmp_path: Path) -> Iterator[Console]:
    """Ledgers 1-6 on B1-B3, the hand-off on, judging as if the cluster's checker read every entry."""
    c = start_cluster(zk_server, zk_client, zk_namespace, tmp_path, [md(lid) for lid in range(1, 7)],
                      (B1, B2, B3), (B1, B2, B3), scan_extra={"auditor_ledger_verification_percentage": 100},
                      auditor_extra={"repair": "mark", "repair_interval_seconds": 0.3})
    try:
        yield c
    finally:
        c.stop()


def test_an_unrepaired_mark_and_a_loss_no_feed_saw_raise_their_alerts(handing_off: Console, zk_client: KazooClient,
                                                                       tmp_path: Path) -> None:
    c = handing_off
    prom = Prometheus(tmp_path, {"auditor": c.auditor.http.port})  # type: ignore[union-attr]
    try:
        wait_for(lambda: prom.value('scrutiny_violations{category="UNMARKED_WITHOUT_REPAIR"}') == 0, 30)
        assert not prom.active() & (DEMO | CLUSTER), prom.active()
        # the hand-off marks a loss mid-share of ledger 4; the cluster's replication worker checks at 0,
        # BookKeeper's default, and unmarks it without repair
        c.holdings[B1].drop(4)
        c.holdings[B1].put(4, np.setdiff1d(share(md(4), B1), [3]))
        c.full_run()
        with store_at(c.auditor.config.scan.metadata_service_uri) as store:
            wait_for(lambda: 4 in store.marked([4]), 30)
        ReplicationWorker(zk_client, c.writer.root, c.holdings, percentage=0).run_once()
        wait_active(prom, {"ScrutinyUnmarkedWithoutRepair"})
        # entries gone from a ledger B2 still lists: no feed tells continuous scrutiny; the next full run finds it
        c.full_run()  # the current state rests on a full run made while continuous scrutiny watched
        c.holdings[B2].lose(5, share(md(5), B2)[:2])
        c.full_run()
        wait_active(prom, {"ScrutinyContinuousMissed"})
    finally:
        prom.close()


def test_no_complete_run_for_days_then_no_leader(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                 zk_namespace: str, tmp_path: Path) -> None:
    """The last complete full run, as the last leader recorded it, finished three days ago, and re-replication
    is disabled since (runs are skipped): the new leader exports its true age. Then no auditor leads."""
    root = f"{zk_namespace}/ledgers"
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    store = store_on(zk_client, uri)
    c = start_cluster(zk_server, zk_client, zk_namespace, tmp_path, [md(1)], (B1, B2, B3), (B1, B2, B3))
    c.auditor.stop()
    three_days_ago = int(time.time() * 1000) - 3 * DAY_MS
    last = last_run("full").read(store)
    assert last is not None
    last_run("full").write(store, dataclasses.replace(last, finished_ms=three_days_ago))
    cadence("full").write(store, three_days_ago)
    c.writer.set_replication_disabled(True)
    auditor = Auditor(c.auditor.config.scan, c.auditor.config.auditor, metrics=MetricsSettings(listen="127.0.0.1:0"),
                      web=AuditorWeb, engine=LocalEngine()).start()
    prom = None
    try:
        assert auditor.http is not None
        prom = Prometheus(tmp_path, {"auditor": auditor.http.port})
        wait_active(prom, {"ScrutinyNoCompleteRun"})
        assert "ScrutinyNoLeader" not in prom.active()
        auditor.stop()
        wait_active(prom, {"ScrutinyNoLeader"})
    finally:
        if prom is not None:
            prom.close()
        auditor.stop()
        for agent in c.agents.values():
            agent.stop(grace=0)
