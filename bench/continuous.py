"""Continuous scrutiny: how long a silent loss goes unseen, and what watching costs against a full run.

A live cluster on a private ZooKeeper: `--ledgers` closed ledgers (E3, WQ2, AQ2) on 9 synthetic bookies
(agents on changing holdings that emit what a DbLedgerStorage agent emits), plus a DbLedgerStorage bookie
with real RocksDB indexes and entry logs (one log per ledger of its own); an auditor leading in continuous
mode (no periodic run), with BookKeeper's write-cache lag (`write_cache_grace_seconds` 10). Measured:
- time to detect: `--per-class` losses of each class, each on its own ledger, from the moment of the loss
  to its finding on /api/v1/current and on /metrics (scrutiny_violations): p50, p99, max;
- steady cost: churn (creates, closes, deletes collected later, re-replications that copy first) at an
  accelerated rate; ZooKeeper requests (the server's own count), agent index entries read and this
  process's CPU per change, against the election's full run measured in the same process: what an hour
  at 1% of the ledgers changing would cost, as a share of one full run.

    python -m bench.continuous [--ledgers 100000 --per-class 50 --resets 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from kazoo.client import KazooClient

from bench.common import table
from scrutiny import entrylog
from scrutiny.agent import BookieAgent
from scrutiny.auditor import Auditor
from scrutiny.auditor.sinks import PrometheusSink
from scrutiny.config import AuditorSettings, MetricsSettings, ScanSettings
from scrutiny.entrysources import DbLedgerStorageSource
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment
from scrutiny.scan.engines import LocalEngine
from scrutiny.testing import store_on
from scrutiny.testing.churn import MutableHoldings, share
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.dbledgerstorage import EntryLog, LiveBookie
from scrutiny.testing.localzk import LocalZooKeeper, packets_received

BOOKIES = [f"127.0.3.{n}:3181" for n in range(1, 10)]
LIVE = "127.0.3.20:3181"
EMPTY = "127.0.3.21:3181"  # a bookie that never gets the entries a re-replication gives it
ENTRIES = 30
CATEGORY = "LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY"


def md(lid: int, ensemble: tuple[str, ...]) -> LedgerMetadata:
    return LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, ENTRIES - 1, ENTRIES * 100, (Segment(0, ensemble),))


class Bench:
    def __init__(self, ledgers: int, per_class: int, workdir: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.zk = LocalZooKeeper(heap="2g")
        self.zk.start()
        self.client = KazooClient(hosts=self.zk.hosts, timeout=20)
        self.client.start(timeout=30)
        root = "/bench/ledgers"
        self.uri = f"zk+hierarchical://{self.zk.hosts}{root}"
        self.writer = ClusterWriter(self.client, root)
        self.writer.init_cluster()
        self.holdings = {b: MutableHoldings() for b in [*BOOKIES, EMPTY]}
        self.ledgers: dict[int, LedgerMetadata] = {}
        for lid in range(ledgers):
            self.ledgers[lid] = md(lid, tuple(self.rng.sample(BOOKIES, 3)))
        self.live_ids = list(range(ledgers, ledgers + per_class))  # one entry log each, on the live bookie
        for lid in self.live_ids:
            self.ledgers[lid] = md(lid, (LIVE, *self.rng.sample(BOOKIES, 2)))
        self.writer.write_ledgers(self.ledgers.values(), batch=1000, in_flight=8)
        for m in self.ledgers.values():
            for b in m.bookies - {LIVE}:
                self.holdings[b].put(m.ledger_id, share(m, b))
        self.path = workdir / "live"
        self.live = LiveBookie(self.path)
        for log_id, lid in enumerate(self.live_ids, start=1):
            log = EntryLog(self.path, log_id)
            m = self.ledgers[lid]
            self.live.write(lid, {int(e): entrylog.package_entry(lid, int(e), int(e) - 1, 0, b"p" * 64, "CRC32C")
                                  for e in share(m, LIVE)}, log)
            log.finish()
        self.live.flush()
        registry = store_on(self.client, self.uri)
        self.agents = {b: BookieAgent(h, bind="127.0.0.1:0", workers=4, watch_interval_seconds=1.0)
                       for b, h in self.holdings.items()}
        self.agents[LIVE] = BookieAgent(DbLedgerStorageSource([self.path], workdir / "scratch"), bind="127.0.0.1:0",
                                        watch_interval_seconds=1.0)
        for b, a in self.agents.items():
            a.start()
            a.register(registry, b, f"127.0.0.1:{a.port}")
            self.writer.register_bookie(BookieRegistration(b, False))
        token = workdir / "token"
        token.write_text("t")
        scan = ScanSettings(metadata_service_uri=self.uri, engine="local", placement_policy="none",
                            write_cache_grace_seconds=10, recheck_delay=5, orphan_check=False, blast_radius=False)
        settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=str(workdir / "reports"), token_file=str(token),
                                   full_interval_seconds=0, underreplication_interval_seconds=0)
        self.auditor = Auditor(scan, settings, metrics=MetricsSettings(listen="127.0.0.1:0"), engine=LocalEngine())
        self.next_id = ledgers + per_class
        self.process = psutil.Process()
        self.touched: set[int] = set()  # ledgers a loss or a reset was aimed at: the churn leaves them alone

    # -- what is measured ----------------------------------------------------------------------

    def cost(self) -> dict[str, float]:
        answers = sum(s.value for a in self.agents.values() for m in a.servicer.metrics.answers.collect()
                      for s in m.samples if s.name.endswith("_total"))
        names = {t.native_id: t.name for t in threading.enumerate()}
        agents = other = 0.0
        for t in self.process.threads():  # the agents' threads (on bookie hosts in a real cluster) apart
            name = names.get(t.id, "")
            if name.startswith(("agent", "metrics-http")):
                agents += t.user_time + t.system_time
            else:
                other += t.user_time + t.system_time
        return {"zk_requests": packets_received(self.zk.port), "agent_ledger_answers": answers,
                "agents_cpu_s": agents, "auditor_cpu_s": other}

    def base(self) -> str:
        port = next(s for s in self.auditor.sinks if isinstance(s, PrometheusSink)).endpoint.port
        return f"http://127.0.0.1:{port}"

    def found(self) -> set[int]:
        with urllib.request.urlopen(f"{self.base()}/api/v1/current?order=newest&limit=10000", timeout=30) as r:
            doc = json.load(r)
        return {v["ledger_id"] for v in doc["violations"] if v["category"] == CATEGORY}

    def gauge(self) -> float:
        with urllib.request.urlopen(f"{self.base()}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f'scrutiny_violations{{category="{CATEGORY}"}}'):
                    return float(line.split()[-1])
        return 0.0

    # -- the cluster changing -------------------------------------------------------------------

    def churn_once(self) -> None:
        """A change BookKeeper makes: a ledger written and closed, one deleted (collected later), or one
        re-replicated after copying."""
        op = self.rng.random()
        if op < 0.4:
            lid, self.next_id = self.next_id, self.next_id + 1
            m = md(lid, tuple(self.rng.sample(BOOKIES, 3)))
            self.writer.write_ledgers([LedgerMetadata(lid, LedgerState.OPEN, 3, 2, 2, -1, 0, m.segments)])
            for b in m.bookies:
                self.holdings[b].put(lid, share(m, b))
            self.writer.update_ledger(m)
            self.ledgers[lid] = m
        elif op < 0.7:
            lid = self.rng.choice(list(self.plain()))
            m = self.ledgers.pop(lid)
            self.writer.delete_ledger(lid)
            self.collect_later(lid, m.bookies)
        else:
            lid = self.rng.choice(list(self.plain()))
            old = self.ledgers[lid]
            gone = self.rng.choice(sorted(old.bookies))
            new = self.rng.choice([b for b in BOOKIES if b not in old.bookies])
            m = md(lid, tuple(new if b == gone else b for b in old.segments[0].ensemble))
            self.holdings[new].put(lid, share(m, new))
            self.writer.update_ledger(m)
            self.ledgers[lid] = m
            self.collect_later(lid, {gone})

    def collect_later(self, lid: int, bookies: Any) -> None:
        """The bookies' garbage collector, a little after the metadata changed."""
        def collect() -> None:
            for b in bookies:
                self.holdings[b].drop(lid)

        threading.Timer(2.0, collect).start()

    def plain(self) -> list[int]:
        return [lid for lid in list(self.ledgers)[:5000] if lid not in self.touched]

    # -- the losses ----------------------------------------------------------------------------

    def lose(self, kind: str, i: int) -> list[int]:
        """One silent loss of this kind; the ledgers it puts below their ack quorum."""
        if kind == "entry log gone (DbLedgerStorage, apache/bookkeeper #4607)":
            entrylog.log_path(self.path, i + 1).unlink()
            return [self.live_ids[i]]
        lid = self.rng.choice([x for x in self.plain() if x not in self.live_ids])
        self.touched.add(lid)
        m = self.ledgers[lid]
        if kind == "ledger gone from a bookie's index":
            self.holdings[self.rng.choice(sorted(m.bookies))].drop(lid)
        else:  # re-replicated to a bookie that never got the entries
            gone = self.rng.choice(sorted(m.bookies))
            moved = md(lid, tuple(EMPTY if b == gone else b for b in m.segments[0].ensemble))
            self.writer.update_ledger(moved)
            self.ledgers[lid] = moved
        return [lid]


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def run(ledgers: int, per_class: int, resets: int, churn_seconds: float, churn_rate: float,
        seed: int = 5) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(ledgers, per_class, Path(tmp), seed)
        try:
            before = b.cost()
            t0 = time.monotonic()
            b.auditor.start()
            while "full" not in b.auditor.last:  # the election's full run: the baseline, measured
                time.sleep(0.5)
            full_s = time.monotonic() - t0
            full = {k: v - before[k] for k, v in b.cost().items()}
            time.sleep(3)
            # steady churn, continuous mode watching
            idle0 = b.cost()
            time.sleep(churn_seconds / 3)
            idle = {k: (v - idle0[k]) / (churn_seconds / 3) for k, v in b.cost().items()}  # per second, no change
            c0, changes = b.cost(), 0
            end = time.monotonic() + churn_seconds
            while time.monotonic() < end:
                b.churn_once()
                changes += 1
                time.sleep(1 / churn_rate)
            time.sleep(15)  # the last changes' looks (write-cache grace, re-check delay)
            window = churn_seconds + 15
            spent = {k: v - c0[k] - idle[k] * window for k, v in b.cost().items()}
            per_change = {k: max(v, 0.0) / changes for k, v in spent.items()}
            hourly = 0.01 * len(b.ledgers)
            cost_rows = [{"what": k, "full run": full[k], "per change": per_change[k],
                          "idle per hour": idle[k] * 3600, "an hour at 1%/h": per_change[k] * hourly + idle[k] * 3600,
                          "share of a full run": (per_change[k] * hourly + idle[k] * 3600) / max(full[k], 1e-9)}
                         for k in ("zk_requests", "agent_ledger_answers", "agents_cpu_s", "auditor_cpu_s")]
            cost_rows.append({"what": "full run seconds", "full run": full_s})
            # the losses, interleaved by class
            kinds = ["ledger gone from a bookie's index", "entry log gone (DbLedgerStorage, apache/bookkeeper #4607)",
                     "re-replicated to a bookie without the entries"]
            pending: dict[int, tuple[str, float]] = {}
            api: dict[str, list[float]] = {k: [] for k in kinds}
            metric: dict[str, list[float]] = {k: [] for k in kinds}
            baseline_gauge = b.gauge()
            seen: list[tuple[str, float]] = []
            for i in range(per_class):
                for kind in kinds:
                    for lid in b.lose(kind, i):
                        pending[lid] = (kind, time.monotonic())
                    time.sleep(0.3)
                    _collect(b, pending, api, metric, seen, baseline_gauge)
            deadline = time.monotonic() + 180
            while (pending or sum(map(len, metric.values())) < len(seen)) and time.monotonic() < deadline:
                time.sleep(0.25)
                _collect(b, pending, api, metric, seen, baseline_gauge)
            rows = [{"loss": k, "injected": per_class, "found": len(api[k]),
                     "api p50 s": percentile(api[k], 50), "api p99 s": percentile(api[k], 99),
                     "api max s": max(api[k], default=float("nan")),
                     "metrics p50 s": percentile(metric[k], 50), "metrics p99 s": percentile(metric[k], 99)}
                    for k in kinds]
            rows += _resets(b, resets)
            return rows, cost_rows
        finally:
            b.auditor.stop()
            for a in b.agents.values():
                a.stop(grace=0)
            b.live.close()
            b.client.stop()
            b.zk.close()


def _collect(b: Bench, pending: dict[int, tuple[str, float]], api: dict[str, list[float]],
             metric: dict[str, list[float]], seen: list[tuple[str, float]], baseline_gauge: float) -> None:
    """One look at the API and at /metrics: each loss's time to its finding there."""
    now = time.monotonic()
    for lid in sorted(b.found() & pending.keys(), key=lambda x: pending[x][1]):
        kind, at = pending.pop(lid)
        api[kind].append(now - at)
        seen.append((kind, at))
    counted = int(b.gauge() - baseline_gauge)
    done = sum(len(v) for v in metric.values())
    for kind, at in seen[done:counted]:  # the gauge counts the findings in the order they were made
        metric[kind].append(now - at)


def _resets(b: Bench, resets: int) -> list[dict[str, Any]]:
    """A bookie back empty: every ledger it holds below AQ at once; found by one look at the bookie's ledgers."""
    times = []
    for n in range(resets):
        bookie = BOOKIES[n]
        held = [lid for lid, m in b.ledgers.items() if bookie in m.bookies and lid not in b.touched]
        sample = set(random.Random(n).sample(held, min(20, len(held))))
        t0 = time.monotonic()
        b.holdings[bookie].wipe()
        while time.monotonic() - t0 < 600 and not sample <= {c.violation.ledger_id
                                                              for c in b.auditor.current.findings()}:
            time.sleep(0.5)
        times.append(time.monotonic() - t0)
        for lid in held:  # restored, and looked at again so that the next reset starts clean
            b.holdings[bookie].put(lid, share(b.ledgers[lid], bookie))
        b.auditor.continuous._look_at_bookie(bookie, "restored")  # type: ignore[union-attr]
        b.touched |= set(held)
    return [{"loss": f"bookie back empty ({len(held):,} ledgers each)", "injected": resets, "found": len(times),
             "api p50 s": statistics.median(times) if times else float("nan"),
             "api max s": max(times, default=float("nan"))}] if resets else []


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=100_000)
    p.add_argument("--per-class", type=int, default=50)
    p.add_argument("--resets", type=int, default=3)
    p.add_argument("--churn-seconds", type=float, default=60)
    p.add_argument("--churn-rate", type=float, default=5, help="changes per second during the churn window")
    a = p.parse_args()
    rows, cost = run(a.ledgers, a.per_class, a.resets, a.churn_seconds, a.churn_rate)
    print(f"## time to detect ({a.ledgers:,} ledgers)\n")
    print(table(rows) + "\n")
    print("## steady cost against one full run (same process, same cluster)\n")
    print(table(cost))


if __name__ == "__main__":
    main()
