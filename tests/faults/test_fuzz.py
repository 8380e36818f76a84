"""Random requests against the real gRPC servers: no crash, no hang, only documented refusals."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from scrutiny.agent import BookieAgent
from scrutiny.auditor import Auditor, AuditorSettings
from scrutiny.checks import expected_share
from scrutiny.config import ScanSettings
from scrutiny.entrysources import SyntheticStore
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.listedcolumns import read_listed
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc, bookie_pb2, bookie_pb2_grpc

BOOKIE = "127.0.1.1:3181"
ids = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@pytest.fixture(scope="module")
def agent_stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[bookie_pb2_grpc.BookieStub]:
    w = SyntheticStoreWriter()
    for lid in range(50):
        w.add_entries(BOOKIE, lid, range(lid))
    agent = BookieAgent(SyntheticStore(w.write_all(tmp_path_factory.mktemp("s"))[BOOKIE]),
                        bind="127.0.0.1:0").start()
    yield bookie_pb2_grpc.BookieStub(grpc.insecure_channel(f"127.0.0.1:{agent.port}"))
    agent.stop(grace=0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ids, max_size=200), st.booleans())
def test_agent_streaming_requests(agent_stub: bookie_pb2_grpc.BookieStub, ledger_ids: list[int],
                                  columns: bool) -> None:
    req = bookie_pb2.GetListOfEntriesOfLedgersRequest(ledger_ids=ledger_ids, listed_as_columns=columns)
    try:
        msgs = list(agent_stub.GetListOfEntriesOfLedgers(req, timeout=10))
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and any(i < 0 for i in ledger_ids)
        return
    answers = [(a.ledger_id, a.status) for m in msgs for a in m.ledgers]
    listed = [read_listed(m.listed) for m in msgs]
    assert not any(lst.problem for lst in listed) and (columns or not any(lst.ledger_ids.size for lst in listed))
    answers += [(lid, bookie_pb2.EOK) for lst in listed for lid in lst.ledger_ids.tolist()]
    assert sorted(lid for lid, _ in answers) == sorted(set(ledger_ids))
    assert all(status == (bookie_pb2.EOK if lid < 50 else bookie_pb2.ENOLEDGER) for lid, status in answers)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids, st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_agent_list_requests(agent_stub: bookie_pb2_grpc.BookieStub, start: int, most: int) -> None:
    req = bookie_pb2.ListLedgersRequest(from_ledger_id=start, max_ledgers=most)
    try:
        msgs = list(agent_stub.ListLedgers(req, timeout=10))
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and (start < 0 or not 0 <= most <= 1_000_000)
        return
    listed = [int.from_bytes(m.ledger_ids[i:i + 8], "big", signed=True) for m in msgs
              for i in range(0, len(m.ledger_ids), 8)]
    wanted = [lid for lid in range(50) if lid >= start][:most or None]
    assert listed == wanted and msgs[-1].last_page == (len(wanted) == len([i for i in range(50) if i >= start]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids)
def test_agent_unary_requests(agent_stub: bookie_pb2_grpc.BookieStub, ledger_id: int) -> None:
    try:
        a = agent_stub.GetListOfEntriesOfALedger(bookie_pb2.GetListOfEntriesOfALedgerRequest(ledger_id=ledger_id),
                                                 timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and ledger_id < 0
        return
    assert a.ledger_id == ledger_id and a.status == (bookie_pb2.EOK if 0 <= ledger_id < 50 else bookie_pb2.ENOLEDGER)


@pytest.fixture(scope="module")
def auditor_stub(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[auditor_pb2_grpc.AuditorStub]:
    root = "/fuzz/ledgers"
    client = KazooClient(hosts=zk_server.hosts)
    client.start()
    w = ClusterWriter(client, root)
    w.init_cluster()
    mds = [LedgerMetadata(i, LedgerState.CLOSED, 1, 1, 1, 9, 0, (Segment(0, (BOOKIE,)),)) for i in range(5)]
    w.write_ledgers(mds)
    w.register_bookie(BookieRegistration(BOOKIE, False), ephemeral=False)
    store = SyntheticStoreWriter()
    for md in mds:
        store.add(BOOKIE, md.ledger_id, expected_share(md, BOOKIE))
    tmp = tmp_path_factory.mktemp("a")
    agent = BookieAgent(SyntheticStore(store.write_all(tmp)[BOOKIE]), bind="127.0.0.1:0").start()
    scan = ScanSettings(metadata_service_uri=f"zk+hierarchical://{zk_server.hosts}{root}", engine="local",
                        placement_policy="none", min_write_quorum=1, min_ack_quorum=1,
                        bookie_endpoints={BOOKIE: f"127.0.0.1:{agent.port}"})
    auditor = Auditor(scan, AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp / "r"), full_interval_seconds=0,
                                            underreplication_interval_seconds=0, insecure_open_rescan=True,
                                            max_rescan_ledgers=100), engine=LocalEngine()).start()
    import time

    deadline = time.monotonic() + 30
    while not auditor.leading.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield auditor_pb2_grpc.AuditorStub(grpc.insecure_channel(auditor.address))
    auditor.stop()
    agent.stop(grace=0)
    client.stop()
    client.close()


rescans = st.one_of(
    st.builds(lambda x: auditor_pb2.RescanRequest(all_ledgers=x, wait=True), st.booleans()),
    st.builds(lambda v: auditor_pb2.RescanRequest(ledgers=auditor_pb2.LedgerIds(ledger_ids=v), wait=True),
              st.lists(st.one_of(st.integers(0, 6), ids), max_size=150)),
    st.builds(lambda b: auditor_pb2.RescanRequest(bookie_id=b, wait=True), st.text(max_size=40)),
    st.builds(lambda t: auditor_pb2.RescanRequest(all_ledgers=True, wait=True, wait_timeout_seconds=t),
              st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=10)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rescans)
def test_rescan_requests(auditor_stub: auditor_pb2_grpc.AuditorStub, request: auditor_pb2.RescanRequest) -> None:
    try:
        resp = auditor_stub.Rescan(request, timeout=60)
    except grpc.RpcError as exc:
        allowed = [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED]
        if request.wait_timeout_seconds > 0:  # the run outlasts a short wait: served later by GetLastReport
            allowed.append(grpc.StatusCode.DEADLINE_EXCEEDED)
        assert exc.code() in allowed, exc
        assert exc.details()
        return
    assert resp.run_id and resp.report_json
    assert auditor_stub.GetStatus(auditor_pb2.GetStatusRequest(), timeout=10).role == auditor_pb2.LEADER


