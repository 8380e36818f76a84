"""A run with a million findings: what the Spark driver holds while a lost rack is reported.

A cluster of 30 bookies on 5 racks; every ledger (E=3, WQ=2, AQ=2, 100 entries) has one bookie on
rack 0, and rack 0 is gone: its 6 bookies unregistered, without agents. So every ledger is silent at
the first look (potentially faulty), re-checked after the delay, and reported below its ack quorum
with the lost bookie's copies counted as gone: one finding per ledger. The full scan runs on Spark
`local[2]` with one agent process per surviving bookie, then the report is written to a file a finding
at a time.

Measured, for each size: the driver's RSS (this process: at the start, its peak, sampled every 0.5 s)
and Spark's JVM peak (in local mode the executors are threads of the driver's JVM), the scan's phases,
and, as the baseline in the same run, what the same findings cost held as objects
(`list(report.violations)`), which is what the driver held before findings were kept in SQLite.

    python -m bench.driver_findings --sizes 100000,1000000
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from kazoo.client import KazooClient

from bench.common import start_agents, stop_agents, table
from bench.scale import BOOKIES, RACKS, PeakRss, bookie, rack_of
from scrutiny.categories import Category
from scrutiny.checks import expected_share
from scrutiny.config import ScanSettings
from scrutiny.entrysources.synthetic import SyntheticStoreWriter
from scrutiny.metadata import BookieRegistration, LedgerMetadata, LedgerState, Segment
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import SparkEngine, spark_session
from scrutiny.testing.clusterwriter import ClusterWriter
from scrutiny.testing.localzk import LocalZooKeeper

ENTRIES = 100
LOST_RACK = 0


def lost(n: int) -> bool:
    return n % RACKS == LOST_RACK


def ledgers(count: int, seed: int = 11) -> Iterator[LedgerMetadata]:
    rng = random.Random(seed)
    by_rack = {r: [n for n in range(BOOKIES) if n % RACKS == r] for r in range(RACKS)}
    for lid in range(count):
        racks = [LOST_RACK, *rng.sample([r for r in range(RACKS) if r != LOST_RACK], 2)]
        rng.shuffle(racks)
        ens = tuple(bookie(rng.choice(by_rack[r])) for r in racks)
        yield LedgerMetadata(lid, LedgerState.CLOSED, 3, 2, 2, ENTRIES - 1, ENTRIES * 1024, (Segment(0, ens),), ctime=1)


def build(client: KazooClient, root: str, count: int, directory: Path) -> list[str]:
    """The cluster and the surviving bookies' stores; the surviving bookies."""
    w = ClusterWriter(client, root)
    w.init_cluster()
    store = SyntheticStoreWriter()

    def written() -> Iterator[LedgerMetadata]:
        for md in ledgers(count):
            for b in md.bookies:
                store.add(b, md.ledger_id, expected_share(md, b))
            yield md

    w.write_ledgers(written(), batch=1000, in_flight=8)
    w.write_racks({bookie(n): rack_of(n) for n in range(BOOKIES)}, f"{root.rsplit('/', 1)[0]}/bookies")
    alive = [bookie(n) for n in range(BOOKIES) if not lost(n)]
    for b in alive:
        w.register_bookie(BookieRegistration(b, False))
    store.write_all(directory)
    return alive


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def run_size(count: int, session: Any = None) -> dict[str, Any]:
    """One size; on the given SparkSession (left open), else on a new one."""
    row: dict[str, Any] = {"ledgers": count}
    heap = "3g" if count > 300_000 else "1g"
    with tempfile.TemporaryDirectory() as tmp, LocalZooKeeper(heap=heap) as zk:
        root = "/ledgers"
        uri = f"zk+hierarchical://{zk.hosts}{root}"
        client = KazooClient(hosts=zk.hosts, timeout=30)
        client.start()
        t0 = time.perf_counter()
        alive = build(client, root, count, Path(tmp))  # its stores are files now: what the driver holds is the run's
        row["build s"] = time.perf_counter() - t0
        agents = start_agents(alive, Path(tmp), uri, workers=2)
        try:
            owned = session is None
            session = session or spark_session("local[2]")
            settings = ScanSettings(metadata_service_uri=uri, recheck_delay=1.0, spark_master="local[2]",
                                    blast_radius=False, orphan_check=False)
            gc.collect()
            peak = PeakRss()
            t0 = time.perf_counter()
            report = ScrutinyRun(settings, SparkEngine(session=session)).execute()
            row["scan s"] = time.perf_counter() - t0
            findings = report.counts[Category.LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY]
            assert report.complete and findings == count == len(report.violations), (report.errors[:3],
                                                                                       report.counts)
            row["findings"] = findings
            for phase in ("first_pass_ms", "recheck_ms", "verify_ms"):
                row[phase.replace("_ms", " s")] = report.stats[phase] / 1000
            t0 = time.perf_counter()
            with (Path(tmp) / "report.json").open("w") as out:
                report.write_json(out)
            row["report write s"] = time.perf_counter() - t0
            row["report MB"] = (Path(tmp) / "report.json").stat().st_size / 2**20
            peak.stop()
            row["driver RSS at start MB"] = peak.driver_base / 2**20
            row["driver peak growth MB"] = (peak.driver - peak.driver_base) / 2**20
            row["driver MB: start / middle / end"] = peak.driver_over_time()
            row["JVM peak MB"] = peak.jvm / 2**20
            row["Python workers peak MB"] = peak.executors / 2**20
            # The baseline: the same findings held as objects, as the driver held them before.
            gc.collect()
            before = rss_mb()
            held = list(report.violations)
            row["baseline: findings as objects MB"] = rss_mb() - before
            row["baseline / driver growth"] = row["baseline: findings as objects MB"] / max(
                row["driver peak growth MB"], 1)
            del held
            if owned:
                session.stop()
        finally:
            stop_agents(agents)
            client.stop()
            client.close()
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="100000,1000000")
    args = p.parse_args()
    rows = [run_size(int(n)) for n in args.sizes.split(",")]
    print(table(rows))


if __name__ == "__main__":
    main()
