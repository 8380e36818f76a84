"""The churn soak: back-to-back runs on both engines, and continuous scrutiny beside them, while the cluster
does only legal BookKeeper operations aimed at the re-check and re-read moments, and loses a bookie's share
of a ledger now and then, which the hand-off to autorecovery (armed) marks and a replication worker repairs,
racing the churn; then faults injected. Nothing but those losses may be reported before the faults, the
hand-off may mark nothing else, and every fault must be found. `python -m scrutiny.testing.soak` runs it for
as long as asked (make soak)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from scrutiny.auditor.continuous import LOOKED_AT, TOPICS_LOOKED_AT, Continuous
from scrutiny.auditor.currentstate import CurrentState
from scrutiny.categories import Category
from scrutiny.checks import Violation
from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.repair.handoff import Handoff
from scrutiny.repair.plan import Handed
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import Engine, LocalEngine
from scrutiny.store import Fence, MetadataStore, open_store
from scrutiny.testing.churn import LOST_BOOKIE_GRACE, MOMENTS, ORPHAN_GRACE, AimedEngine, ChurnCluster, aimed_sleep
from scrutiny.testing.pulsarchurn import PulsarChurn
from scrutiny.testing.racedlosses import concluded, held_for_a_loss, judge, of_a_loss
from scrutiny.testing.replicationworker import ReplicationWorker

log = logging.getLogger(__name__)


@dataclass
class SoakResult:
    runs: int = 0
    runs_by_engine: Counter = field(default_factory=lambda: Counter())
    seconds: float = 0.0
    operations: Counter = field(default_factory=lambda: Counter())
    false_alarms: list[dict[str, Any]] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # the runs not complete, and why (their first errors)
    outages_past_the_recheck: int = 0  # BOOKIE_UNAVAILABLE true because a restart outlasted the re-check delay
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
    continuous_unseen: list[str] = field(default_factory=list)  # ... not found within the deadline
    continuous_extra: list[str] = field(default_factory=list)  # ... found beside the faults
    continuous_missed: int = 0
    continuous_stats: dict[str, int] = field(default_factory=dict)
    # the hand-off to autorecovery, armed (`repair: mark`) on continuous mode's state during the churn, with a
    # replication worker: what it did wrong against the losses the churn raced (`racedlosses.judge`), and how
    # they ended
    handoff_wrong: list[str] = field(default_factory=list)
    handoff: dict[str, Any] = field(default_factory=dict)

    @property
    def incomplete_runs(self) -> int:
        return len(self.incomplete)

    @property
    def ops_per_minute(self) -> float:
        return sum(self.operations.values()) / max(self.seconds, 1e-9) * 60

    def summary(self) -> dict[str, Any]:
        return {"runs": self.runs, "runs_by_engine": dict(self.runs_by_engine), "seconds": round(self.seconds, 1),
                "operations": dict(self.operations), "operations_per_minute": round(self.ops_per_minute),
                "false_alarms": len(self.false_alarms), "incomplete_runs": self.incomplete_runs,
                "incomplete": self.incomplete,
                "outages_past_the_recheck": self.outages_past_the_recheck,
                "moments": dict(self.moments), "faults": self.faults,
                "fault_found": self.fault_found, "fault_report_extra": self.fault_report_extra,
                "continuous_false_alarms": len(self.continuous_false_alarms),
                "continuous_expected": self.continuous_expected, "continuous_found": self.continuous_found,
                "continuous_unseen": self.continuous_unseen, "continuous_extra": self.continuous_extra,
                "continuous_missed": self.continuous_missed, "continuous_stats": self.continuous_stats,
                "handoff_wrong": self.handoff_wrong[:20], "handoff": self.handoff}


def soak(client: Any, root: str, uri: str, seconds: float, engines: dict[str, Engine], seed: int = 1,
         recheck_delay: float = 0.5, bookies: int = 6, pulsar: bool = True, losses_every: float = 2.0,
         min_runs: int = 0, min_pulsar_operations: int = 0, min_moments: tuple[str, ...] = ()) -> SoakResult:
    """Back-to-back scans on each engine in turn while the cluster churns (with Pulsar's topics on it, their
    own operations among the churn's) and loses a share every `losses_every` seconds (0: none); then the
    injected faults, once `seconds` have passed and at least `min_runs` runs and `min_pulsar_operations` of
    Pulsar's operations were made (a loaded machine makes fewer), and the runs met each of `min_moments` (for at
    most four times `seconds`: a moment never met is then the test's to report). `client` writes the cluster (a
    KazooClient, or an EtcdTree for Pulsar's layout on etcd) that `uri` names."""
    cluster = ChurnCluster(client, root, uri, [f"127.0.4.{n}:3181" for n in range(1, bookies + 1)], recheck_delay,
                           random.Random(seed))
    if pulsar:
        cluster.pulsar = PulsarChurn(cluster)
    settings = ScanSettings(metadata_service_uri=uri, placement_policy="none", recheck_delay=recheck_delay,
                            underreplicated_grace_period=1, bookie_deadline_seconds=2.0, zk_session_timeout=10,
                            etcd_lease_ttl=10, orphan_grace_period=ORPHAN_GRACE,
                            leaked_ledger_grace_period=ORPHAN_GRACE,
                            # a bookie restarting, or renewing its session, is unregistered for less than this
                            lost_bookie_grace_period=LOST_BOOKIE_GRACE, lost_bookie_recovery_delay=0)
    result = SoakResult()
    for _ in range(40):
        cluster.create()
    stop, handing_stop = threading.Event(), threading.Event()

    def churn() -> None:
        next_loss = time.monotonic() + losses_every
        while not stop.wait(0.02):
            try:
                cluster.step()
                if losses_every and time.monotonic() >= next_loss:
                    next_loss += losses_every
                    cluster.lose_share()
            except Exception:  # the soak's own churn must not die silently
                log.exception("churn step failed")

    churner = threading.Thread(target=churn, name="churn", daemon=True)
    state = CurrentState()
    watcher = Continuous(settings, AuditorSettings(continuous_batch_seconds=0.3), state, lambda why: None)
    watched = open_store(settings)  # as the auditor opens it (multiRead probed: the watch needs 3.6+)
    watcher.start(watched)
    journal_dir = tempfile.mkdtemp(prefix="scrutiny-soak-")
    armed = AuditorSettings(reports_dir=journal_dir, repair="mark", repair_marks_per_run=100,
                            repair_marks_per_minute=10_000)
    leader = SoakLeader(settings, armed, state, watched)
    handoff = Handoff(leader)

    journal: list[Handed] = []  # all of it: the hand-off's own keeps the newest JOURNAL_KEPT

    def hand_off() -> None:
        while not handing_stop.wait(0.3):
            try:
                journal.extend(handoff.run())
            except Exception as exc:  # as `Handoff.tick`: the next hand-off tries again
                log.warning("hand-off failed (%s)", exc)

    worker = ReplicationWorker(client, root, cluster.holdings, percentage=0)

    def repair() -> None:  # BookKeeper's worker, woken by the marks' watch: here every second
        while not handing_stop.wait(1.0):
            try:
                cluster.repair(worker)
            except Exception:
                log.exception("the replication worker's turn failed")

    handing = [threading.Thread(target=hand_off, name="handoff", daemon=True),
               threading.Thread(target=repair, name="replication-worker", daemon=True)]
    t0 = time.monotonic()
    churner.start()
    for t in handing:
        t.start()
    try:
        names = list(engines)
        renewal_due = cluster.renewal_wanted = True  # the first run starts during a renewal
        def pulsar_operations() -> int:  # (list(): a copy the churn's thread cannot change under it)
            return sum(n for op, n in list(cluster.ops.items()) if op.startswith("pulsar_"))

        def moments_unmet() -> bool:
            return any(not result.moments[m] for m in min_moments) and time.monotonic() - t0 < 4 * seconds

        while (time.monotonic() - t0 < seconds or result.runs < min_runs
               or pulsar_operations() < min_pulsar_operations or moments_unmet()):
            name = names[result.runs % len(names)]
            if result.runs % 3 == 1 or renewal_due:  # a run that starts while a bookie renews its session (its
                # agent answers), until its first pass is over; when every bookie was restarted just now, the
                # next run's start tries again, as it does until a run has seen one
                renewal_due = cluster.restart(session_only=True, held=True) is None
            started_ms = int(time.time() * 1000)
            report = ScrutinyRun(settings, AimedEngine(engines[name], cluster), sleep=aimed_sleep(cluster),
                                 record_sightings=True).execute()
            result.runs += 1
            result.runs_by_engine[name] += 1
            if not report.complete:
                result.incomplete.append(f"run {report.run_id} ({name}): {report.errors[:3]}")
            result.moments.update({k: v for k, v in report.stats.items() if k in MOMENTS})
            cluster.renewal_wanted = not result.moments["lost_bookies"]
            renewal_due = renewal_due or cluster.renewal_wanted
            for v in report.violations:
                if _outlasted_the_recheck(v, cluster, started_ms, recheck_delay):
                    result.outages_past_the_recheck += 1
                elif not of_a_loss(v, cluster.losses, started_ms):
                    result.false_alarms.append({"run": report.run_id, "engine": name, "run_started_ms": started_ms,
                                                **v.to_json(), "outages": cluster.outages_of(v.bookies)})
            result.continuous_false_alarms += _unexplained(state, cluster, recheck_delay)
            state.full_run(report.violations, started_ms, int(time.time() * 1000), unsettled=report.unsettled)
        stop.set()
        churner.join()
        result.seconds = time.monotonic() - t0
        result.operations = Counter(cluster.ops)
        if losses_every:
            cluster.lose_share()  # one the churn cannot end: the hand-off and the worker alone
            # the losses still standing marked and repaired now that the churn is over, each mark followed to its end
            deadline = time.monotonic() + 60
            while ((cluster.standing_losses() or not concluded(journal))
                   and time.monotonic() < deadline):
                time.sleep(0.2)
        handing_stop.set()
        for t in handing:
            t.join()
        result.handoff_wrong, result.handoff = judge(journal, cluster.losses)
        result.handoff_wrong = [w + _held(state, w) for w in result.handoff_wrong]
        cluster.settle(timeout=60)  # every pending garbage collection and restart is done
        time.sleep(recheck_delay * 4)  # ... and the agents' feeds told continuous mode
        # ... and every agent followed again: one restarted late is followed anew after a gap, once its new feed has
        # taken stock, and what changed before that is a full run's (the soak makes none here). A loaded machine
        # stretched that past the faults: the copy lost at a bookie whose feed was still reconnecting went unseen
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                state != "up" for feed, state in list(watcher.feeds.items()) if feed.startswith("agent ")):
            time.sleep(0.1)
        result.continuous_false_alarms += _unexplained(state, cluster, recheck_delay)
        faults = cluster.inject_faults()
        result.faults = sorted(f"{c} {lid}" for c, lid in faults)
        # What continuous mode sees by itself: a copy gone (the agent's feed); with the store's watch also a
        # close with adds past it, and a registration gone (its ledgers after the lost-bookie delay); with the
        # watch on Pulsar's records too, each topic's fault; neither orphans nor leaks (full runs only)
        following = watcher.feeds.get("metadata") == "up"
        seen = {f for f in faults if f[0] == "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"
                or (following and Category(f[0]) in LOOKED_AT)
                or (following and watcher.feeds.get("pulsar") == "up" and Category(f[0]) in TOPICS_LOOKED_AT)}
        result.continuous_expected = sorted(f"{c} {lid}" for c, lid in seen)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not seen <= _keys(state):
            time.sleep(0.2)
        keys = _keys(state)
        result.continuous_unseen = sorted(f"{c} {lid}" for c, lid in seen - keys)
        result.continuous_extra = sorted(f"{c} {lid}" for c, lid in keys - faults)
        result.continuous_found = not result.continuous_unseen and not result.continuous_extra
        ScrutinyRun(settings, engines[names[0]], record_sightings=True).execute()  # the orphan is sighted
        time.sleep(max(ORPHAN_GRACE, LOST_BOOKIE_GRACE))  # ... and the lost bookie
        started_ms = int(time.time() * 1000)
        report = ScrutinyRun(settings, engines[names[0]], record_sightings=True).execute()
        got = {(str(v.category), v.ledger_id) for v in report.violations}
        result.fault_found = faults <= got and report.complete
        result.fault_report_extra = sorted(f"{c} {lid}" for c, lid in got - faults)
        result.continuous_missed = state.full_run(report.violations, started_ms, int(time.time() * 1000),
                                                  unsettled=report.unsettled)
        result.continuous_stats = dict(watcher.stats)
    finally:
        stop.set()
        handing_stop.set()
        leader.close()
        watcher.stop()
        shutil.rmtree(journal_dir, ignore_errors=True)
        watched.close()
        cluster.close()
    return result


class SoakLeader:
    """The soak's hand-off leads as the auditor's does: elected on the store it watches (so its marks are fenced),
    judging the findings of continuous scrutiny beside the runs."""

    def __init__(self, settings: ScanSettings, armed: AuditorSettings, state: CurrentState,
                 store: MetadataStore) -> None:
        self._settings, self._state, self._store = (settings, armed), state, store
        self.stopping = threading.Event()
        self._leading = threading.Event()
        self._election = store.election("soak")
        self._thread = threading.Thread(target=self._election.run, args=(self._lead,), name="soak-election",
                                        daemon=True)
        self._thread.start()
        if not self._leading.wait(30):
            raise RuntimeError("the soak's hand-off was not elected within 30 s")

    def close(self) -> None:
        """Depose, then let go (on a live session: before the store it watches is closed)."""
        self.stopping.set()
        self._election.cancel()
        self._thread.join(30)

    def _lead(self) -> None:
        self._leading.set()
        self.stopping.wait()
        self._leading.clear()

    def settings(self) -> tuple[ScanSettings, AuditorSettings]:
        return self._settings

    def findings(self) -> Iterable[Violation]:
        return (c.violation for c in self._state.findings())

    def store(self) -> MetadataStore:
        return self._store

    def leading(self) -> bool:
        return self._leading.is_set()

    def fence(self) -> Fence | None:
        return self._election.fence()

    def name(self) -> str:
        return "soak"

    def looked_again(self, ledger_ids: list[int], found: list[Violation]) -> None:
        return None  # continuous scrutiny and the runs keep the state


def _outlasted_the_recheck(v: Violation, cluster: ChurnCluster, since_ms: int, recheck_delay: float) -> bool:
    """A bookie silent at both looks whose agent the churn's restart kept down longer than the re-check delay (a
    loaded machine): a true finding, not a false alarm."""
    return v.category is Category.BOOKIE_UNAVAILABLE and all(
        cluster.down_longer_than(b, recheck_delay, since_ms) for b in v.bookies)


def _unexplained(state: CurrentState, cluster: ChurnCluster, recheck_delay: float) -> list[dict[str, Any]]:
    """Continuous scrutiny's findings (and the last run's, which the soak gives it) that neither a raced loss nor
    a restart that outlasted the re-check (within the minute before the finding) explains: false alarms."""
    now_ms = int(time.time() * 1000)
    return [c.to_json() for c in state.findings() if not held_for_a_loss(c, cluster.losses, now_ms)
            and not _outlasted_the_recheck(c.violation, cluster, c.detected_ms - 60_000, recheck_delay)]


def _held(state: CurrentState, wrong: str) -> str:
    """For a loss never marked: what the state the hand-off reads holds of its ledger now, and what looks cleared."""
    if "never marked" not in wrong:
        return ""
    lid = int(wrong.split()[1].rstrip(":"))
    now = [str(c.violation.category) for c in state.findings() if c.violation.ledger_id == lid]
    cleared = [f"{r.was.violation.category} by {r.resolved_by}" for r in state.resolved()
               if r.was.violation.ledger_id == lid]
    return f"; the state holds {now or 'nothing'} of it; cleared: {cleared or 'nothing'}"


def _keys(state: CurrentState) -> set[tuple[str, int]]:
    return {(str(c.violation.category), c.violation.ledger_id) for c in state.findings()}


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
    logging.getLogger("scrutiny.findings").setLevel(logging.ERROR)  # every finding is in the figures below
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
    for wrong in result.handoff_wrong[:20]:
        print("HAND-OFF WRONG", wrong)
    return 0 if (not result.false_alarms and result.fault_found and not result.fault_report_extra
                 and not result.handoff_wrong) else 1


if __name__ == "__main__":
    sys.exit(main())
