"""Whatever the history: a cluster of three live DbLedgerStorage bookies on a real ZooKeeper lives at random (ledgers
written, entry logs rolled over and compacted, ledgers deleted, bookies restarted) and loses data at random (entry
logs removed), while the bookies' agents are restarted, killed and started again, and an auditor (continuous mode
on) is restarted or killed and replaced. At each check, a full run through the long-lived agents equals one
through agents that never ran before, and a model of what each bookie holds; at the end the auditor's current
state, once its own full run has ended, equals the findings of a run by a process with no history."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.auditor import Auditor
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment
from scrutiny.report import Report
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import MetadataStore
from scrutiny.testing import store_on
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.localzk import LocalZooKeeper
from tests.support.helpers import wait_for

pytestmark = pytest.mark.slow
BOOKIES = [f"127.0.11.{n}:3181" for n in (1, 2, 3)]
ENTRIES = 12


def stored(lid: int, eid: int) -> bytes:
    return entrylog.package_entry(lid, eid, eid - 1, 0, b"h" * 16, "CRC32C")


@dataclass
class Bookie:
    """One live bookie: its indexes open, the entry log it writes, and what its disk holds (the model)."""

    bookie_id: str
    path: Path
    live: LiveBookie
    log: EntryLog
    next_log: int = 2
    logs: set[int] = field(default_factory=lambda: {1})  # entry logs in its directory
    where: dict[int, dict[int, int]] = field(default_factory=dict)  # ledger -> entry -> log, as indexed

    def roll(self) -> None:
        if self.log.log_id in self.logs:
            self.log.finish()
        self.log = EntryLog(self.path, self.next_log)
        self.logs.add(self.next_log)
        self.next_log += 1

    def held(self, ledger_id: int) -> set[int]:
        return {e for e, log in self.where.get(ledger_id, {}).items() if log in self.logs}


@dataclass
class Cluster:
    writer: ClusterWriter
    registry: MetadataStore
    bookies: dict[str, Bookie]
    agents: dict[str, BookieAgent]
    scan: ScanSettings
    tmp_path: Path

    def agent(self, b: str, scratch: str = "scratch", register: bool = True) -> BookieAgent:
        source = DbLedgerStorageSource([self.bookies[b].path], self.tmp_path / f"{scratch}-{b}")
        agent = BookieAgent(source, bind="127.0.0.1:0", watch_interval_seconds=0.2).start()
        if register:
            agent.register(self.registry, b, f"127.0.0.1:{agent.port}")
        return agent

    def full_run(self, agents: dict[str, BookieAgent] | None = None) -> Report:
        """A whole-cluster run through the registered agents (or these, named explicitly)."""
        scan = dataclasses.replace(self.scan, bookie_endpoints={b: f"127.0.0.1:{a.port}" for b, a in agents.items()}
                                   ) if agents else self.scan
        report = ScrutinyRun(scan, LocalEngine()).execute()
        assert report.complete, report.errors[:3]
        return report


@pytest.fixture
def cluster(zk_server: LocalZooKeeper, zk_client: KazooClient, zk_namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    root = f"{zk_namespace}/ledgers"
    uri = f"zk+hierarchical://{zk_server.hosts}{root}"
    writer = ClusterWriter(zk_client, root)
    writer.init_cluster()
    bookies = {}
    for b in BOOKIES:
        path = tmp_path / b.replace(":", "_")
        bookies[b] = Bookie(b, path, LiveBookie(path), EntryLog(path, 1))
        writer.register_bookie(BookieRegistration(b, False))
    scan = ScanSettings(metadata_service_uri=uri, engine="local", placement_policy="none", recheck_delay=0.2,
                        write_cache_grace_seconds=0, orphan_check=False)
    c = Cluster(writer, store_on(zk_client, uri), bookies, {}, scan, tmp_path)
    try:
        for b in BOOKIES:
            c.agents[b] = c.agent(b)
        yield c
    finally:
        for a in c.agents.values():
            a.stop(grace=0)
        for bookie in bookies.values():
            bookie.live.close()


def findings(report: Report) -> dict[tuple[str, int], tuple[str, ...]]:
    return {(str(v.category), v.ledger_id): v.bookies for v in report.violations}


def model(c: Cluster, ledgers: dict[int, LedgerMetadata]) -> dict[tuple[str, int], tuple[str, ...]]:
    """What a run must find: every entry of these E3 WQ3 AQ2 ledgers belongs on each bookie; its fewest copies
    decide the category, and every bookie lacking some copy is named."""
    out = {}
    for lid in ledgers:
        held = {b: bookie.held(lid) for b, bookie in c.bookies.items()}
        least = min(sum(e in h for h in held.values()) for e in range(ENTRIES))
        short = tuple(sorted(b for b, h in held.items() if len(h) < ENTRIES))
        category = ("NO_REPLICA_OF_AN_ENTRY" if least == 0 else "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY" if least < 2
                    else "LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY" if least < 3 else "")
        if category:
            out[(category, lid)] = short
    return out


@pytest.mark.parametrize("seed", range(3))
def test_any_history_of_agents_and_auditors_then_a_full_run_is_a_fresh_one(cluster: Cluster, seed: int) -> None:
    c, rng = cluster, random.Random(seed)
    ledgers: dict[int, LedgerMetadata] = {}
    down: set[str] = set()
    auditor: Auditor | None = None
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(c.tmp_path / "reports"),
                               full_interval_seconds=0, underreplication_interval_seconds=0,
                               continuous_batch_seconds=0.3, insecure_open_rescan=True)
    next_ledger, checks = 1, 0
    try:
        for step in range(70):
            op = rng.choice(["write", "write", "roll", "delete", "compact", "lose", "restart bookie",
                             "agent restart", "agent down", "agent up", "auditor", "check"])
            b = rng.choice(BOOKIES)
            bookie = c.bookies[b]
            if op == "write":
                lid, next_ledger = next_ledger, next_ledger + 1
                md = LedgerMetadata(lid, LedgerState.CLOSED, 3, 3, 2, ENTRIES - 1, 100 * ENTRIES,
                                    (Segment(0, tuple(BOOKIES)),))
                for x in c.bookies.values():
                    x.live.write(lid, {e: stored(lid, e) for e in range(ENTRIES)}, x.log)
                    x.where[lid] = dict.fromkeys(range(ENTRIES), x.log.log_id)
                    x.live.checkpoint()
                c.writer.write_ledgers([md])
                ledgers[lid] = md
            elif op == "roll":
                bookie.roll()
            elif op == "delete" and ledgers:
                lid = rng.choice(sorted(ledgers))
                c.writer.delete_ledger(lid)
                del ledgers[lid]
                for x in c.bookies.values():
                    x.live.delete(lid)
                    x.where.pop(lid, None)
            elif op == "compact":
                finished = sorted(bookie.logs - {bookie.log.log_id})
                if finished:
                    old = rng.choice(finished)
                    new = EntryLog(bookie.path, bookie.next_log)
                    bookie.next_log += 1
                    bookie.live.compact(bookie.path, old, new)
                    bookie.logs = (bookie.logs - {old}) | {new.log_id}
                    for entries in bookie.where.values():
                        for e, log in entries.items():
                            if log == old:
                                entries[e] = new.log_id
            elif op == "lose" and bookie.logs:
                gone = rng.choice(sorted(bookie.logs))
                entrylog.log_path(bookie.path, gone).unlink()
                bookie.logs.discard(gone)
                if gone == bookie.log.log_id:
                    bookie.roll()
            elif op == "restart bookie":
                bookie.live.close()
                bookie.live = LiveBookie(bookie.path)
                bookie.roll()
            elif op == "agent restart" and b not in down:
                c.agents.pop(b).stop(grace=0)
                c.agents[b] = c.agent(b)
            elif op == "agent down" and b not in down:
                c.agents.pop(b).stop(grace=0)
                down.add(b)
            elif op == "agent up" and b in down:
                c.agents[b] = c.agent(b)
                down.discard(b)
            elif op == "auditor":  # started, or stopped (cleanly or not: its last state kept or not) and replaced
                if auditor is not None:
                    auditor.stop()
                auditor = Auditor(c.scan, settings, engine=LocalEngine()).start()
            elif op == "check" and not down:
                long_lived = findings(c.full_run())
                fresh = {b: c.agent(b, f"fresh{step}", register=False) for b in BOOKIES}
                try:
                    assert findings(c.full_run(fresh)) == long_lived == model(c, ledgers), (seed, step)
                finally:
                    for a in fresh.values():
                        a.stop(grace=0)
                checks += 1
        for b in sorted(down):
            c.agents[b] = c.agent(b)
        want = model(c, ledgers)
        assert findings(c.full_run()) == want
        if auditor is None:
            auditor = Auditor(c.scan, settings, engine=LocalEngine()).start()
        wait_for(lambda: auditor is not None and auditor.leading.is_set(), 30)
        before = auditor.last.get("rescan")
        auditor.rescan(None, "")
        wait_for(lambda: auditor is not None and auditor.last.get("rescan") is not before, 60)
        now = {(str(f.violation.category), f.violation.ledger_id): f.violation.bookies
               for f in auditor.current.findings()}
        assert now == want, (seed, now, want)
        assert checks, "no check ran"
    finally:
        if auditor is not None:
            auditor.stop()

