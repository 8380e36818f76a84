"""The real thing on etcd (#66 item 4): a real broker and its bookies keeping every record on Pulsar's metadata store
on etcd (`metadataStoreUrl=etcd:...`, `metadataServiceUri=metadata-store:etcd:...`), read by scrutiny's etcd store.
What the ZooKeeper tests check there, here: every owner the broker names, every message counted, a deep run clean
while a producer churns; then ledgers a topic needs deleted through BookKeeper's own shell, and a deduplicated
topic's last ledger lost on every bookie, found with their owners, in the whole run and in the tenant's alone."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pulsar
import pytest
from pulsar.schema import JsonSchema

from scrutiny.pulsar.scope import Scope
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.scan.cursorledgers import CursorLedgers
from scrutiny.store.etcd import EtcdStore
from scrutiny.testing import store_at
from scrutiny.testing.realbookkeeper import RealBookKeeper
from scrutiny.testing.realpulsar import Order, RealPulsar
from tests.real.conftest import PulsarOn, scan, scan_settings
from tests.real.test_pulsar import Churn, Produced, owners_agree


@pytest.fixture
def on_etcd(pulsar_on_etcd: PulsarOn) -> Iterator[tuple[RealBookKeeper, RealPulsar]]:
    cluster, _, start = pulsar_on_etcd
    yield cluster, start()


def test_a_broker_on_etcd_is_read_whole_and_its_losses_found_with_their_owners(
        on_etcd: tuple[RealBookKeeper, RealPulsar]) -> None:
    cluster, broker = on_etcd
    plain, dedup = broker.namespace("plain"), broker.namespace("dedup", deduplication=True)
    listed, typed, parted = (f"persistent://{plain}/{t}" for t in ("listed", "typed", "parted"))
    tail = f"persistent://{dedup}/tail"
    orders = f"persistent://{broker.namespace('shop', tenant=broker.tenant('acme'))}/orders"  # a tenant unharmed
    produced = Produced()
    client = broker.client()
    # three full ledgers: deduplication's snapshot at the third's end
    produced.send(client.create_producer(tail, producer_name="tailer", batching_enabled=False), tail, range(1, 16))
    consumer = client.subscribe(listed, "audit", initial_position=pulsar.InitialPosition.Earliest)
    produced.send(client.create_producer(listed, batching_enabled=False), listed, range(1, 13))
    for _ in range(6):
        consumer.acknowledge(consumer.receive(30000))
    consumer.close()
    produced.send(client.create_producer(typed, schema=JsonSchema(Order)), typed, range(1, 4),
                  payload=lambda i: Order(item=f"item-{i}"))
    broker.admin("PUT", f"/admin/v2/persistent/{plain}/parted/partitions", 2)
    produced.send(client.create_producer(parted), parted, range(1, 11))
    produced.send(client.create_producer(orders, batching_enabled=False), orders, range(1, 13))
    time.sleep(2)  # the last rollover named in its record (the broker's view is ahead of it a moment), the flushes
    topics = [listed, typed, orders, tail, *(f"{parted}-partition-{i}" for i in range(2))]

    with store_at(cluster.uri) as store:
        assert isinstance(store, EtcdStore)
        cursors = CursorLedgers(scan_settings(cluster), store)
        try:
            owners_agree(store, cursors, broker, topics)
        finally:
            cursors.close()
        checks = [t.topic for t in PulsarRecord.decode(store.pulsar_records()).topics.values()
                  if t.topic.startswith("persistent://pulsar/") and t.topic.endswith("/healthcheck")]

    tail_stats = broker.stats_internal(tail)  # (not loaded again after the unload below)
    tail_last = tail_stats["ledgers"][2]["ledgerId"]
    assert tail_stats["ledgers"][2]["entries"] == 5
    churned = f"persistent://{dedup}/churn"
    churn = Churn(client, churned)  # a deep run while it writes and its ledgers roll over: clean
    try:
        live = scan(cluster, deep=True, leaked_ledger_grace_period=0)
    finally:
        produced.messages[churned] += churn.stop()
    assert [(str(v.category), v.ledger_id, v.details) for v in live.violations] == []
    client.close()
    for check in checks:  # the broker's own health checks: one message an entry
        produced.messages[check] = broker.stats_internal(check)["numberOfEntries"]
    for topic in [*topics, churned, *checks]:  # every head closed: every message stored is in a closed ledger
        broker.unload(topic)
    done = scan(cluster, deep=True)
    assert {str(v.category) for v in done.violations} <= {"TOPIC_HEAD_LEDGER_CLOSED"}, done.violations
    assert done.stats["pulsar_validation_stopped"] == 0
    assert done.stats["pulsar_messages_validated"] == sum(produced.messages.values()), produced.messages

    client = broker.client()  # the subscription's cursor, reloaded, gets a ledger again as it moves
    consumer = client.subscribe(listed, "audit")
    for _ in range(3):
        consumer.acknowledge(consumer.receive(30000))
    deadline = time.monotonic() + 60
    while (cursor := broker.stats_internal(listed)["cursors"]["audit"])["cursorLedger"] < 0:
        assert time.monotonic() < deadline, cursor
        time.sleep(0.3)
    client.close()
    data_ledger = broker.stats_internal(listed)["ledgers"][1]["ledgerId"]  # closed, listed
    cursor_ledger = cursor["cursorLedger"]
    for lid in (data_ledger, cursor_ledger):  # deleted through BookKeeper's own client, on etcd
        cluster.shell("deleteledger", "-ledgerid", str(lid), "-force")
    cluster.lose_ledger(tail_last)

    report = scan(cluster, deep=True)
    found = {(str(v.category), v.ledger_id): v for v in report.violations}
    expected = {("TOPIC_LEDGER_MISSING", data_ledger): ("topic", listed),
                ("TOPIC_LEDGER_MISSING", cursor_ledger): ("cursor", listed),
                ("NO_REPLICA_OF_AN_ENTRY", tail_last): ("topic", tail),
                ("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", tail_last): ("topic", tail)}
    for key, (kind, name) in expected.items():
        v = found.get(key)
        assert v is not None, (key, sorted(found))
        assert v.owner is not None and (v.owner.kind, v.owner.name) == (kind, name), (key, v.owner)
    assert found[("TOPIC_LEDGER_MISSING", cursor_ledger)].details["subscription"] == "audit"
    assert found[("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", tail_last)].details["producers"] == [
        {"producer": "tailer", "persisted": 15, "highest_stored": 10,
         "last_seen": f"{tail_stats['ledgers'][1]['ledgerId']}:4"}]
    assert report.stats["pulsar_entries_lost"] == 5
    assert {k[0] for k in found if k not in expected} <= {"TOPIC_HEAD_LEDGER_CLOSED"}, sorted(found)

    public_run, acme_run = (scan(cluster, tenants=(t,)) for t in ("public", "acme"))
    assert {str(v.category) for v in acme_run.violations} <= {"TOPIC_HEAD_LEDGER_CLOSED"}
    assert acme_run.stats["pulsar_topics"] == 1
    assert {("TOPIC_LEDGER_MISSING", data_ledger), ("NO_REPLICA_OF_AN_ENTRY", tail_last)} <= \
        {(str(v.category), v.ledger_id) for v in public_run.violations}
    assert all(v.owner is not None and Scope("tenant", "public").owns(v.owner) for v in public_run.violations)
