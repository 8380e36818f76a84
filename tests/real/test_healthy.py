"""A healthy real cluster raises nothing while it does what clusters do, on every BookKeeper line: real bookies on
DbLedgerStorage (one with the direct-I/O entry logger) written by BookKeeper's own client (every digest type,
every shape of ensemble and quorum, Pulsar's custom metadata), a bookie killed mid-write (an ensemble change), an
open ledger recovered and fenced by a second client, a bookie restarted, ledgers deleted and the bookies' garbage
collection and compaction at work, a bookie lost for good and re-replicated by a real AutoRecovery. Meanwhile an
auditor watches (continuous scrutiny, with the agents' feeds); afterwards a full run and a deep run: nothing, at
any time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scrutiny.auditor import Auditor
from scrutiny.config import AuditorSettings
from scrutiny.metadata import LedgerMetadata
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_at
from scrutiny.testing.realbookkeeper import RealBookie, RealBookKeeper, RealBookKeeperError
from tests.real.conftest import Agents, findings, flushed, scan, scan_settings
from tests.support.helpers import wait_for

SHAPES = [(3, 3, 2), (3, 2, 2), (4, 2, 2), (2, 2, 2), (4, 3, 2)]  # ensemble, write quorum, ack quorum
DIGESTS = ["CRC32", "CRC32C", "MAC", "DUMMY"]
PULSAR = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": "public/real/persistent/t"}


def metadata(cluster: RealBookKeeper, ledger_ids: list[int]) -> dict[int, LedgerMetadata | None]:
    with store_at(cluster.uri) as store:
        return {r.ledger_id: r.metadata for r in store.read_ledgers(ledger_ids)}


def held(agents: Agents, bookie: RealBookie) -> set[int]:
    ids, _ = agents.agents[bookie.bookie_id].source.list_ledgers(0, 1_000_000)  # type: ignore[attr-defined]
    return set(ids.tolist())


def logs_of(agents: Agents, bookie: RealBookie, ledger_id: int) -> set[int]:
    """The entry logs the bookie's index places the ledger's entries in."""
    source = agents.agents[bookie.bookie_id].source
    source.refresh()
    return {loc >> 32 for _, _, loc in source.locations_of(ledger_id) or []}  # type: ignore[attr-defined]


def watched(agents: Agents, bookie: RealBookie) -> tuple[float, float]:
    """How many ledgers the bookie's agent saw leave its `ledgers` index, and how often it read every key of it."""
    registry = agents.agents[bookie.bookie_id].servicer.metrics.registry
    return (registry.get_sample_value("scrutiny_agent_changes_total", {"kind": "LEDGERS_GONE"}) or 0.0,
            registry.get_sample_value("scrutiny_agent_index_passes_total") or 0.0)


def test_a_healthy_cluster_raises_nothing_while_it_lives(bookkeeper: RealBookKeeper, agents: Agents,
                                                         tmp_path: Path) -> None:
    c = bookkeeper
    # compaction on (a log less than 80% alive is compacted), run when asked for through the bookie's admin endpoint
    # rather than on its timers (which a loaded machine stretches past any wait)
    compacting = {"minorCompactionInterval": 1800, "majorCompactionInterval": 3600, "majorCompactionThreshold": 0.8}
    bookies = ([c.add_bookie(admin=True, **compacting) for _ in range(4)]
               + [c.add_bookie(admin=True, dbStorage_directIOEntryLogger="true", **compacting)])
    for b in bookies:
        agents.serve(b)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(tmp_path / "reports"), full_interval_seconds=3600,
                               underreplication_interval_seconds=0, insecure_open_rescan=True,
                               continuous_batch_seconds=1.0)
    auditor = Auditor(scan_settings(c), settings, engine=LocalEngine()).start()
    client = c.client()
    try:
        wait_for(lambda: "full" in auditor.last and auditor.last["full"].report is not None, 120)
        written = [client.create(e, wq, aq, digest, entries=30 + i, size=200,
                                 metadata=PULSAR if digest == "CRC32C" else None)[0]
                   for i, (e, wq, aq) in enumerate(SHAPES) for digest in DIGESTS]

        # a bookie killed mid-write: the client replaces it (an ensemble change); it comes back with its share
        changed = client.open(3, 2, 2)
        client.add(changed, 20)
        md = metadata(c, [changed])[changed]
        assert md is not None
        victim = next(b for b in bookies if b.bookie_id == md.segments[0].ensemble[1])
        # (its write cache flushed first: a bookie killed within flushInterval of an add holds that entry in its
        # journal only until it restarts, and is rightly reported short while it is down; tests/real/test_losses)
        flushed(agents, [changed], added={changed: 19})
        victim.kill()
        client.add(changed, 20)
        assert client.close_ledger(changed) == 39
        victim.start()
        md = metadata(c, [changed])[changed]
        assert md is not None and len(md.segments) == 2 and victim.bookie_id not in md.segments[1].ensemble
        written.append(changed)

        # an open ledger recovered by a second client: the writer is fenced
        fenced = client.open(3, 2, 2, metadata=PULSAR)
        client.add(fenced, 15)
        assert client.recover(fenced) == 14
        with pytest.raises(RealBookKeeperError):
            client.add(fenced, 1)
        written.append(fenced)

        # a bookie restarted (what it had in its write cache flushed at the stop)
        bookies[0].stop()
        bookies[0].start()

        # ledgers deleted: each bookie's garbage collector drops them, and compaction moves what stays
        # (the one that stays first: the 6 MB after it fill its entry log, which is then rotated and compactable,
        # wherever the logs stood; the active log is never compacted)
        big = [client.create(3, 3, 2, "CRC32C", entries=300, size=4096)[0] for _ in range(6)]
        kept, deleted = big[0], big[1:]
        flushed(agents, big)
        logs_before = {b.bookie_id: logs_of(agents, b, kept) for b in bookies if logs_of(agents, b, kept)}
        # (the bookies never restarted: their index's write-ahead log never rotated)
        steady = [b for b in bookies[1:] if b is not victim and held(agents, b) & set(deleted)]
        for lid in deleted:
            client.delete(lid)
        for b in bookies:  # each bookie's garbage collector drops them, and compacts
            b.force_gc()
        wait_for(lambda: not any(held(agents, b) & set(deleted) for b in bookies), 120)
        # their agents saw them go in the index's write-ahead log, reading no key again after taking stock (a real
        # bookie's WAL, as rocksdbjni writes it)
        assert steady
        wait_for(lambda: all(watched(agents, b)[0] > 0 for b in steady), 30, lambda: {
            b.bookie_id: watched(agents, b) for b in steady})
        assert {b.bookie_id: watched(agents, b)[1] for b in steady} == {b.bookie_id: 1.0 for b in steady}
        # compaction: the entries that stay are copied out of the logs mostly deleted, and those logs removed
        assert any(logs_of(agents, b, kept) != logs_before[b.bookie_id] for b in bookies
                   if b.bookie_id in logs_before), f"no compaction; see {c.workdir}"
        written.append(kept)

        # a bookie lost for good: AutoRecovery's Auditor marks its ledgers, its worker copies them to the others
        # (a bookie added first: an ensemble of 4 needs a fifth bookie outside it)
        agents.serve(c.add_bookie())
        c.autorecovery(percentage=0)
        lost = bookies[3]
        flushed(agents, written)  # its write cache flushed
        agents.stop(lost)
        lost.kill()

        def re_replicated() -> bool:
            with store_at(c.uri) as store:
                marks, _ = store.underreplication_marks()
                mds = [r.metadata for r in store.read_ledgers(written)]
            return not marks and all(m is not None and lost.bookie_id not in m.bookies for m in mds)

        wait_for(re_replicated, 240, lambda: f"for AutoRecovery; see {c.workdir}")
        flushed(agents, written)  # the last copies flushed
        time.sleep(2)  # the feeds' last looks: a false alarm would show

        # what scrutiny says, a run at a time and watching all along
        full = scan(c)
        assert findings(full) == set() and full.ledgers["checked"] == len(written)
        deep = scan(c, deep=True)
        assert findings(deep) == set()
        assert deep.stats["deep_entries_verified"] > 0 and deep.stats["deep_entries_corrupt"] == 0
        assert auditor.current.findings() == [] and auditor.current.resolved() == [], \
            [c.to_json() for c in auditor.current.findings()] + [r.to_json() for r in auditor.current.resolved()]
        assert auditor.continuous is not None and auditor.continuous.stats["ledgers_checked"] > 0
    finally:
        auditor.stop()
