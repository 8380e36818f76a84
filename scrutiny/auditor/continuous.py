"""Continuous scrutiny on the auditor's leader: learn from the bookies and the metadata what changed, and
check only that, with the same BP-34 steps as any run.

Three feeds: every agent's WatchHoldings stream (ledgers gone from a bookie's index, an entry log removed
under ledgers that still need it, a bookie back empty), the metadata store's watch (a ledger closed or its
ensemble changed, deleted, marked or unmarked, a bookie's registration gone or back), and the watch on
Pulsar's records (`TopicFeed`: a managed ledger, a cursor or a schema changed; a topic's ledger deleted or
closed). What they name is batched, and each batch is a scoped run (`ScrutinyRun.execute(ledger_ids=...)`,
or a topic run: re-check, re-read, marks, registrations, as every run) whose findings update the current
state (`CurrentState`). A feed that may have missed something (a reconnection to ZooKeeper, an agent
restarted, changes no longer kept) and a mass event (more ledgers at once than
`continuous_max_ledgers_per_second` allows) schedule a full run instead, the safety net. The agents'
cursors are kept in the store: a new leader goes on where the last one stopped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from scrutiny.auditor.backlog import BOOKIES, LANES, LEDGERS, TOPICS, Backlog, Due
from scrutiny.auditor.currentstate import CurrentState
from scrutiny.auditor.cursors import Cursors, KeptCursors
from scrutiny.auditor.feeds import AgentFeeds
from scrutiny.auditor.gonebookies import GoneBookies
from scrutiny.auditor.listing import AgentListing
from scrutiny.auditor.topicfeed import TopicFeed
from scrutiny.bookieclient import EndpointResolver
from scrutiny.categories import Category, Phase, in_phase
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.metadata import TreeChange
from scrutiny.pulsar.owners import topic_of_owner
from scrutiny.pulsar.snapshot import PulsarRecord
from scrutiny.report import Report
from scrutiny.runstats import Scan
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.store import MetadataStore, TreeWatchHandle
from scrutiny.store.facts import AGENTS, REGISTRATIONS, REPLICATION, SIGHTINGS, FactsCache
from scrutiny.tls import channel_credentials
from scrutiny.v1 import bookie_pb2

log = logging.getLogger(__name__)
Msg = bookie_pb2.HoldingsChange
LOOKED_AT: tuple[Category, ...] = in_phase(Phase.LEDGERS) + in_phase(Phase.MARKS)  # what a scoped run finds
# ... and a look at a topic (a leak is no topic's: full runs find them, as orphans)
TOPICS_LOOKED_AT = tuple(c for c in in_phase(Phase.TOPICS) if c is not Category.LEAKED_LEDGER)
FACTS_OF = {"registration": (REGISTRATIONS, AGENTS, SIGHTINGS), "cookie": (REGISTRATIONS,),  # what each change spoils
            "replication": (REPLICATION,)}


class Continuous:
    def __init__(self, scan: ScanSettings, settings: AuditorSettings, state: CurrentState,
                 schedule_full: Callable[[str], None], now: Callable[[], float] = time.time) -> None:
        # A batch's own run: the local engine (a batch is small), the run's delayed re-check as any run's.
        self.scan = replace(scan, engine="local", orphan_check=False, blast_radius=False)
        self.settings, self.state, self.schedule_full, self.now = settings, state, schedule_full, now
        # a topic's ledger closed since its messages' checkpoint: read (the deep scrub's cost) and validated
        self.validates_messages = settings.continuous_validate_messages and settings.deep_interval_seconds > 0
        self.stats: Counter[str] = Counter()
        self.feeds: dict[str, str] = {}  # feed -> "up" | "down" | "unavailable"
        self._lock = threading.Lock()
        self._gone = GoneBookies(self.scan)
        self._kept = KeptCursors()  # how far the feeds were looked at, as the store keeps it
        self._seen: dict[str, tuple[str, int]] = {}  # ... last sequence taken note of
        self._stop = threading.Event()
        # something to look at (or, for the ledgers' loop, cursors moved): each lane's loop wakes only then
        self._pokes = {lane: threading.Event() for lane in LANES}
        self.backlog = Backlog({lane: e.set for lane, e in self._pokes.items()})
        self._listing = AgentListing(self._follow_listed)
        self._threads: list[threading.Thread] = []
        self._watch: TreeWatchHandle | None = None
        self._store: MetadataStore | None = None
        self.facts: FactsCache | None = None  # the facts the looks start on, kept between changes
        self.fact_reads: Counter[str] = Counter()  # ... how often each part was read, every leadership together
        self._feeds: AgentFeeds | None = None
        self._resolver = EndpointResolver(self.scan.bookie_endpoints, default_port=self.scan.agent_default_port)
        self.topics = TopicFeed(self.scan, self._look_at_topic, lambda why: self._gap("pulsar", why))

    def _ms(self) -> int:
        return int(self.now() * 1000)

    def pending(self) -> int:
        """Ledgers and bookies waiting for a look, or being looked at: the backlog."""
        return len(self.backlog)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, store: MetadataStore, kept: list[int] | tuple[int, ...] = ()) -> None:
        """On election: follow the feeds from where the last leader's cursors say, and look at what they name, and
        at once at the `kept` ledgers (the findings of the state a last leader kept: confirmed, or cleared)."""
        self._look(kept, "the last leader's current state names it")
        self._stop.clear()
        self._store, self.facts = store, FactsCache(store, reads=self.fact_reads)
        stored = self._kept.read(store)
        position, self._seen = stored.metadata, dict(stored.agents)
        self.state.watching(self._ms())
        self._gone = GoneBookies(self.scan)  # what a last leadership's watch saw is not known to be true now
        self._gone.judged(self._ms())  # every election asks for a full run (below)
        self._watch = store.watch_tree(self._on_tree, lambda why: self._gap("metadata", why), position)
        self.facts.keeping = self._watch is not None  # unwatched, no fact is known to stay true
        self.feeds["metadata"] = "up" if self._watch is not None else "unavailable"
        if self._watch is not None and not (position and self._watch.position()):
            # ZooKeeper's watch replays nothing: what changed before it started is unknown
            self._gap("metadata", "a new leader's watch starts now; what changed before it is unknown", expected=True)
        else:  # etcd's resumes where the last leader stopped; the agents' feeds too
            self.schedule_full("the new leader's current state (it keeps no findings across leaders)")
        if pulsar := self.topics.start(store):  # Pulsar's records: watched from now (the full run covers before)
            self.feeds["pulsar"] = pulsar
        s = self.scan
        self._feeds = AgentFeeds(self._resolver.address, lambda b: self._seen.get(b, ("", 0)), self._on_agent,
                                 lambda _: self._listing.moved(), self.feeds,
                                 channel_credentials(s.bookie_tls_ca, s.bookie_tls_cert, s.bookie_tls_key),
                                 s.bookie_max_message_bytes)
        for target, name, args in ((self._listing.follow, "continuous-agents", (self._stop,)),
                                   (self._work, "continuous", (LEDGERS,)),
                                   (self._work, "continuous-bookies", (BOOKIES,)),
                                   (self._work, "continuous-topics", (TOPICS,))):
            t = threading.Thread(target=target, args=args, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for poke in self._pokes.values():
            poke.set()
        self._listing.moved()
        self.state.stopped_watching()
        self.topics.stop()  # its watches were added after the tree's
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._feeds is not None:
            self._feeds.stop()
            self._feeds = None
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        self.feeds.clear()

    # -- what the feeds say -----------------------------------------------------------------------

    def _gap(self, feed: str, why: str, expected: bool = False) -> None:
        """A feed may have missed changes: only a full run can tell what they were (`expected`: as at every
        election, nothing an operator need look into)."""
        log.log(logging.INFO if expected else logging.WARNING, "continuous scrutiny: %s feed: %s; scheduling a full "
                "run", feed, why)
        self.stats[f"gaps.{feed.split(' ')[0]}"] += 1
        if self.facts is not None:
            self.facts.changed()
        self.state.watching(self._ms())
        self.schedule_full(f"a gap in the {feed} feed")

    def _look(self, ledger_ids: list[int] | tuple[int, ...], why: str, after_s: float = 0.0) -> None:
        self.backlog.add(ledger_ids, self._ms() + int(after_s * 1000), why)

    def _look_at_bookie(self, bookie: str, why: str, after_s: float = 0.0) -> None:
        self.backlog.add_named(BOOKIES, bookie, self._ms() + int(after_s * 1000), why)

    def _look_at_topic(self, topic: str, why: str, after_s: float = 0.0) -> None:
        self.backlog.add_named(TOPICS, topic, self._ms() + int(after_s * 1000), why)

    def _on_tree(self, change: TreeChange) -> None:
        """On the store's own thread: take note only."""
        s = self.scan
        if self.facts is not None and change.what in FACTS_OF:
            self.facts.changed(*FACTS_OF[change.what])
        if change.what == "ledger":
            if change.event == "deleted":
                self.backlog.forget(change.ledger_id)
                self.state.forget([change.ledger_id], self._ms())
                self.topics.ledger_changed(change.ledger_id, "was deleted")  # a record may still name it
            elif change.event == "changed":  # closed, or its ensemble changed: once the write cache is flushed
                self._look([change.ledger_id], "its metadata changed", s.write_cache_grace_seconds)
                self.topics.ledger_changed(change.ledger_id, "was closed or changed", s.write_cache_grace_seconds)
        elif change.what == "mark":
            self._look([change.ledger_id], f"its under-replication mark was {change.event}")
        elif change.what != "registration":
            return
        elif change.event == "deleted":  # a registration gone: BookKeeper marks its ledgers after the delay
            self._gone.went(change.bookie_id, self._ms())
            self._look_at_bookie(change.bookie_id, f"{change.bookie_id}'s registration went away",
                                 s.lost_bookie_recovery_delay + s.lost_bookie_grace_period + 1)
        elif change.event == "created":
            self._gone.back(change.bookie_id, self._ms())
            self._listing.moved()  # a bookie back, or a new one: its agent may be new too
            self._look_at_bookie(change.bookie_id, f"{change.bookie_id} registered again")

    def _follow_listed(self) -> None:
        try:
            assert self.facts is not None
            self.facts.changed(AGENTS, SIGHTINGS)  # read afresh, and kept for the looks until the next listing
            facts = self.facts.facts()
        except Exception as exc:  # the store away for a moment: the next round
            log.info("continuous scrutiny: cannot list the agents now: %s", exc)
            return
        self._resolver.registered.update(facts.agent_addresses)
        for bookie, wait in self._gone.adopt(facts, self._ms()).items():
            self._look_at_bookie(bookie, f"a run sighted {bookie} gone", wait)
        feeds = self._feeds
        if feeds is None:  # stepping down meanwhile
            return
        for bookie in sorted({*self._resolver.registered, *self._resolver.explicit}):
            feeds.follow(bookie)

    def runs_sighted(self, started_ms: int) -> None:
        """A whole-cluster run of this process, started then, recorded its lost-bookie sightings: they are read,
        and a bookie it found gone but not yet due is looked at when due (from the next listing of the agents)."""
        self._gone.judged(started_ms)
        self._listing.moved()

    def _on_agent(self, bookie: str, feed_id: str, msg: Any) -> None:
        if msg.kind == Msg.HEARTBEAT:
            return
        if msg.kind == Msg.GAP:
            if feed_id:  # a first reader has missed nothing: it starts watching now
                self._gap(f"agent {bookie}", msg.detail)
            self._seen[bookie] = (msg.feed_id, msg.sequence)
            self._pokes[LEDGERS].set()  # the new cursor recorded
            return
        why = f"{Msg.Kind.Name(msg.kind)} on {bookie}" + (f": {msg.detail}" if msg.detail else "")
        self.stats["agent_changes"] += 1
        if msg.every_ledger or msg.kind == Msg.BOOKIE_RESET:
            self._look_at_bookie(bookie, why)
        else:
            self._look(list(msg.ledger_ids), why)
        self._seen[bookie] = (msg.feed_id, msg.sequence)

    # -- looking ------------------------------------------------------------------------------------

    def _work(self, lane: str) -> None:
        """A batch of this lane when something is due, at most one every continuous_batch_seconds; asleep
        otherwise (an idle leader costs nothing but its feeds' heartbeats)."""
        interval, last, poke = self.settings.continuous_batch_seconds, -math.inf, self._pokes[lane]
        while not self._stop.is_set():
            poke.clear()
            now = self._ms()
            sleep_ms = self.backlog.sleep_ms(lane, now, now + (last + interval - time.monotonic()) * 1000)
            if sleep_ms is None:
                self._record_cursors_if_settled(self._cursors_now())
                poke.wait()
                continue
            if sleep_ms > 0:
                poke.wait(sleep_ms / 1000)
                continue
            last = time.monotonic()
            try:
                self.batch(lane)
            except Exception:
                log.exception("continuous scrutiny: a batch failed; its %s wait for the next", lane)

    def _cursors_now(self) -> Cursors:
        with self._lock:
            return Cursors(dict(self._seen), self._watch.position() if self._watch is not None else "")

    def batch(self, lane: str = LEDGERS) -> None:
        """What is due now in this lane, looked at with BP-34's steps; the current state updated."""
        most = max(1, int(self.settings.continuous_max_ledgers_per_second * self.settings.continuous_batch_seconds))
        cursors = self._cursors_now()  # before the take: what they name is taken, or still waits
        due, mass = self.backlog.take(lane, self._ms(), math.inf if lane == BOOKIES else most)
        if due:
            self._gone.record(self._store, self.facts)  # a bookie back since its sighting is never judged by it
        try:
            if mass:
                self.stats["degraded"] += 1
                self.schedule_full(f"{mass} {lane} changed at once (continuous_max_ledgers_per_second)")
            if due and lane == LEDGERS:
                self._look_at_ledgers(due)
            elif due and lane == TOPICS:
                self._look_at_topics(due)
            elif due:
                self._look_at_bookies(due)
        finally:
            self.backlog.done(lane)
        self._record_cursors_if_settled(cursors)

    def _look_at_ledgers(self, due: dict[int, Due]) -> None:
        report = self._scoped(ledger_ids=sorted(due))
        if report is None:
            for lid, d in due.items():
                self._look([lid], d.why, self.settings.continuous_batch_seconds)
            return
        self.state.looked_again(due, report.violations, self._ms(),
                                {lid: f"continuous: {d.why}" for lid, d in due.items()}, LOOKED_AT)

    def _look_at_topics(self, due: dict[str, Due]) -> None:
        """These topics' records against BookKeeper's metadata of their ledgers (a topic run)."""
        topics = sorted(due)
        report = self._scoped(replace(self.scan, topics=tuple(topics)),
                              topics_read=lambda record: self.topics.learned(topics, record))
        if report is None:
            for topic, d in due.items():
                self._look_at_topic(topic, d.why, self.settings.continuous_batch_seconds)
            return
        how = {v.ledger_id: f"continuous: {due[t].why}" for v in report.violations
               if v.owner is not None and (t := topic_of_owner(v.owner)) in due}
        self.stats["topics_checked"] += len(topics)
        self.state.looked_again_topics(due, report.violations, self._ms(), how, TOPICS_LOOKED_AT)

    def _look_at_bookies(self, due: dict[str, Due]) -> None:
        """Every ledger of these bookies, in one pass over the metadata."""
        again = self.settings.continuous_batch_seconds
        for bookie, d in list(due.items()):
            wait = self._gone.until_due(bookie, self._ms(), self.facts)
            if wait > 0:  # the cluster's lostBookieRecoveryDelay is longer than the setting: not yet
                self._look_at_bookie(bookie, d.why, wait)
                del due[bookie]
        report = self._scoped(only_bookies=sorted(due)) if due else None
        if report is None:
            for bookie, d in due.items():
                self._look_at_bookie(bookie, d.why, again)
            return
        first = next(iter(due.values())).why
        how = {v.ledger_id: "continuous: " + next((d.why for b, d in due.items() if b in v.bookies
                                                   or b in v.details.get("lost_bookies", ())), first)
               for v in report.violations}
        self.state.looked_again_bookies(due, report.violations, self._ms(), how, LOOKED_AT)
        if Scan.of(report.stats).lost_bookie_ledgers_not_yet_due:  # its sighting is later than the watch's
            for bookie in self._gone.among(due.keys()):
                self._look_at_bookie(bookie, due[bookie].why, max(again, self.scan.lost_bookie_grace_period))

    def _record_cursors_if_settled(self, at: Cursors) -> None:
        """Record how far the feeds were read when everything they had named by then is looked at (nothing
        waits in any lane): a new leader goes on from there."""
        if not len(self.backlog) and self._store is not None:
            self._kept.record(self._store, at)

    def _scoped(self, scan: ScanSettings | None = None, topics_read: Callable[[PulsarRecord], None] | None = None,
                **scope: Any) -> Report | None:
        """A run over these ledgers (or one bookie's, or some topics'), as any run; None when it could not
        complete (the caller looks again at the next batch)."""
        try:
            report = ScrutinyRun(scan or self.scan, LocalEngine(), kind="continuous", sleep=self._pause,
                                 store=self._store, facts=self.facts.facts if self.facts else None,
                                 checkpoints=self.validates_messages, topics_read=topics_read).execute(**scope)
        except Exception as exc:  # the store away for a moment: nothing it was to look at is dropped
            log.info("continuous scrutiny: a look failed (%s): trying again", exc)
            return None
        if not report.complete:
            log.info("continuous scrutiny: an incomplete look (%s): trying again", report.errors[:1])
            return None
        self.stats["batches"] += 1
        self.stats["ledgers_checked"] += report.ledgers.get("checked", 0)
        self.stats["store_reads"] += report.stats.get("store_reads", 0)
        return report

    def _pause(self, seconds: float) -> None:
        """A run's delayed re-check waits (its facts read afresh after), cut short when the leader steps down."""
        self._stop.wait(seconds)

