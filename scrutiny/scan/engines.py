"""Engines: what hands each range of a run to `check_range`, in this process or on Spark executors.

An engine is opened once and closed once (`close()` stops its SparkSession, or the executor resources
of this process); a run calls `map_ranges` once per pass. `open()` starts what the engine needs up
front: a daemon calls it before its gRPC servers start, since forking Spark's JVM while gRPC threads
are busy fails ("Java gateway process exited").
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from scrutiny.config import ScanSettings
from scrutiny.scan.context import Pass, RunContext
from scrutiny.scan.result import RangeResult
from scrutiny.scan.work import BETWEEN_TASKS, EXECUTOR, check_range
from scrutiny.store import LedgerRange

Progress = Callable[[int, int, int], None]  # (ranges done, ranges in all, ledgers seen so far)


class Engine(Protocol):
    def open(self) -> None: ...

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Progress | None = None) -> Iterator[RangeResult]: ...

    def close(self) -> None: ...


class LocalEngine:
    """The same work in this process, range after range (small rescans, tests of the logic)."""

    def open(self) -> None:
        pass

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Progress | None = None) -> Iterator[RangeResult]:
        ledgers = 0
        for i, rng in enumerate(ranges):
            result = check_range(ctx, rng, mode)
            ledgers += result.counts.get("seen", 0)
            yield result
            if progress:
                progress(i + 1, len(ranges), ledgers)

    def close(self) -> None:
        EXECUTOR.close()


_session_lock = threading.Lock()


def spark_session(master: str = "local[*]", app_name: str = "scrutiny", extra: dict[str, str] | None = None) -> Any:
    """The process's one SparkSession (created on first use)."""
    # Workers must run this venv's python (the system one lacks the package and pyarrow).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession  # heavy: only when a Spark engine is used

    with _session_lock:
        builder = (SparkSession.builder.master(master).appName(app_name)
                   .config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", "4")
                   .config("spark.python.worker.reuse", "true")
                   .config("spark.task.maxFailures", "4")
                   .config("spark.ui.showConsoleProgress", "false"))
        if master.startswith("local"):
            builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        for k, v in (extra or {}).items():
            builder = builder.config(k, v)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session


def _partition(ctx: RunContext, mode: Pass, ranges: Iterator[LedgerRange], seen: Any) -> Iterator[RangeResult]:
    # One merged result per partition: less to pickle and collect than one per range.
    result = RangeResult.merge(check_range(ctx, rng, mode) for rng in ranges)
    seen.add(result.counts.get("seen", 0))  # a Spark accumulator: the progress bar's ledger count
    BETWEEN_TASKS.ended()
    yield result


class SparkEngine:
    """Ranges become tasks; each task runs `check_range` on an executor and sends back only its
    result (counts, violations, potentially faulty ledgers)."""

    def __init__(self, master: str = "local[*]", session: Any = None, conf: dict[str, str] | None = None) -> None:
        self.master = master
        self.conf = dict(conf or {})
        self._session = session
        self._owned = session is None  # a session handed in belongs to the caller

    @property
    def session(self) -> Any:
        if self._session is None:
            self._session = spark_session(self.master, extra=self.conf)
        return self._session

    def open(self) -> None:
        self.session  # noqa: B018 - the session starts here, not in the middle of a run

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Progress | None = None) -> Iterator[RangeResult]:
        """Every range checked in parallel, each partition's result kept on its executor's disk, then
        brought to the driver a few thousand findings at a time: a lost rack's million findings never
        all reach the driver at once (a `collect` held them all, pickled in the JVM and as objects)."""
        if not ranges:
            return
        from pyspark import StorageLevel

        sc = self.session.sparkContext
        # A range is a task: small enough to retry cheaply, large enough to pipeline its reads.
        rdd = sc.parallelize(ranges, numSlices=min(len(ranges), 10_000))
        seen = sc.accumulator(0)
        job = rdd.mapPartitions(lambda it: _partition(ctx, mode, it, seen)).persist(StorageLevel.DISK_ONLY)
        stop = threading.Event()
        watcher = None
        if progress is not None:
            watcher = threading.Thread(target=_watch, args=(sc, len(ranges), seen, progress, stop), daemon=True)
            watcher.start()
        try:
            try:
                sizes = job.map(lambda r: len(r.violations)).collect()  # one result per partition, in order
            finally:
                stop.set()
                if watcher is not None:
                    watcher.join()
            if progress is not None:
                progress(len(ranges), len(ranges), int(seen.value))
            for partitions in fetches(sizes, FETCH_FINDINGS):
                yield from sc.runJob(job, lambda it: it, partitions)
        finally:
            job.unpersist()

    def close(self) -> None:
        EXECUTOR.close()  # an in-process run on the driver may have left a session
        if self._session is not None and self._owned:
            self._session.stop()
            self._session = None


FETCH_FINDINGS = 10_000  # findings per fetch of results from the executors (a few KB each as objects)


def fetches(findings_per_partition: list[int], most: int) -> Iterator[list[int]]:
    """The partitions in order, grouped so that a group holds at most `most` findings (or is one
    partition), and at most 1,000 partitions (a job's results are held whole)."""
    group: list[int] = []
    held = 0
    for partition, n in enumerate(findings_per_partition):
        if group and (held + n > most or len(group) == 1000):
            yield group
            group, held = [], 0
        group.append(partition)
        held += n
    if group:
        yield group


def _watch(sc: Any, total: int, seen: Any, progress: Progress, stop: threading.Event) -> None:
    tracker = sc.statusTracker()
    while not stop.wait(1.0):
        done = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
        progress(min(done, total), total, int(seen.value))


def make_engine(settings: ScanSettings) -> Engine:
    if settings.engine == "local":
        return LocalEngine()
    return SparkEngine(settings.spark_master, conf=settings.spark_conf)
