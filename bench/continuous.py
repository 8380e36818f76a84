"""Continuous scrutiny: how long a silent loss goes unseen, and what watching costs against a full run.

A live cluster on a private ZooKeeper: `--ledgers` closed ledgers (E3, WQ2, AQ2, 30 entries) on 9 bookies
whose agents serve changing synthetic holdings (in this process; they emit what a DbLedgerStorage agent
emits) and one DbLedgerStorage bookie with real RocksDB indexes, its share of the ledgers as a bookie of
that cluster has it, served by a `scrutiny bookie-agent` process (looking every 5 s, the default); five
fifty small bookies (`--small-ledgers` each) for the bookie-back-empty class; the auditor a `scrutiny auditor`
process with BookKeeper's write-cache lag (`write_cache_grace_seconds` 10) and no periodic run.

Measured, in this order:
1. without continuous mode (the auditor's off, the DbLedgerStorage agent not watching its bookie): idle
   for `--idle-seconds`; then, for each of `--hourly-shares` (1% and 10% of the ledgers an hour), that
   churn for `--churn-seconds` (creates, closes, deletes, re-replications that copy first; on every bookie,
   the DbLedgerStorage one too; what a bookie no longer needs is deleted at its garbage collector's next pass,
   every `--gc-wait-seconds`); then one full run (rescan), its cost;
2. with continuous mode on (the default; the agent restarted, watching every 5 s): the election's full
   run and its cost; idle for `--idle-seconds`; the same churns for `--churn-seconds` each;
3. time to detect: `--per-class` losses of each class, each on its own ledger, from the moment of the loss
   to its finding on /api/v1/current and on /metrics (scrutiny_violations): p50, p99, max.
Costs: ZooKeeper's requests (the server's own count, every session's pings included, the cluster's own
writes not) and its CPU, the DbLedgerStorage agent's CPU, the synthetic agents' answers, the auditor
process's CPU. An hour at a share of the ledgers changing is its churn window per hour (made at that
rate); what continuous mode costs is that hour with it on less the same hour with it off (the cluster's
own churn, ZooKeeper's and the processes' idle cost are in both), against one full run.

    python -m bench.continuous [--ledgers 1000000 --per-class 50 --hourly-shares 0.01,0.1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from bench.common import table
from bench.harness import BenchCluster
from scrutiny import entrylog
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment
from scrutiny.testing import processes
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.holdings import MutableHoldings, share
from scrutiny.testing.localzk import free_port, packets_received
from scrutiny.testing.processes import stop

SYNTHETIC = [f"127.0.3.{n}:3181" for n in range(1, 10)]
LIVE = "127.0.3.20:3181"  # the DbLedgerStorage bookie
EMPTY = "127.0.3.21:3181"  # a bookie that never gets the entries a re-replication gives it
SMALL = [f"127.0.4.{n}:3181" for n in range(1, 51)]  # bookies with few ledgers: each wiped once
ENTRIES = 30
BULK_LOG = 0x7FFF  # the live bookie's bulk ledgers: indexed, their entry log not on disk (never read here)
CATEGORY = "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"
# a bookie's garbage collector's pass: BookKeeper's gcWaitTime is 600 s in code, 900 s in its bk_server.conf; passes
# ten times as often send its agent's feed ten times the messages (each pass's deletes are one message)
GC_WAIT_SECONDS = 60.0
KINDS = ("ledger gone from a synthetic bookie's index", "ledger gone from a DbLedgerStorage bookie's index",
         "entry log gone (DbLedgerStorage, apache/bookkeeper #4607)", "re-replicated to a bookie without the entries",
         "a small bookie back empty (all its ledgers found)")


def md(lid: int, ensemble: tuple[str, ...], state: LedgerState = LedgerState.CLOSED) -> LedgerMetadata:
    closed = state is LedgerState.CLOSED
    return LedgerMetadata(lid, state, 3, 2, 2, ENTRIES - 1 if closed else -1, ENTRIES * 100 if closed else 0,
                          (Segment(0, ensemble),))


def get(url: str, token: str = "") -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read()
    return json.loads(body) if r.headers.get_content_type() == "application/json" else body.decode()


def say(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.25)


class Cluster(BenchCluster):
    """ZooKeeper, the ledgers, the bookies and their agents: everything but the auditor."""

    def __init__(self, ledgers: int, per_class: int, small_ledgers: int, workdir: Path, seed: int,
                 gc_wait_seconds: float = GC_WAIT_SECONDS) -> None:
        super().__init__(heap="4g" if ledgers > 300_000 else "2g")
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.own_requests = 0  # what the cluster itself asks of ZooKeeper (its writes): not scrutiny's cost
        send = self.client._call

        def counted(request: Any, async_object: Any) -> Any:
            self.own_requests += 1
            return send(request, async_object)

        self.client._call = counted
        self.writer.init_cluster()
        self.holdings = {b: MutableHoldings() for b in [*SYNTHETIC, *SMALL, EMPTY]}
        self.live_lock = threading.Lock()  # the bookie's own writes (the churn's, the losses')
        self.path = workdir / "live"
        self.live = LiveBookie(self.path)
        self.ledgers: dict[int, LedgerMetadata] = {}
        big = [*SYNTHETIC, LIVE]
        for lid in range(ledgers):
            self.ledgers[lid] = md(lid, tuple(self.rng.sample(big, 3)))
        self.small_of: dict[str, list[int]] = {}
        lid = ledgers
        for b in SMALL:
            self.small_of[b] = list(range(lid, lid + small_ledgers))
            for x in self.small_of[b]:
                self.ledgers[x] = md(x, (b, *self.rng.sample(SYNTHETIC, 2)))
            lid += small_ledgers
        self.log_ids = list(range(lid, lid + per_class))  # one finished entry log each on the live bookie
        for x in self.log_ids:
            self.ledgers[x] = md(x, (LIVE, *self.rng.sample(SYNTHETIC, 2)))
        self.next_id = lid + per_class
        t0 = time.monotonic()
        self.writer.write_ledgers(self.ledgers.values(), batch=1000, in_flight=8)
        for m in self.ledgers.values():
            for b in m.bookies:
                if b == LIVE:
                    if m.ledger_id not in self.log_ids:
                        self.live.add(m.ledger_id, share(m, b).tolist(), BULK_LOG)
                else:
                    self.holdings[b].put(m.ledger_id, share(m, b))
        for log_id, x in enumerate(self.log_ids, start=1):
            log = EntryLog(self.path, log_id)
            m = self.ledgers[x]
            self.live.write(x, {int(e): entrylog.package_entry(x, int(e), int(e) - 1, 0, b"p" * 64, "CRC32C")
                                for e in share(m, LIVE)}, log)
            log.finish()
        self.live.flush()
        self.built_s = time.monotonic() - t0
        self.serve(self.holdings)
        self.live_agent: subprocess.Popen[str] | None = None
        self.start_live_agent(watching=False)
        self.writer.register_bookie(BookieRegistration(LIVE, False))
        self.touched: set[int] = set()  # ledgers a loss was aimed at: the churn leaves them alone
        self.plain = [x for x in range(ledgers) if x not in self.log_ids]
        self.gc_wait = gc_wait_seconds
        self.collectible: dict[str, list[int]] = defaultdict(list)  # by bookie: for its garbage collector's next pass
        self.gc_lock = threading.Lock()
        self.gc_stop = threading.Event()
        self.gc = threading.Thread(target=self.garbage_collectors, name="bookies-gc", daemon=True)
        self.gc.start()

    def start_live_agent(self, watching: bool) -> None:
        """The DbLedgerStorage bookie's agent (again), looking at its bookie every 5 s or never."""
        if self.live_agent is not None:
            stop(self.live_agent)
        say(f"starting the DbLedgerStorage bookie's agent ({'' if watching else 'not '}watching)")
        self.live_agent = processes.spawn(
            [sys.executable, "-m", "scrutiny.cli", "bookie-agent", "--bookie-id", LIVE, "--source", "dbledgerstorage",
             "--ledger-dir", str(self.path), "--scratch-dir", str(self.workdir / "scratch"), "--bind", "127.0.0.1:0",
             "--metadata-service-uri", self.uri, "--watch-interval-seconds", "5" if watching else "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.live_agent.stdout.readline()  # type: ignore[union-attr]

    def close(self) -> None:
        self.gc_stop.set()
        self.gc.join()
        if self.live_agent is not None:
            stop(self.live_agent)
        self.live.close()
        super().close()

    # -- what is measured ----------------------------------------------------------------------

    def cost(self, auditor: psutil.Process | None) -> dict[str, float]:
        def cpu(p: psutil.Process | None) -> float:
            if p is None:
                return 0.0
            t = p.cpu_times()
            return t.user + t.system + t.children_user + t.children_system

        answers = sum(s.value for a in self.agents.values() for m in a.servicer.metrics.answers.collect()
                      for s in m.samples if s.name.endswith("_total"))
        return {"zk_requests": packets_received(self.zk.port) - self.own_requests,
                "zk_cpu_s": cpu(psutil.Process(self.zk.pid)),
                "dbledgerstorage_agent_cpu_s": cpu(psutil.Process(self.live_agent.pid) if self.live_agent else None),
                "synthetic_agent_answers": answers, "auditor_cpu_s": cpu(auditor)}

    # -- the cluster changing -------------------------------------------------------------------

    def put(self, b: str, m: LedgerMetadata) -> None:
        if b == LIVE:
            with self.live_lock:
                self.live.add(m.ledger_id, share(m, b).tolist(), BULK_LOG)
        else:
            self.holdings[b].put(m.ledger_id, share(m, b))

    def collect_later(self, lid: int, bookies: Any) -> None:
        """The ledger deleted, or moved off these bookies: each deletes it at its garbage collector's next pass."""
        with self.gc_lock:
            for b in bookies:
                self.collectible[b].append(lid)

    def garbage_collectors(self) -> None:
        """Each bookie's garbage collector: a pass every `gc_wait` seconds (the bookies' passes spread evenly over
        it), deleting at once every ledger it no longer needs, as BookKeeper's GarbageCollectorThread does every
        gcWaitTime (the live bookie's index loses them, then their locations: a checkpoint's cleanup)."""
        big = [*SYNTHETIC, LIVE]
        start = time.monotonic()
        for n in itertools.count(1):
            if self.gc_stop.wait(max(0.0, start + n * self.gc_wait / len(big) - time.monotonic())):
                return
            b = big[n % len(big)]
            with self.gc_lock:
                ids = self.collectible.pop(b, [])
            if b == LIVE:
                with self.live_lock:
                    for lid in ids:
                        self.live.delete(lid)
                        self.live.cleanup(lid)
            else:
                for lid in ids:
                    self.holdings[b].drop(lid)

    def churn_once(self) -> None:
        """A change BookKeeper makes: a ledger written and closed, one deleted (collected later), or one
        re-replicated after copying."""
        op = self.rng.random()
        big = [*SYNTHETIC, LIVE]
        if op < 0.4:
            lid, self.next_id = self.next_id, self.next_id + 1
            m = md(lid, tuple(self.rng.sample(big, 3)))
            self.writer.write_ledgers([md(lid, m.segments[0].ensemble, LedgerState.OPEN)])
            for b in m.bookies:
                self.put(b, m)
            self.writer.update_ledger(m)
            self.ledgers[lid] = m
            self.plain.append(lid)
            return
        lid = self.pick()
        old = self.ledgers[lid]
        if op < 0.7:
            del self.ledgers[lid]
            self.writer.delete_ledger(lid)
            self.collect_later(lid, old.bookies)
        else:
            gone = self.rng.choice(sorted(old.bookies))
            new = self.rng.choice([b for b in big if b not in old.bookies])
            m = md(lid, tuple(new if b == gone else b for b in old.segments[0].ensemble))
            self.put(new, m)
            self.writer.update_ledger(m)
            self.ledgers[lid] = m
            self.collect_later(lid, {gone})

    def pick(self, on: str = "") -> int:
        """A ledger nothing else was aimed at (on bookie `on` if given)."""
        while True:
            lid = self.plain[self.rng.randrange(len(self.plain))]
            m = self.ledgers.get(lid)
            if m is not None and lid not in self.touched and (not on or on in m.bookies):
                self.touched.add(lid)
                return lid

    # -- the losses ----------------------------------------------------------------------------

    def lose(self, kind: str, i: int) -> list[int]:
        """One silent loss of this kind; the ledgers it puts below their ack quorum."""
        if kind == KINDS[2]:
            entrylog.log_path(self.path, i + 1).unlink()
            self.touched.add(self.log_ids[i])
            return [self.log_ids[i]]
        if kind == KINDS[4]:
            self.holdings[SMALL[i]].wipe()
            self.touched.update(self.small_of[SMALL[i]])
            return list(self.small_of[SMALL[i]])
        if kind == KINDS[1]:
            lid = self.pick(on=LIVE)
            with self.live_lock:
                self.live.delete(lid)
            return [lid]
        lid = self.pick()
        m = self.ledgers[lid]
        if kind == KINDS[0]:
            self.holdings[self.rng.choice(sorted(m.bookies - {LIVE}))].drop(lid)
        else:  # re-replicated to a bookie that never got the entries
            gone = self.rng.choice(sorted(m.bookies))
            moved = md(lid, tuple(EMPTY if b == gone else b for b in m.segments[0].ensemble))
            self.writer.update_ledger(moved)
            self.ledgers[lid] = moved
        return [lid]


class AuditorProcess:
    """`scrutiny auditor` on the bench's cluster, with continuous mode on or off."""

    def __init__(self, cluster: Any, continuous: bool, workdir: Path, scan: dict[str, Any] | None = None,
                 auditor: dict[str, Any] | None = None, launcher: tuple[str, ...] = ("-m", "scrutiny.cli")) -> None:
        """`cluster`: what has the `uri`; `scan` and `auditor`: settings besides the bench's own; `launcher`:
        how Python is told to run scrutiny's command line."""
        self.token = "bench"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "token").write_text(self.token)
        self.port = free_port()
        config = {"metadata_service_uri": cluster.uri, "engine": "local", "placement_policy": "none",
                  "write_cache_grace_seconds": 10, "recheck_delay": 5, "orphan_check": False,
                  "blast_radius": False,
                  "auditor": {"listen": "127.0.0.1:0", "reports_dir": str(workdir / "reports"),
                              "token_file": str(workdir / "token"), "full_interval_seconds": 0,
                              "underreplication_interval_seconds": 0, "continuous": continuous,
                              **(auditor or {})},
                  "metrics": {"listen": f"127.0.0.1:{self.port}"}, **(scan or {})}
        path = workdir / f"auditor-{continuous}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.proc = processes.spawn([sys.executable, *launcher, "auditor", "--config", str(path),
                                      "--log-level", "WARNING"], stdout=subprocess.PIPE,
                                     stderr=open(workdir / f"auditor-{continuous}.log", "w"), text=True)  # noqa: SIM115
        say("starting an auditor")
        self.proc.stdout.readline()  # type: ignore[union-attr]
        self.ps = psutil.Process(self.proc.pid)
        self.base = f"http://127.0.0.1:{self.port}"
        wait(lambda: get(f"{self.base}/api/v1/status")["role"] == "leader", 60, "the auditor leads")

    def runs(self, kind: str) -> list[str]:
        return [r["run_id"] for r in get(f"{self.base}/api/v1/status")["last_runs"]
                if r["kind"] == kind and r["complete"]]

    def full_run(self, kind: str, timeout: float) -> float:
        """Wait for the next complete whole-cluster run of this kind (a rescan is asked for; a full run is
        the election's, which a small cluster may have finished already); its seconds."""
        before = self.runs(kind) if kind == "rescan" else []
        t0 = time.monotonic()
        if kind == "rescan":
            req = urllib.request.Request(f"{self.base}/api/v1/rescan", data=b'{"all_ledgers": true}', method="POST",
                                         headers={"Authorization": f"Bearer {self.token}"})
            urllib.request.urlopen(req, timeout=60).close()
        wait(lambda: self.runs(kind) != before, timeout, f"a {kind} run")
        return time.monotonic() - t0

    def found(self) -> set[int]:
        doc = get(f"{self.base}/api/v1/current?order=newest&limit=10000")
        return {v["ledger_id"] for v in doc["violations"] if v["category"] == CATEGORY}

    def gauge(self) -> float:
        for line in get(f"{self.base}/metrics").splitlines():
            if line.startswith(f'scrutiny_violations{{category="{CATEGORY}"}}'):
                return float(line.split()[-1])
        return 0.0

    def close(self) -> None:
        stop(self.proc, grace=30)


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def window(cluster: Cluster, auditor: AuditorProcess, seconds: float,
           step: Callable[[], None] | None = None, rate: float = 0.0) -> dict[str, float]:
    """What the window cost, per hour; `step` called `rate` times a second meanwhile."""
    c0, t0, n = cluster.cost(auditor.ps), time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        if step is None:
            time.sleep(min(5.0, seconds))
            continue
        step()
        n += 1
        time.sleep(max(0.0, t0 + n / rate - time.monotonic()))
    took = time.monotonic() - t0
    return {k: (v - c0[k]) * 3600 / took for k, v in cluster.cost(auditor.ps).items()} | {"changes": n}


def spent(cluster: Cluster, auditor: AuditorProcess, fn: Callable[[], float]) -> dict[str, float]:
    c0 = cluster.cost(auditor.ps)
    took = fn()
    return {k: v - c0[k] for k, v in cluster.cost(auditor.ps).items()} | {"seconds": took}


def run(ledgers: int, per_class: int, small_ledgers: int, idle_s: float, churn_s: float,
        shares: list[float], gc_wait_s: float = GC_WAIT_SECONDS, seed: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cluster = Cluster(ledgers, per_class, small_ledgers, work, seed, gc_wait_s)
        say(f"the cluster: {len(cluster.ledgers):,} ledgers in {cluster.built_s:.0f} s")
        out: dict[str, Any] = {"ledgers": len(cluster.ledgers), "live_bookie_ledgers": sum(
            LIVE in m.bookies for m in cluster.ledgers.values()), "build_s": cluster.built_s}
        try:
            off = AuditorProcess(cluster, False, work / "off")
            try:
                say("an auditor, continuous mode off: idle")
                out["idle_off"] = window(cluster, off, idle_s)
                for hourly in shares:
                    say(f"... the churn, {hourly:.0%} of the ledgers an hour")
                    out[f"churn_off_{hourly}"] = window(cluster, off, churn_s, cluster.churn_once,
                                                       hourly * ledgers / 3600)
                say("... its full run")
                out["full_off"] = spent(cluster, off, lambda: off.full_run("rescan", 3600))
            finally:
                off.close()
            cluster.start_live_agent(watching=True)
            on = AuditorProcess(cluster, True, work / "on")
            try:
                say("an auditor, continuous mode on: its election's full run")
                out["full_on"] = spent(cluster, on, lambda: on.full_run("full", 3600))
                say("... idle")
                time.sleep(5)
                out["idle_on"] = window(cluster, on, idle_s)
                for hourly in shares:
                    say(f"... the churn, {hourly:.0%} of the ledgers an hour")
                    out[f"churn_on_{hourly}"] = window(cluster, on, churn_s, cluster.churn_once,
                                                       hourly * ledgers / 3600)
                time.sleep(15)  # the last changes' looks (write-cache grace, re-check delay)
                say("... the losses")
                out["detect"] = detect(cluster, on, per_class)
                say("... a bookie with its full share back empty")
                out["detect"].append(big_reset(cluster, on))
                out["missed"] = [line for line in get(f"{on.base}/metrics").splitlines()
                                 if line.startswith("scrutiny_continuous_missed_total")]
            finally:
                on.close()
        finally:
            cluster.close()
        return out


def detect(cluster: Cluster, auditor: AuditorProcess, per_class: int) -> list[dict[str, Any]]:
    """The losses, interleaved by class; the time to each one's finding on the API and on /metrics (a
    small bookie back empty: to the finding of its last ledger)."""
    api: dict[str, list[float]] = {k: [] for k in KINDS}
    metric: dict[str, list[float]] = {k: [] for k in KINDS}
    pending: dict[int, tuple[str, float]] = {}
    seen: list[tuple[str, float]] = []
    baseline = auditor.gauge()
    wiped: dict[str, float] = {}  # small bookie -> when

    def collect() -> None:
        now = time.monotonic()
        for lid in sorted(auditor.found() & pending.keys(), key=lambda x: pending[x][1]):
            kind, at = pending.pop(lid)
            seen.append((kind, at))
            if kind != KINDS[4]:
                api[kind].append(now - at)
        for b, at in list(wiped.items()):
            if not set(cluster.small_of[b]) & pending.keys():
                api[KINDS[4]].append(now - at)
                del wiped[b]
        counted = int(auditor.gauge() - baseline)  # nothing clears meanwhile: the gauge only grows
        for kind, at in seen[sum(len(v) for v in metric.values()):counted]:  # in the order they were made
            metric[kind].append(now - at)

    for i in range(per_class):
        for kind in KINDS:
            at = time.monotonic()
            for lid in cluster.lose(kind, i):
                pending[lid] = (kind, at)
            if kind == KINDS[4]:
                wiped[SMALL[i]] = at
            time.sleep(0.3)
            collect()
    deadline = time.monotonic() + 600
    while (pending or wiped) and time.monotonic() < deadline:
        time.sleep(0.25)
        collect()
    return [{"loss": k, "injected": per_class, "found": len(api[k]), "api p50 s": percentile(api[k], 50),
             "api p99 s": percentile(api[k], 99), "api max s": max(api[k], default=float("nan")),
             "metrics p50 s": percentile(metric[k], 50), "metrics p99 s": percentile(metric[k], 99)}
            for k in KINDS]


def big_reset(cluster: Cluster, auditor: AuditorProcess) -> dict[str, Any]:
    """A bookie with its full share back empty: more ledgers at once than continuous_max_ledgers_per_second
    allows, so a full run instead (a mass event); the time to the first and to the last of a sample."""
    bookie = SYNTHETIC[0]
    held = [lid for lid, m in cluster.ledgers.items() if bookie in m.bookies]
    # a ledger a loss was aimed at already: a second loss makes it NO_REPLICA_OF_AN_ENTRY instead
    candidates = [lid for lid in held if lid not in cluster.touched]
    sample = set(random.Random(1).sample(candidates, min(200, len(candidates))))
    t0 = time.monotonic()
    cluster.holdings[bookie].wipe()
    first = last = float("nan")
    waiting = sorted(sample)
    while waiting and time.monotonic() - t0 < 3600:  # a ledger's own page: the current state holds 300,000 now
        if CATEGORY in {v["category"] for v in get(f"{auditor.base}/api/v1/ledgers/{waiting[0]}")["current"]}:
            waiting.pop(0)
            if first != first:
                first = time.monotonic() - t0
            continue
        time.sleep(1)
    if not waiting:
        last = time.monotonic() - t0
    mass = len(held) > 2000 * 10  # continuous_max_ledgers_per_second x continuous_batch_seconds (the defaults)
    how = "a mass event: a full run" if mass else "one look at its ledgers"
    return {"loss": f"a bookie back empty with {len(held):,} ledgers ({how})", "injected": 1,
            "found": int(last == last), "api p50 s": first, "api max s": last}


def cost_rows(out: dict[str, Any], shares: list[float]) -> list[dict[str, Any]]:
    """Per cost: a full run (median of the two); idle an hour with continuous mode off and on; and for each
    share of the ledgers changing an hour, what continuous mode adds to that hour (its churn window with it on
    less the same with it off, per hour), against the full run."""
    rows = []
    for k in ("zk_requests", "zk_cpu_s", "dbledgerstorage_agent_cpu_s", "synthetic_agent_answers", "auditor_cpu_s"):
        full = statistics.median([out["full_off"][k], out["full_on"][k]])
        row: dict[str, Any] = {"cost": k, "full run": full, "idle/h, off": out["idle_off"][k],
                               "idle/h, on": out["idle_on"][k]}
        for hourly in shares:
            added = out[f"churn_on_{hourly}"][k] - out[f"churn_off_{hourly}"][k]
            row[f"{hourly:.0%}/h: continuous mode's hour (on - off)"] = added
            row[f"{hourly:.0%}/h: / full run"] = added / max(full, 1e-9)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=1_000_000)
    p.add_argument("--per-class", type=int, default=50, help="at most 50 (the small bookies)")
    p.add_argument("--small-ledgers", type=int, default=20, help="ledgers on each of the 50 small bookies")
    p.add_argument("--idle-seconds", type=float, default=300)
    p.add_argument("--churn-seconds", type=float, default=300)
    p.add_argument("--hourly-shares", default="0.01,0.1", help="the churns: shares of the ledgers changed an hour")
    p.add_argument("--gc-wait-seconds", type=float, default=GC_WAIT_SECONDS,
                   help="each bookie's garbage collector's pass (BookKeeper's gcWaitTime)")
    p.add_argument("--output", help="also write the figures as JSON here")
    a = p.parse_args()
    shares = [float(x) for x in a.hourly_shares.split(",")]
    out = run(a.ledgers, a.per_class, a.small_ledgers, a.idle_seconds, a.churn_seconds, shares, a.gc_wait_seconds)
    out["churn_seconds"], out["hourly_shares"], out["gc_wait_seconds"] = a.churn_seconds, shares, a.gc_wait_seconds
    if a.output:
        Path(a.output).write_text(json.dumps(out, indent=1, default=str))
    print(f"## time to detect ({out['ledgers']:,} ledgers; the DbLedgerStorage bookie holds "
          f"{out['live_bookie_ledgers']:,})\n")
    print(table(out["detect"]) + "\n")
    print(f"## cost against a full run (full runs: {out['full_off']['seconds']:.0f} s, "
          f"{out['full_on']['seconds']:.0f} s; each churn {a.churn_seconds:.0f} s, at "
          + ", ".join(f"{out[f'churn_on_{x}']['changes'] / a.churn_seconds:.2f}" for x in shares) + " changes/s)\n")
    print(table(cost_rows(out, shares)))
    print("\n" + "\n".join(out["missed"]))


if __name__ == "__main__":
    main()
