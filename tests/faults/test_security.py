"""Security: TLS and mutual TLS on every gRPC server, authenticated Rescan, ZooKeeper digest auth
with ACLs on scrutiny's own znodes, and no secret in logs or reports."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl_credential

from scrutiny.agent import BookieAgent
from scrutiny.auditor import Auditor, AuditorSettings
from scrutiny.bookieclient import BookieClient, EndpointResolver
from scrutiny.checks import Outcome
from scrutiny.config import ScanSettings
from scrutiny.entrysources import SyntheticStore
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.metadata import parse_metadata_service_uri
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.scan.work import EXECUTOR
from scrutiny.testing import store_at
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.tls import channel_credentials, server_credentials
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc
from tests.support.certs import CertificateAuthority, Pair

BOOKIE = "127.0.1.1:3181"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(d)
    rogue = CertificateAuthority(d, "rogue CA")
    return {"ca": ca.pem, "server": ca.issue("server", "scrutiny", server=True),
            "client": ca.issue("client", "operator", server=False),
            "rogue": rogue.issue("rogue-client", "mallory", server=False)}


@pytest.fixture
def store(tmp_path: Path) -> Path:
    w = SyntheticStoreWriter()
    w.add_entries(BOOKIE, 1, range(10))
    return w.write_all(tmp_path)[BOOKIE]


def ask(port: int, creds: grpc.ChannelCredentials | None) -> Outcome:
    client = BookieClient(EndpointResolver({BOOKIE: f"127.0.0.1:{port}"}), credentials=creds, deadline=3, retries=0)
    with client:
        return client.fetch(BOOKIE, [1])[1].outcome


def test_agent_over_tls_and_mutual_tls(pki: dict, store: Path) -> None:  # type: ignore[type-arg]
    server: Pair = pki["server"]  # type: ignore[assignment]
    client: Pair = pki["client"]  # type: ignore[assignment]
    rogue: Pair = pki["rogue"]  # type: ignore[assignment]
    tls = BookieAgent(SyntheticStore(store), bind="127.0.0.1:0",
                      credentials=server_credentials(str(server.cert), str(server.key))).start()
    try:
        assert ask(tls.port, channel_credentials(str(pki["ca"]))) is Outcome.ENTRIES
        assert ask(tls.port, None) is Outcome.UNAVAILABLE  # plaintext to a TLS server: refused
    finally:
        tls.stop(grace=0)
    mtls = BookieAgent(SyntheticStore(store), bind="127.0.0.1:0",
                       credentials=server_credentials(str(server.cert), str(server.key), str(pki["ca"]))).start()
    try:
        assert ask(mtls.port, channel_credentials(str(pki["ca"]), str(client.cert), str(client.key))) is Outcome.ENTRIES
        assert ask(mtls.port, channel_credentials(str(pki["ca"]))) is Outcome.UNAVAILABLE  # no client certificate
        assert ask(mtls.port, channel_credentials(str(pki["ca"]), str(rogue.cert), str(rogue.key))) \
            is Outcome.UNAVAILABLE  # a certificate from another CA
    finally:
        mtls.stop(grace=0)


@pytest.fixture
def secured_zk(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
               tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A cluster root with one ledger; scrutiny's client authenticates with digest credentials."""
    from scrutiny.metadata import LedgerMetadata, LedgerState, Segment
    from scrutiny.testing.clusterwriter import ClusterWriter

    w = ClusterWriter(zk_client, f"{zk_namespace}/ledgers")
    w.init_cluster()
    w.write_ledgers([LedgerMetadata(1, LedgerState.CLOSED, 1, 1, 1, 9, 0, (Segment(0, (BOOKIE,)),))])
    auth = tmp_path / "zk-auth"
    auth.write_text("scrutiny:zk-pa55word\n")
    yield f"zk+hierarchical://{zk_server.hosts}{zk_namespace}/ledgers", auth


def _assert_protected(zk_client: KazooClient, path: str) -> None:
    acls, _ = zk_client.get_acls(path)
    schemes = {(a.id.scheme, a.perms) for a in acls}
    assert ("digest", 31) in schemes and ("world", 1) in schemes, acls
    with pytest.raises(NoAuthError):
        zk_client.set(path, b"tampered")


def test_agent_registration_is_protected_by_an_acl(secured_zk: tuple[str, Path], zk_client: KazooClient,
                                                   store: Path) -> None:
    uri, auth = secured_zk
    parsed = parse_metadata_service_uri(uri)
    registry = store_at(uri, zk_auth_file=str(auth))  # the agent's own connection, with its credentials
    agent = BookieAgent(SyntheticStore(store), bind="127.0.0.1:0").start()
    try:
        agent.register(registry, BOOKIE, f"127.0.0.1:{agent.port}")
        _assert_protected(zk_client, f"{parsed.scrutiny_path}/agents/{BOOKIE}")
        assert make_digest_acl_credential("scrutiny", "zk-pa55word") not in zk_client.get(
            f"{parsed.scrutiny_path}/agents/{BOOKIE}")[0].decode()
    finally:
        agent.stop(grace=0)
        registry.close()


def test_auditor_tls_mtls_token_acls_and_no_secret_leaks(pki: dict, secured_zk: tuple[str, Path],  # type: ignore[type-arg]
                                                         zk_client: KazooClient, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    uri, auth = secured_zk
    server: Pair = pki["server"]  # type: ignore[assignment]
    client: Pair = pki["client"]  # type: ignore[assignment]
    token = tmp_path / "token"
    token.write_text("t0p-s3cret-t0ken")
    scan = ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.2, zk_auth_file=str(auth),
                        placement_policy="none", min_write_quorum=1, min_ack_quorum=1, bookie_deadline_seconds=2)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), token_file=str(token),
                               tls_cert=str(server.cert), tls_key=str(server.key), tls_client_ca=str(pki["ca"]),
                               full_interval_seconds=3600, underreplication_interval_seconds=0)
    caplog.set_level(logging.DEBUG)
    auditor = Auditor(scan, settings, engine=LocalEngine()).start()
    try:
        deadline = time.monotonic() + 30
        while not auditor.last.get("full") and time.monotonic() < deadline:
            time.sleep(0.1)
        req = auditor_pb2.RescanRequest(ledgers=auditor_pb2.LedgerIds(ledger_ids=[1]), wait=True)
        mtls = channel_credentials(str(pki["ca"]), str(client.cert), str(client.key))
        with grpc.secure_channel(auditor.address, mtls) as ch:  # a verified client certificate suffices
            assert json.loads(auditor_pb2_grpc.AuditorStub(ch).Rescan(req).report_json)["ledgers"]["seen"] == 1
        with grpc.secure_channel(auditor.address, channel_credentials(str(pki["ca"]))) as ch, \
                pytest.raises(grpc.RpcError) as err:
            auditor_pb2_grpc.AuditorStub(ch).GetStatus(auditor_pb2.GetStatusRequest(), timeout=3)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # TLS, but no client certificate: no handshake
        with grpc.insecure_channel(auditor.address) as ch, pytest.raises(grpc.RpcError):
            auditor_pb2_grpc.AuditorStub(ch).GetStatus(auditor_pb2.GetStatusRequest(), timeout=3)
        base = f"{parse_metadata_service_uri(uri).scrutiny_path}/auditor"
        _assert_protected(zk_client, f"{base}/cadence/full")
        for node in zk_client.get_children(f"{base}/election"):
            acls, _ = zk_client.get_acls(f"{base}/election/{node}")
            assert {a.id.scheme for a in acls} == {"digest", "world"}
    finally:
        auditor.stop()
    written = "\n".join(p.read_text() for p in (tmp_path / "reports").rglob("*.json")) + caplog.text
    for secret in ("t0p-s3cret-t0ken", "zk-pa55word", server.key.read_text().splitlines()[1]):
        assert secret not in written


def test_scan_over_zookeeper_tls(pki: dict, tmp_path: Path, store: Path) -> None:  # type: ignore[type-arg]
    """A real ZooKeeper with a TLS client port (secureClientPort, Netty), certificates from the test CA."""
    from scrutiny.metadata import LedgerMetadata, LedgerState, Segment
    from scrutiny.testing.clusterwriter import ClusterWriter

    server: Pair = pki["server"]  # type: ignore[assignment]
    keystore = tmp_path / "zk-keystore.pem"
    keystore.write_text(server.key.read_text() + server.cert.read_text())
    with LocalZooKeeper(workdir=tmp_path / "zk", tls_keystore=keystore) as zk:
        plain = KazooClient(hosts=zk.hosts)
        plain.start()
        w = ClusterWriter(plain, "/ledgers")
        w.init_cluster()
        w.write_ledgers([LedgerMetadata(i, LedgerState.CLOSED, 1, 1, 1, 9, 0, (Segment(0, (BOOKIE,)),))
                         for i in range(1, 4)])
        plain.stop()
        plain.close()
        agent = BookieAgent(SyntheticStore(store), bind="127.0.0.1:0").start()
        try:
            settings = ScanSettings(metadata_service_uri=f"zk+hierarchical://127.0.0.1:{zk.secure_port}/ledgers",
                                    engine="local", placement_policy="none", min_write_quorum=1, min_ack_quorum=1,
                                    zk_tls_ca=str(pki["ca"]),
                                    recheck_delay=0.1, bookie_endpoints={BOOKIE: f"127.0.0.1:{agent.port}"})
            report = ScrutinyRun(settings, LocalEngine()).execute()
            assert report.complete and report.ledgers["seen"] == 3
            # ledger 1 holds entries 0..9 on the agent; 2 and 3 are not there at all
            assert {(str(v.category), v.ledger_id) for v in report.violations} == {
                ("NO_REPLICA_OF_AN_ENTRY", 2), ("NO_REPLICA_OF_AN_ENTRY", 3)}
        finally:
            agent.stop(grace=0)
            EXECUTOR.close()
