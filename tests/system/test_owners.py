"""The operator's first question: which topic is at risk? Pulsar-shaped ledgers (data, cursor,
compacted, schema, and an old-style ledger found only through /managed-ledgers, compressed) through
real ZooKeeper, agents and Spark."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import cramjam
import pytest
from kazoo.client import KazooClient

from scrutiny.checks import expected_share
from scrutiny.config import ScanSettings
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, MetadataError, Segment
from scrutiny.pulsar import encode
from scrutiny.pulsar import managed_ledger_pb2 as mlpb
from scrutiny.pulsar.owners import owner_from_custom_metadata
from scrutiny.pulsar.records import LedgerInfo, ManagedLedgerRecord, topic_of
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper
from tests.support.helpers import synthetic_agents

ENS = ("127.0.6.1:3181", "127.0.6.2:3181", "127.0.6.3:3181")
ORDERS, PRICES, LEGACY = ("persistent://public/default/orders", "persistent://public/default/prices",
                          "persistent://public/default/legacy topic")


def pulsar(component: str, **keys: str) -> tuple[tuple[str, bytes], ...]:
    """Pulsar's keys: `managed_ledger=...` is `pulsar/managed-ledger`, `compactedTopic=...` `pulsar/compactedTopic`."""
    return (("application", b"pulsar"), ("component", component.encode()),
            *((f"pulsar/{k.replace('_', '-')}", v.encode()) for k, v in keys.items()))


# ledger id -> (custom metadata, loses a copy?)
LEDGERS: dict[int, tuple[tuple[tuple[str, bytes], ...], bool]] = {
    101: (pulsar("managed-ledger", managed_ledger="public/default/persistent/orders"), True),
    102: (pulsar("managed-ledger", managed_ledger="public/default/persistent/orders",
                 cursor="sub-1"), True),
    103: (pulsar("compacted-ledger", compactedTopic=PRICES), True),
    104: (pulsar("schema", schemaId="public/default/orders"), True),
    105: ((), True),  # an old Pulsar's ledger: no keys; only /managed-ledgers knows it
    106: ((), True),  # offloaded to tiered storage, bookkeeperDeleted: not BookKeeper's any more
    107: (pulsar("managed-ledger", managed_ledger="public/default/persistent/orders"), False),
    108: ((("application", b"my-app"),), True),
}


@pytest.fixture
def pulsar_cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
                   tmp_path: Path) -> Iterator[str]:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    store = SyntheticStoreWriter()
    for lid, (custom, loses) in LEDGERS.items():
        md = LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, 49, 0, (Segment(0, ENS),), custom_metadata=custom)
        w.write_ledgers([md])
        for b in (ENS[2:] if lid == 108 else ENS[1:]) if loses else ENS:  # 108 lost two copies
            if lid != 106:  # the offloaded ledger's copies are gone from every bookie
                store.add(b, lid, expected_share(md, b))
    for b in ENS:
        w.register_bookie(BookieRegistration(b, False))
    w.write_managed_ledger("public/default/persistent/orders",
                           encode.managed_ledger([LedgerInfo(101, 50, 5000), LedgerInfo(107, 50, 5000)], "LZ4"),
                           {"sub-1": encode.cursor(102)})
    w.write_managed_ledger("public/default/persistent/prices", encode.managed_ledger([]),
                           {"__compaction": encode.compaction_cursor(103)})
    w.write_managed_ledger("public/default/persistent/legacy+topic",  # Java's URLEncoder: a space is +
                           encode.managed_ledger([LedgerInfo(105, 50, 5000), LedgerInfo(106, 50, 5000, True, True)],
                                                 "ZLIB"))
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    with synthetic_agents(store, tmp_path, store_on(zk_client, uri)):
        yield uri


def test_names_and_topic_of_custom_metadata() -> None:
    assert topic_of("public/default/persistent/a%20b") == "persistent://public/default/a b"
    assert topic_of("public/default/persistent/a+b%2B") == "persistent://public/default/a b+"
    assert topic_of("prop/cluster/ns/persistent/t") == "persistent://prop/cluster/ns/t"  # v1 names
    assert owner_from_custom_metadata(LEDGERS[102][0]).to_json() == {"kind": "cursor", "name": ORDERS,  # type: ignore[union-attr]
                                                                    "cursor": "sub-1"}
    assert owner_from_custom_metadata(()) is None


def test_every_finding_names_its_owner(pulsar_cluster: str, spark_engine: object) -> None:
    settings = ScanSettings(metadata_service_uri=pulsar_cluster, placement_policy="none", recheck_delay=0.2)
    report = ScrutinyRun(settings, spark_engine).execute()  # type: ignore[arg-type]
    doc = report.to_json()
    owners = {v["ledger_id"]: v["owner"] for v in doc["violations"]}
    assert owners == {
        101: {"kind": "topic", "name": ORDERS},
        102: {"kind": "cursor", "name": ORDERS, "cursor": "sub-1"},
        103: {"kind": "compacted-topic", "name": PRICES},
        104: {"kind": "schema", "name": "public/default/orders"},
        105: {"kind": "topic", "name": LEGACY},  # found through /managed-ledgers (ZLIB-compressed)
        108: {"kind": "other", "name": "my-app"},
    }
    assert 106 not in owners and report.stats["dropped_offloaded"] == 1  # offloaded: never "missing"
    rows = doc["owners"]
    # worst first: the owner whose ledger lost every copy of some entries, then those below AQ
    assert rows[0] == {"kind": "other", "name": "my-app", "counts": {"NO_REPLICA_OF_AN_ENTRY": 1}}
    assert len(rows) == 6 and all(r["counts"] == {"LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY": 1} for r in rows[1:])
    text = report.render_text()
    assert text.splitlines()[2].startswith("at risk") and f"topic           {ORDERS}" in text
    assert f"cursor          {ORDERS} cursor sub-1" in text


def test_scan_of_one_topic(pulsar_cluster: str, tmp_path: Path) -> None:
    settings = ScanSettings(metadata_service_uri=pulsar_cluster, placement_policy="none", recheck_delay=0.2,
                            topics=(ORDERS,))
    report = ScrutinyRun(settings, LocalEngine()).execute()
    assert report.ledgers["seen"] == 3  # data ledgers 101 and 107, cursor ledger 102
    assert {v.ledger_id for v in report.violations} == {101, 102}
    out = subprocess.run([sys.executable, "-m", "scrutiny.cli", "scan", "--metadata-service-uri", pulsar_cluster,
                          "--engine", "local", "--placement-policy", "none", "--recheck-delay", "0.2",
                          "--topic", PRICES, "--format", "json"], capture_output=True, text=True)
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and doc["ledgers"]["seen"] == 1  # the compacted ledger, via __compaction
    assert doc["violations"][0]["owner"] == {"kind": "compacted-topic", "name": PRICES}


def _pulsar_framed(body: bytes, codec: str) -> bytes:
    """A record as Pulsar's MetaStoreImpl writes it with each CompressionCodec (written here apart from
    scrutiny's own encoder): ZLIB deflates with SYNC_FLUSH and never finishes the stream, LZ4 is a raw
    block, ZSTD one frame, SNAPPY raw."""
    if codec == "ZLIB":
        deflater = zlib.compressobj()
        packed = deflater.compress(body) + deflater.flush(zlib.Z_SYNC_FLUSH)
    else:
        packed = bytes({"LZ4": lambda b: cramjam.lz4.compress_block(b, store_size=False),
                        "ZSTD": cramjam.zstd.compress, "SNAPPY": cramjam.snappy.compress_raw}[codec](body))
    meta = mlpb.ManagedLedgerInfoMetadata(compressionType=codec, uncompressedSize=len(body)).SerializeToString()
    return b"\x47\x78" + struct.pack(">i", len(meta)) + meta + packed


@pytest.mark.parametrize("codec", ["ZLIB", "LZ4", "ZSTD", "SNAPPY"])
def test_a_record_compressed_as_pulsar_compresses_it_is_read(codec: str) -> None:
    body = encode.managed_ledger(range(1000, 1400))  # over 16 KB would be compressed since PIP-270; any size here
    framed = _pulsar_framed(body, codec)
    assert not framed.endswith(zlib.compress(body)[-4:])  # (no Adler-32: the stream is never finished)
    assert [li.ledger_id for li in ManagedLedgerRecord.from_node("t", framed).ledgers] == list(range(1000, 1400))
    assert ManagedLedgerRecord.from_node("t", encode.managed_ledger([7], codec)).ledgers == (LedgerInfo(7, 10, 1000),)
    with pytest.raises(MetadataError, match="undecodable compressed value"):
        ManagedLedgerRecord.from_node("t", framed[:-7])
