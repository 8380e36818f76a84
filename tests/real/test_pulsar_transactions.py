"""Transactions on a real broker (#66 item 2), written and acknowledged by Pulsar's own Java client
(`TransactionTool`: the Python client has none): committed and aborted transactions on a deduplicated topic and a
partitioned one, and acknowledgements in a transaction. The coordinators' logs, the transaction buffers' snapshot
topics and the pending acknowledgements are managed ledgers of their own: every ledger of theirs is named with the
owner its own metadata says, and nothing is a false alarm, live or unloaded. The message validation counts what
consumers receive: a committed transaction's messages, and an aborted one's apart. A coordinator's log and a
pending acknowledgement's ledger lost are found with their owners and what that means for the transactions.

One thing is not clean, and truly so: the first snapshot of a namespace's transaction buffer registers its topic's
schema from two places at once, and Pulsar up to 4.0.7 keeps the loser's schema ledger (apache/pulsar#25514, fixed
upstream in 2026): a ledger Pulsar created that nothing names, `LEAKED_LEDGER`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from scrutiny.pulsar.owners import Owner, owner_from_custom_metadata
from scrutiny.pulsar.records import COMPACTED_LEDGER_PROPERTY, COMPACTION_CURSOR
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.pulsar.transactions import SNAPSHOT_TOPICS
from scrutiny.report import Report
from scrutiny.scan.cursorledgers import CursorLedgers
from scrutiny.testing import store_at
from scrutiny.testing.realbookkeeper import RealBookKeeper
from scrutiny.testing.realpulsar import RealPulsar
from tests.real.conftest import PulsarOn, scan, scan_settings

SNAPSHOTS = SNAPSHOT_TOPICS[0]  # each namespace's system topic of its buffers' snapshots


@pytest.fixture
def transactional(pulsar_on: PulsarOn) -> Iterator[tuple[RealBookKeeper, RealPulsar]]:
    cluster, _, start = pulsar_on
    yield cluster, start(transactionCoordinatorEnabled="true", systemTopicEnabled="true")


def orphan_schemas(cluster: RealBookKeeper) -> set[int]:
    """Every ledger whose own metadata names its owner is the ledger the broker's record names for that owner,
    but the snapshot topics' schema ledgers that lost the locator's race (named by none)."""
    with store_at(cluster.uri) as store:
        cursors = CursorLedgers(scan_settings(cluster), store)
        try:
            record = PulsarRecord.decode(store.pulsar_records())
            assert record.problems == ()
            owners = record.owners()
            for t in record.topics.values():  # a live compaction's ledger (the snapshot topics are compacted)
                compaction = t.cursors.get(COMPACTION_CURSOR)
                if compaction is not None and compaction.ledger_id >= 0 and \
                        (live := cursors.mark_delete(t.topic, compaction)):
                    owners.setdefault(live[1][COMPACTED_LEDGER_PROPERTY], Owner("compacted-topic", t.topic))
        finally:
            cursors.close()
        tagged = {r.ledger_id: o for r in store.read_ledgers(range(0, 400))
                  if r.metadata is not None and (o := owner_from_custom_metadata(r.metadata.custom_metadata))}
    orphans = set()
    for lid, owner in tagged.items():
        if lid in owners:
            assert (owners[lid].kind, owners[lid].name) == (owner.kind, owner.name), (lid, owners[lid], owner)
        else:
            assert owner.kind == "schema" and owner.name.endswith(f"/{SNAPSHOTS}"), (lid, owner)
            assert any(s.versions for s in record.schemas.values() if s.schema_id == owner.name), owner
            orphans.add(lid)
    kinds = {(o.kind, o.name.rsplit("/", 1)[-1].rstrip("0123456789")) for o in tagged.values()}
    assert {("topic", "__transaction_log_"), ("topic", "orders-audit__transaction_pending_ack"),
            ("topic", SNAPSHOTS)} <= kinds, kinds
    return orphans


def leaks(report: Report) -> set[int]:
    return {v.ledger_id for v in report.violations if str(v.category) == "LEAKED_LEDGER"}


def test_transactions_ledgers_are_named_and_nothing_is_a_false_alarm(
        transactional: tuple[RealBookKeeper, RealPulsar]) -> None:
    cluster, broker = transactional
    dedup, plain = broker.namespace("dedup", deduplication=True), broker.namespace("plain")
    deduped, parted = f"persistent://{dedup}/orders", f"persistent://{plain}/parted"
    broker.admin("PUT", f"/admin/v2/persistent/{plain}/parted/partitions", 2)
    one = broker.transactions("produce", deduped, "txn-orders", 1, "c3", "a2", "c4")
    two = broker.transactions("produce", parted, "txn-parted", 1, "c4", "a4", "c2")  # each partition in each
    assert (one["committed"], one["aborted"], two["committed"], two["aborted"]) == (7, 2, 6, 4)
    broker.transactions("acknowledge", deduped, "audit", 3, "c")  # the subscription's pending acknowledgements
    time.sleep(2)  # the buffers' snapshots written, the bookies' write caches flushed

    orphans = orphan_schemas(cluster)
    live = scan(cluster, deep=True, leaked_ledger_grace_period=0)  # every unnamed ledger a candidate
    assert leaks(live) == orphans
    assert [(str(v.category), v.ledger_id, v.details) for v in live.violations
            if v.ledger_id not in orphans] == []
    for v in live.violations:
        assert v.owner is not None and v.owner.kind == "schema" and v.details["kind"] == "schema", v

    snapshots = [f"persistent://{ns}/{SNAPSHOTS}" for ns in (dedup, plain)]
    topics = [deduped, *(f"{parted}-partition-{i}" for i in range(2)), *snapshots]
    with store_at(cluster.uri) as store:
        checks = [t.topic for t in PulsarRecord.decode(store.pulsar_records()).topics.values()
                  if t.topic.startswith("persistent://pulsar/") and t.topic.endswith("/healthcheck")]
    entries = {t: broker.stats_internal(t)["numberOfEntries"] for t in [*snapshots, *checks]}
    for topic in [*topics, *checks]:  # every head closed: every message stored is in a closed ledger
        broker.unload(topic)
    done = scan(cluster, deep=True)
    assert leaks(done) <= orphans
    assert {str(v.category) for v in done.violations if v.ledger_id not in orphans} <= {"TOPIC_HEAD_LEDGER_CLOSED"}
    stats = done.stats
    # the commit and abort markers: one a transaction on the deduplicated topic, one a partition it wrote on
    assert stats["pulsar_markers"] == 3 + 3 * 2, stats
    # what consumers receive: the committed transactions' messages, the snapshots and the health checks (one
    # message an entry); the aborted ones apart
    assert stats["pulsar_messages_validated"] == 7 + 6 + sum(entries.values()), (stats, entries)
    assert (stats["pulsar_messages_aborted"], stats["pulsar_messages_in_open_transactions"]) == (2 + 4, 0), stats
    assert (stats["pulsar_transactions_committed"], stats["pulsar_transactions_aborted"]) == (2 + 2 * 2, 1 + 2), stats
    assert orphan_schemas(cluster) == orphans

    # transaction ledgers lost (deleted through BookKeeper's own shell): a coordinator's log, and the pending
    # acknowledgements of the subscription (closed with its topic's unload): each found with its owner and what it
    # means for the transactions
    pending = f"{deduped}-audit__transaction_pending_ack"
    with store_at(cluster.uri) as store:
        named = {t.topic: t for t in PulsarRecord.decode(store.pulsar_records()).topics.values()}
    log_topic = next(t for t in sorted(named) if "/__transaction_log_" in t)
    lost = {named[log_topic].managed_ledger.ledgers[-1].ledger_id: (log_topic, "coordinator-log"),
            named[pending].managed_ledger.ledgers[-1].ledger_id: (pending, "pending-ack")}
    for lid in lost:
        cluster.shell("deleteledger", "-ledgerid", str(lid), "-force")
    report = scan(cluster)
    found = {v.ledger_id: v for v in report.violations if str(v.category) == "TOPIC_LEDGER_MISSING"}
    assert set(found) == set(lost), sorted(found)
    for lid, (topic, role) in lost.items():
        v = found[lid]
        assert v.owner is not None and (v.owner.kind, v.owner.name) == ("topic", topic), v
        assert v.details["transactions"] == role and "transaction" in v.details["depends"], v.details
