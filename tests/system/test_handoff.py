"""The hand-off to BookKeeper's autorecovery (`auditor.repair`), on a real ZooKeeper with real agents: what it
marks (the ledgers whose loss autorecovery's checker sees, with the bookies to copy), what it never marks (a
loss its checker cannot see; anything while re-replication is disabled; beyond the limits), the dry run, and
the journal."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kazoo.client import KazooClient

from scrutiny.metadata import UnderreplicationMark
from scrutiny.repair.plan import ALREADY_MARKED, REPAIRED, UNREPAIRED
from scrutiny.testing import store_at
from scrutiny.testing.holdings import share
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.replicationworker import NOTHING_BAD, REPLICATED, ReplicationWorker
from tests.support.helpers import wait_for
from tests.system.test_console import B1, B2, B3, B4, Console, md, start_cluster

pytestmark = pytest.mark.slow


def losses(c: Console) -> None:
    """Ledger 3: B2's whole share gone (its checker reads the share's first entry: autorecovery repairs it);
    ledger 4: one entry of B1's share gone mid-share (both ends held: a mark would be removed unrepaired);
    ledger 5: B3's whole share gone."""
    c.holdings[B2].drop(3)
    c.holdings[B1].drop(4)
    c.holdings[B1].put(4, np.setdiff1d(share(md(4), B1), [3]))
    c.holdings[B3].drop(5)


def handoffs(c: Console) -> list[dict[str, object]]:
    status, doc = c.get("/api/v1/handoffs")
    assert status == 200
    return doc["handoffs"]  # type: ignore[no-any-return]


@pytest.fixture
def started(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[Console]:
    auditor = {"repair_interval_seconds": 0.3, **request.param}
    scan = {"auditor_ledger_verification_percentage": auditor.pop("percentage", 0)}
    c = start_cluster(zk_server, zk_client, zk_namespace, tmp_path, [md(lid) for lid in range(1, 7)],
                      (B1, B2, B3, B4), (B1, B2, B3, B4), scan_extra=scan, auditor_extra=auditor)
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.parametrize("started", [{"repair": "dry-run"}], indirect=True)
def test_a_dry_run_lists_what_it_would_mark_and_marks_nothing(started: Console) -> None:
    c = started
    losses(c)
    c.full_run()
    wait_for(lambda: {h["ledger_id"] for h in handoffs(c)} == {3, 5}, 30)
    time.sleep(1.0)  # a few more hand-offs: each finding is listed once
    listed = handoffs(c)
    assert sorted((h["ledger_id"], h["outcome"], h["replicas"]) for h in listed) == [
        (3, "would mark (dry run)", [B2]), (5, "would mark (dry run)", [B3])]
    with store_at(c.auditor.config.scan.metadata_service_uri) as store:
        assert store.marked([3, 4, 5]) == set()


@pytest.mark.parametrize("started", [{"repair": "mark", "repair_marks_per_minute": 1}], indirect=True)
def test_marks_as_the_auditor_would_within_its_limit_never_while_replication_is_disabled(
        started: Console, zk_client: KazooClient) -> None:
    c = started
    c.writer.set_replication_disabled(True)
    losses(c)
    c.full_run()
    assert {f.violation.ledger_id for f in c.auditor.current.findings()} == {3, 4, 5}
    time.sleep(1.5)  # several hand-offs while re-replication is disabled
    assert handoffs(c) == []
    with store_at(c.auditor.config.scan.metadata_service_uri) as store:
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
    worker = ReplicationWorker(zk_client, c.writer.root, c.holdings, percentage=0)
    assert sorted(worker.run_once()) == [(3, REPLICATED), (5, REPLICATED)]
    wait_for(lambda: {h["ledger_id"] for h in handoffs(c) if h["outcome"] == REPAIRED} == {3, 5}, 30)


@pytest.mark.parametrize("started", [{"repair": "mark", "percentage": 100}], indirect=True)
def test_each_mark_is_followed_to_its_end_repaired_or_unmarked_without_repair(started: Console,
                                                                              zk_client: KazooClient) -> None:
    """scrutiny judges as if the cluster's checker read every entry (percentage 100) and marks both losses; the
    cluster's worker runs at 0, BookKeeper's default: it repairs the share whose first entry is gone, and unmarks
    the mid-share loss without repair: a finding, with its cause and its command, and never marked again."""
    c = started
    worker = ReplicationWorker(zk_client, c.writer.root, c.holdings, percentage=0)
    losses(c)
    c.full_run()
    with store_at(c.auditor.config.scan.metadata_service_uri) as store:
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
