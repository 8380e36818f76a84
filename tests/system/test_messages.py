"""Pulsar's own stamps on a topic's entries, read by the deep scrub from real DbLedgerStorage entry logs through
real agents over a real ZooKeeper: a message corrupted before BookKeeper stored it is found on the entries and
bookies it is on; every legitimate form of a Pulsar entry, a KoP-style entry, a cursor's ledger and a ledger
Pulsar did not tag are never reported."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient

from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.auditor import DEEP, Auditor
from scrutiny.auditor.runqueue import Ticket
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, encode_ledger_metadata, ledger_path
from scrutiny.pulsar import encode
from scrutiny.pulsar.records import LedgerInfo, Position, managed_ledger_of
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.scan.messages import checkpoint_record
from scrutiny.testing import store_at, store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.v1 import bookie_pb2, bookie_pb2_grpc
from tests.support.deepbookie import Bookie, ledger
from tests.support.helpers import wait_for

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


def bookies_with_agents(w: ClusterWriter, uri: str, tmp_path: Path, mds: list[LedgerMetadata],
                        bodies: Callable[[int], Mapping[int, bytes]]) -> list[BookieAgent]:
    """BOOKIES registered, each a DbLedgerStorage directory with its shares of `mds` (the entries `bodies`
    gives a ledger) and its agent, registered."""
    for b in BOOKIES:
        w.register_bookie(BookieRegistration(b, False))
    store = store_on(w.client, uri)
    agents = []
    for n, bid in enumerate(BOOKIES):
        path = tmp_path / f"bookie{n}"
        b = Bookie(path, LiveBookie(path), EntryLog(path, 1))
        for md in mds:
            b.store(md, shares(md, bid, bodies(md.ledger_id)))
        b.seal()
        b.index.close()
        agent = BookieAgent(DbLedgerStorageSource([path], tmp_path / f"scratch{n}"), bind="127.0.0.1:0").start()
        agent.register(store, bid, f"127.0.0.1:{agent.port}")
        agents.append(agent)
    return agents


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
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    agents = bookies_with_agents(w, uri, tmp_path, mds, lambda lid: layout[lid][1])
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



# -- each producer's sequence ids through a topic's ledgers -------------------------------------------------

DEDUP = "persistent://acme/orders/paid"  # deduplication on: its pulsar.dedup cursor keeps the snapshot inline
PLAIN = "persistent://acme/orders/viewed"  # off (no such cursor)


def open_head(md: LedgerMetadata) -> LedgerMetadata:
    return dataclasses.replace(md, state=LedgerState.OPEN, last_entry_id=-1, length=0)


def messages(producer: str, ids: list[int], **kw: object) -> list[bytes]:
    return [encode.message(producer, s, **kw) for s in ids]  # type: ignore[arg-type]


@pytest.fixture
def topics_cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
                   tmp_path: Path) -> Iterator[tuple[ScanSettings, ClusterWriter, list[BookieAgent]]]:
    """Topic DEDUP, deduplication's snapshot at 22:9 saying a persisted 29 and b 130: ledger 21 (a 0-19, b's
    batches 100-109), 22 (a 20-29, then 25 again at entry 15; b 110-114: b's 115-130 are gone, and b sent
    nothing since), 23 (a 40), and its open head 24 (a 41-43; the snapshot waits until 24 is validated: `unload`
    closes it). Topic PLAIN, no deduplication: gaps, a restart, repeats, a marker, a chunked message."""
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    bodies = {
        21: messages("a", list(range(20))) + [encode.message("b", s, [b"x"] * 5) for s in (100, 105)],
        22: messages("a", list(range(20, 30))) + messages("b", [110, 111, 112, 113, 114]) + messages("a", [25]),
        23: messages("a", [40]),
        24: messages("a", [41, 42, 43]),  # the open head: the bookies hold its entries, its metadata is OPEN
        # pulsar.dedup's own ledger (open), where a live broker keeps its position: two snapshots, the last
        40: [encode.position_entry(Position(21, 5), {"a": 3, "b": 100}),
             encode.position_entry(Position(22, 9), {"a": 29, "b": 130})],
        31: messages("v", [0, 1, 2, 9, 10]) + messages("v", [0, 1, 1]) + [encode.message("m", 0, marker_type=1)]
        + [encode.message("v", 11, chunk=(0, 2)), encode.message("v", 11, chunk=(1, 2))],
        32: messages("v", [5, 6]),
    }
    topic_of = {21: DEDUP, 22: DEDUP, 23: DEDUP, 24: DEDUP, 31: PLAIN, 32: PLAIN}
    mds = [dataclasses.replace(ledger(lid, BOOKIES, last=len(b) - 1), custom_metadata=encode.ledger_keys(
        "topic", topic_of[lid]) if lid in topic_of else encode.ledger_keys("cursor", DEDUP, cursor="pulsar.dedup"))
        for lid, b in bodies.items()]
    w.write_ledgers([md if md.ledger_id not in (24, 40) else open_head(md) for md in mds])
    w.write_managed_ledger(managed_ledger_of(DEDUP), encode.managed_ledger(
        [LedgerInfo(lid, len(bodies[lid]), 100) for lid in (21, 22, 23)] + [LedgerInfo(24)]),
        {"pulsar.dedup": encode.cursor(-1, Position(22, 9), properties={"a": 29, "b": 130})})
    w.write_managed_ledger(managed_ledger_of(PLAIN), encode.managed_ledger(
        [LedgerInfo(lid, len(bodies[lid]), 100) for lid in (31, 32)]))
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    agents = bookies_with_agents(w, uri, tmp_path, mds, lambda lid: dict(enumerate(bodies[lid])))
    yield (ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.1, placement_policy="none",
                        deep=True), w, agents)
    for a in agents:
        a.stop(grace=0)


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_messages_gone_behind_deduplication_and_a_repeat_it_should_have_dropped_are_found(
        topics_cluster: tuple[ScanSettings, ClusterWriter, list[BookieAgent]], engine: str,
        request: pytest.FixtureRequest) -> None:
    settings, w, _ = topics_cluster
    unload(w)
    runner = LocalEngine() if engine == "local" else request.getfixturevalue("spark_engine")
    report = ScrutinyRun(settings, runner).execute()
    assert report.complete
    found = {(str(v.category), v.ledger_id): v for v in report.violations}
    assert set(found) == {("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 22), ("PULSAR_REPEAT_UNDER_DEDUP", 22)}
    ahead = found[("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 22)]
    assert ahead.details == {"dedup_snapshot": "22:9", "horizon": 24, "producers": [
        {"producer": "b", "persisted": 130, "highest_stored": 114, "last_seen": "22:14"}]}
    assert ahead.owner is not None and ahead.owner.name == DEDUP
    repeat = found[("PULSAR_REPEAT_UNDER_DEDUP", 22)]
    assert repeat.details["producers"] == [{"producer": "a", "count": 1, "entry_id": 15, "sequence_id": 25,
                                            "highest_before": 29}]
    stats = report.stats
    assert stats["pulsar_topics_validated"] == 2 and stats["pulsar_ledgers_validated"] == 6
    # all but the marker, the chunked message once
    assert stats["pulsar_messages_validated"] == 20 + 10 + 10 + 6 + 1 + 3 + 5 + 3 + 1 + 2
    assert stats["pulsar_topics_without_dedup_snapshot"] == 1
    assert stats["pulsar_validation_stopped"] == 0
    assert stats["pulsar_dedup_snapshots_judged"] == 1 and stats["pulsar_dedup_snapshots_waiting"] == 0
    # counted, never reported: gaps (PLAIN's 2 to 9, DEDUP's a from 29 to 40 across ledgers), PLAIN's restart,
    # its repeats (two inside ledger 31, 5 after 11 across ledgers) and DEDUP's repeat, the marker
    assert (stats["pulsar_sequence_gaps"], stats["pulsar_producer_restarts"], stats["pulsar_repeats"],
            stats["pulsar_markers"]) == (2, 1, 4, 1)
    text = report.render_text()
    assert "producer b: persisted 130 by deduplication's snapshot at 22:9, the highest stored through ledger 24 " \
        "is 114" in text


def test_each_topics_checkpoint_lets_the_next_leader_validate_a_closed_ledger_alone(
        topics_cluster: tuple[ScanSettings, ClusterWriter, list[BookieAgent]], tmp_path: Path) -> None:
    settings, w, _ = topics_cluster
    auditing = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"),
                               full_interval_seconds=0, underreplication_interval_seconds=0,
                               deep_interval_seconds=3600, deep_pass_days=1 / 24, insecure_open_rescan=True)
    first = Auditor(dataclasses.replace(settings, deep=False), auditing, engine=LocalEngine()).start()
    try:
        wait_for(lambda: DEEP in first.last)  # the first deep run is due at once
        one = first.last[DEEP].report
    finally:
        first.stop()
    assert one is not None and one.stats["pulsar_ledgers_validated"] == 5
    # the snapshot's horizon is the open head 24: it waits in the checkpoint
    assert {str(v.category) for v in one.violations} == {"PULSAR_REPEAT_UNDER_DEDUP"}
    assert one.stats["pulsar_dedup_snapshots_waiting"] == 1
    with store_at(settings.metadata_service_uri) as store:
        kept = checkpoint_record(DEDUP).read(store)
    assert kept.position == Position(23, 0) and kept.producers["a"].highest == 40
    assert kept.waiting is not None and (kept.waiting.position, kept.waiting.horizon) == (Position(22, 9), 24)
    close_the_head(w)  # between the two leaders: no look saw it
    second = Auditor(dataclasses.replace(settings, deep=False), auditing, engine=LocalEngine()).start()
    try:
        wait_for(lambda: second.leading.is_set())
        ticket, _ = second.queue.submit(Ticket(DEEP))
        assert ticket.done.wait(60)
        two = ticket.report
    finally:
        second.stop()
    assert two is not None and two.complete
    assert two.stats["pulsar_ledgers_validated"] == 1  # ledger 24 alone: every other one was validated
    assert two.stats["pulsar_messages_validated"] == 3
    # the first validation's repeat, standing, and the snapshot it kept, judged now that 24 is validated
    found = {(str(v.category), v.ledger_id) for v in two.violations}
    assert found == {("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 22), ("PULSAR_REPEAT_UNDER_DEDUP", 22)}
    assert two.stats["pulsar_dedup_snapshots_judged"] == 1
    with store_at(settings.metadata_service_uri) as store:
        assert checkpoint_record(DEDUP).read(store).position == Position(24, 2)


def close_the_head(w: ClusterWriter, roll_over: bool = True) -> None:
    """DEDUP's broker closes its head, ledger 24 (3 entries), and opens ledger 25 (or, unloading the topic, none)."""
    closed = dataclasses.replace(ledger(24, BOOKIES, last=2), custom_metadata=encode.ledger_keys("topic", DEDUP))
    w.client.set(ledger_path(w.layout, w.root, 24), encode_ledger_metadata(closed, 3))
    listed = [LedgerInfo(21, 22, 100), LedgerInfo(22, 16, 100), LedgerInfo(23, 1, 100), LedgerInfo(24, 3, 100)]
    if roll_over:
        w.write_ledgers([open_head(dataclasses.replace(closed, ledger_id=25))])
        listed.append(LedgerInfo(25))
    w.write_managed_ledger(managed_ledger_of(DEDUP), encode.managed_ledger(listed))


def unload(w: ClusterWriter) -> None:
    """DEDUP unloaded: its last ledger closed, so every ledger a snapshot read now can speak of is closed."""
    close_the_head(w, roll_over=False)


def test_continuous_scrutiny_validates_a_ledger_closed_since_the_checkpoint_at_once(
        topics_cluster: tuple[ScanSettings, ClusterWriter, list[BookieAgent]], tmp_path: Path) -> None:
    """With the deep scrub on, the leader's look at a topic whose record changed reads its ledgers closed
    since the checkpoint, and validates them: the checkpoint moves on without a deep run."""
    settings, w, _ = topics_cluster
    auditing = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"),
                               full_interval_seconds=0, underreplication_interval_seconds=0,
                               deep_interval_seconds=3600, deep_pass_days=1 / 24, insecure_open_rescan=True,
                               continuous_batch_seconds=0.3)
    auditor = Auditor(dataclasses.replace(settings, deep=False), auditing, engine=LocalEngine()).start()
    try:
        wait_for(lambda: DEEP in auditor.last)
        deep_run = auditor.last[DEEP].run_id
        close_the_head(w)

        def checkpoint() -> Position | None:
            with store_at(settings.metadata_service_uri) as store:
                return checkpoint_record(DEDUP).read(store).position

        wait_for(lambda: checkpoint() == Position(24, 2), 60)
        assert auditor.last[DEEP].run_id == deep_run  # no deep run since: continuous scrutiny's look did it
        looks = auditor.continuous
        assert looks is not None
        wait_for(lambda: looks.stats["topics_checked"] >= 1)  # counted once its look is done
    finally:
        auditor.stop()


def test_a_live_brokers_dedup_snapshot_is_read_from_its_cursors_own_ledger(
        topics_cluster: tuple[ScanSettings, ClusterWriter, list[BookieAgent]]) -> None:
    """A live broker keeps cursor pulsar.dedup's position in the cursor's own (open) ledger: its last entry is the
    snapshot, read from the bookies of its ensemble, and judged as the inline one."""
    settings, w, _ = topics_cluster
    w.write_cursor(managed_ledger_of(DEDUP), "pulsar.dedup", encode.cursor(40))
    live = ScrutinyRun(settings, LocalEngine()).execute()  # the head open: the snapshot cannot be judged yet
    assert {(str(v.category), v.ledger_id) for v in live.violations} == {("PULSAR_REPEAT_UNDER_DEDUP", 22)}
    assert live.stats["pulsar_dedup_snapshots_waiting"] == 1 and live.stats["pulsar_dedup_snapshots_judged"] == 0
    unload(w)
    report = ScrutinyRun(settings, LocalEngine()).execute()
    found = {(str(v.category), v.ledger_id): v for v in report.violations}
    assert set(found) == {("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 22), ("PULSAR_REPEAT_UNDER_DEDUP", 22)}
    assert found[("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 22)].details["dedup_snapshot"] == "22:9"
    assert report.stats["pulsar_topics_without_dedup_snapshot"] == 1  # PLAIN only


def test_a_ledger_closed_empty_is_read_whole(topics_cluster: tuple[ScanSettings, ClusterWriter, list[BookieAgent]]
                                             ) -> None:
    """A broker that rolls over and is unloaded before writing again closes the new ledger empty (as a real one does):
    it holds nothing to read, and the validation goes through it to the snapshot's horizon."""
    settings, w, _ = topics_cluster
    close_the_head(w)
    empty = dataclasses.replace(ledger(25, BOOKIES, last=-1), custom_metadata=encode.ledger_keys("topic", DEDUP))
    w.client.set(ledger_path(w.layout, w.root, 25), encode_ledger_metadata(empty, 3))
    w.write_managed_ledger(managed_ledger_of(DEDUP), encode.managed_ledger(
        [LedgerInfo(21, 22, 100), LedgerInfo(22, 16, 100), LedgerInfo(23, 1, 100), LedgerInfo(24, 3, 100),
         LedgerInfo(25)]))  # unloaded: the record lists it as the broker left it, without its entries
    report = ScrutinyRun(settings, LocalEngine()).execute()
    assert report.stats["pulsar_validation_stopped"] == 0 and report.stats["pulsar_ledgers_validated"] == 7
    assert report.stats["pulsar_dedup_snapshots_judged"] == 1
    assert ("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 22) in {(str(v.category), v.ledger_id) for v in report.violations}


def test_a_lost_ledger_is_reported_and_the_validation_starts_again_after_it(
        topics_cluster: tuple[ScanSettings, ClusterWriter, list[BookieAgent]]) -> None:
    settings, w, _ = topics_cluster
    unload(w)
    w.delete_ledger(21)  # still listed by DEDUP's record
    report = ScrutinyRun(settings, LocalEngine()).execute()
    found = {(str(v.category), v.ledger_id) for v in report.violations}
    assert found == {("TOPIC_LEDGER_MISSING", 21), ("PULSAR_DEDUP_STATE_AHEAD_OF_DATA", 22),
                     ("PULSAR_REPEAT_UNDER_DEDUP", 22)}
    assert report.stats["pulsar_restarts_after_a_lost_ledger"] == 1 and report.stats["pulsar_ledgers_validated"] == 5


def test_a_finding_whose_ledger_is_trimmed_while_it_is_read_again_is_not_reported(
        topics_cluster: tuple[ScanSettings, ClusterWriter, list[BookieAgent]]) -> None:
    """Retention trims DEDUP's ledgers 21 and 22 (the record first, then BookKeeper's metadata) between the
    validation and the re-read before reporting: the findings rest on ledger 22, and are not reported."""
    settings, w, _ = topics_cluster
    trims = []

    def trim_while_waiting(seconds: float) -> None:
        if not trims:
            w.write_managed_ledger(managed_ledger_of(DEDUP), encode.managed_ledger(
                [LedgerInfo(23, 1, 100), LedgerInfo(24)]))
            for lid in (21, 22):
                w.delete_ledger(lid)
            trims.append(seconds)
        time.sleep(seconds)

    report = ScrutinyRun(settings, LocalEngine(), sleep=trim_while_waiting).execute()
    assert trims and report.complete
    assert not [v for v in report.violations if str(v.category).startswith("PULSAR_")]
    assert report.stats["pulsar_ledgers_validated"] == 5  # validated as they were, then not confirmed


def test_the_agent_reads_a_ledgers_last_entry_and_refuses_a_bad_request(
        topics_cluster: tuple[ScanSettings, ClusterWriter, list[BookieAgent]]) -> None:
    _, _, agents = topics_cluster
    stub = bookie_pb2_grpc.BookieStub(grpc.insecure_channel(f"127.0.0.1:{agents[1].port}"))

    def ask(ledger_id: int, **kw: object) -> object:
        ledger = bookie_pb2.LedgerToVerify(ledger_id=ledger_id, digest_type=bookie_pb2.CRC32C, **kw)
        return stub.ReadLastEntry(bookie_pb2.ReadLastEntryRequest(ledger=ledger), timeout=10)

    got = ask(40)  # bookie 2 of 3 holds entries 0 and 1 of ledger 40 (E3 WQ2)
    assert got.status == bookie_pb2.EOK and got.entry_id == 1
    assert got.payload == encode.position_entry(Position(22, 9), {"a": 29, "b": 130})
    assert ask(999).status == bookie_pb2.ENOLEDGER
    for bad, code in (({"ledger_id": -1}, grpc.StatusCode.INVALID_ARGUMENT),
                      ({"password": b"pw"}, grpc.StatusCode.FAILED_PRECONDITION)):
        with pytest.raises(grpc.RpcError) as err:
            ask(**{"ledger_id": 40, **bad})  # type: ignore[arg-type]
        assert err.value.code() == code
