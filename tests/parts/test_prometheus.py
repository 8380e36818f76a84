"""Where operators look: /metrics on the auditor and the agent, the alert rules (Debian's promtool),
the Grafana dashboard's queries, and a real Prometheus scraping a running auditor and agent."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from prometheus_client import CollectorRegistry, Counter

from scrutiny.agent import AgentMetrics, BookieServicer
from scrutiny.auditor import Auditor, AuditorSettings
from scrutiny.auditor.collector import collectors
from scrutiny.auditor.sinks import FinishedRun, RunTallies
from scrutiny.categories import REGISTRY, Category
from scrutiny.checks import Violation
from scrutiny.config import ConfigError, MetricsSettings, ScanSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.deeppass import DeepPass
from scrutiny.findings import Findings
from scrutiny.httpserver import HttpServer
from scrutiny.metricnames import PREFIX, family_names
from scrutiny.report import Report
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_on
from scrutiny.testing.demo import DemoCluster, build_demo_cluster, demo_agents
from scrutiny.testing.localzk import LocalZooKeeper
from tests.support.helpers import wait_for
from tests.support.metrics import sample, scrape
from tests.support.prometheus import RULES, Prometheus

ROOT = Path(__file__).resolve().parents[2]
METRIC = re.compile(r"\b((?:scrutiny|auditor)_[A-Za-z_]+)\b")


def a_run(kind: str = "full", whole: bool = True) -> FinishedRun:
    violations = [Violation(Category.NO_REPLICA_OF_AN_ENTRY, 7, ("b1:3181",)),
                  Violation(Category.BOOKIE_UNAVAILABLE, 8, ("b2:3181",)),
                  Violation(Category.BOOKIE_UNAVAILABLE, 9, ("b2:3181",)),
                  Violation(Category.ORPHAN_LEDGER, 10, ("b1:3181", "b3:3181"),
                            {"held_by": {"b1:3181": {"entries": 5, "bytes": 500}, "b3:3181": {"entries": 4}}}),
                  Violation(Category.ORPHAN_LEDGER, 11, ("b1:3181",), {"held_by": {"b1:3181": {"entries": 2}}}),
                  Violation(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, 12, ("b4:3181",), {"below_ack_quorum": True}),
                  Violation(Category.LOST_BOOKIE_RECOVERY_NOT_STARTED, 13, ("b4:3181",), {"below_ack_quorum": False})]
    report = Report("r1", "s", "f", True, {"checked": 40}, Findings(violations),
                    stats={"first_pass_ms": 1500, "bookie_calls_failed": 3, "underreplicated_marks": 2,
                           "pulsar_leaked_ledgers": 1, "pulsar_leaked_bytes": 4096},
                    blast_radius={"bookies": {"b1:3181": {"ledgers_below_aq": 5, "ledgers_without_a_copy": 1,
                                                          "topics_below_aq": 2, "topics_without_a_copy": 1}},
                                  "racks": {}})
    return FinishedRun(kind, report, 2500, tuple(REGISTRY), whole)


class Exported:
    """What an auditor exports, served as it serves it: the tallies its runs feed, its collector, an HTTP
    server; `sink` is what the auditor tells of its runs."""

    def __init__(self, current: Any = None, continuous: Any = None) -> None:
        self.sink = RunTallies()
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in collectors(self.sink, current, continuous):
            self.registry.register(collector)
        self.server = HttpServer("127.0.0.1:0", self.registry)
        self.port = self.server.port

    def close(self) -> None:
        self.server.close()


def test_the_auditor_sink_exports_bookkeepers_names_and_its_own() -> None:
    exported = Exported()
    sink = exported.sink
    try:
        sink.leadership(True)
        sink.published(a_run())
        text = scrape(exported.port)
        assert sample(text, "auditor_NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY") == 1
        assert sample(text, "scrutiny_violations", '{category="NO_REPLICA_OF_AN_ENTRY"}') == 1
        assert sample(text, "scrutiny_violations", '{category="LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY"}') == 0
        assert sample(text, "scrutiny_bookie_unavailable_ledgers", '{bookie="b2:3181",silence="down"}') == 2
        assert sample(text, "scrutiny_runs_total", '{kind="full",outcome="complete"}') == 1
        assert sample(text, "scrutiny_ledgers_checked_total") == 40
        assert sample(text, "scrutiny_last_run_phase_seconds", '{kind="full",phase="first_pass"}') == 1.5
        assert sample(text, "scrutiny_underreplicated_ledgers") == 2 and sample(text, "scrutiny_leader") == 1
        assert sample(text, "scrutiny_blast_radius_ledgers", '{impact="below_aq",name="b1:3181",scope="bookie"}') == 5
        assert sample(text, "scrutiny_lost_bookie_ledgers", '{bookie="b4:3181"}') == 2
        assert sample(text, "scrutiny_lost_bookie_ledgers_below_aq", '{bookie="b4:3181"}') == 1
        assert "ledger_id" not in text and "=\"7\"" not in text  # bounded labels: never a ledger id
        # a rescan of some ledgers counts, but does not replace the whole cluster's gauges
        rescan = Report("r2", "s", "f", True, {"checked": 1}, Findings())
        sink.published(FinishedRun("rescan", rescan, 5, tuple(REGISTRY), whole_cluster=False))
        text = scrape(exported.port)
        assert sample(text, "scrutiny_violations", '{category="NO_REPLICA_OF_AN_ENTRY"}') == 1
        assert sample(text, "scrutiny_ledgers_checked_total") == 41
        sink.leadership(False)  # a standby: its leadership and nothing stale
        text = scrape(exported.port)
        assert sample(text, "scrutiny_leader") == 0
        assert "scrutiny_violations{" not in text and "auditor_NUM" not in text
        assert "scrutiny_last_complete_run_age_seconds{" not in text
    finally:
        exported.close()


def test_a_new_leader_exports_the_inherited_run_with_its_true_age_until_it_has_its_own() -> None:
    exported = Exported()
    sink = exported.sink
    try:
        sink.leadership(True)
        ten_minutes_ago = int(time.time() * 1000) - 600_000
        sink.restored(FinishedRun("full", a_run().report, 2500, tuple(REGISTRY), finished_ms=ten_minutes_ago,
                                  ran_by="a1:3192").summary)
        text = scrape(exported.port)
        assert sample(text, "auditor_NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY") == 1
        assert sample(text, "scrutiny_bookie_unavailable_ledgers", '{bookie="b2:3181",silence="down"}') == 2
        assert sample(text, "scrutiny_blast_radius_ledgers", '{impact="below_aq",name="b1:3181",scope="bookie"}') == 5
        assert sample(text, "scrutiny_orphan_ledgers", '{bookie="b1:3181"}') == 2  # a new leader has the orphans
        assert sample(text, "scrutiny_orphan_entries", '{bookie="b1:3181"}') == 7
        assert sample(text, "scrutiny_orphan_bytes", '{bookie="b1:3181"}') == 500
        assert sample(text, "scrutiny_orphan_bytes", '{bookie="b3:3181"}') == 0  # not known there
        assert 599 < (sample(text, "scrutiny_last_complete_run_age_seconds", '{kind="full"}') or 0) < 700
        assert sample(text, "scrutiny_runs_total", '{kind="full",outcome="complete"}') is None  # not run here
        empty = Report("r2", "s", "f", True, {"checked": 1}, Findings())
        sink.published(FinishedRun("full", empty, 5, tuple(REGISTRY)))
        sink.restored(FinishedRun("full", a_run().report, 2500, tuple(REGISTRY), finished_ms=ten_minutes_ago,
                                  ran_by="a1:3192").summary)  # older than its own run: ignored
        text = scrape(exported.port)
        assert sample(text, "auditor_NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY") == 0
        assert (sample(text, "scrutiny_last_complete_run_age_seconds", '{kind="full"}') or 999) < 60
    finally:
        exported.close()


def test_metrics_never_take_the_bookies_port() -> None:
    with pytest.raises(ConfigError, match="8000"):
        MetricsSettings(listen="0.0.0.0:8000").validate()


def test_alert_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "make setup installs Debian's prometheus (promtool)"
    for args in (["check", "rules", "scrutiny-rules.yml"], ["test", "rules", "scrutiny-rules.test.yml"]):
        res = subprocess.run([promtool, *args], cwd=RULES, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


def test_the_leader_exports_every_category_the_rules_name_at_0_when_none() -> None:
    exported = Exported()
    try:
        exported.sink.leadership(True)
        exported.sink.published(a_run())
        text = scrape(exported.port)
        named = set(re.findall(r'category(?:="|=~")([A-Z_|]+)"', (RULES / "scrutiny-rules.yml").read_text()))
        for category in {c for alt in named for c in alt.split("|")}:
            assert sample(text, "scrutiny_violations", f'{{category="{category}"}}') is not None, category
        assert sample(text, "scrutiny_violations", '{category="UNMARKED_WITHOUT_REPAIR"}') == 0
    finally:
        exported.close()


def leading_with_every_kind_of_run() -> tuple[RunTallies, Any, Any]:
    """A leader's tallies after every kind of run, its current state and continuous scrutiny: each collector has
    something to say."""
    from scrutiny.auditor.continuous import Continuous
    from scrutiny.auditor.currentstate import CurrentState

    current, sink = CurrentState(), RunTallies()
    continuous = Continuous(ScanSettings(metadata_service_uri="zk://127.0.0.1:1/ledgers"), AuditorSettings(),
                            current, lambda why: None)
    sink.leadership(True)
    sink.published(a_run())
    deep = a_run("deep")
    deep.report.stats.update(DeepPass.fresh(4, 0).after_run(0, 1000).stats(), deep_bytes_read=10)
    sink.published(deep)
    sink.skipped("full", "still_running")
    return sink, current, continuous


def exported() -> set[str]:
    """Every name the auditor and the agent export once they have something to say."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors(*leading_with_every_kind_of_run()):
        registry.register(collector)
    names = family_names(registry)
    agent = BookieServicer(source=None, metrics=AgentMetrics())  # type: ignore[arg-type]
    agent.metrics.requests.labels("x").inc()
    agent.metrics.answers.labels("EOK").inc()
    agent.metrics.catch_up.observe(0.001)
    agent.metrics.verified_bytes.inc(10)
    agent.metrics.corrupt.labels("bad-digest").inc()
    return names | family_names(agent.metrics.registry)


def test_each_collector_describes_exactly_the_families_it_collects() -> None:
    everything = collectors(*leading_with_every_kind_of_run())
    for collector in everything:
        described = [f.name for f in collector.describe()]
        assert described and len(set(described)) == len(described), type(collector).__name__
        assert {f.name for f in collector.collect()} == set(described), type(collector).__name__
    registry = CollectorRegistry()  # describe() lets the registry refuse two collectors naming one family
    for collector in everything:
        registry.register(collector)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(everything[0])


def test_the_contract_names_every_metric_family_exported() -> None:
    contract = (ROOT / "docs" / "contract.md").read_text()
    families = {re.sub(r"_(bucket|count|sum|created)$", "", n) for n in exported()}
    missing = [f for f in sorted(families) if f not in contract and f.removesuffix("_total") not in contract]
    assert not missing, missing


def test_every_dashboard_and_rule_query_names_an_exported_metric() -> None:
    names = exported()
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "scrutiny-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += re.findall(r"expr: (.+)", (RULES / "scrutiny-rules.yml").read_text())
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used and used <= names, used - names
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    assert all(w in titles for w in ("violations", "runs", "duration", "unavailable", "blast radius", "deep scrub"))


# -- a real Prometheus -----------------------------------------------------------------------------

@pytest.fixture
def cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
            tmp_path: Path) -> Iterator[tuple[DemoCluster, str, list[Any]]]:
    demo = build_demo_cluster(zk_client, f"{zk_namespace}/ledgers", tmp_path / "stores", healthy=60)
    uri = f"zk+hierarchical://{zk_server.hosts}{zk_namespace}/ledgers"
    with demo_agents(demo, store_on(zk_client, uri)) as agents:
        yield demo, uri, agents


def test_a_real_prometheus_scrapes_the_auditor_and_an_agent(cluster: tuple[DemoCluster, str, list[Any]],
                                                            tmp_path: Path) -> None:
    demo, uri, agents = cluster
    agent_port = agents[0].serve_metrics("127.0.0.1:0")
    scan = ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.3, underreplicated_grace_period=3600)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"),
                               underreplication_interval_seconds=0, insecure_open_rescan=True)
    auditor = Auditor(scan, settings, metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb,
                      engine=LocalEngine()).start()
    prom = None
    try:
        assert auditor.http is not None
        prom = Prometheus(tmp_path, {"auditor": auditor.http.port, "agent": agent_port})
        wait_for(lambda: "full" in auditor.last, 60)
        wait_for(lambda: prom.value('scrutiny_runs_total{kind="full"}') == 1, 30)
        assert prom.value('scrutiny_violations{category="NO_REPLICA_OF_AN_ENTRY"}') == 1
        assert prom.value("auditor_NUM_LEDGERS_HAVING_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY") == 2
        assert prom.value("scrutiny_leader") == 1
        assert prom.value("sum(scrutiny_bookie_unavailable_ledgers)") == 2  # demo ledgers 9005 and 9006
        assert prom.value("scrutiny_ledgers_checked_total") == demo.checked
        wait_for(lambda: (prom.value("sum(scrutiny_agent_answers_total)") or 0) > 0, 30)  # its own scrape
        wait_for(lambda: "ScrutinyDataAtRisk" in prom.firing(), 30)
    finally:
        if prom is not None:
            prom.close()
        auditor.stop()


def test_data_at_risk_keeps_firing_across_a_rolling_restart(cluster: tuple[DemoCluster, str, list[Any]],
                                                            tmp_path: Path) -> None:
    """The leader goes (released leadership, as a rolling restart does), the standby leads: Prometheus
    sees the same violation gauges from it at once, the age goes on, and the alert never resolves."""
    _, uri, _ = cluster
    scan = ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.3, underreplicated_grace_period=3600)
    auditors, prom = [], None
    try:
        for i in range(2):
            settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / f"reports{i}"),
                                       full_interval_seconds=3600, underreplication_interval_seconds=0,
                                       insecure_open_rescan=True)
            auditors.append(Auditor(scan, settings, metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb,
                                    engine=LocalEngine()).start())
            wait_for(lambda: auditors[0].leading.is_set())
        first, second = auditors
        ports = {f"a{i}": a.http.port
                 for i, a in enumerate(auditors)}
        prom = Prometheus(tmp_path, ports)
        wait_for(lambda: "full" in first.last, 60)
        wait_for(lambda: "ScrutinyDataAtRisk" in prom.firing(), 30)
        since = prom.active_since("ScrutinyDataAtRisk")
        age_before = prom.value('scrutiny_last_complete_run_age_seconds{job="a0",kind="full"}')
        first.stop()
        wait_for(lambda: second.leading.is_set(), 30)
        at_risk = 'scrutiny_violations{job="a1",category="NO_REPLICA_OF_AN_ENTRY"}'
        wait_for(lambda: prom.value(at_risk) == 1, 30)
        assert "full" not in second.last  # no run of its own: the inherited one
        age_after = prom.value('scrutiny_last_complete_run_age_seconds{job="a1",kind="full"}')
        assert age_before is not None and age_after is not None and age_after >= age_before
        time.sleep(2)  # a few evaluations with the new leader's series
        assert "ScrutinyDataAtRisk" in prom.firing() and prom.active_since("ScrutinyDataAtRisk") == since
    finally:
        if prom is not None:
            prom.close()
        for a in auditors:
            a.stop()


def test_metrics_are_served_in_the_format_the_scraper_asks_for() -> None:
    """prometheus_client's own application answers /metrics: OpenMetrics to a scraper that asks for it,
    text 0.0.4 to one that asks for that, gzip when accepted."""
    import gzip

    registry = CollectorRegistry()
    Counter(f"{PREFIX}asked", "asked", registry=registry).inc()
    endpoint = HttpServer("127.0.0.1:0", registry)
    try:
        def get(**headers: str) -> tuple[str, str, bytes]:
            req = urllib.request.Request(f"http://127.0.0.1:{endpoint.port}/metrics", headers=headers)
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.headers["Content-Type"], resp.headers.get("Content-Encoding", ""), resp.read()

        kind, _, body = get(Accept="application/openmetrics-text; version=1.0.0")
        assert kind.startswith("application/openmetrics-text; version=1.0.0") and body.endswith(b"# EOF\n")
        kind, _, body = get(Accept="text/plain;version=0.0.4")
        assert kind.startswith("text/plain; version=0.0.4") and b"scrutiny_asked_total 1.0" in body
        kind, encoding, body = get(Accept="text/plain;version=0.0.4", **{"Accept-Encoding": "gzip"})
        assert encoding == "gzip" and b"scrutiny_asked_total 1.0" in gzip.decompress(body)
    finally:
        endpoint.close()


def test_an_application_that_fails_is_a_500_that_shows_no_internals() -> None:
    endpoint = HttpServer("127.0.0.1:0", CollectorRegistry())

    def failing(req: Any) -> Any:
        raise KeyError("secret-internal-state")

    endpoint.app = failing
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/ledgers/1", timeout=10)
        body = err.value.read().decode()
        assert err.value.code == 500 and "its log says why" in json.loads(body)["error"]
        assert "secret" not in body and "KeyError" not in body
    finally:
        endpoint.close()
