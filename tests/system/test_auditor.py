"""The auditor daemon: election and failover between real processes, cadence kept in ZooKeeper,
the Rescan RPC, StatsD packets on a real UDP socket, configuration checks."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import grpc
import pytest
from grpc_status import rpc_status
from kazoo.client import KazooClient

from scrutiny.auditor import Auditor, AuditorSettings
from scrutiny.auditor.lastrun import last_run
from scrutiny.config import MetricsSettings, ScanSettings, StatsdSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.demo import DemoCluster, build_demo_cluster, demo_agents
from scrutiny.testing.localzk import free_port
from scrutiny.testing.processes import reap
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc
from tests.conftest import place_on
from tests.support.helpers import auditor_process, wait_for
from tests.support.metrics import sample, scrape


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[DemoCluster, str]]:
    """The demo cluster on ZooKeeper; on Pulsar's metadata store on etcd where a test asks (indirect "etcd")."""
    with place_on(request, getattr(request, "param", "zk")) as place:
        demo = build_demo_cluster(place.client, place.root, tmp_path / "stores", healthy=60)
        with demo_agents(demo, place.registry):
            yield demo, place.uri


def scan_settings(uri: str) -> ScanSettings:
    return ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.5,
                        underreplicated_grace_period=3600, zk_session_timeout=4.0)


class UdpListener:
    """A StatsD receiver: the real packets, as lines."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sock.settimeout(0.2)

    def lines(self, until: str, timeout: float = 20.0) -> list[str]:
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(ln.startswith(until) for ln in got):
            with contextlib.suppress(TimeoutError):
                got += self.sock.recv(65536).decode().splitlines()
        return got


def stub(address: str) -> auditor_pb2_grpc.AuditorStub:
    return auditor_pb2_grpc.AuditorStub(grpc.insecure_channel(address))


def test_leader_runs_reports_statsd_and_rescan(cluster: tuple[DemoCluster, str], tmp_path: Path) -> None:
    demo, uri = cluster
    udp = UdpListener()
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"),
                               underreplication_interval_seconds=0, insecure_open_rescan=True)
    statsd = StatsdSettings(host="127.0.0.1", port=udp.port, prefix="scrutiny")
    auditor = Auditor(scan_settings(uri), settings, statsd, engine=LocalEngine()).start()
    try:
        wait_for(lambda: auditor.leading.is_set())
        # the first full run is due at once (no cadence yet)
        lines = udp.lines(until="scrutiny.runs.full.complete")
        assert "scrutiny.violations.NO_REPLICA_OF_AN_ENTRY:1|c" in lines
        assert "scrutiny.auditor.NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY:1|g" in lines
        assert "scrutiny.auditor.NUM_LEDGERS_HAVING_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY:2|g" in lines
        assert "scrutiny.violations.BOOKIE_UNAVAILABLE:2|c" in lines
        assert any(ln.startswith("scrutiny.run.full.duration:") and ln.endswith("|ms") for ln in lines)
        assert f"scrutiny.ledgers.checked:{demo.checked}|c" in lines
        wait_for(lambda: full_reports(tmp_path))
        report = json.loads(full_reports(tmp_path)[0].read_text())
        assert {(v["category"], v["ledger_id"]) for v in report["violations"]} == demo.expected
        down = [v["details"]["silence"] for v in report["violations"] if v["category"] == "BOOKIE_UNAVAILABLE"]
        assert down and all(set(s.values()) == {"down"} for s in down)  # connection refused: down, not slow
        status = stub(auditor.address).GetStatus(auditor_pb2.GetStatusRequest())
        assert status.role == auditor_pb2.LEADER and status.leader_address == auditor.address
        assert "full" in status.next_runs
        # the on-demand rescan of two ledgers returns their report
        resp = stub(auditor.address).Rescan(auditor_pb2.RescanRequest(
            ledgers=auditor_pb2.LedgerIds(ledger_ids=[9001, 1]), wait=True))
        got = json.loads(resp.report_json)
        assert {(v["category"], v["ledger_id"]) for v in got["violations"]} == {("NO_REPLICA_OF_AN_ENTRY", 9001)}
        assert got["ledgers"]["seen"] == 2
        last = stub(auditor.address).GetLastReport(auditor_pb2.GetLastReportRequest(kind="rescan"))
        assert json.loads(last.report_json)["run_id"] == resp.run_id
    finally:
        auditor.stop()


def full_reports(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "reports" / "full").glob("*.json"))


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (auditor_pb2.RescanRequest(ledgers=auditor_pb2.LedgerIds(ledger_ids=[1, 424242])), "INVALID_ARGUMENT",
         "no such ledger 424242"),
        (auditor_pb2.RescanRequest(ledgers=auditor_pb2.LedgerIds(ledger_ids=[-1])), "INVALID_ARGUMENT", "negative"),
        (auditor_pb2.RescanRequest(ledgers=auditor_pb2.LedgerIds(ledger_ids=list(range(10_001)))),
         "INVALID_ARGUMENT", "at most"),
        (auditor_pb2.RescanRequest(bookie_id="  "), "INVALID_ARGUMENT", "bookie_id is empty"),
        (auditor_pb2.RescanRequest(), "INVALID_ARGUMENT", "say what to rescan"),
        (auditor_pb2.RescanRequest(all_ledgers=True, wait_timeout_seconds=-1), "INVALID_ARGUMENT", "negative"),
    ],
)
def test_bad_rescan_requests(cluster: tuple[DemoCluster, str], tmp_path: Path, request_: object, code: str,
                             words: str) -> None:
    _, uri = cluster
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path), full_interval_seconds=0,
                               underreplication_interval_seconds=0, insecure_open_rescan=True)
    auditor = Auditor(scan_settings(uri), settings, engine=LocalEngine()).start()
    try:
        wait_for(lambda: auditor.leading.is_set())
        with pytest.raises(grpc.RpcError) as err:
            stub(auditor.address).Rescan(request_)
        assert err.value.code().name == code and words in (err.value.details() or "")
        # refused: no rescan queued, going or done (continuous scrutiny's full run, at each leadership the
        # session's losses under load give it, is another matter)
        st = auditor.status()
        accepted = [*auditor.queue.queued, *st.last, *((st.current,) if st.current else ())]
        assert not [t for t in accepted if t.kind == "rescan"]
    finally:
        auditor.stop()


def test_token_guards_rescan(cluster: tuple[DemoCluster, str], tmp_path: Path) -> None:
    _, uri = cluster
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path), full_interval_seconds=0,
                               underreplication_interval_seconds=0, token_file=str(token))
    auditor = Auditor(scan_settings(uri), settings, engine=LocalEngine()).start()
    try:
        wait_for(lambda: auditor.leading.is_set())
        req = auditor_pb2.RescanRequest(ledgers=auditor_pb2.LedgerIds(ledger_ids=[1]), wait=True)
        for md in ([], [("authorization", "Bearer wrong")]):
            with pytest.raises(grpc.RpcError) as err:
                stub(auditor.address).Rescan(req, metadata=md)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert not auditor.last  # nothing ran
        ok = stub(auditor.address).Rescan(req, metadata=[("authorization", "Bearer s3cret")])
        assert json.loads(ok.report_json)["ledgers"]["seen"] == 1
        stub(auditor.address).GetStatus(auditor_pb2.GetStatusRequest())  # open by default
    finally:
        auditor.stop()


def test_runs_are_skipped_while_replication_is_disabled(cluster: tuple[DemoCluster, str], tmp_path: Path,
                                                        zk_client: KazooClient) -> None:
    demo, uri = cluster
    ClusterWriter(zk_client, demo.root).set_replication_disabled(True)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path), full_interval_seconds=1,
                               underreplication_interval_seconds=0, insecure_open_rescan=True)
    auditor = Auditor(scan_settings(uri), settings, engine=LocalEngine()).start()
    try:
        wait_for(lambda: auditor.trigger.skipped["full.replication_disabled"] >= 2)
        assert not auditor.last
    finally:
        auditor.stop()


@pytest.mark.parametrize("cluster", ["zk", "etcd"], indirect=True)
def test_failover_keeps_the_cadence_and_the_alerts(cluster: tuple[DemoCluster, str], tmp_path: Path) -> None:
    """Leader SIGKILLed after a run with faults: the standby leads, keeps the cadence, and exports the
    same violation gauges at once with the run's true age, so no data-at-risk alert clears. On ZooKeeper
    and on etcd (its election on a lease of the same 4 s)."""
    _, uri = cluster
    ports, metric_ports = [free_port(), free_port()], [free_port(), free_port()]
    configs = []
    for i, port in enumerate(ports):
        cfg = tmp_path / f"auditor{i}.yaml"
        cfg.write_text(f"metadata_service_uri: {uri}\nengine: local\nrecheck_delay: 0.5\nzk_session_timeout: 4\n"
                       "etcd_lease_ttl: 4\n"
                       f"auditor:\n  listen: 127.0.0.1:{port}\n  reports_dir: {tmp_path / f'reports{i}'}\n"
                       "  full_interval_seconds: 3600\n  underreplication_interval_seconds: 0\n"
                       f"  insecure_open_rescan: true\nmetrics:\n  listen: 127.0.0.1:{metric_ports[i]}\n")
        configs.append(cfg)
    logs = [tmp_path / "auditor0.log", tmp_path / "auditor1.log"]
    first = auditor_process(configs[0], logs[0])
    second = None
    try:
        a, b = f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"
        wait_for(lambda: _status(a) is not None and _status(a).role == auditor_pb2.LEADER)
        wait_for(lambda: any(r.kind == "full" and r.finished_at for r in _status(a).last_runs), 60)
        gauges = _violation_gauges(scrape(metric_ports[0]))
        assert gauges["scrutiny_violations{category=\"NO_REPLICA_OF_AN_ENTRY\"}"] == 1
        assert gauges["auditor_NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY"] == 1
        second = auditor_process(configs[1], logs[1])
        # A standby names the leader once its own session can read the election (until then: "").
        wait_for(lambda: _status(b) is not None and _status(b).role == auditor_pb2.STANDBY
                 and _status(b).leader_address == a)
        with pytest.raises(grpc.RpcError) as err:
            stub(b).Rescan(auditor_pb2.RescanRequest(all_ledgers=True))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and a in (err.value.details() or "")
        # the redirect as the proto says: a RescanResponse with leader_address, in the rich error details
        refusal = rpc_status.from_call(err.value)  # type: ignore[arg-type]
        assert refusal is not None and len(refusal.details) == 1
        redirect = auditor_pb2.RescanResponse()
        assert refusal.details[0].Unpack(redirect) and redirect.leader_address == a
        assert dict(err.value.trailing_metadata() or ())["leader-address"] == a  # type: ignore[attr-defined]
        # what the new leader must inherit: the last full run the first completed. Its start schedules a full
        # run and, on ZooKeeper, the watch's gap another (a busy machine may lose a session and add more), so
        # take it once the first is quiet, just before it is killed (a run takes longer than that moment).
        wait_for(lambda: _quiet(a), 60)
        run = next(r for r in _status(a).last_runs if r.kind == "full")
        ran_at = datetime.fromisoformat(run.started_at)
        before = scrape(metric_ports[0])
        age_before = sample(before, "scrutiny_last_complete_run_age_seconds", '{kind="full"}')
        assert _violation_gauges(before) == gauges
        reap(first)
        killed_at = time.time()
        t0 = time.monotonic()
        wait_for(lambda: _status(b).role == auditor_pb2.LEADER, 20)
        assert time.monotonic() - t0 < 10  # within the 4 s session timeout, plus slack
        wait_for(lambda: "full" in _status(b).next_runs, 10)  # scheduled once it has inherited the last runs
        status = _status(b)
        # the new leader keeps the cadence: next full run one interval after the last, not now
        due = datetime.fromisoformat(status.next_runs["full"])
        assert abs((due - ran_at).total_seconds() - 3600) < 5
        # ... and the last full run, as the first leader left it: exported at once, its age not reset
        after = scrape(metric_ports[1])
        assert _violation_gauges(after) == gauges
        age = sample(after, "scrutiny_last_complete_run_age_seconds", '{kind="full"}')
        assert age is not None and age_before is not None and age >= age_before + time.time() - killed_at - 1
        assert sample(after, "scrutiny_leader") == 1
        inherited = next(r for r in status.last_runs if r.kind == "full")
        assert (inherited.run_id, inherited.ran_by, inherited.counts["NO_REPLICA_OF_AN_ENTRY"]) == (run.run_id, a, 1)
        report = json.loads(stub(b).GetLastReport(auditor_pb2.GetLastReportRequest(kind="full")).report_json)
        assert report["summary_only"] and report["ran_by"] == a and report["run_id"] == run.run_id
        assert report["counts"]["NO_REPLICA_OF_AN_ENTRY"] == 1 and "violations" not in report
        assert report["blast_radius"]["bookies"]
        files = list((tmp_path / "reports1" / "full").glob("*.json"))
        assert [json.loads(f.read_text())["run_id"] for f in files] == [run.run_id]
        # SIGTERM: a clean exit that releases leadership
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
    finally:
        for p in (first, second):
            if p is not None:
                reap(p)
    # what an operator reads in the logs: where things are served, which kind of run counted what, who leads
    text = [log.read_text() for log in logs]
    assert f"auditor RPC on 127.0.0.1:{ports[0]}" in text[0] and f"/metrics on 127.0.0.1:{metric_ports[0]}" in text[0]
    assert f"full run {run.run_id} counts" in text[0]
    assert f"standing by: {a} leads" in text[1]
    assert f"inherited the last complete full run {run.run_id}" in text[1]


def _violation_gauges(metrics: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^((?:scrutiny_violations|auditor_NUM_\w+|scrutiny_bookie_unavailable_ledgers|scrutiny_blast_radius_\w+)"
        r"(?:\{[^}]*\})?) (\S+)$", metrics, re.M)}


def _quiet(address: str) -> bool:
    """No run going on, queued or awaiting its re-check."""
    s = _status(address)
    return s is not None and not s.current_run.run_id and s.queued_runs == 0 and s.runs_awaiting_recheck == 0


def _status(address: str) -> auditor_pb2.GetStatusResponse | None:
    try:
        return stub(address).GetStatus(auditor_pb2.GetStatusRequest(), timeout=2)
    except grpc.RpcError:
        return None


def validate(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrutiny.cli", "auditor", "--config", str(config),
                           "--validate-config"], capture_output=True, text=True)


def test_validate_config(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("metadata_service_uri: zk+hierarchical://127.0.0.1:2181/ledgers\n"
                    "auditor:\n  listen: 127.0.0.1:3192\n  full_interval_seconds: 600\n  insecure_open_rescan: true\n")
    res = validate(good)
    assert res.returncode == 0 and "configuration OK" in res.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("metadata_service_uri: zk+hierarchical://127.0.0.1:2181/ledgers\n"
                   "auditor:\n  full_interval_secs: 600\n")
    res = validate(bad)
    assert res.returncode == 2 and "full_interval_secs" in res.stderr
    bad.write_text("metadata_service_uri: zk+hierarchical://127.0.0.1:2181/ledgers\n"
                   "auditor:\n  reports_keep: 0\n  insecure_open_rescan: true\n")
    res = validate(bad)
    assert res.returncode == 2 and "reports_keep" in res.stderr
    bad.write_text("metadata_service_uri: zk+hierarchical://127.0.0.1:2181/ledgers\n")
    res = validate(bad)
    assert res.returncode == 2 and "Rescan needs authentication" in res.stderr
    for repair, says in (("off", "unquoted as booleans: quote it"), ("always", "off, dry-run or mark")):
        bad.write_text("metadata_service_uri: zk+hierarchical://127.0.0.1:2181/ledgers\n"
                       f"auditor:\n  insecure_open_rescan: true\n  repair: {repair}\n")
        res = validate(bad)
        assert res.returncode == 2 and "repair" in res.stderr and says in res.stderr, res.stderr


def test_rescan_command(cluster: tuple[DemoCluster, str], tmp_path: Path) -> None:
    _, uri = cluster
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path), full_interval_seconds=0,
                               underreplication_interval_seconds=0, insecure_open_rescan=True)
    leader = Auditor(scan_settings(uri), settings, engine=LocalEngine()).start()
    standby = None
    try:
        wait_for(lambda: leader.leading.is_set())
        standby = Auditor(scan_settings(uri), settings, engine=LocalEngine()).start()
        wait_for(lambda: standby is not None and standby.leader_address() == leader.address)
        cmd = [sys.executable, "-m", "scrutiny.cli", "rescan", "--auditor", standby.address]
        res = subprocess.run([*cmd, "--ledger", "9004", "--format", "json"], capture_output=True, text=True)
        assert res.returncode == 1, res.stderr  # asked the standby: answered by the leader
        assert json.loads(res.stdout)["counts"]["PLACEMENT_POLICY_NOT_ADHERING"] == 1
        res = subprocess.run([*cmd, "--ledger", "1"], capture_output=True, text=True)
        assert res.returncode == 0 and "seen 1" in res.stdout
        res = subprocess.run([*cmd, "--all", "--no-wait"], capture_output=True, text=True)
        assert res.returncode == 0 and res.stdout.startswith("run ")
        res = subprocess.run([*cmd, "--ledger", "777777"], capture_output=True, text=True)
        assert res.returncode == 2 and "no such ledger 777777" in res.stderr
    finally:
        for a in (standby, leader):
            if a is not None:
                a.stop()


def test_the_periodic_mark_check_sets_its_gauges(cluster: tuple[DemoCluster, str], tmp_path: Path) -> None:
    """The cheap under-replication run (every 15 min by default) moves the mark-age gauge, not only the
    daily full run, and its summary is kept for the next leader."""
    _, uri = cluster
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path), full_interval_seconds=0,
                               underreplication_interval_seconds=3600, insecure_open_rescan=True)
    port = free_port()
    auditor = Auditor(scan_settings(uri), settings, metrics=MetricsSettings(listen=f"127.0.0.1:{port}"), web=AuditorWeb,
                      engine=LocalEngine()).start()
    try:
        wait_for(lambda: "underreplication" in auditor.last)
        text = scrape(port)
        assert sample(text, "auditor_NUM_UNDERREPLICATED_LEDGERS_ELAPSED_RECOVERY_GRACE_PERIOD") == 1  # ledger 17
        assert sample(text, "scrutiny_underreplicated_ledgers") == 1
        assert sample(text, "scrutiny_violations", '{category="NO_REPLICA_OF_AN_ENTRY"}') is None  # not looked at
        with store_at(uri) as store:
            stored = last_run("underreplication").read(store)
        assert stored is not None and stored.counts == {"UNDERREPLICATED_ELAPSED_GRACE_PERIOD": 1}
    finally:
        auditor.stop()
