"""The operator's console, as an operator meets it: a real auditor on a real ZooKeeper with real agents,
read with a real HTTP client (and HTTPS, with the RPC's own certificate); the verdict for a healthy
cluster and one at risk, what is new and resolved across runs, the history chart, the bookies' states
(answering, slow, down, unregistered), a ledger's page (healthy, at fault, not checked yet, missing)
and every refusal as a JSON 4xx."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kazoo.client import KazooClient

from scrutiny.agent import BookieAgent
from scrutiny.auditor import Auditor
from scrutiny.checks.sequences import MessageCheckpoint, ProducerState
from scrutiny.config import AuditorSettings, ClusterSettings, MetricsSettings, ScanSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.metadata import (
    BookieRegistration,
    LedgerMetadata,
    LedgerState,
    Segment,
    UnderreplicationMark,
    parse_metadata_service_uri,
)
from scrutiny.pulsar import encode
from scrutiny.pulsar.records import LedgerInfo, Position
from scrutiny.scan.engines import LocalEngine
from scrutiny.scan.messages import checkpoint_record
from scrutiny.store import MetadataStore, open_store
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.holdings import MutableHoldings, share
from scrutiny.testing.localzk import LocalZooKeeper
from tests.support.certs import CertificateAuthority
from tests.support.helpers import wait_for
from tests.support.slow_agent import SlowSource

pytestmark = pytest.mark.slow
B1, B2, B3, B4, B5 = (f"127.0.8.{n}:3181" for n in range(1, 6))
TOKEN = "console-token"


def md(lid: int, ensemble: tuple[str, ...] = (B1, B2, B3), state: LedgerState = LedgerState.CLOSED,
       last: int = 29, managed_ledger: str = "") -> LedgerMetadata:
    topic = (managed_ledger or f"public/console/persistent/t{lid % 2}").encode()
    return LedgerMetadata(lid, state, 3, 2, 2, last, 3000, (Segment(0, ensemble),), custom_metadata=(
        ("application", b"pulsar"), ("component", b"managed-ledger"), ("pulsar/managed-ledger", topic)))


@dataclass
class Console:
    writer: ClusterWriter
    holdings: dict[str, MutableHoldings]
    agents: dict[str, BookieAgent]
    auditor: Auditor
    base: str
    bookies: Bookies | None = None

    def get(self, path: str, html: bool = False) -> tuple[int, Any]:
        req = urllib.request.Request(f"{self.base}{path}", headers={"Accept": "text/html"} if html else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                text, status = resp.read().decode(), resp.status
        except urllib.error.HTTPError as exc:
            text, status = exc.read().decode(), exc.code
        return status, text if html else json.loads(text)

    def stop(self) -> None:
        self.auditor.stop()
        if self.bookies is not None:
            self.bookies.stop()
        else:
            for agent in self.agents.values():
                agent.stop(grace=0)

    def full_run(self) -> None:
        before = self.auditor.last.get("rescan")
        self.auditor.rescan(None, "")
        wait_for(lambda: self.auditor.last.get("rescan") is not before
                 and self.auditor.last["rescan"].report is not None, 60)


@dataclass
class Bookies:
    """A cluster's metadata (`writer`) and its bookies' agents over holdings the test changes."""

    writer: ClusterWriter
    uri: str
    holdings: dict[str, MutableHoldings]
    agents: dict[str, BookieAgent]
    registry: MetadataStore  # where the agents registered
    own_registry: bool = False

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop(grace=0)
        if self.own_registry:
            self.registry.close()


def start_bookies(client: Any, root: str, uri: str, ledgers: list[LedgerMetadata], registered: tuple[str, ...],
                  agents_for: tuple[str, ...], slow: tuple[str, ...] = ()) -> Bookies:
    """On ZooKeeper (`client` a KazooClient) or on etcd (the tests' EtcdTree)."""
    w = ClusterWriter(client, root)
    w.init_cluster()
    w.write_ledgers(ledgers)
    holdings = {b: MutableHoldings() for b in agents_for}
    for m in ledgers:
        if m.state is LedgerState.CLOSED:
            for b in m.bookies & set(agents_for):
                holdings[b].put(m.ledger_id, share(m, b))
    own = not isinstance(client, KazooClient)
    registry = open_store(ClusterSettings(metadata_service_uri=uri, etcd_lease_ttl=5)) if own else store_on(client, uri)
    agents = {}
    for b in agents_for:
        source: Any = SlowSource(holdings[b], 3.0) if b in slow else holdings[b]  # type: ignore[arg-type]
        agents[b] = BookieAgent(source, bind="127.0.0.1:0", watch_interval_seconds=0.2).start()
        agents[b].register(registry, b, f"127.0.0.1:{agents[b].port}")
    for b in registered:
        w.register_bookie(BookieRegistration(b, False))
    w.write_racks({B1: "/r1", B2: "/r1", B3: "/r2", B4: "/r2", B5: "/r3"}, parse_metadata_service_uri(uri).racks_path)
    return Bookies(w, uri, holdings, agents, registry, own)


def start_cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path,
                  ledgers: list[LedgerMetadata], registered: tuple[str, ...], agents_for: tuple[str, ...],
                  slow: tuple[str, ...] = (), scan_extra: dict[str, Any] | None = None,
                  auditor_extra: dict[str, Any] | None = None, https: bool = False) -> Console:
    root = f"{zk_namespace}/ledgers"
    bookies = start_bookies(zk_client, root, f"zk+hierarchical://{zk_server.hosts}{root}", ledgers, registered,
                            agents_for, slow)
    return audited(bookies, tmp_path, scan_extra, auditor_extra, https)


def audited(bookies: Bookies, tmp_path: Path, scan_extra: dict[str, Any] | None = None,
            auditor_extra: dict[str, Any] | None = None, https: bool = False) -> Console:
    """The cluster, and an auditor over it serving the console (its first full run done)."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    scan = ScanSettings(**{"metadata_service_uri": bookies.uri, "engine": "local", "placement_policy": "none",
                           "recheck_delay": 0.3, "write_cache_grace_seconds": 0.3, "orphan_check": False,
                           "bookie_deadline_seconds": 1.0, **(scan_extra or {})})
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), token_file=str(token),
                               underreplication_interval_seconds=0, continuous_batch_seconds=0.3,
                               **(auditor_extra or {}))
    a = Auditor(scan, settings, metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb,
                engine=LocalEngine()).start()
    wait_for(lambda: "full" in a.last and a.last["full"].report is not None, 60)
    port = a.http.port
    return Console(bookies.writer, bookies.holdings, bookies.agents, a,
                   f"{'https' if https else 'http'}://127.0.0.1:{port}", bookies)


@pytest.fixture
def healthy(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
            tmp_path: Path) -> Iterator[Console]:
    """Ledgers 1-6 with every copy in place on B1-B3; ledger 50 still open."""
    c = start_cluster(zk_server, zk_client, zk_namespace, tmp_path,
                      [*(md(lid) for lid in range(1, 7)), md(50, state=LedgerState.OPEN, last=-1)],
                      (B1, B2, B3), (B1, B2, B3))
    try:
        yield c
    finally:
        c.stop()


def test_the_verdict_new_and_resolved_findings_and_the_history(healthy: Console) -> None:
    c = healthy
    status, now = c.get("/api/v1/current")
    assert status == 200 and now["verdict"]["level"] == "HEALTH_OK", now["verdict"]
    status, page = c.get("/", html=True)
    assert status == 200 and 'class="verdict HEALTH_OK"' in page and "<svg id=\"history\"" in page
    # a copy silently gone: acknowledged data below its ack quorum
    c.holdings[B1].drop(2)
    c.full_run()
    status, now = c.get("/api/v1/current")
    assert now["verdict"]["level"] == "HEALTH_ERR" and now["verdict"]["by_severity"]["critical"] == 1, now["verdict"]
    assert {(v["category"], v["ledger_id"]) for v in now["violations"]} == {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 2)}
    status, page = c.get("/", html=True)
    assert 'class="verdict HEALTH_ERR"' in page and "acknowledged data at risk now: 1 ledger below" in page
    new = page.split("What is new since")[1].split('id="resolved"')[0]
    assert 'href="/ledgers/2"' in new and "sev-critical" in new
    # repaired: resolved since the previous run
    c.holdings[B1].put(2, share(md(2), B1))
    c.full_run()
    wait_for(lambda: c.get("/api/v1/current")[1]["verdict"]["level"] == "HEALTH_OK", 30)
    status, page = c.get("/", html=True)
    resolved = page.split('id="resolved"')[1].split("</table>")[0]
    assert 'href="/ledgers/2"' in resolved and "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY" in resolved
    status, history = c.get("/api/v1/history")
    assert [r["kind"] for r in history["runs"]] == ["full", "rescan", "rescan"], history
    assert [r["counts"] for r in history["runs"]] == [{}, {"LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY": 1}, {}]
    chart = page.split('<svg id="history"')[1].split("</svg>")[0]
    assert chart.count("<polyline") == 1 and "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY" in chart


def test_a_ledgers_page_says_healthy_at_fault_not_checked_or_missing(healthy: Console) -> None:
    c = healthy
    c.holdings[B2].drop(3)
    c.full_run()
    status, doc = c.get("/api/v1/ledgers/1?ask=1")
    assert status == 200 and doc["checked"] == "healthy" and doc["metadata"]["ensemble_size"] == 3
    held = {copy["bookie"]: copy for copy in doc["segments"][0]["copies"]}
    assert set(held) == {B1, B2, B3} and all(not cp["missing"] and cp["held"] for cp in held.values())
    status, doc = c.get("/api/v1/ledgers/3?ask=1")
    assert doc["checked"] == "at fault" and doc["current"][0]["category"] == "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"
    lacking = {copy["bookie"]: copy for copy in doc["segments"][0]["copies"]}[B2]
    assert lacking["answer"] == "it holds no such ledger"
    assert lacking["missing"] == [[a, a + 1] for a in range(0, 28, 3)]  # B2's share (position 1 of 3, WQ 2): all
    status, page = c.get("/ledgers/3", html=True)
    assert status == 200 and "at fault" in page and 'class="missing"' in page and "sev-critical" in page
    # its remedy: B2's whole share gone, the first entry its checker reads among it
    fix = doc["current"][0]["remedy"]
    assert fix["commands"] == [f"bin/bookkeeper shell recover {B2} -l 3"] and fix["autorecovery"] == "yes"
    assert f"recover {B2} -l 3</code>" in page and "autorecovery, if marked" in page
    # one copy lost mid-share: BookKeeper's checker (percentage 0) reads only the share's ends, both held
    c.holdings[B1].drop(4)
    c.holdings[B1].put(4, np.setdiff1d(share(md(4), B1), [3]))
    c.full_run()
    _, report = c.get("/api/v1/report?kind=rescan")
    assert report["repair"]["auditor_ledger_verification_percentage"] == 0
    fix = next(v["remedy"] for v in report["violations"] if v["ledger_id"] == 4)
    assert fix["autorecovery"] == "no" and fix["commands"] == [f"bin/bookkeeper shell recover {B1} -l 4"]
    status, doc = c.get("/api/v1/ledgers/50")
    assert doc["checked"] == "not checked yet" and "open" in doc["why"]
    # closed after the last full run: not checked yet until a look
    c.writer.write_ledgers([md(7)])
    status, doc = c.get("/api/v1/ledgers/7")
    assert doc["checked"] == "not checked yet" and "after the last full run" in doc["why"]
    status, doc = c.get("/api/v1/ledgers/424242")
    assert status == 404 and "no such ledger" in doc["error"]
    status, page = c.get("/ledgers/424242", html=True)
    assert status == 404 and "no such ledger" in page and "<html" in page


@pytest.fixture
def troubled(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
             tmp_path: Path) -> Iterator[Console]:
    """B1, B2 answering; B3 registered, its agent stopped; B4 registered, its agent slower than the
    deadline; B5 named by ledgers and registered nowhere (its agent up)."""
    ledgers = [md(1, (B1, B2, B3)), md(2, (B1, B2, B4)), md(3, (B1, B2, B5)), md(4, (B1, B2, B3))]
    c = start_cluster(zk_server, zk_client, zk_namespace, tmp_path, ledgers, (B1, B2, B3, B4),
                      (B1, B2, B3, B4, B5), slow=(B4,), auditor_extra={"continuous": False},
                      scan_extra={"bookie_deadline_seconds": 0.5})  # re-checked within 1.5 s: B4 takes 3
    try:
        c.agents[B3].stop(grace=0)
        c.full_run()
        yield c
    finally:
        c.stop()


def test_the_bookies_and_their_states(troubled: Console) -> None:
    c = troubled
    status, doc = c.get("/api/v1/bookies")
    states = {b["bookie"]: b for b in doc["bookies"]}
    assert {b: s["state"] for b, s in states.items()} == {B1: "answering", B2: "answering", B3: "down", B4: "slow",
                                                          B5: "unregistered"}, doc
    assert states[B1]["ledgers"] == 4 and states[B1]["rack"] == "/r1" and states[B1]["registered"] == "writable"
    assert states[B3]["findings"] == {"BOOKIE_UNAVAILABLE": 2} and "could not be reached" in states[B3]["why"]
    assert "slow" in states[B4]["why"] and "UNAVAILABLE:" not in states[B4]["why"]  # in words, not gRPC's
    assert states[B5]["registered"] == "no" and states[B5]["ledgers"] == 1
    status, page = c.get("/bookies", html=True)
    assert status == 200 and page.count('class="bookie"') == 5 and '<svg id="racks"' in page
    rows = {r.split(">", 2)[1].split("<")[0]: r for r in page.split('<tr class="bookie"><td>')[1:]}
    for b, state in ((B3, "down"), (B4, "slow"), (B5, "unregistered")):
        assert f'class="st st-{state}"' in rows[b], (b, rows[b])
    # the blast radius no longer calls a silent bookie safe by leaving it out
    status, page = c.get("/blast-radius", html=True)
    silent = page.split('id="silent"')[1].split("</p>")[0]
    assert B3 in silent and B4 in silent


def test_every_link_leads_to_its_subset(troubled: Console) -> None:
    c = troubled
    status, page = c.get("/blast-radius?scope=racks", html=True)
    assert status == 200 and 'href="/findings?rack=%2Fr2"' in page
    _, by_rack = c.get("/api/v1/report?kind=rescan&rack=/r2")
    _, by_bookies = c.get("/api/v1/report?kind=rescan")
    on_r2 = {v["ledger_id"] for v in by_bookies["violations"] if {B3, B4} & set(v["bookies"])}
    assert on_r2 and {v["ledger_id"] for v in by_rack["violations"]} == on_r2
    status, page = c.get("/findings?kind=rescan&rack=/r2", html=True)
    assert status == 200 and page.count('class="finding') == len(on_r2) and "the bookies of rack /r2" in page
    _, page = c.get("/findings?kind=rescan", html=True)
    topic = "persistent://public/console/t0"
    assert f'href="/findings?topic={topic.replace(":", "%3A").replace("/", "%2F")}"' in page
    _, by_topic = c.get(f"/api/v1/report?kind=rescan&topic={topic}")
    assert {v["ledger_id"] for v in by_topic["violations"]} == {v["ledger_id"] for v in by_bookies["violations"]
                                                               if v["ledger_id"] % 2 == 0}
    _, csv = c.get("/findings.csv?kind=rescan&category=BOOKIE_UNAVAILABLE", html=True)
    lines = csv.strip().splitlines()
    assert lines[0].startswith("ledger_id,category,severity") and len(lines) - 1 == by_bookies["counts"][
        "BOOKIE_UNAVAILABLE"]


@pytest.mark.parametrize(("method", "path", "headers", "body", "code", "words"), [
    ("GET", "/ledgers/18446744073709551616", {}, b"", 400, "ledger ids are 0 .. 2^63-1"),
    ("GET", "/api/v1/ledgers/99999999999999999999999", {}, b"", 400, "ledger ids are 0 .. 2^63-1"),
    ("GET", "/findings?page=100000000000000000000", {}, b"", 400, "page is 1 or more"),
    ("GET", "/api/v1/report?page=9223372036854775807&page_size=1000", {}, b"", 400, "page is 1 or more"),
    ("POST", "/api/v1/rescan", {"Content-Length": "abc"}, None, 400, "Content-Length"),
    ("POST", "/api/v1/rescan", {"Content-Length": "1e9"}, None, 400, "Content-Length"),
    ("POST", "/api/v1/rescan", {"Content-Length": "1000000000"}, None, 413, "exceeds the maximum allowed bytes"),
    ("POST", "/api/v1/rescan", {}, b'{"ledgers": [18446744073709551616]}', 400, "ledger ids are 0 .. 2^63-1"),
    ("GET", "/api/v1/nope", {}, b"", 404, "no such call"),
    ("GET", "/api/v2/status", {}, b"", 404, "no such call"),
    ("PUT", "/api/v1/rescan", {}, b"{}", 405, "PUT is not served"),
    ("DELETE", "/", {}, b"", 405, "DELETE is not served"),
    ("PATCH", "/metrics", {}, b"{}", 405, "PATCH is not served"),
    ("GET", "/findings?rack=/r1&bookie=x", {}, b"", 400, "bookie or rack"),
    ("GET", "/findings?rack=/nope", {}, b"", 400, "no bookie is on rack '/nope' (the racks: /r1, /r2, /r3)"),
    ("GET", "/bookies?rack=/nope", {}, b"", 400, "no bookie is on rack '/nope'"),
    ("GET", "/", {"Content-Length": "-1"}, None, 400, "Content-Length"),
    ("GET", "/api/v1/status", {"Content-Length": "-1"}, None, 400, "Content-Length"),
    ("POST", "/api/v1/rescan", {"Content-Length": "+2"}, None, 400, "Content-Length"),
    ("POST", "/findings", {}, b"{}", 405, "POST is not served at /findings (only GET, HEAD)"),
])
def test_every_refusal_is_a_json_4xx(healthy: Console, method: str, path: str, headers: dict[str, str],
                                     body: bytes | None, code: int, words: str) -> None:
    conn = http.client.HTTPConnection(healthy.base.removeprefix("http://"), timeout=10)
    conn.putrequest(method, path)
    for k, v in {"Authorization": f"Bearer {TOKEN}", **headers}.items():
        conn.putheader(k, v)
    if body is not None and "Content-Length" not in headers:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    if body:
        conn.send(body)
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    assert resp.status == code and resp.getheader("Content-Type") == "application/json" and words in doc["error"], doc
    if code == 405:  # the methods this path serves, not every method of the server
        assert resp.getheader("Allow") == ("GET, HEAD" if method != "PUT" else "POST"), resp.getheaders()
    assert "rescan" not in healthy.auditor.last


def test_the_console_over_https_with_a_token_and_a_client_certificate(
        zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    server = ca.issue("auditor", "auditor", server=True)
    client = ca.issue("operator", "operator", server=False)
    c = start_cluster(zk_server, zk_client, zk_namespace, tmp_path, [md(1)], (B1, B2, B3), (B1, B2, B3),
                      auditor_extra={"tls_cert": str(server.cert), "tls_key": str(server.key),
                                     "tls_client_ca": str(ca.pem), "status_requires_auth": True}, https=True)
    try:
        trusting = ssl.create_default_context(cafile=str(ca.pem))
        host = c.base.removeprefix("https://")

        def get(path: str, context: ssl.SSLContext, token: str | None) -> tuple[int, Any]:
            conn = http.client.HTTPSConnection(host, context=context, timeout=10)
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
            resp = conn.getresponse()
            return resp.status, resp.read().decode()

        status, page = get("/", trusting, TOKEN)
        assert status == 200 and 'class="verdict HEALTH_OK"' in page
        assert get("/api/v1/status", trusting, None)[0] == 401  # status_requires_auth: the token, or ...
        with_cert = ssl.create_default_context(cafile=str(ca.pem))
        with_cert.load_cert_chain(str(client.cert), str(client.key))
        assert get("/api/v1/status", with_cert, None)[0] == 200  # ... a client certificate the CA signed
        # /metrics stays open (aggregates only, for Prometheus), over TLS too
        assert get("/metrics", trusting, None)[0] == 200
        # plain HTTP on the HTTPS port: refused, and the token never crosses in clear
        for _ in range(3):  # answered in JSON, never a connection reset
            conn = http.client.HTTPConnection(host, timeout=10)
            conn.request("GET", "/api/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
            resp = conn.getresponse()
            assert resp.status == 400 and "only speaks HTTPS" in json.loads(resp.read())["error"]
        with socket.create_connection(tuple(host.split(":")), timeout=10) as raw:  # type: ignore[arg-type]
            raw.sendall(b"GET /")  # 5 bytes, and nothing more
            head, _, body = b"".join(iter(lambda: raw.recv(4096), b"")).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and "https://" in json.loads(body)["error"]
        with pytest.raises(ssl.SSLCertVerificationError):  # and a client that does not trust the certificate
            get("/", ssl.create_default_context(), TOKEN)
    finally:
        c.stop()


def test_the_console_in_a_browser(healthy: Console, tmp_path: Path) -> None:
    """Debian's chromium, headless: the pages render, the verdict and the chart show, the links work."""
    from selenium.webdriver.common.by import By

    from tests.support.browser import make_browser

    c = healthy
    c.holdings[B1].drop(4)
    c.full_run()
    browser = make_browser()
    try:
        browser.get(f"{c.base}/")
        assert "HEALTH_ERR" in browser.find_element(By.ID, "verdict").text
        assert browser.find_element(By.ID, "history").size["height"] > 100
        browser.save_screenshot(str(tmp_path / "home.png"))
        browser.find_element(By.CSS_SELECTOR, "#new a[href='/ledgers/4']").click()
        assert "at fault" in browser.find_element(By.ID, "checked").text
        assert browser.find_elements(By.CSS_SELECTOR, "svg.copies rect.missing")
        browser.save_screenshot(str(tmp_path / "ledger.png"))
        browser.get(f"{c.base}/bookies")
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.bookie")) == 3
        browser.save_screenshot(str(tmp_path / "bookies.png"))
        time.sleep(0.1)
        assert all((tmp_path / f"{n}.png").stat().st_size > 5000 for n in ("home", "ledger", "bookies"))
    finally:
        browser.quit()


def test_an_idle_bookie_answers_and_marked_ledgers_depend_on_their_bookies(
        zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> None:
    """B4 registered, its agent up, no ledger on it but the one marked under-replicated for B4 (its copies
    gone, BookKeeper's Auditor said); B5 registered with an agent and no ledger at all. The marked ledger
    depends on B1, B2 and B4, and were B1 down, it would lose every copy of some entries."""
    ledgers = [md(lid) for lid in (1, 2, 3)] + [md(9, (B1, B2, B4))]
    c = start_cluster(zk_server, zk_client, zk_namespace, tmp_path, ledgers, (B1, B2, B3, B4, B5),
                      (B1, B2, B3, B4, B5), scan_extra={"orphan_check": True})
    try:
        c.writer.mark_underreplicated(UnderreplicationMark(9, (B4,), int(time.time() * 1000)))
        c.holdings[B4].drop(9)
        c.full_run()
        _, doc = c.get("/api/v1/bookies")
        rows = {b["bookie"]: b for b in doc["bookies"]}
        assert (rows[B5]["state"], rows[B5]["ledgers"], rows[B5]["below_aq_if_down"]) == ("answering", 0, 0), rows
        assert [rows[b]["ledgers"] for b in (B1, B2, B3, B4)] == [4, 4, 3, 1]
        assert [rows[b]["below_aq_if_down"] for b in (B1, B2, B3, B4)] == [4, 4, 3, 1]  # WQ = AQ = 2: any loss
        _, page = c.get("/bookies", html=True)
        assert "not asked" in page.split('id="states"')[1] and "mark names" in page.split('id="depending"')[1]
        assert "1 ledger depends on it" in page and "4 ledgers depend on it" in page  # the racks' tooltips
        _, blast = c.get("/api/v1/blast-radius?kind=rescan")  # B1 down: ledger 9's entries on B4 and B1, none left
        assert [blast["bookies"][b]["ledgers_without_a_copy"] for b in (B1, B2, B3, B4)] == [1, 1, 0, 0]
        assert blast["racks"]["/r3"]["ledgers"] == 0
    finally:
        c.stop()


def test_a_ledger_page_names_its_owner_and_an_unregistered_bookies_copies_as_gone(troubled: Console) -> None:
    c = troubled
    _, doc = c.get("/api/v1/ledgers/1?ask=1")  # healthy or not: its owner from its own metadata
    assert doc["owner"] == "persistent://public/console/t1"
    c.writer.write_ledgers([md(8, (B1, B2, B5))])  # open or closed, a page names the owner
    _, doc = c.get("/api/v1/ledgers/8?ask=1")
    assert doc["owner"] == "persistent://public/console/t0" and doc["checked"] == "not checked yet"
    c.agents[B5].stop(grace=0)
    _, doc = c.get("/api/v1/ledgers/3?ask=1")
    gone = {cp["bookie"]: cp for cp in doc["segments"][0]["copies"]}[B5]
    assert gone["lacking"] == gone["expected"] > 0 and "count as gone" in gone["answer"], gone
    for path in ("/ledgers/3", "/", "/findings?kind=rescan", "/bookies", "/blast-radius?kind=rescan"):
        _, page = c.get(path, html=True)
        ids = re.findall(r' id="([^"]+)"', page)
        assert len(ids) == len(set(ids)), (path, sorted(ids))


def test_the_findings_page_one_row_a_topic_a_rack_field_and_the_run_it_shows(troubled: Console) -> None:
    c = troubled
    _, page = c.get("/findings?kind=rescan", html=True)
    topics = page.split('id="topics"')[1].split("</table>")[0]
    names = [t.split("</a>")[0].rsplit(">", 1)[-1] for t in topics.split('<tr class="topic">')[1:]]
    assert sorted(names) == ["persistent://public/console/t0", "persistent://public/console/t1"], topics
    assert 'id="rack"' in page.split("<form")[1]
    _, home = c.get("/", html=True)
    new = home.split('id="new"')[1].split("</table>")[0] if 'id="new"' in home else ""
    assert "kind=full" not in new


def test_a_topics_page_lists_its_ledgers_healthy_at_fault_or_missing(healthy: Console) -> None:
    """A topic's record (ledgers 1, 3 and 5, one deleted from BookKeeper, a cursor) beside BookKeeper's
    metadata: each ledger's status on the page and in the JSON; continuous mode finds the missing one by
    itself; a name that is no topic is a 400, a topic nobody knows a 404."""
    c = healthy
    c.holdings[B2].drop(3)
    c.writer.write_managed_ledger("public/console/persistent/t1",
                                  encode.managed_ledger([LedgerInfo(1, 30, 3000), LedgerInfo(3, 30, 3000),
                                                         LedgerInfo(5, 30, 3000), LedgerInfo(9, 30, 3000)]),
                                  {"sub-a": encode.cursor(-1, Position(5, 10))})
    wait_for(lambda: any(f["category"] == "TOPIC_LEDGER_MISSING" for f in c.get("/api/v1/current")[1]["violations"]),
             60)
    c.full_run()
    status, doc = c.get("/api/v1/topics?name=persistent://public/console/t1")
    assert status == 200 and doc["managed_ledger"] == "public/console/persistent/t1" and doc["cursors"] == ["sub-a"]
    assert {r["ledger_id"]: r["status"] for r in doc["ledgers"]} == {1: "healthy", 3: "at fault", 5: "healthy",
                                                                     9: "missing"}
    now = {(f["category"], f["ledger_id"]): f for f in doc["current"]}
    assert set(now) == {("TOPIC_LEDGER_MISSING", 9), ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 3)}
    assert now["TOPIC_LEDGER_MISSING", 9]["found_by"].startswith("continuous: ")
    status, page = c.get("/topics?name=public/console/t1", html=True)
    assert status == 200 and 'class="missing"' in page and 'href="/ledgers/3"' in page and "sub-a" in page
    assert "Not validated yet" in page and doc["messages"]["validated_through"] is None
    # what a deep run's validation of its messages kept: shown as it stands
    c.writer.write_auditor_record(checkpoint_record("persistent://public/console/t1").name, MessageCheckpoint(
        Position(5, 29), {"p": ProducerState(120, 120, Position(5, 29))},
        {"messages_validated": 90, "sequence_gaps": 2, "producer_restarts": 1}).to_bytes())
    doc = c.get("/api/v1/topics?name=persistent://public/console/t1")[1]
    assert doc["messages"] == {"validated_through": "5:29", "producers": 1, "statistics": {
        "messages_validated": 90, "producer_restarts": 1, "sequence_gaps": 2}}
    page = c.get("/topics?name=public/console/t1", html=True)[1]
    assert "validated through 5:29 (1 producers)" in page and "sequence gaps 2" in page
    _, findings = c.get("/findings?kind=rescan", html=True)
    assert 'href="/topics?name=persistent%3A%2F%2Fpublic%2Fconsole%2Ft1"' in findings
    assert c.get("/api/v1/topics?name=persistent://public/console/nothing-here")[0] == 404
    status, doc = c.get("/api/v1/topics?name=persistent://only-a-tenant")
    assert status == 400 and "not persistent://tenant/namespace/name" in doc["error"]


def test_a_tenants_and_a_namespaces_page_their_topics_bytes_risks_and_leaks(
        zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> None:
    """Two tenants: acme (orders/a with ledgers 1-2 and a leaked ledger 7; prices/b with 3-4, one copy of 3
    lost) and beta (ns/c with 5-6, healthy). Each tenant's and namespace's view names its own topics alone,
    with what their records say they store, what is at risk now and the leaks; bad names are 400s, a
    tenant nothing knows a 404."""
    names = {1: "acme/orders/persistent/a", 2: "acme/orders/persistent/a", 7: "acme/orders/persistent/a",
             3: "acme/prices/persistent/b", 4: "acme/prices/persistent/b",
             5: "beta/ns/persistent/c", 6: "beta/ns/persistent/c"}
    root = f"{zk_namespace}/ledgers"
    bookies = start_bookies(zk_client, root, f"zk+hierarchical://{zk_server.hosts}{root}",
                            [md(lid, managed_ledger=ml) for lid, ml in names.items()], (B1, B2, B3), (B1, B2, B3))
    for ml in dict.fromkeys(names.values()):
        bookies.writer.write_managed_ledger(ml, encode.managed_ledger(
            [LedgerInfo(lid, 30, 3000) for lid, m in names.items() if m == ml and lid != 7]))
    c = audited(bookies, tmp_path, scan_extra={"leaked_ledger_grace_period": 0})
    try:
        c.holdings[B2].drop(3)
        c.full_run()
        status, acme = c.get("/api/v1/tenants?name=acme")
        assert status == 200 and acme["tenant"] == "acme", acme
        rows = {r["topic"]: r for r in acme["topics"]}
        assert list(rows) == ["persistent://acme/prices/b", "persistent://acme/orders/a"]  # worst first
        b, a = rows.values()
        assert (b["ledgers"], b["entries"], b["bytes_stored"], b["ledgers_at_risk"]) == (2, 60, 6000, {"critical": 1})
        assert b["categories"] == {"LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY": 1} and b["leaked"] == []
        assert (a["ledgers"], a["ledgers_at_risk"], a["leaked"], a["leaked_bytes"]) == (2, {"warning": 1}, [7], 0)
        assert acme["totals"] == {"topics": 2, "ledgers": 4, "entries": 120, "bytes_stored": 12000,
                                  "ledgers_at_risk": {"critical": 1, "warning": 1}, "leaked_ledgers": 1,
                                  "leaked_bytes": 0}
        assert acme["verdict"]["level"] == "HEALTH_ERR"
        assert {(f["category"], f["ledger_id"], f["topic"]) for f in acme["findings"]} == {
            ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 3, "persistent://acme/prices/b"),
            ("LEAKED_LEDGER", 7, "persistent://acme/orders/a")}
        status, orders = c.get("/api/v1/namespaces?name=acme/orders")
        assert status == 200 and [r["topic"] for r in orders["topics"]] == ["persistent://acme/orders/a"]
        assert orders["verdict"]["level"] == "HEALTH_WARN" and orders["totals"]["leaked_ledgers"] == 1
        status, beta = c.get("/api/v1/tenants?name=beta")
        assert status == 200 and beta["verdict"]["level"] == "HEALTH_OK" and beta["findings"] == []
        assert beta["totals"]["ledgers_at_risk"] == {} and [r["ledgers"] for r in beta["topics"]] == [2]
        status, page = c.get("/tenants?name=acme", html=True)
        assert status == 200 and 'class="verdict HEALTH_ERR"' in page and 'href="/ledgers/7"' in page
        assert 'href="/topics?name=persistent%3A%2F%2Facme%2Fprices%2Fb"' in page and "sev-critical" in page
        assert "beta" not in page
        _, page = c.get("/topics?name=acme/prices/b", html=True)
        assert 'href="/namespaces?name=acme%2Fprices"' in page and 'href="/tenants?name=acme"' in page
        for path, status_wanted in (("/api/v1/tenants?name=acme/orders", 400), ("/api/v1/namespaces?name=acme", 400),
                                    ("/api/v1/namespaces?name=acme/x/y", 400), ("/api/v1/tenants?name=nobody", 404)):
            status, doc = c.get(path)
            assert status == status_wanted and doc["error"], (path, doc)
        assert c.get("/namespaces?name=a%20b", html=True)[0] == 400
    finally:
        c.stop()


def test_the_history_chart_draws_equal_series_once_and_one_run_in_the_middle() -> None:
    from scrutiny.auditor.history import RunPoint
    from scrutiny.console.display import CHART_W, chart

    def point(n: int, **counts: int) -> RunPoint:
        return RunPoint("full", f"r{n}", n * 1000, 1000, 10, counts)

    one = chart([point(1, LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY=2)])
    assert one is not None and one.last == "" and one.series[0][1].startswith(f"{CHART_W / 2:.1f},")
    two = chart([point(1, BOOKIE_UNAVAILABLE=1, ORPHAN_LEDGER=1, NO_REPLICA_OF_AN_ENTRY=3),
                 point(2, BOOKIE_UNAVAILABLE=1, ORPHAN_LEDGER=1)])
    assert two is not None and [name for name, _ in two.series] == ["NO_REPLICA_OF_AN_ENTRY",
                                                                   "BOOKIE_UNAVAILABLE, ORPHAN_LEDGER"]
