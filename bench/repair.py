"""From a silent loss to restored copies: continuous scrutiny, the hand-off to autorecovery and a replication
worker, end to end.

A cluster on a private ZooKeeper: `--ledgers` closed ledgers (E3, WQ2, AQ2, 30 entries) on 10 bookies whose
agents serve in-memory holdings (in this process); a `scrutiny auditor` process with continuous mode and
`repair: mark` at its defaults (a hand-off every 10 s, 20 marks per hand-off, 60 a minute); a replication
worker (`scrutiny.testing.replicationworker`, BookKeeper's behaviour: its checker at the cluster's
percentage, the bad share copied whole to another bookie, the ensemble changed, the ledger unmarked) looking
for marks every second, as BookKeeper's is woken by a watch.

For `auditorLedgerVerificationPercentage` 0 and 100 in turn (the auditor told the same, a new auditor each),
`--per-class` losses of each class, each on its own ledger, one every 0.5 s: a bookie's whole share of a
ledger gone (its checker reads the share's ends: repairable at both), one entry in the middle of a share gone
(repairable at 100 only; at 0 scrutiny names `recover` instead, and marks nothing); then a bookie lost for good
(its agent gone, its registration gone: `LOST_BOOKIE_RECOVERY_NOT_STARTED` once `lost_bookie_grace_period`,
10 s here, has passed), one of its own for each percentage, holding a copy of `--per-class` ledgers. For each:
the time from the loss to its finding (`detected_at`), to its mark (the journal), to the copies back (the
journal's `repaired`), or to the finding whose remedy names the command (what autorecovery cannot repair):
p50, p99, max.

    python -m bench.repair [--ledgers 1000000 --per-class 20]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import table
from bench.continuous import AuditorProcess, get, md, percentile, say, wait
from bench.harness import BenchCluster
from scrutiny.repair.plan import MARKED, REPAIRED
from scrutiny.testing.holdings import MutableHoldings, share
from scrutiny.testing.replicationworker import ReplicationWorker
from scrutiny.times import ms_of

BOOKIES = [f"127.0.5.{n}:3181" for n in range(1, 11)]
# a bookie to lose for good, per percentage; named to sort after the others, so that the worker (which copies a
# share to the first writable bookie outside the ensemble) never repairs a loss onto a bookie about to be lost
LOST = {0: "127.0.6.1:3181", 100: "127.0.6.2:3181"}
WHOLE, MIDDLE, BOOKIE = "a bookie's whole share gone", "one entry gone mid-share", "a bookie lost for good"
LOST_BOOKIE_GRACE = 10  # seconds: lost_bookie_grace_period (lostBookieRecoveryDelay is 0)


class Cluster(BenchCluster):
    def __init__(self, ledgers: int, seed: int, per_class: int) -> None:
        super().__init__(heap="4g" if ledgers > 300_000 else "1g")
        self.rng = random.Random(seed)
        self.writer.init_cluster()
        self.holdings = {b: MutableHoldings() for b in [*BOOKIES, *LOST.values()]}
        self.ledgers = {lid: md(lid, tuple(self.rng.sample(BOOKIES, 3))) for lid in range(ledgers)}
        # each bookie to lose holds a copy of `per_class` ledgers (one of their three bookies)
        self.on_lost: dict[str, list[int]] = {}
        for i, b in enumerate(LOST.values()):
            ids = list(range(i * per_class, (i + 1) * per_class))
            for lid in ids:
                self.ledgers[lid] = md(lid, (*self.ledgers[lid].segments[0].ensemble[:2], b))
            self.on_lost[b] = ids
        t0 = time.monotonic()
        self.writer.write_ledgers(self.ledgers.values(), batch=1000, in_flight=8)
        for m in self.ledgers.values():
            for b in m.bookies:
                self.holdings[b].put(m.ledger_id, share(m, b))
        self.built_s = time.monotonic() - t0
        self.serve(self.holdings)
        reserved = {lid for ids in self.on_lost.values() for lid in ids}
        self.untouched = [lid for lid in self.ledgers if lid not in reserved]
        self.rng.shuffle(self.untouched)

    def lose_bookie(self, bookie: str) -> list[int]:
        """The bookie gone for good (its disk with it): its agent stopped, its registration removed; the ledgers
        it held."""
        self.agents.pop(bookie).stop(grace=0)
        self.writer.unregister_bookie(bookie)
        del self.holdings[bookie]
        return self.on_lost[bookie]

    def lose(self, kind: str) -> int:
        lid = self.untouched.pop()
        m = self.ledgers[lid]
        b = self.rng.choice(m.segments[0].ensemble)
        self.holdings[b].drop(lid)
        if kind == MIDDLE:
            mine = share(m, b)
            self.holdings[b].put(lid, np.delete(mine, len(mine) // 2))
        return lid


def worker_loop(worker: ReplicationWorker, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        worker.run_once()


def measure(cluster: Cluster, percentage: int, per_class: int, workdir: Path,
            earlier: set[str]) -> list[dict[str, Any]]:
    """`earlier`: the full runs of the auditors before (this one inherits their summaries): its own is waited for,
    and added."""
    auditor = AuditorProcess(cluster, True, workdir, scan={"auditor_ledger_verification_percentage": percentage,
                                                           "lost_bookie_grace_period": LOST_BOOKIE_GRACE},
                             auditor={"repair": "mark"})
    stop = threading.Event()
    worker = threading.Thread(target=worker_loop, args=(ReplicationWorker(cluster.client, cluster.root,
                                                                          cluster.holdings, percentage), stop))
    try:
        say(f"percentage {percentage}: the election's full run")
        wait(lambda: bool(set(auditor.runs("full")) - earlier), 3600, "the election's full run")
        earlier.update(auditor.runs("full"))
        worker.start()
        lost: dict[int, tuple[str, int]] = {}  # ledger -> (class, when, ms)
        for _ in range(per_class):
            for kind in (WHOLE, MIDDLE):
                lost[cluster.lose(kind)] = (kind, int(time.time() * 1000))
                time.sleep(0.5)
        gone_at = int(time.time() * 1000)
        lost.update({lid: (BOOKIE, gone_at) for lid in cluster.lose_bookie(LOST[percentage])})
        found: dict[int, int] = {}
        named: dict[int, int] = {}  # found with a remedy that says autorecovery will not, and the command

        def ended() -> bool:
            doc = get(f"{auditor.base}/api/v1/current?order=newest&limit=10000")
            for v in doc["violations"]:
                if v["ledger_id"] in lost:
                    found.setdefault(v["ledger_id"], ms_of(v["detected_at"]))
                    if v["remedy"]["autorecovery"] == "no" and v["remedy"]["commands"]:
                        named.setdefault(v["ledger_id"], ms_of(v["detected_at"]))
            repaired = {h["ledger_id"] for h in get(f"{auditor.base}/api/v1/handoffs")["handoffs"]
                        if h["outcome"] == REPAIRED}
            return all(lid in repaired or lid in named for lid in lost)

        try:
            wait(ended, 600, "every loss repaired or named")
        except TimeoutError:
            say("... some losses neither repaired nor named within 600 s")
        journal = get(f"{auditor.base}/api/v1/handoffs")["handoffs"]
        marked = {h["ledger_id"]: ms_of(h["at"]) for h in journal if h["outcome"] == MARKED}
        repaired = {h["ledger_id"]: ms_of(h["at"]) for h in journal if h["outcome"] == REPAIRED}
    finally:
        stop.set()
        if worker.is_alive():
            worker.join()
        auditor.close()
    rows = []
    for kind in (WHOLE, MIDDLE, BOOKIE):
        mine = {lid: at for lid, (k, at) in lost.items() if k == kind}

        def after(when: dict[int, int], ids: dict[int, int] = mine) -> list[float]:
            return [(when[lid] - at) / 1000 for lid, at in ids.items() if lid in when]

        row: dict[str, Any] = {"percentage": percentage, "loss": kind, "injected": len(mine)}
        for stage, when in (("found", found), ("marked", marked), ("repaired", repaired), ("named", named)):
            xs = after(when)
            row[stage] = len(xs)
            if xs:
                row[f"{stage} p50 s"], row[f"{stage} p99 s"] = percentile(xs, 50), percentile(xs, 99)
        rows.append(row)
    return rows


def run(ledgers: int, per_class: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(ledgers, seed=7, per_class=per_class)
        say(f"the cluster: {len(cluster.ledgers):,} ledgers in {cluster.built_s:.0f} s")
        try:
            earlier: set[str] = set()
            return [r for pct in (0, 100) for r in measure(cluster, pct, per_class, Path(tmp) / str(pct), earlier)]
        finally:
            cluster.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=1_000_000)
    p.add_argument("--per-class", type=int, default=20)
    p.add_argument("--output", help="also write the figures as JSON here")
    a = p.parse_args()
    rows = run(a.ledgers, a.per_class)
    if a.output:
        Path(a.output).write_text(json.dumps({"ledgers": a.ledgers, "rows": rows}, indent=1))
    print(f"## from a silent loss to restored copies ({a.ledgers:,} ledgers; a hand-off every 10 s, a worker "
          "every 1 s)\n")
    print(table(rows))


if __name__ == "__main__":
    main()
