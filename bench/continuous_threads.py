"""Where continuous mode's hour goes in the auditor, thread by thread: its CPU idle (an hour of it), and what
each change adds (ms a change), at a steady churn.

`bench.continuous`'s cluster (its bookies, agents and churn: creates, closes, deletes and re-replications, what
a bookie no longer needs deleted at its garbage collector's pass every `--gc-wait-seconds`) at `--ledgers`, and a
`scrutiny auditor` with continuous mode on; after its election's full run, `--idle-seconds` idle, then
`--churn-seconds` of churn at `--rate` changes a second (2.78: 1% an hour of 1M ledgers) and 15 s for the last
looks. Each thread's CPU is read from /proc, named by the auditor itself (`bench.thread_names`); a change's cost
is the churn window's CPU less the idle rate over it.

    python -m bench.continuous_threads [--ledgers 100000 --idle-seconds 120 --churn-seconds 180 --rate 2.78]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

from bench.common import table
from bench.continuous import GC_WAIT_SECONDS, AuditorProcess, Cluster, say, window

TAIL_SECONDS = 15.0  # the last changes' looks: write-cache grace, then the batch


def per_thread(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread's /proc name and CPU seconds; under -1, the whole process's (threads that ended too)."""
    proc = psutil.Process(pid)
    times = proc.cpu_times()
    out = {-1: ("the process", times.user + times.system)}
    for t in proc.threads():
        try:
            comm = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
        except OSError:  # ended meanwhile
            continue
        out[t.id] = (comm, t.user_time + t.system_time)
    return out


def by_name(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
            names: dict[int, str]) -> dict[str, float]:
    """CPU seconds between the two readings, by thread name (a pool's threads together); a thread that ended
    between them is counted only in the process's row."""
    spent: dict[str, float] = defaultdict(float)
    for tid, (comm, cpu) in after.items():
        if tid < 0:
            continue
        name = re.sub(r"[-_ ]?\d+$", "", names.get(tid, comm))
        spent[name] += cpu - before.get(tid, (comm, 0.0))[1]
    return spent


def measure(ledgers: int, idle_s: float, churn_s: float, rate: float,
            gc_wait_s: float = GC_WAIT_SECONDS) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cluster = Cluster(ledgers, 5, 20, work, seed=5, gc_wait_seconds=gc_wait_s)
        names_file = work / "threads.json"
        try:
            cluster.start_live_agent(watching=True)
            auditor = AuditorProcess(cluster, True, work / "on",
                                     launcher=("-m", "bench.thread_names", str(names_file)))
            try:
                say("the election's full run")
                auditor.full_run("full", 3600)
                time.sleep(10)
                pid = auditor.proc.pid
                say(f"idle for {idle_s:.0f} s")
                a, t0 = per_thread(pid), time.monotonic()
                time.sleep(idle_s)
                b, t1 = per_thread(pid), time.monotonic()
                say(f"churn for {churn_s:.0f} s at {rate} changes/s")
                n = int(window(cluster, auditor, churn_s, cluster.churn_once, rate)["changes"])
                time.sleep(TAIL_SECONDS)
                c, t2 = per_thread(pid), time.monotonic()
                os.kill(pid, signal.SIGUSR2)
                deadline = time.monotonic() + 10
                while not names_file.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                names = {int(k): v for k, v in json.loads(names_file.read_text()).items()}
            finally:
                auditor.close()
        finally:
            cluster.close()
    idle, churn = by_name(a, b, names), by_name(b, c, names)
    idle["the process"], churn["the process"] = b[-1][1] - a[-1][1], c[-1][1] - b[-1][1]
    idle_rate = {k: v / (t1 - t0) for k, v in idle.items()}
    rows = [{"thread": k, "idle CPU-s an hour": round(idle_rate.get(k, 0.0) * 3600, 2),
             "ms a change": round((churn[k] - idle_rate.get(k, 0.0) * (t2 - t1)) * 1000 / n, 3)}
            for k in sorted(churn, key=lambda k: (k == "the process", -churn[k]))
            if churn[k] >= 0.005 or idle.get(k, 0.0) >= 0.005]
    return {"ledgers": len(cluster.ledgers), "changes": n, "churn_window_s": t2 - t1, "rows": rows,
            "threads": sorted(churn)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ledgers", type=int, default=100_000)
    p.add_argument("--idle-seconds", type=float, default=120)
    p.add_argument("--churn-seconds", type=float, default=180)
    p.add_argument("--rate", type=float, default=2.78, help="changes a second (2.78: 1%% an hour of 1M ledgers)")
    p.add_argument("--gc-wait-seconds", type=float, default=GC_WAIT_SECONDS,
                   help="each bookie's garbage collector's pass (BookKeeper's gcWaitTime)")
    a = p.parse_args()
    out = measure(a.ledgers, a.idle_seconds, a.churn_seconds, a.rate, a.gc_wait_seconds)
    print(f"## the auditor's CPU by thread, continuous mode on ({out['ledgers']:,} ledgers; {out['changes']} changes "
          f"in {out['churn_window_s']:.0f} s)\n")
    print(table(out["rows"]))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
