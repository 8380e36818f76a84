"""Where a scan's time goes beyond the floor: cProfile of the executor-side work (`check_range`) over
a synthetic cluster, in one process, with the agents in their own processes, grouped by component.
cProfile sees the main thread alone: a run before it, not profiled, gives each thread's CPU (the
ZooKeeper session's, the bookie calls', gRPC's own), from the kernel's per-thread counters, and the cyclic
collector's time within it (wall time of its collections, by generation).

`--spark`: the same cluster scanned as a full run scans it, on Spark `local[2]`, twice (the first warms the
Python workers: their imports, sessions and channels); the second's CPU by worker thread, not profiled, beside
the in-process run's: what Spark's workers spend beyond the work itself.

    python -m bench.profile_scan [--ledgers 20000] [--cumulative] [--spark]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
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


def _comm(tid: int) -> str:
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        return "a thread that ended meanwhile"


def cpu_by_thread(work: Callable[[], object]) -> dict[str, float]:
    """Each thread's CPU seconds over `work`, by its name (a pool's threads together), most first."""
    me = psutil.Process()
    before = {t.id: t.user_time + t.system_time for t in me.threads()}
    work()
    names = {t.native_id: t.name for t in threading.enumerate()}
    spent: dict[str, float] = defaultdict(float)
    for t in me.threads():
        name = names.get(t.id) or _comm(t.id)  # gRPC's own threads
        spent["main" if t.id == threading.main_thread().native_id else re.sub(r"_\d+$", "", name)] += (
            t.user_time + t.system_time - before.get(t.id, 0.0))
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


class CollectorTime:
    """The cyclic collector's own time over a span, by generation (`gc.callbacks`), in any thread."""

    def __init__(self) -> None:
        self.by_generation: dict[int, float] = defaultdict(float)
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.by_generation[info["generation"]] += time.perf_counter() - self._started

    def __enter__(self) -> CollectorTime:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def spark_threads(settings: ScanSettings, leave_out: list[int]) -> dict[str, float]:
    """Spark's Python workers' CPU seconds over a warm full run, by thread ("main": the one running the tasks;
    gRPC's event engine; every other Python thread: the bookie calls, the ZooKeeper session)."""
    from scrutiny.scan.engines import SparkEngine, spark_session

    def sample() -> dict[tuple[int, str], float]:
        out: dict[tuple[int, str], float] = {}
        for p in psutil.Process().children(recursive=True):
            try:
                if p.pid in leave_out or "java" in p.name():
                    continue
                for t in p.threads():
                    comm = Path(f"/proc/{p.pid}/task/{t.id}/comm").read_text().strip()
                    kind = "workers: main" if t.id == p.pid else f"workers: {comm.replace('python', 'other Python')}"
                    out[t.id, kind] = t.user_time + t.system_time
            except (psutil.Error, OSError):
                continue  # a thread or process ended meanwhile
        return out

    engine = SparkEngine(session=spark_session("local[2]"))
    try:
        ScrutinyRun(settings, engine).execute()  # warms the workers
        before = sample()
        ScrutinyRun(settings, engine).execute()
        after = sample()
    finally:
        engine.session.stop()
    spent: dict[str, float] = defaultdict(float)
    for (tid, kind), cpu in after.items():
        spent[kind] += cpu - before.get((tid, kind), 0.0)
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=20_000)
    p.add_argument("--cumulative", action="store_true", help="the functions by cumulative time too")
    p.add_argument("--spark", action="store_true", help="a warm full run's CPU by Spark worker thread too")
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
            with CollectorTime() as collector:
                threads = cpu_by_thread(lambda: ScrutinyRun(settings, LocalEngine()).execute())
            workers = spark_threads(settings, [zk.pid, *(a.pid for a in agents)]) if args.spark else {}
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
    rows = [{"thread": name, "CPU us per ledger": cpu / count * 1e6} for name, cpu in threads.items()
            if cpu / count >= 5e-8]
    rows.append({"thread": "in one process, every thread", "CPU us per ledger": sum(threads.values()) / count * 1e6})
    rows += [{"thread": f"of it, the cyclic collector (generation {g})", "CPU us per ledger": spent / count * 1e6}
             for g, spent in sorted(collector.by_generation.items())]
    if workers:
        rows += [{"thread": name, "CPU us per ledger": cpu / count * 1e6} for name, cpu in workers.items()
                 if cpu / count >= 5e-8]
        rows.append({"thread": "Spark's workers, every thread",
                     "CPU us per ledger": sum(workers.values()) / count * 1e6})
    print("CPU by thread, not profiled (in one process; then Spark's workers, when asked):\n")
    print(table(rows))
    print(f"\n{count} ledgers in {wall:.1f} s in one process ({count / wall:,.0f} ledgers/s); CPU by component:\n")
    print(table([{"component": k, "CPU s": v, "share": f"{v / total:.0%}"}
                 for k, v in sorted(own.items(), key=lambda kv: -kv[1])]))
    print()
    stats.sort_stats("tottime").print_stats(15)
    if args.cumulative:
        stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
