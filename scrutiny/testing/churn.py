"""A cluster that churns as a BookKeeper cluster does, only ever legally: ledgers created, closed, deleted
(and later collected), re-replicated, recovered with residue past the close; agents and bookies restarted,
sessions renewed; its runs' sleeps aimed at their re-check and re-read moments. Losses a replication worker
repairs may be injected among its operations (`lose_share`, `repair`), and the churn races them."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scrutiny.agent import BookieAgent
from scrutiny.metadata import (
    BookieRegistration,
    LedgerMetadata,
    LedgerState,
    Segment,
    UnderreplicationMark,
    decode_ledger_metadata,
    ledger_path,
)
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.engines import Engine, Progress
from scrutiny.scan.result import RangeResult
from scrutiny.store import LedgerRange
from scrutiny.testing import store_for
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.holdings import MutableHoldings, share
from scrutiny.testing.racedlosses import Loss, Losses
from scrutiny.testing.replicationworker import REPLICATED, ReplicationWorker

log = logging.getLogger(__name__)
RESTART_SPACING = 12.0


# The run statistics that say a guarded moment was hit (a false alarm would have hidden there).
MOMENTS = ("lost_bookies", "potentially_faulty", "rechecked_again", "reasked_before_reporting",
           "reanalyzed_after_metadata_change",
           "dropped_marked_during_run",
           "deleted_during_run", "relooked_after_registration_change", "relooked_after_agent_moved",
           "left_unsettled_after_rechecks",
           "marks_gone_before_reporting", "ledgers_with_residue_past_the_close", "orphan_candidates",
           "pulsar_candidates")


ORPHAN_GRACE = 5  # seconds: longer than the churn's garbage collection takes (at most 3 re-check delays)
LOST_BOOKIE_GRACE = 2  # seconds: longer than a restart or a session renewal keeps a bookie unregistered
RENEWAL_HELD_MOST = LOST_BOOKIE_GRACE / 2  # a renewal held over a run's first pass ends by then at the latest
KEPT_CLOSED = 20  # the churn deletes only while it keeps this many closed ledgers: the faults are aimed at them


@dataclass
class Outage:
    """An agent stopped by the churn (wall ms), and back (None while it is down)."""

    down_ms: int
    back_ms: int | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


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
    pulsar: Any = None  # a PulsarChurn: Pulsar's topics on the cluster, their operations among the churn's
    losses: Losses = field(default_factory=Losses)
    # each agent's outages: meant shorter than the re-check delay, a loaded machine can stretch one past it, and
    # then its silence at both looks is true
    outages: dict[str, list[Outage]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.writer = ClusterWriter(self.client, self.root)
        self.writer.init_cluster()
        self._resources = contextlib.ExitStack()
        self.store = self._resources.enter_context(store_for(self.client, self.uri))
        self.lock = threading.RLock()
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

    def later(self, seconds: float, fn: Callable[[], None]) -> None:
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
        with self.lock:
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
                # from the moment its stop begins (it deregisters as it stops: a loaded machine takes a while)
                self.outages.setdefault(bookie, []).append(Outage(_now_ms()))
                self.agents.pop(bookie).stop(grace=0)
            if whole_bookie or session_only:
                self.writer.unregister_bookie(bookie)
        self.ops["session_expiry" if session_only else "restart_bookie" if whole_bookie else "restart_agent"] += 1

        def back() -> None:
            with self.lock:
                if session_only and self._renewals.pop(bookie, None) is None:
                    return  # ended already
                if whole_bookie or session_only:
                    self.writer.register_bookie(BookieRegistration(bookie, False))
                if not session_only:
                    self._start_agent(bookie)
                    self.outages[bookie][-1].back_ms = _now_ms()

        if session_only:
            with self.lock:
                self._renewals[bookie] = back
        self.later(down, back)
        return bookie

    def outages_of(self, bookies: Iterable[str]) -> dict[str, list[tuple[int, int | None]]]:
        """Each bookie's agent outages (down, back: wall ms), for a false alarm's context."""
        with self.lock:
            return {b: [(o.down_ms, o.back_ms) for o in self.outages.get(b, [])] for b in bookies}

    def down_longer_than(self, bookie: str, seconds: float, since_ms: int) -> bool:
        """Whether `bookie`'s agent was down for `seconds` or more at a time, since `since_ms`."""
        now = _now_ms()
        with self.lock:
            return any((o.back_ms or now) >= since_ms and (o.back_ms or now) - o.down_ms >= seconds * 1000
                       for o in self.outages.get(bookie, []))

    def end_renewals(self) -> None:
        """The sessions being renewed are renewed now, their bookies registered again."""
        with self.lock:
            ending = list(self._renewals.values())
        for back in ending:
            back()
        with self.lock:
            if not self._renewals:
                self._down_until = min(self._down_until, time.monotonic())

    # -- ledgers -------------------------------------------------------------------------------

    def create(self, past_the_close: int = 0) -> int:
        """A ledger written and closed; with `past_the_close`, entries written beyond its close: the residue
        of a recovery (1: the entry after the close on one bookie; 2: and the next one on both bookies of its
        write set, in flight at the fence and never acknowledged), or (3) adds a replaced bookie took after
        the close, on every bookie of their write sets (a fault: ENTRIES_PAST_THE_CLOSE)."""
        with self.lock:
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
        with self.lock:
            self.closed[lid] = closed
        self.ops["create" if not past_the_close else "recover_with_residue"] += 1
        return lid

    def _pick(self) -> LedgerMetadata | None:
        with self.lock:
            ids = [lid for lid in self.closed if lid not in self.frozen]
            return self.closed[self.rng.choice(ids)] if ids else None

    def delete(self) -> None:
        with self.lock:
            md = self._pick()
            if md is None:
                return
            del self.closed[md.ledger_id]
            self.losses.end(md.ledger_id, "deleted")
            self.writer.delete_ledger(md.ledger_id)
        self.later(self.recheck_delay * self.rng.uniform(0.1, 3.0), lambda: self._collect(md.ledger_id, md.bookies))
        self.ops["delete"] += 1

    def rereplicate(self) -> None:
        # Under the lock from mark to unmark: BookKeeper's over-replication GC skips a ledger that is
        # being re-replicated, so it can never collect the copy just made.
        with self.lock:
            md = self._pick()
            if md is None:
                return
            ens = md.segments[0].ensemble
            # a worker's checker finds the share a loss took bad: that is the one it copies
            loss = self.losses.standing(md.ledger_id)
            source = loss.bookie if loss is not None else self.rng.choice(ens)
            target = self.rng.choice([b for b in self.bookies if b not in ens])
            self.writer.mark_underreplicated(UnderreplicationMark(md.ledger_id, (source,), int(time.time() * 1000)))
            self.holdings[target].put(md.ledger_id, share(md, source))
            moved = dataclasses.replace(md, segments=(Segment(0, tuple(target if b == source else b for b in ens)),))
            self.writer.update_ledger(moved)
            self.closed[md.ledger_id] = moved
            self.losses.end(md.ledger_id, "rereplicated")
            self.writer.unmark_underreplicated(md.ledger_id)
        self.later(self.recheck_delay * self.rng.uniform(0.1, 3.0), lambda: self._collect(md.ledger_id, {source}))
        self.ops["rereplicate"] += 1

    def lose_share(self) -> int | None:
        """A bookie's whole share of one closed ledger gone, nobody told (once per ledger); the churn goes on
        with the ledger as with any other."""
        with self.lock:
            ids = [lid for lid in self.closed if lid not in self.frozen and lid not in self.losses]
            if not ids:
                return None
            md = self.closed[self.rng.choice(ids)]
            bookie = self.rng.choice(md.segments[0].ensemble)
            self.holdings[bookie].drop(md.ledger_id)
            self.losses[md.ledger_id] = Loss(bookie, _now_ms(), self._version(md.ledger_id))
        self.ops["lose_share"] += 1
        return md.ledger_id

    def repair(self, worker: ReplicationWorker) -> None:
        """A replication worker's turn on the marks (as BookKeeper's, racing the churn); the ensembles it
        changed, the churn goes on from."""
        with self.lock:
            for lid, outcome in worker.run_once():
                if outcome == REPLICATED and lid in self.closed:
                    data, stat = self.client.get(ledger_path(self.writer.layout, self.root, lid))
                    self.closed[lid] = decode_ledger_metadata(lid, data, stat.ctime, stat.version)
                    self.losses.end(lid, "repaired")

    def standing_losses(self) -> dict[int, Loss]:
        with self.lock:
            return self.losses.still_standing()

    def _version(self, ledger_id: int) -> int:
        return int(self.client.get(ledger_path(self.writer.layout, self.root, ledger_id))[1].version)

    def _collect(self, ledger_id: int, bookies: set[str] | frozenset[str]) -> None:
        """The bookies' garbage collector: a copy goes unless the ledger (still) names the bookie."""
        with self.lock:
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
            self.settle(timeout)
            yield
        finally:
            self._quiet.clear()

    def settle(self, timeout: float) -> None:
        """Wait (`timeout` at most) until the step under way and what the churn set going ended: restarted
        bookies back, copies collected (a loaded machine runs those timers late)."""
        with self._stepping:
            pass
        deadline = time.monotonic() + timeout
        for t in list(self._timers):
            t.join(max(0.0, deadline - time.monotonic()))

    def step(self) -> None:
        with self._stepping:
            if not self._quiet.is_set():
                self._step()

    def _step(self) -> None:
        if self.pulsar is not None and self.rng.random() < 0.4:
            self.pulsar.step()
            return
        op = self.rng.random()
        if op < 0.30 or len(self.closed) < KEPT_CLOSED:
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
        LOST_BOOKIE_RECOVERY_NOT_STARTED for each; and with Pulsar's topics, one fault of each class their
        records can have (`PulsarChurn.inject_faults`)."""
        with self.lock:
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
        with self.lock:
            unhandled = {("LOST_BOOKIE_RECOVERY_NOT_STARTED", lid) for lid, m in self.closed.items()
                         if gone in m.bookies}
        pulsar = self.pulsar.inject_faults() if self.pulsar is not None else set()
        return {("LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY", lost), ("ORPHAN_LEDGER", orphaned),
                ("ENTRIES_PAST_THE_CLOSE", past)} | unhandled | pulsar

    def close(self) -> None:
        for t in self._timers:
            t.cancel()
        with self.lock:
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
            if len(c.closed) >= KEPT_CLOSED:  # back-to-back runs deleted faster than the churn created
                c.delete()
            else:
                c.create()
            if c.pulsar is not None:  # a topic rolls over, trims, deletes an offloaded ledger
                c.pulsar.step()
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
