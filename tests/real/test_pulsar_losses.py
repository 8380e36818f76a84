"""The losses Pulsar's users report, made on a real broker the way they happen: ledgers a topic still needs deleted
through BookKeeper's own client (apache/pulsar #19444's class), a topic's deletion cut between its ledgers and its
record, a rollover whose ledger the broker lost track of, and a topic's last ledger lost on every bookie. Where the
broker must fail at one exact step, ZooKeeper refuses it that step (an ACL), as a session lost there would: the
broker is then killed, as in the reports."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE, make_acl
from pulsar.schema import JsonSchema

from scrutiny.auditor import Auditor
from scrutiny.config import AuditorSettings, MetricsSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.metadata import Layout, ledger_path
from scrutiny.pulsar.owners import owner_from_custom_metadata
from scrutiny.pulsar.scope import Scope
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at
from scrutiny.testing.realbookkeeper import RealBookKeeper, RealBookKeeperError
from scrutiny.testing.realpulsar import Order, RealPulsar
from tests.real.conftest import PulsarOn, scan, scan_settings


def refuse(zk: KazooClient, path: str, **refused: bool) -> None:
    """Every client may do anything at `path` but what `refused` names (delete, write: its data)."""
    zk.set_acls(path, [make_acl("world", "anyone", **{p: p not in refused for p in
                                                       ("read", "write", "create", "delete", "admin")})])


def allow(zk: KazooClient, path: str) -> None:
    zk.set_acls(path, OPEN_ACL_UNSAFE)


def produce(client: pulsar.Client, topic: str, count: int, name: str | None = None) -> None:
    producer = client.create_producer(topic, producer_name=name, batching_enabled=False)
    for i in range(1, count + 1):
        producer.send(f"m{i}".encode(), sequence_id=i)
    producer.close()


def wait_for(what: str, check: Callable[[], object], timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.3)
    return got


@pytest.fixture
def lossy(pulsar_on: PulsarOn) -> Iterator[tuple[RealBookKeeper, RealPulsar]]:
    cluster, _, start = pulsar_on
    yield cluster, start()


def test_the_losses_pulsar_users_report_are_found_with_their_owners(lossy: tuple[RealBookKeeper, RealPulsar],
                                                                    tmp_path: Path) -> None:
    cluster, broker = lossy
    zk = cluster.tree  # its ACLs: where the broker must fail at one step
    assert isinstance(zk, KazooClient)
    plain, doomed, dedup = broker.namespace("plain"), broker.namespace("doomed"), \
        broker.namespace("dedup", deduplication=True)
    ml = f"{broker.chroot}/managed-ledgers"
    listed, typed, leaky = (f"persistent://{plain}/{t}" for t in ("listed", "typed", "leaky"))
    cut, tail = f"persistent://{doomed}/cut", f"persistent://{dedup}/tail"
    orders = f"persistent://{broker.namespace('shop', tenant=broker.tenant('acme'))}/orders"  # a tenant unharmed
    client = broker.client()
    consumer = client.subscribe(listed, "audit", initial_position=pulsar.InitialPosition.Earliest)
    produce(client, listed, 12)
    for _ in range(6):
        consumer.acknowledge(consumer.receive(30000))
    consumer.close()
    typed_producer = client.create_producer(typed, schema=JsonSchema(Order))
    typed_producer.send(Order(item="one"))
    typed_producer.close()
    produce(client, leaky, 3)
    produce(client, orders, 12)
    produce(client, cut, 7)
    produce(client, tail, 15, name="tailer")  # three full ledgers: deduplication's snapshot at the third's end
    stats = {t: broker.stats_internal(t) for t in (listed, typed, cut, tail)}
    data_ledger = stats[listed]["ledgers"][1]["ledgerId"]  # closed, listed
    cursor_ledger = stats[listed]["cursors"]["audit"]["cursorLedger"]
    schema_ledger = stats[typed]["schemaLedgers"][0]["ledgerId"]
    cut_ledgers = [li["ledgerId"] for li in stats[cut]["ledgers"]]
    tail_last = stats[tail]["ledgers"][2]["ledgerId"]
    assert stats[tail]["ledgers"][2]["entries"] == 5

    # 1. ledgers the records need, deleted through BookKeeper's client
    bk = cluster.client()
    for lid in (data_ledger, cursor_ledger, schema_ledger):
        bk.delete(lid)

    # 2. the last ledger of a deduplicated topic, lost on every bookie of its ensemble, the topic unloaded
    broker.unload(tail)
    cluster.lose_ledger(tail_last)

    # 3. a topic's deletion cut after its ledgers and before its record
    cut_parent = f"{ml}/public/doomed/persistent"
    refuse(zk, cut_parent, delete=True)
    with pytest.raises(RealBookKeeperError):
        broker.admin("DELETE", f"/admin/v2/persistent/{doomed}/cut?force=true")
    allow(zk, cut_parent)
    with store_at(cluster.uri) as store:
        assert all(r.metadata is None for r in store.read_ledgers(cut_ledgers))  # every ledger deleted
        left = PulsarRecord.decode(store.pulsar_records([cut])).topic(cut)
    # the broker trims the ledgers it can before deleting the rest: the record is left naming its head
    assert left is not None
    named = [li.ledger_id for li in left.managed_ledger.ledgers]
    assert named

    # 4. a rollover whose new ledger the broker cannot name (its record refuses the write) nor delete, and the
    # broker killed before it could (once ZooKeeper allows it, a live broker deletes it)
    with store_at(cluster.uri) as store:
        newest = max(r.ledger_id for r in store.read_ledgers(range(0, 200)) if r.metadata is not None)
    assert newest < 9_000  # every ledger of this test under one parent znode
    parent = ledger_path(Layout.HIERARCHICAL, cluster.root, newest).rsplit("/", 1)[0]
    leaky_node = f"{ml}/public/plain/persistent/leaky"
    refuse(zk, leaky_node, write=True)
    refuse(zk, parent, delete=True)
    producer = client.create_producer(leaky, producer_name="leaker", batching_enabled=False, send_timeout_millis=0)
    for i in range(4, 12):  # fills the head (5 entries), then the broker rolls over
        producer.send_async(b"x", None, sequence_id=i)

    def leaked() -> set[int]:
        with store_at(cluster.uri) as store:
            named = PulsarRecord.decode(store.pulsar_records()).named()
            return {r.ledger_id for r in store.read_ledgers(range(newest + 1, newest + 40)) if r.metadata is not None
                    and r.ledger_id not in named and (o := owner_from_custom_metadata(r.metadata.custom_metadata))
                    is not None and o.name == leaky}

    wait_for("a ledger the broker created and could not name", leaked)
    client.close()
    broker.kill()
    allow(zk, leaky_node)
    allow(zk, parent)
    lost_track = leaked()  # each retry of the rollover left one more
    broker.start()

    report = scan(cluster, deep=True, leaked_ledger_grace_period=0)
    found = {(str(v.category), v.ledger_id): v for v in report.violations}
    expected = {("TOPIC_LEDGER_MISSING", data_ledger): ("topic", listed, "data"),
                ("TOPIC_LEDGER_MISSING", cursor_ledger): ("cursor", listed, "cursor"),
                ("TOPIC_LEDGER_MISSING", schema_ledger): ("schema", "public/plain/typed", "schema"),
                **{("TOPIC_LEDGER_MISSING", lid): ("topic", cut, "data") for lid in named},
                **{("LEAKED_LEDGER", lid): ("topic", leaky, "") for lid in lost_track},
                ("NO_REPLICA_OF_AN_ENTRY", tail_last): ("topic", tail, ""),
                ("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", stats[tail]["ledgers"][2]["ledgerId"]): ("topic", tail, "")}
    for key, (kind, name, what) in expected.items():
        v = found.get(key)
        assert v is not None, (key, sorted(found))
        assert v.owner is not None and (v.owner.kind, v.owner.name) == (kind, name), (key, v.owner)
        if key[0] == "TOPIC_LEDGER_MISSING":
            assert v.details["kind"] == what, (key, v.details)
    assert found[("TOPIC_LEDGER_MISSING", cursor_ledger)].details["subscription"] == "audit"
    ahead = found[("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", tail_last)]
    assert ahead.details["producers"] == [{"producer": "tailer", "persisted": 15, "highest_stored": 10,
                                           "last_seen": f"{stats[tail]['ledgers'][1]['ledgerId']}:4"}]
    assert report.stats["pulsar_entries_lost"] == 5
    others = {k[0] for k in found if k not in expected}
    assert others <= {"TOPIC_HEAD_LEDGER_CLOSED"}, [(k, found[k].details) for k in found if k not in expected]

    # what the guide says to do with a deletion cut short: delete it again
    broker.admin("DELETE", f"/admin/v2/persistent/{doomed}/cut?force=true")
    again = scan(cluster)
    assert not [v for v in again.violations if v.owner is not None and v.owner.name == cut]

    # 5. each tenant alone: a run of its topics, and its view in the console
    public_run, acme_run = (scan(cluster, tenants=(t,)) for t in ("public", "acme"))
    warnings = {"TOPIC_HEAD_LEDGER_CLOSED"}  # as after the whole run above
    assert {str(v.category) for v in acme_run.violations} <= warnings and acme_run.stats["pulsar_topics"] == 1
    mine = {(str(v.category), v.ledger_id) for v in public_run.violations}
    assert {("TOPIC_LEDGER_MISSING", data_ledger), ("NO_REPLICA_OF_AN_ENTRY", tail_last)} <= mine
    assert all(v.owner is not None and Scope("tenant", "public").owns(v.owner) for v in public_run.violations)
    full_run = set(expected) - {("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", tail_last)}  # a deep run's
    full_run -= {("TOPIC_LEDGER_MISSING", lid) for lid in named}  # deleted again
    still = leaked()
    full_run -= {("LEAKED_LEDGER", lid) for lid in lost_track - still}
    tenant_views(cluster, tmp_path, {"public": {"findings": full_run, "leaked": sorted(still)},
                                     "acme": {"topics": [orders], "findings": set(), "leaked": []}})


def tenant_views(cluster: RealBookKeeper, tmp_path: Path, want: dict[str, dict[str, Any]]) -> None:
    """An auditor over the cluster: once its first full run is done, each tenant's view in its console names
    its own findings (a deep run's aside: the view is the current state) and leaks, and nothing of another's."""
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), continuous=False,
                               underreplication_interval_seconds=0, insecure_open_rescan=True)
    auditor = Auditor(scan_settings(cluster, leaked_ledger_grace_period=0), settings,
                      metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb, engine=LocalEngine()).start()
    try:
        wait_for("the auditor's first full run",
                 lambda: "full" in auditor.last and auditor.last["full"].report is not None, 120)
        for tenant, wanted in want.items():
            with urllib.request.urlopen(f"http://127.0.0.1:{auditor.http.port}/api/v1/tenants?name={tenant}",
                                        timeout=60) as got:
                view = json.loads(got.read())
            found = {(f["category"], f["ledger_id"]) for f in view["findings"]}
            assert wanted["findings"] <= found, (tenant, found)
            assert {c for c, _ in found - wanted["findings"]} <= {"TOPIC_HEAD_LEDGER_CLOSED"}, (tenant, found)
            assert (view["verdict"]["level"] == "HEALTH_ERR") == bool(wanted["findings"]), view["verdict"]
            assert all(f["topic"].startswith(f"persistent://{tenant}/") for f in view["findings"])
            assert [lid for t in view["topics"] for lid in t["leaked"]] == wanted["leaked"], view["topics"]
            assert view["totals"]["leaked_ledgers"] == len(wanted["leaked"])
            if "topics" in wanted:
                assert [t["topic"] for t in view["topics"]] == wanted["topics"]
                assert view["totals"]["entries"] >= 10 and view["totals"]["bytes_stored"] > 0, view["totals"]
    finally:
        auditor.stop()
