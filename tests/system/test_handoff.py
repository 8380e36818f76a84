"""The hand-off to BookKeeper's autorecovery (`auditor.repair`), on a real ZooKeeper with real agents: what it
marks (the ledgers whose loss autorecovery's checker sees, with the bookies to copy), what it never marks (a
loss its checker cannot see; anything while re-replication is disabled; beyond the limits), the dry run, and
the journal."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from kazoo.client import KazooClient

from scrutiny.config import ClusterSettings
from scrutiny.metadata import UnderreplicationMark
from scrutiny.repair.handoff import JOURNAL_FILE
from scrutiny.repair.kept import HANDOFF_RECORD
from scrutiny.repair.plan import ALREADY_MARKED, MARKED, NOT_AGAIN, REPAIRED, UNREPAIRED
from scrutiny.store import MetadataStore, open_store
from scrutiny.testing import store_at
from scrutiny.testing.holdings import MutableHoldings, share
from scrutiny.testing.localzk import LocalZooKeeper, free_port
from scrutiny.testing.processes import reap
from scrutiny.testing.replicationworker import NOTHING_BAD, REPLICATED, ReplicationWorker
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc
from tests.conftest import place_on
from tests.support.helpers import auditor_process, wait_for
from tests.system.test_console import B1, B2, B3, B4, Console, audited, md, start_bookies

pytestmark = pytest.mark.slow


def losses(holdings: dict[str, MutableHoldings]) -> None:
    """Ledger 3: B2's whole share gone (its checker reads the share's first entry: autorecovery repairs it);
    ledger 4: one entry of B1's share gone mid-share (both ends held: a mark would be removed unrepaired);
    ledger 5: B3's whole share gone."""
    holdings[B2].drop(3)
    holdings[B1].drop(4)
    holdings[B1].put(4, np.setdiff1d(share(md(4), B1), [3]))
    holdings[B3].drop(5)


def opened(c: Console) -> MetadataStore:
    """A store on the console's cluster, ZooKeeper or etcd, as scrutiny opens it."""
    return open_store(ClusterSettings(metadata_service_uri=c.auditor.config.scan.metadata_service_uri,
                                      etcd_lease_ttl=5))


def handoffs(c: Console) -> list[dict[str, object]]:
    status, doc = c.get("/api/v1/handoffs")
    assert status == 200
    return doc["handoffs"]  # type: ignore[no-any-return]


@pytest.fixture(params=["zk", "etcd"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """The whole hand-off on ZooKeeper, and on Pulsar's metadata store on etcd."""
    return str(request.param)


@pytest.fixture
def started(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Console]:
    auditor = {"repair_interval_seconds": 0.3, **request.param}
    scan = {"auditor_ledger_verification_percentage": auditor.pop("percentage", 0)}
    with place_on(request, store_kind) as place:
        bookies = start_bookies(place.client, place.root, place.uri, [md(lid) for lid in range(1, 7)],
                                (B1, B2, B3, B4), (B1, B2, B3, B4))
        c = audited(bookies, tmp_path, scan_extra=scan, auditor_extra=auditor)
        try:
            yield c
        finally:
            c.stop()


@pytest.mark.parametrize("started", [{"repair": "dry-run"}], indirect=True)
def test_a_dry_run_lists_what_it_would_mark_and_marks_nothing(started: Console) -> None:
    c = started
    losses(c.holdings)
    c.full_run()
    wait_for(lambda: {h["ledger_id"] for h in handoffs(c)} == {3, 5}, 30)
    time.sleep(1.0)  # a few more hand-offs: each finding is listed once
    listed = handoffs(c)
    assert sorted((h["ledger_id"], h["outcome"], h["replicas"]) for h in listed) == [
        (3, "would mark (dry run)", [B2]), (5, "would mark (dry run)", [B3])]
    with opened(c) as store:
        assert store.marked([3, 4, 5]) == set()


@pytest.mark.parametrize("started", [{"repair": "mark", "repair_marks_per_minute": 1}], indirect=True)
def test_marks_as_the_auditor_would_within_its_limit_never_while_replication_is_disabled(
        started: Console) -> None:
    c = started
    c.writer.set_replication_disabled(True)
    losses(c.holdings)
    c.full_run()
    assert {f.violation.ledger_id for f in c.auditor.current.findings()} == {3, 4, 5}
    time.sleep(1.5)  # several hand-offs while re-replication is disabled
    assert handoffs(c) == []
    with opened(c) as store:
        assert store.marked([3, 4, 5]) == set()
        c.writer.set_replication_disabled(False)
        wait_for(lambda: store.marked([3, 4, 5]) == {3}, 30)
        mark = store.underreplication_mark(3)
        assert mark is not None and mark.replicas == (B2,) and abs(mark.ctime / 1000 - time.time()) < 60  # type: ignore[operator]
        time.sleep(1.5)  # one mark a minute: ledger 5 waits; ledger 4's loss is one autorecovery cannot see
        assert store.marked([3, 4, 5]) == {3}
    [h] = handoffs(c)
    assert (h["ledger_id"], h["outcome"], h["replicas"], h["by"]) == (3, "marked", [B2], c.auditor.address)
    assert "first and the last entry" in str(h["why"]) and h["run_id"]
    status, page = c.get("/handoffs", html=True)
    assert status == 200 and "<b>mark</b>" in page and '<a href="/ledgers/3">3</a>' in page and f"<td>{B2}</td>" in page
    journal = Path(c.auditor.config.auditor.reports_dir) / "handoffs.jsonl"
    assert [json.loads(line)["ledger_id"] for line in journal.read_text().splitlines()] == [3]
    # BookKeeper's own Auditor marks ledger 5: followed to its end as well; a worker repairs both
    c.writer.mark_underreplicated(UnderreplicationMark(5, (B3,), int(time.time() * 1000)))
    wait_for(lambda: any(h["ledger_id"] == 5 and h["outcome"] == ALREADY_MARKED for h in handoffs(c)), 30)
    worker = ReplicationWorker(c.writer.client, c.writer.root, c.holdings, percentage=0)
    assert sorted(worker.run_once()) == [(3, REPLICATED), (5, REPLICATED)]
    wait_for(lambda: {h["ledger_id"] for h in handoffs(c) if h["outcome"] == REPAIRED} == {3, 5}, 30)


@pytest.mark.parametrize("started", [{"repair": "mark", "percentage": 100}], indirect=True)
def test_each_mark_is_followed_to_its_end_repaired_or_unmarked_without_repair(started: Console) -> None:
    """scrutiny judges as if the cluster's checker read every entry (percentage 100) and marks both losses; the
    cluster's worker runs at 0, BookKeeper's default: it repairs the share whose first entry is gone, and unmarks
    the mid-share loss without repair: a finding, with its cause and its command, and never marked again."""
    c = started
    worker = ReplicationWorker(c.writer.client, c.writer.root, c.holdings, percentage=0)
    losses(c.holdings)
    c.full_run()
    with opened(c) as store:
        wait_for(lambda: store.marked([3, 4, 5]) == {3, 4, 5}, 30)
        assert sorted(worker.run_once()) == [(3, REPLICATED), (4, NOTHING_BAD), (5, REPLICATED)]
        wait_for(lambda: {h["outcome"] for h in handoffs(c) if h["ledger_id"] == 4} >= {UNREPAIRED}, 30)
        time.sleep(1.0)  # a few more hand-offs: a ledger unmarked without repair is not marked again
        assert store.marked([3, 4, 5]) == set()
        md3 = next(store.read_ledgers([3])).metadata
    assert md3 is not None and md3.segments[0].ensemble == (B1, B4, B3)  # the worker's ensemble change
    ends = {h["ledger_id"]: h for h in handoffs(c) if h["outcome"] in (REPAIRED, UNREPAIRED)}
    assert ends[3]["outcome"] == ends[5]["outcome"] == REPAIRED and ends[3]["seconds"] >= 0
    assert ends[4]["outcome"] == UNREPAIRED
    _, now = c.get("/api/v1/current")
    found = {(v["category"], v["ledger_id"]): v for v in now["violations"]}
    assert set(found) == {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 4), ("UNMARKED_WITHOUT_REPAIR", 4)}, set(found)
    unmarked = found[("UNMARKED_WITHOUT_REPAIR", 4)]
    assert "at 0, BookKeeper's default" in unmarked["details"]["cause"]
    assert unmarked["remedy"]["commands"] == [f"bin/bookkeeper shell recover {B1} -l 4"]
    # repaired by hand: both resolved at the next look
    c.holdings[B1].put(4, share(md(4), B1))
    c.full_run()
    wait_for(lambda: c.get("/api/v1/current")[1]["violations"] == [], 30)


def _auditor_config(tmp_path: Path, name: str, uri: str) -> tuple[Path, str, int]:
    """An auditor that marks (judging as if the cluster's checker read every entry), and its RPC and HTTP ports."""
    port, http = free_port(), free_port()
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(f"metadata_service_uri: {uri}\nengine: local\nplacement_policy: none\nrecheck_delay: 0.3\n"
                   "write_cache_grace_seconds: 0.3\norphan_check: false\nbookie_deadline_seconds: 1.0\n"
                   "zk_session_timeout: 4\nauditor_ledger_verification_percentage: 100\n"
                   f"auditor:\n  listen: 127.0.0.1:{port}\n  reports_dir: {tmp_path / name}\n"
                   "  full_interval_seconds: 3600\n  underreplication_interval_seconds: 0\n"
                   "  insecure_open_rescan: true\n  repair: mark\n  repair_interval_seconds: 0.3\n"
                   f"metrics:\n  listen: 127.0.0.1:{http}\n")
    return cfg, f"127.0.0.1:{port}", http


def _role(address: str) -> int | None:
    try:
        return auditor_pb2_grpc.AuditorStub(grpc.insecure_channel(address)).GetStatus(
            auditor_pb2.GetStatusRequest(), timeout=2).role
    except grpc.RpcError:
        return None


def _full_run(address: str) -> None:
    auditor_pb2_grpc.AuditorStub(grpc.insecure_channel(address)).Rescan(
        auditor_pb2.RescanRequest(all_ledgers=True), timeout=60)


def _journal(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    path = tmp_path / name / JOURNAL_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _current(http: int) -> set[tuple[str, int]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/api/v1/current", timeout=10) as resp:
        return {(v["category"], v["ledger_id"]) for v in json.loads(resp.read())["violations"]}


def test_what_the_leader_follows_survives_a_failover_and_a_given_up_ledger_is_never_marked_again(
        zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> None:
    """The leader marks three ledgers and is killed before any is unmarked. The next leader follows them from
    the leaders' record: two repaired, one unmarked by the worker without repair (UNMARKED_WITHOUT_REPAIR).
    Killed in turn, the leader after it never marks that ledger again, and says why."""
    root = f"{zk_namespace}/ledgers"
    bookies = start_bookies(zk_client, root, f"zk+hierarchical://{zk_server.hosts}{root}",
                            [md(lid) for lid in range(1, 7)], (B1, B2, B3, B4), (B1, B2, B3, B4))
    procs: list[subprocess.Popen[str]] = []
    try:
        (cfg_a, a, _), (cfg_b, b, http_b), (cfg_c, c, http_c) = (
            _auditor_config(tmp_path, name, bookies.uri) for name in ("a", "b", "c"))
        procs.append(auditor_process(cfg_a, tmp_path / "a.log"))
        wait_for(lambda: _role(a) == auditor_pb2.LEADER, 30)
        procs.append(auditor_process(cfg_b, tmp_path / "b.log"))
        wait_for(lambda: _role(b) == auditor_pb2.STANDBY, 30)
        losses(bookies.holdings)
        _full_run(a)
        with store_at(bookies.uri) as store:
            # the record is written as each mark is
            wait_for(lambda: store.marked([3, 4, 5]) == {3, 4, 5}
                     and set(HANDOFF_RECORD.read(store).followed) == {3, 4, 5}, 30)
        reap(procs[0])  # killed between the marks and their end
        wait_for(lambda: _role(b) == auditor_pb2.LEADER, 30)
        worker = ReplicationWorker(zk_client, bookies.writer.root, bookies.holdings, percentage=0)
        assert sorted(worker.run_once()) == [(3, REPLICATED), (4, NOTHING_BAD), (5, REPLICATED)]

        def ends(name: str) -> dict[int, str]:
            return {h["ledger_id"]: h["outcome"] for h in _journal(tmp_path, name)
                    if h["outcome"] in (REPAIRED, UNREPAIRED)}

        wait_for(lambda: ends("b") == {3: REPAIRED, 4: UNREPAIRED, 5: REPAIRED}, 60,
                 lambda: str(_journal(tmp_path, "b")))
        assert ("UNMARKED_WITHOUT_REPAIR", 4) in _current(http_b)
        with store_at(bookies.uri) as store:
            wait_for(lambda: (kept := HANDOFF_RECORD.read(store)).followed == {} and set(kept.given_up) == {4}, 30)

        reap(procs[1])
        procs.append(auditor_process(cfg_c, tmp_path / "c.log"))
        wait_for(lambda: _role(c) == auditor_pb2.LEADER, 30)
        _full_run(c)  # finds ledger 4's loss again: a candidate for a leader that knew nothing
        wait_for(lambda: any(h["ledger_id"] == 4 and h["outcome"] == NOT_AGAIN for h in _journal(tmp_path, "c")), 30)
        time.sleep(1.0)  # a few more hand-offs
        with store_at(bookies.uri) as store:
            assert store.marked([4]) == set()
        assert not any(h["outcome"] == MARKED for h in _journal(tmp_path, "c"))
        # why it is not marked stands under this leader too, beside the loss
        wait_for(lambda: {("UNMARKED_WITHOUT_REPAIR", 4), ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 4)} <= _current(http_c))
    finally:
        for proc in procs:
            reap(proc)
        bookies.stop()
