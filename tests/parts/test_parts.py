"""Each part of the middle alone: the run queue, the RPC servicer, leadership, the report sinks, the
settings sections, the category registry, and a second metadata store as one module plus a scheme."""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from scrutiny.auditor.lastrun import RunSummary
from scrutiny.auditor.leadership import Leadership, PeriodicRuns
from scrutiny.auditor.runqueue import Later, RunQueue, Ticket
from scrutiny.auditor.service import AuditorServicer, Authenticator, Status
from scrutiny.auditor.sinks import FinishedRun, ReportFiles
from scrutiny.categories import REGISTRY, Category, Fact, Phase, in_phase, resting_on, spec
from scrutiny.checks import Violation, expected_share
from scrutiny.config import AgentSettings, ScanSettings, StatsdSettings, build
from scrutiny.entrysources.kinds import checked
from scrutiny.errors import Busy, ConfigError, DataError, NotLeader, RequestError, StoreError
from scrutiny.findings import Findings
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment, UnderreplicationMark
from scrutiny.report import Report
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import open_store
from scrutiny.testing import store_at
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc
from tests.support import memstore
from tests.support.helpers import wait_for


def report(run_id: str = "r", violations: list[Any] | None = None) -> Report:
    return Report(run_id, "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:01.000Z", True, {}, Findings(violations or []))


# -- the run queue --------------------------------------------------------------------------------

def test_run_queue_order_bound_recheck_and_failures() -> None:
    gate = threading.Event()
    published: list[tuple[str, str]] = []
    timers: list[threading.Timer] = []

    def execute(t: Ticket) -> Report | Later:
        if t.kind == "slow":
            gate.wait(10)
        if t.kind == "broken":
            raise RuntimeError("boom")
        if t.kind == "recheck":
            return Later(0.2, lambda: report(t.run_id))
        return report(t.run_id)

    def schedule(delay: float, fn: Any) -> None:
        timers.append(threading.Timer(delay, fn))
        timers[-1].start()

    q = RunQueue(execute, lambda t, r: published.append((t.kind, r.run_id)), schedule,
                 lambda t, e: Report(t.run_id, "", "", False, {}, Findings(), errors=[str(e)]), max_queued=2)
    q.start()
    first, waits = q.submit(Ticket("slow"))
    assert not waits
    wait_for(lambda: q.current is first)
    second, waits = q.submit(Ticket("recheck"))
    assert waits and q.busy_with("recheck") and q.busy_with("slow") and not q.busy_with("full")
    q.submit(Ticket("broken"))
    with pytest.raises(Busy):
        q.submit(Ticket("full"))  # two already queued
    gate.set()
    wait_for(lambda: "broken" in q.last and "recheck" in q.last)
    assert [k for k, _ in published] == ["slow", "broken", "recheck"]  # the re-check freed the worker
    assert q.last["broken"].report is not None and q.last["broken"].report.errors == ["boom"]
    assert second.done.is_set() and not q.awaiting_recheck
    assert q.stop(5)


# -- the RPC servicer, on a real server, over a fake auditor ----------------------------------------

class FakeApi:
    def __init__(self) -> None:
        self.error: Exception | None = None
        self.asked: list[tuple[list[int] | None, str]] = []

    def rescan(self, ledger_ids: list[int] | None, bookie_id: str) -> tuple[Ticket, bool]:
        self.asked.append((ledger_ids, bookie_id))
        if self.error is not None:
            raise self.error
        t = Ticket("rescan", run_id="abc")
        t.report = report("abc")
        t.done.set()
        return t, False

    def status(self) -> Status:
        return Status(leading=False, leader_address="10.0.0.1:3192", queued_runs=3)

    def last_report(self, kind: str) -> dict[str, Any] | None:
        return {"run_id": "d1", "counts": {}} if kind == "deep" else None


@pytest.fixture
def fake_auditor() -> Iterator[tuple[FakeApi, auditor_pb2_grpc.AuditorStub]]:
    api = FakeApi()
    server = grpc.server(futures_pool())
    auditor_pb2_grpc.add_AuditorServicer_to_server(
        AuditorServicer(api, Authenticator("t0k", False, False), 5.0, False), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield api, auditor_pb2_grpc.AuditorStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    server.stop(0)


def futures_pool() -> Any:
    from concurrent import futures

    return futures.ThreadPoolExecutor(max_workers=2)


AUTH = [("authorization", "Bearer t0k")]


def test_servicer_translates_requests_and_maps_each_error_kind_once(
        fake_auditor: tuple[FakeApi, auditor_pb2_grpc.AuditorStub]) -> None:
    api, stub = fake_auditor
    resp = stub.Rescan(auditor_pb2.RescanRequest(bookie_id=" b:3181 ", wait=True), metadata=AUTH)
    assert resp.run_id == "abc" and json.loads(resp.report_json)["run_id"] == "abc"
    assert api.asked == [(None, "b:3181")]
    cases = [(StoreError("ZooKeeper down"), grpc.StatusCode.UNAVAILABLE),
             (RequestError("no such ledger 7"), grpc.StatusCode.INVALID_ARGUMENT),
             (Busy("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
             (NotLeader("10.0.0.1:3192"), grpc.StatusCode.FAILED_PRECONDITION)]
    for error, code in cases:
        api.error = error
        with pytest.raises(grpc.RpcError) as err:
            stub.Rescan(auditor_pb2.RescanRequest(all_ledgers=True), metadata=AUTH)
        assert err.value.code() == code and str(error) in (err.value.details() or "")
    assert dict(err.value.trailing_metadata() or ())["leader-address"] == "10.0.0.1:3192"
    with pytest.raises(grpc.RpcError) as err:
        stub.Rescan(auditor_pb2.RescanRequest(all_ledgers=True))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    status = stub.GetStatus(auditor_pb2.GetStatusRequest())
    assert status.role == auditor_pb2.STANDBY and status.queued_runs == 3
    with pytest.raises(grpc.RpcError) as err:
        stub.GetLastReport(auditor_pb2.GetLastReportRequest(kind="full"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    deep = stub.GetLastReport(auditor_pb2.GetLastReportRequest(kind="deep"))  # a kind the auditor runs
    assert json.loads(deep.report_json)["run_id"] == "d1"
    with pytest.raises(grpc.RpcError) as err:
        stub.GetLastReport(auditor_pb2.GetLastReportRequest(kind="weekly"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "deep" in (err.value.details() or "")


# -- leadership, on the real ZooKeeper ------------------------------------------------------------

def test_leadership_fails_over_and_keeps_the_cadence(zk_server: LocalZooKeeper, zk_namespace: str) -> None:
    uri = f"zk+hierarchical://{zk_server.hosts}{zk_namespace}/ledgers"
    events: list[str] = []
    # what a leader takes over (the state the last one kept) is in place before it says it leads
    said_leading_before_taking_over: list[bool] = []
    parts = [Leadership(lambda: store_at(uri, zk_session_timeout=4.0), name, "",
                        lambda n=name: events.append(f"+{n}"), lambda n=name: events.append(f"-{n}"),
                        lambda i=i: said_leading_before_taking_over.append(parts[i].leading.is_set()))
             for i, name in enumerate(("a:1", "b:1"))]
    try:
        parts[0].start()
        wait_for(parts[0].leading.is_set)
        parts[1].start()
        wait_for(lambda: parts[1].leader_address() == "a:1")
        assert not parts[1].leading.is_set()
        from apscheduler.schedulers.background import BackgroundScheduler

        scheduler = BackgroundScheduler()
        scheduler.start()
        periodic = PeriodicRuns(scheduler, parts[0].connected_store, lambda kind: None)
        periodic.record("full", int(time.time() * 1000) - 1000)
        periodic.schedule({"full": 3600, "underreplication": 0})
        due = periodic.next_runs()
        assert list(due) == ["full"] and due["full"] > time.strftime("%Y-%m-%dT%H", time.gmtime(time.time() + 3000))
        scheduler.shutdown(wait=False)
        parts[0].stop()
        # b takes over. On a loaded machine either session may also be lost on the way (4 s): the node then
        # steps down and stands again, and a session that expired on the server lets b lead before a has
        # heard of it (two processes, in production: no order between their callbacks is promised). What is
        # promised: b ends up leading, each node's callbacks alternate (elected, deposed, ...), and a, stopped,
        # leads no more.
        def of(name: str) -> list[str]:
            return [e for e in events if e.endswith(name)]

        wait_for(lambda: parts[1].leading.is_set() and of("b:1")[-1:] == ["+b:1"] and of("a:1")[-1:] == ["-a:1"],
                 30, lambda: str(events))
        for name in ("a:1", "b:1"):
            mine = [e[0] for e in events if e[1:] == name]
            assert mine[0] == "+" and all(x != y for x, y in itertools.pairwise(mine)), events
        assert events[0] == "+a:1" and not parts[0].leading.is_set(), events
        assert len(said_leading_before_taking_over) == events.count("+a:1") + events.count("+b:1")
        assert not any(said_leading_before_taking_over)
    finally:
        for p in parts:
            p.stop()


def test_leadership_backs_off_while_the_store_is_unreachable() -> None:
    tries: list[float] = []

    def unreachable() -> Any:
        tries.append(time.monotonic())
        raise StoreError("nobody home")

    lead = Leadership(unreachable, "x:1", "", lambda: None, lambda: None)
    lead.start()
    time.sleep(2.5)
    lead.stop()
    assert 2 <= len(tries) <= 3 and not lead.leading.is_set()  # 1 s, then 2 s: no busy loop
    with pytest.raises(StoreError):
        lead.connected_store()


# -- sinks ----------------------------------------------------------------------------------------

def test_report_files_keep_the_newest(tmp_path: Path) -> None:
    sink = ReportFiles(str(tmp_path), keep=2)
    for i in range(4):
        r = Report(f"run{i}", f"2026-01-01T00:00:0{i}.000Z", "x", True, {}, Findings())
        sink.published(FinishedRun("full", r, 1, tuple(REGISTRY)))
    names = sorted(p.name for p in (tmp_path / "full").glob("*.json"))
    assert len(names) == 2 and names[-1].endswith("run3.json") and not list((tmp_path / "full").glob(".*"))


def a_summary(kind: str = "full", finished_ms: int = 1_700_000_000_000) -> RunSummary:
    violations = [Violation(Category.NO_REPLICA_OF_AN_ENTRY, 7, ("b1:3181",)),
                  Violation(Category.BOOKIE_UNAVAILABLE, 8, ("b2:3181",))]
    report = Report("r1", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", True, {"checked": 40}, Findings(violations),
                    stats={"first_pass_ms": 1500}, blast_radius={"bookies": {"b1:3181": {"ledgers_below_aq": 5}}})
    return FinishedRun(kind, report, 60_000, tuple(REGISTRY), finished_ms=finished_ms, ran_by="a1:3192").summary


def test_the_last_run_summary_round_trips_and_bad_ones_are_named() -> None:
    summary = a_summary()
    assert RunSummary.parse(summary.to_bytes(), "here") == summary
    assert summary.counts["NO_REPLICA_OF_AN_ENTRY"] == 1 and summary.unavailable == {"b2:3181": 1}
    doc = summary.report_json()
    assert doc["summary_only"] and doc["finished_at"] == "2023-11-14T22:13:20Z" and "violations" not in doc
    assert Report.from_json(doc).complete  # still reads as the contract's report
    good = summary.to_json()
    for data, words in [(b"\xff", "not JSON"), (b"[1]", "not a JSON object"),
                        (json.dumps({**good, "format": 2}).encode(), "format 2"),
                        (json.dumps({**good, "finished_ms": -1}).encode(), "finished_ms"),
                        (json.dumps({**good, "counts": {"X": "1"}}).encode(), "counts"),
                        (json.dumps({**good, "blast_radius": {"bookies": [1]}}).encode(), "blast_radius"),
                        (json.dumps({k: v for k, v in good.items() if k != "run_id"}).encode(), "run_id")]:
        with pytest.raises(DataError, match=f"znode /x: .*{words}"):
            RunSummary.parse(data, "znode /x")


def test_report_files_write_an_inherited_run_as_its_summary_unless_its_report_is_there(tmp_path: Path) -> None:
    sink = ReportFiles(str(tmp_path), keep=5)
    sink.restored(a_summary())
    written = json.loads(next((tmp_path / "full").glob("*-r1.json")).read_text())
    assert written["summary_only"] and written["ran_by"] == "a1:3192"
    report = Report("r2", "2026-01-02T00:00:00Z", "x", True, {}, Findings())
    sink.published(FinishedRun("full", report, 1, tuple(REGISTRY)))
    sink.restored(dataclasses.replace(a_summary(), run_id="r2", started_at="2026-01-02T00:00:00Z"))
    assert "summary_only" not in json.loads(next((tmp_path / "full").glob("*-r2.json")).read_text())


# -- settings -------------------------------------------------------------------------------------

def test_every_section_is_validated_and_unknown_ones_refused() -> None:
    with pytest.raises(ConfigError, match="unknown section 'statsdd'"):
        build(ScanSettings, {"statsdd": {"host": "x"}}, {})
    with pytest.raises(ConfigError, match=r"unknown key 'statsd\.hots'"):
        build(StatsdSettings, {"statsd": {"hots": "x"}}, {}, section="statsd")
    got = build(StatsdSettings, {"statsd": {"host": "s"}}, {}, section="statsd", env={"SCRUTINY_STATSD_PORT": "9"})
    assert (got.host, got.port) == ("s", 9)
    with pytest.raises(ConfigError, match=r"agent\.source: 'tape' is not one of dbledgerstorage, bridge, synthetic"):
        checked(build(AgentSettings, {"agent": {"bookie_id": "b:3181", "source": "tape"}}, {}, section="agent")
                .validate())
    for source, lacking in (("dbledgerstorage", "ledger directory"), ("bridge", "--bookie-address"),
                            ("synthetic", "--synthetic-file")):
        with pytest.raises(ConfigError, match=lacking):
            checked(AgentSettings(bookie_id="b:3181", source=source).validate())
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        checked(AgentSettings(bookie_id="b:3181", source="bridge", bookie_address="nowhere"))
    with pytest.raises(ConfigError, match="one to one"):
        AgentSettings(bookie_id="b:3181", source="dbledgerstorage", ledger_dirs=("/d0",), index_dirs=("/i0", "/i1")
                      ).validate()
    agent = checked(build(AgentSettings, {"agent": {"bookie_id": "b:3181", "source": "dbledgerstorage",
                                                    "ledger_dirs": ["/d0", "/d1"]}}, {}, section="agent").validate())
    assert agent.ledger_dirs == ("/d0", "/d1")
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        ScanSettings(metadata_service_uri="zk://a:1/l", bookie_endpoints={"b:1": "nowhere"}).validate()


# -- the registry ---------------------------------------------------------------------------------

def test_the_registry_drives_the_report() -> None:
    assert set(REGISTRY) == set(Category)
    assert in_phase(Phase.MARKS) == (Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD,)
    assert Category.PLACEMENT_POLICY_NOT_ADHERING not in resting_on(Fact.ANSWERS)
    assert Category.NO_REPLICA_OF_AN_ENTRY in resting_on(Fact.ANSWERS) & resting_on(Fact.METADATA)
    from scrutiny.checks import Violation

    soft = Violation(Category.PLACEMENT_POLICY_SOFTLY_ADHERING, 1, (), {"segments": []})
    assert spec(soft.category).warning and report(violations=[soft]).exit_status() == 0
    age = Violation(Category.UNDERREPLICATED_ELAPSED_GRACE_PERIOD, 2, (),
                    {"age_seconds": 9, "grace_period_seconds": 5})
    text = report(violations=[age]).render_text()
    assert "marked 9 s ago, grace period 5 s" in text and report(violations=[age]).exit_status() == 1


# -- a second store: one module plus a URI scheme -----------------------------------------------------

def test_a_scan_over_another_metadata_store(tmp_path: Path) -> None:
    from scrutiny.agent import BookieAgent
    from scrutiny.entrysources import SyntheticStore
    from scrutiny.entrysources.synthetic import SyntheticStoreWriter

    memstore.install()
    cluster = memstore.MemoryCluster()
    memstore.CLUSTERS["c1"] = cluster
    ens = ("m1:3181", "m2:3181", "m3:3181")
    writer = SyntheticStoreWriter()
    for lid in range(1, 8):
        md = LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, 49, 0, (Segment(0, ens),))
        cluster.ledgers[lid] = md
        for b in ens:
            if not (lid == 5 and b == "m3:3181"):  # ledger 5 lost a copy
                writer.add(b, lid, expected_share(md, b))
    cluster.bookies = {b: BookieRegistration(b, False) for b in ens}
    cluster.marks[6] = UnderreplicationMark(6, ("m1:3181",), 1)
    settings = ScanSettings(metadata_service_uri="mem://c1", engine="local", placement_policy="none",
                            underreplicated_grace_period=60, recheck_delay=0.1)
    agents = []
    try:
        with open_store(settings) as store:
            for b, path in writer.write_all(tmp_path).items():
                agents.append(BookieAgent(SyntheticStore(path), bind="127.0.0.1:0").start())
                agents[-1].register(store, b, f"127.0.0.1:{agents[-1].port}")
        got = ScrutinyRun(settings, LocalEngine()).execute()
    finally:
        for a in agents:
            a.stop(grace=0)
        del memstore.CLUSTERS["c1"]
    assert got.complete and got.ledgers["checked"] == 6 and got.ledgers["skipped_underreplicated"] == 1
    assert {(str(v.category), v.ledger_id) for v in got.violations} == {
        ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 5), ("UNDERREPLICATED_ELAPSED_GRACE_PERIOD", 6)}
    with pytest.raises(ConfigError, match=r"unknown store 'etcd'.*BookKeeper's own etcd driver"):
        open_store(ScanSettings(metadata_service_uri="etcd://x:2379/ledgers"))  # not Pulsar's layout


def test_runs_awaiting_their_recheck_are_abandoned_at_shutdown() -> None:
    closed: list[str] = []
    timers: list[Any] = []
    q = RunQueue(lambda t: Later(60, lambda: report(t.run_id), lambda: closed.append(t.run_id)),
                 lambda t, r: None, lambda delay, fn: timers.append(fn), lambda t, e: report(t.run_id))
    q.start()
    ticket, _ = q.submit(Ticket("full", run_id="waits"))
    wait_for(lambda: q.awaiting_recheck == [ticket])
    assert q.stop(5)
    q.abandon_rechecks()
    assert closed == ["waits"]  # its store session closed, not left to reconnect forever


def test_the_report_streamed_a_finding_at_a_time_is_the_same_json() -> None:
    found = [Violation(Category.NO_REPLICA_OF_AN_ENTRY, i, ("b1:3181",), {"entries": [[i, i + 1]]}) for i in range(3)]
    for violations in (found, []):
        r = Report("r1", "s", "f", True, {"checked": 3}, Findings(violations), stats={"x": 1},
                   blast_radius={"bookies": {}, "racks": {}})
        streamed = json.loads(r.dumps())
        assert streamed == r.to_json() and Report.from_json(streamed).to_json() == r.to_json()
