"""Deep scrub: entry logs and indexes written in BookKeeper's formats with real digests, read back by
the agent (read-only, rate-limited) and judged by the scan: each kind of damage is found as the right
category on the right entries, a healthy bookie is clean, a compaction racing the scrub is no alarm."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import grpc
import pytest
from kazoo.client import KazooClient

from scrutiny import entrylog
from scrutiny.agent import BookieAgent, Rate
from scrutiny.auditor import DEEP, Auditor
from scrutiny.auditor.deeprecord import DEEP_PASS
from scrutiny.auditor.runqueue import Ticket
from scrutiny.config import AuditorSettings, MetricsSettings, ScanSettings
from scrutiny.console.web import AuditorWeb
from scrutiny.deeppass import DeepPass, slices_for
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.errors import DataError
from scrutiny.metadata import BookieRegistration, LedgerMetadata
from scrutiny.scan.driver import ScrutinyRun, check_marks
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at, store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.v1 import auditor_pb2, auditor_pb2_grpc, bookie_pb2, bookie_pb2_grpc
from tests.support.deepbookie import Bookie, ledger
from tests.support.helpers import wait_for

BOOKIES = [f"127.0.4.{n}:3181" for n in range(1, 4)]


def payload(lid: int, eid: int) -> bytes:
    return f"ledger {lid} entry {eid} ".encode() * 8


def stored_entries(md: LedgerMetadata, bookie: str) -> dict[int, bytes]:
    """The entries a bookie of the ledger's (one-segment) ensemble stores, round robin, as sent."""
    ens = md.segments[0].ensemble
    pos = ens.index(bookie)
    out, length = {}, 0
    for eid in range(md.last_entry_id + 1):
        body = payload(md.ledger_id, eid)
        length += len(body)
        if (pos - eid) % md.ensemble_size < md.write_quorum:
            out[eid] = entrylog.package_entry(md.ledger_id, eid, eid - 1, length, body, md.digest_type, md.password)
    return out


def tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


# -- the formats, pure --------------------------------------------------------------------------------

@pytest.mark.parametrize("digest_type", ["CRC32", "CRC32C", "HMAC", "DUMMY"])
def test_a_packaged_entry_verifies_and_a_flipped_byte_does_not(digest_type: str) -> None:
    stored = entrylog.package_entry(7, 3, 2, 4096, b"payload bytes", digest_type, b"secret")
    assert stored[:16] == struct.pack(">qq", 7, 3) and stored.endswith(b"payload bytes")
    ok = entrylog.verify_entry(stored, 7, 3, digest_type, b"secret")
    assert ok.reason == "" and ok.payload_hash == entrylog.payload_hash(b"payload bytes")
    flipped = stored[:-1] + bytes([stored[-1] ^ 1])
    expected = "" if digest_type == "DUMMY" else entrylog.BAD_DIGEST
    assert entrylog.verify_entry(flipped, 7, 3, digest_type, b"secret").reason == expected
    assert entrylog.verify_entry(stored, 7, 4, digest_type, b"secret").reason == entrylog.OTHER_ENTRY
    assert entrylog.verify_entry(stored[:10], 7, 3, digest_type).reason == entrylog.BAD_SIZE


def test_digests_are_the_libraries_crcs_in_bookkeepers_layout() -> None:
    header = struct.pack(">qqqq", 1, 2, 1, 10)
    body = b"0123456789"
    crc32 = entrylog.package_entry(1, 2, 1, 10, body, "CRC32")
    assert crc32[32:40] == struct.pack(">q", zlib.crc32(header + body))  # an int64 holding java's CRC32
    crc32c = entrylog.package_entry(1, 2, 1, 10, body, "CRC32C")
    assert crc32c[32:36] == struct.pack(">I", google_crc32c.value(header + body))
    assert hex(google_crc32c.value(b"123456789")) == "0xe3069283"  # the standard CRC-32C check value
    hmac_entry = entrylog.package_entry(1, 2, 1, 10, body, "HMAC", b"pw")
    assert len(hmac_entry) == 32 + 20 + 10
    assert entrylog.verify_entry(hmac_entry, 1, 2, "HMAC", None).reason == ""  # no password: ids and size only
    assert entrylog.verify_entry(hmac_entry, 1, 2, "HMAC", b"other").reason == entrylog.BAD_DIGEST


def test_the_byte_rate_limit_sleeps_readers_to_the_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    rate = Rate(1000, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        rate.take(500)
    assert now[0] == pytest.approx(5.0, abs=0.11)  # 5000 bytes at 1000/s, at most 0.1 s of credit


# -- the agent's source, on a bookie's directories ---------------------------------------------------

@pytest.fixture
def bookie(tmp_path: Path) -> Iterator[Bookie]:
    path = tmp_path / "bookie"
    with LiveBookie(path) as index:
        b = Bookie(path, index, EntryLog(path, 1))
        for lid, digest_type in ((1, "CRC32C"), (2, "CRC32"), (3, "CRC32C")):
            md = ledger(lid, BOOKIES, digest_type)
            b.store(md, stored_entries(md, BOOKIES[0]))
        b.seal()
        yield b


def verify_all(source: DbLedgerStorageSource, b: Bookie) -> dict[int, list[tuple[int, str, str]]]:
    source.refresh()
    out = {}
    for lid, md in b.mds.items():
        got = source.verify(lid, md.digest_type, None)
        assert got is not None
        out[lid] = got.corrupt
    return out


def test_a_healthy_bookie_is_clean_and_nothing_of_it_changes(bookie: Bookie, tmp_path: Path) -> None:
    before = tree(bookie.path)
    source = DbLedgerStorageSource([bookie.path], tmp_path / "scratch")
    try:
        source.refresh()
        got = source.verify(1, "CRC32C", None)
        assert got is not None and not got.corrupt and got.digest_checked
        assert list(got.verified) == sorted(stored_entries(bookie.mds[1], BOOKIES[0]))
        assert got.payload_hashes == b"".join(entrylog.payload_hash(payload(1, e)) for e in got.verified)
        assert source.verify(99, "CRC32C", None) is None  # no such ledger
    finally:
        source.close()
    assert tree(bookie.path) == before


def test_each_kind_of_damage_is_found_on_its_entries(bookie: Bookie, tmp_path: Path) -> None:
    data = bookie.log_bytes()
    flipped = bookie.pos(1, 3) + 40  # a payload byte of ledger 1 entry 3 (CRC32C: 32 + 4 digest bytes)
    data[flipped] ^= 0xFF
    other = bookie.pos(2, 0)  # ledger 2 entry 0's location made to point at ledger 2 entry 2
    bookie.index.locations[struct.pack(">qq", 2, 0)] = struct.pack(">q", bookie.index.location(2, 2))
    bookie.index.flush()
    assert other != bookie.pos(2, 0)
    last = max(stored_entries(bookie.mds[3], BOOKIES[0]))
    bookie.rewrite_log(bytes(data[:bookie.pos(3, last) + 20]))  # the log cut in ledger 3's last entry
    source = DbLedgerStorageSource([bookie.path], tmp_path / "scratch")
    try:
        corrupt = verify_all(source, bookie)
        assert [(e, r) for e, r, _ in corrupt[1]] == [(3, entrylog.BAD_DIGEST)]
        assert [(e, r) for e, r, _ in corrupt[2]] == [(0, entrylog.OTHER_ENTRY)]
        assert "entry 2" in corrupt[2][0][2]
        assert [(e, r) for e, r, _ in corrupt[3]] == [(last, entrylog.TRUNCATED)]
        entrylog.log_path(bookie.path, 1).unlink()  # the whole log gone
        corrupt = verify_all(source, bookie)
        assert {r for lid in corrupt for _, r, _ in corrupt[lid]} == {entrylog.MISSING_LOG}
        assert len(corrupt[1]) == len(stored_entries(bookie.mds[1], BOOKIES[0]))
    finally:
        source.close()


def test_a_compaction_that_moves_entries_during_the_scrub_is_no_alarm(tmp_path: Path) -> None:
    """Ledger 1's first entries in log 1, the rest in log 3; right after the scrub's first read (its
    locations already taken, log 3 not opened yet) compaction moves log 3's entries to log 4 and
    removes log 3: the scrub finds log 3 gone, re-reads the index, and verifies them in log 4."""
    path = tmp_path / "bookie"
    md = ledger(1, BOOKIES)
    entries = stored_entries(md, BOOKIES[0])
    ids = sorted(entries)
    with LiveBookie(path) as index:
        first, second = EntryLog(path, 1), EntryLog(path, 3)
        index.write(1, {e: entries[e] for e in ids[:4]}, first)
        index.write(1, {e: entries[e] for e in ids[4:]}, second)
        first.finish()
        second.finish()
        index.flush()
        source = DbLedgerStorageSource([path], tmp_path / "scratch")
        reads = [0]

        def compact_after_the_first_read(n: int) -> None:
            reads[0] += 1
            if reads[0] == 1:
                index.compact(path, 3, EntryLog(path, 4))

        try:
            source.refresh()
            got = source.verify(1, "CRC32C", None, compact_after_the_first_read)
            assert got is not None and not got.corrupt and list(got.verified) == ids
            assert not entrylog.log_path(path, 3).exists()
            assert entrylog.split_location(index.location(1, ids[-1]))[0] == 4  # really moved
        finally:
            source.close()


def test_the_agent_answers_over_grpc_at_its_byte_rate(bookie: Bookie, tmp_path: Path) -> None:
    source = DbLedgerStorageSource([bookie.path], tmp_path / "scratch")
    size = entrylog.log_path(bookie.path, 1).stat().st_size
    rate = size / 1.0  # the three ledgers' entries take about a second at this rate
    agent = BookieAgent(source, bind="127.0.0.1:0", deep_bytes_per_second=rate).start()
    try:
        stub = bookie_pb2_grpc.BookieStub(grpc.insecure_channel(f"127.0.0.1:{agent.port}"))
        asks = [bookie_pb2.LedgerToVerify(ledger_id=lid, digest_type=bookie_pb2.DigestType.Value(md.digest_type))
                for lid, md in bookie.mds.items()] + [bookie_pb2.LedgerToVerify(ledger_id=42)]
        t0 = time.monotonic()
        answers = [v for msg in stub.VerifyEntriesOfLedgers(
            bookie_pb2.VerifyEntriesOfLedgersRequest(ledgers=asks), timeout=30) for v in msg.ledgers]
        elapsed = time.monotonic() - t0
        read = sum(v.bytes_read for v in answers)
        assert {v.ledger_id: v.status for v in answers} == {1: 0, 2: 0, 3: 0, 42: bookie_pb2.ENOLEDGER}
        assert all(not v.corrupt and not v.digest_unchecked for v in answers if v.ledger_id != 42)
        assert elapsed >= read / rate - 0.15  # never faster than the limit (less the 0.1 s credit)
        with pytest.raises(grpc.RpcError) as err:  # a password to an agent without TLS: refused
            list(stub.VerifyEntriesOfLedgers(bookie_pb2.VerifyEntriesOfLedgersRequest(
                ledgers=[bookie_pb2.LedgerToVerify(ledger_id=1, digest_type=bookie_pb2.HMAC, password=b"pw")])))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        agent.stop(grace=0)


# -- the scan ------------------------------------------------------------------------------------------

@pytest.fixture
def deep_cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str,
                 tmp_path: Path) -> Iterator[tuple[ScanSettings, dict[str, Bookie]]]:
    """Ledgers 1..4 (E3 WQ2 AQ2) on three DbLedgerStorage bookies, each with its agent; ledger 1's
    entry 5 flipped on bookie 0 (after its index said it is there), ledger 2's entry 3 stored on
    bookies 0 and 1 with different payloads (each digest good), ledgers 3 and 4 healthy."""
    root = f"{zk_namespace}/ledgers"
    w = ClusterWriter(zk_client, root)
    w.init_cluster()
    mds = [ledger(lid, BOOKIES, "CRC32" if lid == 4 else "CRC32C") for lid in range(1, 5)]
    w.write_ledgers(mds)
    for b in BOOKIES:
        w.register_bookie(BookieRegistration(b, False))
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    store = store_on(zk_client, uri)
    bookies: dict[str, Bookie] = {}
    agents = []
    for n, bid in enumerate(BOOKIES):
        path = tmp_path / f"bookie{n}"
        b = Bookie(path, LiveBookie(path), EntryLog(path, 1))
        for md in mds:
            entries = stored_entries(md, bid)
            if md.ledger_id == 2 and n == 1:  # bookie 1's copy of entry 3: another payload
                entries[3] = entrylog.package_entry(2, 3, 2, 0, b"something else", "CRC32C")
            b.store(md, entries)
        b.seal()
        bookies[bid] = b
    data = bookies[BOOKIES[0]].log_bytes()
    data[bookies[BOOKIES[0]].pos(1, 5) + 40] ^= 0xFF
    bookies[BOOKIES[0]].rewrite_log(bytes(data))
    for b in bookies.values():  # stopped bookies: whatever changes in their directories is the scrub's doing
        b.index.close()
    for n, bid in enumerate(BOOKIES):
        source = DbLedgerStorageSource([bookies[bid].path], tmp_path / f"scratch{n}")
        agent = BookieAgent(source, bind="127.0.0.1:0").start()
        agent.register(store, bid, f"127.0.0.1:{agent.port}")
        agents.append(agent)
    yield ScanSettings(metadata_service_uri=uri, engine="local", recheck_delay=0.1, placement_policy="none"), bookies
    for a in agents:
        a.stop(grace=0)


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_a_deep_scan_finds_corrupt_and_divergent_copies_and_counts_corrupt_as_gone(
        deep_cluster: tuple[ScanSettings, dict[str, Bookie]], engine: str, request: pytest.FixtureRequest) -> None:
    settings, bookies = deep_cluster
    before = {b: tree(x.path) for b, x in bookies.items()}
    shallow = ScrutinyRun(settings, LocalEngine()).execute()
    assert shallow.complete and not shallow.violations  # every index lists every entry
    runner = LocalEngine() if engine == "local" else request.getfixturevalue("spark_engine")
    report = ScrutinyRun(dataclasses.replace(settings, deep=True), runner).execute()
    assert report.complete
    found = {(str(v.category), v.ledger_id): v for v in report.violations}
    assert set(found) == {("CORRUPT_ENTRY", 1), ("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 1), ("DIVERGENT_COPIES", 2)}
    corrupt = found[("CORRUPT_ENTRY", 1)]
    assert corrupt.bookies == (BOOKIES[0],)
    assert corrupt.details["copies"][BOOKIES[0]]["entries"] == [[5, 5]]
    assert corrupt.details["copies"][BOOKIES[0]]["reasons"] == {"bad-digest": 1}
    below = found[("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", 1)]  # the corrupt copy is no copy: entry 5 has one
    assert below.details["under_covered"][0]["first_entry"] == 5 and below.details["under_covered"][0]["copies"] == 1
    divergent = found[("DIVERGENT_COPIES", 2)]
    assert divergent.details["entries"] == [[3, 3]] and len(divergent.details["first_entry_copies"]) == 2
    assert report.stats["deep_ledgers_verified"] == 4 and report.stats["deep_entries_corrupt"] == 1
    assert report.stats["deep_entries_verified"] == 4 * 20 * 2 - 1
    assert "deep scrub: 4 ledgers" in report.render_text()
    assert {b: tree(x.path) for b, x in bookies.items()} == before  # read-only


def test_deep_slices_verify_every_ledger_once_per_pass(deep_cluster: tuple[ScanSettings, dict[str, Bookie]]) -> None:
    settings, _ = deep_cluster
    verified = []
    for k in range(3):
        s = dataclasses.replace(settings, deep=True, deep_slices=3, deep_slice=k)
        report = ScrutinyRun(s, LocalEngine()).execute()
        verified.append(report.stats.get("deep_ledgers_verified", 0))
        assert report.ledgers["checked"] == 4  # the shallow checks still cover every ledger
    assert sum(verified) == 4


# -- the deep pass: a cursor over many runs, resumed by the next leader ----------------------------------

def test_a_deep_pass_moves_slice_by_slice_and_wraps() -> None:
    cursor = DeepPass.fresh(3, now_ms=1000)
    assert (cursor.next_slice, cursor.progress, cursor.oldest_verified_ms) == (0, 0.0, 1000)
    for k, started in enumerate((2000, 3000, 4000)):
        cursor = cursor.after_run(k, started)
    assert (cursor.next_slice, cursor.passes_completed, cursor.oldest_verified_ms) == (0, 1, 2000)
    cursor = cursor.after_run(0, 5000)
    assert cursor.oldest_verified_ms == 3000 and cursor.progress == pytest.approx(1 / 3)
    assert DeepPass.parse(cursor.to_bytes()) == cursor
    assert cursor.resized(3) is cursor
    assert cursor.resized(4) == DeepPass(4, 0, (0, 0, 0, 0), 3000, 1)  # debt kept from the oldest known
    for bad in (b"{", b'{"slices": 0, "next_slice": 0, "verified_ms": [], "created_ms": 0}',
                b'{"slices": 2, "next_slice": 5, "verified_ms": [0, 0], "created_ms": 0}'):
        with pytest.raises(DataError, match="deep-pass cursor"):
            DeepPass.parse(bad)
    assert slices_for(7 * 86400, 3600) == 168 and slices_for(100, 0) == 1


def _deep_ticket(auditor: Auditor) -> Ticket:
    ticket, _ = auditor.queue.submit(Ticket(DEEP))
    assert ticket.done.wait(60)
    return ticket


def test_the_auditors_deep_job_resumes_its_pass_after_a_leader_change(
        deep_cluster: tuple[ScanSettings, dict[str, Bookie]], tmp_path: Path) -> None:
    settings, _ = deep_cluster
    auditor_settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"),
                                       full_interval_seconds=0, underreplication_interval_seconds=0,
                                       deep_interval_seconds=3600, deep_pass_days=3 / 24, insecure_open_rescan=True)
    first = Auditor(settings, auditor_settings, metrics=MetricsSettings(listen="127.0.0.1:0"), web=AuditorWeb,
                    engine=LocalEngine()).start()
    try:
        wait_for(lambda: first.leading.is_set())
        wait_for(lambda: DEEP in first.last)  # the first deep run is due at once
        runs = [first.last[DEEP], _deep_ticket(first)]
        text = urllib.request.urlopen(f"http://127.0.0.1:{first.http.port}/metrics", timeout=5).read().decode()
        assert "scrutiny_deep_pass_progress_ratio 0.666" in text
        assert "scrutiny_deep_unverified_age_seconds" in text
        stub = auditor_pb2_grpc.AuditorStub(grpc.insecure_channel(first.address))
        last = json.loads(stub.GetLastReport(auditor_pb2.GetLastReportRequest(kind="deep")).report_json)
        assert last["run_id"] == runs[1].run_id and last["stats"]["deep_pass_next_slice"] == 2
    finally:
        first.stop()
    with store_at(settings.metadata_service_uri) as store:
        cursor = DEEP_PASS.read(store)
    assert cursor.next_slice == 2 and cursor.verified_ms[:2] == tuple(r.started_ms for r in runs)
    second = Auditor(settings, auditor_settings, engine=LocalEngine()).start()
    try:
        wait_for(lambda: second.leading.is_set())  # the deep cadence is kept: the next run is an hour away
        # the first leader's last deep run, as a summary: read from the leaders' record once it leads
        wait_for(lambda: second.last_report(DEEP) is not None)
        assert DEEP not in second.last
        inherited = second.last_report(DEEP)
        assert inherited is not None and inherited["summary_only"] and inherited["run_id"] == runs[1].run_id
        runs.append(_deep_ticket(second))  # as if the hour had passed: the pass resumes at slice 2
    finally:
        second.stop()
    assert [r.deep_slice for r in runs] == [0, 1, 2]
    reports = [r.report for r in runs]
    assert all(rep is not None and rep.complete for rep in reports)
    assert sum(rep.stats["deep_ledgers_verified"] for rep in reports if rep) == 4  # every ledger once a pass
    found = {(str(v.category), v.ledger_id) for rep in reports if rep for v in rep.violations}
    assert {("CORRUPT_ENTRY", 1), ("DIVERGENT_COPIES", 2)} <= found
    with store_at(settings.metadata_service_uri) as store:
        final = DEEP_PASS.read(store)
    assert (final.next_slice, final.passes_completed) == (0, 1)


def documented_stats() -> tuple[set[str], set[str]]:
    """The stats the documentation lists: (every run's, deep runs')."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "report.md").read_text() + (docs / "agent.md").read_text()
    every = text[text.index("- `stats` counts what the run looked at again"):]
    every = every[:every.index("\n\n")]
    deep = text[text.index("The report's `stats` say what was verified"):]
    deep = deep[:deep.index(") and, for")]
    named = set(re.findall(r"`([a-z_]+)`", every)) | set(re.findall(r"`stats\.([a-z_]+)`", text))
    return named - {"stats"}, set(re.findall(r"`(deep_[a-z_]+)`", deep))


def test_every_stat_the_documentation_lists_is_in_every_report_of_its_kind(
        deep_cluster: tuple[ScanSettings, dict[str, Bookie]]) -> None:
    settings, _ = deep_cluster
    every, deep = documented_stats()
    assert "deep_copies_unverified" in deep and "potentially_faulty" in every  # the parsing found the lists
    shallow = ScrutinyRun(settings, LocalEngine()).execute()
    assert every - {s for s in every if s.startswith("deep_")} <= set(shallow.stats)
    # a deep slice of healthy ledgers only: nothing unverified, and still every deep stat is there
    healthy = ScrutinyRun(dataclasses.replace(settings, deep=True, ledgers=(3, 4)), LocalEngine()).execute()
    assert not healthy.violations and (every | deep) <= set(healthy.stats)
    assert healthy.stats["deep_copies_unverified"] == 0 and healthy.stats["deep_ledgers_verified"] == 2
    marks = check_marks(settings)
    assert {"underreplicated_marks", "marks_gone_before_reporting"} <= set(marks.stats)
