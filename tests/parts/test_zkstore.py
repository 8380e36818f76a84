"""The metadata layer against a real ZooKeeper server."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.utils import selector_select

from scrutiny.metadata import (
    BookieRegistration,
    Endpoint,
    Layout,
    LedgerMetadata,
    LedgerState,
    Segment,
    UnderreplicationMark,
    encode_ledger_metadata,
)
from scrutiny.store.zkhandler import PollingHandler
from scrutiny.store.zookeeper import ZooKeeperStore
from scrutiny.testing import store_at
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper, expire_session

ENS = ("a:3181", "b:3181", "c:3181")


def ledger(lid: int, state: LedgerState = LedgerState.CLOSED, last: int = 9) -> LedgerMetadata:
    return LedgerMetadata(lid, state, 3, 2, 2, last, 100, (Segment(0, ENS),), ctime=1000)


def store_for(zk_server: LocalZooKeeper, root: str, layout: str = "hierarchical",
              **kw: object) -> ZooKeeperStore:
    return store_at(f"zk+{layout}://{zk_server.hosts}{root}", **kw)


IDS_AROUND_SWITCH = [0, 1, 9999, 10000, 21234561, 2147483646, 2147483647, 2147483648, 9_999_999_999_999]


@pytest.mark.parametrize("layout", list(Layout))
def test_enumeration_and_reads_per_layout(layout: Layout, zk_server: LocalZooKeeper, zk_client: KazooClient,
                                          zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root, layout)
    w.init_cluster()
    assert w.write_ledgers([ledger(i) for i in IDS_AROUND_SWITCH], version=lambda md: 1 + md.ledger_id % 3) == 9
    # Non-ledger children the enumeration must skip.
    zk_client.ensure_path(f"{root}/idgen-long")
    zk_client.ensure_path(f"{root}/ID-0000000001")
    if layout is Layout.HIERARCHICAL:
        zk_client.ensure_path(f"{root}/abc/0000")
        zk_client.ensure_path(f"{root}/1/0000")
    with store_for(zk_server, root, "null") as store:  # plain: read the LAYOUT znode
        assert store.layout is layout
        ranges = store.ledger_ranges()
        ids = sorted(i for r in ranges for i in store.ledger_ids(r))
        assert ids == IDS_AROUND_SWITCH
        reads = list(store.read_ledgers(ids))
        assert [r.ledger_id for r in reads] == ids
        assert all(r.metadata is not None and r.metadata.segments[0].ensemble == ENS for r in reads)
        assert {r.metadata.format_version for r in reads if r.metadata} == {1, 2, 3}


def test_hierarchical_lists_both_trees_as_separate_ranges(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                          zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    w.write_ledgers([ledger(i) for i in (5, 10005, 2147483648)])
    with store_for(zk_server, root) as store:
        ranges = store.ledger_ranges()
        assert [(r.token, store.ledger_ids(r)) for r in ranges] == [
            ("00/0000", [5]), ("00/0001", [10005]), ("000/0000/0021/4748", [2147483648])]


def test_bad_and_deleted_ledgers_do_not_stop_a_read(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                    zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    w.write_ledgers([ledger(i) for i in range(1, 6)])
    w.write_raw_ledger(3, b"random \x00 bytes")
    w.write_raw_ledger(4, encode_ledger_metadata(
        LedgerMetadata(4, LedgerState.CLOSED, 2, 3, 2, 5, 0, (Segment(0, ("a:1", "b:1")),)), 3))
    with store_for(zk_server, root) as store:
        ids = store.ledger_ids(store.ledger_ranges()[0])
        w.delete_ledger(5)  # deleted between enumeration and read
        reads = {r.ledger_id: r for r in store.read_ledgers(ids)}
    assert reads[1].metadata is not None and reads[2].metadata is not None
    assert reads[3].error and "ledger 3" in reads[3].error
    assert reads[4].error and "write quorum 3" in reads[4].error
    assert reads[5].deleted


def test_marks_registrations_racks_and_switches(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    for lid in (1, 2**40 + 7):
        w.mark_underreplicated(UnderreplicationMark(lid, ("a:3181",), 1_700_000_000_000))
    w.mark_underreplicated(UnderreplicationMark(3, ("b:3181",), None))
    zk_client.create(f"{root}/underreplication/ledgers/0000/0000/0000/0004/urL0000000004", b"\xff\xfe",
                     makepath=True)
    w.register_bookie(BookieRegistration("a:3181", False, (Endpoint("scrutiny-grpc", "127.0.0.1", 4181, "grpc"),)))
    w.register_bookie(BookieRegistration("b:3181", True))
    w.register_bookie(BookieRegistration("c:3181", False), ephemeral=False)
    w.write_racks({"a:3181": "/r1", "b:3181": "/r2"}, f"{zk_namespace}/bookies")
    w.set_replication_disabled(True)
    w.set_lost_bookie_recovery_delay(30)
    with store_for(zk_server, root) as store:
        marks, problems = store.underreplication_marks()
        assert set(marks) == {1, 2**40 + 7, 3}
        assert marks[1].ctime == 1_700_000_000_000 and marks[1].replicas == ("a:3181",)
        assert marks[3].ctime is None
        assert len(problems) == 1 and "ledger 4" in problems[0]
        assert store.underreplication_mark(2**40 + 7) is not None and store.underreplication_mark(9) is None
        regs = store.registrations()
        assert set(regs.writable) == {"a:3181", "c:3181"} and set(regs.readonly) == {"b:3181"}
        assert regs.writable["a:3181"].endpoints[0].port == 4181
        assert regs.cookies == {"a:3181", "b:3181", "c:3181"}
        assert store.racks() == ({"a:3181": "/r1", "b:3181": "/r2"}, [])
        assert store.replication_disabled() and store.lost_bookie_recovery_delay() == 30
        w.set_replication_disabled(False)
        assert not store.replication_disabled()


def test_pipelining_respects_its_bound(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    w.write_ledgers([ledger(i) for i in range(2000)])
    with store_for(zk_server, root, zk_max_in_flight=32, zk_multi_read="off") as store:
        reads = list(store.read_ledgers(range(2000)))
        assert len(reads) == 2000 and all(r.metadata for r in reads)
        assert store.peak_in_flight == 32
    with store_for(zk_server, root, zk_max_in_flight=2) as store:  # multiRead: requests bounded the same way
        assert store.multi_read and len(list(store.read_ledgers(range(2000)))) == 2000
        assert store.peak_in_flight == 2


def _read_all_with_fault(store: ZooKeeperStore, n: int, fault: object) -> list[int]:
    got = []
    for i, r in enumerate(store.read_ledgers(range(n))):
        if i == 300:
            t = threading.Thread(target=fault)  # type: ignore[arg-type]
            t.start()
            t.join()
        assert r.metadata is not None, r
        got.append(r.ledger_id)
    return got


def test_reads_survive_a_server_restart_mid_enumeration(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                        zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    ClusterWriter(zk_client, root).init_cluster()
    ClusterWriter(zk_client, root).write_ledgers([ledger(i) for i in range(3000)])
    with store_for(zk_server, root, zk_max_in_flight=64) as store:
        assert _read_all_with_fault(store, 3000, zk_server.restart) == list(range(3000))
        ranges = store.ledger_ranges()
        assert sum(len(store.ledger_ids(r)) for r in ranges) == 3000


def test_reads_survive_session_expiry_mid_enumeration(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                      zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    ClusterWriter(zk_client, root).init_cluster()
    ClusterWriter(zk_client, root).write_ledgers([ledger(i) for i in range(3000)])
    with store_for(zk_server, root, zk_max_in_flight=64, zk_session_timeout=4.0) as store:
        sid, pw = store.client.client_id

        def expire() -> None:
            expire_session(zk_server.hosts, sid, pw)
            time.sleep(0.5)

        assert _read_all_with_fault(store, 3000, expire) == list(range(3000))
        assert store.client.client_id[0] != sid  # it really got a new session


# -- multiRead (ZooKeeper 3.6+), and the fallback for servers without it -----------------------------

def test_multiread_reads_what_single_reads_read(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    w.write_ledgers([ledger(i) for i in range(3000)])
    w.write_raw_ledger(7, b"not metadata")
    ids = [*range(3000), 5000, 5001]  # two never existed: NONODE per op, not for the batch
    with store_for(zk_server, root, zk_multi_read="off") as single, store_for(zk_server, root) as multi:
        assert multi.multi_read and not single.multi_read  # "auto" probed the 3.8 server
        a = list(single.read_ledgers(ids))
        b = list(multi.read_ledgers(ids))
        assert a == b and [r.ledger_id for r in b] == ids
        assert b[-1].deleted and b[7].error and b[8].metadata is not None
        assert multi.requests <= len(ids) / 100 < single.requests  # a batch per request
        ranges = multi.ledger_ranges()  # the tree's listing: getChildren ops in a multiRead
        assert ranges == single.ledger_ranges() and len(ranges) == 1
        assert [list(kids or []) for _, kids in multi.children_many([f"{root}/00", f"{root}/nothing"])] == \
            [list(kids or []) for _, kids in single.children_many([f"{root}/00", f"{root}/nothing"])]
        w.delete_ledger(9)  # deleted between enumeration and read: that op alone says NONODE
        assert [r.ledger_id for r in multi.read_ledgers([8, 9, 10]) if r.deleted] == [9]


class RefusesMultiRead:
    """A TCP proxy to the real server that behaves like ZooKeeper 3.5 at an unknown opcode: it closes
    the connection (and so the session) when a client sends multiRead (opcode 22)."""

    def __init__(self, target: int) -> None:
        import socket

        self.target = target
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._upstream, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _upstream(self, client: Any, server: Any) -> None:
        first = True
        try:
            while True:
                head = self._exactly(client, 4)
                body = self._exactly(client, int.from_bytes(head, "big"))
                if not first and int.from_bytes(body[4:8], "big", signed=True) == 22:
                    self.refused += 1
                    raise OSError("multiRead refused")
                first = False
                server.sendall(head + body)
        except OSError:
            client.close()
            server.close()

    @staticmethod
    def _exactly(sock: Any, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise OSError("closed")
            buf += chunk
        return buf

    @staticmethod
    def _pipe(src: Any, dst: Any) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            src.close()
            dst.close()


def test_a_server_without_multiread_is_detected_and_read_singly(zk_server: LocalZooKeeper, zk_client: KazooClient,
                                                                 zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    w.write_ledgers([ledger(i) for i in range(500)])
    proxy = RefusesMultiRead(zk_server.port)
    with store_at(f"zk+hierarchical://127.0.0.1:{proxy.port}{root}") as store:
        assert proxy.refused == 1 and not store.multi_read  # the probe's throwaway session took the hit
        sid = store.client.client_id[0]
        assert [r.ledger_id for r in store.read_ledgers(range(500)) if r.metadata] == list(range(500))
        assert store.client.client_id[0] == sid and proxy.refused == 1  # its own session never risked


def test_a_mark_is_written_as_bookkeepers_auditor_writes_it_and_only_on_the_ledger_as_judged(
        zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str) -> None:
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    far = 2**40 + 7
    w.write_ledgers(ledger(lid) for lid in (1, 3, 4, far))
    with store_for(zk_server, root) as store:
        judged = {r.ledger_id: r.metadata.znode_version for r in store.read_ledgers([1, 3, 4, far]) if r.metadata}
        mark = UnderreplicationMark(1, ("a:3181", "b:3181"), 1_700_000_000_000)
        assert store.mark_underreplicated(mark, judged[1])
        data, _ = zk_client.get(f"{root}/underreplication/ledgers/0000/0000/0000/0001/urL0000000001")
        assert data == b'replica: "a:3181"\nreplica: "b:3181"\nctime: 1700000000000\n'
        assert store.underreplication_mark(1) == mark
        assert not store.mark_underreplicated(UnderreplicationMark(1, ("c:3181",), 1), judged[1])  # marked already
        assert store.underreplication_mark(1) == mark
        w.update_ledger(ledger(3, last=19))  # an ensemble change, a recovery: not the ledger that was judged
        w.delete_ledger(4)
        for lid in (3, 4):
            assert not store.mark_underreplicated(UnderreplicationMark(lid, ("a:3181",), 1), judged[lid])
            assert store.underreplication_mark(lid) is None
        assert not store.mark_underreplicated(UnderreplicationMark(far, ("a:3181",), 1), -1)  # version unknown
        assert store.mark_underreplicated(UnderreplicationMark(far, ("a:3181",), 1), judged[far])
        assert zk_client.exists(f"{root}/underreplication/ledgers/0000/0100/0000/0007/urL{far:010d}")


def test_the_polling_handlers_select_answers_as_kazoos_own() -> None:
    """Ready sockets in the order given, as kazoo's own selector gives them (its connection loop reads when its
    socket comes first, sends otherwise); the writable apart; nothing ready within the timeout: nothing."""
    (a, a_peer), (b, b_peer) = socket.socketpair(), socket.socketpair()
    handler = PollingHandler()
    try:
        assert handler.select([a, b], [], [], 0.01) == ([], [], [])
        a_peer.send(b"x")
        assert handler.select([a, b], [], [], 1) == selector_select([a, b], [], [], 1) == ([a], [], [])
        b_peer.send(b"y")
        for given in ([a, b], [b, a]):
            assert handler.select(given, [], [], 1) == selector_select(given, [], [], 1) == (given, [], [])
        assert handler.select([], [a], [], 1) == ([], [a], [])
        with pytest.raises(ValueError, match="non-negative"):
            handler.select([a], [], [], -1)
    finally:
        for s in (a, a_peer, b, b_peer):
            s.close()
