"""The other direction: what the bookies hold that the metadata does not say. Real DbLedgerStorage
indexes and entry logs written while the agents read them, a real ZooKeeper, the agents over gRPC,
the Spark job: entries past a close that a writer may have had acknowledged, the residue of a recovery,
orphans older than the grace period and ledgers merely awaiting garbage collection."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.bookieclient import BookieClient, EndpointResolver, HoldingsClient
from scrutiny.codec import SequenceGroup
from scrutiny.config import ScanSettings
from scrutiny.entrysources import DbLedgerStorageSource, SyntheticStore
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment
from scrutiny.orphans import SIGHTINGS as ORPHAN_SIGHTINGS
from scrutiny.orphans import LedgerIds, Sightings, not_enumerated
from scrutiny.runstats import Holdings
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store.zookeeper import ZooKeeperStore
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.times import iso, now_ms
from scrutiny.v1 import bookie_pb2

BOOKIES = [f"127.0.6.{n}:3181" for n in range(1, 4)]
NEW = "127.0.6.4:3181"  # ledger 7's replacement for BOOKIES[2], from entry 20 (past its close)
LAST = 19  # every ledger here closes at entry 19 (E 3, WQ 2, AQ 2), but ledger 8 (empty)
CHANGED = (BOOKIES[0], BOOKIES[1], NEW)


def ledger(lid: int) -> LedgerMetadata:
    return LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, LAST, 0, (Segment(0, tuple(BOOKIES)),))


def on(bookie: str, eid: int, ensemble: list[str] | tuple[str, ...] = BOOKIES) -> bool:
    """Is entry `eid` on this bookie's part of the write set (round robin over the ensemble)?"""
    return bookie in ensemble and (list(ensemble).index(bookie) - eid) % 3 < 2


def past_the_close() -> list[LedgerMetadata]:
    """Ledger 7: closed at 19 while adds were in flight behind an ensemble change at 20 (BookKeeper's own
    auditor tests have this shape); ledger 8: closed empty."""
    return [LedgerMetadata(7, LedgerState.CLOSED, 3, 2, 2, LAST, 0, (Segment(0, tuple(BOOKIES)), Segment(20, CHANGED))),
            LedgerMetadata(8, LedgerState.CLOSED, 3, 2, 2, -1, 0, (Segment(0, tuple(BOOKIES)),))]


def stored(lid: int, eid: int) -> bytes:
    return entrylog.package_entry(lid, eid, eid - 1, 0, f"ledger {lid} entry {eid}".encode() * 4, "CRC32C")


@dataclass
class Cluster:
    settings: ScanSettings
    writer: ClusterWriter
    indexes: dict[str, LiveBookie]
    store: ZooKeeperStore

    def collect(self, lid: int) -> None:
        """The bookies' garbage collector: the deleted ledger leaves every `ledgers` index."""
        for index in self.indexes.values():
            index.delete(lid)
            index.flush()


@pytest.fixture
def cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    """Ledgers 1..6, all healthy, on three live DbLedgerStorage bookies with agents; and above the close:
    ledger 2's entries 20-24 on both bookies of each write set (a replaced bookie took the old writer's
    adds after the close), ledger 3's entry 20 on one bookie and 21 on two (a recovery's residue: 21
    came after an entry that never reached AQ); ledger 7's entries 20-22 on both bookies of their write
    sets in its last segment (which starts past the close), ledger 8's 0-2 past its empty close."""
    root = f"{zk_namespace}/ledgers"
    writer = ClusterWriter(zk_client, root)
    writer.init_cluster()
    writer.write_ledgers([ledger(lid) for lid in range(1, 7)] + past_the_close())
    for b in [*BOOKIES, NEW]:
        writer.register_bookie(BookieRegistration(b, False))
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    store = store_on(zk_client, uri)
    past = {2: {b: [e for e in range(20, 25) if on(b, e)] for b in BOOKIES},
            3: {BOOKIES[1]: [20, 21], BOOKIES[2]: [21]}}
    indexes, agents = {}, []
    try:
        for n, b in enumerate([*BOOKIES, NEW]):
            path = tmp_path / f"bookie{n}"
            index = LiveBookie(path)
            log = EntryLog(path, 1)
            for lid in range(1, 9):
                mine = [e for e in range(LAST + 1) if on(b, e) and lid < 8] + past.get(lid, {}).get(b, [])
                mine += [e for e in range(20, 23) if lid == 7 and on(b, e, CHANGED)]
                mine += [e for e in range(3) if lid == 8 and on(b, e)]
                if mine:
                    index.write(lid, {e: stored(lid, e) for e in mine}, log)
            log.finish()
            index.flush()
            indexes[b] = index
            agent = BookieAgent(DbLedgerStorageSource([path], tmp_path / f"scratch{n}"), bind="127.0.0.1:0").start()
            agent.register(store, b, f"127.0.0.1:{agent.port}")
            agents.append(agent)
        settings = ScanSettings(metadata_service_uri=uri, placement_policy="none", recheck_delay=0.1,
                                orphan_grace_period=2)
        yield Cluster(settings, writer, indexes, store)
    finally:
        for a in agents:
            a.stop(grace=0)
        for index in indexes.values():
            index.close()


def found(report: object) -> set[tuple[str, int]]:
    return {(str(v.category), v.ledger_id) for v in report.violations}  # type: ignore[attr-defined]


def test_writes_after_the_close_are_found_and_a_recovery_residue_is_not(cluster: Cluster,
                                                                        spark_engine: object) -> None:
    report = ScrutinyRun(cluster.settings, spark_engine).execute()  # type: ignore[arg-type]
    assert report.complete, report.errors
    assert found(report) == {("ENTRIES_PAST_THE_CLOSE", 2), ("ENTRIES_PAST_THE_CLOSE", 7),
                             ("ENTRIES_PAST_THE_CLOSE", 8)}
    v, changed, empty = sorted(report.violations, key=lambda v: v.ledger_id)
    assert v.details["entries"] == [[20, 24]] and v.details["count"] == 5 and v.details["least_copies"] == 2
    assert set(v.bookies) == set(BOOKIES) and v.details["ensemble"] == BOOKIES
    # the new bookie of a segment starting past the close is asked, and its copies count
    assert changed.details["entries"] == [[20, 22]] and changed.details["ensemble"] == list(CHANGED)
    assert NEW in changed.bookies and changed.details["least_copies"] == 2
    assert empty.details["entries"] == [[0, 2]] and empty.details["last_entry_id"] == -1
    assert report.ledgers["skipped_empty"] == 1 and report.ledgers["checked"] == 7
    assert report.stats["ledgers_with_residue_past_the_close"] == 1  # ledger 3
    assert report.exit_status() == 0  # a warning (docs/entries-past-the-close.md)
    assert "above lastEntryId 19" in report.render_text()


def test_an_orphan_older_than_the_grace_is_found_and_a_just_deleted_ledger_is_not(cluster: Cluster) -> None:
    cluster.writer.delete_ledger(4)  # its bookies never collect it: an orphan once the grace has passed
    cluster.writer.delete_ledger(6)  # collected before the next run: never an orphan
    first = ScrutinyRun(cluster.settings, LocalEngine(), record_sightings=True).execute()
    assert "ORPHAN_LEDGER" not in {c for c, _ in found(first)}  # first seen now
    assert first.stats["orphan_candidates"] == 6 and first.stats["orphan_bookies_listed"] == 4
    readme = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    assert all(f"`{name}`" in readme and name in first.stats for name in Holdings.names())
    cluster.collect(6)
    time.sleep(2.2)
    cluster.writer.delete_ledger(5)  # deleted a moment ago, awaiting the bookies' garbage collection
    second = ScrutinyRun(cluster.settings, LocalEngine(), record_sightings=True).execute()
    orphans = {lid: v for (c, lid), v in {(str(v.category), v.ledger_id): v for v in second.violations}.items()
               if c == "ORPHAN_LEDGER"}
    assert set(orphans) == {4}, second.violations
    v = orphans[4]
    assert v.bookies == tuple(sorted(BOOKIES)) and v.details["absent_seconds"] >= 2
    expected_bytes = {b: sum(len(stored(4, e)) for e in range(LAST + 1) if on(b, e)) for b in BOOKIES}
    assert v.details["held_by"] == {b: {"entries": 14 if i == 1 else 13, "bytes": expected_bytes[b]}
                                    for i, b in enumerate(BOOKIES)}  # entries e with (i - e) % 3 < 2
    assert second.stats["orphan_candidates"] == 6  # ledgers 4 and 5 on every bookie
    assert second.exit_status() == 0  # a warning, not a page
    # the same sightings, read by a plain scan, which records nothing: ledger 5 is due once the grace has
    # passed since the second run sighted it (a loaded machine may get there before the scan's look)
    recorded = ORPHAN_SIGHTINGS.read(cluster.store)
    seen_5 = min(per[5] for per in recorded.first_seen.values() if 5 in per)
    before = now_ms()
    scan = ScrutinyRun(cluster.settings, LocalEngine()).execute()
    after = now_ms()
    assert ORPHAN_SIGHTINGS.read(cluster.store) == recorded
    again = {o.ledger_id: o.details["absent_since"] for o in scan.violations if str(o.category) == "ORPHAN_LEDGER"}
    assert again.get(4) == v.details["absent_since"]
    if 5 in again:
        assert again[5] == iso(seen_5) and after - seen_5 >= 2000
    else:
        assert before - seen_5 < 2000


def test_an_orphan_collected_or_recreated_before_reporting_is_not_reported(cluster: Cluster) -> None:
    cluster.writer.delete_ledger(4)
    ScrutinyRun(cluster.settings, LocalEngine(), record_sightings=True).execute()
    time.sleep(2.2)
    cluster.collect(4)  # the garbage collector caught up: nothing left to report
    report = ScrutinyRun(dataclasses.replace(cluster.settings, orphan_grace_period=0), LocalEngine(),
                         record_sightings=True).execute()
    assert not any(c == "ORPHAN_LEDGER" for c, _ in found(report))
    assert report.stats["orphan_candidates"] == 0


def test_the_agents_list_their_ledgers_in_pages(tmp_path: Path) -> None:
    writer = SyntheticStoreWriter()
    ids = list(range(5, 2005, 2))
    for lid in ids:
        writer.add("b1:3181", lid, [SequenceGroup(0, 0, 3, 0)])
    path = writer.write_all(tmp_path)["b1:3181"]
    agent = BookieAgent(SyntheticStore(path), bind="127.0.0.1:0").start()
    try:
        with BookieClient(EndpointResolver({"b1:3181": f"127.0.0.1:{agent.port}"})) as client:
            listed = HoldingsClient(client).list_many(["b1:3181"], page=300)["b1:3181"]
            assert isinstance(listed, np.ndarray) and listed.tolist() == ids
            stub = client._stub("b1:3181")
            for bad in (bookie_pb2.ListLedgersRequest(from_ledger_id=-1),
                        bookie_pb2.ListLedgersRequest(max_ledgers=10_000_000)):
                with pytest.raises(grpc.RpcError) as err:
                    list(stub.ListLedgers(bad, timeout=5))
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        agent.stop(grace=0)


def test_sightings_keep_the_first_time_and_survive_their_stored_form() -> None:
    s = Sightings().seen({"a": [1, 2], "b": [7]}, now_ms=1000)
    s = s.seen({"a": [2, 3]}, now_ms=5000)  # b not listed this time: kept; a's 1 gone, 2 kept, 3 new
    assert s.first_seen == {"a": {2: 1000, 3: 5000}, "b": {7: 1000}}
    assert s.due(3000, 6000) == {"a": {2: 1000}, "b": {7: 1000}}
    assert Sightings.parse(s.to_bytes(), "x").first_seen == s.first_seen
    capped = Sightings().seen({"a": list(range(10))}, now_ms=1).seen({"a": list(range(20))}, now_ms=2, most=15)
    assert len(capped) == 15 and capped.untracked == 5 and all(capped.first_seen["a"][i] == 1 for i in range(10))
    for bad in (b"", b"not zlib", __import__("zlib").compress(b'{"format": 2}')):
        with pytest.raises(Exception, match="sightings"):
            Sightings.parse(bad, "the stored orphan sightings")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5000), max_size=300), max_size=6), st.lists(st.integers(0, 6000), max_size=400))
def test_enumerated_ids_kept_compactly_answer_as_the_ids_do(ranges: list[list[int]], held: list[int]) -> None:
    enumerated = [LedgerIds.of(np.unique(np.array(r, dtype=np.int64))) for r in ranges]
    bookie = np.unique(np.array(held, dtype=np.int64))
    every = np.unique(np.array([i for r in ranges for i in r], dtype=np.int64))
    assert not_enumerated(bookie, enumerated).tolist() == np.setdiff1d(bookie, every).tolist()


def test_a_dense_range_costs_a_bit_a_ledger() -> None:
    dense = LedgerIds.of(np.arange(10_000, 20_000, dtype=np.int64))
    assert dense.bits is not None and dense.bits.nbytes == 1250
    sparse = LedgerIds.of(np.array([1, 10**12], dtype=np.int64))
    assert sparse.ids is not None and sparse.contains(np.array([1, 2, 10**12])).tolist() == [True, False, True]
