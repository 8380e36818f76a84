"""Pulsar's own stamps on a topic's entries, read by the deep scrub from real DbLedgerStorage entry logs through
real agents over a real ZooKeeper: a message corrupted before BookKeeper stored it is found on the entries and
bookies it is on; every legitimate form of a Pulsar entry, a KoP-style entry, a cursor's ledger and a ledger
Pulsar did not tag are never reported."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.config import ScanSettings
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.metadata import BookieRegistration, LedgerMetadata
from scrutiny.pulsar import encode
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.localzk import LocalZooKeeper
from tests.support.deepbookie import Bookie, ledger

BOOKIES = [f"127.0.5.{n}:3181" for n in range(1, 4)]
TOPIC = "persistent://acme/orders/created"
OTHER = "persistent://acme/kafka/clicks"


def every_form(eid: int) -> bytes:
    """Entry `eid` of a healthy topic: each legitimate form of a Pulsar entry in turn."""
    forms = [
        {}, {"payloads": [b"a", b"bb", b"ccc"]}, {"compression": "LZ4", "payloads": [b"x" * 300, b"y" * 200]},
        {"compression": "ZSTD"}, {"compression": "ZLIB"}, {"compression": "SNAPPY"}, {"encrypted": True},
        {"broker_entry": (1_700_000_000_000 + eid, eid)}, {"checksum": False}, {"chunk": (0, 2)}, {"chunk": (1, 2)},
        {"marker_type": 2}, {"transaction": (7, 1)}, {"replicated_from": "west"},
    ]
    return encode.message("orders-1", eid, **forms[eid % len(forms)])  # type: ignore[arg-type]


def kafka_record(eid: int) -> bytes:
    """What KoP stores in Kafka's own format: not a Pulsar message at all."""
    return bytes(8) + eid.to_bytes(8, "big") + b"\x00\x00\x00\x40kafka record batch"


def shares(md: LedgerMetadata, bookie: str, body_of: dict[int, bytes]) -> dict[int, bytes]:
    """What a bookie of the ledger's one-segment ensemble stores, round robin, packaged with a good digest."""
    pos = md.segments[0].ensemble.index(bookie)
    out, length = {}, 0
    for eid in range(md.last_entry_id + 1):
        length += len(body_of[eid])
        if (pos - eid) % md.ensemble_size < md.write_quorum:
            out[eid] = entrylog.package_entry(md.ledger_id, eid, eid - 1, length, body_of[eid], md.digest_type)
    return out


@pytest.fixture
def pulsar_cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
                   tmp_path: Path) -> Iterator[ScanSettings]:
    """Ledger 10: a healthy topic ledger in every form; 11: the same topic, entry 7's message corrupted
    before BookKeeper stored it (its digest good on both copies); 12: another topic's KoP records; 13: a
    cursor's ledger and 14: a ledger nobody tagged, both holding what would fail Pulsar's checksum."""
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    corrupt = {eid: encode.message("orders-2", 100 + eid, corrupt=eid == 7) for eid in range(20)}
    bad_everywhere = {eid: encode.message("orders-3", eid, corrupt=True) for eid in range(20)}
    layout = {
        10: (encode.ledger_keys("topic", TOPIC), {eid: every_form(eid) for eid in range(28)}),
        11: (encode.ledger_keys("topic", TOPIC), corrupt),
        12: (encode.ledger_keys("topic", OTHER), {eid: kafka_record(eid) for eid in range(20)}),
        13: (encode.ledger_keys("cursor", TOPIC, cursor="sub"), bad_everywhere),
        14: ((), bad_everywhere),
    }
    mds = [dataclasses.replace(ledger(lid, BOOKIES, last=len(bodies) - 1), custom_metadata=keys)
           for lid, (keys, bodies) in layout.items()]
    w.write_ledgers(mds)
    for b in BOOKIES:
        w.register_bookie(BookieRegistration(b, False))
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    store = store_on(zk_client, uri)
    agents = []
    for n, bid in enumerate(BOOKIES):
        path = tmp_path / f"bookie{n}"
        b = Bookie(path, LiveBookie(path), EntryLog(path, 1))
        for md in mds:
            b.store(md, shares(md, bid, layout[md.ledger_id][1]))
        b.seal()
        b.index.close()
        agent = BookieAgent(DbLedgerStorageSource([path], tmp_path / f"scratch{n}"), bind="127.0.0.1:0").start()
        agent.register(store, bid, f"127.0.0.1:{agent.port}")
        agents.append(agent)
    yield ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.1, placement_policy="none")
    for a in agents:
        a.stop(grace=0)


def test_a_message_corrupted_before_bookkeeper_stored_it_is_found_and_nothing_legitimate_is(
        pulsar_cluster: ScanSettings) -> None:
    report = ScrutinyRun(dataclasses.replace(pulsar_cluster, deep=True), LocalEngine()).execute()
    assert report.complete
    violations = list(report.violations)
    assert [(str(v.category), v.ledger_id) for v in violations] == [("PULSAR_CHECKSUM_MISMATCH", 11)]
    v = violations[0]
    holders = tuple(b for b in BOOKIES if (BOOKIES.index(b) - 7) % 3 < 2)  # entry 7's write set
    assert v.bookies == holders
    assert {b: c["entries"] for b, c in v.details["copies"].items()} == {b: [[7, 7]] for b in holders}
    assert "Pulsar's CRC32C" in v.details["copies"][holders[0]]["example"]
    assert v.details["messages"] == [{"entry_id": 7, "producer": "orders-2", "sequence_ids": [107, 107]}]
    assert v.owner is not None and v.owner.name == TOPIC
    text = report.render_text()
    assert "PULSAR_CHECKSUM_MISMATCH" in text and "producer orders-2, sequence ids 107-107" in text
    assert report.stats["deep_ledgers_verified"] == 5 and report.stats["deep_entries_corrupt"] == 0

