"""Real losses on real bookies, found with the right ledger, entries and bookies, on every BookKeeper line: a
bookie's disk wiped and the bookie back (continuous scrutiny within its detection goal, and a full run); an entry
log file removed under a running bookie (either entry logger); an entry log removed while the bookie was stopped,
found whether its agent watched it go, was restarted after, or was down; a bookie back on an earlier instance's
directories while its agent was down; a byte flipped inside an entry of a real entry log (the deep scrub:
CORRUPT_ENTRY); a mark BookKeeper's own Auditor wrote, aged past the grace period."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scrutiny import entrylog
from scrutiny.auditor import Auditor
from scrutiny.changefeed import Kind
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.config import AuditorSettings
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.metadata import LedgerMetadata
from scrutiny.report import Report
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at
from scrutiny.testing.realbookkeeper import RealBookie, RealBookKeeper
from tests.real.conftest import Agents, findings, flushed, scan, scan_settings
from tests.support.helpers import wait_for

DETECTION_GOAL_SECONDS = 20.0  # continuous scrutiny's, per loss class (bench/results/continuous-1m.md)


def metadata(cluster: RealBookKeeper, ledger_ids: list[int]) -> dict[int, LedgerMetadata]:
    with store_at(cluster.uri) as store:
        out = {r.ledger_id: r.metadata for r in store.read_ledgers(ledger_ids)}
    assert all(md is not None for md in out.values())
    return out  # type: ignore[return-value]


def share(md: LedgerMetadata, bookie: str) -> list[int]:
    return Availability.of(expected_share(md, bookie)).entry_ids().tolist()


def source(agents: Agents, bookie: RealBookie) -> DbLedgerStorageSource:
    """The agent's source, caught up with its bookie (as an agent does at each call)."""
    s = agents.agents[bookie.bookie_id].source
    assert isinstance(s, DbLedgerStorageSource)
    s.refresh()
    return s


@pytest.fixture
def watched(bookkeeper: RealBookKeeper, agents: Agents, tmp_path: Path) -> Iterator[Auditor]:
    """Three bookies (the third on the direct-I/O entry logger), their agents, and an auditor watching them."""
    for b in [bookkeeper.add_bookie(), bookkeeper.add_bookie(),
              bookkeeper.add_bookie(dbStorage_directIOEntryLogger="true")]:
        agents.serve(b)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), full_interval_seconds=3600,
                               underreplication_interval_seconds=0, insecure_open_rescan=True,
                               continuous_batch_seconds=1.0)
    auditor = Auditor(scan_settings(bookkeeper), settings, engine=LocalEngine()).start()
    try:
        wait_for(lambda: "full" in auditor.last and auditor.last["full"].report is not None, 120)
        yield auditor
    finally:
        auditor.stop()


def test_a_wiped_bookie_back_is_found_at_once_and_by_every_full_run(bookkeeper: RealBookKeeper, agents: Agents,
                                                                    watched: Auditor) -> None:
    c = bookkeeper
    client = c.client()
    ledgers = [client.create(3, 2, 2, "CRC32C", entries=30)[0] for _ in range(4)]
    flushed(agents, ledgers)
    wiped = c.bookies[0]
    wiped.wipe()  # killed, its disks emptied, formatted (its data gone a moment before this returns)
    wiped.start()
    lost = time.monotonic()  # scrutiny's detection from here: the bookie's own start is not its latency (a loaded
    # machine stretched that to most of the goal); the next full run is an hour away, so any look here is continuous
    mds = metadata(c, ledgers)
    want = {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", lid) for lid in ledgers}

    def found_now() -> set[tuple[str, int]]:
        return {(str(f.violation.category), f.violation.ledger_id) for f in watched.current.findings()}

    wait_for(lambda: want <= found_now(), 60, lambda: detection_state(watched, agents, wiped))
    assert time.monotonic() - lost <= DETECTION_GOAL_SECONDS
    full = scan(c)
    assert findings(full) == want
    for v in full.violations:
        assert v.bookies == (wiped.bookie_id,)
        assert sum(r["entries"] for r in v.details["under_covered"]) == len(share(mds[v.ledger_id], wiped.bookie_id))


def detection_state(auditor: Auditor, agents: Agents, bookie: RealBookie) -> str:
    """What each part saw, for a detection that did not come in time: the auditor's findings, continuous
    scrutiny's feeds, figures and backlog, the last runs, and the changes the bookie's agent saw by kind."""
    c = auditor.continuous
    assert c is not None
    registry = agents.agents[bookie.bookie_id].servicer.metrics.registry
    seen = {str(k): registry.get_sample_value("scrutiny_agent_changes_total", {"kind": str(k)}) for k in Kind}
    found = sorted((str(f.violation.category), f.violation.ledger_id) for f in auditor.current.findings())
    runs = {kind: (t.run_id, t.finished_ms) for kind, t in auditor.last.items()}
    return (f"found {found}; continuous: feeds {dict(c.feeds)}, figures {dict(c.stats)}, {c.pending()} pending; "
            f"last runs {runs}; the agent of {bookie.bookie_id} saw {seen}, its watch looked {looks(agents, bookie)} "
            f"times (watching: {registry.get_sample_value('scrutiny_agent_watching')})")


def looks(agents: Agents, bookie: RealBookie) -> float:
    """How many looks the bookie's agent's watch made: a log made and removed between two looks is never listed."""
    registry = agents.agents[bookie.bookie_id].servicer.metrics.registry
    return registry.get_sample_value("scrutiny_agent_watch_seconds_count") or 0.0


def finished_log(bookie: RealBookie) -> tuple[int, Path]:
    """An entry log the bookie has finished (rolled over: its ledgers map written), not the one it writes."""
    current = bookie.ledger_dir / "current"
    for path in sorted(current.glob("*.log"), key=lambda p: int(p.stem, 16)):
        with path.open("rb") as f:
            if entrylog.ledgers_map_offset(f.read(entrylog.LOG_HEADER.size)) > 0:
                return int(path.stem, 16), path
    raise AssertionError(f"no finished entry log in {current}")


@pytest.mark.parametrize("which", [0, 2], ids=["default-entry-logger", "direct-io-entry-logger"])
def test_an_entry_log_removed_under_a_running_bookie(bookkeeper: RealBookKeeper, agents: Agents, watched: Auditor,
                                                     which: int) -> None:
    c = bookkeeper
    client = c.client()
    # 4 KiB entries, E3: every bookie holds every entry; a few MiB roll each bookie's entry log (logSizeLimit 4 MiB)
    ledgers = [client.create(3, 3, 2, "CRC32C", entries=400, size=4096)[0] for _ in range(5)]
    flushed(agents, ledgers)
    bookie = c.bookies[which]
    log_id, path = finished_log(bookie)
    where = {lid: [e for _, e, loc in source(agents, bookie).locations_of(lid) or []
                   if entrylog.split_location(loc)[0] == log_id] for lid in ledgers}
    hit = {lid for lid, entries in where.items() if entries}
    assert hit
    os.remove(path)
    want = {("LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY", lid) for lid in hit}

    def found_now() -> set[tuple[str, int]]:
        return {(str(f.violation.category), f.violation.ledger_id) for f in watched.current.findings()}

    removed, looked = time.monotonic(), looks(agents, bookie)
    wait_for(lambda: want <= found_now(), 60,
             lambda: f"{detection_state(watched, agents, bookie)}, {looked} of them before the removal")
    assert time.monotonic() - removed <= DETECTION_GOAL_SECONDS
    full = scan(c)
    assert findings(full) == want
    for v in full.violations:
        assert v.bookies == (bookie.bookie_id,)
        lacking = sum(r["entries"] for r in v.details["under_covered"])
        assert lacking == len(where[v.ledger_id])


def logs_of(agents: Agents, bookie: RealBookie, ledgers: list[int]) -> set[int]:
    """The entry logs the bookie's index places these ledgers' entries in."""
    return {entrylog.split_location(loc)[0] for lid in ledgers for _, _, loc in
            source(agents, bookie).locations_of(lid) or []}


def in_log(agents: Agents, bookie: RealBookie, ledgers: list[int], log_id: int) -> dict[int, int]:
    """How many entries of each ledger the bookie's index places in the entry log (those with any)."""
    where = {lid: sum(1 for _, _, loc in source(agents, bookie).locations_of(lid) or []
                      if entrylog.split_location(loc)[0] == log_id) for lid in ledgers}
    return {lid: n for lid, n in where.items() if n}


def lacking(report: Report) -> dict[int, int]:
    """The entries each finding's ledger lacks copies of."""
    return {v.ledger_id: sum(r["entries"] for r in v.details["under_covered"]) for v in report.violations}


def test_a_full_run_finds_a_removed_entry_log_whatever_its_agent_saw(bookkeeper: RealBookKeeper,
                                                                    agents: Agents) -> None:
    """As an operator meets it: a bookie stopped, an entry log of its removed, the bookie started again; a full run
    finds the copies gone, and again after the bookie's agent is restarted (the same command line, the same scratch
    directory). Then another log removed while the agent is down: the agent started again finds both."""
    c = bookkeeper
    bookies = agents.bookies(3)
    client = c.client()
    # 4 KiB entries, E3: every bookie holds every entry; a few MiB roll each bookie's entry log (logSizeLimit 4 MiB)
    ledgers = [client.create(3, 3, 2, "CRC32C", entries=400, size=4096)[0] for _ in range(5)]
    flushed(agents, ledgers)
    bookie = bookies[0]
    first, path = finished_log(bookie)
    gone = in_log(agents, bookie, ledgers, first)
    assert gone
    bookie.stop()
    os.remove(path)
    bookie.start()
    full = scan(c)
    assert findings(full) == {("LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY", lid) for lid in gone}
    assert lacking(full) == gone and all(v.bookies == (bookie.bookie_id,) for v in full.violations)
    agents.stop(bookie)
    agents.serve(bookie)  # restarted: nothing of what it saw before
    again = scan(c)
    assert findings(again) == findings(full) and lacking(again) == gone

    second = min(log_id for log_id in logs_of(agents, bookie, ledgers) if log_id != first)  # not the one written
    path = entrylog.log_path(bookie.ledger_dir, second)
    more = in_log(agents, bookie, ledgers, second)
    assert more
    agents.stop(bookie)
    bookie.stop()
    os.remove(path)  # while the agent is down
    bookie.start()
    agents.serve(bookie)
    both = scan(c)
    want = {lid: gone.get(lid, 0) + more.get(lid, 0) for lid in {*gone, *more}}
    assert lacking(both) == want and {str(v.category) for v in both.violations} == {
        "LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY"}


def test_a_bookie_back_on_an_earlier_instances_directories_while_its_agent_was_down(
        bookkeeper: RealBookKeeper, agents: Agents, tmp_path: Path) -> None:
    """A bookie's directories (journal and ledgers) swapped for a copy of an earlier instance's (a disk restored
    from a backup) while the bookie and its agent are down: the bookie starts on them, its cookie the same, holding
    nothing written since; the agent started again answers from them, and a full run finds every copy it lost."""
    c = bookkeeper
    bookies = agents.bookies(3)
    client = c.client()
    early = [client.create(3, 3, 2, "CRC32C", entries=20)[0] for _ in range(3)]
    flushed(agents, early)
    bookie = bookies[0]
    bookie.stop()
    shutil.copytree(bookie.base, tmp_path / "backup")
    bookie.start()
    client = c.client()  # one that knows the bookie is back
    late = [client.create(3, 3, 2, "CRC32C", entries=20)[0] for _ in range(3)]
    flushed(agents, late)
    assert findings(scan(c)) == set()
    agents.stop(bookie)
    bookie.stop()
    shutil.rmtree(bookie.base)
    shutil.copytree(tmp_path / "backup", bookie.base)
    bookie.start()
    agents.serve(bookie)
    full = scan(c)
    assert findings(full) == {("LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY", lid) for lid in late}
    assert lacking(full) == dict.fromkeys(late, 20) and all(v.bookies == (bookie.bookie_id,) for v in full.violations)
    assert not set(early) & {v.ledger_id for v in full.violations}


@pytest.mark.parametrize("which", [0, 2], ids=["default-entry-logger", "direct-io-entry-logger"])
def test_a_byte_flipped_in_a_real_entry_log_is_a_corrupt_entry(bookkeeper: RealBookKeeper, agents: Agents,
                                                              which: int) -> None:
    c = bookkeeper
    for _ in range(3):
        agents.serve(c.add_bookie(**({"dbStorage_directIOEntryLogger": "true"} if _ == 2 else {})))
    client = c.client()
    ledger, _ = client.create(3, 3, 2, "CRC32C", entries=20, size=500)
    flushed(agents, [ledger])
    bookie = c.bookies[which]
    location = next(loc for _, e, loc in source(agents, bookie).locations_of(ledger) or [] if e == 7)
    log_id, pos = entrylog.split_location(location)
    path = entrylog.log_path(bookie.ledger_dir, log_id)
    with path.open("r+b") as f:  # a bit flipped in the payload (past the 32 header bytes and the 4 of CRC32C)
        f.seek(pos + 32 + 4 + 100)
        byte = f.read(1)
        f.seek(pos + 32 + 4 + 100)
        f.write(bytes([byte[0] ^ 0x01]))
    assert findings(scan(c)) == set()  # the index still lists the copy: only its bytes can tell
    deep = scan(c, deep=True)
    assert findings(deep) == {("CORRUPT_ENTRY", ledger), ("LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY", ledger)}
    corrupt = next(v for v in deep.violations if str(v.category) == "CORRUPT_ENTRY")
    assert corrupt.bookies == (bookie.bookie_id,)
    copy = corrupt.details["copies"][bookie.bookie_id]
    assert (copy["entries"], copy["reasons"]) == ([[7, 7]], {"bad-digest": 1})


def test_a_mark_bookkeepers_auditor_wrote_is_aged_past_the_grace(bookkeeper: RealBookKeeper, agents: Agents) -> None:
    """Three bookies, ledgers on all three; one lost: BookKeeper's Auditor marks its ledgers, and its worker finds no
    fourth bookie to copy them to. The marks, as BookKeeper writes them, read by scrutiny."""
    c = bookkeeper
    bookies = agents.bookies(3)
    client = c.client()
    ledgers = [client.create(3, 2, 2, "CRC32C", entries=10)[0] for _ in range(3)]
    flushed(agents, ledgers)
    c.autorecovery(percentage=0)
    lost = bookies[2]
    agents.stop(lost)
    lost.kill()
    with store_at(c.uri) as store:
        wait_for(lambda: store.marked(ledgers) == set(ledgers), 120, lambda: f"see {c.workdir}")
        marks, problems = store.underreplication_marks()
    assert problems == [] and {lid: m.replicas for lid, m in marks.items()} == {lid: (lost.bookie_id,) for lid in
                                                                               ledgers}
    assert all(m.ctime and abs(m.ctime / 1000 - time.time()) < 120 for m in marks.values())
    time.sleep(1.5)
    report = scan(c, underreplicated_grace_period=1)
    assert findings(report) == {("UNDERREPLICATED_ELAPSED_GRACE_PERIOD", lid) for lid in ledgers}
    assert report.ledgers["skipped_underreplicated"] == len(ledgers)
