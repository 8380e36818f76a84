"""The Spark side of a run: ranges become tasks; each task runs `check_range` on an executor and
sends back only its counts, violations and potentially faulty ledgers."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from scrutiny.run import Pass, RangeResult, RunContext, check_range
from scrutiny.zkstore import LedgerRange

_session_lock = threading.Lock()


def spark_session(master: str = "local[*]", app_name: str = "scrutiny", extra: dict[str, str] | None = None) -> Any:
    """The process's one SparkSession (created on first use)."""
    # Workers must run this venv's python (the system one lacks the package and pyarrow).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

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


def _partition(ctx: RunContext, mode: Pass, ranges: Iterator[LedgerRange]) -> Iterator[RangeResult]:
    for rng in ranges:
        yield check_range(ctx, rng, mode)


class SparkEngine:
    def __init__(self, master: str = "local[*]", session: Any = None, conf: dict[str, str] | None = None) -> None:
        self.master = master
        self.conf = dict(conf or {})
        self._session = session

    @property
    def session(self) -> Any:
        if self._session is None:
            self._session = spark_session(self.master, extra=self.conf)
        return self._session

    def map_ranges(self, ctx: RunContext, ranges: list[LedgerRange], mode: Pass,
                   progress: Callable[[int, int], None] | None = None) -> Iterator[RangeResult]:
        if not ranges:
            return iter(())
        sc = self.session.sparkContext
        # A range is a task: small enough to retry cheaply, large enough to pipeline its reads.
        rdd = sc.parallelize(ranges, numSlices=min(len(ranges), 10_000))
        job = rdd.mapPartitions(lambda it: _partition(ctx, mode, it))
        stop = threading.Event()
        watcher = None
        if progress is not None:
            watcher = threading.Thread(target=_watch, args=(sc, len(ranges), progress, stop), daemon=True)
            watcher.start()
        try:
            # Results are small (counts, violations): collecting them keeps the driver's memory to
            # the findings, whatever the number of ledgers.
            results = job.collect()
        finally:
            stop.set()
            if watcher is not None:
                watcher.join()
        if progress is not None:
            progress(len(ranges), len(ranges))
        return iter(results)


def _watch(sc: Any, total: int, progress: Callable[[int, int], None], stop: threading.Event) -> None:
    tracker = sc.statusTracker()
    while not stop.wait(1.0):
        done = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
        progress(min(done, total), total)
