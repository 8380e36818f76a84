"""The real thing, part 2: a real Pulsar broker on real bookies, written to by Pulsar's own Python client, its records
in the tests' ZooKeeper as a production broker keeps them. Every Pulsar check of scrutiny's reads what the broker
wrote: topics of every form are clean and counted, every owner is the one the broker names, and the
deduplication snapshot is the one the broker reports."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest
from pulsar.schema import JsonSchema

from scrutiny.pulsar.owners import Owner, owner_from_custom_metadata
from scrutiny.pulsar.records import COMPACTED_LEDGER_PROPERTY, COMPACTION_CURSOR, Position
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.scan.cursorledgers import CursorLedgers
from scrutiny.scan.messages import dedup_snapshot
from scrutiny.store import MetadataStore
from scrutiny.testing import store_at
from scrutiny.testing.realbookkeeper import RealBookKeeper
from scrutiny.testing.realpulsar import CODECS, Order, RealPulsar, records_in, topic_ledgers
from tests.real.conftest import PulsarOn, scan, scan_settings

KINDS = {"topic": "topic", "cursor": "cursor", "compacted": "compacted-topic", "schema": "schema"}  # stats-internal's


@dataclasses.dataclass
class Produced:
    """What the tests' producers were told was persisted: messages per topic (a chunked message once)."""

    messages: Counter[str] = dataclasses.field(default_factory=Counter)

    def send(self, producer: pulsar.Producer, topic: str, ids: range,
             payload: Callable[[int], Any] = lambda i: f"m{i}".encode(), batched: bool = False,
             key: Callable[[int], str] | None = None) -> None:
        results: list[pulsar.Result] = []
        for i in ids:
            kw = {"partition_key": key(i)} if key else {}
            if batched:
                producer.send_async(payload(i), lambda result, _: results.append(result), sequence_id=i, **kw)
            else:
                producer.send(payload(i), sequence_id=i, **kw)
        producer.flush()
        assert results.count(pulsar.Result.Ok) == (len(ids) if batched else 0), results
        self.messages[topic] += len(ids)


class Churn:
    """A producer writing batches to a deduplicated topic while a scan runs: its ledgers roll over every few entries."""

    def __init__(self, client: pulsar.Client, topic: str) -> None:
        self.producer = client.create_producer(topic, producer_name="churn", batching_enabled=True,
                                               batching_max_messages=3, batching_max_publish_delay_ms=5)
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 1
        while not self._stop.is_set():
            for _ in range(3):
                self.producer.send_async(b"c", None, sequence_id=i)
                i += 1
            self.producer.flush()
            self.sent = i - 1
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        self.producer.close()
        return self.sent


def owners_agree(store: MetadataStore, cursors: CursorLedgers, broker: RealPulsar, topics: list[str]) -> None:
    """Each ledger the broker names for a topic (stats-internal) is the one scrutiny's reading of Pulsar's record
    names, for the same thing (a live compaction's ledger: in its cursor's own ledger), and its own custom metadata
    says so too; and scrutiny names no other."""
    record = PulsarRecord.decode(store.pulsar_records())
    assert record.problems == ()
    owners = record.owners()
    for topic in topics:
        t = record.topic(topic)
        assert t is not None, topic
        compaction = t.cursors.get(COMPACTION_CURSOR)
        if compaction is not None and compaction.ledger_id >= 0 and (live := cursors.mark_delete(topic, compaction)):
            owners.setdefault(live[1][COMPACTED_LEDGER_PROPERTY], Owner("compacted-topic", topic))
        theirs = topic_ledgers(broker.stats_internal(topic))
        ours = {lid for lid, o in owners.items() if o.kind != "schema" and o.name == topic}
        assert ours == {lid for lid, (kind, _) in theirs.items() if kind != "schema"}, topic
        mds = {r.ledger_id: r.metadata for r in store.read_ledgers(sorted(theirs))}
        for lid, (kind, cursor) in theirs.items():
            assert owners[lid].kind == KINDS[kind] and owners[lid].cursor == cursor, (topic, lid, owners[lid])
            md = mds[lid]
            assert md is not None
            tagged = owner_from_custom_metadata(md.custom_metadata)
            assert tagged is not None and tagged.kind == KINDS[kind], (topic, lid, tagged)
            if kind != "schema":
                assert tagged.name == topic and tagged.cursor == cursor, (topic, lid, tagged)


@pytest.fixture
def broker_on(pulsar_on: PulsarOn) -> Iterator[tuple[RealBookKeeper, RealPulsar]]:
    cluster, _, start = pulsar_on
    yield cluster, start(maxMessageSize=16384, **records_in("NONE"))


def test_topics_of_every_form_are_clean_and_every_message_is_counted(
        broker_on: tuple[RealBookKeeper, RealPulsar]) -> None:
    cluster, broker = broker_on
    dedup, plain = broker.namespace("dedup", deduplication=True), broker.namespace("plain")
    produced = Produced()
    codec_topics = []
    for n, (codec, compression) in enumerate(CODECS.items()):
        if n:  # the broker's records in this codec from now on: each topic's is written again as it changes
            broker.stop()
            broker.start(**records_in(codec))
        topic = f"persistent://{dedup}/codec-{codec.lower()}"
        client = broker.client()
        producer = client.create_producer(topic, producer_name=f"p-{codec}", batching_enabled=True,
                                          batching_max_messages=4, batching_max_publish_delay_ms=20,
                                          compression_type=compression)
        consumer = client.subscribe(topic, f"sub-{codec}", initial_position=pulsar.InitialPosition.Earliest)
        produced.send(producer, topic, range(1, 24), batched=True)
        for _ in range(10):
            consumer.acknowledge(consumer.receive(30000))
        client.close()
        codec_topics.append(topic)
    client = broker.client()
    chunked = f"persistent://{dedup}/chunked"
    produced.send(client.create_producer(chunked, producer_name="chunker", chunking_enabled=True), chunked,
                  range(1, 3), payload=lambda i: bytes(40_000))
    typed = f"persistent://{plain}/orders"
    produced.send(client.create_producer(typed, schema=JsonSchema(Order)), typed, range(1, 8),
                  payload=lambda i: Order(item=f"item-{i}"))
    compacted = f"persistent://{plain}/prices"
    produced.send(client.create_producer(compacted), compacted, range(1, 13), key=lambda i: f"k{i % 4}")
    broker.admin("PUT", f"/admin/v2/persistent/{plain}/prices/compaction")
    parted = f"persistent://{plain}/parted"
    broker.admin("PUT", f"/admin/v2/persistent/{plain}/parted/partitions", 2)
    produced.send(client.create_producer(parted), parted, range(1, 11))
    gone = f"persistent://{plain}/gone"
    produced.send(client.create_producer(gone), gone, range(1, 7))
    broker.admin("DELETE", f"/admin/v2/persistent/{plain}/gone?force=true")
    del produced.messages[gone]
    deadline = time.monotonic() + 60
    while broker.admin("GET", f"/admin/v2/persistent/{plain}/prices/compaction")["status"] != "SUCCESS":
        assert time.monotonic() < deadline, "compaction did not finish"
        time.sleep(0.5)
    time.sleep(2)  # the bookies' write caches flushed (flushInterval 1 s): the agents read what is on disk
    partitions = [f"{parted}-partition-{i}" for i in range(2)]
    topics = [*codec_topics, chunked, typed, compacted, *partitions]
    churned = f"persistent://{dedup}/churn"

    with store_at(cluster.uri) as store:
        cursors = CursorLedgers(scan_settings(cluster), store)
        try:
            owners_agree(store, cursors, broker, topics)
            record = PulsarRecord.decode(store.pulsar_records())
            for topic in [*codec_topics, chunked]:  # the live snapshot, from the cursor's own ledger, is the broker's
                t = record.topic(topic)
                assert t is not None
                stats = broker.stats_internal(topic)["cursors"]["pulsar.dedup"]
                assert dedup_snapshot(t, cursors) == (Position.parse(stats["markDeletePosition"]),
                                                      stats["properties"]), topic
        finally:
            cursors.close()

    churn = Churn(client, churned)  # a deep run while it writes and its ledgers roll over: clean
    try:
        live = scan(cluster, deep=True, leaked_ledger_grace_period=0)  # every unnamed ledger a candidate
    finally:
        produced.messages[churned] += churn.stop()
    assert [(str(v.category), v.ledger_id, v.details) for v in live.violations] == []
    client.close()

    with store_at(cluster.uri) as store:  # the broker's own health-check topic (Pulsar 3.0 keeps its head open)
        checks = [t.topic for t in PulsarRecord.decode(store.pulsar_records()).topics.values()
                  if t.topic.startswith("persistent://pulsar/") and t.topic.endswith("/healthcheck")]
    for check in checks:  # one message per check, each an entry, in the ledgers the topic lists
        produced.messages[check] = broker.stats_internal(check)["numberOfEntries"]
    for topic in [*topics, churned, *checks]:  # every head closed: every message stored is in a closed ledger
        broker.unload(topic)
    done = scan(cluster, deep=True)
    heads = {str(v.category) for v in done.violations}
    assert heads <= {"TOPIC_HEAD_LEDGER_CLOSED"}, [(str(v.category), v.ledger_id, v.details) for v in done.violations]
    stats = done.stats
    assert stats["pulsar_validation_stopped"] == 0
    assert stats["pulsar_messages_validated"] == sum(produced.messages.values()), produced.messages
    assert stats["pulsar_dedup_snapshots_judged"] == len(codec_topics) + 2  # and chunked's, churn's
    assert stats["pulsar_dedup_snapshots_waiting"] == 0


def test_a_snapshot_written_when_an_idle_producer_is_forgotten_is_judged_at_its_horizon(pulsar_on: PulsarOn) -> None:
    """#56 item 5, settled on the broker: forgetting an idle producer, deduplication writes the current ids at the
    old mark-delete, so the stored snapshot holds ids persisted in a later ledger. Judged at the end of its
    position's ledger it would say they are gone; judged at its horizon, nothing is."""
    cluster, _, start = pulsar_on
    broker = start(brokerDeduplicationProducerInactivityTimeoutMinutes=1,  # forgotten after 1 min, checked every 20 s
                   brokerDeduplicationSnapshotIntervalSeconds=0)  # no timer snapshot: every 5 entries, and the purge
    topic = f"persistent://{broker.namespace('dedup', deduplication=True)}/purged"
    client = broker.client()
    produced = Produced()
    idle = client.create_producer(topic, producer_name="idle")
    produced.send(idle, topic, range(1, 4))
    idle.close()  # inactive from now on
    steady = client.create_producer(topic, producer_name="steady")  # connected throughout
    produced.send(steady, topic, range(1, 3))  # entries 3-4: the first ledger full, a snapshot at its 5th entry
    # One snapshot by count only: the broker skips one asked for while the last is still being stored, and the stats
    # show a mark-delete before it is stored (a second, five entries later, was skipped on a loaded machine).
    deadline = time.monotonic() + 60
    while (before := broker.stats_internal(topic))["cursors"].get("pulsar.dedup", {}).get("properties") != \
            {"idle": 3, "steady": 2}:
        assert time.monotonic() < deadline, f"no deduplication snapshot: {before['cursors']}"
        time.sleep(0.5)
    first = before["ledgers"][0]["ledgerId"]
    assert before["cursors"]["pulsar.dedup"]["markDeletePosition"] == f"{first}:4"
    produced.send(steady, topic, range(3, 7))  # entries 5-8: the second ledger, its head (no snapshot by count)
    assert len(broker.stats_internal(topic)["ledgers"]) == 2

    def purged() -> dict[str, Any] | None:
        cursor: dict[str, Any] = broker.stats_internal(topic)["cursors"]["pulsar.dedup"]
        return cursor if "idle" not in cursor["properties"] else None

    deadline = time.monotonic() + 150
    while (after := purged()) is None:
        assert time.monotonic() < deadline, "the broker did not forget the idle producer"
        time.sleep(2)
    # the old position, and steady's 3 to 6, persisted in the second ledger
    assert after["markDeletePosition"] == f"{first}:4" and after["properties"] == {"steady": 6}

    live = scan(cluster, deep=True)
    assert [str(v.category) for v in live.violations] == []
    assert live.stats["pulsar_dedup_snapshots_waiting"] == 1 and live.stats["pulsar_dedup_snapshots_judged"] == 0
    steady.close()
    client.close()
    broker.unload(topic)
    done = scan(cluster, deep=True)
    assert {str(v.category) for v in done.violations} <= {"TOPIC_HEAD_LEDGER_CLOSED"}
    assert done.stats["pulsar_dedup_snapshots_judged"] == 1
    assert done.stats["pulsar_messages_validated"] == sum(produced.messages.values())
