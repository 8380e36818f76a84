"""Where a scan's time goes beyond the floor: cProfile of the executor-side work (`check_range`) over
a synthetic cluster, in one process, with the agents in their own processes, grouped by component.
cProfile sees the main thread alone: a run before it, not profiled, gives each thread's CPU (the
ZooKeeper session's, the bookie calls', gRPC's own), from the kernel's per-thread counters.

    python -m bench.profile_scan [--ledgers 20000] [--cumulative]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import psutil
from kazoo.client import KazooClient

from bench.common import table
from bench.scale import build
from scrutiny.config import ScanSettings
from scrutiny.scan.driver import ScrutinyRun
from scrutiny.scan.engines import LocalEngine
from scrutiny.scan.work import EXECUTOR
from scrutiny.testing import processes
from scrutiny.testing.localzk import LocalZooKeeper
from scrutiny.testing.processes import stop

COMPONENTS = (("kazoo", "ZooKeeper client (kazoo)"), ("grpc", "gRPC client"), ("scrutiny/codec", "codec"),
              ("scrutiny/checks", "checks"), ("scrutiny/metadata", "metadata decoding"),
              ("protobuf", "protobuf"), ("threading", "waiting (threading)"), ("scrutiny/", "scrutiny, other"))


def cpu_by_thread(work: Callable[[], object]) -> dict[str, float]:
    """Each thread's CPU seconds over `work`, by its name (a pool's threads together), most first."""
    me = psutil.Process()
    before = {t.id: t.user_time + t.system_time for t in me.threads()}
    work()
    names = {t.native_id: t.name for t in threading.enumerate()}
    spent: dict[str, float] = defaultdict(float)
    for t in me.threads():
        name = names.get(t.id) or Path(f"/proc/self/task/{t.id}/comm").read_text().strip()  # gRPC's own threads
        spent["main" if t.id == threading.main_thread().native_id else re.sub(r"_\d+$", "", name)] += (
            t.user_time + t.system_time - before.get(t.id, 0.0))
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=20_000)
    p.add_argument("--cumulative", action="store_true", help="the functions by cumulative time too")
    args = p.parse_args()
    count = args.ledgers
    with tempfile.TemporaryDirectory() as tmp, LocalZooKeeper(heap="1g") as zk:
        client = KazooClient(hosts=zk.hosts)
        client.start()
        held = build(client, "/ledgers", count, 1000, Path(tmp))
        uri = f"zk+hierarchical://{zk.hosts}/ledgers"
        agents = [processes.spawn([sys.executable, "-m", "scrutiny.cli", "bookie-agent", "--bookie-id", b,
                                    "--source", "synthetic", "--synthetic-file",
                                    str(Path(tmp) / f"{b.replace(':', '_')}.synth"), "--bind", "127.0.0.1:0",
                                    "--metadata-service-uri", uri], stdout=subprocess.PIPE, text=True)
                  for b in sorted(held)]
        try:
            for a in agents:
                a.stdout.readline()  # type: ignore[union-attr]
            settings = ScanSettings(metadata_service_uri=uri)
            threads = cpu_by_thread(lambda: ScrutinyRun(settings, LocalEngine()).execute())
            run = ScrutinyRun(settings, LocalEngine())
            profile = cProfile.Profile()
            t0 = time.perf_counter()
            profile.enable()
            report = run.execute()
            profile.disable()
            wall = time.perf_counter() - t0
            assert report.complete and not report.violations
        finally:
            EXECUTOR.close()
            for a in agents:
                stop(a)
            client.stop()
    stats = pstats.Stats(profile)
    own: dict[str, float] = defaultdict(float)
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        name = next((label for key, label in COMPONENTS if key in filename), "other (Python runtime)")
        own[name] += tottime
    total = sum(own.values())
    print("CPU by thread, not profiled:\n")
    print(table([{"thread": name, "CPU us per ledger": cpu / count * 1e6} for name, cpu in threads.items()
                 if cpu / count >= 5e-8]))
    print(f"\n{count} ledgers in {wall:.1f} s in one process ({count / wall:,.0f} ledgers/s); CPU by component:\n")
    print(table([{"component": k, "CPU s": v, "share": f"{v / total:.0%}"}
                 for k, v in sorted(own.items(), key=lambda kv: -kv[1])]))
    print()
    stats.sort_stats("tottime").print_stats(15)
    if args.cumulative:
        stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
