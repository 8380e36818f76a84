"""Faults injected for real against real processes on loopback: scrutiny keeps working and reports
only the truth."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from kazoo.client import KazooClient

from scrutiny.agent import BookieAgent
from scrutiny.auditor import Auditor, AuditorSettings
from scrutiny.checks import expected_share
from scrutiny.config import ScanSettings
from scrutiny.entrysources import SyntheticStore
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.metadata import (
    BookieRegistration,
    LedgerMetadata,
    LedgerState,
    Segment,
    encode_ledger_metadata,
    parse_metadata_service_uri,
)
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine, Progress
from scrutiny.scan.result import RangeResult
from scrutiny.scan.work import EXECUTOR
from scrutiny.store import LedgerRange
from scrutiny.testing import processes, store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.demo import DemoCluster, bookie, build_demo_cluster, demo_agents
from scrutiny.testing.localzk import LocalZooKeeper, expire_session
from scrutiny.testing.processes import reap
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc
from tests.support.helpers import auditor_process, slow_agent


def found(report: object) -> set[tuple[str, int]]:
    return {(str(v.category), v.ledger_id) for v in report.violations}  # type: ignore[attr-defined]


class FaultAfterFirstRange(LocalEngine):
    def __init__(self, fault: Callable[[RunContext], None]) -> None:
        self.fault: Callable[[RunContext], None] | None = fault

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Progress | None = None) -> Iterator[RangeResult]:
        for i, result in enumerate(super().map_ranges(ctx, ranges, mode, progress)):
            yield result
            if i == 0 and self.fault is not None:
                fault, self.fault = self.fault, None
                fault(ctx)


@pytest.fixture
def demo(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
         tmp_path: Path) -> Iterator[tuple[DemoCluster, ScanSettings]]:
    cluster = build_demo_cluster(zk_client, f"{zk_namespace}/ledgers", tmp_path, healthy=200)
    uri = f"zk+hierarchical://{zk_server.hosts}{zk_namespace}/ledgers"
    settings = ScanSettings(metadata_service_uri=uri, recheck_delay=0.3, underreplicated_grace_period=3600,
                            bookie_deadline_seconds=5, zk_session_timeout=4, zk_retry_deadline=20)
    with demo_agents(cluster, store_on(zk_client, uri)):
        yield cluster, settings


def test_session_expiry_mid_run_gives_the_same_findings(demo: tuple[DemoCluster, ScanSettings],
                                                        zk_server: LocalZooKeeper) -> None:
    cluster, settings = demo

    def expire(ctx: RunContext) -> None:
        store, _ = EXECUTOR.get(ctx)
        expire_session(zk_server.hosts, *store.client.client_id)

    report = ScrutinyRun(settings, FaultAfterFirstRange(expire)).execute()
    assert report.complete and found(report) == cluster.expected


def test_connection_loss_mid_run_gives_the_same_findings(demo: tuple[DemoCluster, ScanSettings],
                                                         zk_server: LocalZooKeeper) -> None:
    cluster, settings = demo
    report = ScrutinyRun(settings, FaultAfterFirstRange(lambda ctx: zk_server.restart())).execute()
    assert report.complete and found(report) == cluster.expected


def test_zookeeper_down_during_a_run_is_an_incomplete_report(demo: tuple[DemoCluster, ScanSettings],
                                                            zk_server: LocalZooKeeper) -> None:
    cluster, settings = demo
    quick = ScanSettings(**{**settings.__dict__, "zk_retry_deadline": 2.0})
    try:
        t0 = time.monotonic()
        report = ScrutinyRun(quick, FaultAfterFirstRange(lambda ctx: zk_server.stop())).execute()
        assert time.monotonic() - t0 < 30
    finally:
        zk_server.start()
    assert not report.complete and report.exit_status() == 2 and report.errors
    assert found(report) <= cluster.expected  # what it did see is still true


def test_auditor_backs_off_while_zookeeper_is_down_at_start(tmp_path: Path) -> None:
    zk = LocalZooKeeper(workdir=tmp_path / "zk")  # not started yet
    scan = ScanSettings(metadata_service_uri=f"zk+hierarchical://{zk.hosts}/ledgers", engine="local",
                        zk_connect_timeout=1.0, zk_session_timeout=4)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "r"), full_interval_seconds=0,
                               underreplication_interval_seconds=0, insecure_open_rescan=True)
    auditor = Auditor(scan, settings, engine=LocalEngine()).start()
    try:
        time.sleep(3)
        assert not auditor.leading.is_set() and not auditor.stopping.is_set()  # waiting, not crashed
        zk.start()
        deadline = time.monotonic() + 40
        while not auditor.leading.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert auditor.leading.is_set()
    finally:
        auditor.stop()
        zk.close()


def _one_bookie_cluster(zk_client: KazooClient, root: str, tmp_path: Path, ledgers: int,
                        last: int = 99) -> tuple[list[LedgerMetadata], Path]:
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    mds = [LedgerMetadata(i, LedgerState.CLOSED, 1, 1, 1, last, 0, (Segment(0, (bookie(1),)),))
           for i in range(1, ledgers + 1)]
    w.write_ledgers(mds)
    w.register_bookie(BookieRegistration(bookie(1), False))
    store = SyntheticStoreWriter()
    for md in mds:
        store.add(bookie(1), md.ledger_id, expected_share(md, bookie(1)))
    return mds, store.write_all(tmp_path)[bookie(1)]


def test_hung_agent_costs_its_deadlines_then_bookie_unavailable(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                               zk_namespace: str, tmp_path: Path) -> None:
    root = f"{zk_namespace}/ledgers"
    _, store = _one_bookie_cluster(zk_client, root, tmp_path, 5)
    proc, port = slow_agent(store, 60)  # accepts, never answers in time
    try:
        settings = ScanSettings(metadata_service_uri=f"zk+hierarchical://{zk_server.hosts}{root}", engine="local",
                                placement_policy="none", min_write_quorum=1, min_ack_quorum=1,
                                recheck_delay=0.2, bookie_deadline_seconds=1.0,
                                bookie_endpoints={bookie(1): f"127.0.0.1:{port}"})
        t0 = time.monotonic()
        report = ScrutinyRun(settings, LocalEngine()).execute()
        elapsed = time.monotonic() - t0
    finally:
        reap(proc)
    assert found(report) == {("BOOKIE_UNAVAILABLE", i) for i in range(1, 6)}
    assert elapsed < 10  # two deadlines (first look 1 s, re-check 3 s) and the delay, not 5 x 60 s
    # up but overloaded: it answers its health check, so the finding says slow, not down
    details = next(v for v in report.violations if v.ledger_id == 1).details
    assert details["silence"] == {bookie(1): "slow"} and "health check" in details["reasons"][bookie(1)]


def test_an_agent_slower_than_the_first_deadline_gets_a_longer_one_at_the_delayed_look(
        zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> None:
    root = f"{zk_namespace}/ledgers"
    _, store = _one_bookie_cluster(zk_client, root, tmp_path, 5)
    proc, port = slow_agent(store, 0.4)  # 2 s for the five ledgers: past the first deadline, within the second
    try:
        settings = ScanSettings(metadata_service_uri=f"zk+hierarchical://{zk_server.hosts}{root}", engine="local",
                                placement_policy="none", min_write_quorum=1, min_ack_quorum=1,
                                recheck_delay=0.2, bookie_deadline_seconds=1.0,
                                bookie_recheck_deadline_seconds=6.0, bookie_endpoints={bookie(1): f"127.0.0.1:{port}"})
        report = ScrutinyRun(settings, LocalEngine()).execute()
    finally:
        reap(proc)
    assert report.complete and found(report) == set()  # slow is not down: it answered the delayed look
    assert report.stats["potentially_faulty"] == 5 and report.stats["bookie_calls_failed"] >= 1


def test_huge_answers_are_invalid_and_memory_is_bounded(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                        zk_namespace: str, tmp_path: Path) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    big = LedgerMetadata(1, LedgerState.CLOSED, 1, 1, 1, 999_999, 0, (Segment(0, (bookie(1),)),))
    small = LedgerMetadata(2, LedgerState.CLOSED, 1, 1, 1, 99, 0, (Segment(0, (bookie(1),)),))
    w.write_ledgers([big, small])
    store = SyntheticStoreWriter()
    rng = np.random.default_rng(1)
    store.add_entries(bookie(1), 1, np.flatnonzero(rng.random(1_000_000) < 0.5))  # ~250k groups, ~6 MB answer
    store.add(bookie(1), 2, expected_share(small, bookie(1)))
    agent = BookieAgent(SyntheticStore(store.write_all(tmp_path)[bookie(1)]), bind="127.0.0.1:0").start()
    try:
        settings = ScanSettings(metadata_service_uri=f"zk+hierarchical://{zk_server.hosts}{root}", engine="local",
                                placement_policy="none", min_write_quorum=1, min_ack_quorum=1,
                                recheck_delay=0.2, bookie_max_message_bytes=1 << 20,
                                bookie_endpoints={bookie(1): f"127.0.0.1:{agent.port}"})
        report = ScrutinyRun(settings, LocalEngine()).execute()
    finally:
        agent.stop(grace=0)
    assert found(report) == {("INVALID_BOOKIE_RESPONSE", 1)}
    assert "larger than 1048576 bytes" in json.dumps(next(iter(report.violations)).to_json())


def test_hostile_metadata_is_invalid_metadata_and_the_run_goes_on(zk_server: LocalZooKeeper,
                                                                  zk_client: KazooClient, zk_namespace: str,
                                                                  tmp_path: Path) -> None:
    root = f"{zk_namespace}/ledgers"
    _, store = _one_bookie_cluster(zk_client, root, tmp_path, 1)
    w = ClusterWriter(zk_client, root)
    huge = tuple(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:3181" for i in range(40_000))
    hostile = {
        10: b"",
        11: b"\x00\xff" * 100,
        12: b"BookieMetadataFormatVersion\tthree\n",
        13: b"BookieMetadataFormatVersion\t12345678901\n",
        14: encode_ledger_metadata(LedgerMetadata(14, LedgerState.CLOSED, 2, 3, 2, 9, 0,
                                                  (Segment(0, ("a:1", "b:1")),)), 3),
        15: encode_ledger_metadata(LedgerMetadata(15, LedgerState.CLOSED, 3, 2, 3, 9, 0,
                                                  (Segment(0, ("a:1", "b:1", "c:1")),)), 3),
        16: encode_ledger_metadata(LedgerMetadata(16, LedgerState.CLOSED, 40_000, 2, 2, 9, 0,
                                                  (Segment(0, huge),)), 3),
        17: b"BookieMetadataFormatVersion\t3\n\xff\xff\xff\xff\x0f",
    }
    for lid, data in hostile.items():
        w.write_raw_ledger(lid, data)
    agent = BookieAgent(SyntheticStore(store), bind="127.0.0.1:0").start()
    try:
        settings = ScanSettings(metadata_service_uri=f"zk+hierarchical://{zk_server.hosts}{root}", engine="local",
                                placement_policy="none", min_write_quorum=1, min_ack_quorum=1,
                                bookie_endpoints={bookie(1): f"127.0.0.1:{agent.port}"})
        report = ScrutinyRun(settings, LocalEngine()).execute()
    finally:
        agent.stop(grace=0)
    assert found(report) == {("INVALID_METADATA", lid) for lid in hostile}
    assert report.complete and report.ledgers["checked"] == 1  # the healthy ledger was checked all the same


def test_leader_killed_mid_run_the_standby_redoes_it_once(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                          zk_namespace: str, tmp_path: Path) -> None:
    root = f"{zk_namespace}/ledgers"
    _, store = _one_bookie_cluster(zk_client, root, tmp_path, 60)
    agent, port = slow_agent(store, 0.1)  # a full run takes about 6 s
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    procs = []
    try:
        configs = []
        for i in range(2):
            cfg = tmp_path / f"a{i}.yaml"
            cfg.write_text(f"metadata_service_uri: {uri}\nengine: local\nplacement_policy: none\n"
                           "min_write_quorum: 1\nmin_ack_quorum: 1\n"
                           f"zk_session_timeout: 4\nbookie_endpoints: {{'{bookie(1)}': '127.0.0.1:{port}'}}\n"
                           f"auditor:\n  listen: 127.0.0.1:0\n  reports_dir: {tmp_path / f'reports{i}'}\n"
                           "  full_interval_seconds: 3600\n  underreplication_interval_seconds: 0\n"
                           "  insecure_open_rescan: true\n")
            configs.append(cfg)
        procs.append(auditor_process(configs[0]))
        first = int(procs[0].stdout.readline().split()[-1])  # type: ignore[union-attr]
        status = auditor_pb2_grpc.AuditorStub(grpc.insecure_channel(f"127.0.0.1:{first}"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the first one leads and is in the middle of its run ...
            s = status.GetStatus(auditor_pb2.GetStatusRequest(), timeout=2)
            if s.role == auditor_pb2.LEADER and s.current_run.run_id:
                break
            time.sleep(0.05)
        assert s.current_run.kind == "full"
        procs.append(auditor_process(configs[1]))  # ... when the standby joins
        procs[1].stdout.readline()  # type: ignore[union-attr]
        time.sleep(1.0)
        reap(procs[0])
        deadline = time.monotonic() + 60
        while not list((tmp_path / "reports1" / "full").glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
    finally:
        for p in procs:
            reap(p)
        reap(agent)
    assert not list((tmp_path / "reports0").rglob("*.json"))  # the killed leader never finished
    redone = list((tmp_path / "reports1" / "full").glob("*.json"))
    assert len(redone) == 1  # redone once by the new leader: not lost, not duplicated
    report = json.loads(redone[0].read_text())
    assert report["complete"] and report["ledgers"]["checked"] == 60 and report["violations"] == []


def test_a_spark_executor_failing_mid_job_is_retried_with_the_same_findings(
        demo: tuple[DemoCluster, ScanSettings], zk_client: KazooClient, tmp_path: Path) -> None:
    cluster, settings = demo
    # Slow down one bookie (a slow agent process replaces its agent) so that tasks take seconds.
    path = parse_metadata_service_uri(settings.metadata_service_uri).scrutiny_path
    store = cluster.store_files[bookie(1)]
    agent, port = slow_agent(store, 0.03)
    zk_client.set(f"{path}/agents/{bookie(1)}", json.dumps({"bookie_id": bookie(1),
                                                            "address": f"127.0.0.1:{port}"}).encode())
    out = tmp_path / "r.json"
    scan = processes.spawn([sys.executable, "-m", "scrutiny.cli", "scan", "--metadata-service-uri",
                             settings.metadata_service_uri, "--format", "json", "--output", str(out),
                             "--recheck-delay", "0.3", "--underreplicated-grace-period", "3600",
                             "--spark-master", "local[2,4]"], stderr=subprocess.PIPE, text=True)
    killed = 0
    try:
        deadline = time.monotonic() + 120
        while scan.poll() is None and time.monotonic() < deadline and not killed:
            for p in psutil.Process(scan.pid).children(recursive=True):
                try:
                    parent = p.parent()
                    if parent is not None and "pyspark.daemon" in " ".join(parent.cmdline()) \
                            and "pyspark.daemon" in " ".join(p.cmdline()):
                        p.send_signal(signal.SIGKILL)  # a Python worker in the middle of a task
                        killed += 1
                        break
                except psutil.Error:
                    continue
            time.sleep(0.05)
        assert scan.wait(timeout=240) == 1, scan.stderr.read()[-3000:] if scan.stderr else ""
    finally:
        reap(scan)
        reap(agent)
    assert killed == 1
    report = json.loads(out.read_text())
    assert report["complete"]
    assert {(v["category"], v["ledger_id"]) for v in report["violations"]} == cluster.expected


def test_zookeeper_ensemble_leader_killed_mid_scan_same_findings(tmp_path: Path) -> None:
    from scrutiny.testing.localzk import LocalEnsemble

    ensemble = LocalEnsemble(3, workdir=tmp_path / "ensemble")
    ensemble.start()
    client = KazooClient(hosts=ensemble.hosts, timeout=10)
    client.start(timeout=15)
    try:
        cluster = build_demo_cluster(client, "/ledgers", tmp_path / "stores", healthy=300)
        uri = f"zk+hierarchical://{ensemble.hosts.replace(',', ';')}/ledgers"
        settings = ScanSettings(metadata_service_uri=uri, recheck_delay=0.3, underreplicated_grace_period=3600,
                                bookie_deadline_seconds=5, zk_session_timeout=10, zk_retry_deadline=30)
        with demo_agents(cluster, store_on(client, uri)):
            leader = ensemble.leader()
            report = ScrutinyRun(settings, FaultAfterFirstRange(lambda ctx: ensemble.kill(leader))).execute()
            assert not leader.running
            assert report.complete, report.errors
            assert found(report) == cluster.expected  # same findings, no false alarm
            assert report.ledgers["seen"] == cluster.ledgers
    finally:
        client.stop()
        client.close()
        ensemble.close()
