"""The auditor's page and HTTP API: a real auditor after a run with known faults, a real HTTP client
(answers and refusals), and Debian's chromium, headless, through Selenium and chromium-driver."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from scrutiny.auditor import Auditor
from scrutiny.config import AuditorSettings, MetricsSettings, ScanSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_on
from scrutiny.testing.demo import DemoCluster, build_demo_cluster, demo_agents
from scrutiny.testing.localzk import LocalZooKeeper
from tests.support.browser import make_browser
from tests.support.helpers import wait_for

TOKEN = "s3cret-page"


@pytest.fixture
def auditor(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
            tmp_path: Path) -> Iterator[tuple[DemoCluster, Auditor, str]]:
    """A leading auditor after its first full run over the demo's faults; the base URL of its page."""
    demo = build_demo_cluster(zk_client, f"{zk_namespace}/ledgers", tmp_path / "stores", healthy=40)
    uri = f"zk+hierarchical://{zk_server.hosts}{zk_namespace}/ledgers"
    token = tmp_path / "token"
    token.write_text(TOKEN)
    scan = ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.3, underreplicated_grace_period=3600)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), token_file=str(token),
                               underreplication_interval_seconds=0)
    with demo_agents(demo, store_on(zk_client, uri)):
        a = Auditor(scan, settings, metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb,
                    engine=LocalEngine()).start()
        try:
            wait_for(lambda: "full" in a.last, 60)
            port = a.http.port
            yield demo, a, f"http://127.0.0.1:{port}"
        finally:
            a.stop()


def call(url: str, body: Any = None, token: str | None = None, raw: bytes | None = None,
         method: str | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(), exc.code
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def test_the_http_api_answers_what_the_rpc_answers(auditor: tuple[DemoCluster, Auditor, str]) -> None:
    demo, a, base = auditor
    status, doc = call(f"{base}/api/v1/status")
    assert status == 200 and doc["role"] == "leader" and doc["last_runs"][0]["kind"] == "full"
    status, report = call(f"{base}/api/v1/report?kind=full")
    assert status == 200 and {(v["category"], v["ledger_id"]) for v in report["violations"]} == demo.expected
    status, page = call(f"{base}/api/v1/report?category=NO_REPLICA_OF_AN_ENTRY&page_size=1")
    assert (status, page["total"], [v["ledger_id"] for v in page["violations"]]) == (200, 1, [9001])
    status, page = call(f"{base}/api/v1/report?bookie=127.0.1.9:3181")  # the bookie that is down
    assert {v["ledger_id"] for v in page["violations"]} == {9005, 9006}
    status, ledger = call(f"{base}/api/v1/ledgers/9001")
    assert status == 200 and [f["category"] for f in ledger["findings"]] == ["NO_REPLICA_OF_AN_ENTRY"]
    status, blast = call(f"{base}/api/v1/blast-radius")
    assert status == 200 and blast["bookies"]
    # a rescan with the token: the same run the RPC would start
    status, done = call(f"{base}/api/v1/rescan", {"ledgers": [9001, 1], "wait": True}, TOKEN)
    assert status == 200 and [v["ledger_id"] for v in done["report"]["violations"]] == [9001]
    assert a.last["rescan"].run_id == done["run_id"]


@pytest.mark.parametrize(("path", "body", "token", "code", "words"), [
    ("/api/v1/rescan", {"all_ledgers": True}, None, 401, "bearer token"),
    ("/api/v1/rescan", {"all_ledgers": True}, "wrong", 401, "bearer token"),
    ("/api/v1/whatif", {"bookie_ids": ["127.0.1.1:3181"]}, None, 401, "bearer token"),
    ("/api/v1/rescan", {"ledgers": [424242]}, TOKEN, 400, "no such ledger 424242"),
    ("/api/v1/rescan", {"ledgers": ["1"]}, TOKEN, 400, "say what to rescan"),
    ("/api/v1/whatif", {}, TOKEN, 400, "say which bookie_ids or racks"),
    ("/api/v1/rescan", b"{not json", TOKEN, 400, "not JSON"),
    ("/api/v1/report?kind=weekly", None, None, 400, "kind must be one of"),
    ("/api/v1/report?category=NOPE", None, None, 400, "not one of scrutiny's categories"),
    ("/api/v1/report?page_size=100000", None, None, 400, "page_size 1..1000"),
    ("/api/v1/report?page=0", None, None, 400, "page is 1 or more"),
    ("/api/v1/ledgers/abc", None, None, 400, "not a ledger id"),
    ("/api/v1/report?kind=deep", None, None, 404, "no complete deep run"),
    ("/nowhere", None, None, 404, "no page at /nowhere"),
])
def test_the_http_api_refuses_clearly_and_runs_nothing(auditor: tuple[DemoCluster, Auditor, str], path: str,
                                                      body: Any, token: str | None, code: int, words: str) -> None:
    _, a, base = auditor
    raw = body if isinstance(body, bytes) else None
    status, doc = call(f"{base}{path}", None if raw is not None else body, token, raw)
    assert status == code and words in (doc["error"] if isinstance(doc, dict) else doc)
    assert "rescan" not in a.last and "whatif" not in a.last and a.status().queued_runs == 0


def test_a_get_on_a_post_path_and_a_huge_body_are_refused(auditor: tuple[DemoCluster, Auditor, str]) -> None:
    _, a, base = auditor
    status, doc = call(f"{base}/api/v1/rescan")
    assert status == 405 and "GET is not served" in doc["error"]
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    conn.putrequest("POST", "/api/v1/rescan")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()  # the 64 MiB announced are never sent: the answer comes before them
    resp = conn.getresponse()
    assert resp.status == 413 and b"exceeds the maximum" in resp.read() and "rescan" not in a.last
    conn.close()


# -- in a real browser ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = make_browser()
    yield driver
    driver.quit()


def test_the_page_in_a_browser_shows_filters_and_sorts(auditor: tuple[DemoCluster, Auditor, str], browser: Any,
                                                       tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    _, a, base = auditor
    browser.get(f"{base}/")
    assert "leads" in browser.find_element(By.TAG_NAME, "body").text
    browser.save_screenshot(str(tmp_path / "status.png"))
    browser.find_element(By.LINK_TEXT, "full").click()
    text = browser.find_element(By.ID, "topics").text
    assert "persistent://public/demo/topic-1" in text and "NO_REPLICA_OF_AN_ENTRY" in text
    ledgers = {r.find_element(By.TAG_NAME, "td").text for r in browser.find_elements(By.CSS_SELECTOR, "tr.finding")}
    assert {"9001", "9002", "9005", "9006", "17"} <= ledgers
    browser.save_screenshot(str(tmp_path / "findings.png"))
    Select(browser.find_element(By.ID, "category")).select_by_visible_text("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY")
    browser.find_element(By.ID, "filter").click()
    WebDriverWait(browser, 10).until(lambda d: "category=LESS_THAN_AQ" in d.current_url)  # the new page, not the old
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.finding")
    assert {r.find_element(By.TAG_NAME, "td").text for r in rows} == {"9002", "9008"}
    assert all("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY" in r.text for r in rows)
    browser.save_screenshot(str(tmp_path / "filtered.png"))
    # from an alert: its `page` link (the scraped address, the alert's category), then one click to the ledger
    browser.get(f"{base}/findings?category=NO_REPLICA_OF_AN_ENTRY")
    browser.find_element(By.LINK_TEXT, "9001").click()
    ledger = browser.find_element(By.TAG_NAME, "body").text
    lost = next(v for v in a.last["full"].report.violations if v.ledger_id == 9001)  # type: ignore[union-attr]
    assert "NO_REPLICA_OF_AN_ENTRY" in ledger and all(b in ledger for b in lost.bookies) and "0 of 2 copies" in ledger
    browser.save_screenshot(str(tmp_path / "ledger.png"))
    browser.get(f"{base}/blast-radius")

    def column(i: int) -> list[str]:
        return [r.find_elements(By.TAG_NAME, "td")[i].text for r in browser.find_elements(By.CSS_SELECTOR, "#blast tr")
                if r.find_elements(By.TAG_NAME, "td")]

    below = [int(x) for x in column(1)]
    assert below == sorted(below, reverse=True) and below  # worst first by default
    browser.find_element(By.ID, "sort-name").click()
    names = column(0)
    assert names == sorted(names, reverse=True)
    browser.find_element(By.ID, "sort-name").click()  # again: the other way
    assert column(0) == sorted(names)
    browser.save_screenshot(str(tmp_path / "blast-radius.png"))
    assert all((tmp_path / f"{n}.png").stat().st_size > 5000 for n in ("status", "findings", "filtered"))


def test_a_standbys_page_names_the_leader_and_its_api_redirects(
        auditor: tuple[DemoCluster, Auditor, str], tmp_path: Path) -> None:
    _, leader, _ = auditor
    token = tmp_path / "standby-token"
    token.write_text(TOKEN)
    standby = Auditor(leader.config.scan, AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "r2"),
                                                          token_file=str(token)),
                      metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb, engine=LocalEngine()).start()
    try:
        wait_for(lambda: standby.leader_address() == leader.address)
        base = f"http://127.0.0.1:{standby.http.port}"
        status, page = call(f"{base}/")
        leader_host = leader.address.rsplit(":", 1)[0]
        assert status == 200 and "standby" in page and leader.address in page and f"http://{leader_host}:" in page
        status, doc = call(f"{base}/api/v1/rescan", {"all_ledgers": True}, TOKEN)
        assert status == 409 and doc["leader_address"] == leader.address
    finally:
        standby.stop()


def test_with_status_requires_auth_the_pages_need_the_token_too() -> None:
    from scrutiny.auditor.currentstate import CurrentState
    from scrutiny.auditor.service import Authenticator, Status
    from scrutiny.errors import StoreError
    from scrutiny.httpserver import Request

    class Api:  # an auditor's face, not connected to its store yet (the run history: none)
        current = CurrentState()

        def connected_store(self) -> Any:
            raise StoreError("not connected to the metadata store yet")

        def scan_settings(self) -> ScanSettings:
            return ScanSettings()

        def auditor_settings(self) -> AuditorSettings:
            return AuditorSettings(status_requires_auth=True)

        def authenticator(self) -> Authenticator:
            return Authenticator(TOKEN, False, False)

        def status(self) -> Status:
            return Status(True, "a:1")

        def last_run(self, kind: str) -> None:
            return None

        def current_state(self, most: int = 1000, newest_first: bool = False) -> dict[str, Any]:
            return {"continuous": False, "feeds": {}, "total": 0, "violations": [], "missed": 0,
                    "watching_since": None}

    web = AuditorWeb(Api())  # type: ignore[arg-type]
    for path in ("/", "/api/v1/status", "/findings"):
        refused = web(Request("GET", path, {}, {}))
        assert refused is not None and refused.status == 401
    allowed = web(Request("GET", "/", {}, {"Authorization": f"Bearer {TOKEN}"}))
    assert allowed is not None and allowed.status == 200 and b"leads" in allowed.body
