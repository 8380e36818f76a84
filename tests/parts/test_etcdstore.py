"""The metadata store on a real etcd, as Pulsar's metadata-store driver keeps BookKeeper's metadata there:
URIs, the tree's shapes (both path lengths, parent keys or none, stray keys), dense and sparse reads,
versions, marks, registrations and the leases under them, scrutiny's election and its failover."""

from __future__ import annotations

import dataclasses
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scrutiny.auditor.leadership import cadence
from scrutiny.config import ClusterSettings
from scrutiny.errors import ConfigError, StoreError
from scrutiny.metadata import (
    BookieRegistration,
    LedgerMetadata,
    LedgerState,
    MetadataError,
    Segment,
    UnderreplicationMark,
    ledger_path,
    parse_metadata_service_uri,
)
from scrutiny.store import MetadataStoreUnavailable, open_store
from scrutiny.store.etcd import DENSE, EtcdStore
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localetcd import EtcdTree, LocalEtcd
from tests.support.certs import CertificateAuthority
from tests.support.helpers import wait_for

B = ("127.0.8.1:3181", "127.0.8.2:3181", "127.0.8.3:3181")


def closed(lid: int, last: int = 9) -> LedgerMetadata:
    return LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, last, (last + 1) * 10, (Segment(0, B),))


def open_etcd(etcd: LocalEtcd, **kw: object) -> EtcdStore:
    store = open_store(ClusterSettings(metadata_service_uri=etcd.uri, **kw))  # type: ignore[arg-type]
    assert isinstance(store, EtcdStore)
    return store


@pytest.mark.parametrize("uri, endpoints", [
    ("metadata-store:etcd:http://127.0.0.1:2379", ("http://127.0.0.1:2379",)),
    ("metadata-store:etcd:https://e1:2379,https://e2:2379/", ("https://e1:2379", "https://e2:2379")),
    ("metadata-store:etcd:e1:2379", ("http://e1:2379",)),
    # as operators copy BookKeeper's metadataServiceUri (`;`), which Pulsar's driver turns into `,`
    ("metadata-store:etcd:http://a:2379;http://b:2379", ("http://a:2379", "http://b:2379")),
])
def test_pulsar_etcd_uris(uri: str, endpoints: tuple[str, ...]) -> None:
    got = parse_metadata_service_uri(uri)
    assert (got.store, got.servers, got.root, got.racks_path) == ("etcd", endpoints, "/ledgers", "/bookies")


@pytest.mark.parametrize("uri, says", [
    ("metadata-store:etcd:ftp://e1:2379", "not http(s)://host:port"),
    ("metadata-store:etcd:http://e1:2379/chroot", "not http(s)://host:port"),
    ("metadata-store:etcd:http://e1", "not HOST:PORT"),
    ("metadata-store:oxia://o:6648/default", "'oxia' is not supported"),
])
def test_bad_etcd_uris_say_what_is_wrong(uri: str, says: str) -> None:
    with pytest.raises(MetadataError, match=re.escape(says)):
        parse_metadata_service_uri(uri)


def test_unreachable_etcd_is_a_clear_error() -> None:
    from scrutiny.testing.localzk import free_port

    uri = f"metadata-store:etcd:http://127.0.0.1:{free_port()}"
    with pytest.raises(MetadataStoreUnavailable, match=re.escape("etcd unreachable at http://127.0.0.1")):
        open_store(ClusterSettings(metadata_service_uri=uri, etcd_timeout=0.3, etcd_connect_timeout=1))
    with pytest.raises(ConfigError, match="etcd_lease_ttl"):
        from scrutiny.config import ScanSettings

        ScanSettings(metadata_service_uri=uri, etcd_lease_ttl=1).validate()


def test_a_scan_gives_up_on_an_etcd_that_refuses_every_connection_as_soon_as_on_zookeeper() -> None:
    """Every endpoint refuses: a one-shot scan fails within the connect timeout (ZooKeeper's default, 15 s),
    not the retry deadline meant for a store lost in the middle of a run (60 s)."""
    from scrutiny.testing.localzk import free_port

    assert ClusterSettings().etcd_connect_timeout == ClusterSettings().zk_connect_timeout == 15
    uri = f"metadata-store:etcd:http://127.0.0.1:{free_port()};http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    got = subprocess.run([sys.executable, "-m", "scrutiny.cli", "scan", "--metadata-service-uri", uri,
                          "--engine", "local"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert got.returncode == 2 and "etcd unreachable at http://127.0.0.1" in got.stderr, got.stderr
    assert took < 25, took


def test_the_tree_in_every_shape_pulsar_and_bookkeeper_leave(etcd_server: LocalEtcd, etcd_tree: EtcdTree) -> None:
    """Short and long paths (from 2^31), buckets with and without parent keys (a tree migrated from
    ZooKeeper has them), keys that are no ledgers, one undecodable ledger: enumerated and read alike."""
    w = ClusterWriter(etcd_tree, "/ledgers")
    w.init_cluster()
    ids = [0, 1, 9_999, 10_000, 123_456_789, 2**31 - 1, 2**31, 2**40 + 5, 2**62 + 7]
    w.write_ledgers(closed(lid) for lid in ids)
    for lid in (10_000, 2**40 + 5):  # parent keys, as a copy of a ZooKeeper tree has
        parent = ledger_path(w.layout, "/ledgers", lid).rsplit("/", 1)[0]
        etcd_tree.ensure_path(parent)
        etcd_tree.ensure_path(parent.rsplit("/", 1)[0])
    for stray in ("/ledgers/00/0000/L12", "/ledgers/00/0000/Lxxxx", "/ledgers/00/0000/L0001/child",
                  "/ledgers/ID-0000000001", "/ledgers/LAYOUT2", "/ledgers-other/00/0000/L0002"):
        etcd_tree.set(stray, b"not a ledger")
    w.write_raw_ledger(77, b"BookieMetadataFormatVersion\t3\n\x05garbage")
    with open_etcd(etcd_server) as store:
        ranges = store.ledger_ranges()
        assert [r.token for r in ranges] == ["00/0000", "00/0001", "01/2345",
                                             "000/0000/0021/4748", "000/0001/0995/1162", "461/1686/0184/2738"]
        # windows bounded: a few requests per bucket found, and one per empty group of either shape
        before = store.reads
        store.ledger_ranges()
        assert store.reads - before < 22 + 93 + 6 * 60, store.reads - before
        listed = sorted(lid for r in ranges for lid in store.ledger_ids(r))
        assert listed == sorted([*ids, 77])
        reads = {r.ledger_id: r for r in store.read_ledgers([*ids, 77, 55])}
        assert all(reads[lid].metadata == dataclasses.replace(closed(lid), znode_version=0) for lid in ids)
        assert reads[77].error and "undecodable" in reads[77].error
        assert reads[55].deleted


def test_dense_and_sparse_reads_agree_and_versions_count_updates(etcd_server: LocalEtcd,
                                                                etcd_tree: EtcdTree) -> None:
    """A bucket's many ledgers in one range read, a few in Txn batches: the same answers, deletions
    between enumeration and read seen, the version Pulsar's Stat gives (etcd's version minus one)."""
    w = ClusterWriter(etcd_tree, "/ledgers")
    w.init_cluster()
    w.write_ledgers(closed(lid) for lid in range(1, 1001))
    for _ in range(3):
        w.update_ledger(closed(500, last=19))
    w.delete_ledger(600)
    with open_etcd(etcd_server) as store:
        dense = list(store.read_ledgers(range(1, 1001)))
        before = store.reads
        sparse = [r for lid in range(1, 1001, 10) for r in store.read_ledgers([lid])]
        assert store.reads - before == 100  # one Txn each: no range read below DENSE ledgers
        few = list(store.read_ledgers(range(491, 491 + DENSE - 1)))
    by_id = {r.ledger_id: r for r in dense}
    assert [r.ledger_id for r in dense] == list(range(1, 1001))  # in the order asked
    assert by_id[500].metadata is not None and by_id[500].metadata.last_entry_id == 19
    assert by_id[500].metadata.znode_version == 3 and by_id[1].metadata.znode_version == 0  # type: ignore[union-attr]
    assert by_id[600].deleted
    assert all(by_id[r.ledger_id] == r for r in sparse + few)
    assert by_id[1].metadata.modified_ms == -1  # type: ignore[union-attr]  # etcd keeps no times


def test_marks_registrations_racks_and_cookies(etcd_server: LocalEtcd, etcd_tree: EtcdTree) -> None:
    w = ClusterWriter(etcd_tree, "/ledgers")
    w.init_cluster()
    w.mark_underreplicated(UnderreplicationMark(5, (B[0],), 1_700_000_000_000))
    w.mark_underreplicated(UnderreplicationMark(2**40, (B[1],), None))
    etcd_tree.set("/ledgers/underreplication/ledgers/0000/0000/0000/0006/urL0000000006", b"{{not text format")
    w.register_bookie(BookieRegistration(B[0], False))
    w.register_bookie(BookieRegistration(B[1], True))
    etcd_tree.set(f"/ledgers/available/{B[2]}", b"\xff\xfe not a BookieServiceInfoFormat")
    w.write_racks({B[0]: "/r1", B[1]: "/r2"}, "/bookies")
    w.set_replication_disabled(True)
    with open_etcd(etcd_server) as store:
        marks, problems = store.underreplication_marks()
        assert marks[5].replicas == (B[0],) and marks[5].ctime == 1_700_000_000_000 and marks[2**40].ctime is None
        assert len(problems) == 1 and "ledger 6" in problems[0]
        assert store.underreplication_mark(5) == marks[5] and store.underreplication_mark(9) is None
        assert store.underreplication_mark(6) == UnderreplicationMark(6, (), None)  # unreadable: still a mark
        regs = store.registrations()
        assert set(regs.writable) == {B[0], B[2]} and set(regs.readonly) == {B[1]}
        assert len(regs.problems) == 1 and B[2] in regs.problems[0]
        assert regs.cookies == {B[0], B[1]}
        assert store.racks() == ({B[0]: "/r1", B[1]: "/r2"}, [])
        assert store.replication_disabled()
        w.set_replication_disabled(False)
        assert not store.replication_disabled()
        # a bookie's registration goes with its session's lease, as etcd's ephemeral
        etcd_tree.session.close()
        assert set(store.registrations().writable) == {B[2]}


def test_an_agents_registration_lives_on_a_lease_and_comes_back_with_a_new_one(etcd_server: LocalEtcd,
                                                                               etcd_tree: EtcdTree) -> None:
    """The lease revoked under the store (as when it expires while etcd cannot hear the keep-alives):
    the session is lost, a new lease is granted, the registration is back on it."""
    lost = threading.Event()
    with open_etcd(etcd_server, etcd_lease_ttl=3) as store, open_etcd(etcd_server) as reader:
        store.on_session_lost(lost.set)
        reg = store.register_agent(B[0], "127.0.0.1:3191")
        assert reader.agent_addresses() == {B[0]: "127.0.0.1:3191"}
        old = store.session.lease
        store.kv.revoke(old)
        assert reader.agent_addresses() == {}
        wait_for(lost.is_set, 10)
        wait_for(lambda: reader.agent_addresses() == {B[0]: "127.0.0.1:3191"}, 10)
        assert store.session.lease != old
        reg.close()
        assert reader.agent_addresses() == {}
        # a process that dies without closing: its registration expires with its lease
        store.register_agent(B[1], "127.0.0.1:3192")
        store.session._stop.set()  # no more keep-alives, as from a killed process
        assert reader.agent_addresses() == {B[1]: "127.0.0.1:3192"}
        wait_for(lambda: reader.agent_addresses() == {}, 15)


def test_election_the_first_leads_the_next_takes_over(etcd_server: LocalEtcd, etcd_tree: EtcdTree) -> None:
    first, second = open_etcd(etcd_server, etcd_lease_ttl=2), open_etcd(etcd_server, etcd_lease_ttl=2)
    leading: list[str] = []
    release = {"a": threading.Event(), "b": threading.Event()}

    def contend(store: EtcdStore, who: str) -> threading.Thread:
        def lead() -> None:
            leading.append(who)
            release[who].wait(30)

        t = threading.Thread(target=store.election(who).run, args=(lead,), daemon=True)
        t.start()
        return t

    try:
        a = contend(first, "a")
        wait_for(lambda: leading == ["a"])
        b = contend(second, "b")
        wait_for(lambda: first.election("x").contenders() == ["a", "b"])
        time.sleep(1)
        assert leading == ["a"]  # one leader at a time
        # the leader's process dies: no release, no revoke; its lease expires and the next leads
        first.session._stop.set()
        wait_for(lambda: leading == ["a", "b"], 10)
        assert second.election("x").contenders() == ["b"]
        release["b"].set()
        b.join(5)
        assert second.election("x").contenders() == []  # leadership given up when `lead` returns
        release["a"].set()
        a.join(5)
    finally:
        for store in (first, second):
            store.close()


def test_tls_and_mutual_tls_as_etcd_serves_them(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    server, client = ca.issue("etcd", "127.0.0.1", server=True), ca.issue("scrutiny", "scrutiny", server=False)
    with LocalEtcd(tls=(server.cert, server.key), client_ca=ca.pem) as etcd:
        uri = f"metadata-store:etcd:{etcd.endpoint}"
        assert uri.startswith("metadata-store:etcd:https://")
        settings = {"metadata_service_uri": uri, "etcd_tls_ca": str(ca.pem), "etcd_tls_cert": str(client.cert),
                    "etcd_tls_key": str(client.key)}
        with open_store(ClusterSettings(**settings)) as store:  # type: ignore[arg-type]
            cadence("full").write(store, 42)
            assert cadence("full").read(store) == 42
        # no client certificate: etcd refuses the handshake; the store says it cannot reach etcd
        with pytest.raises(MetadataStoreUnavailable, match="etcd unreachable"):
            open_store(ClusterSettings(metadata_service_uri=uri, etcd_tls_ca=str(ca.pem), etcd_timeout=0.5,
                                       etcd_retry_deadline=1))


def test_etcd_authentication_and_an_expired_token(tmp_path: Path) -> None:
    with LocalEtcd(extra_args=("--auth-token-ttl", "1")) as etcd:
        for args in (["user", "add", "root:s3cret"], ["auth", "enable"]):
            subprocess.run(["etcdctl", "--endpoints", etcd.endpoint, *args], check=True, capture_output=True,
                           env={**os.environ, "ETCDCTL_API": "3"})
        secret = tmp_path / "etcd-auth"
        secret.write_text("root:s3cret\n")
        with open_store(ClusterSettings(metadata_service_uri=etcd.uri, etcd_auth_file=str(secret))) as store:
            cadence("full").write(store, 7)
            time.sleep(2.5)  # the simple token expires after 1 s idle: authenticated again, transparently
            assert cadence("full").read(store) == 7
        with pytest.raises(StoreError, match="etcd refused"):
            open_store(ClusterSettings(metadata_service_uri=etcd.uri))
        secret.write_text("root:wrong\n")
        with pytest.raises(StoreError, match="etcd refused"):
            open_store(ClusterSettings(metadata_service_uri=etcd.uri, etcd_auth_file=str(secret)))
        secret.write_text("no colon\n")
        with pytest.raises(ConfigError, match="not of the form user:password"):
            open_store(ClusterSettings(metadata_service_uri=etcd.uri, etcd_auth_file=str(secret)))


def test_bucket_search_finds_every_ledger_however_sparse(etcd_server: LocalEtcd, etcd_tree: EtcdTree) -> None:
    """Random ids, dense runs and lone ledgers, on both sides of 2^31 and near every group boundary."""
    rng = random.Random(11)
    ids = set(range(99_990, 100_020)) | {2**31 - 2, 2**31 - 1, 10**13 * 10_000 - 1, 10**13 * 10_000, 2**63 - 1}
    ids |= {rng.randrange(0, 2**31) for _ in range(150)} | {rng.randrange(2**31, 2**63) for _ in range(150)}
    ids |= {10_000 * b + rng.randrange(10_000) for b in (9_999, 10_000, 19_999, 214_748)}
    w = ClusterWriter(etcd_tree, "/ledgers")
    w.init_cluster()
    w.write_ledgers(closed(lid) for lid in ids)
    with open_etcd(etcd_server) as store:
        before = store.reads
        ranges = store.ledger_ranges()
        requests = store.reads - before
        assert sorted(lid for r in ranges for lid in store.ledger_ids(r)) == sorted(ids)
    assert len({r.token for r in ranges}) == len(ranges)
    assert requests < 60 * len(ranges), requests  # a gallop per gap: logarithmic in its width


def test_the_tree_watch_resumes_where_it_stopped_and_a_compaction_is_a_gap(etcd_server: LocalEtcd,
                                                                            etcd_tree: EtcdTree) -> None:
    """etcd's watch from a revision: what changed while nobody watched is delivered to the next watch that
    resumes from the last position (a new leader's), and a history compacted past it is a gap."""
    from scrutiny.metadata import BookieRegistration, TreeChange, UnderreplicationMark

    w = ClusterWriter(etcd_tree, "/ledgers")
    w.init_cluster()
    store = open_etcd(etcd_server)
    changes: list[TreeChange] = []
    gaps: list[str] = []
    try:
        watch = store.watch_tree(changes.append, gaps.append)
        w.write_ledgers([closed(1)])
        w.update_ledger(closed(1, last=19))
        w.mark_underreplicated(UnderreplicationMark(1, (B[0],), 5))
        w.register_bookie(BookieRegistration(B[0], False), ephemeral=False)
        w.delete_ledger(1)
        expected = [TreeChange("ledger", "created", 1), TreeChange("ledger", "changed", 1),
                    TreeChange("mark", "created", 1), TreeChange("registration", "created", bookie_id=B[0]),
                    TreeChange("cookie", "created", bookie_id=B[0]), TreeChange("ledger", "deleted", 1)]
        wait_for(lambda: changes == expected, 10, lambda: f"{changes}")
        wait_for(lambda: int(watch.position()) >= etcd_tree.kv.revision(), 10)
        position = watch.position()
        watch.close()
        w.write_ledgers([closed(2)])  # while nobody watches
        w.unmark_underreplicated(1)
        changes.clear()
        watch = store.watch_tree(changes.append, gaps.append, resume=position)
        wait_for(lambda: changes == [TreeChange("ledger", "created", 2), TreeChange("mark", "deleted", 1)], 10)
        position = watch.position()
        watch.close()
        w.write_ledgers([closed(3)])  # two revisions: the first one after the position is compacted away
        w.write_ledgers([closed(5)])
        subprocess.run(["etcdctl", "--endpoints", etcd_server.endpoint, "compact", str(etcd_tree.kv.revision())],
                       check=True, capture_output=True, timeout=30)
        watch = store.watch_tree(changes.append, gaps.append, resume=position)
        wait_for(lambda: bool(gaps), 10)
        assert "compacted" in gaps[0]
        w.write_ledgers([closed(4)])  # watched again from the compaction on
        wait_for(lambda: TreeChange("ledger", "created", 4) in changes, 10)
        watch.close()
    finally:
        store.close()


def test_a_mark_is_written_as_pulsars_driver_writes_it_and_only_on_the_ledger_as_judged(
        etcd_server: LocalEtcd, etcd_tree: EtcdTree) -> None:
    w = ClusterWriter(etcd_tree, "/ledgers")
    w.init_cluster()
    w.write_ledgers(closed(lid) for lid in (1, 3, 4))
    w.update_ledger(closed(1, last=19))
    with open_etcd(etcd_server) as store:
        judged = {r.ledger_id: r.metadata.znode_version for r in store.read_ledgers([1, 3, 4]) if r.metadata}
        mark = UnderreplicationMark(1, (B[0], B[1]), 1_700_000_000_000)
        assert judged[1] == 1 and store.mark_underreplicated(mark, judged[1])
        got = store.kv.get(b"/ledgers/underreplication/ledgers/0000/0000/0000/0001/urL0000000001")
        assert got is not None and got.value == f'replica: "{B[0]}"\nreplica: "{B[1]}"\nctime: 1700000000000\n'.encode()
        assert not store.mark_underreplicated(UnderreplicationMark(1, (B[2],), 1), judged[1])  # marked already
        assert store.underreplication_mark(1) == mark
        w.update_ledger(closed(3, last=19))
        w.delete_ledger(4)
        for lid in (3, 4):
            assert not store.mark_underreplicated(UnderreplicationMark(lid, (B[0],), 1), judged[lid])
            assert store.underreplication_mark(lid) is None
