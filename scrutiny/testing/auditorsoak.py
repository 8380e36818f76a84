"""The auditor's soak: many runs of a real auditor over a churning cluster, its threads, descriptors and memory
sampled at rest after each."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

from scrutiny.config import AuditorSettings, ScanSettings
from scrutiny.scan.engines import Engine
from scrutiny.testing.churn import ChurnCluster


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
    sample of its resources after each run. Its hand-off to autorecovery is on: legal churn marks nothing."""
    from scrutiny.auditor import Auditor

    uri = f"zk+hierarchical://{hosts}{root}"
    cluster = populated(ChurnCluster(client, root, uri, [f"127.0.5.{n}:3181" for n in range(1, 6)], recheck_delay,
                                     random.Random(seed)))
    scan = ScanSettings(metadata_service_uri=uri, placement_policy="none", recheck_delay=recheck_delay,
                        underreplicated_grace_period=1, bookie_deadline_seconds=2.0, zk_session_timeout=10)
    settings = AuditorSettings(listen="127.0.0.1:0", reports_dir=reports_dir, full_interval_seconds=1,
                               underreplication_interval_seconds=0, insecure_open_rescan=True, reports_keep=5,
                               repair="mark", repair_interval_seconds=0.5)
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
                    if auditor.handoff.handed():
                        raise AssertionError(f"a hand-off under legal churn: {auditor.handoff.handed()[0].to_json()}")
                    with cluster.quiet():
                        _continuous_settled(auditor, 5.0)
                        samples.append(_usage(len(samples) + 1))
                time.sleep(0.05)
        finally:
            auditor.stop()
    return samples

