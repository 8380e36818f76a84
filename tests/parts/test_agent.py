"""The bookie agent over each source, and the client the scan uses, on loopback."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import socketserver
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kazoo.client import KazooClient

from scrutiny import codec
from scrutiny.agent import MESSAGE_BYTES, BookieAgent, in_messages
from scrutiny.agent.servicer import BookieServicer
from scrutiny.bookieclient import BookieAnswers, BookieClient, EndpointResolver, Outcome
from scrutiny.bookkeeper import bookie_protocol_pb2 as bkp
from scrutiny.config import ScanSettings
from scrutiny.entrysources import BookieBridgeSource, DbLedgerStorageSource, SyntheticStore
from scrutiny.entrysources.bridge import read_frame, request_frame
from scrutiny.entrysources.synthetic import CORRUPT, SyntheticStoreWriter
from scrutiny.retry import Backoff
from scrutiny.scan.context import RunContext
from scrutiny.scan.work import ExecutorResources
from scrutiny.testing import store_at, store_on
from scrutiny.testing.dbledgerstorage import LiveBookie, write_index
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.processes import reap
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc
from tests.parts.conftest import writing_flushing_restarting
from tests.support.helpers import slow_agent, wait_for

G = codec.SequenceGroup


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    w = SyntheticStoreWriter()
    w.add_entries("b1:3181", 1, range(0, 100))
    w.add("b1:3181", 2, [G(0, 996, 2, 3)])
    w.add("b1:3181", 3, CORRUPT)
    w.add("b1:3181", 4, [])
    for lid in range(100, 2100):
        w.add("b1:3181", lid, [G(0, 0, 10, 0)])
    return w.write_all(tmp_path)["b1:3181"]


@pytest.fixture
def agent(synthetic: Path) -> Iterator[BookieAgent]:
    a = BookieAgent(SyntheticStore(synthetic), bind="127.0.0.1:0").start()
    yield a
    a.stop(grace=0)


def client_for(port: int, **kw: object) -> BookieClient:
    return BookieClient(EndpointResolver({"b1:3181": f"127.0.0.1:{port}"}), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("streaming", [True, False])
def test_synthetic_store_through_the_agent(agent: BookieAgent, streaming: bool) -> None:
    with client_for(agent.port, streaming=streaming, ledgers_per_call=700) as c:
        got = c.fetch("b1:3181", [1, 2, 3, 4, 5, *range(100, 2100)])
    assert got[1].outcome is Outcome.ENTRIES and got[1].availability is not None
    assert got[1].availability.groups == (G(0, 0, 100, 0),)
    assert got[2].availability is not None and got[2].availability.groups == (G(0, 996, 2, 3),)
    assert got[3].outcome is Outcome.INVALID and "ledger 3" in got[3].reason
    assert got[4].outcome is Outcome.ENTRIES and got[4].availability is not None and got[4].availability.count == 0
    assert got[5].outcome is Outcome.NO_LEDGER
    assert all(got[i].outcome is Outcome.ENTRIES for i in range(100, 2100))
    assert len(got) == 2005


class EarlierAgent(BookieServicer):
    """An agent of a version before the answers as columns: it does not know the request's field."""

    def GetListOfEntriesOfLedgers(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        request.ClearField("listed_as_columns")
        yield from super().GetListOfEntriesOfLedgers(request, context)


class ColumnsAskew(BookieServicer):
    """An agent whose columns do not line up: each message's sizes one short."""

    def GetListOfEntriesOfLedgers(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        for msg in super().GetListOfEntriesOfLedgers(request, context):
            if msg.HasField("listed"):
                msg.listed.sizes = msg.listed.sizes[:-4]
            yield msg


def test_answers_as_columns_are_those_of_an_agent_that_sends_none(synthetic: Path) -> None:
    """The client asks for the EOK answers as columns; an agent that does not know the field answers each ledger
    as BP-34's call does, and the client reads the same answers from both."""
    asked = [1, 2, 3, 4, 5, *range(100, 2100)]
    got = {}
    for servicer in (BookieServicer(SyntheticStore(synthetic)), EarlierAgent(SyntheticStore(synthetic))):
        server, port = serve_counted(servicer)
        try:
            with client_for(port, ledgers_per_call=700) as c:
                answers = c.fetch("b1:3181", asked)
                listed = answers.columns()
                got[type(servicer).__name__] = (dict(zip(listed.ledger_ids.tolist(), listed.answers(), strict=True)),
                                                answers.other)
        finally:
            server.stop(grace=0)
    assert got["BookieServicer"] == got["EarlierAgent"]
    encoded, other = got["BookieServicer"]
    assert set(encoded) == {1, 2, 3, 4, *range(100, 2100)} and set(other) == {5}


def test_columns_that_do_not_line_up_are_invalid_answers_named(synthetic: Path) -> None:
    server, port = serve_counted(ColumnsAskew(SyntheticStore(synthetic)))
    try:
        with client_for(port) as c:
            got = c.fetch("b1:3181", [1, 2, 5, 100])
    finally:
        server.stop(grace=0)
    assert got[5].outcome is Outcome.NO_LEDGER  # not among the columns: answered on its own
    for lid in (1, 2, 100):
        assert got[lid].outcome is Outcome.INVALID
        assert got[lid].reason == "bookie b1:3181: listed columns: 8 bytes of sizes for 3 ledgers"


def test_bad_requests_get_invalid_argument(agent: BookieAgent) -> None:
    stub = bookie_pb2_grpc.BookieStub(grpc.insecure_channel(f"127.0.0.1:{agent.port}"))
    with pytest.raises(grpc.RpcError) as err:
        stub.GetListOfEntriesOfALedger(bookie_pb2.GetListOfEntriesOfALedgerRequest(ledger_id=-4))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "-4" in (err.value.details() or "")
    with pytest.raises(grpc.RpcError) as err:
        list(stub.GetListOfEntriesOfLedgers(bookie_pb2.GetListOfEntriesOfLedgersRequest(ledger_ids=[1, -2])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        list(stub.GetListOfEntriesOfLedgers(bookie_pb2.GetListOfEntriesOfLedgersRequest(
            ledger_ids=list(range(100_001)))))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most" in (err.value.details() or "")
    # duplicates in one request: exactly one answer each
    msgs = list(stub.GetListOfEntriesOfLedgers(bookie_pb2.GetListOfEntriesOfLedgersRequest(ledger_ids=[1, 1, 5])))
    assert sorted(a.ledger_id for m in msgs for a in m.ledgers) == [1, 5]


def test_health_service(agent: BookieAgent) -> None:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{agent.port}"))
    resp = stub.Check(health_pb2.HealthCheckRequest(service="scrutiny.v1.Bookie"))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def _tree_digest(path: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(path)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_dbledgerstorage_answers_what_the_bookie_would_serve(tmp_path: Path) -> None:
    d0, d1 = tmp_path / "ledgers0", tmp_path / "ledgers1"
    # ledger 8: deleted by the bookie (gone from `ledgers`), its `locations` keys not yet cleaned up;
    # ledger 9: in limbo (BP-46); ledger 10: ids whose merged period would not fit int32
    write_index(d0, {2: range(0, 50), 4: [0, 2, 4], 7: range(10, 20), 8: range(30), 9: [0, 1, 5],
                     10: [0, 3_000_000_000, 6_000_000_000]}, limbo=[9], deleted=[8])
    write_index(d1, {3: range(5), 7: range(20, 25)})  # ledger 7 in both: the union counts
    before = {d: _tree_digest(d) for d in (d0, d1)}
    source = DbLedgerStorageSource([d0, d1], scratch_dir=tmp_path / "scratch")
    agent = BookieAgent(source, bind="127.0.0.1:0").start()
    try:
        with client_for(agent.port) as c:
            got = c.fetch("b1:3181", [2, 3, 4, 7, 8, 9, 10, 99])
    finally:
        agent.stop(grace=0)
    assert got[2].availability is not None and got[2].availability.groups == (G(0, 0, 50, 0),)
    assert got[4].availability is not None and got[4].availability.groups == (G(0, 4, 1, 2),)
    assert got[7].availability is not None and got[7].availability.groups == (G(10, 10, 15, 0),)
    assert got[3].outcome is Outcome.ENTRIES and got[99].outcome is Outcome.NO_LEDGER
    assert got[8].outcome is Outcome.NO_LEDGER  # the bookie refuses every read of a deleted ledger
    assert got[9].outcome is Outcome.LIMBO and got[9].availability is not None
    assert got[9].availability.entry_ids().tolist() == [0, 1, 5]
    assert got[10].outcome is Outcome.ENTRIES and got[10].availability is not None
    assert got[10].availability.entry_ids().tolist() == [0, 3_000_000_000, 6_000_000_000]
    assert {d: _tree_digest(d) for d in (d0, d1)} == before  # not one byte of the bookie's files touched


def test_dbledgerstorage_follows_a_live_bookie_at_every_request(tmp_path: Path) -> None:
    d0 = tmp_path / "ledgers0"
    bookie = LiveBookie(d0)
    bookie.add(1, range(3))
    bookie.add(2, range(10))
    bookie.flush()
    source = DbLedgerStorageSource([d0], scratch_dir=tmp_path / "scratch")
    agent = BookieAgent(source, bind="127.0.0.1:0").start()
    try:
        with client_for(agent.port) as c:
            assert c.fetch("b1:3181", [1])[1].availability.entry_ids().tolist() == [0, 1, 2]  # type: ignore[union-attr]
            bookie.add(1, [3])  # flushed by the bookie, not by the test: written, then answered at once
            bookie.add(5, range(4))
            bookie.delete(2)
            got = c.fetch("b1:3181", [1, 2, 5])
            assert got[1].availability.entry_ids().tolist() == [0, 1, 2, 3]  # type: ignore[union-attr]
            assert got[2].outcome is Outcome.NO_LEDGER and got[5].outcome is Outcome.ENTRIES
            for i in range(20):  # the bookie keeps flushing: new SST files, compactions
                bookie.add(100 + i, range(1000))
                bookie.flush()
            bookie.set_limbo(5, True)
            got = c.fetch("b1:3181", [5, 119])
            assert got[5].outcome is Outcome.LIMBO and got[119].availability.count == 1000  # type: ignore[union-attr]
    finally:
        agent.stop(grace=0)
        bookie.close()


def test_dbledgerstorage_answers_whole_while_the_bookie_flushes_and_restarts(tmp_path: Path) -> None:
    """A RocksDB secondary reads the MANIFEST, then the write-ahead logs after it: a log the bookie flushed into an
    SST and removed in between (a memtable's flush; a restart, whose recovery flushes every log) was skipped, its
    keys in neither. On real bookies restarting, about once in 150 restarts, every ledger of one bookie went missing
    from one answer: a false alarm. Here the bookie writes, flushes and restarts as fast as it can while the source
    is caught up and asked about every ledger written before: none is ever missing (a catch-up may fail, EIO:
    unknown, never missing)."""
    from scrutiny.entrysources import SourceError

    d0 = tmp_path / "ledgers0"
    bookie = LiveBookie(d0)
    source = DbLedgerStorageSource([d0], scratch_dir=tmp_path / "scratch")
    looks, missing = 0, []
    try:
        with writing_flushing_restarting(bookie) as writing:
            end = time.monotonic() + 8
            while time.monotonic() < end:
                asked = writing.last(200)
                try:
                    source.refresh()
                except SourceError:
                    continue
                looks += 1
                missing += [lid for lid in asked if (got := source.entry_ids(lid)) is None or got[0].size != 2]
    finally:
        source.close()
        bookie.close()
    assert looks >= 20 and writing.moves["restarts"] >= 5, (looks, writing.moves)
    assert missing == [], f"{len(missing)} ledgers missing from {looks} answers, beside {dict(writing.moves)}"


def test_dbledgerstorage_missing_index_is_a_clear_error(tmp_path: Path) -> None:
    from scrutiny.entrysources import SourceError

    with pytest.raises(SourceError, match="no RocksDB index"):
        DbLedgerStorageSource([tmp_path / "nothing"])


# -- the bridge to a stock bookie ---------------------------------------------------------------

def test_request_frame_matches_the_spec_example() -> None:
    assert request_frame(7, 1).hex() == "0000000d0a060803100b1801e206020807"


class FakeStockBookie(socketserver.ThreadingTCPServer):
    """Speaks BookKeeper's v3 framing for GET_LIST_OF_ENTRIES_OF_LEDGER."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, ledgers: dict[int, bytes | int]) -> None:
        self.ledgers = ledgers
        self.requests: list[bytes] = []
        super().__init__(("127.0.0.1", 0), _BookieHandler)


class _BookieHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: FakeStockBookie = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        while True:
            try:
                body = read_frame(sock)
            except Exception:
                return
            server.requests.append(body)
            req = bkp.Request()
            req.ParseFromString(body)
            lid = req.getListOfEntriesOfLedgerRequest.ledgerId
            held = server.ledgers.get(lid, bkp.ENOLEDGER)
            inner = bkp.GetListOfEntriesOfLedgerResponse(ledgerId=lid)
            resp = bkp.Response(header=req.header)
            if isinstance(held, bytes):
                resp.status = inner.status = bkp.EOK
                inner.availabilityOfEntriesOfLedger = held
            else:
                resp.status = inner.status = held
            resp.getListOfEntriesOfLedgerResponse.CopyFrom(inner)
            out = resp.SerializeToString()
            sock.sendall(len(out).to_bytes(4, "big") + out)


def test_bridge_relays_a_stock_bookie() -> None:
    stock = FakeStockBookie({7: codec.encode_unmerged([0, 1, 3, 4, 6, 7]), 8: bkp.EIO})
    threading.Thread(target=stock.serve_forever, daemon=True).start()
    source = BookieBridgeSource("127.0.0.1", stock.server_address[1])
    agent = BookieAgent(source, bind="127.0.0.1:0").start()
    try:
        with client_for(agent.port) as c:
            got = c.fetch("b1:3181", [7, 8, 9])
    finally:
        agent.stop(grace=0)
        stock.shutdown()
        stock.server_close()
    av = got[7].availability
    assert av is not None and av.entry_ids().tolist() == [0, 1, 3, 4, 6, 7]  # Java's unmerged shape accepted
    assert got[8].outcome is Outcome.UNAVAILABLE and "EIO" in got[8].reason
    assert got[9].outcome is Outcome.NO_LEDGER
    first = bkp.Request()
    first.ParseFromString(stock.requests[0])
    assert first.header.operation == bkp.GET_LIST_OF_ENTRIES_OF_LEDGER and first.header.version == bkp.VERSION_THREE


def test_bridge_to_a_dead_bookie_answers_eio() -> None:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    dead = port.getsockname()[1]
    port.close()
    agent = BookieAgent(BookieBridgeSource("127.0.0.1", dead, timeout=1), bind="127.0.0.1:0").start()
    try:
        with client_for(agent.port) as c:
            got = c.fetch("b1:3181", [1])
    finally:
        agent.stop(grace=0)
    assert got[1].outcome is Outcome.UNAVAILABLE and "EIO" in got[1].reason


# -- registration, resolution, failures ------------------------------------------------------------

def test_agent_registers_itself_and_the_scan_finds_it(agent: BookieAgent, zk_server: LocalZooKeeper,
                                                      zk_client: KazooClient, zk_namespace: str) -> None:
    uri_text = f"zk+hierarchical://{zk_server.hosts}{zk_namespace}/ledgers"
    agent.register(store_on(zk_client, uri_text), "b1:3181", f"127.0.0.1:{agent.port}")
    with store_at(uri_text) as store:
        addresses = store.agent_addresses()
    assert addresses == {"b1:3181": f"127.0.0.1:{agent.port}"}
    with BookieClient(EndpointResolver(registered=addresses)) as c:
        assert c.fetch("b1:3181", [1])[1].outcome is Outcome.ENTRIES
    assert EndpointResolver(default_port=4444).address("10.1.2.3:3181") == "10.1.2.3:4444"
    agent.stop(grace=0)
    with store_at(uri_text) as store:
        assert store.agent_addresses() == {}


def test_a_runs_session_and_channels_follow_an_agent_that_moved(agent: BookieAgent, synthetic: Path,
                                                                zk_server: LocalZooKeeper, zk_namespace: str) -> None:
    """A bookie joining, leaving or moving its agent does not open a new session and new channels to every
    agent (an auditor's threads grew with each, up to four sets): the next run reuses them and calls the
    agent at its newest address; each run at its own reading's, whatever runs beside it read."""
    settings = ScanSettings(metadata_service_uri=f"zk+hierarchical://{zk_server.hosts}{zk_namespace}/ledgers")
    moved = BookieAgent(SyntheticStore(synthetic), bind="127.0.0.1:0").start()
    resources = ExecutorResources()

    def run_seeing(addresses: dict[str, str]) -> RunContext:
        return RunContext(settings, locations={}, marked={}, agent_addresses=addresses, now_ms=0)

    old, new = {"b1:3181": f"127.0.0.1:{agent.port}"}, {"b1:3181": f"127.0.0.1:{moved.port}", "b2:3181": "127.0.0.1:9"}
    try:
        with resources.use(run_seeing(old)) as (store, client):
            assert client.fetch("b1:3181", [1])[1].outcome is Outcome.ENTRIES
        agent.stop(grace=0)
        with resources.use(run_seeing(new)) as (same_store, client):
            assert same_store is store
            assert client.fetch("b1:3181", [1])[1].outcome is Outcome.ENTRIES
            # another run at once, on an older reading of the registrations (continuous mode's cached facts): it
            # asks where it believes the agent is, and never moves this run's calls back there
            with resources.use(run_seeing(old)) as (_, stale):
                assert stale.fetch("b1:3181", [1])[1].outcome is Outcome.UNAVAILABLE
                assert client.fetch("b1:3181", [1])[1].outcome is Outcome.ENTRIES
    finally:
        resources.close()
        moved.stop(grace=0)


class Counted(BookieServicer):
    """The agent's own answers, each call counted; without its streaming call when `streams` is False (an agent
    that has only BP-34's one-ledger call)."""

    def __init__(self, source: SyntheticStore, streams: bool) -> None:
        super().__init__(source)
        self.streams, self.asked = streams, Counter[str]()

    def GetListOfEntriesOfALedger(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.asked["unary"] += 1
        return super().GetListOfEntriesOfALedger(request, context)

    def GetListOfEntriesOfLedgers(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.asked["streaming"] += 1
        if not self.streams:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        yield from super().GetListOfEntriesOfLedgers(request, context)


def serve_counted(servicer: BookieServicer, port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    bookie_pb2_grpc.add_BookieServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port


def test_an_agent_without_the_streaming_call_is_asked_it_again_later_and_at_a_new_address(synthetic: Path) -> None:
    """An agent that answers UNIMPLEMENTED to the streaming call gets BP-34's one-ledger calls, and the same
    answers; the client remembers that for a while only, and per address: the agent upgraded at the same
    address is asked in one call again after `streaming_asked_again`, and an agent at a new address at once."""
    source, again = SyntheticStore(synthetic), 3.0
    old = Counted(source, streams=False)
    server, port = serve_counted(old)
    servers = [server]
    try:
        with BookieClient(EndpointResolver(registered={"b1:3181": f"127.0.0.1:{port}"}),
                          streaming_asked_again=again) as c:
            first = time.monotonic()
            for _ in range(2):
                got = c.fetch("b1:3181", [1, 5])
                assert got[1].outcome is Outcome.ENTRIES and got[5].outcome is Outcome.NO_LEDGER
            learned = time.monotonic()  # when it heard UNIMPLEMENTED: between `first` and now
            assert old.asked == {"streaming": 1, "unary": 4}  # asked once, not at every fetch
            server.stop(0).wait()
            upgraded = Counted(source, streams=True)
            servers.append(serve_counted(upgraded, port)[0])
            asked = time.monotonic()
            assert c.fetch("b1:3181", [1])[1].outcome is Outcome.ENTRIES
            if asked < first + again:  # (a loaded machine may have taken longer: then it streams already)
                assert upgraded.asked == {"unary": 1}
            time.sleep(max(0.0, learned + again - time.monotonic()))
            got = c.fetch("b1:3181", [1, 5])
            assert got[1].outcome is Outcome.ENTRIES and got[5].outcome is Outcome.NO_LEDGER
            assert upgraded.asked["streaming"] == 1 and upgraded.asked["unary"] <= 1

            # an agent without it at one address; the bookie's agent registered at another, which has it
            unary_only = Counted(source, streams=False)
            server, other = serve_counted(unary_only)
            servers.append(server)
            assert c.view({"b1:3181": f"127.0.0.1:{other}"}).fetch("b1:3181", [1])[1].outcome is Outcome.ENTRIES
            assert unary_only.asked == {"streaming": 1, "unary": 1}
            moved = Counted(source, streams=True)
            server, new_port = serve_counted(moved)
            servers.append(server)
            assert c.view({"b1:3181": f"127.0.0.1:{new_port}"}).fetch("b1:3181", [1])[1].outcome is Outcome.ENTRIES
            assert moved.asked == {"streaming": 1}
    finally:
        for s in servers:
            s.stop(0)


def test_an_agent_back_at_its_address_is_reached_at_once_however_long_it_was_down(synthetic: Path) -> None:
    """An agent down a while, then back at the same address: the client's next calls reach it within about a second,
    whatever gRPC's reconnect backoff had grown to while the address refused (a run's re-check, 10 s after its first
    look, found an agent back for seconds "unavailable": a false alarm). Both ways of calling: a look's loop, and
    the threaded calls."""
    agent = BookieAgent(SyntheticStore(synthetic), bind="127.0.0.1:0").start()
    port = agent.port

    def answered(c: BookieClient) -> bool:
        return (c.fetch_many({"b1:3181": [1]})["b1:3181"][1].outcome is Outcome.ENTRIES
                and c.fetch("b1:3181", [1])[1].outcome is Outcome.ENTRIES)

    with client_for(port) as c:
        assert answered(c)
        agent.stop(grace=0)
        down = time.monotonic() + 18  # refused all along: gRPC's own backoff ends it at 6 s or more between attempts
        while time.monotonic() < down:
            assert c.fetch_many({"b1:3181": [1]})["b1:3181"][1].outcome is Outcome.UNAVAILABLE
            time.sleep(0.5)
        agent = BookieAgent(SyntheticStore(synthetic), bind=f"127.0.0.1:{port}").start()
        try:
            wait_for(lambda: answered(c), 4)
        finally:
            agent.stop(grace=0)


def test_nobody_listening_is_unavailable_not_missing() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with client_for(port, retries=1, backoff=Backoff(0.05), deadline=2) as c:
        got = c.fetch("b1:3181", [1, 2])
    assert {a.outcome for a in got.values()} == {Outcome.UNAVAILABLE}


def test_agent_killed_mid_stream(synthetic: Path) -> None:
    proc, port = slow_agent(synthetic, 0.005)
    try:
        killer = threading.Timer(1.0, lambda: os.kill(proc.pid, signal.SIGKILL))
        killer.start()
        with client_for(port, retries=1, backoff=Backoff(0.05), deadline=20) as c:
            t0 = time.monotonic()
            got = c.fetch("b1:3181", list(range(100, 2100)))
            elapsed = time.monotonic() - t0
    finally:
        reap(proc)
    outcomes = [got[i].outcome for i in range(100, 2100)]
    assert Outcome.ENTRIES in outcomes and Outcome.UNAVAILABLE in outcomes  # it really died mid-stream
    assert Outcome.NO_LEDGER not in outcomes and Outcome.INVALID not in outcomes
    assert elapsed < 10


def test_a_hung_agent_costs_one_deadline(synthetic: Path) -> None:
    proc, port = slow_agent(synthetic, 30)
    try:
        with client_for(port, deadline=1.0) as c:
            t0 = time.monotonic()
            got = c.fetch("b1:3181", [1, 2])
            elapsed = time.monotonic() - t0
    finally:
        reap(proc)
    assert {a.outcome for a in got.values()} == {Outcome.UNAVAILABLE}
    assert "DEADLINE_EXCEEDED" in got[1].reason and elapsed < 3


@pytest.mark.timeout(60)  # a call left held keeps the next look waiting for good
def test_a_small_fetchs_calls_on_one_loop_are_each_read_as_alone_and_free_after(synthetic: Path,
                                                                                agent: BookieAgent) -> None:
    """A small fetch (a continuous look): one call a bookie, all at once on one loop. Each bookie's answers are what
    it alone would give whatever the others did (hung, down, killed mid-stream), a hung agent costs one deadline
    for all and is told slow, not down, and each bookie's only call is free again after."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    nobody = s.getsockname()[1]
    s.close()
    hung, hung_port = slow_agent(synthetic, 30)
    killed, killed_port = slow_agent(synthetic, 0.005)
    ports = {"b1:3181": agent.port, "b2:3181": hung_port, "b3:3181": nobody, "b4:3181": killed_port,
             "b5:3181": agent.port, "b6:3181": agent.port}
    wanted = {"b1:3181": [1, 5], "b2:3181": [1], "b3:3181": [1], "b4:3181": list(range(100, 400)), "b5:3181": [4],
              "b6:3181": list(range(100, 500))}  # 705 ledgers: within one call's 1,000, a small fetch
    try:
        threading.Timer(0.5, lambda: os.kill(killed.pid, signal.SIGKILL)).start()
        with BookieClient(EndpointResolver({b: f"127.0.0.1:{p}" for b, p in ports.items()}), deadline=2.0,
                          retries=1, backoff=Backoff(0.05), max_calls_per_bookie=1) as c:
            t0 = time.monotonic()
            got = c.fetch_many(wanted)
            elapsed = time.monotonic() - t0
            again: list[dict[str, BookieAnswers]] = []
            t = threading.Thread(target=lambda: again.append(c.fetch_many({b: [1] for b in ports})), daemon=True)
            t.start()
            t.join(timeout=30)
    finally:
        reap(hung)
        reap(killed)
    assert got["b1:3181"][1].availability is not None and got["b1:3181"][1].availability.groups == (G(0, 0, 100, 0),)
    assert got["b1:3181"][5].outcome is Outcome.NO_LEDGER
    assert got["b2:3181"][1].outcome is Outcome.UNAVAILABLE and "DEADLINE_EXCEEDED" in got["b2:3181"][1].reason
    assert got["b2:3181"][1].slow  # it answers its health check
    assert got["b3:3181"][1].outcome is Outcome.UNAVAILABLE
    assert {got["b4:3181"][i].outcome for i in range(100, 400)} == {Outcome.ENTRIES, Outcome.UNAVAILABLE}
    assert got["b5:3181"][4].outcome is Outcome.ENTRIES
    assert {got["b6:3181"][i].outcome for i in range(100, 500)} == {Outcome.ENTRIES}
    assert elapsed < 8  # the hung agent's deadline once, not once a bookie after it
    assert again, "a bookie's only call was still held after the look"
    assert again[0]["b1:3181"][1].outcome is Outcome.ENTRIES and again[0]["b5:3181"][1].outcome is Outcome.ENTRIES


def test_store_file_validation(tmp_path: Path) -> None:
    from scrutiny.entrysources import SourceError

    bad = tmp_path / "bad.synth"
    bad.write_bytes(b"nope")
    with pytest.raises(SourceError, match="not a synthetic store"):
        SyntheticStore(bad)
    w = SyntheticStoreWriter()
    w.add_entries("x", 1, np.arange(5))
    p = w.write_all(tmp_path)["x"]
    p.write_bytes(p.read_bytes()[:-3])
    with pytest.raises(SourceError, match="truncated"):
        SyntheticStore(p)


def test_synthetic_answers_many_at_once_as_one_at_a_time(synthetic: Path) -> None:
    store = SyntheticStore(synthetic)
    ids = [5, 2100, 1, 3, 4, 2, 100, 2099, -1]
    assert store.availability_many(ids) == [store.availability_many([i])[0] for i in ids]
    assert store.availability_many([1])[0] == store.availability(1) is not None
    assert store.availability_many([]) == []


def test_stream_messages_are_bounded_by_answers_and_by_bytes() -> None:
    sizes = [10] * 25 + [MESSAGE_BYTES * 2] + [MESSAGE_BYTES // 3] * 7 + [10] * 3
    messages = list(in_messages(range(len(sizes)), lambda i: sizes[i], most=10))
    assert [i for m in messages for i in m] == list(range(len(sizes)))  # every answer once, in order
    assert all(len(m) <= 10 for m in messages)
    # a message closes at the answer that takes it to the byte bound: only that answer can go past it
    assert all(sum(sizes[i] for i in m[:-1]) < MESSAGE_BYTES for m in messages)
    assert [len(m) for m in messages] == [10, 10, 6, 4, 4, 2]  # 3 thirds of MESSAGE_BYTES fall 1 byte short


def test_the_cpu_budget_holds_and_is_on_metrics(synthetic: Path) -> None:
    """entries_per_second caps what a scan costs the bookie host: 2,000 ledgers of 10 entries at 10,000
    entries a second take two seconds however fast the client asks."""
    agent = BookieAgent(SyntheticStore(synthetic), bind="127.0.0.1:0", entries_per_second=10_000).start()
    port = agent.serve_metrics("127.0.0.1:0")
    try:
        with client_for(agent.port) as c:
            t0 = time.monotonic()
            got = c.fetch("b1:3181", range(100, 2100))
            elapsed = time.monotonic() - t0
        assert all(a.availability is not None and a.availability.count == 10 for a in got.values())
        assert 1.8 <= elapsed < 6, elapsed  # 20,000 entries at 10,000/s, 0.1 s of credit
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "scrutiny_agent_entries_per_second_limit 10000.0" in text
        assert "scrutiny_agent_entries_listed_total 20000.0" in text
        throttled = re.search(r"^scrutiny_agent_throttled_seconds_total (\S+)$", text, re.MULTILINE)
        assert throttled is not None and float(throttled.group(1)) > 1.5
    finally:
        agent.stop(grace=0)


class CountingSource:
    def __init__(self, inner: SyntheticStore) -> None:
        self.inner, self.refreshes = inner, 0

    def refresh(self) -> None:
        self.refreshes += 1

    def availability(self, ledger_id: int) -> object:
        return self.inner.availability(ledger_id)

    def close(self) -> None:
        pass


def test_unary_calls_catch_up_at_most_every_so_often_streams_at_every_call(synthetic: Path) -> None:
    source = CountingSource(SyntheticStore(synthetic))
    agent = BookieAgent(source, bind="127.0.0.1:0", unary_catch_up_seconds=0.5).start()  # type: ignore[arg-type]
    try:
        with client_for(agent.port, streaming=False, unary_in_flight=1) as unary:
            assert all(a.outcome is Outcome.ENTRIES for a in unary.fetch("b1:3181", range(100, 300)).values())
            within = source.refreshes
            time.sleep(0.6)
            unary.fetch("b1:3181", [100])
            assert source.refreshes == within + 1  # the interval passed: the next call catches up
        assert 1 <= within <= 4, within  # 200 calls in well under 2 s
        with client_for(agent.port) as streaming:
            before = source.refreshes
            for _ in range(3):
                streaming.fetch("b1:3181", [100, 101])
            assert source.refreshes == before + 3
    finally:
        agent.stop(grace=0)
