"""Timing helpers: medians of repeated runs (this machine is small and noisy)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from scrutiny.checks import BookieAnswers
from scrutiny.listedcolumns import Listed
from scrutiny.scan import work as range_work
from scrutiny.testing import processes
from scrutiny.testing.processes import stop


def as_columns(answers: Mapping[str, BookieAnswers]) -> None:
    """Each bookie's lists of entries as one message's columns, as a scan keeps what an agent sends."""
    for got in answers.values():
        got.add_listed(Listed.of(got.encoded))
        got.encoded.clear()


def median_seconds(fn: Callable[[], Any], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_seconds(pid: int | None = None) -> float:
    """A process's CPU seconds, user and system (this process's without `pid`)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def thread_cpu(native_id: int) -> float:
    """One thread of this process, its CPU seconds to the nanosecond (psutil counts in 10 ms ticks: a
    notification or a feed message costs a fraction of one). OSError once the thread ended."""
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols = list(dict.fromkeys(c for r in rows for c in r))
    rows = [{c: r.get(c, "") for c in cols} for r in rows]
    width = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in cols}
    out = ["| " + " | ".join(c.ljust(width[c]) for c in cols) + " |",
           "|" + "|".join("-" * (width[c] + 2) for c in cols) + "|"]
    out += ["| " + " | ".join(_fmt(r[c]).ljust(width[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def start_agents(bookies: Iterable[str], directory: Path, uri: str, workers: int = 4,
                 metrics: Mapping[str, int] | None = None) -> list[subprocess.Popen[str]]:
    """One `scrutiny bookie-agent` process per bookie, on its synthetic store in `directory`, each
    serving (its first line printed); `metrics`: the port of each one's /metrics."""
    agents = [processes.spawn([sys.executable, "-m", "scrutiny.cli", "bookie-agent", "--bookie-id", b,
                                "--source", "synthetic", "--synthetic-file",
                                str(directory / f"{b.replace(':', '_')}.synth"), "--bind", "127.0.0.1:0",
                                "--metadata-service-uri", uri, "--workers", str(workers),
                                *(["--metrics-listen", f"127.0.0.1:{metrics[b]}"] if metrics else [])],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
              for b in sorted(bookies)]
    for a in agents:
        a.stdout.readline()  # type: ignore[union-attr]
    return agents


def stop_agents(agents: list[subprocess.Popen[str]]) -> None:
    """The agents, and this process's clients of them and of the store."""
    range_work.EXECUTOR.close()
    for a in agents:
        stop(a)
