"""Continuous scrutiny, end to end on a real ZooKeeper: an auditor's leader follows a live DbLedgerStorage
bookie's agent (real RocksDB indexes and entry logs), agents on changing synthetic holdings, and the
store's persistent watch; each loss class is found by continuous mode alone (after the leader's first full
run, its baseline: ZooKeeper's watch cannot resume where the last leader stopped), normal
garbage collection and a re-replication that copies first are not findings, a feed gap schedules a full
run, and a new leader goes on from the cursors the last one kept."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.auditor import Auditor
from scrutiny.auditor.currentstate import Current
from scrutiny.auditor.cursors import CURSORS
from scrutiny.auditor.keptstate import CURRENT_STATE
from scrutiny.config import AuditorSettings, MetricsSettings, ScanSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.lostbookies import SIGHTINGS as LOST_BOOKIE_SIGHTINGS
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment
from scrutiny.runstats import Scan
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import MetadataStore, open_store
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter, cookie
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.holdings import MutableHoldings, share
from scrutiny.testing.localzk import LocalZooKeeper, free_port
from scrutiny.testing.processes import reap
from tests.support.helpers import wait_for

pytestmark = pytest.mark.slow
LIVE = "127.0.9.1:3181"  # the DbLedgerStorage bookie
B2, B3, B4 = (f"127.0.9.{n}:3181" for n in (2, 3, 4))
ENSEMBLE = (LIVE, B2, B3)
FOUND_WITHIN = 30  # seconds: generous for a loaded CI machine (the latency goal is bench.continuous's)


def md(lid: int, ensemble: tuple[str, ...] = ENSEMBLE) -> LedgerMetadata:
    return LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, 29, 3000, (Segment(0, ensemble),))


@dataclass
class Cluster:
    writer: ClusterWriter
    live: LiveBookie
    path: Path
    synthetic: dict[str, MutableHoldings]
    agents: dict[str, BookieAgent]
    scan: ScanSettings
    settings: AuditorSettings
    registry: MetadataStore

    def auditor(self) -> Auditor:
        return Auditor(self.scan, self.settings, metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb,
                       engine=LocalEngine()).start()


@pytest.fixture
def cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    """Ledgers 1-3 in the live bookie's entry log 1, 4-8 in its log 2 (both finished); every copy in place."""
    root = f"{zk_namespace}/ledgers"
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    w.write_ledgers([md(lid) for lid in range(1, 9)])
    path = tmp_path / "live"
    live = LiveBookie(path)
    for log_id, ledgers in ((1, range(1, 4)), (2, range(4, 9))):
        log = EntryLog(path, log_id)
        for lid in ledgers:
            live.write(lid, {int(e): entrylog.package_entry(lid, int(e), int(e) - 1, 0, b"p" * 32, "CRC32C")
                             for e in share(md(lid), LIVE)}, log)
        log.finish()
    live.flush()
    synthetic = {b: MutableHoldings() for b in (B2, B3, B4)}
    for lid in range(1, 9):
        for b in (B2, B3):
            synthetic[b].put(lid, share(md(lid), b))
    registry = store_on(zk_client, uri)
    agents = {LIVE: BookieAgent(DbLedgerStorageSource([path], tmp_path / "scratch"), bind="127.0.0.1:0",
                                watch_interval_seconds=0.2)}
    agents |= {b: BookieAgent(h, bind="127.0.0.1:0", watch_interval_seconds=0.2) for b, h in synthetic.items()}
    for b, a in agents.items():
        a.start()
        a.register(registry, b, f"127.0.0.1:{a.port}")
        w.register_bookie(BookieRegistration(b, False))
    token = tmp_path / "token"
    token.write_text("t")
    scan = ScanSettings(metadata_service_uri=uri, engine="local", placement_policy="none", recheck_delay=0.2,
                        write_cache_grace_seconds=0.5, orphan_check=False)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), token_file=str(token),
                               full_interval_seconds=0, underreplication_interval_seconds=0,
                               continuous_batch_seconds=0.3)
    try:
        yield Cluster(w, live, path, synthetic, agents, scan, settings, registry)
    finally:
        for a in agents.values():
            a.stop(grace=0)
        live.close()


def current(a: Auditor) -> dict[tuple[str, int], dict[str, object]]:
    return {(v["category"], v["ledger_id"]): v for v in a.current_state()["violations"]}


def full_run(a: Auditor) -> None:
    """A whole-cluster run on demand, waited for."""
    before = a.last.get("rescan")
    a.rescan(None, "")
    wait_for(lambda: a.last.get("rescan") is not before, 60)


def test_each_loss_is_found_by_continuous_mode_and_normal_gc_is_not(cluster: Cluster) -> None:
    a = cluster.auditor()
    try:
        wait_for(lambda: "full" in a.last, 60)  # a new leader's first full run: the current state's baseline
        baseline = a.last["full"]
        assert current(a) == {} and a.current.baseline_ms
        time.sleep(1)  # the agents' first looks have taken stock
        # an entry log removed while the index still points into it (apache/bookkeeper #4607)
        entrylog.log_path(cluster.path, 1).unlink()
        # a ledger gone from a bookie whose metadata still names it
        cluster.synthetic[B2].drop(4)
        # a re-replication that moved ledger 5 to a bookie that never got the entries
        cluster.writer.update_ledger(md(5, (LIVE, B2, B4)))
        # ... and one that copied first (ledger 6 to B4): no finding
        cluster.synthetic[B4].put(6, share(md(6, (LIVE, B2, B4)), B4))
        cluster.writer.update_ledger(md(6, (LIVE, B2, B4)))
        # normal garbage collection: the metadata goes first, then the bookies' copies
        cluster.writer.delete_ledger(7)
        time.sleep(0.5)
        cluster.synthetic[B2].drop(7)
        cluster.live.delete(7)
        cluster.live.flush()
        wanted = {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", lid) for lid in (1, 2, 3, 4, 5)}
        wait_for(lambda: set(current(a)) == wanted, FOUND_WITHIN)
        found = current(a)
        assert str(found["LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 1]["found_by"]).startswith("continuous: ENTRY_LOG_GONE")
        assert "LEDGERS_GONE" in str(found["LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 4]["found_by"])
        assert "metadata changed" in str(found["LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 5]["found_by"])
        assert all(v["detected_at"] for v in found.values())
        assert a.last["full"] is baseline and "rescan" not in a.last  # continuous mode alone
        port = a.http.port
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'scrutiny_violations{category="LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"} 5.0' in metrics
        assert "scrutiny_continuous_watching 1.0" in metrics
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        assert "Continuous scrutiny: watching every change since" in page and "ENTRY_LOG_GONE" in page
        # the safety net agrees: a full run finds the same, and nothing continuous mode missed
        full_run(a)
        assert set(current(a)) == wanted and a.current.missed == 0
        # repaired (the copy back): a later look clears it
        cluster.synthetic[B2].put(4, share(md(4), B2))
        cluster.writer.update_ledger(md(4))  # the repair's own metadata write (its new version)
        wait_for(lambda: ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 4) not in current(a), FOUND_WITHIN)
    finally:
        a.stop()


def test_a_bookie_back_empty_is_found_by_continuous_mode(cluster: Cluster) -> None:
    """The DbLedgerStorage bookie's disk replaced: back under its id with a new cookie and empty indexes."""
    a = cluster.auditor()
    try:
        wait_for(lambda: "full" in a.last, 60)
        baseline = a.last["full"]
        time.sleep(1)
        cluster.live.close()
        shutil.rmtree(cluster.path / "current")
        cluster.live = LiveBookie(cluster.path)
        cluster.live.flush()
        (cluster.path / "current" / "VERSION").write_bytes(cookie("127.0.9.1:3181", "new"))
        wanted = {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", lid) for lid in range(1, 9)}
        wait_for(lambda: set(current(a)) == wanted, FOUND_WITHIN)
        assert all(str(v["found_by"]).startswith("continuous:") for v in current(a).values())
        assert a.last["full"] is baseline and "rescan" not in a.last
    finally:
        a.stop()


def test_a_feed_gap_schedules_a_full_run_and_a_new_leader_goes_on_from_the_cursors(cluster: Cluster) -> None:
    a = cluster.auditor()
    try:
        wait_for(lambda: "full" in a.last, 60)
        first = a.last["full"]
        time.sleep(1)
        cluster.synthetic[B3].drop(8)
        wait_for(lambda: ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 8) in current(a), FOUND_WITHIN)
        wait_for(lambda: B3 in CURSORS.read(cluster.registry).agents, 10)
        # the agent of B3 restarts (at the same address): its feed is new, what changed meanwhile unknown
        port = cluster.agents[B3].port
        cluster.agents[B3].stop(grace=0)
        cluster.agents[B3] = BookieAgent(cluster.synthetic[B3], bind=f"127.0.0.1:{port}",
                                         watch_interval_seconds=0.2).start()
        cluster.agents[B3].register(cluster.registry, B3, f"127.0.0.1:{port}")
        wait_for(lambda: a.last["full"] is not first, 60)  # the gap's full run
        assert a.continuous is not None and a.continuous.stats["gaps.agent"] == 1
    finally:
        a.stop()
    # a new leader: the cursors it inherits are the last one's (B3's new feed); no gap when it goes on
    stored = CURSORS.read(cluster.registry)
    cursors, position = stored.agents, stored.metadata
    feed = cluster.agents[B3].servicer.watching.feed
    assert cursors[B3][0] == feed.feed_id and position == ""  # ZooKeeper: no resuming
    b = cluster.auditor()
    try:
        wait_for(lambda: "full" in b.last, 60)
        time.sleep(1)
        cluster.synthetic[B2].drop(3)
        wait_for(lambda: ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 3) in current(b), FOUND_WITHIN)
        assert b.continuous is not None and b.continuous.stats["gaps.agent"] == 0
    finally:
        b.stop()


def test_a_lost_bookie_is_looked_at_when_the_clusters_delay_has_passed(cluster: Cluster) -> None:
    """A bookie gone for good (its agent and its registration), nobody re-replicating: its ledgers are
    reported by continuous mode once the cluster's lostBookieRecoveryDelay (longer than the setting) and the
    grace have passed since the watch saw the registration go, not before, and not only at the next run."""
    delay, grace = 3, 1
    cluster.scan = dataclasses.replace(cluster.scan, lost_bookie_recovery_delay=0, lost_bookie_grace_period=grace)
    cluster.writer.set_lost_bookie_recovery_delay(delay)
    a = cluster.auditor()
    try:
        wait_for(lambda: "full" in a.last, 60)
        baseline = a.last["full"]
        time.sleep(1)
        cluster.agents[B3].stop(grace=0)
        cluster.writer.unregister_bookie(B3)
        gone = time.monotonic()
        lost = {("LOST_BOOKIE_RECOVERY_NOT_STARTED", lid) for lid in range(1, 9)}
        wait_for(lambda: lost <= set(current(a)), FOUND_WITHIN)
        assert time.monotonic() - gone >= delay + grace
        found = current(a)["LOST_BOOKIE_RECOVERY_NOT_STARTED", 1]
        assert B3 in str(found["found_by"]) and str(found["found_by"]).startswith("continuous:")
        assert a.last["full"] is baseline and "rescan" not in a.last  # continuous mode alone
    finally:
        a.stop()


def test_a_bookie_back_and_gone_again_is_judged_from_its_last_departure(cluster: Cluster) -> None:
    """A bookie's registration gone long enough ago to be sighted, back, and gone again (a restart, then lost for
    good): continuous mode saw it come back, so no look judges its ledgers by the first sighting; they are found
    once the delay and the grace have passed since it went the second time (the churn soak's early alarm)."""
    delay, grace = 3, 1
    cluster.scan = dataclasses.replace(cluster.scan, lost_bookie_recovery_delay=0, lost_bookie_grace_period=grace)
    cluster.writer.set_lost_bookie_recovery_delay(delay)
    a = cluster.auditor()
    try:
        wait_for(lambda: "full" in a.last, 60)
        cluster.writer.unregister_bookie(B3)  # its agent goes on: a session expired, say
        wait_for(lambda: B3 in LOST_BOOKIE_SIGHTINGS.read(cluster.registry), 30)
        time.sleep(delay + grace + 1)  # past due, counted from then
        cluster.writer.register_bookie(BookieRegistration(B3, False))

        def lost_found() -> set[tuple[str, int]]:
            return {k for k in current(a) if k[0] == "LOST_BOOKIE_RECOVERY_NOT_STARTED"}

        wait_for(lambda: not lost_found() and B3 not in LOST_BOOKIE_SIGHTINGS.read(cluster.registry), 30)
        cluster.writer.unregister_bookie(B3)  # gone again, for good
        gone = time.monotonic()
        cluster.synthetic[B2].drop(4)  # a look at ledger 4 now: B3 is not due yet
        wait_for(lambda: ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 4) in current(a)
                 or ("LOST_BOOKIE_RECOVERY_NOT_STARTED", 4) in current(a), FOUND_WITHIN)
        early = lost_found()
        assert early == set() or time.monotonic() - gone >= delay + grace, early
        lost = {("LOST_BOOKIE_RECOVERY_NOT_STARTED", lid) for lid in range(1, 9)}
        wait_for(lambda: lost <= set(current(a)), FOUND_WITHIN)
        assert time.monotonic() - gone >= delay + grace
    finally:
        a.stop()


def test_a_new_leader_judges_a_bookie_by_the_sightings_in_the_store_not_by_a_last_leaders(cluster: Cluster) -> None:
    """The sightings a leader keeps with its facts are the store's: a bookie sighted by one leader, back while no
    auditor ran (a run dropped its sighting) and gone again, is judged by the next leader from what the store
    says, as a fresh process would: not before the delay and the grace have passed since it went again (what the
    last leader found is shown until the new one's looks clear it). Once due, continuous mode finds its ledgers
    though its watch never saw it go: the election's full run sighted it (no periodic full run here)."""
    delay, grace = 15, 1  # long enough for a loaded machine's election and first look
    cluster.scan = dataclasses.replace(cluster.scan, lost_bookie_recovery_delay=0, lost_bookie_grace_period=grace)
    cluster.writer.set_lost_bookie_recovery_delay(delay)
    a = cluster.auditor()
    try:
        wait_for(lambda: "full" in a.last, 60)
        cluster.writer.unregister_bookie(B3)
        wait_for(lambda: B3 in LOST_BOOKIE_SIGHTINGS.read(cluster.registry), 30)
        lost = {("LOST_BOOKIE_RECOVERY_NOT_STARTED", lid) for lid in range(1, 9)}
        wait_for(lambda: lost <= set(current(a)), delay + grace + FOUND_WITHIN)  # past due, from that sighting
    finally:
        a.stop()
    cluster.writer.register_bookie(BookieRegistration(B3, False))  # back while no auditor runs ...
    LOST_BOOKIE_SIGHTINGS.write(cluster.registry, {})  # ... as a run that saw it registered records
    cluster.writer.unregister_bookie(B3)  # gone again, for good
    gone = time.monotonic()
    b = cluster.auditor()
    try:
        wait_for(lambda: not lost & set(current(b)), FOUND_WITHIN)  # the last leader's, looked at again: not due
        assert time.monotonic() - gone < delay + grace, "cleared too late to tell"
        while time.monotonic() - gone < delay + grace:  # never judged by the first leader's sighting
            assert not lost & set(current(b))
            time.sleep(0.5)
        wait_for(lambda: lost <= set(current(b)), FOUND_WITHIN)
    finally:
        b.stop()


def test_a_departure_a_last_leader_recorded_is_looked_at_when_due_by_the_next(cluster: Cluster) -> None:
    """A bookie a last leader recorded gone (its sighting in the store), the leader gone before the bookie was due
    (a failover in a bookie's outage): the next leader's watch never saw it go, and its election's full run finds
    it not yet due; continuous mode takes the departure from the store and finds its ledgers once due, not before
    (no periodic full run here)."""
    delay, grace = 15, 1  # long enough for a loaded machine's election and its full run
    cluster.scan = dataclasses.replace(cluster.scan, lost_bookie_recovery_delay=0, lost_bookie_grace_period=grace)
    cluster.writer.set_lost_bookie_recovery_delay(delay)
    cluster.writer.unregister_bookie(B3)
    gone = time.monotonic()
    LOST_BOOKIE_SIGHTINGS.write(cluster.registry, {B3: int(time.time() * 1000)})  # as the last leader recorded
    a = cluster.auditor()
    try:
        lost = {("LOST_BOOKIE_RECOVERY_NOT_STARTED", lid) for lid in range(1, 9)}
        wait_for(lambda: lost <= set(current(a)), delay + grace + FOUND_WITHIN)
        assert time.monotonic() - gone >= delay + grace
        election = a.last["full"].report
        assert election is not None and Scan.of(election.stats).lost_bookie_ledgers_not_yet_due == 8
        assert str(current(a)["LOST_BOOKIE_RECOVERY_NOT_STARTED", 1]["found_by"]).startswith("continuous:")
    finally:
        a.stop()


def test_a_process_elected_again_takes_no_departure_from_its_last_leadership(cluster: Cluster) -> None:
    """What continuous mode's watch saw go is one leadership's: the same process elected again, after the bookie
    came back and went again while another leader ran, never writes the first departure into the sightings (it
    would judge the bookie early), and follows the departure the store records."""
    from scrutiny.auditor.continuous import Continuous
    from scrutiny.auditor.currentstate import CurrentState

    cluster.writer.set_lost_bookie_recovery_delay(600)  # no look at the bookie's ledgers within the test
    c = Continuous(cluster.scan, cluster.settings, CurrentState(), lambda _: None)
    store = open_store(cluster.scan)  # the leader's own session, which its watch needs
    c.start(store)
    try:
        cluster.writer.unregister_bookie(B3)
        wait_for(lambda: c.pending() == 1, 30)  # its look, due after the delay
    finally:
        c.stop()
    cluster.writer.register_bookie(BookieRegistration(B3, False))  # back while another leader ran ...
    cluster.writer.unregister_bookie(B3)  # ... and gone again, as that leader recorded:
    again = int(time.time() * 1000)
    LOST_BOOKIE_SIGHTINGS.write(cluster.registry, {B3: again})
    c.start(store, [1])  # elected again: a look at ledger 1 at once (it records what the watch saw)
    try:
        wait_for(lambda: c.stats["batches"] >= 1, FOUND_WITHIN)
        assert LOST_BOOKIE_SIGHTINGS.read(cluster.registry) == {B3: again}
    finally:
        c.stop()
        store.close()


def kept_findings(store: MetadataStore) -> tuple[Current, ...]:
    kept = CURRENT_STATE.read(store)
    return kept.found if kept is not None else ()


def test_a_leader_killed_mid_stream_hands_its_cursors_on(cluster: Cluster, tmp_path: Path) -> None:
    """A `scrutiny auditor` process leading, killed (SIGKILL: no stop, no last word) while its feeds
    stream; what the agents saw while no one led reaches the next leader through the cursors the first
    kept in the store: its feeds resume without a gap, and that change is what they bring first. What the
    killed leader had found stands at the new one's election, from the current state it kept."""
    s = cluster.scan
    port = free_port()
    config = tmp_path / "auditor.yaml"
    config.write_text(yaml.safe_dump({
        "metadata_service_uri": s.metadata_service_uri, "engine": "local", "placement_policy": "none",
        "recheck_delay": s.recheck_delay, "write_cache_grace_seconds": s.write_cache_grace_seconds,
        "orphan_check": False, "zk_session_timeout": 4,
        "auditor": {"listen": "127.0.0.1:0", "reports_dir": str(tmp_path / "reports-a"),
                    "token_file": cluster.settings.token_file, "full_interval_seconds": 0,
                    "underreplication_interval_seconds": 0, "continuous_batch_seconds": 0.3},
        "metrics": {"listen": f"127.0.0.1:{port}"}}))
    first = subprocess.Popen([sys.executable, "-m", "scrutiny.cli", "auditor", "--config", str(config)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().startswith("auditor RPC")

        def current_of_first() -> set[tuple[str, int]]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/current", timeout=10) as r:
                return {(v["category"], v["ledger_id"]) for v in json.load(r)["violations"]}

        def status_of_first() -> dict[str, Any]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status", timeout=10) as r:
                return dict(json.load(r))

        wait_for(lambda: any(r["kind"] == "full" for r in status_of_first()["last_runs"]), 60)
        time.sleep(1)
        cluster.synthetic[B2].drop(4)
        wait_for(lambda: ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 4) in current_of_first(), FOUND_WITHIN)
        wait_for(lambda: B2 in CURSORS.read(cluster.registry).agents, 10)
        wait_for(lambda: any(c.violation.ledger_id == 4 for c in kept_findings(cluster.registry)), 10)
        first.kill()  # mid-stream: every feed open
        first.wait(timeout=10)
    finally:
        reap(first)
    kept = CURSORS.read(cluster.registry).agents
    feed = cluster.agents[B2].servicer.watching.feed
    assert kept[B2] == (feed.feed_id, feed.last)
    cluster.synthetic[B2].drop(6)  # while nobody leads
    wait_for(lambda: feed.last > kept[B2][1], 10)
    cluster.scan = dataclasses.replace(s, zk_session_timeout=4)
    second = cluster.auditor()  # leads once the killed one's session has expired
    try:
        wait_for(lambda: second.leading.is_set(), 30)
        elected_ms = time.time() * 1000
        # what only continuous mode had found stands at once: kept by the killed leader, not found anew by the
        # new one's takeover full run (which would say "rescan", found at its end)
        found = {(str(c.violation.category), c.violation.ledger_id): c for c in second.current.findings()}
        mine = found[("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 4)]
        assert mine.found_by.startswith("continuous") and mine.detected_ms < elected_ms, mine
        assert second.continuous is not None
        wait_for(lambda: ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 6) in current(second), FOUND_WITHIN)
        time.sleep(1)
        # resumed where the killed leader's cursors said: no gap, and only the change made after them (a
        # reader without them would have been given every change kept, ledger 4's too)
        assert second.continuous.stats["gaps.agent"] == 0 and second.continuous.stats["agent_changes"] == 1
    finally:
        second.stop()


def test_continuous_mode_can_be_off(cluster: Cluster) -> None:
    cluster.settings = dataclasses.replace(cluster.settings, continuous=False)
    a = cluster.auditor()
    try:
        wait_for(a.leading.is_set, 30)
        assert a.continuous is None and a.current_state()["continuous"] is False
    finally:
        a.stop()


def test_a_mass_event_is_a_full_run_not_a_storm() -> None:
    """More ledgers at once than continuous_max_ledgers_per_second allows (a rack lost): one full run."""
    from scrutiny.auditor.continuous import Continuous
    from scrutiny.auditor.currentstate import CurrentState

    asked: list[str] = []
    c = Continuous(ScanSettings(metadata_service_uri="zk://127.0.0.1:1/ledgers"),
                   AuditorSettings(continuous_batch_seconds=2, continuous_max_ledgers_per_second=100),
                   CurrentState(), asked.append)
    c._look(list(range(201)), "a rack lost")  # 201 > 100/s * 2 s
    assert c.pending() == 201
    c.batch()
    assert c.stats["degraded"] == 1 and len(asked) == 1 and "201 ledgers changed at once" in asked[0]
    assert c.pending() == 0  # the full run looks at them all


def test_a_look_at_every_ledger_of_a_bookie_never_holds_up_the_looks_at_a_few_ledgers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bookie back empty is a pass over the whole metadata (minutes at a million ledgers): the ledgers the
    feeds name meanwhile are looked at in their own lane, and the bookies due together share one pass."""
    import threading

    from scrutiny.auditor.backlog import BOOKIES, LEDGERS
    from scrutiny.auditor.continuous import Continuous
    from scrutiny.auditor.currentstate import CurrentState

    c = Continuous(ScanSettings(metadata_service_uri="zk://127.0.0.1:1/ledgers"),
                   AuditorSettings(continuous_batch_seconds=0.1), CurrentState(), lambda _: None)
    passing, release, looked = threading.Event(), threading.Event(), threading.Event()
    passes: list[list[str]] = []

    def bookies_pass(due: dict[str, Any]) -> None:
        passes.append(sorted(due))
        passing.set()
        release.wait(30)

    monkeypatch.setattr(c, "_look_at_bookies", bookies_pass)
    monkeypatch.setattr(c, "_look_at_ledgers", lambda due: looked.set())
    workers = [threading.Thread(target=c._work, args=(lane,), daemon=True) for lane in (LEDGERS, BOOKIES)]
    for w in workers:
        w.start()
    try:
        c._look_at_bookie("b1:3181", "BOOKIE_RESET on b1:3181")
        assert passing.wait(10)
        c._look_at_bookie("b2:3181", "BOOKIE_RESET on b2:3181")
        c._look_at_bookie("b3:3181", "BOOKIE_RESET on b3:3181")
        c._look([7], "LEDGERS_GONE on b4:3181")
        assert looked.wait(5), "the look at ledger 7 waited for the bookie's pass"
        wait_for(lambda: c.pending() == 3, 5)  # b1 being looked at, b2 and b3 waiting
        release.set()
        wait_for(lambda: c.pending() == 0, 10)
        assert passes == [["b1:3181"], ["b2:3181", "b3:3181"]]
    finally:
        release.set()
        c.stop()
        for w in workers:
            w.join(5)


def scraped(a: Auditor) -> dict[str, float]:
    """The auditor's /metrics as Prometheus reads them: `name{labels}` (labels sorted, JSON) -> value."""
    port = a.http.port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {s.name + (json.dumps(s.labels, sort_keys=True) if s.labels else ""): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_looks_read_the_bookies_facts_once_and_again_when_the_watch_says_they_changed(cluster: Cluster) -> None:
    """A look at a few ledgers starts on the facts the last one read (the registrations, lostBookieRecoveryDelay,
    whether re-replication is disabled and the lost bookies' sightings) until the store's watch says they
    changed, or may have: a gap, or a new leadership (on a loaded machine the leader may lose its session
    mid-test; it then reads them once more, and this is what /metrics shows)."""
    cluster.writer.unregister_bookie("127.0.9.9:3181")
    cluster.writer.set_replication_disabled(False)
    a = cluster.auditor()
    try:
        wait_for(lambda: "full" in a.last and scraped(a).get(
            'scrutiny_continuous_feeds{"kind": "metadata", "state": "up"}') == 1, 60)

        def reads(m: dict[str, float], part: str) -> float:
            return m.get(f'scrutiny_continuous_fact_reads_total{{"part": "{part}"}}', 0)

        def renewals(m: dict[str, float]) -> float:
            """What starts the facts anew: a new leadership, a gap in the store's watch."""
            return m["scrutiny_leaderships_total"] + m['scrutiny_continuous_feed_gaps_total{"kind": "metadata"}']

        def look() -> dict[str, float]:
            """A look at ledger 8 (a new version of its metadata), waited for; /metrics after it."""
            before = scraped(a)["scrutiny_continuous_ledgers_checked_total"]
            cluster.writer.update_ledger(md(8))
            wait_for(lambda: scraped(a)["scrutiny_continuous_ledgers_checked_total"] > before, FOUND_WITHIN)
            return scraped(a)

        first = look()
        assert reads(first, "registrations") >= 1 and reads(first, "replication") >= 1
        for _ in range(3):
            later = look()
        for part in ("registrations", "replication"):  # (where the agents listen is read at every listing too)
            assert reads(later, part) - reads(first, part) <= renewals(later) - renewals(first), (part, later)
        # the lost bookies' sightings: with the agents' addresses at each listing, and when the leader records them
        assert (reads(later, "sightings") - reads(first, "sightings")
                <= reads(later, "agents") - reads(first, "agents") + renewals(later) - renewals(first)), later
        cluster.writer.register_bookie(BookieRegistration("127.0.9.9:3181", False))
        cluster.writer.set_replication_disabled(True)
        changed = later
        for _ in range(10):  # the looks after the watch reported the changes read the facts again
            changed = look()
            if all(reads(changed, part) > reads(later, part) for part in ("registrations", "replication")):
                break
        assert all(reads(changed, part) > reads(later, part)
                   for part in ("registrations", "replication", "sightings")), changed
        cluster.writer.set_replication_disabled(False)
        for _ in range(10):
            again = look()
            if reads(again, "replication") > reads(changed, "replication"):
                break
        assert reads(again, "replication") > reads(changed, "replication"), again
        assert reads(again, "registrations") - reads(changed, "registrations") <= renewals(again) - renewals(changed)
        assert current(a) == {}
    finally:
        a.stop()
