"""A churn soak: a real ZooKeeper, live agents whose holdings change while they serve, and a cluster
that only ever does what BookKeeper does, in BookKeeper's order, racing with back-to-back scans:

- create: the metadata znode OPEN, the entries onto the write quorums, then the znode CLOSED;
- delete: the metadata znode first, the bookies' copies garbage-collected later;
- re-replicate away from a live bookie: under-replication mark, copy to the new bookie, ensemble
  update, unmark, the old copy collected later;
- restart an agent, or a whole bookie (registration gone and back), for less than the re-check delay,
  one at a time, never the same bookie twice within `RESTART_SPACING` seconds (longer than a run's looks
  take: two separate restarts of one bookie, each hitting one look, are a flapping bookie, which the
  scan reports by design);
- garbage-collect as the bookie does: a deleted ledger's copies, and an over-replicated copy only while
  the bookie is still outside the ledger's current ensemble.

Churn is aimed at the moments where false alarms hide: right after a first pass, during the delayed
re-check (an agent goes down just as the re-check asks), and right before the re-read that precedes
reporting. Every run must report nothing; at the end, with the churn stopped, the injected faults (a
bookie's lost copy, an orphan left by a garbage collector that never runs, adds taken past a close) must be
found, and nothing else.

    python -m scrutiny.testing.churn --seconds 600     # make soak
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kazoo.client import KazooClient

from scrutiny import codec
from scrutiny.agent import BookieAgent
from scrutiny.auditor.continuous import Continuous
from scrutiny.auditor.currentstate import CurrentState
from scrutiny.changefeed import Change, Kind
from scrutiny.checks import expected_share
from scrutiny.codec import Availability
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.entrysources import Holding
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment, UnderreplicationMark
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import Engine, LocalEngine, Progress
from scrutiny.scan.work import Pass, RangeResult, RunContext
from scrutiny.store import LedgerRange, open_store
from scrutiny.testing import store_for
from scrutiny.testing.clusterwriter import ClusterWriter

log = logging.getLogger(__name__)
RESTART_SPACING = 12.0
# The run statistics that say a guarded moment was hit (a false alarm would have hidden there).
MOMENTS = ("lost_bookies", "potentially_faulty", "rechecked_again", "reanalyzed_after_metadata_change",
           "dropped_marked_during_run",
           "deleted_during_run", "relooked_after_registration_change", "left_unsettled_after_rechecks",
           "marks_gone_before_reporting", "ledgers_with_residue_past_the_close", "orphan_candidates")
ORPHAN_GRACE = 5  # seconds: longer than the churn's garbage collection takes (at most 3 re-check delays)
LOST_BOOKIE_GRACE = 2  # seconds: longer than a restart or a session renewal keeps a bookie unregistered
RENEWAL_HELD_MOST = LOST_BOOKIE_GRACE / 2  # a renewal held over a run's first pass ends by then at the latest


class MutableHoldings:
    """A bookie's holdings that change while its agent serves them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ledgers: dict[int, np.ndarray] = {}
        self._gone: list[int] = []  # dropped since the last look (`changes`)
        self._wiped = False

    def put(self, ledger_id: int, entry_ids: np.ndarray) -> None:
        with self._lock:
            old = self._ledgers.get(ledger_id)
            self._ledgers[ledger_id] = entry_ids if old is None else np.union1d(old, entry_ids)

    def drop(self, ledger_id: int) -> None:
        with self._lock:
            if self._ledgers.pop(ledger_id, None) is not None:
                self._gone.append(ledger_id)

    def wipe(self) -> None:
        """The bookie back empty (a disk replaced, the bookie formatted again under its id): what a
        DbLedgerStorage agent sees of its index emptied, every ledger it held gone and a reset."""
        with self._lock:
            self._gone = sorted({*self._gone, *self._ledgers})
            self._ledgers.clear()
            self._wiped = True

    def changes(self, ledgers_too: bool = True) -> tuple[list[Change], int]:
        """What a DbLedgerStorage agent would see since the last look: the drops (LEDGERS_GONE), a wipe
        (BOOKIE_RESET); nothing without `ledgers_too` (nobody follows: what happened meanwhile is forgotten)."""
        with self._lock:
            gone, self._gone = sorted(self._gone) if ledgers_too else [], []
            wiped, self._wiped = self._wiped and ledgers_too, False
        found = [Change(Kind.BOOKIE_RESET, detail="back empty", every_ledger=True)] if wiped else []
        return found + ([Change(Kind.LEDGERS_GONE, tuple(gone), "dropped")] if gone else []), len(gone)

    def refresh(self) -> None:
        pass

    def availability(self, ledger_id: int) -> Holding | None:
        with self._lock:
            ids = self._ledgers.get(ledger_id)
        return None if ids is None else Holding(codec.encode(ids))

    def list_ledgers(self, from_id: int, limit: int) -> tuple[np.ndarray, bool]:
        with self._lock:
            ids = sorted(lid for lid in self._ledgers if lid >= from_id)
        return np.array(ids[:limit], dtype=np.int64), len(ids) <= limit

    def close(self) -> None:
        pass


def share(md: LedgerMetadata, bookie: str) -> np.ndarray:
    return Availability.of(expected_share(md, bookie)).entry_ids()


@dataclass
class ChurnCluster:
    client: Any  # the cluster's writer: a KazooClient, or an EtcdTree
    root: str
    uri: str
    bookies: list[str]
    recheck_delay: float
    rng: random.Random
    holdings: dict[str, MutableHoldings] = field(default_factory=dict)
    agents: dict[str, BookieAgent] = field(default_factory=dict)
    closed: dict[int, LedgerMetadata] = field(default_factory=dict)
    ops: Counter = field(default_factory=lambda: Counter())
    next_id: int = 1
    frozen: set[int] = field(default_factory=set)  # ledgers the churn leaves alone (the fault's)

    def __post_init__(self) -> None:
        self.writer = ClusterWriter(self.client, self.root)
        self.writer.init_cluster()
        self._resources = contextlib.ExitStack()
        self.store = self._resources.enter_context(store_for(self.client, self.uri))
        self._lock = threading.RLock()
        self._down_until = 0.0  # one restart at a time
        self._restarted: dict[str, float] = {}
        self._renewals: dict[str, Callable[[], None]] = {}  # sessions being renewed: how each ends
        # Until a run has seen a bookie renew its session, only renewals: other restarts would keep every
        # bookie within RESTART_SPACING of its last one, and no renewal could start.
        self.renewal_wanted = False
        self._timers: list[threading.Timer] = []
        self._quiet = threading.Event()
        self._stepping = threading.Lock()
        for b in self.bookies:
            self.holdings[b] = MutableHoldings()
            self.writer.register_bookie(BookieRegistration(b, False))
            self._start_agent(b)

    # -- agents and bookies --------------------------------------------------------------------

    def _start_agent(self, bookie: str) -> None:
        agent = BookieAgent(self.holdings[bookie], bind="127.0.0.1:0", workers=4, watch_interval_seconds=0.3).start()
        agent.register(self.store, bookie, f"127.0.0.1:{agent.port}")
        self.agents[bookie] = agent

    def _later(self, seconds: float, fn: Callable[[], None]) -> None:
        t = threading.Timer(seconds, fn)
        t.daemon, t.name = True, "churn-timer"
        t.start()
        self._timers = [old for old in self._timers if old.is_alive()]  # a long soak keeps only the pending
        self._timers.append(t)

    def restart(self, whole_bookie: bool = False, session_only: bool = False, held: bool = False) -> str | None:
        """An agent (or the whole bookie: registration too; or only the bookie's registration, its ZooKeeper
        session expired and renewed while it and its agent go on) down for less than the re-check delay;
        one at a time, never the same bookie twice within RESTART_SPACING. A renewal `held` lasts until
        `end_renewals` (a run's first pass is over), RENEWAL_HELD_MOST at most: that run sees it, whatever
        the machine's load made its start take."""
        now = time.monotonic()
        with self._lock:
            if now < self._down_until or (self.renewal_wanted and not session_only):
                return None
            choices = [b for b in self.bookies if now - self._restarted.get(b, -1e9) > RESTART_SPACING]
            if not choices:
                return None
            bookie = self.rng.choice(choices)
            down = RENEWAL_HELD_MOST if held else self.recheck_delay * self.rng.uniform(0.2, 0.6)
            self._down_until = now + down + 0.05
            self._restarted[bookie] = now
            if not session_only:
                self.agents.pop(bookie).stop(grace=0)
            if whole_bookie or session_only:
                self.writer.unregister_bookie(bookie)
        self.ops["session_expiry" if session_only else "restart_bookie" if whole_bookie else "restart_agent"] += 1

        def back() -> None:
            with self._lock:
                if session_only and self._renewals.pop(bookie, None) is None:
                    return  # ended already
                if whole_bookie or session_only:
                    self.writer.register_bookie(BookieRegistration(bookie, False))
                if not session_only:
                    self._start_agent(bookie)

        if session_only:
            with self._lock:
                self._renewals[bookie] = back
        self._later(down, back)
        return bookie

    def end_renewals(self) -> None:
        """The sessions being renewed are renewed now, their bookies registered again."""
        with self._lock:
            ending = list(self._renewals.values())
        for back in ending:
            back()
        with self._lock:
            if not self._renewals:
                self._down_until = min(self._down_until, time.monotonic())

    # -- ledgers -------------------------------------------------------------------------------

    def create(self, past_the_close: int = 0) -> int:
        """A ledger written and closed; with `past_the_close`, entries written beyond its close: the residue
        of a recovery (1: the entry after the close on one bookie; 2: and the next one on both bookies of its
        write set, in flight at the fence and never acknowledged), or (3) adds a replaced bookie took after
        the close, on every bookie of their write sets (a fault: ENTRIES_PAST_THE_CLOSE)."""
        with self._lock:
            lid, self.next_id = self.next_id, self.next_id + 1
        ens = tuple(self.rng.sample(self.bookies, 3))
        last = self.rng.randint(10, 200)
        opened = LedgerMetadata(lid, LedgerState.OPEN, 3, 2, 2, -1, 0, (Segment(0, ens),))
        self.writer.write_ledgers([opened])
        closed = dataclasses.replace(opened, state=LedgerState.CLOSED, last_entry_id=last, length=(last + 1) * 100)
        beyond = dataclasses.replace(closed, last_entry_id=last + 5)  # as the writer went on
        for b in ens:
            held = share(closed, b)
            extra = share(beyond, b)
            extra = extra[extra > last]
            if past_the_close == 1 or past_the_close == 2:
                extra = extra[:1] if b == ens[(last + 1) % 3] else np.empty(0, np.int64)
                if past_the_close == 2:
                    extra = np.union1d(extra, [last + 2] if (ens.index(b) - last - 2) % 3 < 2 else [])
            if past_the_close:
                held = np.union1d(held, extra).astype(np.int64)
            self.holdings[b].put(lid, held)
        self.writer.update_ledger(closed)
        with self._lock:
            self.closed[lid] = closed
        self.ops["create" if not past_the_close else "recover_with_residue"] += 1
        return lid

    def _pick(self) -> LedgerMetadata | None:
        with self._lock:
            ids = [lid for lid in self.closed if lid not in self.frozen]
            return self.closed[self.rng.choice(ids)] if ids else None

    def delete(self) -> None:
        with self._lock:
            md = self._pick()
            if md is None:
                return
            del self.closed[md.ledger_id]
            self.writer.delete_ledger(md.ledger_id)
        self._later(self.recheck_delay * self.rng.uniform(0.1, 3.0), lambda: self._collect(md.ledger_id, md.bookies))
        self.ops["delete"] += 1

    def rereplicate(self) -> None:
        # Under the lock from mark to unmark: BookKeeper's over-replication GC skips a ledger that is
        # being re-replicated, so it can never collect the copy just made.
        with self._lock:
            md = self._pick()
            if md is None:
                return
            ens = md.segments[0].ensemble
            source = self.rng.choice(ens)
            target = self.rng.choice([b for b in self.bookies if b not in ens])
            self.writer.mark_underreplicated(UnderreplicationMark(md.ledger_id, (source,), int(time.time() * 1000)))
            self.holdings[target].put(md.ledger_id, share(md, source))
            moved = dataclasses.replace(md, segments=(Segment(0, tuple(target if b == source else b for b in ens)),))
            self.writer.update_ledger(moved)
            self.closed[md.ledger_id] = moved
            self.writer.unmark_underreplicated(md.ledger_id)
        self._later(self.recheck_delay * self.rng.uniform(0.1, 3.0), lambda: self._collect(md.ledger_id, {source}))
        self.ops["rereplicate"] += 1

    def _collect(self, ledger_id: int, bookies: set[str] | frozenset[str]) -> None:
        """The bookies' garbage collector: a copy goes unless the ledger (still) names the bookie."""
        with self._lock:
            current = self.closed.get(ledger_id)
            keep = current.bookies if current is not None else frozenset()
            for b in set(bookies) - keep:
                self.holdings[b].drop(ledger_id)

    @contextlib.contextmanager
    def quiet(self, timeout: float = 5.0) -> Iterator[None]:
        """No churn for the block, which starts once what is under way has ended (restarted bookies back,
        copies collected): a moment to measure the auditor without the cluster's own comings and goings."""
        self._quiet.set()
        try:
            with self._stepping:  # the step under way ends first
                pass
            deadline = time.monotonic() + timeout
            for t in list(self._timers):
                t.join(max(0.0, deadline - time.monotonic()))
            yield
        finally:
            self._quiet.clear()

    def step(self) -> None:
        with self._stepping:
            if not self._quiet.is_set():
                self._step()

    def _step(self) -> None:
        op = self.rng.random()
        if op < 0.30 or len(self.closed) < 20:
            self.create()
        elif op < 0.35:
            self.create(past_the_close=self.rng.choice((1, 2)))
        elif op < 0.55:
            self.delete()
        elif op < 0.85:
            self.rereplicate()
        else:
            self.restart(whole_bookie=op > 0.95, session_only=0.92 < op <= 0.95)

    def inject_faults(self) -> set[tuple[str, int]]:
        """A bookie loses its copy of one ledger (nobody repairs it): LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY; a
        ledger deleted whose copies the bookies never collect: ORPHAN_LEDGER once sighted for the grace
        period; adds a replaced bookie took after a close: ENTRIES_PAST_THE_CLOSE; a bookie whose
        registration goes for good (its disk, and agent, still there) and whose ledgers nobody marks:
        LOST_BOOKIE_RECOVERY_NOT_STARTED for each."""
        with self._lock:
            lost, orphaned = sorted(self.closed)[:2]
            self.frozen |= {lost, orphaned}
            md = self.closed[lost]
            del self.closed[orphaned]
        self.holdings[md.segments[0].ensemble[0]].drop(lost)
        self.writer.delete_ledger(orphaned)  # and no garbage collection
        past = self.create(past_the_close=3)
        self.frozen.add(past)
        gone = self.bookies[-1]
        self.writer.unregister_bookie(gone)
        with self._lock:
            unhandled = {("LOST_BOOKIE_RECOVERY_NOT_STARTED", lid) for lid, m in self.closed.items()
                         if gone in m.bookies}
        return {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", lost), ("ORPHAN_LEDGER", orphaned),
                ("ENTRIES_PAST_THE_CLOSE", past)} | unhandled

    def close(self) -> None:
        for t in self._timers:
            t.cancel()
        with self._lock:
            for a in self.agents.values():
                a.stop(grace=0)
            self.agents.clear()
        self._resources.close()


class AimedEngine:
    """An engine that churns the cluster at the moments where false alarms hide."""

    def __init__(self, inner: Engine, cluster: ChurnCluster) -> None:
        self.inner, self.cluster = inner, cluster

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Progress | None = None) -> Iterator[RangeResult]:
        results = list(self.inner.map_ranges(ctx, ranges, mode, progress))
        c = self.cluster
        c.end_renewals()
        # right after a pass, before the re-check or the re-read: move, delete, restart
        for _ in range(3):
            c.rereplicate()
            c.delete()
        c.restart(whole_bookie=c.rng.random() < 0.5)
        return iter(results)

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()


def aimed_sleep(cluster: ChurnCluster) -> Callable[[float], None]:
    """The run's delay before a re-check: an agent goes down just as the re-check is about to ask."""

    def sleep(seconds: float) -> None:
        time.sleep(seconds * 0.8)
        cluster.restart(whole_bookie=cluster.rng.random() < 0.3)
        time.sleep(seconds * 0.2)

    return sleep


@dataclass
class SoakResult:
    runs: int = 0
    runs_by_engine: Counter = field(default_factory=lambda: Counter())
    seconds: float = 0.0
    operations: Counter = field(default_factory=lambda: Counter())
    false_alarms: list[dict[str, Any]] = field(default_factory=list)
    incomplete_runs: int = 0
    moments: Counter = field(default_factory=lambda: Counter())  # how often the churn hit each guarded moment
    faults: list[str] = field(default_factory=list)
    fault_found: bool = False
    fault_report_extra: list[str] = field(default_factory=list)
    # continuous scrutiny beside the runs (its own current state): what it reported during the churn (false
    # alarms), whether it found the injected faults it can see by itself, and what the last full run found
    # that it had not (missed)
    continuous_false_alarms: list[dict[str, Any]] = field(default_factory=list)
    continuous_expected: list[str] = field(default_factory=list)
    continuous_found: bool = False
    continuous_missed: int = 0
    continuous_stats: dict[str, int] = field(default_factory=dict)

    @property
    def ops_per_minute(self) -> float:
        return sum(self.operations.values()) / max(self.seconds, 1e-9) * 60

    def summary(self) -> dict[str, Any]:
        return {"runs": self.runs, "runs_by_engine": dict(self.runs_by_engine), "seconds": round(self.seconds, 1),
                "operations": dict(self.operations), "operations_per_minute": round(self.ops_per_minute),
                "false_alarms": len(self.false_alarms), "incomplete_runs": self.incomplete_runs,
                "moments": dict(self.moments), "faults": self.faults,
                "fault_found": self.fault_found, "fault_report_extra": self.fault_report_extra,
                "continuous_false_alarms": len(self.continuous_false_alarms),
                "continuous_expected": self.continuous_expected, "continuous_found": self.continuous_found,
                "continuous_missed": self.continuous_missed, "continuous_stats": self.continuous_stats}


def soak(client: Any, root: str, uri: str, seconds: float, engines: dict[str, Engine], seed: int = 1,
         recheck_delay: float = 0.5, bookies: int = 6) -> SoakResult:
    """Back-to-back scans on each engine in turn while the cluster churns; then the injected fault. `client`
    writes the cluster (a KazooClient, or an EtcdTree for Pulsar's layout on etcd) that `uri` names."""
    cluster = ChurnCluster(client, root, uri, [f"127.0.4.{n}:3181" for n in range(1, bookies + 1)], recheck_delay,
                           random.Random(seed))
    settings = ScanSettings(metadata_service_uri=uri, placement_policy="none", recheck_delay=recheck_delay,
                            underreplicated_grace_period=1, bookie_deadline_seconds=2.0, zk_session_timeout=10,
                            etcd_lease_ttl=10, orphan_grace_period=ORPHAN_GRACE,
                            # a bookie restarting, or renewing its session, is unregistered for less than this
                            lost_bookie_grace_period=LOST_BOOKIE_GRACE, lost_bookie_recovery_delay=0)
    result = SoakResult()
    for _ in range(40):
        cluster.create()
    stop = threading.Event()

    def churn() -> None:
        while not stop.wait(0.02):
            try:
                cluster.step()
            except Exception:  # the soak's own churn must not die silently
                log.exception("churn step failed")

    churner = threading.Thread(target=churn, name="churn", daemon=True)
    state = CurrentState()
    watcher = Continuous(settings, AuditorSettings(continuous_batch_seconds=0.3), state, lambda why: None)
    watched = open_store(settings)  # as the auditor opens it (multiRead probed: the watch needs 3.6+)
    watcher.start(watched)
    t0 = time.monotonic()
    churner.start()
    try:
        names = list(engines)
        renewal_due = cluster.renewal_wanted = True  # the first run starts during a renewal
        while time.monotonic() - t0 < seconds:
            name = names[result.runs % len(names)]
            if result.runs % 3 == 1 or renewal_due:  # a run that starts while a bookie renews its session (its
                # agent answers), until its first pass is over; when every bookie was restarted just now, the
                # next run's start tries again, as it does until a run has seen one
                renewal_due = cluster.restart(session_only=True, held=True) is None
            report = ScrutinyRun(settings, AimedEngine(engines[name], cluster), sleep=aimed_sleep(cluster),
                                 record_sightings=True).execute()
            result.runs += 1
            result.runs_by_engine[name] += 1
            result.incomplete_runs += not report.complete
            result.moments.update({k: v for k, v in report.stats.items() if k in MOMENTS})
            cluster.renewal_wanted = not result.moments["lost_bookies"]
            renewal_due = renewal_due or cluster.renewal_wanted
            result.false_alarms += [{"run": report.run_id, "engine": name, **v.to_json()} for v in report.violations]
            result.continuous_false_alarms += [c.to_json() for c in state.findings()]
            state.full_run(report.violations, int(time.time() * 1000), int(time.time() * 1000))
        stop.set()
        churner.join()
        result.seconds = time.monotonic() - t0
        result.operations = Counter(cluster.ops)
        time.sleep(recheck_delay * 4)  # every pending garbage collection and restart is done
        result.continuous_false_alarms += [c.to_json() for c in state.findings()]
        faults = cluster.inject_faults()
        result.faults = sorted(f"{c} {lid}" for c, lid in faults)
        # What continuous mode sees by itself: a copy gone (the agent's feed); with the store's watch also a
        # close with adds past it, and a registration gone (its ledgers after the lost-bookie delay)
        seen = {f for f in faults if f[0] == "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"
                or (watcher.feeds.get("metadata") == "up" and f[0] != "ORPHAN_LEDGER")}
        result.continuous_expected = sorted(f"{c} {lid}" for c, lid in seen)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not seen <= _keys(state):
            time.sleep(0.2)
        result.continuous_found = seen <= _keys(state) and not (_keys(state) - faults)
        ScrutinyRun(settings, engines[names[0]], record_sightings=True).execute()  # the orphan is sighted
        time.sleep(max(ORPHAN_GRACE, LOST_BOOKIE_GRACE))  # ... and the lost bookie
        report = ScrutinyRun(settings, engines[names[0]], record_sightings=True).execute()
        got = {(str(v.category), v.ledger_id) for v in report.violations}
        result.fault_found = faults <= got and report.complete
        result.fault_report_extra = sorted(f"{c} {lid}" for c, lid in got - faults)
        result.continuous_missed = state.full_run(report.violations, int(time.time() * 1000), int(time.time() * 1000))
        result.continuous_stats = dict(watcher.stats)
    finally:
        stop.set()
        watcher.stop()
        watched.close()
        cluster.close()
    return result


def _keys(state: CurrentState) -> set[tuple[str, int]]:
    return {(str(c.violation.category), c.violation.ledger_id) for c in state.findings()}


@dataclass(frozen=True)
class Sample:
    run: int
    rss_mb: float  # the auditor's process
    fds: int
    threads: int
    jvm_rss_mb: float  # Spark's JVM (0 with the local engine)
    workers_rss_mb: float  # Spark's Python workers, where the per-range work runs


def spark_children_mb(proc: Any) -> tuple[float, float]:
    """RSS of a process's Spark JVM and of its Python workers (MB): the processes under it."""
    import psutil

    jvm = workers = 0
    for child in proc.children(recursive=True):
        try:
            rss = child.memory_info().rss
            if "java" in child.name():
                jvm += rss
            elif "python" in child.name():
                workers += rss
        except psutil.Error:
            continue
    return jvm / 2**20, workers / 2**20


# The threads of the cluster simulated in this process (in production, other processes): its agents'
# workers, their watches, the churn and its timers.
CLUSTER_THREADS = ("agent", "churn")


def _usage(run: int) -> Sample:
    import psutil

    me = psutil.Process()
    cluster = sum(t.name.startswith(CLUSTER_THREADS) for t in threading.enumerate())
    return Sample(run, me.memory_info().rss / 2**20, me.num_fds(), me.num_threads() - cluster,
                  *spark_children_mb(me))


def populated(cluster: ChurnCluster, ledgers: int = 60) -> ChurnCluster:
    for _ in range(ledgers):
        cluster.create()
    return cluster


@contextlib.contextmanager
def churning(cluster: ChurnCluster, period: float = 0.05) -> Iterator[ChurnCluster]:
    """The cluster changing on a thread of its own, a step every `period` s, until the block ends; then closed."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.wait(period):
            cluster.step()

    churner = threading.Thread(target=churn, daemon=True, name="churn")
    churner.start()
    try:
        yield cluster
    finally:
        stop.set()
        churner.join()
        cluster.close()


def _continuous_settled(auditor: Any, timeout: float) -> None:
    """Every feed up (a stream holds a gRPC thread while it is open) and no look under way (each opens a
    store session): the auditor at rest, whatever the churn left it doing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and auditor.continuous is not None:
        c = auditor.continuous
        if c.pending() == 0 and all(state == "up" for state in list(c.feeds.values())):
            return
        time.sleep(0.05)


def auditor_soak(client: KazooClient, root: str, hosts: str, runs: int, engine: Engine, reports_dir: str,
                 seed: int = 1, recheck_delay: float = 0.3) -> list[Sample]:
    """A leading auditor doing full runs back to back (interval 1 s) while the cluster churns; one
    sample of its resources after each run."""
    from scrutiny.auditor import Auditor
    from scrutiny.config import AuditorSettings

    uri = f"zk+hierarchical://{hosts}{root}"
    cluster = populated(ChurnCluster(client, root, uri, [f"127.0.5.{n}:3181" for n in range(1, 6)], recheck_delay,
                                     random.Random(seed)))
    scan = ScanSettings(metadata_service_uri=uri, placement_policy="none", recheck_delay=recheck_delay,
                        underreplicated_grace_period=1, bookie_deadline_seconds=2.0, zk_session_timeout=10)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=reports_dir, full_interval_seconds=1,
                               underreplication_interval_seconds=0, insecure_open_rescan=True, reports_keep=5)
    auditor = Auditor(scan, settings, engine=engine).start()
    samples: list[Sample] = []
    with churning(cluster):
        try:
            seen = ""
            deadline = time.monotonic() + runs * 30
            while len(samples) < runs and time.monotonic() < deadline:
                last = auditor.last.get("full")
                if last is not None and last.run_id != seen and last.report is not None:
                    seen = last.run_id
                    if last.report.violations:
                        first = next(iter(last.report.violations))
                        raise AssertionError(f"false alarm in run {seen}: {first.to_json()}")
                    with cluster.quiet():
                        _continuous_settled(auditor, 5.0)
                        samples.append(_usage(len(samples) + 1))
                time.sleep(0.05)
        finally:
            auditor.stop()
    return samples


def main(argv: list[str] | None = None) -> int:
    from scrutiny.scan.engines import SparkEngine
    from scrutiny.testing.localetcd import EtcdTree, LocalEtcd
    from scrutiny.testing.localzk import LocalZooKeeper

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--engines", default="local,spark")
    p.add_argument("--output", help="write the figures as JSON here too")
    p.add_argument("--store", choices=("zk", "etcd"), default="zk",
                   help="the metadata store: ZooKeeper, or Pulsar's metadata store on etcd")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    engines: dict[str, Engine] = {}
    for name in args.engines.split(","):
        engines[name] = LocalEngine() if name == "local" else SparkEngine("local[2]")
        engines[name].open()  # before the agents' gRPC threads exist
    with contextlib.ExitStack() as stack:
        if args.store == "etcd":
            etcd = stack.enter_context(LocalEtcd())
            client: Any = EtcdTree(etcd.endpoint)
            stack.callback(client.close)
            uri = etcd.uri
        else:
            zk = stack.enter_context(LocalZooKeeper())
            client = KazooClient(hosts=zk.hosts, timeout=15)
            client.start(timeout=15)
            stack.callback(client.close)
            stack.callback(client.stop)
            uri = f"zk+hierarchical://{zk.hosts}/ledgers"
        for e in engines.values():
            stack.callback(e.close)
        result = soak(client, "/ledgers", uri, args.seconds, engines, seed=args.seed)
    figures = json.dumps(result.summary(), indent=2)
    print(figures)
    for alarm in result.false_alarms[:20]:
        print("FALSE ALARM", json.dumps(alarm))
    if args.output:
        Path(args.output).write_text(figures)
    return 0 if not result.false_alarms and result.fault_found and not result.fault_report_extra else 1


if __name__ == "__main__":
    sys.exit(main())
